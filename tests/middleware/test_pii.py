"""PII redaction: detectors against a labelled set, strategies, and where redaction applies."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from contextos import Agent, FailureReason, Runtime
from contextos import events as ev
from contextos.middleware import PiiRedaction, custom, detect
from contextos.middleware.pii import iban_ok, luhn_ok
from contextos.testing import ScriptedModel, call_tool, reply

DATA = Path(__file__).parent.parent / "data" / "pii_labelled.jsonl"


def evaluate() -> dict[str, tuple[int, int, int]]:
    """Entity-level (true positives, false positives, false negatives) per type.

    A detection counts when its type matches a labelled entity and their spans overlap.
    """
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    for line in DATA.read_text().splitlines():
        row = json.loads(line)
        text = row["text"]
        gold = []
        for e in row["entities"]:
            start = text.index(e["value"])
            gold.append((e["type"], start, start + len(e["value"])))
        used: set[int] = set()
        for d in detect(text):
            match = next(
                (
                    i
                    for i, (t, s, e) in enumerate(gold)
                    if i not in used and t == d.type and d.start < e and s < d.end
                ),
                None,
            )
            if match is None:
                fp[d.type] += 1
            else:
                used.add(match)
                tp[d.type] += 1
        for i, (t, _, _) in enumerate(gold):
            if i not in used:
                fn[t] += 1
    kinds = sorted(set(tp) | set(fp) | set(fn))
    return {k: (tp[k], fp[k], fn[k]) for k in kinds}


def test_the_labelled_set_has_at_least_200_strings() -> None:
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    assert len(rows) >= 200
    assert sum(1 for r in rows if not r["entities"]) >= 80  # hard negatives too


def test_precision_and_recall_on_the_labelled_set() -> None:
    table = evaluate()
    tp = sum(t for t, _, _ in table.values())
    fp = sum(f for _, f, _ in table.values())
    fn = sum(n for _, _, n in table.values())
    print("\ntype          precision  recall   tp  fp  fn")
    for kind, (t, f, n) in table.items():
        print(f"{kind:12}  {t / max(t + f, 1):9.3f}  {t / max(t + n, 1):6.3f}  {t:3} {f:3} {n:3}")
    print(f"{'all':12}  {tp / (tp + fp):9.3f}  {tp / (tp + fn):6.3f}  {tp:3} {fp:3} {fn:3}")
    # Thresholds: see docs/context.md. Checksummed types (cards, IBANs) and IPs are exact; the
    # set deliberately holds obfuscated e-mails, spelled-out phones and prose passwords that no
    # offline pattern catches, which bounds recall below 1.
    assert tp / (tp + fp) >= 0.97
    assert tp / (tp + fn) >= 0.93
    for kind in ("credit_card", "iban", "ip"):
        t, f, n = table[kind]
        assert t / (t + f) >= 0.99 and t / (t + n) >= 0.99, kind


def test_checksums() -> None:
    assert luhn_ok("4111 1111 1111 1111")
    assert not luhn_ok("4111 1111 1111 1112")
    assert iban_ok("GB82 WEST 1234 5698 7654 32")
    assert not iban_ok("GB82 WEST 1234 5698 7654 33")


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("redact", "mail [REDACTED:EMAIL] now"),
        ("mask", "mail a***@example.com now"),
        ("hash", "mail <email:"),
    ],
)
def test_strategies(strategy: str, expected: str) -> None:
    layer = PiiRedaction(strategy=strategy)
    out = layer.redact_text("mail alice@example.com now")
    assert out.startswith(expected)
    assert "alice@example.com" not in out
    assert layer.redact_text(out) == out  # guards never rewrite their own output


def test_hash_is_a_stable_pseudonym() -> None:
    layer = PiiRedaction(strategy="hash", hash_key="k")
    a = layer.redact_text("alice@example.com")
    assert a == layer.redact_text("alice@example.com")
    assert a != layer.redact_text("bob@example.com")
    assert a != PiiRedaction(strategy="hash", hash_key="other").redact_text("alice@example.com")


def test_custom_detectors_by_regex_and_callable() -> None:
    employee = custom("employee_id", r"\bEMP-\d{5}\b")

    def codenames(text: str) -> list[tuple[int, int]]:
        i = text.find("Bluebird")
        return [(i, i + len("Bluebird"))] if i >= 0 else []

    layer = PiiRedaction(extra=[employee, custom("codename", codenames)])
    out = layer.redact_text("EMP-12345 works on Bluebird")
    assert out == "[REDACTED:EMPLOYEE_ID] works on [REDACTED:CODENAME]"


async def test_the_model_never_sees_pii_from_input_or_tools(tmp_path: Path) -> None:
    def customer(customer_id: str) -> str:
        """Look a customer up."""
        return "Jo Park, +44 20 7946 0958, card 4111 1111 1111 1111"

    model = ScriptedModel([call_tool("customer", {"customer_id": "c1"}), reply("done")])
    agent = Agent(name="a", model=model, tools=[customer], middleware=[PiiRedaction()])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "I am jo@example.com, my IP is 203.0.113.9")
        events = await rt.events(result.run_id)
    seen = "\n".join(m.content for r in model.requests for m in r.messages)
    for raw in ("jo@example.com", "203.0.113.9", "+44 20 7946 0958", "4111 1111 1111 1111"):
        assert raw not in seen
    assert "[REDACTED:CREDIT_CARD]" in seen
    # Tool results are redacted before they are recorded, not only for the model.
    completed = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert "4111" not in completed.output and "[REDACTED:PHONE]" in completed.output
    first = next(e for e in events if isinstance(e, ev.ModelResponded))
    assert first.context["telemetry"]["pii.email"] == 1
    assert first.context["telemetry"]["pii.ip"] == 1


async def test_block_ends_the_run_before_the_model_sees_the_input(tmp_path: Path) -> None:
    model = ScriptedModel([reply("never")])
    agent = Agent(
        name="a", model=model, middleware=[PiiRedaction(strategies={"credit_card": "block"})]
    )
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "charge 4111 1111 1111 1111 please")
    assert model.requests == []
    assert result.failure_reason is FailureReason.CONTENT_BLOCKED


async def test_block_withholds_a_read_tools_output(tmp_path: Path) -> None:
    def vault() -> str:
        """Read the vault."""
        return "key AKIAIOSFODNN7EXAMPLE"

    model = ScriptedModel([call_tool("vault"), reply("done")])
    layer = PiiRedaction(strategies={"secret": "block"})
    agent = Agent(name="a", model=model, tools=[vault], middleware=[layer])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "read it")
        events = await rt.events(result.run_id)
    completed = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert completed.is_error and "AKIA" not in completed.output
    assert "PII policy blocks" in completed.output
