"""The webhook senders in docs/api.md (shell and Python) run as they are against a real server
and each starts its run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from api_server import serving

from contextos import Runtime
from contextos.api import ApiConfig
from contextos.store.queue import queue_of
from contextos.workers import add_trigger

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "api.md"


def sample(language: str, holding: str) -> str:
    """The docs' code block in `language` that holds `holding`."""
    for found in re.finditer(rf"```{language}\n(.*?)```", DOC.read_text(), re.S):
        if holding in found.group(1):
            return found.group(1)
    raise AssertionError(f"docs/api.md has no {language} sample with {holding!r}")


async def test_the_signed_webhook_samples_start_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORDER_HOOK_SECRET", "change-me")
    url = f"sqlite:///{tmp_path}/runs.db"
    async with Runtime(url) as rt:
        queue = queue_of(rt.store)
        assert queue is not None
        await add_trigger(
            queue,
            "new-order",
            "examples/refund_approval.py:small_refund",
            webhook=True,
            secret_env="ORDER_HOOK_SECRET",
        )
    sender = tmp_path / "sender.py"
    sender.write_text(sample("python", "def deliver("))
    with serving(ApiConfig(open_access=True, store=url)) as base:
        env = {**os.environ, "API": base}
        shell = subprocess.run(
            ["bash", "-c", sample("bash", "X-ContextOS-Signature")],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shell.returncode == 0, shell.stderr
        answer = json.loads(shell.stdout)
        assert (answer["delivery"], answer["duplicate"]) == ("delivery-0001", False), answer
        python = subprocess.run(
            [sys.executable, str(sender)], env=env, capture_output=True, text=True, timeout=60
        )
        assert python.returncode == 0, python.stderr
        assert "'delivery': 'delivery-0002', 'duplicate': False}" in python.stdout
    async with Runtime(url) as rt:
        inputs = {(await rt.state(r.run_id)).input for r in await rt.runs()}
        assert inputs == {
            '{"order": "A-1", "reason": "damaged"}',
            '{"order": "A-2", "reason": "late"}',
        }
