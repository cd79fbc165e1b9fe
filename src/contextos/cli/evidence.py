"""Evidence: artifacts, decision records, replay and fork."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from contextos import (
    Artifact,
    ConfigError,
    ContextOSError,
    DecisionRecord,
    ReplayPacket,
    RunResult,
    Runtime,
    load_agent,
)
from contextos.cli.common import (
    JsonOption,
    StoreOption,
    app,
    call,
    console,
    counted,
    examples,
    fail,
    finish,
    print_json,
    resolve_run,
)


@app.command(
    short_help="List a run's artifacts, with their lineage.",
    epilog=examples(
        "contextos artifacts run_3f2a9c",
        "contextos artifacts run_3f2a9c --json",
    ),
)
def artifacts(
    run_id: Annotated[str, typer.Argument(help="The run whose artifacts to list.")],
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the artifacts a run produced, with their lineage."""
    run_id = resolve_run(store, run_id)
    rows = call(store, lambda rt: rt.artifacts(run_id))
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print(f"[dim]run {run_id} recorded no artifacts (yet)[/]")
        return
    table = Table(title=f"artifacts of {run_id} ({len(rows)})", title_justify="left")
    table.add_column("id", no_wrap=True)
    for col in ("type", "bytes", "classification", "sha256", "from events", "from artifacts"):
        table.add_column(col, overflow="fold")
    for a in rows:
        table.add_row(
            a.artifact_id,
            a.type,
            str(a.size),
            a.classification,
            a.content_hash[:12],
            ", ".join(f"#{s}" for s in a.source_events),
            ", ".join(a.input_artifacts),
        )
    console.print(table)


