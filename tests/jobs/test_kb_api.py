"""The scan is a built-in job written on the public API, and its own surface is deliberate."""

from __future__ import annotations

import ast
from pathlib import Path

import contextos
import contextos.errors
import contextos.graph
import contextos.jobs.kb as kb
import contextos.middleware
import contextos.policy
import contextos.tools

JOBS = Path(contextos.__file__).parent / "jobs"
PUBLIC = {
    "contextos": set(contextos.__all__),
    "contextos.graph": set(contextos.graph.__all__),  # what docs/graph.md imports
    "contextos.middleware": set(contextos.middleware.__all__),  # the budget gate, as docs show
    "contextos.policy": set(contextos.policy.__all__),
    "contextos.tools": set(contextos.tools.__all__),
    # the one error tree: its classes are the public contract of failures
    "contextos.errors": {n for n in vars(contextos.errors) if n.endswith(("Error", "Violation"))},
}


def test_the_job_imports_only_public_names() -> None:
    for path in sorted(JOBS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
                assert not [m for m in modules if m.startswith("contextos.")], path
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "contextos"
            ):
                continue
            module = node.module or ""
            if module.startswith("contextos.jobs"):
                continue
            assert module in PUBLIC, f"{path.name} imports from {module}"
            hidden = {a.name for a in node.names} - PUBLIC[module]
            assert not hidden, f"{path.name} imports {hidden} from {module}, which are not public"


def test_the_exports_are_sorted_and_importable() -> None:
    assert kb.__all__ == sorted(kb.__all__)
    for name in kb.__all__:
        assert getattr(kb, name) is not None
