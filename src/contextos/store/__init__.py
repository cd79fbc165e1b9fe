"""Event stores: the protocol, the embedded SQLite backend, and opening one from a URL."""

from __future__ import annotations

import os
from pathlib import Path

from contextos.errors import ConfigError
from contextos.store.base import EventStore, RunSummary
from contextos.store.sqlite import SqliteStore

DEFAULT_STORE_PATH = Path(".contextos") / "contextos.db"


def default_store_url() -> str:
    """`CONTEXTOS_STORE` if set, else a SQLite file under ./.contextos/."""
    return os.environ.get("CONTEXTOS_STORE") or f"sqlite:///{DEFAULT_STORE_PATH}"


def open_store(url: str | None = None) -> EventStore:
    """Open the store a URL names: `sqlite:///path`, a plain file path, or `postgresql://…`."""
    url = url or default_store_url()
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from contextos.store.postgres import PostgresStore
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError(
                "PostgreSQL store needs psycopg: pip install 'contextos[postgres]'", url=url
            ) from exc
        return PostgresStore(url)
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
    elif "://" in url:
        raise ConfigError(
            f"unknown store URL {url!r}: use sqlite:///path/to/file.db or postgresql://…",
            url=url,
        )
    else:
        path = url
    if not path:
        raise ConfigError(f"store URL {url!r} has no file path", url=url)
    return SqliteStore(path)


__all__ = [
    "DEFAULT_STORE_PATH",
    "EventStore",
    "RunSummary",
    "SqliteStore",
    "default_store_url",
    "open_store",
]
