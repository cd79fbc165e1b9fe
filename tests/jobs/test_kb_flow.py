"""The scan as a workflow: the same findings as the deterministic scan, one scan node per
top-level directory given only its own part, counts that a bad model cannot move, and a run
killed at any point that resumes in a new process to the same report, without running a
finished node again or fetching a link again once its verdict was kept."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kb_targets import flow, nonsense
from kbsample import SAMPLE, key, planted, verifier_for

from contextos import RunId, RunStatus, Runtime
from contextos.jobs.kb import SCANNER, Finding, Fixture, Report, ScanRequest, scan_kb
from contextos.state import RunState, fold
from contextos.store import SqliteStore
from support.crashes import crash_env, kill_after_command

ROOT = Path(__file__).resolve().parents[2]
FLOW = "tests/jobs/kb_targets.py:flow"
APPENDS_IN_A_CLEAN_RUN = 29
"""To the workflow's own log: 10 nodes started and completed, the judge's two child runs (one
per doubted link) and the writer's."""
DURING_EACH_STAGE = (3, 5, 7, 9, 11, 13, 14, 15, 19, 21, 23, 24, 25, 27)
"""The appends after which a stage is under way: each node's `node_started`, the first
judge's child run started and finished, and the writer's child run started and finished."""
CHILDREN = ["run_k", "run_k.judge.0", "run_k.judge.1", "run_k.synthesis"]


async def scan(db: Path, request: ScanRequest, which: Any = flow) -> Report:
    async with Runtime(str(db)) as rt:
        result = await rt.run(which, request, principal=SCANNER)
        assert result.status is RunStatus.COMPLETED, result.failure_message
        return Report.model_validate(result.structured_output)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


async def test_the_workflow_finds_every_planted_fault_and_each_scan_node_sees_its_part_only(
    tmp_path: Path, site: Fixture
) -> None:
    request = ScanRequest(root=str(SAMPLE), index=str(tmp_path / "i.db"), sample_site=site.port)
    report = await scan(tmp_path / "runs.db", request)
    assert {key(f) for f in report.new} == planted()
    assert len(report.new) == len(planted()) and (report.open, report.fixed) == ((), ())
    assert report.counts.new == 29 and report.summary is not None

    async with Runtime(str(tmp_path / "runs.db")) as rt:
        (run,) = [r for r in await rt.runs() if r.agent_name == "kb-scan"]
        state = await rt.state(run.run_id)
    tasks = state.nodes["scan"].items
    assert tasks is not None
    # the root's own files (FAULTS.json) are a part of their own
    assert [t["part"] for t in tasks] == [".", "decisions", "docs", "runbooks"]
    assert all(set(t) == {"at", "part", "full", "rules", "previous"} for t in tasks)


async def test_the_second_run_reports_what_the_deterministic_scan_reports(
    kb: Path, tmp_path: Path, site: Fixture
) -> None:
    """Against `scan_kb` on an identical copy, which the manifest's tests pin."""
    twin = Path(__import__("shutil").copytree(kb, tmp_path / "twin"))
    request = ScanRequest(root=str(kb), index=str(tmp_path / "i.db"), sample_site=site.port)
    first = await scan(tmp_path / "runs.db", request)
    reference = await scan_kb(twin, index=tmp_path / "t.db", verifier=verifier_for(twin, site))
    for root in (kb, twin):
        edit(root / "docs/getting-started.md", "(ingest/http.md)", "(ingest/http-api.md)")
        edit(root / "runbooks/alert-storm.md", "## Check the alertmanager queue", "## Check it")
        (root / "decisions/0011-single-region-first.md").write_text("# Single region\n\n")

    second = await scan(tmp_path / "runs.db", request)
    again = await scan_kb(
        twin,
        index=tmp_path / "t.db",
        verifier=verifier_for(twin, site),
        previous=reference.report.current(),
    )
    assert [key(f) for f in first.new] == [key(f) for f in reference.report.new]
    for mine, theirs in ((second.new, again.report.new), (second.fixed, again.report.fixed)):
        assert [key(f) for f in mine] == [key(f) for f in theirs]
    assert second.counts.open == again.report.counts.open
    assert second.counts.new > 0 and second.counts.fixed > 0
    assert second.reread == again.plan.read == 3


