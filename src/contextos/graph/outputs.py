"""What nodes that take in many results give: a gate's verdicts, a map's collected results.

Plain Pydantic models, so they travel on typed edges and are validated like any output.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741


class ClaimCheck(BaseModel):
    """A verifier's verdict on one claim, after trying to disprove it."""

    holds: bool
    """True when the claim survived every attempt to disprove it."""
    reason: str = ""
    """Why: the evidence that disproves it, or what was checked."""


class Rejected(BaseModel, Generic[T]):
    """An item a gate rejected, and why."""

    item: T
    reason: str = ""


class Gated(BaseModel, Generic[T]):
    """What a gate gives: the items whose claim held, and those it rejected."""

    passed: list[T] = []
    rejected: list[Rejected[T]] = []


class ItemFailure(BaseModel, Generic[T]):
    """An item whose work gave no result, and why."""

    item: T
    reason: str
    """The failure's reason: `child_failed`, `output_invalid`, `node_failed`, …"""
    message: str = ""


class Collected(BaseModel, Generic[I, T]):
    """What a map with `merge="collect"` gives: the results of the items that gave one, in item
    order, and the items that did not, with why."""

    results: list[T] = []
    failed: list[ItemFailure[I]] = []


__all__ = ["ClaimCheck", "Collected", "Gated", "ItemFailure", "Rejected"]
