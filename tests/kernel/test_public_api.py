"""The public surface is deliberate: sorted, importable, and pinned."""

from __future__ import annotations

import contextos


def test_all_is_sorted_and_importable() -> None:
    assert contextos.__all__ == sorted(contextos.__all__)
    for name in contextos.__all__:
        assert not name.startswith("_")
        assert getattr(contextos, name) is not None


def test_kernel_names_are_exported() -> None:
    kernel = {
        "Agent",
        "Budget",
        "EventStore",
        "FailureReason",
        "ModelAdapter",
        "RunResult",
        "RunState",
        "RunStatus",
        "Runtime",
        "Tool",
        "fold",
        "load_agent",
        "open_store",
        "run",
        "tool",
    }
    assert kernel <= set(contextos.__all__)
