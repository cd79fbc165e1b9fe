"""What a model call costs: a price table per model, overridable, and token estimates.

Prices are US dollars per million tokens, list prices as published by each provider when this
table was last edited. Providers change them: override with `set_price(...)` (process-wide) or
the `price=` argument of an adapter, which always wins.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contextos.errors import ConfigError
from contextos.messages import Message, ToolSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Price:
    """What one model charges, in US dollars per million tokens."""

    input_per_mtok: float
    """Uncached prompt tokens."""
    output_per_mtok: float
    """Generated tokens."""
    cache_read_per_mtok: float | None = None
    """Prompt tokens read from the provider's prompt cache (None: billed as input)."""
    cache_write_per_mtok: float | None = None
    """Prompt tokens written to the provider's prompt cache (None: billed as input)."""

    def __post_init__(self) -> None:
        rates = (
            self.input_per_mtok,
            self.output_per_mtok,
            self.cache_read_per_mtok,
            self.cache_write_per_mtok,
        )
        if not all(r is None or (math.isfinite(r) and r >= 0) for r in rates):
            # A negative price would turn spending into credit and switch budgets off.
            raise ConfigError(f"prices must be finite and not negative: {self}")

    def cost(
        self,
        input_tokens: int,
        output_tokens: int,
        *,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> float:
        """Dollars for one call; `input_tokens` excludes the cached ones given separately."""
        read = self.input_per_mtok if self.cache_read_per_mtok is None else self.cache_read_per_mtok
        write = (
            self.input_per_mtok if self.cache_write_per_mtok is None else self.cache_write_per_mtok
        )
        return (
            input_tokens * self.input_per_mtok
            + output_tokens * self.output_per_mtok
            + cache_read_tokens * read
            + cache_write_tokens * write
        ) / 1_000_000


FREE = Price(input_per_mtok=0.0, output_per_mtok=0.0)
"""The embedded model runs on your own CPU."""


def _p(inp: float, out: float, *, read: float | None = None, write: float | None = None) -> Price:
    return Price(
        input_per_mtok=inp,
        output_per_mtok=out,
        cache_read_per_mtok=read,
        cache_write_per_mtok=write,
    )


# Keys are adapter names (`provider:model`). A dated snapshot such as
# `anthropic:claude-sonnet-4-5-20250929` falls back to the longest key it starts with.
DEFAULT_PRICES: Mapping[str, Price] = {
    "openai:gpt-5": _p(1.25, 10.0, read=0.125),
    "openai:gpt-5-mini": _p(0.25, 2.0, read=0.025),
    "openai:gpt-5-nano": _p(0.05, 0.40, read=0.005),
    "openai:gpt-4.1": _p(2.0, 8.0, read=0.50),
    "openai:gpt-4.1-mini": _p(0.40, 1.60, read=0.10),
    "openai:gpt-4.1-nano": _p(0.10, 0.40, read=0.025),
    "openai:gpt-4o": _p(2.50, 10.0, read=1.25),
    "openai:gpt-4o-mini": _p(0.15, 0.60, read=0.075),
    "openai:o3": _p(2.0, 8.0, read=0.50),
    "openai:o4-mini": _p(1.10, 4.40, read=0.275),
    "anthropic:claude-opus-4-5": _p(5.0, 25.0, read=0.50, write=6.25),
    "anthropic:claude-opus-4-1": _p(15.0, 75.0, read=1.50, write=18.75),
    "anthropic:claude-opus-4": _p(15.0, 75.0, read=1.50, write=18.75),
    "anthropic:claude-sonnet-4-5": _p(3.0, 15.0, read=0.30, write=3.75),
    "anthropic:claude-sonnet-4": _p(3.0, 15.0, read=0.30, write=3.75),
    "anthropic:claude-3-7-sonnet": _p(3.0, 15.0, read=0.30, write=3.75),
    "anthropic:claude-haiku-4-5": _p(1.0, 5.0, read=0.10, write=1.25),
    "anthropic:claude-3-5-haiku": _p(0.80, 4.0, read=0.08, write=1.0),
}

_overrides: dict[str, Price] = {}
_lock = threading.Lock()


def set_price(model: str, price: Price | None) -> None:
    """Set (or with None, remove) the price of `model` for this process; beats the defaults."""
    with _lock:
        if price is None:
            _overrides.pop(model, None)
        else:
            _overrides[model] = price


def price_for(model: str) -> Price | None:
    """The price of an adapter name (`provider:model`), or None when nobody priced it."""
    with _lock:
        table = {**DEFAULT_PRICES, **_overrides}
    if model not in table and (model == "local" or model.startswith("local:")):
        return FREE
    if model in table:
        return table[model]
    # Longest key that the name extends at a dash: a dated snapshot of a priced model.
    best = max(
        (k for k in table if model.startswith(k) and model[len(k)] == "-"),
        key=len,
        default=None,
    )
    return table[best] if best is not None else None


def cost_usd(
    model: str,
    input_tokens: int,
    output_tokens: int,
    *,
    price: Price | None = None,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
) -> float:
    """Dollars for one call, 0.0 when the model has no known price."""
    p = price if price is not None else price_for(model)
    if p is None:
        return 0.0
    return p.cost(
        input_tokens,
        output_tokens,
        cache_read_tokens=cache_read_tokens,
        cache_write_tokens=cache_write_tokens,
    )


# Roughly four characters per token for English text and JSON across today's tokenizers;
# only used when a provider does not report usage, so budgets still move.
_CHARS_PER_TOKEN = 4
_PER_MESSAGE_TOKENS = 4


def estimate_tokens(text: str) -> int:
    """A provider-independent guess at the tokens in `text`."""
    return math.ceil(len(text) / _CHARS_PER_TOKEN) if text else 0


def estimate_prompt_tokens(messages: Iterable[Message], tools: Iterable[ToolSpec] = ()) -> int:
    """A guess at the prompt tokens of a request: message texts, calls and tool schemas."""
    total = 0
    for m in messages:
        total += _PER_MESSAGE_TOKENS + estimate_tokens(m.content)
        for c in m.tool_calls:
            total += estimate_tokens(c.name) + estimate_tokens(c.arguments)
    for t in tools:
        total += estimate_tokens(t.name) + estimate_tokens(t.description)
        total += estimate_tokens(str(t.parameters))
    return total
