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
    return os.environ.get("CONTEXTOS_STORE") or f"sqlite:{DEFAULT_STORE_PATH}"


STORE_URLS = (
    "sqlite:///abs/path.db (absolute), sqlite:rel/path.db or a plain file path (relative), "
    "or postgresql://…"
)
"""The store URL forms, as errors name them."""


def store_path(url: str) -> Path | None:
    """The SQLite file a store URL names, or None for a PostgreSQL URL; ConfigError when the
    URL is malformed.

    `sqlite:///abs/path.db` (three slashes, as in `file:///`) is absolute; `sqlite:rel.db` and
    a plain path are relative to the working directory.
    """
    if url.startswith(("postgresql://", "postgres://")):
        return None
    if url.startswith("sqlite:"):
        rest = url.removeprefix("sqlite:")
        if rest.startswith("//"):
            if not rest.startswith("///"):  # sqlite://host/…: a file has no host
                raise ConfigError(f"malformed store URL {url!r}: use {STORE_URLS}", url=url)
            rest = "/" + rest.lstrip("/")  # sqlite:////abs (four slashes) names it too
        path = rest
    elif "://" in url:
        raise ConfigError(f"unknown store URL {url!r}: use {STORE_URLS}", url=url)
    else:
        path = url
    if not path.strip() or path.endswith("/"):
        raise ConfigError(f"store URL {url!r} names no file: use {STORE_URLS}", url=url)
    return Path(path)


def open_store(url: str | None = None, *, create: bool = True) -> EventStore:
    """Open the store a URL names (see `store_path`), or `CONTEXTOS_STORE`, or the default.

    With `create=False` (commands that only read) a store that does not exist is not made:
    its first use raises StoreNotFound.
    """
    url = url or default_store_url()
    path = store_path(url)
    if path is None:
        try:
            from contextos.store.postgres import PostgresStore
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError(
                "PostgreSQL store needs psycopg: pip install 'contextos[postgres]'", url=url
            ) from exc
        return PostgresStore(url, create=create)
    return SqliteStore(path, create=create)


__all__ = [
    "DEFAULT_STORE_PATH",
    "EventStore",
    "RunSummary",
    "STORE_URLS",
    "SqliteStore",
    "default_store_url",
    "open_store",
    "store_path",
]
