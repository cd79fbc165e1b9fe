"""PII redaction: detectors against a labelled set, strategies, and where redaction applies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from guard_corpora import pii_scores, pii_table, presidio_faker_pii, project_pii

from contextos import Agent, FailureReason, RunStatus, Runtime, ToolResult, codec, tool
from contextos import events as ev
from contextos.middleware import PiiRedaction, custom
from contextos.middleware.pii import Detector, iban_ok, luhn_ok
from contextos.state import fold
from contextos.store.snapshots import FORMAT, encode, restore
from contextos.testing import ScriptedModel, call_tool, reply


def print_table(name: str, scores: dict[str, tuple[int, int, int]]) -> tuple[float, float]:
    print(f"\n{name}\n{pii_table(scores)}")
    tp, fp, fn = (sum(v[i] for v in scores.values()) for i in range(3))
    return tp / (tp + fp), tp / (tp + fn)


def test_the_labelled_set_has_at_least_200_strings() -> None:
    rows = project_pii()
    assert len(rows) >= 200
    assert sum(1 for r in rows if not r["entities"]) >= 80  # hard negatives too


def test_precision_and_recall_on_the_projects_labelled_set() -> None:
    scores = pii_scores(project_pii())
    precision, recall = print_table("tests/data/pii_labelled.jsonl", scores)
    # Thresholds: see docs/context.md. The set holds a spelled-out phone number on purpose,
    # which no offline pattern catches; every other type is exact today.
    assert precision >= 0.98 and recall >= 0.98
    for kind, (t, f, n) in scores.items():
        assert t / (t + f) >= 0.98 and t / (t + n) >= 0.95, kind


def test_precision_and_recall_on_a_public_generated_set() -> None:
    rows = presidio_faker_pii()
    scores = pii_scores(rows)
    print_table(f"presidio-evaluator templates x Faker ({len(rows)} strings)", scores)
    assert set(scores) == {"credit_card", "email", "iban", "ip", "phone", "secret"}
    for kind, (t, f, n) in scores.items():
        assert t >= 150, kind
        assert t / (t + f) >= 0.98 and t / (t + n) >= 0.98, kind


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


# One value of each type, as a tool might return it; the look-alikes must survive.
VALUES = {
    "EMAIL": "dana.ross@example.org",
    "PHONE": "+44 20 7946 0958",
    "CREDIT_CARD": "4111 1111 1111 1111",
    "IBAN": "DE03 9589 6935 0492 5899 13",  # its digits also pass Luhn: an IBAN, not a card
    "IP": "2001:db8:85a3:8d3:1319:8a2e:370:7348",  # unbracketed, followed by a port below
    "SECRET": "8f14e45fceea167a5a36dedd4bea2543",
}
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9Pl"
AWS = "AKIAY34FZKBOKMUTVV7A"
KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq\n-----END RSA PRIVATE KEY-----"
ISBN = "ISBN 978-7-9789-1024-1"  # Luhn-valid, not a card


async def test_every_type_is_redacted_before_the_model_sees_it(tmp_path: Path) -> None:
    def customer(customer_id: str) -> str:
        """Look a customer up."""
        return (
            f"mail {VALUES['EMAIL']}, phone {VALUES['PHONE']}, card {VALUES['CREDIT_CARD']}, "
            f"IBAN {VALUES['IBAN']}, last login from {VALUES['IP']}:443, "
            f"token: {VALUES['SECRET']}, session {JWT}, key id {AWS}\n{KEY}\nbought {ISBN}"
        )

    model = ScriptedModel([call_tool("customer", {"customer_id": "c1"}), reply("done")])
    agent = Agent(name="a", model=model, tools=[customer], middleware=[PiiRedaction()])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        await rt.run(agent, "Who is customer c1?")
    seen = next(m.content for m in model.requests[1].messages if m.role == "tool")
    for kind, raw in VALUES.items():
        assert raw not in seen, kind
        assert f"[REDACTED:{kind}]" in seen, kind
    for raw in (JWT, AWS, "MIIEpAIBAAKCAQEA7bq"):
        assert raw not in seen
    assert ISBN in seen  # a look-alike is left alone


async def test_tool_call_arguments_are_redacted_before_the_model_sees_them(tmp_path: Path) -> None:
    def notify(email: str) -> str:
        """Notify someone."""
        return "sent"

    model = ScriptedModel([call_tool("notify", {"email": "jo.park@example.com"}), reply("done")])
    agent = Agent(name="a", model=model, tools=[notify], middleware=[PiiRedaction()])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        await rt.run(agent, "Tell Jo.")
    call = next(m for m in model.requests[1].messages if m.tool_calls).tool_calls[0]
    assert "jo.park@example.com" not in call.arguments
    assert "[REDACTED:EMAIL]" in call.arguments


async def test_model_output_is_redacted_before_it_is_stored_by_default(tmp_path: Path) -> None:
    model = ScriptedModel([reply("Your card 4111 1111 1111 1111 is on file.")])
    agent = Agent(name="a", model=model, middleware=[PiiRedaction()])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "Which card do you have?")
        events = await rt.events(result.run_id)
    answer = next(e for e in events if isinstance(e, ev.ModelResponded)).message.content
    assert answer == "Your card [REDACTED:CREDIT_CARD] is on file."
    assert result.output == answer


async def test_a_snapshot_holds_the_runs_input_no_more_often_than_its_events(
    tmp_path: Path,
) -> None:
    raw = "I am jo@example.com, card 4111 1111 1111 1111"
    model = ScriptedModel([reply("ok")])
    agent = Agent(name="a", model=model, middleware=[PiiRedaction()])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, raw)
        events = await rt.events(result.run_id)
    in_events = sum(codec.encode(e).count(raw.encode()) for e in events)
    state = fold(events)
    blob = encode(state)  # what the store writes as the run's snapshot
    assert blob.count(raw.encode()) <= in_events == 1
    restored = restore(state.run_id, state.seq, FORMAT, blob)
    assert restored is not None and restored.input == raw and restored == state


def test_mask_keeps_the_last_four_characters_and_the_shape() -> None:
    layer = PiiRedaction(strategy="mask")
    assert layer.redact_text("card 4111 1111 1111 1111") == "card **** **** **** 1111"
    assert layer.redact_text("call +44 20 7946 0958") == "call +** ** **** 0958"
    assert layer.redact_text("mail dana.ross@example.org") == "mail d***@example.org"


def test_each_type_gets_its_own_strategy_and_the_rest_the_default() -> None:
    layer = PiiRedaction(strategy="redact", strategies={"email": "mask"})
    out = layer.redact_text("mail dana.ross@example.org, card 4111 1111 1111 1111")
    assert out == "mail d***@example.org, card [REDACTED:CREDIT_CARD]"


def test_a_hashed_value_reads_as_its_type_and_ten_hex_digits() -> None:
    out = PiiRedaction(strategy="hash").redact_text("mail dana.ross@example.org")
    assert re.fullmatch(r"mail <email:[0-9a-f]{10}>", out), out


async def test_block_names_every_blocked_type_of_a_read_tools_output(tmp_path: Path) -> None:
    def vault() -> str:
        """Read the vault."""
        return "key AKIAIOSFODNN7EXAMPLE, owner ops@example.com"

    model = ScriptedModel([call_tool("vault"), reply("done")])
    layer = PiiRedaction(strategies={"secret": "block", "email": "block"})
    agent = Agent(name="a", model=model, tools=[vault], middleware=[layer])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "read it")
        events = await rt.events(result.run_id)
    completed = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert completed.is_error and completed.error_code == "content_blocked"
    assert completed.output.endswith(
        "the output of vault contained email, secret, which the PII policy blocks; it was withheld"
    )


async def test_a_write_tools_output_is_redacted_not_blocked(tmp_path: Path) -> None:
    @tool(effect="write")
    def rotate() -> str:
        """Rotate the key."""
        return "rotated; new key AKIAIOSFODNN7EXAMPLE"

    model = ScriptedModel([call_tool("rotate"), reply("done")])
    layer = PiiRedaction(strategies={"secret": "block"})
    agent = Agent(name="a", model=model, tools=[rotate], middleware=[layer])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "rotate it")
        events = await rt.events(result.run_id)
    completed = next(e for e in events if isinstance(e, ev.ToolCompleted))
    # The key was rotated: failing the call would make the effect look undone.
    assert not completed.is_error
    assert completed.output == "rotated; new key [REDACTED:SECRET]"


async def test_a_tool_result_with_receipts_is_redacted_and_keeps_its_receipts(
    tmp_path: Path,
) -> None:
    @tool(effect="write")
    def notify(email: str) -> ToolResult:
        """Notify someone."""
        return ToolResult(output=f"sent to {email}", receipts={"message_id": "m-1"})

    model = ScriptedModel([call_tool("notify", {"email": "jo.park@example.com"}), reply("done")])
    agent = Agent(name="a", model=model, tools=[notify], middleware=[PiiRedaction()])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "Tell Jo.")
        events = await rt.events(result.run_id)
        (effect,) = (await rt.state(result.run_id)).effects.values()
    completed = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert completed.output == "sent to [REDACTED:EMAIL]"
    assert effect.receipts["message_id"] == "m-1"


async def test_a_blocked_input_names_the_layer_and_every_type_it_blocks(tmp_path: Path) -> None:
    model = ScriptedModel([reply("never")])
    layer = PiiRedaction(strategies={"credit_card": "block", "email": "block"})
    agent = Agent(name="a", model=model, middleware=[layer])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "charge 4111 1111 1111 1111 for jo@example.com")
        events = await rt.events(result.run_id)
    failed = next(e for e in events if isinstance(e, ev.RunFailed))
    message = "the input contains data the PII policy blocks: credit_card, email"
    assert result.failure_message == failed.message == message
    assert failed.error == {"code": "content_blocked", "layer": "pii"}


async def test_block_stops_what_the_user_wrote_not_what_a_tool_returned(tmp_path: Path) -> None:
    def directory() -> str:
        """Look the owner up."""
        return "owner: ops@example.com"

    model = ScriptedModel([call_tool("directory"), reply("done")])
    # Tool results are left as they are when recorded, and only redacted for the model.
    layer = PiiRedaction(strategies={"email": "block"}, tool_results=False)
    agent = Agent(name="a", model=model, tools=[directory], middleware=[layer])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "who owns it?")
    assert result.status is RunStatus.COMPLETED
    seen = next(m.content for m in model.requests[1].messages if m.role == "tool")
    assert "owner: [REDACTED:EMAIL]" in seen and "ops@example.com" not in seen


async def test_a_blocked_type_in_the_models_answer_is_redacted(tmp_path: Path) -> None:
    model = ScriptedModel([reply("Write to ops@example.com.")])
    agent = Agent(name="a", model=model, middleware=[PiiRedaction(strategies={"email": "block"})])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "Who do I write to?")
    assert result.status is RunStatus.COMPLETED
    assert result.output == "Write to [REDACTED:EMAIL]."


async def test_model_output_off_records_the_answer_as_the_model_gave_it(tmp_path: Path) -> None:
    model = ScriptedModel([reply("Write to ops@example.com.")])
    agent = Agent(name="a", model=model, middleware=[PiiRedaction(model_output=False)])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "Who do I write to?")
    assert result.output == "Write to ops@example.com."


def test_the_layer_enters_the_agent_identity_under_stable_names() -> None:
    # A renamed key would change every agent's identity: runs in flight could not resume.
    layer = PiiRedaction(strategies={"email": "mask"}, tool_results=False)
    assert layer.fingerprint() == {
        "detectors": ["secret", "email", "iban", "ip", "credit_card", "phone"],
        "strategy": "redact",
        "strategies": {"email": "mask"},
        "hash_key": "e3b0c44298fc",  # sha256 of the empty key: the key itself is never shown
        "tool_results": False,
        "model_output": True,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # prose: a password that is not a word is a secret, whatever the case of its name
        ("The Password is hunter2hunter2", "The Password is [REDACTED:SECRET]"),
        ("the password is abcdefghijklmnop", "the password is [REDACTED:SECRET]"),  # 16 letters
        ("the password is abcdefghijklmno", "the password is abcdefghijklmno"),  # 15: a word
        ("the token is hunter2hunter2", "the token is hunter2hunter2"),  # prose names passwords
        # assigned: a password or secret may be a plain word
        ("password: sunshine", "password: [REDACTED:SECRET]"),
        ("PWD=sunshine", "PWD=[REDACTED:SECRET]"),
        ("secret: sunshine", "secret: [REDACTED:SECRET]"),
        # a key or token needs a digit and 8 characters, or 20 characters
        ("api_key=abcd1234", "api_key=[REDACTED:SECRET]"),
        ("api_key=abc1234", "api_key=abc1234"),
        ("token: abcdefghijklmnopqrst", "token: [REDACTED:SECRET]"),
        ("token: abcdefghijklmnopqrs", "token: abcdefghijklmnopqrs"),
    ],
)
def test_an_assigned_or_stated_secret_is_redacted_only_when_it_reads_as_one(
    text: str, expected: str
) -> None:
    assert PiiRedaction().redact_text(text) == expected


def test_iban_lengths_follow_the_country_and_the_standard() -> None:
    assert iban_ok("NO93 8601 1117 947")  # 15 characters, the shortest there is
    assert iban_ok("BY13 NBRB 3600 9000 0000 2Z00 AB00")  # a country without a length in the table
    # Right checksums, wrong lengths: 20 characters for Britain (22), 35 for anyone (34 at most).
    assert not iban_ok("GB04 WEST 1234 5698 7654")
    assert iban_ok("ZZ08 1111 1111 1111 1111 1111 1111 1111 11")
    assert not iban_ok("ZZ41 1111 1111 1111 1111 1111 1111 1111 111")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # international numbers: 8 to 15 digits after + or a grouped 00
        ("+49 30 1234", "[REDACTED:PHONE]"),
        ("+49 301 2345 678 901", "[REDACTED:PHONE]"),
        ("+49 301 2345 678 9013", "+49 301 2345 678 9013"),
        ("+442079460958", "[REDACTED:PHONE]"),
        ("0044 20 7946 0958", "[REDACTED:PHONE]"),
        # grouped, no word: 9 to 12 digits; an extension is not counted
        ("id 123 456 789", "id [REDACTED:PHONE]"),
        ("id 123 456 789 012", "id [REDACTED:PHONE]"),
        ("id 123 456 789 0123", "id 123 456 789 0123"),
        ("id 1234 5678", "id 1234 5678"),
        ("020 7946 0958 ext 4567 today", "[REDACTED:PHONE] today"),
        # a word says so: 7 to 15 digits, but not a run of two digits repeated
        ("call 123 4567", "call [REDACTED:PHONE]"),
        ("call 123 456 789 012 345", "call [REDACTED:PHONE]"),
        ("call 123 456 789 012 3456", "call 123 456 789 012 3456"),
        ("call 123 1231 231", "call [REDACTED:PHONE]"),
        ("call 121 2121 212", "call 121 2121 212"),
        # shapes that are not phone numbers even after a word
        ("registered 2024-05-06", "registered 2024-05-06"),
        ("ref 123-45-6789", "ref 123-45-6789"),
    ],
)
def test_what_counts_as_a_phone_number(text: str, expected: str) -> None:
    assert PiiRedaction().redact_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("paid with 4222222222222", "paid with [REDACTED:CREDIT_CARD]"),  # 13 digits: a Visa
        ("card 5018 0000 0009", "card [REDACTED:CREDIT_CARD]"),  # 12 (Maestro) after a word
        ("card 0000 0000 0000 0000", "card 0000 0000 0000 0000"),  # one digit repeated
        (
            "ISBN 978-7-9789-1024-1 and card 4111 1111 1111 1111",
            "ISBN 978-7-9789-1024-1 and card [REDACTED:CREDIT_CARD]",
        ),
        (
            "DE03 9589 6935 0492 5899 13 and GB82 WEST 1234 5698 7654 32",
            "[REDACTED:IBAN] and [REDACTED:IBAN]",
        ),
        ("IBAN GB82 WEST 1234 5698 7654 32 BIC NWBKGB2L", "IBAN [REDACTED:IBAN] BIC NWBKGB2L"),
        (
            "ref DE00123456789012345678 and GB82 WEST 1234 5698 7654 32",
            "ref DE00123456789012345678 and [REDACTED:IBAN]",
        ),
    ],
)
def test_cards_and_ibans_next_to_other_numbers_and_words(text: str, expected: str) -> None:
    assert PiiRedaction().redact_text(text) == expected


def test_luhn_counts_12_to_19_digits() -> None:
    assert luhn_ok("0" * 12) and luhn_ok("0" * 19)
    assert not luhn_ok("0" * 11) and not luhn_ok("0" * 20)


def test_a_custom_regex_redacts_its_group_and_asks_its_validator() -> None:
    order = custom("order", r"order (\d{6})|ORDERS")
    assert PiiRedaction(extra=[order]).redact_text("ORDERS: order 123456") == (
        "ORDERS: order [REDACTED:ORDER]"
    )
    badge = Detector(name="badge", pattern=re.compile(r"B-\d+"), validate=lambda v: v.endswith("7"))
    assert PiiRedaction(extra=[badge]).redact_text("B-17 and B-18") == "[REDACTED:BADGE] and B-18"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("from 2001:db8:85a3:8d3:1319:8a2e:370:7348:443 today", "from [REDACTED:IP]:443 today"),
        ("host ABCD::EF", "host [REDACTED:IP]"),
        ("host abcd::ef", "host [REDACTED:IP]"),
        ("C++ uses :: for scope; from 2001:db8::1", "C++ uses :: for scope; from [REDACTED:IP]"),
        ("order 12345678, call 020 7946 0958", "order 12345678, call [REDACTED:PHONE]"),
        ("Authorization: Bearer abcdefghijklmnop1234", "Authorization: Bearer [REDACTED:SECRET]"),
    ],
)
def test_the_detected_value_is_what_is_replaced_and_nothing_around_it(
    text: str, expected: str
) -> None:
    assert PiiRedaction().redact_text(text) == expected


def test_spans_that_are_empty_or_overlap_an_earlier_one_are_skipped() -> None:
    spans = [(3, 6), (0, 3), (6, 6), (4, 8), (6, 7), (9, 11)]
    found = custom("code", lambda text: spans)
    out = PiiRedaction(detectors=[found]).redact_text("abcdefgh ij")
    assert out == "[REDACTED:CODE][REDACTED:CODE][REDACTED:CODE]h [REDACTED:CODE]"


async def test_the_agents_instructions_are_redacted_and_counted_on_every_call(
    tmp_path: Path,
) -> None:
    model = ScriptedModel([call_tool("lookup"), reply("done")])

    def lookup() -> str:
        """Look it up."""
        return "nothing"

    agent = Agent(
        name="a",
        model=model,
        tools=[lookup],
        instructions="Escalate to ops@example.com.",
        middleware=[PiiRedaction()],
    )
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "go")
        events = await rt.events(result.run_id)
    for request in model.requests:
        system = "\n".join(m.content for m in request.messages if m.role == "system")
        assert "Escalate to [REDACTED:EMAIL]." in system and "ops@example.com" not in system
    calls = [e for e in events if isinstance(e, ev.ModelResponded)]
    assert [e.context["telemetry"]["pii.email"] for e in calls] == [1, 1]
