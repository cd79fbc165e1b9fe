"""The shell samples of docs/control-room.md run as they are: `contextos token` issues the
tokens, and with them the API says who they are and streams a run's events."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
from api_server import serving

from contextos.api import ApiConfig

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "control-room.md"


def sample(holding: str) -> str:
    for found in re.finditer(r"```bash\n(.*?)```", DOC.read_text(), re.S):
        if holding in found.group(1):
            return found.group(1)
    raise AssertionError(f"docs/control-room.md has no bash sample with {holding!r}")


def test_the_token_and_stream_samples_run(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    env = {
        **os.environ,
        # the samples call `contextos` as a newcomer would: from the environment's bin
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "CONTEXTOS_STORE": store,
        "CONTEXTOS_POLICY": str(ROOT / "examples" / "refund_policy.toml"),
    }
    issued = subprocess.run(
        ["bash", "-ec", sample("contextos token create") + 'echo "$ALICE $BOB"'],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert issued.returncode == 0, issued.stderr
    *listing, tokens = issued.stdout.strip().splitlines()
    alice, bob = tokens.split()
    assert "alice" in "".join(listing) and "finance" in "".join(listing)
    assert alice not in "".join(listing)  # a token is shown once, never listed

    config = ApiConfig(
        store=store,
        agents=("examples/refund_approval.py:small_refund",),
        worker=True,
        policy=env["CONTEXTOS_POLICY"],
    )
    with serving(config) as base:
        run = httpx.post(
            f"{base}/v1/runs",
            params={"wait": "true", "timeout": "60"},
            json={"agent": "refunds", "input": "Refund order A-1"},
            headers={"Authorization": f"Bearer {bob}"},
            timeout=60,
        ).json()
        assert run["status"] == "completed", run
        shown = subprocess.run(
            ["bash", "-ec", sample("events/stream")],
            env={**env, "API": base, "ALICE": alice, "BOB": bob, "RUN": run["run_id"]},
            capture_output=True,
            text=True,
            timeout=120,
        )

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            command = [sys.executable, "-m", "contextos", "token", *args, "--store", store]
            return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

        listing = cli("list", "--json").stdout
        assert alice not in listing and bob not in listing  # never the secrets
        (bob_id,) = [t["token_id"] for t in json.loads(listing) if t["user"] == "bob"]
        assert bob_id in bob
        revoked = cli("revoke", bob_id)
        assert revoked.returncode == 0 and f"revoked token {bob_id}" in revoked.stdout
        refused = httpx.get(f"{base}/v1/runs", headers={"Authorization": f"Bearer {bob}"})
        assert refused.json()["error"]["code"] == "unauthenticated"
        again = cli("revoke", bob_id)
        assert again.returncode == 1 and "no live token" in again.stderr + again.stdout
    assert shown.returncode == 0, shown.stderr
    me, *stream = shown.stdout.splitlines()
    assert '"user":"alice"' in me and '"roles":["finance"]' in me
    assert f"id: {run['last_seq']}" in stream and "event: run_completed" in stream
    end = stream.index("event: end")
    assert '"status":"completed"' in stream[end + 1] and stream[end + 2 :] == [""]
