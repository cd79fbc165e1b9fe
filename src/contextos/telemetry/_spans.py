"""A run's events as span records, by the OpenTelemetry GenAI semantic conventions.

Pure: the same events always give the same spans (ids included), so a trace exported live,
one exported later from the store, and one whose run crashed and resumed elsewhere agree.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE

from contextos import events as ev
from contextos.delegation import DelegationContract
from contextos.runs import RunStatus
from contextos.telemetry._capture import Capture
from contextos.telemetry._ids import span_id_for, trace_id_for

AttrValue = str | bool | int | float | tuple[str, ...]
METADATA = Capture()
Kind = Literal["internal", "client"]
Status = Literal["unset", "ok", "error"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SpanEvent:
    """Something that happened at one moment inside a span."""

    name: str
    """Event name (`contextos.<event type>`)."""
    at: datetime
    """When."""
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    """Its attributes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SpanRecord:
    """One span, built from recorded events."""

    name: str
    """Span name, e.g. `chat local:smollm2`."""
    kind: Kind
    """OpenTelemetry span kind."""
    trace_id: int
    """128-bit trace id, derived from the run id."""
    span_id: int
    """64-bit span id, derived from the run id and what the span is about."""
    parent_id: int | None
    """The parent span's id (None for the run's root span)."""
    start: datetime
    """Start time."""
    end: datetime
    """End time."""
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    """GenAI and contextos.* attributes."""
    events: tuple[SpanEvent, ...] = ()
    """Span events, in order."""
    status: Status = "unset"
    """Span status."""
    status_description: str = ""
    """Why, for an error status."""
    closed_by: int | None = None
    """Seq of the event that completes this span; None while the run is still going."""


@dataclass(kw_only=True, slots=True)
class _Tool:
    call_id: str
    name: str
    start: datetime
    arguments: str = ""
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    done: SpanRecord | None = None


@dataclass(kw_only=True, slots=True)
class _Node:
    name: str
    kind: str
    start: datetime
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)


def parent_of_delegation(contract: DelegationContract) -> int | None:
    """The span a child run's root span hangs from: its workflow node's, or the tool call's
    (`delegate_to_<name>`) of its parent."""
    if contract.node is not None:
        return span_id_for(contract.parent_run_id, f"node/{contract.node}")
    if contract.call_id is not None:
        return span_id_for(contract.parent_run_id, f"tool/{contract.call_id}")
    return None


