"""Model adapters, and choosing one from a string.

Strings: `"local"` (embedded llama.cpp model), `"openai:MODEL"` (api.openai.com, key from
OPENAI_API_KEY), `"openai-compatible:BASE_URL#MODEL"` (any OpenAI-compatible server),
`"anthropic:MODEL"` (key from ANTHROPIC_API_KEY).
"""

from __future__ import annotations

from contextos.errors import ConfigError
from contextos.models.anthropic import AnthropicModel
from contextos.models.base import (
    ModelAdapter,
    ModelRequest,
    ModelResponse,
    StreamingModelAdapter,
)
from contextos.models.local import LocalModel
from contextos.models.openai import OpenAIModel
from contextos.models.pricing import Price, set_price
from contextos.models.scripted import ScriptedModel, call_tool, call_tools, reply


def resolve_model(spec: str | ModelAdapter) -> ModelAdapter:
    """Turn a model string into an adapter; adapters pass through."""
    if not isinstance(spec, str):
        return spec
    provider, _, rest = spec.partition(":")
    if provider == "local":
        return LocalModel(rest or None)
    if provider == "openai" and rest:
        return OpenAIModel(model=rest)
    if provider == "openai-compatible" and rest:
        base_url, _, model = rest.partition("#")
        return OpenAIModel(
            model=model or "default", base_url=base_url, provider="openai-compatible"
        )
    if provider == "anthropic" and rest:
        return AnthropicModel(model=rest)
    raise ConfigError(
        f"unknown model {spec!r}: use 'local', 'openai:MODEL', "
        "'openai-compatible:http://host:port/v1#MODEL' or 'anthropic:MODEL'",
        model=spec,
    )


__all__ = [
    "AnthropicModel",
    "LocalModel",
    "ModelAdapter",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "Price",
    "ScriptedModel",
    "StreamingModelAdapter",
    "call_tool",
    "call_tools",
    "reply",
    "resolve_model",
    "set_price",
]
