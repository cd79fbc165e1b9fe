"""Numbers from outside (a model's arguments, a policy file, a person's answer), made exact.

Policy compares numbers as exact decimals and refuses anything that is not a finite number, so
neither NaN, an infinity nor float rounding can decide whether a rule applies.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from contextos.errors import ContextOSError

_LITERAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

MAX_SECONDS = 100 * 365 * 24 * 3600
"""The longest duration a person may give anywhere (a century): longer than any wait should
last, well inside what a timestamp can hold."""


def is_number(value: Any) -> bool:
    """An int, float or Decimal (a bool is not a number here)."""
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    """A whole number, 0 or more (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def exact(value: Any) -> Decimal | None:
    """The exact decimal a value stands for, or None when it is not a finite number.

    A float counts as the shortest decimal that reads back as it (0.1 is 0.1, as written in the
    JSON it came from); a string counts when it is a plain decimal literal (`5000`, `-12.50`,
    `1e3`), which is how a Decimal argument reads once validated into JSON.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return value if value.is_finite() else None
    if isinstance(value, str) and _LITERAL.fullmatch(value):
        return Decimal(value)
    return None


def finite(value: Any) -> bool:
    """False for a float or Decimal that is NaN or infinite; True for anything else."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Decimal):
        return value.is_finite()
    return True


def seconds(value: Any, *, what: str, error: type[ContextOSError], **fields: Any) -> float:
    """A duration a person gave, in seconds: a finite number above 0 and at most a century.

    Anything else raises `error` (with `fields`) saying what `what` must be.
    """
    amount = exact(value) if is_number(value) else None
    if amount is None or not 0 < amount <= MAX_SECONDS:
        raise error(
            f"{what} must be in the future: a number of seconds above 0 and at most "
            f"{MAX_SECONDS} (a century), not {value!r}",
            **fields,
        )
    return float(amount)
