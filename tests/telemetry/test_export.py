"""Traces leave the process: over OTLP/HTTP to a real server, from a run that crashed and
resumed in another process, and never as a requirement of importing contextos."""

from __future__ import annotations

import gzip
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from contextos.events import ModelResponded, RuntimeCrashDetected
from contextos.store import SqliteStore
from contextos.telemetry import spans_for, trace_id_for
from support.crashes import crash_env, kill_after_command

ROOT = Path(__file__).resolve().parents[2]
CRASH_AGENT = "tests/crash/crash_agent.py:agent"


class Collector:
    """An OTLP/HTTP trace receiver on 127.0.0.1 that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.paths: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        collector.spans.extend(scope.spans)
                collector.paths.append(self.path)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def ids(self) -> list[tuple[str, bytes, bytes, bytes]]:
        return sorted((s.name, s.trace_id, s.span_id, s.parent_span_id) for s in self.spans)


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    c.thread.start()
    yield c
    c.server.shutdown()
    c.server.server_close()


def contextos(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = crash_env(tmp_path)
    return {k: v for k, v in env.items() if not k.startswith(("OTEL_", "CONTEXTOS_OTEL"))}


async def recorded(db: Path, run_id: str) -> list[object]:
    store = SqliteStore(db)
    try:
        return list(await store.read(run_id))  # type: ignore[arg-type]
    finally:
        await store.close()


async def test_a_run_killed_midway_and_resumed_elsewhere_is_one_trace(
    tmp_path: Path, collector: Collector
) -> None:
    db, run_id = tmp_path / "c.db", "run_r"
    env = clean_env(tmp_path)
    killed = subprocess.run(
        kill_after_command(db, run_id, 6, CRASH_AGENT, "Where are A-1 and B-2?"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    # The new process exports live, as its events commit.
    resumed = contextos(
        "resume", run_id, "--store", str(db), "--json",
        env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    events = await recorded(db, run_id)
    assert any(isinstance(e, RuntimeCrashDetected) for e in events)

    spans = spans_for(events)  # type: ignore[arg-type]
    roots = [s for s in spans if s.parent_id is None]
    assert [r.name for r in roots] == ["invoke_agent crash-test"]
    [root] = roots
    assert root.attributes["contextos.run.status"] == "completed"
    assert "contextos.runtime_crash_detected" in [e.name for e in root.events]
    chats = [s for s in spans if s.name.startswith("chat ")]
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert len(chats) == sum(isinstance(e, ModelResponded) for e in events) == 4
    assert sorted(str(t.attributes["gen_ai.tool.call.id"]) for t in tools) == [
        "call_1_0",
        "call_2_0",
        "call_2_1",
    ]
    assert len({s.span_id for s in spans}) == len(spans) == 8
    assert {s.trace_id for s in spans} == {trace_id_for(run_id)}

    # What the resumed process sent live is part of that same trace, the root included.
    live = collector.ids()
    assert collector.paths and set(collector.paths) == {"/v1/traces"}
    assert len(live) == len(set(live))
    by_id = {s.span_id.to_bytes(8, "big"): s for s in spans}
    for name, trace_id, span_id, parent in live:
        assert trace_id == trace_id_for(run_id).to_bytes(16, "big")
        assert by_id[span_id].name == name
        assert parent == (root.span_id.to_bytes(8, "big") if name != root.name else b"")
    assert root.name in [name for name, *_ in live]


async def test_contextos_trace_sends_a_recorded_run_over_otlp_http(
    tmp_path: Path, collector: Collector
) -> None:
    db = tmp_path / "c.db"
    env = clean_env(tmp_path)
    ran = contextos(
        "run", "tests/crash/crash_agent.py:agent", "Where is A-1?", "--store", str(db),
        "--run-id", "run_t", "--json", env=env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert collector.spans == []  # nothing is exported unless asked

    sent = contextos("trace", "run_t", "--store", str(db), "--otlp", collector.url, env=env)
    assert sent.returncode == 0, sent.stderr
    assert "invoke_agent crash-test" in sent.stdout
    names = sorted(name for name, *_ in collector.ids())
    assert names == [
        "chat scripted",
        "chat scripted",
        "chat scripted",
        "chat scripted",
        "execute_tool lookup",
        "execute_tool lookup",
        "execute_tool stock",
        "invoke_agent crash-test",
    ]
    [root] = [s for s in collector.spans if not s.parent_span_id]
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["gen_ai.conversation.id"].string_value == "run_t"
    assert attrs["gen_ai.operation.name"].string_value == "invoke_agent"
    chat = next(s for s in collector.spans if s.name.startswith("chat"))
    assert chat.kind == Span.SpanKind.SPAN_KIND_CLIENT


def test_importing_contextos_needs_no_opentelemetry(tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import contextos, contextos.runtime, contextos.cli, contextos.telemetry\n"
        "from contextos.errors import ConfigError\n"
        "try:\n"
        "    contextos.telemetry.spans_for([])\n"
        "except ConfigError as exc:\n"
        "    print(exc.message)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'contextos[otel]'" in out.stdout
