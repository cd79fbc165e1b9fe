"""The sample knowledge base and its manifest of planted faults, for the scan's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contextos.jobs.kb import Finding, Fixture, LinkVerifier

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kb"


def manifest() -> list[dict[str, Any]]:
    faults: list[dict[str, Any]] = json.loads((SAMPLE / "FAULTS.json").read_text())["faults"]
    return faults


def key(f: Finding) -> tuple[str, str, int | None, str | None, bool]:
    """What the manifest says of a fault: kind, page, line, target, unsure."""
    return (f.kind.value, f.path, f.line, f.target, f.unsure)


def planted() -> set[tuple[str, str, int | None, str | None, bool]]:
    return {
        (f["kind"], f["path"], f["line"], f["target"], f.get("unsure", False)) for f in manifest()
    }


def verifier_for(root: Path, site: Fixture, **options: Any) -> LinkVerifier:
    """A verifier that reaches the loopback site and nothing else."""
    return LinkVerifier(
        root, network=site.network, resolver=site.resolver, aliases=site.aliases, **options
    )


def soft_404s() -> dict[str, tuple[str, ...]]:
    """The manifest's links that work but lead nowhere useful: URL, the pages linking to it."""
    listed: list[dict[str, Any]] = json.loads((SAMPLE / "FAULTS.json").read_text())["soft_404"]
    return {s["url"]: tuple(s["pages"]) for s in listed}
