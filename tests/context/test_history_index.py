"""The history index: a run's conversation kept across model calls with running totals.

Each call of a long run must cost what an early one does, so the index only adds the messages
that are new and reads tokens, untrusted blocks and the history digest from running totals. The
totals must be exactly what walking the whole history gives, for every compaction cursor.
"""

from __future__ import annotations

import random

from contextos.context import compile_context
from contextos.context.compiled import CompiledContext, HistoryIndex
from contextos.messages import Message, ToolCall


def conversation(turns: int, rng: random.Random) -> tuple[list[Message], list[int]]:
    messages = [Message(role="user", content="Where is order A-1001?")]
    seqs = [1]
    seq = 1
    for t in range(turns):
        seq += 1
        call = ToolCall(id=f"c{t}", name="lookup", arguments=f'{{"n": {rng.randint(0, 99)}}}')
        messages.append(Message(role="assistant", content="", tool_calls=(call,)))
        seqs.append(seq)
        seq += 1
        body = "x" * rng.randint(1, 300)
        messages.append(Message(role="tool", content=body, tool_call_id=call.id, name="lookup"))
        seqs.append(seq)
    return messages, seqs


def walked(context: CompiledContext) -> CompiledContext:
    """The same context with its history as a plain tuple: totals come from a full walk."""
    return CompiledContext(
        items=context.items,
        history=tuple(context.history),
        tools=context.tools,
        cursor=context.cursor,
        source=context.source,
    )


def compiled(
    messages: list[Message], seqs: list[int], cursor: int, index: HistoryIndex | None
) -> CompiledContext:
    return compile_context(
        run_id="r",
        agent="a@1",
        instructions="Answer briefly.",
        messages=messages,
        message_seqs=seqs,
        summary="earlier turns" if cursor else None,
        cursor=cursor,
        index=index,
    )


def test_running_totals_equal_a_full_walk_for_every_cursor() -> None:
    rng = random.Random(7)
    messages, seqs = conversation(40, rng)
    index = HistoryIndex()
    for end in range(1, len(messages) + 1, 3):
        for cursor in sorted({0, 1, *rng.sample(seqs[:end], min(3, end))}):
            context = compiled(messages[:end], seqs[:end], cursor, index)
            plain = walked(context)
            assert context.manifest() == plain.manifest()
            assert context.tokens == plain.tokens
            assert context.render() == plain.render()
            assert list(reversed(context.history)) == list(reversed(plain.history))
            assert [context.history[i] for i in range(-len(plain.history), 0)] == list(
                plain.history
            )


def test_the_first_message_is_kept_ahead_of_a_compacted_range() -> None:
    messages, seqs = conversation(5, random.Random(1))
    context = compiled(messages, seqs, seqs[4], HistoryIndex())
    assert [e.seq for e in context.history] == [seqs[0], *seqs[5:]]
    assert context.history[0].message is messages[0]


def test_each_call_only_adds_the_messages_that_are_new() -> None:
    messages, seqs = conversation(30, random.Random(3))
    index = HistoryIndex()
    early = compiled(messages[:21], seqs[:21], 0, index).history
    late = compiled(messages, seqs, 0, index).history
    # The entries of the first call are the very objects the later call sees: nothing was
    # derived twice, so a late call's cost does not grow with the messages before it.
    assert all(late[i] is early[i] for i in range(len(early)))
    assert len(index.entries) == len(messages)


def test_an_index_fed_another_conversation_starts_over() -> None:
    a, seqs = conversation(4, random.Random(5))
    b, _ = conversation(4, random.Random(6))
    index = HistoryIndex()
    before = compiled(a, seqs, 0, index)
    context = compiled(b, seqs, 0, index)
    assert [e.message for e in context.history] == b
    assert context.manifest() == walked(context).manifest()
    # A view taken before the index started over still shows what it showed.
    assert [e.message for e in before.history] == a
    assert before.manifest() == walked(before).manifest()


def test_a_guard_rewrites_each_entry_once_and_keeps_the_running_totals() -> None:
    from collections import Counter

    from contextos.context.compiled import Entry, History
    from contextos.middleware.base import ContentGuard, Services
    from contextos.testing import ScriptedModel

    rewritten: list[int] = []

    def shout(e: Entry, found: Counter[str]) -> Entry:
        rewritten.append(e.seq)
        found["entries"] += 1
        found["tools"] += e.message.role == "tool"
        return e.with_content(e.message.content.upper(), "shout")

    guard = ContentGuard().bind(Services(model=ScriptedModel([])))
    assert isinstance(guard, ContentGuard)
    rng = random.Random(11)
    messages, seqs = conversation(30, rng)
    index = HistoryIndex()
    for end in range(1, len(messages) + 1, 4):
        cursor = seqs[end // 2] if end > 8 else 0
        context = compiled(messages[:end], seqs[:end], cursor, index)
        counts: Counter[str] = Counter()
        guarded = guard.guard_history(context, counts, shout)
        expected: Counter[str] = Counter()
        plain = walked(context).map_history(lambda e, found=expected: shout(e, found))
        del rewritten[-len(plain.history) :]  # the walk above is the reference, not the guard
        # Still backed by an index: totals and the digest are not a walk of the history.
        assert isinstance(guarded.history, History)
        assert guarded.manifest() == plain.manifest()
        assert guarded.render() == plain.render()
        assert counts == expected
    # Each message was rewritten once in the whole run, however many calls saw it.
    assert sorted(rewritten) == sorted(set(rewritten)) == seqs[: len(rewritten)]
