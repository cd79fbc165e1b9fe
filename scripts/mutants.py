"""Break one promise at a time and check that a test notices.

Each mutant below is a single text patch that removes one invariant the project promises (the
append fence, retry only when the contract allows it, the freeze of terminal runs, ...). The
script copies `src/` to a temporary directory, applies one patch there, runs only the tests that
guard that promise with the copy first on PYTHONPATH (subprocesses the tests start see it too),
and reports which test killed the mutant, or that it survived. The working tree is never
touched. Every test selection is first run once on the unpatched copy: a selection that fails
there proves nothing and is reported as such.

    python scripts/mutants.py                 # every mutant (make mutate-invariants)
    python scripts/mutants.py retry fence     # only mutants whose name contains a word
    python scripts/mutants.py --list          # names and what each breaks

Exit status: 0 when every mutant was killed, 1 when one survived or a baseline failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMED_OUT = -1


@dataclass(frozen=True, kw_only=True, slots=True)
class Mutant:
    name: str
    """Short, unique; what the patch breaks."""
    breaks: str
    """The promise, in one line."""
    path: str
    """The file under src/contextos/ to patch."""
    old: str
    """Text that must occur exactly once in the file."""
    new: str
    tests: tuple[str, ...]
    """pytest arguments: the narrow selection that guards the promise."""


CONFORMANCE = "tests/store/test_conformance.py"
RETRY = "tests/tools/test_retry_contract.py"

MUTANTS = (
    Mutant(
        name="sqlite-append-fence",
        breaks="SQLite: an append must start right after the log's last seq",
        path="store/sqlite.py",
        old="f\" WHERE run_id = ? AND last_seq = ? AND NOT {is_terminal('status')}\"",
        new="f\" WHERE run_id = ? AND ? IS NOT NULL AND NOT {is_terminal('status')}\"",
        tests=(CONFORMANCE, "-k", "sqlite and (expected_seq or conflict or writers)"),
    ),
    Mutant(
        name="postgres-append-fence",
        breaks="PostgreSQL: an append must start right after the log's last seq",
        path="store/postgres.py",
        old="AND last_seq = %(expected)s ",
        new="",
        tests=(CONFORMANCE, "-k", "postgres and (expected_seq or conflict or writers)"),
    ),
    Mutant(
        name="freeze-forgets-expired",
        breaks="an expired run is frozen against SQL like every terminal run",
        path="store/migrations.py",
        old="_TERMINAL = \"('completed', 'failed', 'cancelled', 'expired')\"",
        new="_TERMINAL = \"('completed', 'failed', 'cancelled')\"",
        tests=(CONFORMANCE, "-k", "frozen or terminal"),
    ),
    Mutant(
        name="fold-accepts-gaps",
        breaks="the fold refuses a log with a gap or a repeated seq",
        path="state.py",
        old="    if event.seq != state.seq + 1:\n",
        new="    if event.seq <= state.seq:\n",
        tests=("tests/kernel/test_events.py",),
    ),
    Mutant(
        name="unknown-version-guessed",
        breaks="an event of a newer schema version stops loudly",
        path="codec.py",
        old="        if version > cls.SCHEMA_VERSION or version < 1:\n",
        new="        if version < 1:\n",
        tests=("tests/kernel/test_events.py", "-k", "unknown or version"),
    ),
    Mutant(
        name="retry-undeclared-errors",
        breaks="an error the contract does not declare safe is not retried",
        path="tools/contract.py",
        old="        return isinstance(error, self.safe_on)\n",
        new="        return True\n",
        tests=(RETRY,),
    ),
    Mutant(
        name="retry-unsafe-loses-precedence",
        breaks="unsafe_on wins over safe_on",
        path="tools/contract.py",
        old="        if attempt >= self.attempts or isinstance(error, self.unsafe_on):\n",
        new="        if attempt >= self.attempts:\n",
        tests=(RETRY,),
    ),
    Mutant(
        name="retry-one-attempt-too-many",
        breaks="`attempts` counts every attempt, the first included",
        path="tools/contract.py",
        old="        if attempt >= self.attempts or ",
        new="        if attempt > self.attempts or ",
        tests=(RETRY,),
    ),
    Mutant(
        name="retry-a-crashed-tool",
        breaks="a tool that crashed (SystemExit, its process killed) is never retried",
        path="tools/effects.py",
        old="again = not isinstance(exc, ToolCrashed) and ",
        new="again = ",
        tests=("tests/tools/test_wedging.py", "-k", "not worker"),
    ),
    Mutant(
        name="idempotency-key-shared-across-runs",
        breaks="an effect's idempotency key names its run, so two runs never share one",
        path="ledger.py",
        old='    return f"{run_id}/{call_id}"\n',
        new="    return call_id\n",
        tests=("tests/tools/test_effects.py", "-k", "keys_of_their_own or with_the_same_key"),
    ),
    Mutant(
        name="pii-skips-tool-call-arguments",
        breaks="tool-call arguments are redacted before the model sees them",
        path="middleware/pii.py",
        old="[text(c.arguments, counts) for c in m.tool_calls]",
        new="[c.arguments for c in m.tool_calls]",
        tests=("tests/middleware/test_pii.py",),
    ),
    Mutant(
        name="sanitizer-leaves-tool-results-bare",
        breaks="an untrusted tool result reaches the model inside the spotlight markers",
        path="middleware/sanitize.py",
        old="if e.trust is not TrustClass.UNTRUSTED or GUARD_SPOTLIGHT in e.guards",
        new="if True",
        # The self-contained tests: the corpus tests are in test_sanitize_runs.py.
        tests=("tests/middleware/test_sanitize.py",),
    ),
    Mutant(
        name="policy-rate-limit-off-by-one",
        breaks="a rate limit of N calls refuses the (N+1)th",
        path="policy/engine.py",
        old="used >= lim.max_calls",
        new="used > lim.max_calls",
        tests=("tests/policy/test_engine.py",),
    ),
    Mutant(
        name="policy-constraints-ignored",
        breaks="arguments that break a rule's constraints are denied",
        path="policy/engine.py",
        old="        if broken:  # even under a deny",
        new="        if False:  # even under a deny",
        tests=("tests/policy/test_engine.py",),
    ),
    Mutant(
        name="policy-repeat-writes-off-by-one",
        breaks="after `repeat_writes` identical successes, another needs a person",
        path="policy/engine.py",
        old="        if done < allowed:\n",
        new="        if done <= allowed:\n",
        tests=("tests/policy/test_fail_closed.py",),
    ),
    Mutant(
        name="budget-one-model-call-too-many",
        breaks="max_model_calls is a ceiling",
        path="middleware/budget.py",
        old="run.turns >= self.max_model_calls",
        new="run.turns > self.max_model_calls",
        tests=("tests/middleware/test_budget.py",),
    ),
    Mutant(
        name="budget-ignores-the-estimate",
        breaks="a call that would pass the run's token cap never reaches the model",
        path="middleware/budget.py",
        old="spent + estimate > self.run_tokens",
        new="spent > self.run_tokens",
        tests=("tests/middleware/test_budget.py",),
    ),
    Mutant(
        name="lease-claimed-while-live",
        breaks="a leased run is claimed again only after its lease expires",
        path="store/queue_sql.py",
        old="  AND (q.lease_owner IS NULL OR q.lease_expires_at <= {now})\n",
        new="",
        tests=("tests/store/test_queue.py", "-k", "claimed_again_only_after"),
    ),
    Mutant(
        name="schedule-fires-before-its-tick",
        breaks="a schedule does nothing before its next tick",
        path="workers/scheduler.py",
        old="    if schedule.next_tick_at > now:\n",
        new="    if False:\n",
        tests=("tests/workers/test_schedules.py",),
    ),
    Mutant(
        name="webhook-accepts-old-signatures",
        breaks="a signed delivery outside the time window is refused (no replays)",
        path="workers/triggers.py",
        old="                if not abs(skew) <= tolerance_s:",
        new="                if False:",
        tests=("tests/api/test_webhooks.py", "tests/triggers/test_triggers.py"),
    ),
    Mutant(
        name="network-private-ranges-reachable",
        breaks="a wildcard host pattern never reaches a private (RFC 1918) address",
        path="policy/network.py",
        old='        "10.0.0.0/8",  # private (RFC 1918)\n',
        new="",
        tests=("tests/policy/test_http_containment.py", "tests/policy/test_containment.py"),
    ),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    verdict: str
    """killed, timed out (the tests hung: caught too), survived, error (pytest could not run
    the tests), or invalid (the selection fails on the unpatched tree)."""
    by: str
    """The first test that failed, or the pytest summary line."""
    seconds: float


def run_tests(src: Path, tests: tuple[str, ...], limit_s: float) -> tuple[int, str]:
    """pytest's exit status and the first test that failed (or the summary line).

    A mutant can turn a loop endless; after `limit_s` the tests are stopped and the test that
    was running is named.
    """
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{ROOT / 'tests'}")
    args = [sys.executable, "-m", "pytest", "-x", "-v", "-p", "no:cacheprovider", *tests]
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: what the tests started stops with it
    )
    try:
        out, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        running = re.findall(r"^(tests/\S+::\S+)", out, re.MULTILINE)
        where = running[-1] if running else "the tests"
        return TIMED_OUT, f"{where} (stopped after {limit_s:.0f}s)"
    failed = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", out, re.MULTILINE)
    if failed:
        return proc.returncode, failed.group(1)
    last = [line for line in out.splitlines() if line.strip()]
    return proc.returncode, last[-1] if last else f"pytest exited {proc.returncode}"


def patch(original: Path, target: Path, mutant: Mutant) -> None:
    text = original.read_text()
    count = text.count(mutant.old)
    if count != 1:
        sys.exit(f"{mutant.name}: the text to replace occurs {count} times in {mutant.path}")
    target.write_text(text.replace(mutant.old, mutant.new))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="*", help="run only mutants whose name contains a word")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--limit", type=float, default=240, help="seconds a mutant's tests may take (240)"
    )
    opts = parser.parse_args()
    chosen = [m for m in MUTANTS if not opts.words or any(w in m.name for w in opts.words)]
    if opts.list or not chosen:
        for m in chosen or MUTANTS:
            print(f"{m.name:38} {m.breaks}")
        return 0 if chosen else 2

    results: list[tuple[Mutant, Outcome]] = []
    with tempfile.TemporaryDirectory(prefix="contextos-mutants-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
        baselines: dict[tuple[str, ...], tuple[int, str]] = {}
        for m in chosen:
            if m.tests not in baselines:
                baselines[m.tests] = run_tests(src, m.tests, opts.limit)
            code, why = baselines[m.tests]
            if code != 0:
                results.append((m, Outcome(verdict="invalid", by=why, seconds=0.0)))
                print(f"{m.name}: its tests fail on the unpatched tree: {why}", flush=True)
                continue
            original = ROOT / "src" / "contextos" / m.path
            target = src / "contextos" / m.path
            patch(original, target, m)
            started = time.monotonic()
            try:
                code, why = run_tests(src, m.tests, opts.limit)
            finally:
                shutil.copyfile(original, target)
            # pytest exits 1 when a test failed; anything else (2: interrupted, 3: internal error,
            # 4: usage, 5: no test ran) is not a test noticing the mutant.
            verdict = {0: "survived", 1: "killed", TIMED_OUT: "timed out"}.get(code, "error")
            outcome = Outcome(verdict=verdict, by=why, seconds=time.monotonic() - started)
            results.append((m, outcome))
            print(f"{m.name}: {verdict} ({outcome.seconds:.0f}s) {why}", flush=True)

    print("\n| mutant | breaks | verdict | killed by |\n|---|---|---|---|")
    for m, o in results:
        print(f"| `{m.name}` | {m.breaks} | {o.verdict} | `{o.by}` |")
    killed = sum(o.verdict in ("killed", "timed out") for _, o in results)
    print(f"\n{killed} of {len(results)} mutants killed (a mutant that hangs its tests counts)")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
