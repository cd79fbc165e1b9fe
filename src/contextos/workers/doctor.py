"""`contextos doctor`: is the store reachable and migrated, is the model configured?

Nothing is created or changed: the store is only read, the model is not loaded or called.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from dataclasses import dataclass

from contextos.errors import ContextOSError, MigrationError
from contextos.store import open_store


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthCheck:
    """One line of `contextos doctor`."""

    name: str
    """What was checked."""
    ok: bool
    """Whether it passed."""
    detail: str
    """What was found, or what to do about it."""


async def doctor(store: str | None = None, *, model: str | None = None) -> list[HealthCheck]:
    """Check the store (reachable, schema fully migrated) and the model configuration.

    Nothing is created or changed: the store is only read, the model is not loaded or called.
    `model` defaults to $CONTEXTOS_MODEL, else `local`.
    """
    checks: list[HealthCheck] = []
    url = store
    try:
        opened = open_store(url)
    except ContextOSError as exc:
        return [HealthCheck(name="store", ok=False, detail=exc.message)]
    try:
        verify = getattr(opened, "verify", None)
        path = getattr(opened, "path", None)
        if path is not None and not await asyncio.to_thread(os.path.exists, path):
            checks.append(
                HealthCheck(
                    name="store", ok=True, detail=f"{path} does not exist yet: first use creates it"
                )
            )
            checks.append(HealthCheck(name="migrations", ok=True, detail="applied on first use"))
        elif verify is None:
            checks.append(
                HealthCheck(name="store", ok=True, detail=f"{opened.url} (cannot verify)")
            )
        else:
            try:
                version = await verify()
                checks.append(
                    HealthCheck(name="store", ok=True, detail=f"{_redact(opened.url)} reachable")
                )
                checks.append(
                    HealthCheck(name="migrations", ok=True, detail=f"schema at version {version}")
                )
            except MigrationError as exc:
                checks.append(
                    HealthCheck(name="store", ok=True, detail=f"{_redact(opened.url)} reachable")
                )
                checks.append(
                    HealthCheck(
                        name="migrations",
                        ok=False,
                        detail=exc.message + " (opening the store with this ContextOS migrates it)",
                    )
                )
            except ContextOSError as exc:
                checks.append(HealthCheck(name="store", ok=False, detail=exc.message))
            except Exception as exc:  # sqlite3 / driver errors: the store is not usable
                checks.append(
                    HealthCheck(
                        name="store",
                        ok=False,
                        detail=f"{_redact(opened.url)}: {type(exc).__name__}: {exc}",
                    )
                )
    finally:
        await opened.close()
    checks.append(check_model(model or os.environ.get("CONTEXTOS_MODEL") or "local"))
    return checks


def check_model(spec: str) -> HealthCheck:
    """Whether a model string names a provider that is installed and configured."""
    provider, _, rest = spec.partition(":")
    needs: dict[str, tuple[str | None, str | None]] = {
        # provider: (python module it needs, environment variable it needs)
        "local": ("llama_cpp", None),
        "openai": ("httpx", "OPENAI_API_KEY"),
        "openai-compatible": ("httpx", None),
        "anthropic": ("httpx", "ANTHROPIC_API_KEY"),
    }
    if provider not in needs or (provider != "local" and not rest):
        return HealthCheck(
            name="model",
            ok=False,
            detail=f"unknown model {spec!r}: use local, openai:MODEL, "
            "openai-compatible:URL#MODEL or anthropic:MODEL",
        )
    module, env = needs[provider]
    if module is not None and importlib.util.find_spec(module) is None:
        extra = " (pip install 'contextos[local]')" if provider == "local" else ""
        return HealthCheck(
            name="model", ok=False, detail=f"{spec}: {module} is not installed{extra}"
        )
    if env is not None and not os.environ.get(env):
        return HealthCheck(name="model", ok=False, detail=f"{spec}: {env} is not set")
    return HealthCheck(name="model", ok=True, detail=spec)


def _redact(url: str) -> str:
    if url.startswith(("postgresql://", "postgres://")):
        from contextos.store.postgres import redact

        return redact(url)
    return url
