"""Prices, cost, token estimates, model strings and secrets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contextos.errors import ConfigError
from contextos.messages import Message
from contextos.models import resolve_model
from contextos.models._http import Secret, scrub
from contextos.models.anthropic import AnthropicModel
from contextos.models.local import LocalModel
from contextos.models.openai import OpenAIModel
from contextos.models.pricing import (
    FREE,
    Price,
    cost_usd,
    estimate_prompt_tokens,
    estimate_tokens,
    price_for,
    set_price,
)


@pytest.fixture
def clean_overrides() -> Iterator[None]:
    yield
    for name in ("openai:gpt-4.1-mini", "openai-compatible:my-model", "local"):
        set_price(name, None)


def test_dated_snapshots_use_the_longest_priced_prefix() -> None:
    assert price_for("openai:gpt-4.1-mini-2025-04-14") == price_for("openai:gpt-4.1-mini")
    assert price_for("openai:gpt-4.1-2025-04-14") == price_for("openai:gpt-4.1")
    assert price_for("anthropic:claude-sonnet-4-5-20250929") == price_for(
        "anthropic:claude-sonnet-4-5"
    )
    assert price_for("openai:gpt-4.1x") is None  # a priced prefix must end at a dash
    assert price_for("openai-compatible:my-model") is None


def test_the_local_model_is_free_unless_priced(clean_overrides: None) -> None:
    assert price_for("local") == FREE
    assert price_for("local:/models/x.gguf") == FREE
    set_price("local", Price(input_per_mtok=1, output_per_mtok=1))
    assert price_for("local") == Price(input_per_mtok=1, output_per_mtok=1)


def test_overrides_beat_the_table_and_can_be_removed(clean_overrides: None) -> None:
    default = price_for("openai:gpt-4.1-mini")
    mine = Price(input_per_mtok=9.0, output_per_mtok=99.0)
    set_price("openai:gpt-4.1-mini", mine)
    assert price_for("openai:gpt-4.1-mini-2025-04-14") == mine
    assert cost_usd("openai:gpt-4.1-mini", 1_000_000, 1_000_000) == pytest.approx(108.0)
    set_price("openai:gpt-4.1-mini", None)
    assert price_for("openai:gpt-4.1-mini") == default
    set_price("openai-compatible:my-model", mine)
    assert cost_usd("openai-compatible:my-model", 500_000, 0) == pytest.approx(4.5)


def test_cost_of_cached_tokens_and_unknown_models() -> None:
    p = Price(input_per_mtok=3.0, output_per_mtok=15.0, cache_read_per_mtok=0.3)
    assert p.cost(1_000_000, 0, cache_read_tokens=1_000_000, cache_write_tokens=1_000_000) == (
        pytest.approx(3.0 + 0.3 + 3.0)
    )
    assert cost_usd("nobody:knows", 10**6, 10**6) == 0.0


def test_estimates_grow_with_text_and_tools() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("a" * 400) == 100
    short = estimate_prompt_tokens([Message(role="user", content="hi")])
    longer = estimate_prompt_tokens([Message(role="user", content="hi " * 100)])
    assert 0 < short < longer


def test_model_strings() -> None:
    assert isinstance(resolve_model("local"), LocalModel)
    openai = resolve_model("openai:gpt-4.1-mini")
    assert isinstance(openai, OpenAIModel) and openai.name == "openai:gpt-4.1-mini"
    assert openai.base_url == "https://api.openai.com/v1"
    compat = resolve_model("openai-compatible:http://127.0.0.1:8080/v1#qwen")
    assert isinstance(compat, OpenAIModel)
    assert (compat.name, compat.base_url) == ("openai-compatible:qwen", "http://127.0.0.1:8080/v1")
    assert isinstance(resolve_model("anthropic:claude-haiku-4-5"), AnthropicModel)
    with pytest.raises(ConfigError, match="unknown model"):
        resolve_model("gemini:pro")


def test_secrets_never_print() -> None:
    s = Secret("sk-live-abcdef123456")
    assert "abcdef" not in repr(s) and "abcdef" not in str(s) and "abcdef" not in f"{s}"
    assert s.reveal() == "sk-live-abcdef123456"
    assert scrub("bad key sk-live-abcdef123456 given", s) == "bad key *** given"
    assert "zzz" not in scrub("header had sk-proj-zzzzzzzzzzzzzz")


@pytest.mark.parametrize("rate", [-1.0, float("nan"), float("inf")])
def test_a_price_that_would_turn_spending_into_credit_is_refused(rate: float) -> None:
    with pytest.raises(ConfigError, match="finite and not negative"):
        Price(input_per_mtok=1.0, output_per_mtok=rate)
    with pytest.raises(ConfigError, match="finite and not negative"):
        Price(input_per_mtok=1.0, output_per_mtok=1.0, cache_read_per_mtok=rate)
