"""A person's hand on a run between its steps: pause, and send a follow-up message."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from contextos import RunResult, RunStatus, Runtime, load_agent
from contextos.cli.common import (
    AgentRefOption,
    JsonOption,
    StoreOption,
    app,
    call,
    console,
    drive,
    examples,
    print_json,
    print_result,
    resolve_run,
)
from contextos.cli.runs import FollowOption, following

PAUSE_POLL_S = 0.2
"""How often `pause --wait` looks whether the run's driver has paused it."""


@app.command(
    short_help="Pause a run at its next step boundary.",
    epilog=examples(
        "contextos pause run_3f2a9c",
        'contextos pause run_3f --reason "checking the refunds first" --wait',
    ),
)
def pause(
    run_id: Annotated[str, typer.Argument(help="The run to pause.")],
    reason: Annotated[str, typer.Option(help="Why (recorded on the run).")] = "",
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait until the run's driver has paused it.")
    ] = False,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Pause a run at its next step boundary; it keeps everything it recorded.

    A run driven by another process (a worker, `contextos run`) finishes its step in flight
    first. Continue it with `contextos resume RUN_ID` or `contextos send RUN_ID "message"`.
    Example: contextos pause RUN_ID --reason "checking the refunds first" --wait
    """

    async def work(rt: Runtime) -> RunResult:
        result = await rt.pause(run_id, reason=reason, actor="user:cli")
        while wait and result.status is RunStatus.RUNNING:
            await asyncio.sleep(PAUSE_POLL_S)
            # Asking again changes nothing while its driver lives, and pauses it here and now
            # if that driver is gone without taking the request in.
            result = await rt.pause(run_id, reason=reason, actor="user:cli")
        return result

    result = call(store, work)
    if as_json:
        print_json(result)
    elif result.status is RunStatus.RUNNING:
        console.print(
            f"run [bold]{result.run_id}[/] pauses after its current step (its driver takes the "
            f"request in there); `contextos show {result.run_id}` says when"
        )
    else:
        print_result(result, False)


@app.command(
    short_help="Send a message to a paused run or an answered conversation.",
    epilog=examples(
        'contextos send run_3f2a9c "Now the same for last month, please."',
        'contextos send run_3f "And in euros?" --follow',
    ),
)
def send(
    run_id: Annotated[str, typer.Argument(help="The run to continue.")],
    message: Annotated[str, typer.Argument(help="Your next message to the agent.")],
    store: StoreOption = None,
    agent_ref: AgentRefOption = None,
    follow_events: FollowOption = False,
    as_json: JsonOption = False,
) -> None:
    """Send a message to a paused run, or to a conversation that answered, and drive it on
    here as the same run until it answers again.
    """
    run_id = resolve_run(store, run_id)

    async def work(rt: Runtime) -> RunResult:
        agent = load_agent(agent_ref) if agent_ref else None
        seen = (await rt.state(run_id)).seq if follow_events else 0
        sending = rt.send(run_id, message, actor="user:cli", agent=agent)
        return await following(
            rt, run_id, sending, on=follow_events, as_json=as_json, after_seq=seen
        )

    drive(store, work, as_json)


@app.command(
    short_help="Finish an answered conversation: its last answer is the output.",
    epilog=examples("contextos finish run_3f2a9c", "contextos finish run_3f --json"),
)
def finish(
    run_id: Annotated[str, typer.Argument(help="The conversation to finish.")],
    store: StoreOption = None,
    agent_ref: AgentRefOption = None,
    as_json: JsonOption = False,
) -> None:
    """Close a conversation that answered as completed: its last answer becomes the run's
    output (and output artifact), as for a run that is not a conversation.
    """
    run_id = resolve_run(store, run_id)

    async def work(rt: Runtime) -> RunResult:
        agent = load_agent(agent_ref) if agent_ref else None
        return await rt.finish(run_id, actor="user:cli", agent=agent)

    result = call(store, work)
    if as_json:
        print_json(result)
    else:
        print_result(result, False)
