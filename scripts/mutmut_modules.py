"""Mutation score of the modules that carry the project's promises, each against its own tests.

mutmut mutates every operator, constant and call of a module; running the whole suite against
each of those mutants would take days on two cores, so each module is paired with the test files
that guard it and mutated on its own: a work directory per module under `.mutmut/` (a copy of
src/, tests/ and pyproject.toml with that pair's mutmut settings), then one line per module:
mutants, killed, survived, no test reached the code, timed out, and the score.

    python scripts/mutmut_modules.py              # every module (slow; make mutate)
    python scripts/mutmut_modules.py retry pii    # some of them
    python scripts/mutmut_modules.py --survivors retry  # only what the last run left uncaught
    cd .mutmut/retry && python -m mutmut show NAME # a surviving mutant's diff

The score is killed (timeouts included: the mutant hung the tests) over every mutant, the ones
no test reached included.

`--survivors` keeps a module's work directory and mutmut's verdicts: it copies today's src/,
tests/ and settings over it, first runs the mutants never checked (a run stopped half way, a
function changed since), then runs again every mutant not caught (survived, no test reached it,
interrupted) against today's tests. Killed mutants are not run again, so it takes minutes where
the full run takes hours; it proves that new tests kill the survivors they were written for.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutmut"


class Pair(NamedTuple):
    modules: list[str]
    """The files to mutate."""
    tests: list[str]
    """The tests that guard them."""
    only: tuple[str, ...] = ()
    """mutmut's names of the functions to mutate, when a module holds more than the promise."""
    timeout_multiplier: float = 15.0
    """mutmut gives up on a mutant after (its tests' time in the clean run + 1 s) times this
    (mutmut's default 15): lower for a pair whose hanging mutants would each cost minutes."""


_BOTH = ("append", "read", "_read_rows", "get_run", "list_runs")
_STORE_METHODS = (*_BOTH, "_submit", "_schedule_flush", "_take", "_flush", "_flush_later", "_spawn")
_SQLITE_HELPERS = (
    "_write",
    "_refuse",
    "_events",
    "_summary",
    "_write_batch",
    "_write_jobs",
    "_write_alone",
    "_deliver",
)

PAIRS: dict[str, Pair] = {
    # contract.py also builds tools from functions; that part is guarded by other test files.
    "retry": Pair(
        ["src/contextos/tools/contract.py"],
        ["tests/tools/test_retry_contract.py"],
        ("contextos.tools.contract.xǁRetryPolicyǁ*",),
    ),
    # The runner also carries policy, approvals, confirmations, a person's answers to the asking
    # tools, forks and the concurrent reads of one turn through the ledger.
    "effects": Pair(
        ["src/contextos/tools/effects.py", "src/contextos/ledger.py"],
        [
            "tests/tools/test_effects.py",
            "tests/tools/test_ledger_records.py",
            "tests/tools/test_concurrent_reads.py",
            "tests/interrupts/test_approvals.py",
            "tests/interrupts/test_ask.py",
            "tests/tools/test_retry_contract.py",
            "tests/tools/test_gateway.py",
            "tests/tools/test_wedging.py",
            "tests/interrupts/test_confirmation.py",
            "tests/evidence/test_fork.py",
        ],
    ),
    # Every mutant of `apply` runs every paired test: the pure ones only, no runtime or store.
    "fold": Pair(
        ["src/contextos/state.py", "src/contextos/events.py"],
        [
            "tests/kernel/test_fold.py",
            "tests/kernel/test_events.py",
            "tests/kernel/test_people_fold.py",
        ],
    ),
    # The fence, the log's reads, the run summary and SQLite's group commit; connecting,
    # migrating, snapshots and the queue's writes are guarded by other test files. A mutant of
    # the group commit that loses a caller's answer hangs that caller's append: mutmut's
    # default would wait about 90 s for each, so it gives up after a quarter of that (about
    # 20 s). On a loaded machine a mutant's tests alone can take that long: read a timed-out
    # mutant's diff before counting it as caught.
    "store": Pair(
        [
            "src/contextos/store/sqlite.py",
            "src/contextos/store/postgres.py",
            "src/contextos/store/base.py",
        ],
        ["tests/store/test_conformance.py", "tests/store/test_sqlite_group_commit.py"],
        tuple(
            f"contextos.store.{name}__mutmut_*"
            for name in (
                *(f"sqlite.xǁSqliteStoreǁ{f}" for f in _STORE_METHODS),
                *(f"postgres.xǁPostgresStoreǁ{f}" for f in _STORE_METHODS if f in _BOTH),
                "sqlite.xǁ_Appendǁ__call__",
                *(f"sqlite.x_{f}" for f in _SQLITE_HELPERS),
                *(
                    f"postgres.x_{f}"
                    for f in ("_events", "_last_seq", "_status", "_summary", "_utc")
                ),
                *(
                    f"base.x_{f}"
                    for f in ("check_batch", "encode_batch", "_why", "summarize", "run_filter")
                ),
            )
        ),
        timeout_multiplier=4.0,
    ),
    # The engine's rules, conditions, limits and repeat guard are proven end to end in runs.
    "policy": Pair(
        ["src/contextos/policy/engine.py"],
        [
            "tests/policy/test_engine.py",
            "tests/policy/test_rules.py",
            "tests/policy/test_fail_closed.py",
            "tests/policy/test_containment.py",
        ],
    ),
    # The history summary is redacted on its way out of compaction: proven where compaction runs.
    "pii": Pair(
        ["src/contextos/middleware/pii.py"],
        ["tests/middleware/test_pii.py", "tests/middleware/test_context_layers.py"],
    ),
    # The layer called directly and one real run; the other real runs and the public corpora,
    # which every mutant reaching the layer would run, are in test_sanitize_runs.py.
    "sanitize": Pair(
        ["src/contextos/middleware/sanitize.py", "src/contextos/untrusted.py"],
        ["tests/middleware/test_sanitize.py"],
    ),
    # The words a pattern needs, the fold, and that no pattern is skipped on a corpus text.
    "prefilter": Pair(["src/contextos/prefilter.py"], ["tests/middleware/test_prefilter.py"]),
    "budget": Pair(["src/contextos/middleware/budget.py"], ["tests/middleware/test_budget.py"]),
    "leases": Pair(["src/contextos/store/queue_sql.py"], ["tests/store/test_queue.py"]),
    "schedules": Pair(["src/contextos/workers/scheduler.py"], ["tests/workers/test_schedules.py"]),
    "webhooks": Pair(
        ["src/contextos/workers/triggers.py"],
        ["tests/api/test_webhooks.py", "tests/triggers/test_triggers.py"],
    ),
}

