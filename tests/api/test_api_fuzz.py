"""Schemathesis fuzzes the real server from its own OpenAPI schema, with valid and invalid
requests for every operation, authenticated with a token that holds the approver's role: no
request gets a server error, and every refusal (4xx) is the API's JSON error with a code, a
message and a hint.

Random names rarely hit anything that exists, so half the requests aim at real things: the
served agent, a run waiting for an approval, its interrupt, a webhook trigger."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from api_agents import PAYMENTS_ENV, POLICY, payer
from api_server import GREETER, PAYER, serving, token_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from contextos import Runtime
from contextos.api import ApiConfig
from contextos.store.queue import queue_of
from contextos.workers import add_trigger

EXAMPLES = 40
"""Requests per operation and mode (valid, invalid), on each backend: a minute on two cores."""


async def waiting_run(url: str, policy: str) -> tuple[str, str]:
    """A run waiting for an approval, and its interrupt id; and a webhook trigger `inbox`."""
    async with Runtime(url, policy=policy) as rt:  # the local operator's, in the default tenant
        queue = queue_of(rt.store)
        assert queue is not None
        await add_trigger(queue, "inbox", GREETER, webhook=True)
        result = await rt.run(payer, "pay")
        (interrupt_id,) = (await rt.state(result.run_id)).pending_interrupts
        return result.run_id, interrupt_id


def aim(case: schemathesis.Case, real: dict[str, str]) -> None:
    """Point a generated request at the real run, interrupt, webhook and agent."""
    for name in case.path_parameters or {}:
        if name in real:
            case.path_parameters[name] = real[name]
    if isinstance(case.body, dict) and "agent" in case.body:
        case.body["agent"] = real["agent"]


def test_no_request_gets_a_server_error(
    backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PAYMENTS_ENV, str(tmp_path / "payments.log"))
    (tmp_path / "policy.toml").write_text(POLICY)
    policy = str(tmp_path / "policy.toml")
    url = backend_url
    run_id, interrupt_id = asyncio.run(waiting_run(url, policy))
    alice = asyncio.run(token_for(url, user="alice", roles=("finance",)))
    real = {"run_id": run_id, "interrupt_id": interrupt_id, "name": "inbox", "agent": "greeter"}

    statuses: Counter[int] = Counter()
    config = ApiConfig(store=url, agents=(GREETER, PAYER), policy=policy, max_wait_s=0.1)
    with serving(config) as base:
        schema = schemathesis.openapi.from_url(f"{base}/v1/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        for operation in operations:
            for mode in schemathesis.GenerationMode:

                @given(case=operation.as_strategy(generation_mode=mode), aimed=st.booleans())
                @settings(
                    max_examples=EXAMPLES,
                    deadline=None,
                    derandomize=True,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                def fuzz(case: schemathesis.Case, aimed: bool) -> None:
                    if aimed:
                        aim(case, real)
                    response = case.call(base_url=base, headers=alice)
                    statuses[response.status_code] += 1
                    sent = f"{case.as_curl_command()}\n-> {response.text[:500]}"
                    assert response.status_code < 500, sent
                    if response.status_code >= 400:
                        error: dict[str, Any] = response.json()["error"]
                        assert isinstance(error["code"], str) and error["code"], sent
                        assert isinstance(error["message"], str) and error["message"], sent
                        assert isinstance(error["hint"], str) and error["hint"], sent

                try:
                    fuzz()
                except Unsatisfiable:
                    # An operation that takes nothing (GET /v1/health) has no invalid request.
                    assert mode is schemathesis.GenerationMode.NEGATIVE
    assert len(operations) >= 11
    assert sum(statuses.values()) >= len(operations) * EXAMPLES, statuses
    assert statuses[200] and statuses[201] + statuses[202], statuses  # past validation, too
