"""Every error ContextOS raises, in one tree.

    ContextOSError                    code, message, structured fields
    ├── ConfigError                   bad store URL, bad agent reference, bad model string
    ├── RunNotFound                   no run with that id
    ├── StoreError
    │   ├── ConcurrencyConflict       an append expected an older sequence (the fence)
    │   ├── RunIsTerminal             an append to a completed/failed/cancelled/expired run
    │   ├── EventDecodeError          a stored event is corrupt or has an unknown schema version
    │   ├── EventEncodeError          an event would not read back as written; nothing appended
    │   ├── MigrationError            the schema is ahead of this code, or half-applied
    │   ├── StoreNotFound             a command that only reads named a store that does not exist
    │   └── StoreUnavailable          the store cannot be used: not a database, unreachable, …
    ├── AgentChanged                  resuming a run with an agent whose identity hash differs
    ├── RunInUse                      driving a run whose lease a live driver holds
    ├── ControlRefused                a pause or a follow-up the run cannot take now (ended, …)
    ├── ModelError                    a model call failed (retryable says whether to try again)
    │   ├── ModelTimeout              the provider did not answer in time (after retries)
    │   ├── ModelRateLimited          the provider kept saying 429 / Retry-After too far away
    │   ├── ModelProtocolError        the answer broke the protocol: types, fields, numbers, size
    │   └── ScriptExhausted           the scripted model was asked for more steps than it has
    └── ToolError                     a tool failed; goes back to the model unless it ends the run
        ├── ToolTimeout
        ├── ToolArgumentsInvalid      arguments malformed, too big, too deep, not finite, off schema
        ├── ToolOutcomeUnknown        a tool cannot tell whether its call took effect
        ├── ToolManifestChanged       a run's tools changed while it was in flight
        ├── ContentBlocked            a read tool's output held data the PII policy blocks
        ├── ToolCrashed               a tool raised a BaseException (SystemExit, a stray cancel)
        ├── ToolOutputInvalid         a tool's result cannot be turned into text and recorded
        └── McpServerUnavailable      an MCP server did not connect in time, or is gone
    PolicyError (ContextOSError)      authority: policies, run contexts, containment, interrupts
    ├── PolicyLoadError               a policy file or rule is malformed
    ├── ContainmentViolation          a path or URL outside the run's containment
    ├── AuthorityWidened              a child run asked for more authority than its parent has
    ├── InterruptNotFound             no interrupt with that id
    ├── ApprovalRefused               an approval, denial, answer or revocation was not accepted
    │   └── AnswerTooLate             the interrupt expired before the answer came
    ├── AnswerInvalid                 an answer does not match its interrupt's answer schema
    └── Unauthenticated               a bearer token that is missing, unknown or revoked
    SignatureInvalid (ContextOSError) a webhook delivery's signature is missing or wrong
    └── SignatureExpired              it was signed outside the tolerance window (a replay)
    EvidenceError (ContextOSError)    evidence: artifacts, decision records, replay, fork
    ├── ArtifactNotFound              no artifact with that id
    ├── ArtifactCorrupt               an artifact's stored bytes do not match its hash
    ├── RecordInvalid                 a canonical record does not match its schema or its hash
    ├── ForkRefused                   a run cannot be forked at that seq
    ├── LiveDispatchRefused           a replay reached for a live tool; nothing was sent
    └── TraceExportFailed             an OTLP collector refused a trace or did not answer in time
    ImprovementError (ContextOSError) the improvement loop: findings, candidates, releases
    ├── ImprovementNotFound           no finding, proposal, candidate or report with that id
    ├── ReleaseRefused                a candidate regresses a golden run, or its evidence changed
    └── ProposalRefused               a model's draft is not a proposal the ladder allows

Cancelling a run cancels its in-flight asyncio task: `asyncio.CancelledError` is a
BaseException, so a tool's `except Exception` cannot swallow it.

Control flow that is not a failure (a run waiting for a human, a verifier asking for another
turn) is recorded as events, never raised.
"""

from __future__ import annotations

from typing import Any