@app.command(
    short_help="Show an artifact: what, where from, its content.",
    epilog=examples(
        "contextos artifact art_5d0c…",
        "contextos artifact art_5d0c… --content > report.md",
    ),
)
def artifact(
    artifact_id: Annotated[str, typer.Argument(help="The artifact to show.")],
    store: StoreOption = None,
    content_only: Annotated[
        bool, typer.Option("--content", help="Print only the content, as stored.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Show an artifact: what it is, where it came from, and its content."""
    found, content = call(store, lambda rt: rt.artifact(artifact_id))
    if content_only:
        sys.stdout.buffer.write(content)
        return
    text = content.decode() if found.is_text else None
    if as_json:
        print_json({"artifact": found, "content": text})
        return
    _describe(found)
    console.print(Text(text) if text is not None else f"[dim]{found.size} bytes of binary[/]")


def _describe(a: Artifact) -> None:
    console.print(f"artifact [bold]{a.artifact_id}[/] · {a.type} (schema {a.schema_version})")
    lines = [
        f"run {a.run_id}, events {', '.join(f'#{s}' for s in a.source_events) or '-'}",
        f"from artifacts: {', '.join(a.input_artifacts) or '-'}",
        f"sha256 {a.content_hash} · {a.size} bytes · {a.media_type}",
        f"classification {a.classification} · policy snapshot {a.policy_snapshot[:12] or '-'}",
    ]
    for line in lines:
        console.print(Text(line, style="dim"))


@app.command(
    short_help="Show a run's DecisionRecord, traced to its events.",
    epilog=examples(
        "contextos record run_3f2a9c",
        "contextos record run_3f2a9c --json",
    ),
)
def record(
    run_id: Annotated[str, typer.Argument(help="The run whose decision record to show.")],
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a run's DecisionRecord: projected from its log, every part traced to event seqs."""
    run_id = resolve_run(store, run_id)

    built = call(store, lambda rt: rt.record(run_id))
    stored = call(store, lambda rt: rt.receipts(run_id))
    if as_json:
        sys.stdout.write(built.to_json() + "\n")
        return
    for line in _record_lines(built):
        console.print(line)
    for r in stored:
        mark = "identical to the log" if r.matches else f"DIFFERS from the log: {r.problem}"
        style = "green" if r.matches else "bold red"
        where = f"vouched for by {r.anchor}" if r.anchor else f"stored ({r.artifact_id})"
        console.print(Text(f"at #{r.at_seq}, {where}: {mark}", style=style))
    if not stored:
        when = (
            "its parent's log vouches for it once the parent takes its result in"
            if call(store, lambda rt: rt.state(run_id)).delegation is not None
            else "it is stored when the run ends or waits"
        )
        console.print(Text(f"not vouched for yet ({when})", style="dim"))
    if not all(r.matches for r in stored):
        raise typer.Exit(1)  # a stored record the log no longer gives is a finding, not a view


def _seqs(seqs: list[int]) -> str:
    return "[" + ",".join(f"#{s}" for s in seqs) + "]"


def _calls(n: int) -> str:
    return counted(n, "model call")


def _record_lines(r: DecisionRecord) -> list[Text]:
    o = r.outcome
    lines = [
        Text(
            f"decision record of run {r.run_id}: {o.status} ({o.checkpoint} at #{r.at_seq}) "
            f"· hash {r.record_hash[:16]}",
            style="bold",
        ),
        Text(
            f"asked: {r.ask.input!r} of {r.ask.agent_name} v{r.ask.agent_version} "
            f"{_seqs(r.ask.seqs)}"
        ),
    ]
    if r.principal is not None:
        p = r.principal
        lines.append(
            Text(
                f"acts for {p.principal}, scopes {', '.join(p.scopes) or '-'}, clearance "
                f"{p.clearance} {_seqs(p.seqs)}"
            )
        )
    if r.policy is not None:
        lines.append(
            Text(
                f"policy {r.policy.name} v{r.policy.version}, snapshot "
                f"{r.policy.snapshot_hash[:12]} {_seqs(r.policy.seqs)}"
            )
        )
    for m in r.model_calls:
        chose = ", ".join(c.tool for c in m.tool_calls) or "answered"
        lines.append(
            Text(
                f"model call {m.turn}: {m.model}, context {(m.context_hash or '-')[:12]} "
                f"({len(m.manifest)} items), tools {', '.join(m.tools_visible) or '-'} "
                f"-> {chose} {_seqs(m.seqs)}"
            )
        )
    for a in r.actions:
        parts = [f"action {a.call_id} {a.tool}"]
        parts += [f"{d.decision} ({', '.join(d.rule_ids)}) {_seqs(d.seqs)}" for d in a.decisions]
        for ap in a.approvals:
            who = f" by {ap.approver}" if ap.approver else ""
            until = f" until {ap.expires_at}" if ap.expires_at else ""
            parts.append(f"{ap.outcome}{who}, frozen {ap.frozen_hash[:12]}{until} {_seqs(ap.seqs)}")
        if a.effect is not None:
            receipts_ = ", ".join(f"{k}={v}" for k, v in a.effect.receipts.items()) or "none"
            parts.append(f"effect {a.effect.state}, receipts {receipts_} {_seqs(a.effect.seqs)}")
        if a.result is not None:
            res = a.result.error_code or "ok"
            parts.append(f"result {res} {_seqs(a.result.seqs)}")
        lines.append(Text(" · ".join(parts)))
    for e in r.evaluations:
        verdict = "passed" if e.passed else "failed: " + "; ".join(e.gaps)
        lines.append(
            Text(
                f"evaluated by {e.evaluator} ({e.evaluator_kind} {e.evaluator_version}): "
                f"{verdict} {_seqs(e.seqs)}"
            )
        )
    for art in r.artifacts:
        lines.append(
            Text(
                f"artifact {art.artifact_id} {art.type}, {art.classification}, sha256 "
                f"{art.content_hash[:12]} {_seqs(art.seqs)}"
            )
        )
    children = r.delegations or []
    for d in children:
        why = f" ({d.reason})" if d.reason else ""
        vouched = f", record {d.record_hash[:12]}" if d.record_hash else ""
        lines.append(
            Text(
                f"child {d.child_run_id} ({d.agent_name}) {d.status}{why}: "
                f"{_calls(d.model_calls)}, {d.input_tokens}+{d.output_tokens} tokens, "
                f"${d.cost_usd:.4f}"
                f"{vouched} {_seqs(d.seqs)}"
            )
        )
    c = r.costs
    own = " of its own" if children else ""
    cost = (
        f"cost: {_calls(c.model_calls)}{own}, {c.input_tokens}+{c.output_tokens} tokens, "
        f"${c.cost_usd:.4f}"
    )
    if children:
        cost += (
            f"; its child runs: {_calls(sum(d.model_calls for d in children))}, "
            f"{sum(d.input_tokens for d in children)}+"
            f"{sum(d.output_tokens for d in children)} tokens, "
            f"${sum(d.cost_usd for d in children):.4f}"
        )
    lines.append(Text(cost))
    why = f": {o.reason} {o.message or ''}".rstrip() if o.reason else ""
    lines.append(Text(f"ended {o.status}{why} {_seqs(o.seqs)}"))
    return lines


@app.command(
    short_help="Replay a run against a changed agent: no live call.",
    epilog=examples(
        "contextos replay run_3f2a9c --agent agent_v2.py:agent",
        "contextos replay --packet run.packet.json --json",
    ),
)
def replay(
    run_id: Annotated[
        str | None, typer.Argument(help="The recorded run to replay (or give --packet).")
    ] = None,
    agent_ref: Annotated[
        str | None,
        typer.Option("--agent", help="The changed agent to replay against (default: recorded)."),
    ] = None,
    packet: Annotated[
        Path | None, typer.Option("--packet", help="Replay a ReplayPacket file instead of a run.")
    ] = None,
    policy: Annotated[
        Path | None, typer.Option("--policy", help="Decide the replay's calls by this policy.")
    ] = None,
    keep: Annotated[
        Path | None, typer.Option("--keep", help="Keep the replay's log in this SQLite file.")
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Replay a recorded run against a changed agent: recorded tool results, no live call.

    Exits 0 when the replay decided what the run decided (replay_equal), 1 otherwise.
    """
    if (run_id is None) == (packet is None):
        fail(ConfigError("give a run id or --packet FILE (one of them)"))
    try:
        agent = load_agent(agent_ref) if agent_ref else None
        source: str | ReplayPacket = (
            ReplayPacket.from_json(packet.read_bytes())
            if packet is not None
            else resolve_run(store, str(run_id))
        )
    except OSError as exc:
        fail(ConfigError(f"cannot read {packet}: {exc.strerror}"))
    except ContextOSError as exc:
        fail(exc)
    report = call(store, lambda rt: rt.replay(source, agent, policy=policy, keep=keep))
    if as_json:
        print_json(report)
    else:
        style = "green" if report.equal else "bold red"
        head, _, rest = report.text().partition("\n")
        console.print(Text(head, style=style))
        console.print(Text(rest))
    if not report.equal:
        raise typer.Exit(code=1)


@app.command(
    "packet",
    short_help="Print a run's ReplayPacket (JSON) to replay anywhere.",
    epilog=examples(
        "contextos packet run_3f2a9c > run.packet.json",
    ),
)
def packet_command(
    run_id: Annotated[str, typer.Argument(help="The recorded run to pin.")],
    agent_ref: Annotated[
        str | None,
        typer.Option("--agent", help="The agent to replay by default (default: recorded)."),
    ] = None,
    store: StoreOption = None,
) -> None:
    """Print a run's ReplayPacket (JSON): its log and decisions, pinned, to replay anywhere."""
    run_id = resolve_run(store, run_id)
    found = call(store, lambda rt: rt.packet(run_id, agent_ref=agent_ref))
    sys.stdout.write(found.to_json() + "\n")


@app.command(
    short_help="Fork a run at a seq and drive the fork.",
    epilog=examples(
        "contextos fork run_3f2a9c --at 6",
        "contextos fork run_3f2a9c --at 6 --agent agent_v2.py:agent --json",
    ),
)
def fork(
    run_id: Annotated[str, typer.Argument(help="The run to fork.")],
    at: Annotated[
        int, typer.Option("--at", help="Copy the run's events 1..SEQ, go on from there.")
    ],
    agent_ref: Annotated[
        str | None,
        typer.Option("--agent", help="Go on with this agent (default: the run's)."),
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fork a run at a seq and drive the fork: effects the run already sent are never sent
    again (the fork sees their outcome and receipts)."""
    try:
        agent = load_agent(agent_ref) if agent_ref else None
    except ContextOSError as exc:
        fail(exc)
    run_id = resolve_run(store, run_id)

    async def work(rt: Runtime) -> RunResult:
        forked = await rt.fork(run_id, at=at, agent=agent, agent_ref=agent_ref)
        if not as_json:
            console.print(f"[dim]forked {run_id} at #{at} as {forked}[/]")
        return await rt.resume(forked, agent)

    finish(call(store, work), as_json)
