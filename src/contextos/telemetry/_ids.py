"""Trace and span ids derived from the run id: the same in every process that exports the run."""

from __future__ import annotations

import hashlib


def trace_id_for(run_id: str) -> int:
    """The 128-bit trace id of a run's trace."""
    return int.from_bytes(hashlib.blake2b(run_id.encode(), digest_size=16).digest()) or 1


def span_id_for(run_id: str, key: str) -> int:
    """The 64-bit id of the run's span about `key` (`invoke_agent`, `chat/<seq>`, `tool/<id>`)."""
    return int.from_bytes(hashlib.blake2b(f"{run_id}/{key}".encode(), digest_size=8).digest()) or 1