class ContextOSError(Exception):
    """Base of every ContextOS error: a stable `code` plus structured fields."""

    code = "contextos_error"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.fields}


class ConfigError(ContextOSError):
    code = "config_error"


class RunNotFound(ContextOSError):
    code = "run_not_found"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r}", run_id=run_id)
        self.run_id = run_id


class StoreError(ContextOSError):
    code = "store_error"


class ConcurrencyConflict(StoreError):
    code = "concurrency_conflict"

    def __init__(self, run_id: str, expected_seq: int, actual_seq: int) -> None:
        super().__init__(
            f"run {run_id}: append expected seq {expected_seq} but the log is at {actual_seq}; "
            "another writer got there first",
            run_id=run_id,
            expected_seq=expected_seq,
            actual_seq=actual_seq,
        )
        self.run_id = run_id
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq


class RunIsTerminal(StoreError):
    code = "run_is_terminal"

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(
            f"run {run_id} is {status}; a terminal run cannot change", run_id=run_id, status=status
        )
        self.run_id = run_id
        self.status = status


class EventDecodeError(StoreError):
    code = "event_decode_error"

    def __init__(self, run_id: str, seq: int, reason: str) -> None:
        super().__init__(f"run {run_id} event #{seq}: {reason}", run_id=run_id, seq=seq)
        self.run_id = run_id
        self.seq = seq


class EventEncodeError(StoreError):
    """An append refused before anything was written: one of its events holds a value its
    declared type cannot carry, so the row would never decode again."""

    code = "event_encode_error"

    def __init__(self, run_id: str, seq: int, reason: str) -> None:
        super().__init__(
            f"run {run_id} event #{seq} cannot be stored: {reason}; nothing was appended",
            run_id=run_id,
            seq=seq,
        )
        self.run_id = run_id
        self.seq = seq


class MigrationError(StoreError):
    code = "migration_error"


class StoreNotFound(StoreError):
    """Reading never creates a store: the one named does not exist (yet)."""

    code = "store_not_found"

    def __init__(self, url: str) -> None:
        super().__init__(
            f"no store at {url}: nothing has run there yet (start a run with `contextos run`, "
            "or name another store with --store or CONTEXTOS_STORE)",
            url=url,
        )
        self.url = url


class StoreUnavailable(StoreError):
    """The store exists but cannot be used; nothing in it was changed."""

    code = "store_unavailable"


class AgentChanged(ContextOSError):
    code = "agent_changed"


class RunInUse(ContextOSError):
    """Another driver (a worker, `contextos run`, a script) holds the run's lease and renews
    it: driving the run here too would run its steps twice."""

    code = "run_in_use"

    def __init__(self, run_id: str, owner: str, *, detail: str = "") -> None:
        super().__init__(
            f"run {run_id} is being driven by {owner}{detail}: wait for it, or stop it "
            "(Ctrl-C there, or `contextos cancel`)",
            run_id=run_id,
            owner=owner,
        )
        self.run_id = run_id
        self.owner = owner


class ControlRefused(ContextOSError):
    """A pause or a follow-up message the run cannot take in its state (it ended, it is
    running, it waits on a person, it has no budget left); nothing was recorded."""

    code = "control_refused"

    def __init__(self, run_id: str, status: str, reason: str) -> None:
        super().__init__(f"run {run_id} {reason}", run_id=run_id, status=status)
        self.run_id = run_id
        self.status = status


class ModelError(ContextOSError):
    code = "model_error"

    def __init__(self, message: str, *, retryable: bool = False, **fields: Any) -> None:
        super().__init__(message, retryable=retryable, **fields)
        self.retryable = retryable


class ModelTimeout(ModelError):
    code = "model_timeout"


class ModelRateLimited(ModelError):
    code = "model_rate_limited"


class ModelProtocolError(ModelError):
    """A provider answered, but not with a valid answer: a wrong type, a missing field, a
    negative or impossible number, an answer over the size cap. Nothing of it is recorded."""

    code = "model_protocol_error"

    def __init__(self, message: str, *, retryable: bool = True, **fields: Any) -> None:
        super().__init__(message, retryable=retryable, **fields)


