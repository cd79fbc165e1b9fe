"""Operating workers from the command line: worker, workers, limit, schedule, runs --status,
doctor, on both backends. `contextos worker` runs as a real process (it takes signals); the
other commands run in this process through the real CLI app."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result
from worker_helpers import AGENTS

from contextos import Runtime, load_agent
from contextos.cli import app
from contextos.runs import RunStatus
from support.processes import ROOT, stop_all, wait_for_file

SLOW = f"{AGENTS}:slow"


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(
        app, list(args), env={"NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    )


def cli_json(*args: str) -> Any:
    done = cli(*args, "--json")
    assert done.exit_code == 0, done.stderr
    return json.loads(done.stdout)


def cli_worker(store: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "contextos",
                "worker",
                "--store",
                store,
                "--worker-id",
                "cli-worker",
                "--poll",
                "0.1",
                "--log-level",
                "WARNING",
            ],
            cwd=ROOT,
            env={**os.environ, **env},
            stderr=out,
        )


def test_worker_and_workers_commands(backend_url: str, tmp_path: Path) -> None:
    async def start() -> str:
        async with Runtime(backend_url) as rt:
            return await rt.start(load_agent(SLOW), "x", agent_ref=SLOW)

    async def status(rid: str) -> RunStatus:
        async with Runtime(backend_url) as rt:
            return (await rt.state(rid)).status

    rid = asyncio.run(start())
    proc = cli_worker(backend_url, tmp_path / "worker.log", {"CONTEXTOS_TEST_DIR": str(tmp_path)})
    try:
        wait_for_file(tmp_path / f"started-{rid}")
        listed = cli_json("workers", "--store", backend_url)
        (mine,) = [w for w in listed if w["worker_id"] == "cli-worker"]
        assert mine["status"] == "running"
        assert [lease["run_id"] for lease in mine["leases"]] == [rid]
        table = cli("workers", "--store", backend_url)
        assert "cli-worker" in table.stdout and rid in table.stdout

        running = cli_json("runs", "--store", backend_url, "--status", "running")
        assert [r["run_id"] for r in running] == [rid]
        assert cli_json("runs", "--store", backend_url, "--status", "completed") == []

        proc.send_signal(signal.SIGTERM)
        (tmp_path / "go").touch()
        assert proc.wait(timeout=30) == 0, (tmp_path / "worker.log").read_text()
    finally:
        stop_all([proc])
    assert asyncio.run(status(rid)) is RunStatus.QUEUED  # handed back on drain
    assert cli_json("workers", "--store", backend_url) == []  # a stopped worker is not live
    stopped = cli_json("workers", "--store", backend_url, "--all")
    assert [w["status"] for w in stopped if w["worker_id"] == "cli-worker"] == ["stopped"]


def test_limit_command(backend_url: str) -> None:
    assert cli("limit", "--store", backend_url).exit_code == 1  # reading creates no store
    cli_json("limit", "3", "--store", backend_url)
    cli_json("limit", "1", "--tenant", "acme", "--store", backend_url)
    limits = cli_json("limit", "2", "--agent", "*", "--store", backend_url)
    assert sorted((x["scope"], x["name"], x["max_running"]) for x in limits) == [
        ("agent", "*", 2),
        ("global", "", 3),
        ("tenant", "acme", 1),
    ]
    after = cli_json("limit", "--tenant", "acme", "--remove", "--store", backend_url)
    assert sorted(x["scope"] for x in after) == ["agent", "global"]


def test_schedule_commands(backend_url: str) -> None:
    added = cli(
        "schedule",
        "add",
        "morning",
        f"{AGENTS}:ticker",
        "--cron",
        "0 6 * * *",
        "--input",
        "the report",
        "--catch-up",
        "run_once",
        "--timezone",
        "Europe/Paris",
        "--store",
        backend_url,
    )
    assert added.exit_code == 0, added.stderr
    assert "next tick" in added.stdout
    (listed,) = cli_json("schedule", "list", "--store", backend_url)
    assert (listed["name"], listed["cron"], listed["input"], listed["catch_up"]) == (
        "morning",
        "0 6 * * *",
        "the report",
        "run_once",
    )
    assert listed["timezone"] == "Europe/Paris"

    again = cli(
        "schedule",
        "add",
        "morning",
        f"{AGENTS}:ticker",
        "--cron",
        "0 7 * * *",
        "--store",
        backend_url,
    )
    assert again.exit_code == 1 and "exists already" in again.stderr
    bad = cli(
        "schedule", "add", "x", f"{AGENTS}:ticker", "--cron", "at dawn", "--store", backend_url
    )
    assert bad.exit_code == 1 and "cron" in bad.stderr
    policy = cli(
        "schedule",
        "add",
        "y",
        f"{AGENTS}:ticker",
        "--cron",
        "0 6 * * *",
        "--catch-up",
        "sometimes",
        "--store",
        backend_url,
    )
    assert policy.exit_code == 1 and "catch-up" in policy.stderr

    assert cli("schedule", "remove", "morning", "--store", backend_url).exit_code == 0
    missing = cli("schedule", "remove", "morning", "--store", backend_url)
    assert missing.exit_code == 1 and "no schedule named" in missing.stderr
    assert cli_json("schedule", "list", "--store", backend_url) == []


def test_doctor_checks_without_changing_anything(backend_url: str) -> None:
    if backend_url.startswith("postgresql://"):
        fresh = cli("doctor", "--store", backend_url, "--model", "local", "--json")
        assert fresh.exit_code == 1
        checks = {c["name"]: c for c in json.loads(fresh.stdout)}
        assert checks["store"]["ok"] and not checks["migrations"]["ok"]
        assert "version 0" in checks["migrations"]["detail"]
        again = cli("doctor", "--store", backend_url, "--model", "local", "--json")
        assert json.loads(again.stdout) == json.loads(fresh.stdout)  # it created nothing

    async def first_use() -> None:
        async with Runtime(backend_url) as rt:
            await rt.runs()  # migrates

    asyncio.run(first_use())
    ok = cli("doctor", "--store", backend_url, "--model", "local", "--json")
    checks = {c["name"]: c for c in json.loads(ok.stdout)}
    assert checks["store"]["ok"] and checks["migrations"]["ok"]
    assert checks["migrations"]["detail"].startswith("schema at version ")
    keyless = cli(
        "doctor",
        "--store",
        backend_url,
        "--model",
        "openai:gpt-4.1-mini",
        env={"OPENAI_API_KEY": ""},
    )
    assert keyless.exit_code == 1 and "OPENAI_API_KEY is not set" in keyless.stdout


def test_doctor_reports_an_unreachable_store(postgres_server: str) -> None:
    done = cli("doctor", "--store", "postgresql://ops:hunter2@127.0.0.1:9/nowhere", "--json")
    assert done.exit_code == 1
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert not checks["store"]["ok"] and "cannot connect" in checks["store"]["detail"]
    assert "hunter2" not in done.stdout