async def test_removed_directories_are_forgotten_as_a_full_scan_would(
    kb: Path, tmp_path: Path, site: Fixture
) -> None:
    """A top-level directory that is gone, and the root's own files: no scan node is given
    them any more, and the reduce forgets what the index had of them."""
    request = ScanRequest(root=str(kb), index=str(tmp_path / "i.db"), sample_site=site.port)
    await scan(tmp_path / "runs.db", request)
    shutil.rmtree(kb / "decisions")
    (kb / "FAULTS.json").unlink()
    second = await scan(tmp_path / "runs.db", request)
    full = await scan_kb(kb, index=tmp_path / "fresh.db", verifier=verifier_for(kb, site))
    assert sorted(second.current(), key=Finding.sort_key) == list(full.report.new)
    assert second.pages == full.report.pages < 61
    assert any(f.path.startswith("decisions/") for f in second.fixed)
    assert any(f.target and "decisions/" in f.target for f in second.new)  # links to them


async def test_a_writer_that_answers_badly_changes_the_prose_never_the_counts(
    tmp_path: Path, site: Fixture
) -> None:
    def request(name: str) -> ScanRequest:
        index = str(tmp_path / f"{name}.db")
        return ScanRequest(root=str(SAMPLE), index=index, sample_site=site.port)

    good = await scan(tmp_path / "runs.db", request("good"))
    bad = await scan(tmp_path / "runs.db", request("bad"), nonsense)
    assert bad.summary == "0 new, 0 open: nothing is wrong at all."
    assert bad.counts == good.counts and bad.new == good.new
    assert "**29 new**" in bad.markdown()


# -- killed and resumed ------------------------------------------------------------------------


def env(log_dir: Path) -> dict[str, str]:
    return {**os.environ, "CRASH_LOG_DIR": str(log_dir), "NO_COLOR": "1"}


def request_text(tmp: Path, port: int) -> str:
    return ScanRequest(
        root=str(SAMPLE), index=str(tmp / "index.db"), sample_site=port
    ).model_dump_json()


