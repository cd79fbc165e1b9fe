"""The token budget gate: the outermost layer, so a call over budget never reaches the model.

Caps apply per run (tokens, model calls) and per principal per UTC day (tokens, calls, money).
The daily counters live in the store: SQLite keeps them in `principal_usage`, maintained by a
trigger on the event log itself, so they are exactly the run events and cannot drift from them.
A call is refused when what was spent plus what this call would cost (its estimated input
plus the output reserve) passes a cap; the run then ends with `budget_exhausted`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import date, datetime
from typing import Any, Protocol

from contextos.errors import ConfigError
from contextos.events import utcnow
from contextos.middleware.base import (
    BaseMiddleware,
    DailySpend,
    Middleware,
    ModelCall,
    ModelHandler,
    ModelResult,
    Services,
    Spend,
    Stop,
)
from contextos.runs import FailureReason


class BudgetGate(BaseMiddleware):
    """Refuses model calls that would pass a cap; the model is then never called."""

    name = "budget"
    platform_slot = 1

    def __init__(
        self,
        *,
        run_tokens: int | None = None,
        max_model_calls: int | None = None,
        daily_tokens: int | None = None,
        daily_calls: int | None = None,
        daily_cost_usd: float | None = None,
        reserve_output_tokens: int = 512,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.run_tokens = run_tokens
        self.max_model_calls = max_model_calls
        self.daily_tokens = daily_tokens
        self.daily_calls = daily_calls
        self.daily_cost_usd = daily_cost_usd
        self.reserve_output_tokens = reserve_output_tokens
        self.clock = clock
        self.spend: DailySpend | None = None

    @property
    def needs_daily_spend(self) -> bool:
        return any(
            c is not None for c in (self.daily_tokens, self.daily_calls, self.daily_cost_usd)
        )

    @property
    def needs_principal(self) -> bool:
        """Daily caps are per principal: a run bound to no one cannot be charged to one."""
        return self.needs_daily_spend

    def fingerprint(self) -> dict[str, Any]:
        return {
            "run_tokens": self.run_tokens,
            "max_model_calls": self.max_model_calls,
            "daily_tokens": self.daily_tokens,
            "daily_calls": self.daily_calls,
            "daily_cost_usd": self.daily_cost_usd,
            "reserve_output_tokens": self.reserve_output_tokens,
        }

    def bind(self, services: Services) -> Middleware:
        if self.needs_daily_spend and services.spend is None:
            raise ConfigError(
                "the budget gate has daily caps but the store keeps no daily usage counters",
                layer=self.name,
            )
        bound = copy.copy(self)
        bound.spend = services.spend
        return bound

    async def wrap_model_call(self, call: ModelCall, call_next: ModelHandler) -> ModelResult:
        estimate = call.context.tokens + (call.max_output_tokens or self.reserve_output_tokens)
        if self.needs_principal and call.run.principal is None:
            return ModelResult(
                call=call,
                stop=Stop(
                    reason=FailureReason.MISSING_PRINCIPAL,
                    message="the daily caps are kept per principal and this run has none bound: "
                    "start it with principal= or context=",
                    layer=self.name,
                ),
            )
        reason = await self.refusal(call, estimate)
        if reason is not None:
            return ModelResult(
                call=call,
                stop=Stop(reason=FailureReason.BUDGET_EXHAUSTED, message=reason, layer=self.name),
            ).with_telemetry(**{"budget.estimate": estimate, "budget.refused": 1})
        result = await call_next(call)
        return result.with_telemetry(**{"budget.estimate": estimate})

    async def refusal(self, call: ModelCall, estimate: int) -> str | None:
        run = call.run
        if self.max_model_calls is not None and run.turns >= self.max_model_calls:
            return f"the run made all {self.max_model_calls} model calls it may make"
        spent = run.usage.total_tokens
        if self.run_tokens is not None and spent + estimate > self.run_tokens:
            return (
                f"this call (about {estimate} tokens) would take the run past its cap of "
                f"{self.run_tokens} tokens ({spent} used)"
            )
        if not self.needs_daily_spend:
            return None
        assert self.spend is not None  # bind() guarantees it
        principal = run.principal
        assert principal is not None  # checked before
        day = self.clock().date()
        today = await self.spend.spent(principal, day)
        if self.daily_tokens is not None and today.tokens + estimate > self.daily_tokens:
            return (
                f"this call (about {estimate} tokens) would take {principal} past the daily cap "
                f"of {self.daily_tokens} tokens ({today.tokens} used on {day})"
            )
        if self.daily_calls is not None and today.calls + 1 > self.daily_calls:
            return f"{principal} made all {self.daily_calls} model calls allowed on {day}"
        if self.daily_cost_usd is not None and today.cost_usd >= self.daily_cost_usd:
            return (
                f"{principal} spent ${today.cost_usd:.4f} of the daily ${self.daily_cost_usd:.4f}"
            )
        return None


class UsageCounters(Protocol):
    async def daily_usage(self, principal: str, day: str) -> tuple[int, int, float]:
        """A principal's tokens, calls and money on a UTC day."""
        ...


class StoreDailySpend:
    """Reads the daily usage counters an event store keeps (SQLite and PostgreSQL both do)."""

    def __init__(self, store: UsageCounters) -> None:
        self.store = store

    async def spent(self, principal: str, day: date) -> Spend:
        tokens, calls, cost = await self.store.daily_usage(principal, day.isoformat())
        return Spend(tokens=tokens, calls=calls, cost_usd=cost)


def daily_spend_of(store: object) -> DailySpend | None:
    """The daily spend a store counts, if it counts it."""
    if callable(getattr(store, "daily_usage", None)):
        return StoreDailySpend(store)  # type: ignore[arg-type]
    return None
