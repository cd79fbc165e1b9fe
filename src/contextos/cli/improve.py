"""The improvement loop: `findings`, `proposals`, `candidate …`, `release …`, `rollback`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.text import Text

from contextos import ContextOSError, ReplayPacket, Runtime
from contextos.cli.common import JsonOption, StoreOption, app, call, console, err, examples, fail
from contextos.improve import METRICS, Change, Decided, Improvements, Proposal, ReleaseReport

candidate_app = typer.Typer(
    help="Candidates: an exact change to an agent, kept beside its current release.",
    no_args_is_help=True,
)
release_app = typer.Typer(
    help="Release decisions: replay a candidate, ask a person, release; see the release line.",
    no_args_is_help=True,
)
app.add_typer(candidate_app, name="candidate")
app.add_typer(release_app, name="release")


def _dump(value: BaseModel | list[Any]) -> None:
    if isinstance(value, list):
        text = "[" + ",".join(v.model_dump_json() for v in value) + "]"
        sys.stdout.write(text + "\n")
    else:
        sys.stdout.write(value.model_dump_json(indent=2) + "\n")


@app.command(epilog=examples("contextos findings", "contextos findings --scan --min-runs 3 --json"))
def findings(
    scan: Annotated[
        bool, typer.Option("--scan", help="Run the findings job now (a run) before showing.")
    ] = False,
    min_runs: Annotated[
        int, typer.Option(help="With --scan: a pattern is a finding once this many runs show it.")
    ] = 2,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Recurring failures and near misses across runs, with their evidence and root cause."""

    async def work(rt: Runtime) -> Any:
        loop = Improvements(rt)
        return await loop.scan(min_runs=min_runs) if scan else await loop.review()

    review = call(store, work)
    if as_json:
        _dump(review.findings)
        return
    console.print(f"[dim]{review.runs_read} runs read · {len(review.findings)} findings[/]")
    for f in review.findings:
        console.print(Text(f.line(), style="bold"))
        console.print(Text(f"  {f.signature}"))
        console.print(
            Text(
                f"  first {f.first_seen:%Y-%m-%d %H:%M}, last {f.last_seen:%Y-%m-%d %H:%M} · "
                + ", ".join(f"{e.run_id}#{e.seq}" for e in f.evidence[:5])
                + (" …" if len(f.evidence) > 5 else ""),
                style="dim",
            )
        )


