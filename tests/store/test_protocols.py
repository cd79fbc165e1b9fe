"""Store capabilities are runtime-checkable protocols; the runtime asks them of its store
several times a run, so the answer is kept per type."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from contextos.store import SqliteStore
from contextos.store.artifacts import ArtifactStore, artifacts_of
from contextos.store.base import conforms
from contextos.store.queue import RunQueue


def test_a_protocol_check_answered_once_per_type_answers_as_isinstance_does(
    tmp_path: Path,
) -> None:
    """`conforms` caches by type; a protocol with data members still asks the instance."""

    class Bare:
        pass

    class WithUrl:
        def __init__(self, url: object) -> None:
            if url is not None:
                self.url = url

    @runtime_checkable
    class HasUrl(Protocol):
        url: str

    store = SqliteStore(tmp_path / "s.db")
    for _ in range(2):  # the second answer comes from the cache
        assert conforms(store, ArtifactStore) and conforms(store, RunQueue)
        assert not conforms(Bare(), ArtifactStore) and not conforms(Bare(), RunQueue)
        assert conforms(WithUrl("x"), HasUrl) and not conforms(WithUrl(None), HasUrl)
    assert artifacts_of(Bare()) is None and artifacts_of(store) is store
