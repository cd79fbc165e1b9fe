"""The pause and follow-up samples of docs/runs.md and docs/api.md run as they are: the Python
sample prints what the page shows, the shell samples pause, resume and continue real runs, and
the curl samples send a message, follow the answer live and pause a run on a real server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from contextos.api import ApiConfig
from support.markdown import ROOT, code_blocks, run_python
from support.processes import wait_for_file, wait_until

RUNS = ROOT / "docs" / "runs.md"
API = ROOT / "docs" / "api.md"
CHAT = "tests/drivers/chat_agent.py:agent"
SLOW = "tests/drivers/slow_agent.py:agent"

sys.path.insert(0, str(ROOT / "tests" / "api"))
from api_server import serving, token_for  # noqa: E402


def block(doc: Path, language: str, holding: str) -> str:
    found = [b for b in code_blocks(language, doc) if holding in b]
    assert found, f"{doc.name} has no {language} sample with {holding!r}"
    return found[0]


def bash(source: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # `contextos` as a newcomer calls it: from the environment's bin, in the project's folder
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", "-ec", source],
        cwd=cwd,
        env={**os.environ, "PATH": path, "NO_COLOR": "1", "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_conversation_sample_prints_what_the_page_shows(tmp_path: Path) -> None:
    sample = block(RUNS, "python", "conversation=True")
    shown = re.findall(r"```\n(input_required \|.*?)```", RUNS.read_text(), re.S)[0]
    ran = run_python(sample, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == shown


def test_the_pause_shell_sample_pauses_and_resumes_a_live_run() -> None:
    ran = bash(block(RUNS, "bash", "contextos pause r1"), ROOT)
    assert ran.returncode == 0, ran.stderr
    out = " ".join(ran.stdout.split())
    assert "r1 pauses after its current step" in out
    assert out.index("run r1 paused") < out.index("run r1 completed")


def test_the_send_shell_sample_continues_the_conversation() -> None:
    ran = bash(block(RUNS, "bash", "contextos send c1"), ROOT)
    assert ran.returncode == 0, ran.stderr
    assert "user: Hello | assistant: user: Hello | user: And in euros?" in ran.stdout
    assert "user_message_added" in ran.stdout
    assert "run c1 completed" in " ".join(ran.stdout.split())


async def test_the_http_samples_send_follow_and_pause_a_live_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTEXTOS_TEST_DIR", str(tmp_path))  # where the slow tool waits
    store = f"sqlite:///{tmp_path}/runs.db"
    headers = await token_for(store, user="bob")
    token = headers["Authorization"].removeprefix("Bearer ")
    sample = block(API, "bash", "/messages")
    with serving(ApiConfig(store=store, agents=(CHAT, SLOW), worker=True)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=headers) as http:
            run = (
                await http.post("/v1/runs?wait=true", json={"agent": CHAT, "input": "Hi"})
            ).json()
            assert run["status"] == "input_required", run
            busy = (await http.post("/v1/runs", json={"agent": SLOW, "input": "x"})).json()
            wait_for_file(tmp_path / "started-1")  # the server's worker is in step 1
            ran = bash(
                sample,
                tmp_path,
                API=base,
                TOKEN=token,
                RUN=run["run_id"],
                SEEN=str(run["last_seq"]),
                OTHER=busy["run_id"],
            )
            assert ran.returncode == 0, ran.stderr
            sent, *streamed, asked = ran.stdout.strip().splitlines()
            assert (json.loads(sent)["run_id"], json.loads(sent)["status"]) == (
                run["run_id"],
                "queued",
            )
            assert "event: run_answered" in streamed and streamed[-1] == "event: idle"
            now = (await http.get(f"/v1/runs/{run['run_id']}")).json()
            assert now["output"] == "user: Hi | assistant: user: Hi | user: And in euros?"
            assert json.loads(asked)["status"] == "running"  # a request its driver takes in

            (tmp_path / "go").touch()
            other = f"/v1/runs/{busy['run_id']}"

            async def paused() -> bool:
                return bool((await http.get(other)).json()["status"] == "paused")

            await wait_until(paused, what="the worker to pause the run")
            events = (await http.get(f"{other}/events")).json()["events"]
    kinds = [e["type"] for e in events]
    assert kinds[-3:] == ["run_pause_requested", "tool_completed", "run_paused"]
    assert (tmp_path / "calls.log").read_text() == "start 1\nend 1\n"  # step 2 never began
