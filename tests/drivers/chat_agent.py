"""A conversation agent whose scripted model answers with the conversation it was sent.

Each answer is the user and assistant messages of the request, `role: text` joined by ` | `,
so a test reads from the run's output exactly what the model received. Two answers at most:
the budget allows two model turns.
"""

from __future__ import annotations

from contextos import Agent, Budget, ModelRequest, ModelResponse
from contextos.testing import ScriptedModel, reply


def echo(request: ModelRequest) -> ModelResponse:
    said = [f"{m.role}: {m.content}" for m in request.messages if m.role in ("user", "assistant")]
    return reply(" | ".join(said))


def agent() -> Agent:
    # A factory: every process gets a fresh script, and the turn picks the step on resume.
    return Agent(
        name="chat",
        model=ScriptedModel([echo, echo], by_turn=True),
        budget=Budget(max_turns=2),
        conversation=True,
    )
