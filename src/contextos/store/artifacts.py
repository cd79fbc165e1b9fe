"""Artifacts: content-addressed blobs with their lineage, kept beside the event logs.

A blob is stored once per sha256 of its bytes, whatever names it. An artifact names a blob and
says what it is (type, schema version, media type), where it came from (the run and the events
that produced it, the artifacts it was made from, the policy snapshot in force) and how
sensitive it is. A run records an `artifact_recorded` event for each artifact it produces; the
blob stays out of the event rows. Both tables are append-only, like the log.

The blob is written before the event that names it: a crash in between leaves an unnamed
artifact, and the retry derives the same id, so nothing is written twice.

A blob is stored zlib-compressed when that is smaller (decision records and JSON outputs
shrink to less than half); its `size` column always holds the size of the bytes themselves,
so a row whose content is shorter than its size is compressed, and one as long as it is is
stored as it is (as every blob written before compression was).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from contextos import events as ev
from contextos.errors import ArtifactCorrupt, ArtifactNotFound
from contextos.state import RunState
from contextos.store.base import conforms
from contextos.store.statements import Op, Start, all_rows, first_row

TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


@dataclass(frozen=True, kw_only=True, slots=True)
class Artifact:
    """What a run produced, by content hash, with its lineage."""

    artifact_id: str
    """Stable id, derived from the run, the type, the content and the source events."""
    type: str
    """What it is: `run_output`, `child_result`, `report`, `decision_record`, …"""
    schema_version: str
    """Version of its content's shape (`text`, or the output type's name and schema hash)."""
    content_hash: str
    """sha256 of the content, hex: the blob's address."""
    media_type: str
    """`text/plain; charset=utf-8`, `application/json` or `application/octet-stream`."""
    size: int
    """Bytes of content."""
    run_id: str
    """The run that produced it."""
    source_events: tuple[int, ...] = ()
    """Seqs of the producing run's events it was made from."""
    input_artifacts: tuple[str, ...] = ()
    """Artifacts it was made from (a child's result, an earlier report)."""
    policy_snapshot: str = ""
    """Hash of the policy snapshot the run was bound to ("" for an ungoverned run)."""
    classification: str = "internal"
    """Most sensitive data classification of what went into it."""
    created_at: datetime | None = None
    """When the store first saw it (UTC)."""

    @property
    def is_text(self) -> bool:
        """Whether its content reads as text (plain or JSON)."""
        return self.media_type in (TEXT, JSON)

    def event_fields(self) -> dict[str, Any]:
        """The fields of the `artifact_recorded` event that names it."""
        return {
            "artifact_id": self.artifact_id,
            "artifact_type": self.type,
            "schema_version": self.schema_version,
            "content_hash": self.content_hash,
            "media_type": self.media_type,
            "size": self.size,
            "source_events": self.source_events,
            "input_artifacts": self.input_artifacts,
            "policy_snapshot": self.policy_snapshot,
            "classification": self.classification,
        }

    @classmethod
    def from_event(cls, e: ev.ArtifactRecorded) -> Artifact:
        return cls(
            artifact_id=e.artifact_id,
            type=e.artifact_type,
            schema_version=e.schema_version,
            content_hash=e.content_hash,
            media_type=e.media_type,
            size=e.size,
            run_id=e.run_id,
            source_events=tuple(e.source_events),
            input_artifacts=tuple(e.input_artifacts),
            policy_snapshot=e.policy_snapshot,
            classification=e.classification,
            created_at=e.occurred_at,
        )


def encode_content(content: str | bytes | Any) -> tuple[bytes, str]:
    """Bytes and media type: text as UTF-8, bytes as given, anything else as canonical JSON."""
    if isinstance(content, str):
        return content.encode(), TEXT
    if isinstance(content, bytes):
        return content, "application/octet-stream"
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return blob.encode(), JSON


