"""Model adapters, and choosing one from a string.

Strings: `"local"` (embedded llama.cpp model), `"openai:MODEL"` (api.openai.com, key from
OPENAI_API_KEY), `"openai-compatible:BASE_URL#MODEL"` (any OpenAI-compatible server),
`"anthropic:MODEL"` (key from ANTHROPIC_API_KEY).
"""

from __future__ import annotations

from contextos.errors import ConfigError
from contextos.models.base import ModelAdapter, ModelRequest, ModelResponse
from contextos.models.scripted import ScriptedModel, call_tool, call_tools, reply


def resolve_model(spec: str | ModelAdapter) -> ModelAdapter:
    """Turn a model string into an adapter; adapters pass through."""
    if not isinstance(spec, str):
        return spec
    provider, _, rest = spec.partition(":")
    if provider == "local":
        from contextos.models.local import LocalModel

        return LocalModel(rest or None)
    if provider == "openai" and rest:
        from contextos.models.openai import OpenAIModel

        return OpenAIModel(model=rest)
    if provider == "openai-compatible" and rest:
        from contextos.models.openai import OpenAIModel

        base_url, _, model = rest.partition("#")
        return OpenAIModel(
            model=model or "default", base_url=base_url, provider="openai-compatible"
        )
    if provider == "anthropic" and rest:
        from contextos.models.anthropic import AnthropicModel

        return AnthropicModel(model=rest)
    raise ConfigError(
        f"unknown model {spec!r}: use 'local', 'openai:MODEL', "
        "'openai-compatible:http://host:port/v1#MODEL' or 'anthropic:MODEL'",
        model=spec,
    )


__all__ = [
    "ModelAdapter",
    "ModelRequest",
    "ModelResponse",
    "ScriptedModel",
    "call_tool",
    "call_tools",
    "reply",
    "resolve_model",
]
