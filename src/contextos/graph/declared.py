"""What a workflow's declaration is checked against and known by: the types its nodes take
and give, the JSON schemas of those, and the digest of each function's code (part of the
workflow's identity).

Each check raises ConfigError naming the node when the workflow is declared, not when it runs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
from collections.abc import Callable
from typing import Any, get_args, get_origin, get_type_hints

from pydantic import TypeAdapter, ValidationError

from contextos.errors import ConfigError


def check_list_field(node: str, source: Any, over: str) -> None:
    """ConfigError unless `over` names a field of `source` (a model) that can hold a list."""
    fields = getattr(source, "model_fields", None)
    if fields is None:
        return  # not a model: what it holds is known only when it runs
    if over not in fields:
        raise ConfigError(
            f"node {node!r} maps over {over!r}, but {type_name(source)} has no field of that name; "
            f"its fields: {', '.join(fields) or 'none'}",
            node=node,
        )
    annotation = fields[over].annotation
    if isinstance(annotation, type) and not issubclass(annotation, list | tuple | set | frozenset):
        raise ConfigError(
            f"node {node!r} maps over {type_name(source)}.{over}, a {type_name(annotation)}, not a "
            "list: map over a field that holds the items",
            node=node,
        )


def type_hints_of(fn: Any) -> dict[str, Any]:
    """A function's annotations, resolved; names it closes over count too (a type defined in
    the function that declares the workflow)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    local: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars if code else (), cells, strict=False):
        with contextlib.suppress(ValueError):  # a cell not filled yet
            local[name] = cell.cell_contents
    try:
        return get_type_hints(fn, localns=local)
    except Exception:  # unresolvable annotations only cost the declaration-time check
        return {}


def returns_of(name: str, fn: Callable[..., Any]) -> Any:
    ret = type_hints_of(fn).get("return")
    if ret is None:
        raise ConfigError(
            f"node {name!r}: say what it gives, with a return annotation or output=TYPE",
            node=name,
        )
    origin = get_origin(ret)
    if origin is not None and getattr(origin, "__name__", "") in ("Awaitable", "Coroutine"):
        ret = get_args(ret)[-1]
    return ret


def check_params(name: str, fn: Callable[..., Any], given: list[Any]) -> None:
    """The function must take what the nodes it reads give, in order."""
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return
    if len(params) != len(given):
        raise ConfigError(
            f"node {name!r}: its function takes {len(params)} argument(s), and it reads "
            f"{len(given)} node(s)",
            node=name,
        )
    declared = type_hints_of(fn)
    for p, g in zip(params, given, strict=True):
        wanted = declared.get(p.name)
        if wanted is not None and not accepts(wanted, g):
            raise ConfigError(
                f"node {name!r}: parameter {p.name} takes {type_name(wanted)}, but it is given "
                f"{type_name(g)}",
                node=name,
            )


KEY = "idempotency_key"
"""The keyword-only parameter through which a code node that acts gets its call's key."""


def takes_key(fn: Callable[..., Any]) -> bool:
    """Whether `fn` takes a keyword-only `idempotency_key`."""
    try:
        param = inspect.signature(fn).parameters.get(KEY)
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind is param.KEYWORD_ONLY


def accepts(wanted: Any, given: Any) -> bool:
    if wanted is Any or wanted == given:
        return True
    if isinstance(wanted, type) and isinstance(given, type):
        return issubclass(given, wanted)
    w, g = get_origin(wanted), get_origin(given)
    if w is not None and w is g:
        return all(accepts(a, b) for a, b in zip(get_args(wanted), get_args(given), strict=False))
    return False


def positive(name: str, n: int) -> int:
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"node {name!r}: expected a whole number of at least 1, not {n!r}")
    return n


def type_name(t: Any) -> str:
    return getattr(t, "__name__", None) or str(t).replace("typing.", "")


def schema(t: Any) -> Any:
    try:
        return known_schema(t)
    except TypeError:  # an unhashable type: not kept
        return schema_of(t)


@functools.lru_cache(maxsize=256)
def known_schema(t: Any) -> Any:
    # a type's schema is asked for each time a run starts or resumes, and building it is the
    # bulk of a workflow's identity hash: built once per type
    return schema_of(t)


def schema_of(t: Any) -> Any:
    try:
        return TypeAdapter(t).json_schema()
    except Exception:  # a type without a schema is named instead
        return type_name(t)


def code_of(fn: Any) -> str | None:
    """A function as the identity hash sees it: its qualified name and its source (not its
    module's name, which depends on how the module was imported)."""
    if fn is None:
        return None
    name = str(getattr(fn, "__qualname__", repr(fn)))
    code = getattr(inspect.unwrap(fn), "__code__", fn)  # new closures share their code
    try:
        digest = source_digest(code)
    except TypeError:  # an unhashable callable: not kept
        digest = source_digest.__wrapped__(code)
    return name if digest is None else f"{name}:{digest}"


@functools.lru_cache(maxsize=1024)
def source_digest(code: Any) -> str | None:
    # reading a function's source is the rest of a workflow's identity hash: once per code
    try:
        source = inspect.getsource(code)
    except (OSError, TypeError):  # no source at hand (a builtin, an interactive session)
        return None
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
        for e in exc.errors(include_url=False)
    )
