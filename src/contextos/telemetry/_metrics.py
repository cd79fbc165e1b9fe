"""GenAI client metrics from a run's model calls: token usage, operation duration and cost.

`gen_ai.client.token.usage` (one measurement per token type) and
`gen_ai.client.operation.duration` follow the GenAI semantic conventions; the money a call cost
(from the pricing table) goes to `contextos.client.cost` in USD. Every measurement carries the
operation, provider and model, so a dashboard can split them the usual way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import MeterProvider
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

from contextos import events as ev

SCOPE = "contextos"
COST = "contextos.client.cost"


class Metrics:
    """The instruments of one meter provider."""

    def __init__(self, provider: MeterProvider) -> None:
        meter = provider.get_meter(SCOPE)
        self.tokens = gen_ai_metrics.create_gen_ai_client_token_usage(meter)
        self.duration = gen_ai_metrics.create_gen_ai_client_operation_duration(meter)
        self.cost = meter.create_histogram(
            COST, unit="USD", description="What a model call cost, from the pricing table."
        )

    def record(self, events: Iterable[ev.Event]) -> int:
        """Record every model call among `events`; returns how many there were."""
        calls = 0
        for e in events:
            if not isinstance(e, ev.ModelResponded):
                continue
            calls += 1
            provider, _, name = e.model.partition(":")
            attrs: dict[str, Any] = {
                gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.CHAT.value,
                gen_ai.GEN_AI_PROVIDER_NAME: provider,
                gen_ai.GEN_AI_REQUEST_MODEL: name or provider,
                gen_ai.GEN_AI_RESPONSE_MODEL: name or provider,
            }
            for kind, count in (
                (gen_ai.GenAiTokenTypeValues.INPUT.value, e.usage.input_tokens),
                (gen_ai.GenAiTokenTypeValues.COMPLETION.value, e.usage.output_tokens),
            ):
                self.tokens.record(count, {**attrs, gen_ai.GEN_AI_TOKEN_TYPE: kind})
            self.duration.record(e.latency_ms / 1000, attrs)
            self.cost.record(e.usage.cost_usd, attrs)
        return calls


__all__ = ["COST", "Metrics"]
