"""examples/refund_approval.py runs as shipped, and its TOML policy is the same policy."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from contextos.policy import Policy

ROOT = Path(__file__).resolve().parents[2]


def test_the_refund_example_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "refund_approval.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "40 EUR refund: completed: Refunded 40.00 EUR on order A-1." in out
    assert "250 EUR refund: input_required" in out
    assert "[approval_required] Refund 250.0 EUR on order A-2" in out
    assert "250 EUR refund after approval: completed" in out
    assert "require_approval by refund-over-100 (role finance)" in out


def test_the_example_policy_file_matches_the_python_policy() -> None:
    spec = importlib.util.spec_from_file_location(
        "refund_example", ROOT / "examples/refund_approval.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from_file = Policy.load(ROOT / "examples" / "refund_policy.toml")
    python = module.POLICY
    assert from_file.snapshot_hash == python.snapshot_hash
