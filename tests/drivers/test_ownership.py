"""Every driver holds the run's lease: `contextos run`, a script's Runtime, a worker.

Real processes: a live run cannot be resumed from a second one (its owner is named), a signal
stops it cleanly (the step in flight is recorded, the run released, resume repeats nothing),
and a lease that lapsed lets resume go on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contextos import RunInUse, RunStatus, Runtime, load_agent
from contextos import events as ev
from contextos.runs import RunId
from contextos.store.queue import queue_of
from support.processes import ROOT, wait_for_file, wait_until

AGENT = "tests/drivers/slow_agent.py:agent"


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder the slow tool reports to (and waits for `go` in)."""
    monkeypatch.setenv("CONTEXTOS_TEST_DIR", str(tmp_path))
    return tmp_path


def env() -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def start(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *argv],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_cli(*args: str) -> subprocess.Popen[str]:
    return start("-m", "contextos", *args)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def calls(work: Path) -> list[str]:
    return (work / "calls.log").read_text().split("\n")[:-1]


async def events_of(db: Path, run_id: str) -> list[ev.Event]:
    async with Runtime(str(db)) as rt:
        return await rt.events(run_id)


async def test_resume_of_a_live_run_is_refused_naming_its_driver(
    work: Path, procs: list[subprocess.Popen[str]]
) -> None:
    db = work / "runs.db"
    driver = start_cli("run", AGENT, "two steps", "--run-id", "run_live", "--store", str(db))
    procs.append(driver)
    wait_for_file(work / "started-1")

    refused = cli("resume", "run_live", "--store", str(db))
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1, refused.stderr  # one line, no traceback
    assert f"pid {driver.pid}" in refused.stderr and "being driven by cli-" in refused.stderr

    shown = cli("show", "run_live", "--store", str(db))
    assert "live: driven by cli-" in shown.stdout and f"pid {driver.pid}" in shown.stdout
    assert "contextos resume" not in shown.stdout
    owner = json.loads(cli("show", "run_live", "--store", str(db), "--json").stdout)["owner"]
    assert owner["pid"] == driver.pid

    listed = json.loads(cli("workers", "--store", str(db), "--json").stdout)
    assert [(w["pid"], [lease["run_id"] for lease in w["leases"]]) for w in listed] == [
        (driver.pid, ["run_live"])
    ]

    (work / "go").touch()
    _, errs = driver.communicate(timeout=60)
    assert driver.returncode == 0, errs
    assert calls(work) == ["start 1", "end 1", "start 2", "end 2"]  # no step ran twice
    events = await events_of(db, "run_live")
    assert not any(isinstance(e, ev.RuntimeCrashDetected) for e in events)
    assert cli("workers", "--store", str(db), "--json").stdout.strip() == "[]"


