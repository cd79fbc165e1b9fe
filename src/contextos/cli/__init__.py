"""The `contextos` command: parse, call the public API, print.

Every command takes `--store` (default: $CONTEXTOS_STORE, else ./.contextos/contextos.db);
read commands take `--json` for scripts.
"""

from __future__ import annotations

# Each module adds its commands to `app`; `--help` lists them in this order.
# isort: off
from contextos.cli import runs, people, ops, tokens  # noqa: F401
from contextos.cli import evidence  # noqa: F401

# isort: on
from contextos.cli.common import app

__all__ = ["app", "main"]


def main() -> None:
    app()