def build(events: list[ev.Event], *, capture: Capture = METADATA) -> list[SpanRecord]:
    """Every span of the run the events describe, children first, the root last; content as
    `capture` says (none by default).

    A child run's spans join its root run's trace, under the span of the node or tool call
    that started it; a workflow's root span is `invoke_workflow`, with a span per node.
    """
    if not events or not isinstance(events[0], ev.RunCreated):
        return []
    capture = capture.for_run(events)
    created = events[0]
    run_id = created.run_id
    head = events[1:4]
    bound = next((e.contract for e in head if isinstance(e, ev.DelegationBound)), None)
    flow = next((e for e in head if isinstance(e, ev.WorkflowBound)), None)
    # One trace per run tree: a child run joins its root's trace, under the node or tool call
    # that started it; a run a trigger started is a child of that run's span.
    tree = bound.root if bound is not None else (created.correlation_id or run_id)
    trace_id = trace_id_for(tree)
    root_id = span_id_for(run_id, "invoke_workflow" if flow is not None else "invoke_agent")
    source = created.caused_by.partition("#")[0] if created.caused_by else None
    root_parent = span_id_for(source, "invoke_agent") if source else None
    if bound is not None:
        root_parent = parent_of_delegation(bound)
    nodes: dict[str, _Node] = {}
    node_of: dict[str, str] = {}  # delegation id -> the node that started it
    spans: list[SpanRecord] = []
    root_events: list[SpanEvent] = []
    tools: dict[str, _Tool] = {}
    calls: dict[str, tuple[str, str]] = {}  # call id -> (tool name, arguments)
    conversation: list[dict[str, Any]] = [_message(capture, "user", created.input, created.seq)]
    answers: dict[int, str] = {}  # seq of a model answer -> its text
    status = RunStatus.QUEUED
    input_tokens = output_tokens = turns = 0
    cost = 0.0
    end_attrs: dict[str, AttrValue] = {}
    end_status: Status = "unset"
    end_text = ""
    terminal: ev.Event | None = None

    def tool(call_id: str, name: str, at: datetime) -> _Tool:
        if call_id not in tools:
            arguments = calls.get(call_id, (name, ""))[1]
            tools[call_id] = _Tool(call_id=call_id, name=name, start=at, arguments=arguments)
        return tools[call_id]

    for e in events:
        status = ev.status_after(e) or status
        seq_attr: dict[str, AttrValue] = {"contextos.event.seq": e.seq}
        if e.causation_id is not None:
            seq_attr["contextos.event.causation_id"] = e.causation_id
        match e:
            case ev.ModelResponded():
                turns += 1
                input_tokens += e.usage.input_tokens
                output_tokens += e.usage.output_tokens
                cost += e.usage.cost_usd
                for c in e.message.tool_calls:
                    calls[c.id] = (c.name, c.arguments)
                spans.append(_chat(e, trace_id, root_id, turns, conversation, capture))
                conversation.append(_assistant(capture, e))
                answers[e.seq] = e.message.content
            case ev.PolicyDecided():
                t = tool(e.call_id, e.tool, e.occurred_at)
                t.attributes["contextos.policy.decision"] = e.decision
                if e.rule_ids:
                    t.attributes["contextos.policy.rule_ids"] = tuple(e.rule_ids)
                if e.snapshot_hash:
                    t.attributes["contextos.policy.snapshot_hash"] = e.snapshot_hash
                if e.approval_id:
                    t.attributes["contextos.approval.id"] = e.approval_id
                if e.effect_id:
                    t.attributes["contextos.effect.id"] = e.effect_id
            case ev.EffectProposed():
                t = tool(e.call_id, e.tool, e.occurred_at)
                t.attributes["contextos.effect.id"] = e.effect_id
                t.attributes["contextos.effect.kind"] = e.kind
                t.attributes["contextos.effect.state"] = "proposed"
            case ev.EffectChanged():
                for t in tools.values():
                    if t.attributes.get("contextos.effect.id") == e.effect_id:
                        t.attributes["contextos.effect.state"] = str(e.state)
                        changed: dict[str, AttrValue] = {**seq_attr, "state": str(e.state)}
                        if e.attempt:
                            changed["attempt"] = e.attempt
                        if e.error_code:
                            changed[ERROR_TYPE] = e.error_code
                        t.events.append(
                            SpanEvent(name=_name(e), at=e.occurred_at, attributes=changed)
                        )
            case ev.ToolAttemptFailed():
                t = tool(e.call_id, e.tool, e.occurred_at)
                t.events.append(
                    SpanEvent(
                        name=_name(e),
                        at=e.occurred_at,
                        attributes={
                            **seq_attr,
                            "attempt": e.attempt,
                            ERROR_TYPE: e.error_type,
                            "will_retry": e.will_retry,
                        },
                    )
                )
            case ev.ToolCompleted():
                began = e.occurred_at - timedelta(milliseconds=e.duration_ms)
                t = tool(e.call_id, e.name, began)
                t.start = min(t.start, began)
                t.attributes["contextos.tool.truncated"] = e.truncated
                t.done = _tool_span(t, e, trace_id, root_id, run_id, capture)
                spans.append(t.done)
                conversation.append(_message(capture, "tool", e.output, e.seq, call_id=e.call_id))
            case ev.VerificationFailed():
                conversation.append(_message(capture, "user", e.feedback, e.seq))
                root_events.append(
                    SpanEvent(
                        name=_name(e),
                        at=e.occurred_at,
                        attributes={
                            **seq_attr,
                            "verifier": e.verifier,
                            **_content(capture, "gaps", e.gaps),
                        },
                    )
                )
            case ev.UserMessageAdded():
                conversation.append(_message(capture, "user", e.content, e.seq))
                root_events.append(SpanEvent(name=_name(e), at=e.occurred_at, attributes=seq_attr))
            case ev.RunCompleted():
                terminal = e
                end_status = "ok"
                if capture.content:
                    output = e.output if e.answer_seq is None else answers.get(e.answer_seq, "")
                    answer_at = e.answer_seq if e.answer_seq is not None else e.seq
                    end_attrs[gen_ai.GEN_AI_OUTPUT_MESSAGES] = json.dumps(
                        [_message(capture, "assistant", output, answer_at)]
                    )
            case ev.RunFailed():
                terminal = e
                end_status, end_text = "error", e.message
                end_attrs[ERROR_TYPE] = str(e.reason)
                end_attrs["contextos.run.failure_reason"] = str(e.reason)
            case ev.NodeStarted():
                nodes[e.node] = _Node(name=e.node, kind=e.kind, start=e.occurred_at)
                if e.items is not None:
                    nodes[e.node].attributes["contextos.node.items"] = len(e.items)
            case ev.NodeRoundCompleted() if e.node in nodes:
                nodes[e.node].events.append(
                    SpanEvent(
                        name=_name(e), at=e.occurred_at, attributes={**seq_attr, "round": e.round}
                    )
                )
            case ev.NodeItemCompleted():
                pass  # one per item of a code map: its node's span counts the items
            case ev.NodeAttemptFailed() if e.node in nodes:
                attempt: dict[str, AttrValue] = {
                    **seq_attr,
                    "attempt": e.attempt,
                    ERROR_TYPE: e.error_type,
                    "contextos.node.call": e.where,
                }
                nodes[e.node].events.append(
                    SpanEvent(name=_name(e), at=e.occurred_at, attributes=attempt)
                )
            case ev.NodeReconciled() if e.node in nodes:
                found: dict[str, AttrValue] = {**seq_attr, "contextos.node.acted": e.acted}
                nodes[e.node].events.append(
                    SpanEvent(name=_name(e), at=e.occurred_at, attributes=found)
                )
            case ev.NodeCompleted() | ev.NodeFailed() if e.node in nodes:
                spans.append(_node_span(nodes.pop(e.node), e, trace_id, root_id, run_id, flow))
            case ev.ChildRunStarted() | ev.ChildRunFinished():
                if isinstance(e, ev.ChildRunStarted):
                    delegation, child_run = e.contract.delegation_id, e.contract.child_run_id
                    if e.contract.node is not None:
                        node_of[delegation] = e.contract.node
                else:
                    delegation, child_run = e.delegation_id, e.child_run_id
                    input_tokens += e.usage.input_tokens
                    output_tokens += e.usage.output_tokens
                    cost += e.usage.cost_usd
                child_attrs: dict[str, AttrValue] = {
                    **seq_attr,
                    "contextos.child_run.id": child_run,
                }
                node = node_of.get(delegation, "")
                target = nodes[node].events if node in nodes else root_events
                target.append(SpanEvent(name=_name(e), at=e.occurred_at, attributes=child_attrs))
            case ev.RunCancelled() | ev.RunExpired():
                terminal = e
                end_attrs["contextos.run.failure_reason"] = e.reason or e.type
                if isinstance(e, ev.RunExpired):
                    end_status, end_text = "error", e.reason or "the run expired"
                    end_attrs[ERROR_TYPE] = "expired"
            case _:
                root_events.append(
                    SpanEvent(name=_name(e), at=e.occurred_at, attributes=_event_attrs(e, capture))
                )
        if terminal is not None:
            root_events.append(SpanEvent(name=_name(e), at=e.occurred_at, attributes=seq_attr))
            break

    last = terminal or events[-1]
    closed = terminal.seq if terminal is not None else None
    for t in tools.values():  # calls the run never finished: they end with the run
        if t.done is None:
            pending = _tool_span(t, None, trace_id, root_id, run_id, capture)
            spans.append(_replace_end(pending, last.occurred_at, closed, terminal is not None))
    for n in nodes.values():  # nodes still running: they end with the run
        pending = _node_span(n, None, trace_id, root_id, run_id, flow)
        spans.append(_replace_end(pending, last.occurred_at, closed, terminal is not None))

    attrs: dict[str, AttrValue] = {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value,
        gen_ai.GEN_AI_AGENT_NAME: created.agent_name,
        gen_ai.GEN_AI_AGENT_VERSION: created.agent_version,
        gen_ai.GEN_AI_AGENT_ID: created.agent_hash,
        gen_ai.GEN_AI_CONVERSATION_ID: run_id,
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
        gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
        "contextos.run.id": run_id,
        "contextos.run.correlation_id": tree,
        "contextos.run.status": str(status),
        "contextos.run.turns": turns,
        "contextos.usage.cost_usd": cost,
        **end_attrs,
    }
    if created.agent_ref:
        attrs["contextos.agent.ref"] = created.agent_ref
    if created.caused_by:
        attrs["contextos.run.caused_by"] = created.caused_by
    if capture.content:
        attrs["contextos.capture.mode"] = capture.mode.value
        if capture.guarded:
            attrs["contextos.capture.through_pii"] = True
        attrs[gen_ai.GEN_AI_INPUT_MESSAGES] = json.dumps(
            [_message(capture, "user", created.input, created.seq)]
        )
    name = f"invoke_agent {created.agent_name}"
    if flow is not None:
        name = f"invoke_workflow {flow.workflow}"
        attrs[gen_ai.GEN_AI_OPERATION_NAME] = gen_ai.GenAiOperationNameValues.INVOKE_WORKFLOW.value
        attrs[gen_ai.GEN_AI_WORKFLOW_NAME] = flow.workflow
        for key in (gen_ai.GEN_AI_AGENT_NAME, gen_ai.GEN_AI_AGENT_VERSION, gen_ai.GEN_AI_AGENT_ID):
            del attrs[key]
        attrs["contextos.workflow.version"] = created.agent_version
        attrs["contextos.workflow.hash"] = created.agent_hash
    if bound is not None:
        attrs["contextos.parent_run.id"] = bound.parent_run_id
        attrs["contextos.delegation.id"] = bound.delegation_id
    spans.append(
        SpanRecord(
            name=name,
            kind="internal",
            trace_id=trace_id,
            span_id=root_id,
            parent_id=root_parent,
            start=created.occurred_at,
            end=last.occurred_at,
            attributes=attrs,
            events=tuple(root_events),
            status=end_status,
            status_description=end_text,
            closed_by=terminal.seq if terminal is not None else None,
        )
    )
    return spans


