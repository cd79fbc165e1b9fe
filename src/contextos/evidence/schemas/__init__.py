"""The JSON Schemas of the canonical records, generated from their models and kept here.

`python -m contextos.evidence.schemas` rewrites the files after a model changed on purpose; a
test fails while they differ from what the models generate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contextos.evidence.canonical import RECORDS

DIR = Path(__file__).resolve().parent
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def generate() -> dict[str, dict[str, Any]]:
    """Each record's schema, by record name, as its model generates it."""
    return {
        name: {"$schema": DIALECT, **model.model_json_schema()} for name, model in RECORDS.items()
    }


def path(name: str) -> Path:
    """Where the schema of the record `name` is kept."""
    return DIR / f"{name}.schema.json"


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def load(name: str) -> dict[str, Any]:
    """The kept schema of the record `name`."""
    data: dict[str, Any] = json.loads(path(name).read_text())
    return data


def write() -> list[Path]:
    """Rewrite every kept schema from the models; returns the files written."""
    written = []
    for name, schema in generate().items():
        path(name).write_text(render(schema))
        written.append(path(name))
    return written


__all__ = ["DIALECT", "DIR", "generate", "load", "path", "render", "write"]