class ScriptExhausted(ModelError):
    code = "script_exhausted"


class ToolError(ContextOSError):
    code = "tool_error"


class ToolTimeout(ToolError):
    code = "tool_timeout"


class ToolArgumentsInvalid(ToolError):
    code = "tool_arguments_invalid"


class ToolOutcomeUnknown(ToolError):
    """Raised by a tool when its call may or may not have taken effect (a dropped connection
    after the request was sent): the runtime reconciles instead of guessing."""

    code = "tool_outcome_unknown"


class ToolManifestChanged(ToolError):
    code = "tool_manifest_changed"


class ToolCrashed(ToolError):
    """A tool ended with a BaseException that is not an `Exception` (SystemExit,
    KeyboardInterrupt, a CancelledError the runtime did not cause, ...): the tool's fault,
    recorded as its failure; it never stops the process driving the run."""

    code = "tool_crashed"


class ToolOutputInvalid(ToolError):
    """A tool's result has no text that can be recorded (cyclic, its `__str__` raises, lone
    surrogates, ...): the call is recorded as failed with the reason."""

    code = "tool_output_invalid"


class ContentBlocked(ToolError):
    code = "content_blocked"


class McpServerUnavailable(ToolError):
    """An MCP server did not connect and initialise in time, or its connection is gone (a call
    refused with this error was never sent)."""

    code = "mcp_server_unavailable"


class PolicyError(ContextOSError):
    code = "policy_error"


class PolicyLoadError(PolicyError):
    code = "policy_load_error"


class ContainmentViolation(PolicyError):
    code = "containment_violation"


class AuthorityWidened(PolicyError):
    code = "authority_widened"


class InterruptNotFound(PolicyError):
    code = "interrupt_not_found"


class ApprovalRefused(PolicyError):
    code = "approval_refused"


class AnswerTooLate(ApprovalRefused):
    """The interrupt expired unanswered; what was declared for that already happened."""

    code = "interrupt_expired"


class AnswerInvalid(PolicyError):
    code = "answer_invalid"


class Unauthenticated(PolicyError):
    """No principal: the request's bearer token is missing, unknown or revoked."""

    code = "unauthenticated"


class SignatureInvalid(ContextOSError):
    code = "bad_signature"


class SignatureExpired(SignatureInvalid):
    """The signature is right but its timestamp is too far from now: a captured delivery
    replayed later, or a sender whose clock is off."""

    code = "signature_expired"


class EvidenceError(ContextOSError):
    code = "evidence_error"


class ArtifactNotFound(EvidenceError):
    code = "artifact_not_found"

    def __init__(self, artifact_id: str) -> None:
        super().__init__(f"no artifact with id {artifact_id!r}", artifact_id=artifact_id)
        self.artifact_id = artifact_id


class ArtifactCorrupt(EvidenceError):
    code = "artifact_corrupt"


class RecordInvalid(EvidenceError):
    """A canonical record given as JSON does not match its schema, or its hash does not match
    its content: nothing was done with it."""

    code = "record_invalid"


class ForkRefused(EvidenceError):
    code = "fork_refused"


class LiveDispatchRefused(EvidenceError):
    """Raised by the tools of a replay if anything reaches for them: a replay serves recorded
    results and never sends a call."""

    code = "live_dispatch_refused"


class TraceExportFailed(EvidenceError):
    """An OTLP collector refused the spans of a recorded run, or did not answer in time."""

    code = "trace_export_failed"


class ImprovementError(ContextOSError):
    """The improvement loop refused or could not find something: nothing was released."""

    code = "improvement_error"


class ImprovementNotFound(ImprovementError):
    code = "improvement_not_found"


class ReleaseRefused(ImprovementError):
    """A candidate cannot be released: its replay regresses a golden run, the evidence it was
    approved on no longer matches, or nobody approved it."""

    code = "release_refused"


class ProposalRefused(ImprovementError):
    """A model's draft is malformed, climbs the ladder past the finding's rung, leaves the
    finding's agent, or cites evidence the finding does not have: nothing was kept."""

    code = "proposal_refused"