EXTRAS = ("docs", "examples")
"""Folders besides src/ and tests/ that the tests read."""

CAUGHT = ("killed", "timeout", "caught by type check")
"""The verdicts a rerun of the survivors leaves alone."""


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def prepare(name: str, pair: Pair, *, keep: bool = False) -> Path:
    """Copy today's code, tests and settings into the module's work directory; with `keep`,
    over the one an earlier run left (its `mutants/` and verdicts stay)."""
    work = WORK / name
    if keep and not (work / "mutants").is_dir():
        sys.exit(f"{name} has no earlier run to take up: run `make mutate MODULES={name}` first")
    folders = ("src", "tests", *EXTRAS)  # some tests read the docs' samples or the examples
    for gone in [work / folder for folder in folders] if keep else [work]:
        shutil.rmtree(gone, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    # copytree keeps modification times: mutmut regenerates only a mutated file that changed.
    for folder in folders:
        shutil.copytree(ROOT / folder, work / folder, ignore=shutil.ignore_patterns("__pycache__"))
    settings = f"""
[tool.mutmut]
source_paths = ["src/"]
only_mutate = {_toml_list(pair.modules)}
pytest_add_cli_args_test_selection = {_toml_list(pair.tests)}
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]
use_git_change_detection = false
timeout_multiplier = {pair.timeout_multiplier}
also_copy = {_toml_list([f"{extra}/" for extra in EXTRAS])}
"""
    (work / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + settings)
    return work


def score(name: str, children: int, *, survivors: bool = False) -> Counter[str]:
    pair = PAIRS[name]
    work = prepare(name, pair, keep=survivors)
    # The copy under mutants/ must be the code the tests import, not a PYTHONPATH entry.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def mutmut(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "mutmut", *args], cwd=work, env=env, capture_output=True
        )
        return done.stdout.decode(errors="replace")

    run = ("run", "--max-children", str(children))
    # Without names mutmut runs only the mutants it has no verdict for (all of them, the first
    # time); named mutants are run again whatever their verdict. So a pair that names its
    # functions takes up a run by naming only the mutants not caught, the unchecked among them.
    if not (survivors and pair.only):
        mutmut(*run, *pair.only)
    if survivors:
        uncaught = [
            m
            for m, status in verdicts(mutmut("results", "--all", "true"), pair.only)
            if status not in CAUGHT
        ]
        if uncaught:
            mutmut(*run, *uncaught)
    return Counter(status for _, status in verdicts(mutmut("results", "--all", "true"), pair.only))


def verdicts(results: str, only: tuple[str, ...]) -> list[tuple[str, str]]:
    """(mutant, verdict) from `mutmut results --all true`, for the functions the pair names."""
    found = re.findall(r"^\s*(\S+__mutmut_\d+): (.+)$", results, re.MULTILINE)
    return [
        (name, status.strip())
        for name, status in found
        if not only or any(fnmatch(name, pattern) for pattern in only)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="MODULE", help=", ".join(PAIRS))
    parser.add_argument("--children", type=int, default=1, help="mutants run at once")
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="take up the last run: check what it left unchecked, rerun what it did not catch",
    )
    opts = parser.parse_args()
    unknown = set(opts.names) - set(PAIRS)
    if unknown:
        parser.error(f"unknown module {', '.join(sorted(unknown))}; choose from {', '.join(PAIRS)}")
    print("| module | tests | mutants | killed | survived | no test | timeout | score |")
    print("|---|---|---|---|---|---|---|---|")
    for name in opts.names or list(PAIRS):
        c = score(name, opts.children, survivors=opts.survivors)
        total = sum(c.values())
        caught = c["killed"] + c["timeout"]
        pct = f"{100 * caught / total:.0f}%" if total else "-"
        files = ", ".join(f"`{t}`" for t in PAIRS[name].tests)
        cells = [total, c["killed"], c["survived"], c["no tests"], c["timeout"], pct]
        print(f"| {name} | {files} | " + " | ".join(str(x) for x in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
