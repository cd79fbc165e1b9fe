"""`contextos inbox / approve / deny / answer / revoke`, run as real processes against a policy
file named by CONTEXTOS_POLICY."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from refunds import ledger

ROOT = Path(__file__).resolve().parents[2]
AGENT = "tests/interrupts/refunds.py:agent"

POLICY = """
name = "refunds"
version = "2026-11"

[roles]
finance = ["alice"]

[[rules]]
id = "refund-over-100"
tools = ["refund"]
decision = "require_approval"
approver_role = "finance"
reason = "refunds over 100 EUR need a finance approver"
preview = "Refund {amount} EUR on order {order_id}"
when = { amount = { gt = 100 } }
"""


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args, "--store", str(tmp / "runs.db")],
        cwd=ROOT,
        env={
            **os.environ,
            "NO_COLOR": "1",
            "COLUMNS": "250",
            "CONTEXTOS_POLICY": str(tmp / "policy.toml"),
            "REFUND_LEDGER": str(tmp / "refunds.db"),
            "CONTEXTOS_USER": "bob",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def start(tmp: Path) -> tuple[str, dict[str, object]]:
    started = cli(tmp, "run", AGENT, "refund order A-0", "--json")
    assert started.returncode == 0, started.stderr
    run = json.loads(started.stdout)
    assert run["status"] == "input_required"
    listed = cli(tmp, "inbox", "--json")
    (pending,) = [i for i in json.loads(listed.stdout) if i["run_id"] == run["run_id"]]
    return str(run["run_id"]), pending


def test_inbox_approve_resume_revoke(tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    run_id, pending = start(tmp_path)
    assert pending["kind"] == "approval_required"
    assert pending["prompt"] == "Refund 500.0 EUR on order A-0"
    assert pending["approver_roles"] == ["finance"]
    action = pending["action"]
    assert isinstance(action, dict) and action["arguments"] == {"order_id": "A-0", "amount": 500.0}

    table = cli(tmp_path, "inbox")
    assert "Refund 500.0 EUR on order A-0" in table.stdout and "finance" in table.stdout

    iid = str(pending["interrupt_id"])
    no_role = cli(tmp_path, "approve", iid, "--as", "dave")
    assert no_role.returncode == 1 and "dave does not hold finance" in no_role.stderr
    self_approval = cli(tmp_path, "approve", iid)  # --as defaults to $CONTEXTOS_USER (bob)
    assert self_approval.returncode == 1 and "bob does not hold finance" in self_approval.stderr
    forged = cli(tmp_path, "approve", iid, "--as", "alice", "--hash", "0" * 64)
    assert forged.returncode == 1 and "not the hash of the action" in forged.stderr

    approved = cli(
        tmp_path,
        "approve",
        iid,
        "--as",
        "alice",
        "--expires-in",
        "600",
        "--condition",
        "max_amount=1000",
        "--hash",
        str(action["hash"]),
        "--json",
    )
    assert approved.returncode == 0, approved.stderr
    approval = json.loads(approved.stdout)
    assert approval["approver"] == "alice" and approval["conditions"] == {"max_amount": 1000}

    revoked = cli(tmp_path, "revoke", str(approval["id"]), "--as", "alice", "--reason", "audit")
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in revoked.stdout

    again = cli(tmp_path, "resume", run_id, "--json")
    assert json.loads(again.stdout)["status"] == "input_required"  # the revoked approval
    (fresh,) = json.loads(cli(tmp_path, "inbox", "--json").stdout)
    assert any("revoked by alice" in r for r in fresh["reasons"])
    assert ledger(tmp_path / "refunds.db") == ([], 0)
    assert cli(tmp_path, "approve", fresh["interrupt_id"], "--as", "alice").returncode == 0

    resumed = cli(tmp_path, "resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert ledger(tmp_path / "refunds.db") == ([(f"{run_id}/call_1_0", "A-0", 500.0)], 1)
    assert cli(tmp_path, "inbox", "--json").stdout.strip() == "[]"

    shown = cli(tmp_path, "show", run_id)
    for expected in (
        "context_bound",
        "policy_decided",
        "interrupt_raised",
        "approval_granted",
        "approval_revoked",
    ):
        assert expected in shown.stdout


def test_deny_and_answer(tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    run_id, pending = start(tmp_path)
    iid = str(pending["interrupt_id"])
    wrong = cli(tmp_path, "answer", iid, "perhaps", "--as", "alice")
    assert wrong.returncode == 1 and "'approve' or 'deny'" in wrong.stderr
    denied = cli(tmp_path, "deny", iid, "--reason", "goodwill budget spent", "--as", "alice")
    assert denied.returncode == 0, denied.stderr
    resumed = cli(tmp_path, "resume", run_id, "--json")
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert ledger(tmp_path / "refunds.db") == ([], 0)
    missing = cli(tmp_path, "approve", "run_nope.i9", "--as", "alice")
    assert missing.returncode == 1 and "no interrupt with id" in missing.stderr
