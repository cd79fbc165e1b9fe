"""`contextos kb scan PATH` through the command line, and a daily schedule that starts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kbsample import SAMPLE, planted

from contextos import RunStatus, Runtime
from contextos.jobs.kb import Report, ScanRequest
from contextos.workers.scheduler import fire_schedules
from support.processes import ended, spawn_worker, stop_all

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = "tests/jobs/kb_targets.py:flow"


def contextos(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def kb_scan(kb: Path, tmp: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return contextos(
        *("kb", "scan", str(kb), "--sample-site", "--workflow", SCRIPTED),
        *("--store", str(tmp / "runs.db"), "--index", str(tmp / "index.db"), *more),
    )


def test_the_command_prints_the_report_then_only_what_changed(kb: Path, tmp_path: Path) -> None:
    first = kb_scan(kb, tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("# Knowledge-base scan\n")
    assert f"**{len(planted())} new**, 0 still open, 0 fixed" in first.stdout
    assert "Six dead external links" in first.stdout  # the writer's prose, marked as such

    page = kb / "docs/getting-started.md"
    page.write_text(page.read_text().replace("(ingest/http.md)", "(ingest/http-api.md)"))
    second = kb_scan(kb, tmp_path, "--json")
    assert second.returncode == 0, second.stderr
    report = Report.model_validate_json(second.stdout)
    assert (report.counts.new, report.counts.fixed, report.reread) == (0, 1, 1)
    (fixed,) = report.fixed
    assert (fixed.path, fixed.target) == ("docs/getting-started.md", "ingest/http.md")

    full = kb_scan(kb, tmp_path, "--full", "--json")
    assert full.returncode == 0, full.stderr
    again = Report.model_validate_json(full.stdout)
    assert again.reread == again.pages == 61 and again.counts.new == 0


def test_a_path_that_is_not_a_folder_is_one_line_of_error(tmp_path: Path) -> None:
    done = kb_scan(tmp_path / "nowhere", tmp_path)
    assert done.returncode == 1
    assert "is not a folder" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs.db").exists()


def test_kb_daily_is_added_with_the_built_in_workflow(tmp_path: Path) -> None:
    request = ScanRequest(root=str(SAMPLE)).model_dump_json()
    store = str(tmp_path / "runs.db")
    added = contextos(
        *("schedule", "add", "kb-daily", "contextos.jobs.kb:kb_scan", "--cron", "0 6 * * *"),
        *("--input", request, "--store", store),
    )
    assert added.returncode == 0, added.stderr
    listed = contextos("schedule", "list", "--json", "--store", store)
    (schedule,) = json.loads(listed.stdout)
    assert (schedule["name"], schedule["cron"]) == ("kb-daily", "0 6 * * *")


async def test_the_daily_schedule_fires_the_scan_and_a_worker_runs_it(
    kb: Path, tmp_path: Path
) -> None:
    store = str(tmp_path / "runs.db")
    request = ScanRequest(root=str(kb), index=str(tmp_path / "index.db"), sample_site=0)
    added = contextos(
        *("schedule", "add", "kb-daily", SCRIPTED, "--cron", "0 6 * * *"),
        *("--input", request.model_dump_json(), "--store", store),
    )
    assert added.returncode == 0, added.stderr
    tomorrow = datetime.now(UTC).replace(hour=6, minute=0, second=2) + timedelta(days=1)
    worker = spawn_worker(store, tmp_path / "worker.log", "--no-schedules")
    try:
        async with Runtime(store) as rt:
            (fired,) = await fire_schedules(rt, now=tomorrow)
            ((_, run_id),) = fired.runs
            assert await ended(rt, run_id, timeout_s=240) is RunStatus.COMPLETED
            report = Report.model_validate((await rt.result(run_id)).structured_output)
    finally:
        stop_all([worker])
    assert report.counts.new == len(planted())


def test_the_fix_from_the_command_line_waits_for_an_editor_then_writes(
    kb: Path, tmp_path: Path
) -> None:
    nobody = kb_scan(kb, tmp_path, "--fix", "frontmatter")  # no policy names a kb-editor
    assert nobody.returncode == 1 and "role kb-editor" in nobody.stderr
    policy = tmp_path / "policy.toml"
    policy.write_text('name = "people"\n[roles]\nkb-editor = ["erin"]\n')
    with_policy = ("--fix", "frontmatter", "--policy", str(policy))
    proposed = kb_scan(kb, tmp_path, *with_policy)
    assert proposed.returncode == 0, proposed.stderr
    assert "the fix waits for approval" in proposed.stderr
    assert "blast radius: writes 2 file(s)" in proposed.stderr
    interrupt = proposed.stderr.split("contextos kb approve ", 1)[1].split()[0]
    store = str(tmp_path / "runs.db")
    approve = ("kb", "approve", interrupt, "--policy", str(policy), "--store", store)
    refused = contextos(*approve, "--as", "mallory")
    assert refused.returncode == 1 and "kb-editor" in refused.stderr
    approved = contextos(*approve, "--as", "erin")
    assert approved.returncode == 0, approved.stderr
    applied = kb_scan(kb, tmp_path, *with_policy)
    assert applied.returncode == 0, applied.stderr
    assert "frontmatter added to 2 file(s)" in applied.stderr
    assert (kb / "runbooks/compaction-stuck.md").read_text().startswith("---\ntitle:")


def test_the_commands_scans_share_one_daily_budget_and_say_when_it_is_spent(
    kb: Path, tmp_path: Path
) -> None:
    capped = ("--workflow", "tests/jobs/kb_targets.py:capped")
    assert kb_scan(kb, tmp_path, *capped).returncode == 0
    spent = kb_scan(kb, tmp_path, *capped, "--full")
    assert spent.returncode == 1
    said = " ".join((spent.stdout + spent.stderr).split())  # as printed, wrapped to the terminal
    assert "would take service:kb-scan@default past the daily cap of 6000 tokens" in said
