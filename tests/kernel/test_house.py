"""The house keeps its shape: imports run down the layers of DESIGN.md §5, never in a circle,
and the error tree drawn in errors.py is the tree of classes.

Every import counts, wherever it stands (inside a function, under TYPE_CHECKING): each is a
dependency a reader has to follow.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import contextos
from contextos import errors

SRC = Path(contextos.__file__).resolve().parent
PACKAGE = "contextos"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli", "api", "jobs", "__main__"),
    ("contextos", "workers:face", "testing"),
    ("improve",),
    ("runtime", "starting", "ownership", "hosting", "workers", "releases", "steering", "results"),
    ("graph", "loop", "agents", "verify", "evidence", "control"),
    ("middleware",),
    ("context",),
    ("tools",),
    ("policy", "telemetry", "models"),
    ("store",),
    ("state", "causality"),
    ("records",),
    ("events", "codec", "graph_events", "evidence_events", "event_base"),
    ("errors", "runs", "messages", "ledger", "delegation", "numbers", "untrusted", "prefilter"),
)
"""The rooms from the top down: the faces; the public API (`contextos` and the face of
`contextos.workers`); the improvement loop (it drives runs, replays and releases); the harness;
the loop and the graph; the rooms that do the work (policy decides, tools act, context and
middleware shape what the model sees; a model proposes and never persists or acts); the store;
the fold and the core records. A room may import its own layer
and the layers below it, never one above."""

CLIMBS_ALLOWED: dict[tuple[str, str], str] = {}
"""Known arrows that climb, each with the reason it is still there. Adding one is a decision."""


def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join((PACKAGE, *parts)).removesuffix(".__init__")
        out[name] = path
    return out


def imports(source: str, name: str, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """The project's modules that module `name` (of this source) imports, with their lines."""
    package = known.get(name, Path()).name == "__init__.py"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if package else name.split(".")[:-1]
                base = ".".join([*here[: len(here) - node.level + 1], *filter(None, [base])])
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"  # `from contextos import events` names a module
                yield (sub if sub in known else base), node.lineno


def room(module: str) -> str:
    parts = module.split(".")
    if module == f"{PACKAGE}.workers":
        return "workers:face"
    return parts[1] if len(parts) > 1 else PACKAGE


def layer(module: str) -> int:
    for i, rooms in enumerate(LAYERS):
        if room(module) in rooms:
            return i
    raise AssertionError(f"{module} is in no layer: give its room a place in LAYERS")


def graph() -> dict[str, dict[str, int]]:
    known = modules()
    return {
        name: {
            target: line
            for target, line in imports(path.read_text(), name, known)
            if target != name
        }
        for name, path in known.items()
    }


def test_every_room_has_a_place_in_the_layers() -> None:
    for module in modules():
        layer(module)


def test_no_import_climbs_a_layer() -> None:
    climbs = [
        f"{a} -> {b} (line {line})"
        for a, targets in graph().items()
        for b, line in targets.items()
        if layer(b) < layer(a) and (a, b) not in CLIMBS_ALLOWED
    ]
    assert climbs == [], "imports that climb:\n" + "\n".join(climbs)


def test_the_allowed_climbs_still_exist() -> None:
    """A climb that went away is struck from the list, so the list stays the truth."""
    edges = graph()
    for a, b in CLIMBS_ALLOWED:
        assert b in edges[a], f"{a} no longer imports {b}: remove it from CLIMBS_ALLOWED"


def test_no_modules_import_each_other_in_a_circle() -> None:
    edges = {a: set(targets) for a, targets in graph().items()}
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert circles == [], "\n".join(" -> ".join(c) for c in circles)


def test_the_walk_sees_what_the_rules_forbid() -> None:
    """The rules above would pass on a walk that saw nothing."""
    known = {"contextos.events": SRC / "events.py", "contextos.cli": SRC / "cli"}
    source = "from contextos import cli\n\ndef f():\n    from contextos.store import x\n"
    assert dict(imports(source, "contextos.events", known)) == {
        "contextos.cli": 1,
        "contextos.store": 4,
    }
    assert layer("contextos.cli") < layer("contextos.events")


# -- the error tree --------------------------------------------------------------------------

_ITEM = re.compile(r"(?P<lead>(?:│   |    |├── |└── )*)(?P<name>[A-Z]\w*)(?: \((?P<parent>\w+)\))?")


def drawn_tree(doc: str) -> dict[str, str]:
    """Each error a drawing names -> the class it is drawn under (`Name (Parent)` at the left
    edge names its parent; an error at the left edge with none derives from Exception)."""
    block = doc.split("\n\n")[1]  # the drawing: the paragraph after the summary line
    parents: dict[str, str] = {}
    path: list[str] = []
    for line in block.splitlines():
        m = _ITEM.match(line.strip("\n").removeprefix("    "))
        assert m is not None, f"not a line of the tree: {line!r}"
        depth = len(m.group("lead")) // 4
        del path[depth:]
        parent = m.group("parent") or (path[-1] if path else "Exception")
        parents[m.group("name")] = parent
        path.append(m.group("name"))
    return parents


def test_the_error_tree_drawn_in_errors_py_is_the_tree_of_classes() -> None:
    classes = {
        name: cls.__base__.__name__
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, errors.ContextOSError)
    }
    assert drawn_tree(errors.__doc__ or "") == classes


def test_the_drawing_is_read_as_a_tree() -> None:
    doc = "Summary.\n\n    A\n    ├── B\n    │   └── C\n    └── D\n    E (A)\n    └── F\n\nProse."
    assert drawn_tree(doc) == {
        "A": "Exception",
        "B": "A",
        "C": "B",
        "D": "A",
        "E": "A",
        "F": "E",
    }
