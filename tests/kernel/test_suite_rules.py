"""The suite keeps its own rules: no test may skip under CI, and docs/testing.md lists the
invariant mutants that scripts/mutants.py really applies."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _skips_without_a_ci_check(path: Path) -> list[str]:
    """Skips in a function (or a module-level statement) that never looks at CI, and the
    markers that skip without asking."""
    tree = ast.parse(path.read_text(), filename=str(path))
    scopes = [*tree.body, *(n for n in ast.walk(tree) if isinstance(n, FUNCTIONS))]
    checked = {  # every node inside a scope that looks at CI
        id(node)
        for scope in scopes
        if any(isinstance(c, ast.Constant) and c.value == "CI" for c in ast.walk(scope))
        for node in ast.walk(scope)
    }
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = ast.unparse(node)
        never = name in ("pytest.mark.skip", "pytest.mark.skipif")
        if never or (name in ("pytest.skip", "pytest.importorskip") and id(node) not in checked):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_every_skip_fails_under_ci_instead() -> None:
    """A test that needs a service or an optional package skips locally only when it is
    missing, and fails when CI is set: no promise is guarded by a test that may skip in CI."""
    offenders = [
        hit for path in sorted(TESTS.rglob("*.py")) for hit in _skips_without_a_ci_check(path)
    ]
    assert offenders == []


def test_docs_list_the_invariant_mutants_the_script_applies() -> None:
    listed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mutants.py"), "--list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    applied = {line.split()[0] for line in listed.splitlines() if line.strip()}
    documented = set(
        re.findall(r"^\| `([a-z-]+)` \|", (ROOT / "docs" / "testing.md").read_text(), re.M)
    )
    assert applied and documented == applied


def test_every_invariant_mutant_still_applies_to_todays_code() -> None:
    """A refactor that moves a guarded line must move its mutant too, or the mutant would
    silently stop breaking anything."""
    script = ROOT / "scripts" / "mutants.py"
    spec = importlib.util.spec_from_file_location("mutants", script)
    assert spec is not None and spec.loader is not None
    mutants = importlib.util.module_from_spec(spec)
    sys.modules["mutants"] = mutants  # dataclasses look their module up while building
    spec.loader.exec_module(mutants)
    src = ROOT / "src" / "contextos"
    stale = [m.name for m in mutants.MUTANTS if (src / m.path).read_text().count(m.old) != 1]
    assert stale == []
