"""The platform stack every agent runs under: its guard layers are on unless opted out by name.

An agent lists the layers it configures itself; the budget gate, PII redaction and the
untrusted-output sanitizer it does not list are added at their slots with their defaults. A
layer is left out only when the agent names it in `opt_out` with a reason, and the reason is
recorded with every model call the run makes, so an unguarded run is visible as such.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from contextos.errors import ConfigError
from contextos.middleware.base import Middleware, slot_of
from contextos.middleware.budget import BudgetGate
from contextos.middleware.pii import PiiRedaction
from contextos.middleware.sanitize import Sanitizer

DEFAULT_LAYERS: dict[str, Callable[[], Middleware]] = {
    "budget": BudgetGate,
    "pii": PiiRedaction,
    "sanitize": Sanitizer,
}
"""The layers on by default, by name, and how each is built when the agent does not list it."""


def check_opt_out(layers: Sequence[Middleware], opt_out: Mapping[str, str]) -> None:
    """Refuse an opt-out that names no default layer, gives no reason, or contradicts the list."""
    listed = {m.name for m in layers}
    for name, reason in opt_out.items():
        if name not in DEFAULT_LAYERS:
            raise ConfigError(
                f"cannot opt out of {name!r}: only the default platform layers "
                f"({', '.join(DEFAULT_LAYERS)}) are on by default",
                layer=name,
            )
        if not str(reason).strip():
            raise ConfigError(
                f"opting out of {name!r} needs a reason (it is recorded with every model call)",
                layer=name,
            )
        if name in listed:
            raise ConfigError(
                f"{name!r} is both listed in the middleware and opted out; keep one", layer=name
            )


def platform_stack(
    layers: Sequence[Middleware], opt_out: Mapping[str, str] = {}
) -> tuple[Middleware, ...]:
    """The agent's layers with every default platform layer it neither lists nor opts out of."""
    listed = {m.name for m in layers}
    added = [make() for name, make in DEFAULT_LAYERS.items() if name not in listed | set(opt_out)]
    # Platform slots are unique and increasing; domain layers (no slot) keep their place after.
    platform = sorted(
        [*added, *(m for m in layers if slot_of(m) is not None)],
        key=lambda m: slot_of(m) or 0,
    )
    return (*platform, *(m for m in layers if slot_of(m) is None))