def make_artifact(
    state: RunState,
    content: str | bytes | Any,
    *,
    type: str,
    source_events: Sequence[int] = (),
    input_artifacts: Sequence[str] = (),
    schema_version: str = "1",
    classification: str = "internal",
    media_type: str | None = None,
) -> tuple[Artifact, bytes]:
    """An artifact of the run `state` describes, and its bytes (nothing is stored yet);
    `media_type` names what text or bytes already encoded hold."""
    blob, default_type = encode_content(content)
    media_type = media_type or default_type
    digest = hashlib.sha256(blob).hexdigest()
    sources = tuple(sorted(set(source_events)))
    key = f"{state.run_id}/{type}/{digest}/{','.join(map(str, sources))}"
    artifact = Artifact(
        artifact_id="art_" + hashlib.sha256(key.encode()).hexdigest()[:24],
        type=type,
        schema_version=schema_version,
        content_hash=digest,
        media_type=media_type,
        size=len(blob),
        run_id=state.run_id,
        source_events=sources,
        input_artifacts=tuple(input_artifacts),
        policy_snapshot=state.context.snapshot_hash if state.context is not None else "",
        classification=classification,
    )
    return artifact, blob


@runtime_checkable
class ArtifactStore(Protocol):
    """A store that keeps artifacts and their blobs."""

    async def put_artifact(self, artifact: Artifact, content: bytes) -> None:
        """Store the blob (once per hash) and the artifact (once per id); idempotent."""
        ...

    async def get_artifact(self, artifact_id: str) -> Artifact:
        """The artifact. Raises ArtifactNotFound."""
        ...

    async def artifact_content(self, artifact_id: str) -> bytes:
        """The artifact's bytes, checked against its hash. Raises ArtifactNotFound."""
        ...

    async def run_artifacts(self, run_id: str) -> list[Artifact]:
        """Every artifact stored for a run (named by its log or not), oldest first."""
        ...


def artifacts_of(store: object) -> ArtifactStore | None:
    """The store's artifacts, when the backend keeps them."""
    return cast(ArtifactStore, store) if conforms(store, ArtifactStore) else None


async def record_artifact(
    store: object,
    state: RunState,
    content: str | bytes | Any,
    *,
    type: str,
    source_events: Sequence[int] = (),
    input_artifacts: Sequence[str] = (),
    schema_version: str = "1",
    classification: str = "internal",
) -> dict[str, Any] | None:
    """Store an artifact of a run and return the fields of the `artifact_recorded` event to
    append with the step that produced it; None when the store keeps no artifacts.

    A graph layer hands a child's result to its parent this way: `type="child_result"`, the
    child's `run_output` artifact in `input_artifacts`, the parent's receiving event in
    `source_events`.
    """
    artifacts = artifacts_of(store)
    if artifacts is None:
        return None
    artifact, blob = make_artifact(
        state,
        content,
        type=type,
        source_events=source_events,
        input_artifacts=input_artifacts,
        schema_version=schema_version,
        classification=classification,
    )
    await artifacts.put_artifact(artifact, blob)
    return artifact.event_fields()


# -- the SQL, shared by both backends ---------------------------------------------------------

_PUT_BLOB = """
INSERT INTO blobs (sha256, size, content) VALUES (:sha256, :size, :content)
ON CONFLICT (sha256) DO NOTHING
"""

_PUT_ARTIFACT = """
INSERT INTO artifacts (artifact_id, run_id, type, schema_version, content_hash, media_type,
                       classification, policy_snapshot, lineage, created_at)
VALUES (:artifact_id, :run_id, :type, :schema_version, :content_hash, :media_type,
        :classification, :policy_snapshot, :lineage, {now})
ON CONFLICT (artifact_id) DO NOTHING
"""

_COLUMNS = (
    "a.artifact_id, a.run_id, a.type, a.schema_version, a.content_hash, a.media_type,"
    " a.classification, a.policy_snapshot, a.lineage, a.created_at, b.size"
)
_GET = f"SELECT {_COLUMNS} FROM artifacts a JOIN blobs b ON b.sha256 = a.content_hash"
_BY_ID = _GET + " WHERE a.artifact_id = :artifact_id"
_BY_RUN = _GET + " WHERE a.run_id = :run_id ORDER BY a.created_at, a.artifact_id"
_CONTENT = """
SELECT b.content, b.sha256, b.size FROM artifacts a JOIN blobs b ON b.sha256 = a.content_hash
WHERE a.artifact_id = :artifact_id
"""


