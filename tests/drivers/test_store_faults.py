"""A store another process has locked, that is read-only, or whose disk is full: every command
says so in one line naming the store and what to do, exits 1, and changes nothing recorded.

Real processes and real file systems: a second process holding SQLite's write lock, an
immutable file (`chattr +i`, which binds root too), a small tmpfs filled to the last byte.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENT = "tests/kernel/cli_agent.py:agent"


def contextos(store: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args, "--store", str(store)],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "80", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def recorded(store: Path) -> list[dict[str, object]]:
    done = contextos(store, "runs", "--json")
    assert done.returncode == 0, done.stderr
    return [{k: r[k] for k in ("run_id", "status", "last_seq")} for r in json.loads(done.stdout)]


def one_line(done: subprocess.CompletedProcess[str], store: Path, says: str) -> None:
    assert done.returncode == 1, done.stdout
    assert done.stderr.splitlines() == [
        f"error: the store sqlite://{store} {says}; nothing recorded was changed"
    ]


def unavailable(why: str) -> NoReturn:
    """Skip where this machine forbids it; under CI fail instead, as for a missing service."""
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run the read-only and full-disk store tests")
    pytest.skip(why)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    db = tmp_path / "runs.db"
    assert contextos(db, "run", AGENT, "Greet Ada", "--run-id", "run_kept").returncode == 0
    return db


def test_a_store_another_process_has_locked(store: Path) -> None:
    before = recorded(store)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n",
            str(store),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        started = contextos(
            store, "run", AGENT, "Greet Bo", "--run-id", "run_new", CONTEXTOS_BUSY_TIMEOUT="0.5"
        )
        assert recorded(store) == before  # reading goes on beside the writer
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    one_line(
        started,
        store,
        "is locked by another process (waited 0.5 s): let it finish and run the command "
        "again, or set CONTEXTOS_BUSY_TIMEOUT to wait longer",
    )
    assert recorded(store) == before


@pytest.fixture
def immutable(store: Path) -> Iterator[Path]:
    """The store's file made read-only for everyone, root included."""
    made = subprocess.run(["chattr", "+i", str(store)], capture_output=True, check=False)
    if made.returncode != 0:
        unavailable(f"chattr +i is not allowed here: {made.stderr!r}")
    try:
        yield store
    finally:
        subprocess.run(["chattr", "-i", str(store)], check=True)


def test_a_read_only_store(immutable: Path) -> None:
    before = recorded(immutable)
    content = immutable.read_bytes()
    readonly = (
        "is read-only: give this user write access to the file and its folder, or name "
        "another store with --store"
    )
    one_line(contextos(immutable, "run", AGENT, "Greet Bo"), immutable, readonly)
    assert recorded(immutable) == before  # reading a read-only store works
    assert immutable.read_bytes() == content


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of its own."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        unavailable(f"cannot mount a tmpfs here: {made.stderr!r}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_store_on_a_full_disk(store: Path, small_disk: Path) -> None:
    db = small_disk / "runs.db"
    shutil.copy(store, db)
    before = recorded(db)  # opened once: its WAL files exist
    with (small_disk / "filler").open("wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            pass  # the disk is full
    full = "is full (no space left for it): free some space and run the command again"
    one_line(contextos(db, "run", AGENT, "Greet Bo " + "x" * 20_000), db, full)
    (small_disk / "filler").unlink()
    assert recorded(db) == before