def _chat(
    e: ev.ModelResponded,
    trace_id: int,
    root_id: int,
    turn: int,
    conversation: list[dict[str, Any]],
    capture: Capture,
) -> SpanRecord:
    provider, _, name = e.model.partition(":")
    model = name or provider
    attrs: dict[str, AttrValue] = {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.CHAT.value,
        gen_ai.GEN_AI_PROVIDER_NAME: provider,
        gen_ai.GEN_AI_REQUEST_MODEL: model,
        gen_ai.GEN_AI_RESPONSE_MODEL: model,
        gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: (str(e.finish_reason),),
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: e.usage.input_tokens,
        gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: e.usage.output_tokens,
        "contextos.event.seq": e.seq,
        "contextos.turn": turn,
        **({"contextos.event.causation_id": e.causation_id} if e.causation_id is not None else {}),
        "contextos.usage.cost_usd": e.usage.cost_usd,
    }
    if e.request_id:
        attrs[gen_ai.GEN_AI_RESPONSE_ID] = e.request_id
    if e.context_hash:
        attrs["contextos.context.hash"] = e.context_hash
    if capture.content:
        attrs[gen_ai.GEN_AI_INPUT_MESSAGES] = json.dumps(conversation)
        attrs[gen_ai.GEN_AI_OUTPUT_MESSAGES] = json.dumps([_assistant(capture, e)])
    return SpanRecord(
        name=f"chat {model}",
        kind="client",
        trace_id=trace_id,
        span_id=span_id_for(e.run_id, f"chat/{e.seq}"),
        parent_id=root_id,
        start=e.occurred_at - timedelta(milliseconds=e.latency_ms),
        end=e.occurred_at,
        attributes=attrs,
        closed_by=e.seq,
    )