def _pack(content: bytes) -> bytes:
    """The blob as stored: compressed when that makes it shorter, else as it is."""
    packed = zlib.compress(content, 1)  # the fastest level: nearly all the gain, in less time
    return packed if len(packed) < len(content) else content


def _unpack(stored: bytes, size: int) -> bytes | None:
    """The blob's bytes from its row; None when a compressed row does not inflate whole."""
    if len(stored) == size:
        return stored
    inflate = zlib.decompressobj()
    try:
        content = inflate.decompress(stored)
    except zlib.error:
        return None
    return content if inflate.eof and not inflate.unused_data else None


class SqlArtifacts:
    """ArtifactStore operations for a store whose `_execute` runs the shared statements."""

    if TYPE_CHECKING:  # supplied by the backend's queue class

        async def _execute(self, start: Start[Any], *, atomic: bool = False) -> Any: ...

        def _instant(self, value: Any) -> datetime: ...

    async def put_artifact(self, artifact: Artifact, content: bytes) -> None:
        if hashlib.sha256(content).hexdigest() != artifact.content_hash:
            raise ValueError(f"artifact {artifact.artifact_id}: content does not match its hash")
        lineage = json.dumps(
            {
                "source_events": list(artifact.source_events),
                "input_artifacts": list(artifact.input_artifacts),
            }
        )

        def put() -> Op[None]:
            yield (
                _PUT_BLOB,
                {"sha256": artifact.content_hash, "size": len(content), "content": _pack(content)},
            )
            yield (
                _PUT_ARTIFACT,
                {
                    "artifact_id": artifact.artifact_id,
                    "run_id": artifact.run_id,
                    "type": artifact.type,
                    "schema_version": artifact.schema_version,
                    "content_hash": artifact.content_hash,
                    "media_type": artifact.media_type,
                    "classification": artifact.classification,
                    "policy_snapshot": artifact.policy_snapshot,
                    "lineage": lineage,
                },
            )

        await self._execute(put, atomic=True)

    async def get_artifact(self, artifact_id: str) -> Artifact:
        row = await self._execute(lambda: first_row(_BY_ID, {"artifact_id": artifact_id}))
        if row is None:
            raise ArtifactNotFound(artifact_id)
        return self._artifact(row)

    async def run_artifacts(self, run_id: str) -> list[Artifact]:
        """Every artifact stored for a run, whether or not its event was appended."""
        rows = await self._execute(lambda: all_rows(_BY_RUN, {"run_id": run_id}))
        return [self._artifact(r) for r in rows]

    async def artifact_content(self, artifact_id: str) -> bytes:
        row = await self._execute(lambda: first_row(_CONTENT, {"artifact_id": artifact_id}))
        if row is None:
            raise ArtifactNotFound(artifact_id)
        content = _unpack(bytes(row[0]), int(row[2]))
        if content is None or hashlib.sha256(content).hexdigest() != row[1]:
            raise ArtifactCorrupt(
                f"artifact {artifact_id}: its stored content does not match its hash "
                f"{row[1][:12]}; it was changed outside ContextOS",
                artifact_id=artifact_id,
            )
        return content

    def _artifact(self, row: Any) -> Artifact:
        (
            aid,
            run_id,
            type_,
            version,
            digest,
            media,
            level,
            snapshot,
            lineage,
            at,
            size,
        ) = row
        links = json.loads(lineage)
        return Artifact(
            artifact_id=str(aid),
            type=str(type_),
            schema_version=str(version),
            content_hash=str(digest),
            media_type=str(media),
            size=int(size),
            run_id=str(run_id),
            source_events=tuple(int(s) for s in links.get("source_events", ())),
            input_artifacts=tuple(str(a) for a in links.get("input_artifacts", ())),
            policy_snapshot=str(snapshot),
            classification=str(level),
            created_at=self._instant(at),
        )


__all__ = [
    "JSON",
    "TEXT",
    "Artifact",
    "ArtifactStore",
    "SqlArtifacts",
    "artifacts_of",
    "encode_content",
    "make_artifact",
    "record_artifact",
]
