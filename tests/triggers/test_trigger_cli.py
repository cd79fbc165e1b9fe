"""`contextos trigger add / list / remove`, and `contextos show` of a triggered run, as real
processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trigger_helpers import LOOPER, REVIEWER, WRITER

from contextos import Runtime
from contextos.workers.triggers import fire_triggers
from support.processes import ROOT


def cli(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args, "--store", str(store)],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_trigger_commands_and_show(tmp_path: Path) -> None:
    store = tmp_path / "runs.db"
    added = cli(
        store, "trigger", "add", "review", REVIEWER, "--after", "writer", "--input", "R: {output}"
    )
    assert added.returncode == 0, added.stderr
    assert "after a writer run completes" in added.stdout
    hook = cli(store, "trigger", "add", "inbound", WRITER, "--webhook", "--secret-env", "HOOK_KEY")
    assert hook.returncode == 0, hook.stderr

    loop = cli(store, "trigger", "add", "again", LOOPER, "--after", "looper")
    assert loop.returncode == 1 and "--allow-cycle" in loop.stderr
    template = cli(store, "trigger", "add", "t", REVIEWER, "--after", "x", "--input", "{nope}")
    assert template.returncode == 1 and "unknown field {nope}" in template.stderr

    listed = json.loads(cli(store, "trigger", "list", "--json").stdout)
    assert [(t["name"], t["kind"], t["source_agent"], t["secret_env"]) for t in listed] == [
        ("inbound", "webhook", "", "HOOK_KEY"),
        ("review", "run", "writer", None),
    ]
    table = cli(store, "trigger", "list").stdout
    assert "on POST /v1/hooks/inbound (signed with $HOOK_KEY)" in table
    assert "R: {output}" in table

    ran = cli(store, "run", WRITER, "write it", "--json")
    assert ran.returncode == 0, ran.stderr
    source = json.loads(ran.stdout)["run_id"]
    async with Runtime(str(store)) as rt:
        (fired,) = await fire_triggers(rt)
    assert fired.run_id is not None
    shown = cli(store, "show", fired.run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"started by trigger review after run {source} completed (chain depth 1)" in (
        shown.stdout
    )
    assert "R: draft: the quarterly report" in shown.stdout

    assert cli(store, "trigger", "remove", "review").returncode == 0
    missing = cli(store, "trigger", "remove", "review")
    assert missing.returncode == 1 and "no trigger named 'review'" in missing.stderr
    assert [t["name"] for t in json.loads(cli(store, "trigger", "list", "--json").stdout)] == [
        "inbound"
    ]