def _tool_span(
    t: _Tool,
    e: ev.ToolCompleted | None,
    trace_id: int,
    root_id: int,
    run_id: str,
    capture: Capture,
) -> SpanRecord:
    attrs: dict[str, AttrValue] = {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value,
        gen_ai.GEN_AI_TOOL_NAME: t.name,
        gen_ai.GEN_AI_TOOL_CALL_ID: t.call_id,
        gen_ai.GEN_AI_TOOL_TYPE: "function",
        **t.attributes,
    }
    status: Status = "unset"
    text = ""
    if e is not None:
        attrs["contextos.event.seq"] = e.seq
        if e.causation_id is not None:
            attrs["contextos.event.causation_id"] = e.causation_id
        if e.effect_id:
            attrs["contextos.effect.id"] = e.effect_id
        if e.is_error:
            status, text = "error", e.output[:200]
            attrs[ERROR_TYPE] = e.error_code or "tool_error"
    if capture.content:
        attrs[gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS] = capture.text(t.arguments)
        if e is not None:
            attrs[gen_ai.GEN_AI_TOOL_CALL_RESULT] = capture.text(e.output)
    return SpanRecord(
        name=f"execute_tool {t.name}",
        kind="internal",
        trace_id=trace_id,
        span_id=span_id_for(run_id, f"tool/{t.call_id}"),
        parent_id=root_id,
        start=t.start,
        end=max(t.start, e.occurred_at) if e is not None else t.start,
        attributes=attrs,
        events=tuple(t.events),
        status=status,
        status_description=text,
        closed_by=e.seq if e is not None else None,
    )