def test_a_driver_killed_on_this_machine_is_not_shown_as_live(
    work: Path, procs: list[subprocess.Popen[str]]
) -> None:
    db = work / "runs.db"
    driver = start_cli("run", AGENT, "two steps", "--run-id", "run_dead", "--store", str(db))
    procs.append(driver)
    wait_for_file(work / "started-1")
    driver.kill()  # SIGKILL: its lease stays behind, unexpired
    driver.wait(timeout=30)
    shown = cli("show", "run_dead", "--store", str(db))
    assert "live:" not in shown.stdout
    assert "continue with `contextos resume run_dead`" in shown.stdout
    assert json.loads(cli("show", "run_dead", "--store", str(db), "--json").stdout)["owner"] is None


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
async def test_a_signal_records_the_step_in_flight_and_releases_the_run(
    work: Path, procs: list[subprocess.Popen[str]], sig: signal.Signals, code: int
) -> None:
    db = work / "runs.db"
    driver = start_cli("run", AGENT, "two steps", "--run-id", "run_sig", "--store", str(db))
    procs.append(driver)
    wait_for_file(work / "started-1")
    driver.send_signal(sig)
    (work / "go").touch()  # the tool finishes during the shutdown
    _, errs = driver.communicate(timeout=60)
    assert driver.returncode == code, errs
    assert "contextos resume run_sig" in errs and "Traceback" not in errs

    events = await events_of(db, "run_sig")
    assert [e.type for e in events][-2:] == ["tool_completed", "run_released"]
    assert "step 1 done" in str(events[-2])
    shown = cli("show", "run_sig", "--store", str(db))
    assert "released, resumable" in shown.stdout and f"stopped by {sig.name}" in shown.stdout

    resumed = cli("resume", "run_sig", "--store", str(db), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert calls(work) == ["start 1", "end 1", "start 2", "end 2"]  # nothing ran twice
    assert not any(isinstance(e, ev.RuntimeCrashDetected) for e in await events_of(db, "run_sig"))


async def test_a_second_signal_cuts_the_step_and_still_releases(
    work: Path, procs: list[subprocess.Popen[str]]
) -> None:
    db = work / "runs.db"
    driver = start_cli("run", AGENT, "two steps", "--run-id", "run_cut", "--store", str(db))
    procs.append(driver)
    wait_for_file(work / "started-1")
    driver.send_signal(signal.SIGINT)
    assert driver.stderr is not None
    assert "stopping after the current step" in driver.stderr.readline()  # (signals coalesce)
    driver.send_signal(signal.SIGINT)  # the tool never finishes: only the cut ends the step
    _, errs = driver.communicate(timeout=60)
    assert driver.returncode == 130, errs

    events = await events_of(db, "run_cut")
    assert [e.type for e in events][-2:] == ["model_responded", "run_released"]
    (work / "go").touch()
    resumed = cli("resume", "run_cut", "--store", str(db), "--json")
    assert json.loads(resumed.stdout)["status"] == "completed", resumed.stderr


async def test_a_script_runtime_holds_the_lease_and_lets_go_on_ctrl_c(
    work: Path, procs: list[subprocess.Popen[str]]
) -> None:
    db = work / "runs.db"
    script = (
        "import sys\n"
        "from contextos import load_agent, run\n"
        f"run(load_agent({AGENT!r}), 'two steps', store=sys.argv[1])\n"
    )
    proc = start("-c", script, str(db))
    procs.append(proc)
    wait_for_file(work / "started-1")
    async with Runtime(str(db)) as rt:
        (summary,) = await rt.runs()
        owner = await rt.owner(summary.run_id)
        assert owner is not None and owner.pid == proc.pid
        with pytest.raises(RunInUse):
            await rt.resume(summary.run_id, load_agent(AGENT))

        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert (await rt.events(summary.run_id))[-1].type == "run_released"
        assert await rt.owner(summary.run_id) is None


async def test_a_lapsed_lease_lets_resume_go_on(backend_url: str, work: Path) -> None:
    """A holder nobody can see die (another machine) is known gone when its lease lapses."""
    (work / "go").touch()
    agent = load_agent(AGENT)
    async with Runtime(backend_url) as rt:
        rid = await rt.start(agent, "two steps", agent_ref=AGENT)
        queue = queue_of(rt.store)
        assert queue is not None
        await queue.acquire(RunId(rid), "elsewhere-42", lease_s=0.5)
        with pytest.raises(RunInUse, match="elsewhere-42"):
            await rt.resume(rid)

        async def lapsed() -> bool:
            return await rt.owner(rid) is None

        await wait_until(lapsed, what="the lease to lapse")
        result = await rt.resume(rid)
        assert result.status is RunStatus.COMPLETED
    assert calls(work) == ["start 1", "end 1", "start 2", "end 2"]


async def test_follow_prints_each_event_as_it_is_recorded(
    work: Path, procs: list[subprocess.Popen[str]]
) -> None:
    db = work / "runs.db"
    driver = start_cli("run", AGENT, "two steps", "--follow", "--store", str(db))
    procs.append(driver)
    assert driver.stdout is not None
    seen = []
    while "slow_step" not in (line := driver.stdout.readline()):  # mid-run, the tool waits
        assert line, "the run ended before its events were printed"
        seen.append(line.split()[2] if line.startswith("#") else line)
    assert seen[:2] == ["run_created", "run_started"] and "model_responded" in line
    (work / "go").touch()
    rest, errs = driver.communicate(timeout=60)
    assert driver.returncode == 0, errs
    assert "tool_completed slow_step" in rest and "run_completed" in rest
