"""How long an interrupt waits for a person, and what happens when nobody answers in time.

`Expiry` is what a policy rule, an asking tool or a runtime declares; `Deadline` is what a
raised interrupt carries in its payload (`expiry`): an absolute time, fixed when it was raised,
so a later change of configuration never moves the deadline of a question already asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from contextos.errors import PolicyLoadError
from contextos.numbers import seconds

OnExpiry = Literal["deny", "fail", "default"]
"""deny: the action is refused and the run goes on; fail: the run ends `expired`; default: the
declared default answer is given (questions and choices only)."""

ON_EXPIRY: tuple[OnExpiry, ...] = ("deny", "fail", "default")


def on_expiry(value: str, *, where: str, allow_default: bool = True) -> OnExpiry:
    """Check a declared `on_expiry` (PolicyLoadError names `where` otherwise)."""
    allowed = ON_EXPIRY if allow_default else ("deny", "fail")
    if value not in allowed:
        raise PolicyLoadError(
            f"{where}: on_expiry must be one of {', '.join(allowed)}, not {value!r}"
        )
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class Expiry:
    """How long an interrupt may wait, and what is done when nobody answers by then."""

    after_s: float
    """Seconds from the moment the interrupt is raised."""
    on_expiry: OnExpiry = "deny"
    """What happens then: deny, fail or default."""
    default: Any = None
    """For `default`: the answer given (a word, or a JSON object matching the answer schema)."""

    def __post_init__(self) -> None:
        seconds(self.after_s, what="an interrupt's expiry (after_s)", error=PolicyLoadError)
        on_expiry(self.on_expiry, where="expiry")
        if self.on_expiry == "default" and self.default is None:
            raise PolicyLoadError("on_expiry='default' needs the default answer (`default=`)")

    def deadline(
        self, now: datetime, *, set_by: str, default: dict[str, Any] | None = None, note: str = ""
    ) -> Deadline:
        """The deadline of an interrupt raised at `now`."""
        return Deadline(
            expires_at=now + timedelta(seconds=self.after_s),
            on_expiry=self.on_expiry,
            default=default,
            set_by=set_by,
            note=note,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Deadline:
    """A raised interrupt's deadline, as its payload records it."""

    expires_at: datetime
    """When it stops waiting (UTC)."""
    on_expiry: OnExpiry
    """What happens then."""
    default: dict[str, Any] | None = None
    """For `default`: the validated answer given."""
    set_by: str = ""
    """What declared it: `rule:<id>`, `tool:<name>`, `policy`, `runtime`."""
    note: str = ""
    """Why the declared outcome was changed when the interrupt was raised, if it was."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "expires_at": self.expires_at.isoformat(),
            "on_expiry": self.on_expiry,
            "default": self.default,
            "set_by": self.set_by,
            "note": self.note,
        }

    @classmethod
    def of(cls, payload: dict[str, Any]) -> Deadline | None:
        """The deadline an interrupt's payload carries (None: it waits until answered)."""
        data = payload.get("expiry")
        if not isinstance(data, dict) or not data.get("expires_at"):
            return None
        default = data.get("default")
        return cls(
            expires_at=datetime.fromisoformat(str(data["expires_at"])),
            on_expiry=on_expiry(str(data.get("on_expiry", "deny")), where="interrupt"),
            default=dict(default) if isinstance(default, dict) else None,
            set_by=str(data.get("set_by", "")),
            note=str(data.get("note", "")),
        )

    def outcome(self) -> str:
        """What happens (or happened) at the deadline, in words."""
        if self.on_expiry == "fail":
            return "the run ends expired"
        if self.on_expiry == "default":
            return f"the declared default answer {_json(self.default)} is given"
        return "the action is refused and the run goes on without it"


def _json(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


__all__ = ["ON_EXPIRY", "Deadline", "Expiry", "OnExpiry", "on_expiry"]
