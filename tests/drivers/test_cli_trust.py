"""What makes the command trustworthy to a newcomer, run as real processes: id prefixes,
`--json` on every command that reads, help with examples at 80 columns, shell completion,
and an inbox whose ids are never wrapped."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import typer

from contextos.cli import app

ROOT = Path(__file__).resolve().parents[2]
REFUNDS = "tests/interrupts/refunds.py:agent"
POLICY = """
name = "refunds"
version = "2026-11"

[roles]
finance = ["alice"]

[[rules]]
id = "refund-over-100"
tools = ["refund"]
decision = "require_approval"
approver_role = "finance"
reason = "refunds over 100 EUR need a finance approver"
preview = "Refund {amount} EUR on order {order_id}"
when = { amount = { gt = 100 } }
"""
CONTEXTOS = str(Path(sys.executable).parent / "contextos")
"""The installed command, as a person types it (shell completion goes by its name)."""
FIRST, SECOND = "run_0123a1b2c3d4e5f6a7b8", "run_0123f9e8d7c6b5a4f3e2"
"""Two waiting runs whose ids share the prefix `run_0123`."""


class Shell:
    """`contextos` in a real process on one store, as a person at an 80-column terminal."""

    def __init__(self, tmp: Path) -> None:
        self.store = str(tmp / "runs.db")
        self.env = {
            **os.environ,
            "NO_COLOR": "1",
            "COLUMNS": "80",
            "CONTEXTOS_POLICY": str(tmp / "policy.toml"),
            "REFUND_LEDGER": str(tmp / "refunds.db"),
            "CONTEXTOS_USER": "bob",
        }
        (tmp / "policy.toml").write_text(POLICY)

    def __call__(self, *args: str, store: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CONTEXTOS, *args, *(["--store", self.store] if store else [])],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def many(self, *calls: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda args: self(*args), calls))


@pytest.fixture
def sh(tmp_path: Path) -> Iterator[Shell]:
    """Two runs waiting for a finance approval, ids sharing a prefix."""
    shell = Shell(tmp_path)
    for run_id in (FIRST, SECOND):
        started = shell("run", REFUNDS, "refund order A-0", "--run-id", run_id)
        assert started.returncode == 0, started.stderr
    yield shell


def statuses(sh: Shell) -> dict[str, str]:
    return {r["run_id"]: r["status"] for r in json.loads(sh("runs", "--json").stdout)}


def test_an_ambiguous_prefix_is_one_line_naming_the_candidates_and_changes_nothing(
    sh: Shell,
) -> None:
    before = statuses(sh)
    by_run = [
        ("resume", "run_0123"),
        ("cancel", "run_0123"),
        ("show", "run_0123"),
        ("trace", "run_0123"),
        ("artifacts", "run_0123"),
        ("record", "run_0123"),
        ("replay", "run_0123"),
        ("packet", "run_0123"),
        ("fork", "run_0123", "--at", "3"),
        ("approve", "run_0123.i8", "--as", "alice"),
        ("deny", "run_0123.i8", "--as", "alice"),
        ("answer", "run_0123.i8", "yes"),
        ("kb", "approve", "run_0123.i8", "--as", "alice"),
    ]
    for args, done in zip(by_run, sh.many(*by_run), strict=True):
        assert done.returncode == 1, args
        [line] = done.stderr.splitlines()
        assert line.startswith("error: run id prefix 'run_0123' is ambiguous: "), (args, line)
        assert FIRST in line and SECOND in line
    by_interrupt = [
        ("approve", "run_01", "--as", "alice"),
        ("deny", "run_01"),
        ("answer", "run_", "x"),
    ]
    for args, done in zip(by_interrupt, sh.many(*by_interrupt), strict=True):
        assert done.returncode == 1, args
        assert done.stderr.splitlines() == [
            f"error: interrupt id prefix {args[1]!r} is ambiguous: {FIRST}.i8, {SECOND}.i8; "
            "give more of it"
        ] or done.stderr.splitlines() == [
            f"error: interrupt id prefix {args[1]!r} is ambiguous: {SECOND}.i8, {FIRST}.i8; "
            "give more of it"
        ]
    assert statuses(sh) == before == {FIRST: "input_required", SECOND: "input_required"}


def test_a_unique_prefix_names_its_run_or_interrupt(sh: Shell) -> None:
    reads = [
        ("show", FIRST, "--json"),
        ("show", FIRST[:9], "--json"),
        ("record", FIRST[:9], "--json"),
        ("trace", FIRST[:9], "--json"),
        ("artifacts", FIRST[:9], "--json"),
        ("packet", FIRST[:9]),
    ]
    shown, same, recorded, traced, artifacts, packet = sh.many(*reads)
    for done in (shown, same, recorded, traced, artifacts, packet):
        assert done.returncode == 0, done.stderr
    assert json.loads(shown.stdout) == json.loads(same.stdout)
    assert json.loads(shown.stdout)["result"]["run_id"] == FIRST
    assert json.loads(recorded.stdout)["run_id"] == FIRST
    conversations = {
        s["attributes"].get("gen_ai.conversation.id") for s in json.loads(traced.stdout)
    }
    assert conversations - {None} == {FIRST}
    assert json.loads(artifacts.stdout) == []
    assert FIRST in packet.stdout and SECOND not in packet.stdout

    approved = sh("approve", f"{FIRST[:9]}.i8", "--as", "alice", "--json")  # RUN-PREFIX.iN
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["interrupt_id"] == f"{FIRST}.i8"
    denied = sh("deny", SECOND[:9], "--as", "alice")  # the one interrupt still pending
    assert denied.returncode == 0, denied.stderr
    assert denied.stdout.strip() == f"denied {SECOND}.i8"
    assert statuses(sh) == {FIRST: "queued", SECOND: "queued"}


def test_the_inbox_fits_80_columns_and_never_wraps_an_id(sh: Shell) -> None:
    listed = sh("inbox")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    for run_id in (FIRST, SECOND):
        assert sum(f"{run_id}.i8" in line for line in lines) == 1
    assert sum("Refund 500.0 EUR on order A-0" in line for line in lines) == 2
    assert sum("needs finance" in line for line in lines) == 2


EXEMPT_FROM_JSON = {
    "worker": "drives runs until stopped",
    "serve": "serves until stopped",
    "migrate": "changes the schema",
    "deny": "records a denial",
    "release request": "asks a releaser for an approval",
    "release deny": "records a denial",
    "release watch": "judges a canary and may roll it back",
    "revoke": "records a revocation",
    "schedule add": "adds",
    "schedule remove": "removes",
    "trigger add": "adds",
    "trigger remove": "removes",
    "token revoke": "revokes",
    "packet": "prints JSON always",
    "kb approve": "records an approval",
}


def commands() -> dict[str, Any]:
    """Every command of `contextos`, by its path (`schedule add`), as Typer builds it."""
    found: dict[str, Any] = {}

    def walk(group: Any, path: str) -> None:
        for name, cmd in group.commands.items():
            here = f"{path} {name}".strip()
            if hasattr(cmd, "commands"):
                walk(cmd, here)
            else:
                found[here] = cmd

    walk(typer.main.get_command(app), "")
    return found


def test_every_command_that_reads_prints_json(sh: Shell) -> None:
    without = [
        path
        for path, cmd in commands().items()
        if "--json" not in {o for p in cmd.params for o in p.opts} and path not in EXEMPT_FROM_JSON
    ]
    assert without == []
    for setup in (
        ("schedule", "add", "nightly", REFUNDS, "--cron", "0 6 * * *"),
        ("trigger", "add", "after", REFUNDS, "--after", "refunds"),
        ("token", "create", "--tenant", "acme", "--user", "alice"),
        ("limit", "3"),
    ):
        assert sh(*setup).returncode == 0
    reads = {
        "runs": ("runs", "--json"),
        "show": ("show", FIRST, "--json"),
        "inbox": ("inbox", "--json"),
        "workers": ("workers", "--all", "--json"),
        "artifacts": ("artifacts", FIRST, "--json"),
        "record": ("record", FIRST, "--json"),
        "trace": ("trace", FIRST, "--json"),
        "limit": ("limit", "--json"),
        "schedule list": ("schedule", "list", "--json"),
        "trigger list": ("trigger", "list", "--json"),
        "token list": ("token", "list", "--json"),
        "doctor": ("doctor", "--json", "--model", "nonsense"),
    }
    out = {name: done for name, done in zip(reads, sh.many(*reads.values()), strict=True)}
    for name, done in out.items():  # doctor fails on this machine's model, in JSON too
        assert done.returncode == (1 if name == "doctor" else 0), (name, done.stderr)
    data = {name: json.loads(done.stdout) for name, done in out.items()}
    assert {r["run_id"] for r in data["runs"]} == {FIRST, SECOND}
    assert data["show"]["result"]["status"] == "input_required"
    assert sorted(i["interrupt_id"] for i in data["inbox"]) == [f"{FIRST}.i8", f"{SECOND}.i8"]
    assert data["workers"] == [] or all("worker_id" in w for w in data["workers"])
    assert data["artifacts"] == []
    assert data["record"]["run_id"] == FIRST
    assert data["trace"] and all(s["trace_id"] for s in data["trace"])
    assert [lim["max_running"] for lim in data["limit"]] == [3]
    assert [s["name"] for s in data["schedule list"]] == ["nightly"]
    assert [t["name"] for t in data["trigger list"]] == ["after"]
    assert [t["user"] for t in data["token list"]] == ["alice"]
    assert {c["name"] for c in data["doctor"]} >= {"store"}


def test_every_command_has_examples_that_parse_and_help_that_fits_80_columns(
    tmp_path: Path,
) -> None:
    sh = Shell(tmp_path)
    found = commands()
    helps = sh.many(*((*path.split(), "--help") for path in found))
    for (path, cmd), done in zip(found.items(), helps, strict=True):
        assert done.returncode == 0, (path, done.stderr)
        text = done.stdout
        assert max(len(line) for line in text.splitlines()) <= 80, (path, text)
        assert "<bool>" not in text, path  # flags show as flags
        defaults = [
            p
            for p in cmd.params
            if p.param_type_name == "option"
            and p.default not in (None, False, "", ())
            and p.show_default is not False
            and not p.hidden
        ]
        assert text.count("[default:") >= len(defaults), (path, text)
        _, marker, examples = text.partition("\n  Examples:\n")
        assert marker, path
        lines = [line.strip() for line in examples.strip().splitlines()]
        assert lines, path
        for line in lines:
            words = shlex.split(line.replace("$(", " ").replace(")", " "), comments=True)
            words = words[words.index("contextos") + 1 :]
            if ">" in words:
                words = words[: words.index(">")]
            assert " ".join(words).startswith(path), (path, line)
            args = words[len(path.split()) :]
            cmd.make_context(path, args)  # a usage error fails the test


def test_shell_completion_is_on(tmp_path: Path) -> None:
    sh = Shell(tmp_path)
    script = sh("--show-completion", "bash", store=False)
    assert script.returncode == 0, script.stderr
    assert "_CONTEXTOS_COMPLETE=complete_bash" in script.stdout
    sh.env.update(_CONTEXTOS_COMPLETE="complete_bash", COMP_WORDS="contextos ru", COMP_CWORD="1")
    completed = sh(store=False)
    assert completed.stdout.split() == ["run", "runs"]
