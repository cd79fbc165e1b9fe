"""Store URLs, and stores a person can trust: reading never creates one, a bad one is one line.

Every command that only reads is fed every bad store form; each says what is wrong in one
line, exits non-zero, and leaves the directory exactly as it was.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from contextos import ConfigError, open_store
from contextos.cli import app
from contextos.store import SqliteStore, store_path

AGENT = "tests/kernel/cli_agent.py:agent"
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(
        app,
        list(args),
        env={"NO_COLOR": "1", "COLUMNS": "80", "CONTEXTOS_STORE": "", **(env or {})},
    )


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///abs/dir/runs.db", "/abs/dir/runs.db"),
        ("sqlite:////abs/dir/runs.db", "/abs/dir/runs.db"),
        ("sqlite:rel/runs.db", "rel/runs.db"),
        ("rel/runs.db", "rel/runs.db"),
        ("/abs/runs.db", "/abs/runs.db"),
    ],
)
def test_the_sqlite_url_forms(url: str, path: str) -> None:
    assert store_path(url) == Path(path)
    assert store_path(SqliteStore(Path(path)).url) == Path(path)  # a store's URL reads back


@pytest.mark.parametrize(
    "url", ["sqlite:", "sqlite://", "sqlite:///", "sqlite://host/x.db", "mysql://x"]
)
def test_malformed_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("sqlite:///abs/path.db")):
        open_store(url)


def test_absolute_and_relative_urls_name_the_files_they_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    agent = str(ROOT / AGENT)
    absolute = tmp_path / "abs" / "runs.db"
    assert cli("run", agent, "Greet Ada", "--store", f"sqlite://{absolute}").exit_code == 0
    assert absolute.exists()
    assert cli("run", agent, "Greet Ada", "--store", "sqlite:rel/runs.db").exit_code == 0
    assert (tmp_path / "rel" / "runs.db").exists()
    listed = cli("runs", "--store", "sqlite:rel/runs.db", "--json")
    assert listed.exit_code == 0 and '"agent_name": "greeter"' in listed.stdout


def test_a_reused_run_id_says_the_run_exists(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    agent = str(ROOT / AGENT)
    assert cli("run", agent, "Greet Ada", "--run-id", "run_once", "--store", db).exit_code == 0
    again = cli("run", agent, "Greet Ada", "--run-id", "run_once", "--store", db)
    assert again.exit_code == 1
    assert again.stderr.splitlines() == [
        "error: a run with id run_once exists already: choose another run id, or continue "
        "that run with `contextos resume run_once`"
    ]


READ_COMMANDS = [
    ("runs",),
    ("show", "run_x"),
    ("trace", "run_x"),
    ("inbox",),
    ("workers",),
    ("limit",),
    ("schedule", "list"),
    ("trigger", "list"),
    ("resume", "run_x"),
    ("cancel", "run_x"),
]


def bad_stores(tmp_path: Path) -> dict[str, str]:
    """Each bad store form, by what it is (files made here, in `tmp_path`)."""
    (tmp_path / "notes.txt").write_text("not a database\n")
    (tmp_path / "a-directory").mkdir()
    whole = SqliteStore(tmp_path / "whole.db")
    asyncio.run(whole.migrate())
    asyncio.run(whole.close())
    (tmp_path / "truncated.db").write_bytes((tmp_path / "whole.db").read_bytes()[:100])
    (tmp_path / "whole.db").unlink()
    return {
        "missing default": "",
        "missing file": str(tmp_path / "nothing-here.db"),
        "missing parent": f"sqlite://{tmp_path}/no/such/dir/runs.db",
        "text file": str(tmp_path / "notes.txt"),
        "truncated database": f"sqlite:{tmp_path / 'truncated.db'}",
        "directory": str(tmp_path / "a-directory"),
        "empty sqlite URL": "sqlite:",
        "sqlite URL with a host": "sqlite://host/runs.db",
        "unknown scheme": "mysql://localhost/db",
        "unreachable PostgreSQL": "postgresql://nobody@127.0.0.1:9/contextos?connect_timeout=2",
    }


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: " ".join(c))
def test_every_read_command_meets_every_bad_store_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:
    stores = bad_stores(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    for what, url in stores.items():
        done = cli(*command, env={"CONTEXTOS_STORE": url})
        assert isinstance(done.exception, SystemExit), (what, done.exception)
        assert done.exit_code == 1, (what, done.stdout)
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (what, done.stderr)
        assert snapshot(tmp_path) == before, what  # nothing created, nothing changed
    assert not os.path.exists(tmp_path / ".contextos")
