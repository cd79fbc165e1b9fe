"""Built-in file tools confined to roots, HTTP tools confined by the network setting.

The tools check again at the moment they act, whatever the policy engine said before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from contextos.errors import ContainmentViolation
from contextos.policy import Containment, NetworkPolicy
from contextos.tools import file_tools, http_tools
from contextos.tools.contract import ToolContext

CTX = ToolContext(run_id="run_1", call_id="call_1_0")
"""What a tool is told about a call of a run that binds no containment of its own."""


def in_run(containment: Containment) -> ToolContext:
    """What a tool is told about a call of a run that acts under `containment`."""
    return ToolContext(run_id="run_1", call_id="call_1_0", containment=containment)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    r.mkdir()
    (r / "hello.txt").write_text("hello")
    (tmp_path / "secret.txt").write_text("secret")
    return r


def test_read_write_list_inside_the_root(root: Path) -> None:
    read_file, write_file, list_files = file_tools([str(root)])
    assert read_file.fn(ctx=CTX, path="hello.txt") == "hello"
    assert "wrote 5 bytes" in str(write_file.fn(ctx=CTX, path="out/new.txt", content="12345"))
    assert (root / "out" / "new.txt").read_text() == "12345"
    assert list_files.fn(ctx=CTX, path=".") == ["hello.txt", "out/"]
    assert read_file.scopes == ("files:read",) and write_file.effect.value == "write"


def test_traversal_absolute_and_symlink_escape_refused_at_the_tool(
    root: Path, tmp_path: Path
) -> None:
    read_file, write_file, list_files = file_tools([str(root)])
    with pytest.raises(ContainmentViolation, match="climbs out"):
        read_file.fn(ctx=CTX, path="../secret.txt")
    with pytest.raises(ContainmentViolation, match="absolute path is outside"):
        read_file.fn(ctx=CTX, path=str(tmp_path / "secret.txt"))
    os.symlink(tmp_path / "secret.txt", root / "innocent.txt")
    with pytest.raises(ContainmentViolation, match="symlink"):
        read_file.fn(ctx=CTX, path="innocent.txt")
    with pytest.raises(ContainmentViolation, match="symlink"):
        write_file.fn(ctx=CTX, path="innocent.txt", content="overwrite the secret")
    assert (tmp_path / "secret.txt").read_text() == "secret"
    os.symlink(tmp_path, root / "up")
    with pytest.raises(ContainmentViolation):
        list_files.fn(ctx=CTX, path="up")


def test_the_runs_containment_narrows_the_tools_roots(root: Path) -> None:
    (root / "a").mkdir()
    (root / "b").mkdir()
    (root / "b" / "x.txt").write_text("b")
    read_file, _, _ = file_tools([str(root)])

    run = in_run(Containment(roots=(str(root / "a"),)))
    with pytest.raises(ContainmentViolation):
        read_file.fn(ctx=run, path=str(root / "b" / "x.txt"))
    assert read_file.fn(ctx=CTX, path=str(root / "b" / "x.txt")) == "b"


def test_tools_without_any_roots_refuse_everything(root: Path) -> None:
    read_file, _, _ = file_tools()
    with pytest.raises(ContainmentViolation, match="no filesystem roots"):
        read_file.fn(ctx=CTX, path=str(root / "hello.txt"))


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/redirect"):
            target = self.path.split("to=", 1)[1]
            self.send_response(302)
            self.send_header("Location", target)
            self.end_headers()
            return
        body = f"hello from {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[tuple[int, int]]:
    made = [ThreadingHTTPServer(("127.0.0.1", 0), _Handler) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in made]
    for t in threads:
        t.start()
    yield made[0].server_address[1], made[1].server_address[1]
    for s in made:
        s.shutdown()
        s.server_close()


def test_http_reaches_only_allowed_hosts_and_checks_every_redirect(
    servers: tuple[int, int],
) -> None:
    good, bad = servers
    http_get, _ = http_tools(NetworkPolicy(allow=(f"127.0.0.1:{good}",)))

    async def main() -> None:
        ok = await http_get.fn(ctx=CTX, url=f"http://127.0.0.1:{good}/x")
        assert ok["status"] == 200 and ok["body"] == "hello from /x"
        with pytest.raises(ContainmentViolation, match="not on the network allow list"):
            await http_get.fn(ctx=CTX, url=f"http://127.0.0.1:{bad}/x")
        with pytest.raises(ContainmentViolation, match=str(bad)):
            await http_get.fn(
                ctx=CTX, url=f"http://127.0.0.1:{good}/redirect?to=http://127.0.0.1:{bad}/y"
            )
        followed = await http_get.fn(ctx=CTX, url=f"http://127.0.0.1:{good}/redirect?to=/z")
        assert followed["body"] == "hello from /z"

    asyncio.run(main())


def test_http_deny_wins(servers: tuple[int, int]) -> None:
    good, _ = servers
    http_get, _ = http_tools(NetworkPolicy(allow=("127.0.0.1",), deny=(f"127.0.0.1:{good}",)))
    with pytest.raises(ContainmentViolation, match="deny list"):
        asyncio.run(http_get.fn(ctx=CTX, url=f"http://127.0.0.1:{good}/x"))  # type: ignore[arg-type]


def test_a_hard_link_to_a_file_outside_cannot_be_read_or_overwritten(
    root: Path, tmp_path: Path
) -> None:
    os.link(tmp_path / "secret.txt", root / "notes.txt")
    read_file, write_file, _ = file_tools([str(root)])
    with pytest.raises(ContainmentViolation, match="hard links"):
        read_file.fn(ctx=CTX, path="notes.txt")
    with pytest.raises(ContainmentViolation, match="hard links"):
        write_file.fn(ctx=CTX, path="notes.txt", content="overwritten")
    assert (tmp_path / "secret.txt").read_text() == "secret"
    # the run's own containment refuses it too, whatever the tool allows
    lenient_read, _, _ = file_tools([str(root)], allow_hard_links=True)
    assert lenient_read.fn(ctx=CTX, path="notes.txt") == "secret"

    with pytest.raises(ContainmentViolation, match="hard links"):
        lenient_read.fn(ctx=in_run(Containment(roots=(str(root),))), path="notes.txt")


def test_a_read_only_directory_inside_a_writable_root_stays_read_only(root: Path) -> None:
    (root / "kb").mkdir()
    (root / "kb" / "faq.txt").write_text("faq")
    read_file, write_file, _ = file_tools([str(root)], read_only=[str(root / "kb")])
    assert read_file.fn(ctx=CTX, path="kb/faq.txt") == "faq"
    with pytest.raises(ContainmentViolation, match="read-only"):
        write_file.fn(ctx=CTX, path="kb/faq.txt", content="changed")
    with pytest.raises(ContainmentViolation, match="read-only"):
        write_file.fn(ctx=CTX, path="kb/new/deeper.txt", content="new")
    assert (root / "kb" / "faq.txt").read_text() == "faq"
    assert not (root / "kb" / "new").exists()
    assert "wrote" in str(write_file.fn(ctx=CTX, path="elsewhere.txt", content="ok"))


_SWAP_LOOP = """
import ctypes, os, sys
dir, link, stop = sys.argv[1:]
exchange = ctypes.CDLL(None, use_errno=True).renameat2  # atomic: `dir` is never missing
swaps = 0
while not os.path.exists(stop):
    if exchange(-100, dir.encode(), -100, link.encode(), 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
        raise OSError(ctypes.get_errno(), "renameat2")
    swaps += 1
    for _ in range(10):  # stay in each state about as long as a call takes
        os.lstat(dir)
print(swaps)
"""


@contextlib.contextmanager
def _swapping(dir: Path, target: Path) -> Iterator[list[int]]:
    """Another process swaps `dir` with a symlink to `target` and back, over and over."""
    stop = dir.parent.parent / "stop-swapping"
    link = dir.with_name(dir.name + ".link")
    link.symlink_to(target)
    swaps: list[int] = []
    proc = subprocess.Popen(
        [sys.executable, "-c", _SWAP_LOOP, str(dir), str(link), str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield swaps
    finally:
        stop.touch()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        swaps.append(int(out))


def test_a_directory_swapped_for_a_symlink_mid_call_never_leads_outside(
    root: Path, tmp_path: Path
) -> None:
    # a deep path keeps the time between checking `d` and opening the file long
    deep = "/".join(f"x{i}" for i in range(12))
    (root / "d" / deep).mkdir(parents=True)
    (root / "d" / deep / "a.txt").write_text("inside")
    outside = tmp_path / "outside"
    (outside / deep).mkdir(parents=True)
    (outside / deep / "a.txt").write_text("secret")
    (outside / deep / "secret-marker.txt").write_text("")
    read_file, write_file, list_files = file_tools([str(root)])
    seen: set[str] = set()
    refused = 0
    with _swapping(root / "d", outside) as swaps:
        for i in range(1000):
            for call in (
                lambda: read_file.fn(ctx=CTX, path=f"d/{deep}/a.txt"),
                lambda: list_files.fn(ctx=CTX, path=f"d/{deep}"),
                lambda i=i: write_file.fn(
                    ctx=CTX, path=f"d/{deep}/w{i % 7}.txt", content="written"
                ),
            ):
                try:
                    seen.add(repr(call()))
                except ContainmentViolation:
                    refused += 1
    assert swaps[0] > 10 and refused > 0  # the race was really run
    assert not any("secret" in s for s in seen)
    assert sorted(p.name for p in (outside / deep).iterdir()) == ["a.txt", "secret-marker.txt"]
    assert (outside / deep / "a.txt").read_text() == "secret"