def start(tmp: Path, port: int, kill_after: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        kill_after_command(
            tmp / "runs.db", "run_k", kill_after, FLOW, request_text(tmp, port), "own", SCANNER.id
        ),
        cwd=ROOT,
        env=crash_env(tmp),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def resume(tmp: Path) -> dict[str, Any]:
    store = str(tmp / "runs.db")
    done = subprocess.run(
        [sys.executable, "-m", "contextos", "resume", "run_k", "--json", "--store", store],
        cwd=ROOT,
        env=env(tmp),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def states(db: Path) -> dict[str, RunState]:
    async def read() -> dict[str, RunState]:
        store = SqliteStore(db)
        try:
            return {
                r.run_id: fold(await store.read(r.run_id)) for r in await store.list_runs(limit=100)
            }
        finally:
            await store.close()

    return asyncio.run(read())


def kept_links(index: Path) -> set[str]:
    """The URLs whose verdict the scan has kept."""
    if not index.exists():
        return set()
    db = sqlite3.connect(f"file:{index}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute("SELECT key FROM journal WHERE key LIKE 'link:http%'").fetchall()
    except sqlite3.OperationalError:  # not created yet
        return set()
    finally:
        db.close()
    return {r[0].removeprefix("link:") for r in rows}


def fetched(site: Fixture) -> Counter[str]:
    return Counter({k.split(" ", 1)[1]: n for k, n in site.hits.items()})


def path_of(url: str) -> str:
    return "/" + url.split("/", 3)[3] if url.count("/") >= 3 else "/"


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Report:
    tmp = tmp_path_factory.mktemp("clean")
    with Fixture() as site:
        proc = start(tmp, site.port, 0)
        out, errors = proc.communicate(timeout=180)
    assert proc.returncode == 0, errors
    assert int(out) == APPENDS_IN_A_CLEAN_RUN
    return Report.model_validate(states(tmp / "runs.db")["run_k"].structured_output)


def check_resumed(tmp: Path, site: Fixture, clean: Report, kept: set[str]) -> None:
    before = states(tmp / "runs.db")
    asked = Counter(json.loads(x)["run_id"] for x in _lines(tmp / "model.jsonl"))
    hits = fetched(site)
    assert resume(tmp)["status"] == "completed"
    after = states(tmp / "runs.db")
    run = after["run_k"]
    assert Report.model_validate(run.structured_output) == clean
    assert sorted(after) == CHILDREN  # each judge and the writer started once
    # no node ran twice: each started once and completed once
    events = asyncio.run(_events(tmp / "runs.db"))
    for kind in ("node_started", "node_completed"):
        counted = Counter(e.node for e in events if e.type == kind)
        assert set(counted.values()) == {1} and len(counted) == 10, kind
    # a link whose verdict was kept before the kill was not fetched again
    again = fetched(site) - hits
    assert not [url for url in kept if again[path_of(url)]]
    # a recorded answer was not asked for again: no page judged twice, no summary written twice
    now = Counter(json.loads(x)["run_id"] for x in _lines(tmp / "model.jsonl"))
    for child in CHILDREN[1:]:
        if child in before and before[child].turns:
            assert now[child] == asked[child], child


async def _events(db: Path) -> list[Any]:
    store = SqliteStore(db)
    try:
        return list(await store.read(RunId("run_k")))
    finally:
        await store.close()


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("n", DURING_EACH_STAGE)
def test_killed_during_each_stage_the_scan_resumes_to_the_same_report(
    tmp_path: Path, site: Fixture, clean: Report, n: int
) -> None:
    proc = start(tmp_path, site.port, n)
    _, errors = proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL, errors
    check_resumed(tmp_path, site, clean, kept_links(tmp_path / "index.db"))


class SlowSite(Fixture):
    """The sample's site, answering each request after a pause: a scan is still verifying
    links when it is killed."""

    def hit(self, method: str, path: str) -> int:
        time.sleep(0.4)
        return super().hit(method, path)


def test_killed_while_verifying_links_the_scan_fetches_only_what_it_had_not_kept(
    tmp_path: Path, clean: Report
) -> None:
    with SlowSite() as site:
        proc = start(tmp_path, site.port, 0)
        index = tmp_path / "index.db"
        deadline = time.monotonic() + 120
        while not (index.exists() and kept_links(index)):
            assert proc.poll() is None and time.monotonic() < deadline, "no verdict kept"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        kept = kept_links(index)
        gate = states(tmp_path / "runs.db")["run_k"].nodes["verify"]
        assert gate.status != "completed"  # killed in the middle of the gate
        check_resumed(tmp_path, site, clean, kept)
        assert kept and all(fetched(site)[path_of(u)] >= 1 for u in kept)


async def test_a_second_scan_of_an_unchanged_folder_reads_and_removes_nothing(
    tmp_path: Path, site: Fixture
) -> None:
    request = ScanRequest(root=str(SAMPLE), index=str(tmp_path / "i.db"), sample_site=site.port)
    first = await scan(tmp_path / "runs.db", request)
    second = await scan(tmp_path / "runs.db", request)
    assert second.reread == 0 and second.counts.open == first.counts.new == 29
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        last = next(r for r in await rt.runs() if r.agent_name == "kb-scan")  # newest first
        parts = (await rt.state(last.run_id)).nodes["scan"].output
    assert parts is not None
    # the root's own part never takes the top-level directories for removed files
    assert [(p["part"], p["removed"], p["read"]) for p in parts] == [
        (".", [], 0),
        ("decisions", [], 0),
        ("docs", [], 0),
        ("runbooks", [], 0),
    ]