def _node_span(
    n: _Node,
    e: ev.NodeCompleted | ev.NodeFailed | None,
    trace_id: int,
    root_id: int,
    run_id: str,
    flow: ev.WorkflowBound | None,
) -> SpanRecord:
    attrs: dict[str, AttrValue] = {
        "contextos.node.name": n.name,
        "contextos.node.kind": n.kind,
        "contextos.run.id": run_id,
        **n.attributes,
    }
    if flow is not None:
        attrs[gen_ai.GEN_AI_WORKFLOW_NAME] = flow.workflow
    status: Status = "unset"
    text = ""
    if isinstance(e, ev.NodeFailed):
        status, text = "error", e.message[:200]
        attrs[ERROR_TYPE] = str(e.reason)
    elif e is not None:
        status = "ok"
        if e.converged is not None:
            attrs["contextos.node.converged"] = e.converged
    return SpanRecord(
        name=f"node {n.name}",
        kind="internal",
        trace_id=trace_id,
        span_id=span_id_for(run_id, f"node/{n.name}"),
        parent_id=root_id,
        start=n.start,
        end=max(n.start, e.occurred_at) if e is not None else n.start,
        attributes=attrs,
        events=tuple(n.events),
        status=status,
        status_description=text,
        closed_by=e.seq if e is not None else None,
    )


def _replace_end(span: SpanRecord, end: datetime, closed_by: int | None, ended: bool) -> SpanRecord:
    attrs = dict(span.attributes)
    attrs["contextos.tool.completed"] = False
    return SpanRecord(
        name=span.name,
        kind=span.kind,
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_id=span.parent_id,
        start=span.start,
        end=max(span.start, end),
        attributes=attrs,
        events=span.events,
        status="error" if ended else "unset",
        status_description="the run ended before the call completed" if ended else "",
        closed_by=closed_by,
    )


def _name(e: ev.Event) -> str:
    return f"contextos.{e.type}"


_SKIP = {
    "run_id",
    "seq",
    "occurred_at",
    "type",
    "causation_id",
    "correlation_id",
    "payload",
    "value",
    "context",
}


_CONTENT = {"input", "content", "output", "summary", "feedback", "gaps"}
"""Fields that hold what was said (the user's input, a summary, a verifier's gaps): exported
only as the capture mode says, like messages."""


def _content(capture: Capture, name: str, value: str | tuple[str, ...]) -> dict[str, AttrValue]:
    if not capture.content:
        return {}
    if isinstance(value, str):
        return {name: capture.text(value)}
    return {name: tuple(capture.text(v) for v in value)}


def _event_attrs(e: ev.Event, capture: Capture) -> dict[str, AttrValue]:
    """Scalar fields of an event as span-event attributes (payloads stay in the store)."""
    attrs: dict[str, AttrValue] = {"contextos.event.seq": e.seq}
    if e.causation_id is not None:
        attrs["contextos.event.causation_id"] = e.causation_id
    for f in dataclasses.fields(e):
        name, value = f.name, getattr(e, f.name)
        if name in _SKIP or value is None or value == "":
            continue
        if name in _CONTENT:
            if isinstance(value, str | tuple):
                attrs.update(_content(capture, name, value))
        elif isinstance(value, str | bool | int | float):
            attrs[name] = value
        elif isinstance(value, datetime):
            attrs[name] = value.isoformat()
        elif isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            attrs[name] = value
    return attrs


def _message(
    capture: Capture, role: str, text: str, seq: int, *, call_id: str | None = None
) -> dict[str, Any]:
    """A message as the GenAI conventions write it, its text as `capture` exports it (a
    message is only built into a span when the mode carries content)."""
    shown, lineage = capture.text(text) if capture.content else "", capture.lineage(seq)
    if call_id is not None:
        part = {"type": "tool_call_response", "id": call_id, "response": shown, **lineage}
        return {"role": role, "parts": [part]}
    return {"role": role, "parts": [{"type": "text", "content": shown, **lineage}]}


def _assistant(capture: Capture, e: ev.ModelResponded) -> dict[str, Any]:
    message, lineage = e.message, capture.lineage(e.seq)
    parts: list[dict[str, Any]] = []
    if message.content:
        shown = capture.text(message.content) if capture.content else ""
        parts.append({"type": "text", "content": shown, **lineage})
    for c in message.tool_calls:
        arguments = capture.text(c.arguments) if capture.content else ""
        parts.append(
            {"type": "tool_call", "id": c.id, "name": c.name, "arguments": arguments, **lineage}
        )
    return {"role": "assistant", "parts": parts, "finish_reason": str(e.finish_reason)}
