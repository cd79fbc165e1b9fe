"""The public surface is deliberate: sorted, importable, pinned, and the only thing the faces
(the `contextos` command and the HTTP API) use."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import contextos
import contextos.api
import contextos.improve
import contextos.jobs.kb
import contextos.workers

SRC = Path(contextos.__file__).resolve().parent
PUBLIC = (contextos, contextos.workers)


@pytest.mark.parametrize("module", PUBLIC, ids=lambda m: m.__name__)
def test_all_is_the_public_namespace(module: ModuleType) -> None:
    """Every public name the module holds is in `__all__`, sorted, and nothing else is (its
    submodules are the house's rooms, not names)."""
    public = [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    ]
    assert module.__all__ == sorted(public)


FACES = {
    "contextos.cli": {"contextos": contextos, "contextos.workers": contextos.workers},
    "contextos.api": {"contextos": contextos, "contextos.workers": contextos.workers},
}
"""What each face may import besides its own modules: the public API's names. The command
starts the HTTP API too, through that face's own public names."""
FACES["contextos.cli"]["contextos.api"] = contextos.api
FACES["contextos.cli"]["contextos.jobs.kb"] = contextos.jobs.kb
FACES["contextos.cli"]["contextos.improve"] = contextos.improve
FACES["contextos.api"]["contextos.improve"] = contextos.improve


def private_imports(face: str, source: str) -> list[str]:
    """The imports of one module of `face` that are neither the face's own nor public names."""
    allowed = FACES[face]
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [(a.name, None) for a in node.names if a.name.startswith("contextos")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("contextos"):
            names = [(node.module or "", a.name) for a in node.names]
        else:
            continue
        for module, name in names:
            if module == face or module.startswith(face + "."):
                continue  # the face's own modules
            public = allowed.get(module)
            if public is None or name not in public.__all__:
                found.append(f"line {node.lineno}: {module} {name or ''}".rstrip())
    return found


@pytest.mark.parametrize("face", sorted(FACES))
def test_the_faces_use_only_the_public_api(face: str) -> None:
    found = [
        f"{path.relative_to(SRC)} {problem}"
        for path in sorted((SRC / face.split(".")[1]).rglob("*.py"))
        for problem in private_imports(face, path.read_text())
    ]
    assert found == []


def test_the_face_check_sees_private_imports() -> None:
    """The check above would pass on a walk that saw nothing: it sees what it forbids."""
    source = (
        "from contextos import Runtime, events\n"
        "from contextos.workers import add_trigger\n"
        "from contextos.cli.common import app\n"
        "def late():\n"
        "    from contextos.store.queue import queue_of\n"
        "    import contextos.state\n"
    )
    assert private_imports("contextos.cli", source) == [
        "line 1: contextos events",
        "line 5: contextos.store.queue queue_of",
        "line 6: contextos.state",
    ]


def test_the_public_surface_is_pinned() -> None:
    """Adding or removing a public name is a decision: update this list with it."""
    assert contextos.__all__ == [
        "Agent",
        "AgentChanged",
        "ApiToken",
        "Approval",
        "Artifact",
        "BaseTool",
        "Budget",
        "ConcurrencyConflict",
        "ConfigError",
        "Containment",
        "ContextOSError",
        "ControlRefused",
        "DecisionRecord",
        "DelegationContract",
        "EffectKind",
        "EffectState",
        "EventDecodeError",
        "EventStore",
        "FailureReason",
        "FinishReason",
        "FrozenAction",
        "Interrupt",
        "InterruptKind",
        "Message",
        "ModelAdapter",
        "ModelError",
        "ModelRequest",
        "ModelResponse",
        "NetworkPolicy",
        "PRIORITIES",
        "Policy",
        "PolicyDecision",
        "Principal",
        "PrincipalKind",
        "RenderedCall",
        "ReplayPacket",
        "ReplayReport",
        "RetryPolicy",
        "Risk",
        "Rule",
        "RunContext",
        "RunId",
        "RunInUse",
        "RunIsTerminal",
        "RunNotFound",
        "RunOwner",
        "RunResult",
        "RunState",
        "RunStatus",
        "RunSummary",
        "RunTree",
        "Runtime",
        "Subagent",
        "TimelineEntry",
        "Tool",
        "ToolCall",
        "ToolContext",
        "ToolResult",
        "Trace",
        "Unauthenticated",
        "Usage",
        "Verdict",
        "Verifier",
        "Workflow",
        "authenticate",
        "fold",
        "issue_token",
        "list_tokens",
        "load_agent",
        "load_runnable",
        "open_store",
        "resolve_model",
        "revoke_token",
        "run",
        "tool",
    ]


def test_the_workers_surface_is_pinned() -> None:
    """What the command and the HTTP API need of workers, and nothing more."""
    assert contextos.workers.__all__ == [
        "CatchUp",
        "ConcurrencyLimit",
        "DELIVERY_HEADER",
        "HealthCheck",
        "LimitScope",
        "SIGNATURE_HEADER",
        "SIGNATURE_TOLERANCE_S",
        "Schedule",
        "Trigger",
        "TriggerKind",
        "TriggerOn",
        "Worker",
        "WorkerConfig",
        "WorkerInfo",
        "WorkerStatus",
        "add_schedule",
        "add_trigger",
        "doctor",
        "fire_webhook",
        "list_limits",
        "list_schedules",
        "list_triggers",
        "list_workers",
        "remove_schedule",
        "remove_trigger",
        "run_worker",
        "set_limit",
        "sign",
        "started_by",
        "verify_signature",
        "what_fires",
    ]


def test_the_knowledge_base_job_surface_is_pinned() -> None:
    """The job the command runs (`contextos kb scan`), by its public names only."""
    kb = contextos.jobs.kb
    assert kb.__all__ == sorted(kb.__all__)
    assert {"Report", "ScanRequest", "default_index", "kb_scan"} <= set(kb.__all__)


def test_importing_contextos_leaves_the_http_client_to_the_first_request() -> None:
    """httpx is loaded by the first request an HTTP tool, a hosted model or the link checker
    makes: a process that imports the runtime, the command line or the knowledge-base job
    without making one does not pay for it."""
    code = (
        "import sys, contextos, contextos.cli, contextos.jobs.kb, contextos.models; "
        "print('httpx' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
