"""Shared fixtures."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

# -- PostgreSQL store fixtures -------------------------------------------------------------
# A real server named by CONTEXTOS_TEST_POSTGRES (start one with scripts/pg-test-server).
# Without it the PostgreSQL tests skip locally, and fail when CI is set.

POSTGRES_ENV = "CONTEXTOS_TEST_POSTGRES"


def _missing_postgres(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run the PostgreSQL tests (see scripts/pg-test-server)")
    pytest.skip(f"{why} (start a server with scripts/pg-test-server)")


def postgres_schema_url(server_url: str, schema: str) -> str:
    """The server URL with `search_path` set to `schema`: the store's tables go there."""
    sep = "&" if "?" in server_url else "?"
    return f"{server_url}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The test server's URL."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        _missing_postgres(f"{POSTGRES_ENV} is not set")
    try:
        import psycopg
    except ImportError:
        _missing_postgres("psycopg is not installed (pip install -e '.[postgres]')")
    assert url is not None
    try:
        with psycopg.connect(url, connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        _missing_postgres(f"cannot reach {POSTGRES_ENV}: {exc}")
    return url


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A store URL on a fresh schema of the test server, dropped after the test."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
    try:
        yield postgres_schema_url(postgres_server, schema)
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgres"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL, once per backend: a SQLite file, then a PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url