@app.command(
    epilog=examples(
        "contextos proposals",
        "contextos proposals --json",
        "contextos proposals --draft fnd_3f2a9c --model openai:gpt-4.1-mini",
    )
)
def proposals(
    draft: Annotated[
        str | None,
        typer.Option(
            metavar="FINDING",
            help="Ask --model to draft one more proposal for this finding (checked, then "
            "kept beside the others; it changes nothing until released).",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="With --draft: a model string (openai:MODEL, local, …) or a reference "
            "(path.py:attr) to a model adapter."
        ),
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """What the latest findings say should change, and on which rung of the ladder."""
    if (draft is None) != (model is None):
        err.print("[bold red]error:[/] --draft FINDING and --model MODEL go together")
        raise typer.Exit(code=1)

    async def work(rt: Runtime) -> list[Proposal]:
        loop = Improvements(rt)
        if draft is not None and model is not None:
            await loop.draft(draft, model)
        return await loop.proposals()

    listed = call(store, work)
    if as_json:
        _dump(listed)
        return
    for p in listed:
        console.print(Text(f"{p.proposal_id} {p.layer} · {p.scope}", style="bold"))
        console.print(Text(f"  change: {p.change}"))
        console.print(Text(f"  why: {p.rationale}", style="dim"))
        console.print(
            Text(
                f"  expect {p.impact.metric}: {p.impact.baseline:g} -> {p.impact.target:g} · "
                f"finding {p.finding_id} · drafted by {p.drafted_by}",
                style="dim",
            )
        )
    if not listed:
        console.print("[dim]no proposals: the latest findings found nothing recurring[/]")


@candidate_app.command(
    "create",
    epilog=examples(
        "contextos candidate create prop_3f2a9c",
        'contextos candidate create prop_3f2a9c --text "Ids: A-1."',
    ),
)
def candidate_create(
    proposal_id: Annotated[str, typer.Argument(help="The proposal (`contextos proposals`).")],
    text: Annotated[
        str | None, typer.Option(help="Use these words instead of the drafted ones.")
    ] = None,
    agent_ref: Annotated[
        str | None, typer.Option("--agent", help="The agent's reference (default: recorded).")
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make the candidate a proposal asks for: a new agent identity, not yet released."""
    found = call(
        store,
        lambda rt: Improvements(rt).candidate(proposal_id, text=text, agent_ref=agent_ref),
    )
    if as_json:
        _dump(found)
        return
    console.print(
        Text(
            f"candidate {found.candidate_id} of {found.agent}: {found.base_hash[:12]} -> "
            f"{found.candidate_hash[:12]}",
            style="bold",
        )
    )
    console.print(Text(f"  {found.change.kind} {found.change.target}: {found.change.text}"))
    err.print(
        Text(
            f"replay it: contextos release check {found.candidate_id} --golden RUN_OR_PACKET",
            "dim",
        )
    )


@candidate_app.command(
    "change",
    epilog=examples('contextos candidate change desk.py:agent --tool lookup --text "Ids: A-1."'),
)
def candidate_change(
    agent_ref: Annotated[str, typer.Argument(help="The agent (path.py:attr or module:attr).")],
    text: Annotated[str, typer.Option(help="The new description, or the added instruction.")],
    tool: Annotated[
        str | None, typer.Option(help="Change this tool's description (else: instructions).")
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make a candidate by hand: a new tool description or an added instruction."""
    change = Change(
        kind="tool_description" if tool else "instructions", target=tool or "", text=text
    )
    found = call(store, lambda rt: Improvements(rt).change(agent_ref, change))
    if as_json:
        _dump(found)
        return
    console.print(Text(f"candidate {found.candidate_id} of {found.agent}", style="bold"))


@candidate_app.command(
    "list", epilog=examples("contextos candidate list", "contextos candidate list --json")
)
def candidate_list(store: StoreOption = None, as_json: JsonOption = False) -> None:
    """Every candidate kept in the store, oldest first."""
    found = call(store, lambda rt: Improvements(rt).candidates())
    if as_json:
        _dump(found)
        return
    for c in found:
        console.print(
            Text(
                f"{c.candidate_id} {c.agent} {c.change.kind} {c.change.target} "
                f"{c.candidate_hash[:12]} (from {c.proposal_id or 'a person'})"
            )
        )


@release_app.command(
    "check",
    epilog=examples("contextos release check cand_3f2a9c --golden run_1a2b --golden run_3c4d"),
)
def release_check(
    candidate_id: Annotated[str, typer.Argument(help="The candidate to replay.")],
    golden: Annotated[
        list[str] | None,
        typer.Option(help="A golden run: its id, or a ReplayPacket file (repeatable)."),
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Replay the candidate over the golden runs and its finding's runs (no tool is called).

    Exits 1 when it regresses a golden run: such a candidate cannot be released."""
    try:
        sources: list[str | ReplayPacket] = [
            ReplayPacket.from_json(Path(g).read_bytes()) if Path(g).is_file() else g
            for g in golden or ()
        ]
    except ContextOSError as exc:
        fail(exc)
    report = call(store, lambda rt: Improvements(rt).check(candidate_id, golden=sources))
    if as_json:
        _dump(report)
    else:
        _print_report(report)
    if report.regressions:
        raise typer.Exit(code=1)


def _print_report(report: ReleaseReport) -> None:
    style = "bold red" if report.regressions else "green"
    console.print(Text(report.line(), style=style))
    for c in report.cases:
        kind = "golden" if c.golden else "finding"
        console.print(Text(f"  {c.outcome}: {kind} run {c.source} ({c.replay_status})"))
        if c.diff:
            console.print(Text("    " + c.diff.replace("\n", "\n    "), style="dim"))
    if not report.regressions:
        err.print(
            Text(
                f"ask for it: contextos release request {report.candidate_id} "
                f"{report.report_id} --releaser NAME",
                "dim",
            )
        )


@release_app.command(
    "request",
    epilog=examples(
        "contextos release request cand_3f2a9c rep_9e8d --releaser alice",
        "contextos release request cand_3f2a9c rep_9e8d --releaser ann --fraction 0.1",
    ),
)
def release_request(
    candidate_id: Annotated[str, typer.Argument(help="The candidate to release.")],
    report_id: Annotated[str, typer.Argument(help="Its replay report (`release check`).")],
    releaser: Annotated[list[str], typer.Option(help="Who may approve the release (repeatable).")],
    fraction: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Serve this share of new runs: a canary.")
    ] = 1.0,
    criterion: Annotated[
        list[str] | None,
        typer.Option(
            help="What the canary is judged on (repeatable): METRIC <= N, METRIC >= N or "
            "METRIC - stable <= N; metrics: " + ", ".join(METRICS) + "."
        ),
    ] = None,
    store: StoreOption = None,
) -> None:
    """Ask a person to release a candidate: refused when its report regresses a golden run."""
    asked = call(
        store,
        lambda rt: Improvements(rt).request_release(
            candidate_id, report_id, releasers=releaser, fraction=fraction, criteria=criterion or ()
        ),
    )
    console.print(Text(f"release waits for approval: {asked.id}", style="magenta"))
    if asked.action is not None:
        console.print(Text(f"  {asked.action.preview}"))
        console.print(Text(f"  blast radius: {asked.action.blast_radius}", style="dim"))
    err.print(Text(f"approve: contextos release approve {asked.id} --as NAME", "dim"))


@release_app.command(
    "approve", epilog=examples("contextos release approve run_3f2a9c.i2 --as alice")
)
def release_approve(
    interrupt_id: Annotated[str, typer.Argument(help="The release's question.")],
    approver: Annotated[str, typer.Option("--as", help="Who approves (a releaser).")],
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Approve a release and carry it out: a recorded decision."""
    done = call(store, lambda rt: Improvements(rt).approve(interrupt_id, approver=approver))
    _print_decided(done, as_json)


@release_app.command(
    "deny",
    epilog=examples('contextos release deny run_3f2a9c.i2 --as alice --reason "not this week"'),
)
def release_deny(
    interrupt_id: Annotated[str, typer.Argument(help="The release's question.")],
    approver: Annotated[str, typer.Option("--as", help="Who refuses (a releaser).")],
    reason: Annotated[str, typer.Option(help="Why.")] = "",
    store: StoreOption = None,
) -> None:
    """Refuse a release: nothing changes."""
    call(store, lambda rt: Improvements(rt).deny(interrupt_id, approver=approver, reason=reason))
    console.print(f"release {interrupt_id} refused: nothing changed")


@release_app.command(
    "status",
    epilog=examples("contextos release status", "contextos release status order-desk --json"),
)
def release_status(
    agent: Annotated[
        str | None, typer.Argument(help="One agent's release line (default: every agent's).")
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """The release and rollback decisions, oldest first; the last of an agent's is current."""
    line = call(store, lambda rt: Improvements(rt).history(agent))
    if as_json:
        _dump([d.decision for d in line])
        return
    for d in line:
        console.print(Text(_decided_line(d)))
    if not line:
        console.print("[dim]no release decisions: agents run their code as it is[/]")


@release_app.command(
    "watch",
    epilog=examples(
        "contextos release watch order-desk --min-runs 20",
        "contextos release watch order-desk --max-failure-rate 0.2",
    ),
)
def release_watch(
    agent: Annotated[str, typer.Argument(help="The agent whose canary to judge.")],
    max_failure_rate: Annotated[
        float | None,
        typer.Option(
            min=0.0, max=1.0, help="Also roll back over this share of failed canary runs."
        ),
    ] = None,
    min_runs: Annotated[int, typer.Option(help="Judge only once this many runs ended.")] = 5,
    by: Annotated[str, typer.Option("--as", help="Who rolls back.")] = "canary-watch",
    store: StoreOption = None,
) -> None:
    """Judge a canary on the criteria its release names, against the stable runs; roll it
    back when one fails.

    Exits 1 when it rolled the canary back."""
    verdict = call(
        store,
        lambda rt: Improvements(rt).watch(
            agent, max_failure_rate=max_failure_rate, min_runs=min_runs, by=by
        ),
    )
    style = "bold red" if verdict.action == "rolled_back" else "green"
    console.print(Text(verdict.line(), style=style))
    for judged in verdict.judged:
        console.print(Text(f"  {judged.line()}", style="" if judged.passed else "red"))
    if verdict.action == "rolled_back":
        raise typer.Exit(code=1)


@app.command(epilog=examples('contextos rollback order-desk --as alice --reason "more failures"'))
def rollback(
    agent: Annotated[str, typer.Argument(help="The agent whose current release to undo.")],
    by: Annotated[str, typer.Option("--as", help="Who rolls back.")],
    reason: Annotated[str, typer.Option(help="Why.")] = "",
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Go back to an agent's release before the current one: a recorded decision."""
    done = call(store, lambda rt: Improvements(rt).rollback(agent, by=by, reason=reason))
    _print_decided(done, as_json)


def _decided_line(d: Decided) -> str:
    x = d.decision
    now = x.candidate_id or "its code as it is"
    share = f" for {x.fraction:.0%} of runs" if x.fraction < 1 else ""
    if x.criteria:
        share += f" (judged on {'; '.join(x.criteria)})"
    why = f": {x.reason}" if x.reason else ""
    return (
        f"{d.at:%Y-%m-%d %H:%M:%S} {x.agent}: {x.action} -> {now}{share} by {x.decided_by}"
        f"{why} ({d.run_id})"
    )


def _print_decided(done: Decided, as_json: bool) -> None:
    if as_json:
        _dump(done.decision)
        return
    console.print(Text(_decided_line(done), style="green"))
