"""Containment: roots, traversal, symlink escape, absolute paths, network allow/deny."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contextos.errors import ContainmentViolation
from contextos.policy import Containment, NetworkPolicy


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("inside")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    return {"root": root, "outside": outside}


def test_relative_and_absolute_paths_inside_a_root_resolve(tree: dict[str, Path]) -> None:
    c = Containment(roots=(str(tree["root"]),))
    assert c.resolve("sub/a.txt") == (tree["root"] / "sub" / "a.txt").resolve()
    assert c.resolve(str(tree["root"] / "sub" / "a.txt")).read_text() == "inside"
    # a `..` that stays inside is fine
    assert c.resolve("sub/../sub/a.txt").name == "a.txt"


def test_path_traversal_is_refused_with_a_clear_error(tree: dict[str, Path]) -> None:
    c = Containment(roots=(str(tree["root"]),))
    with pytest.raises(ContainmentViolation) as info:
        c.resolve("../outside/secret.txt")
    assert "climbs out of the run's roots" in info.value.message
    assert info.value.fields["path"] == "../outside/secret.txt"


def test_absolute_path_outside_the_roots_is_refused(tree: dict[str, Path]) -> None:
    c = Containment(roots=(str(tree["root"]),))
    with pytest.raises(ContainmentViolation, match="absolute path is outside the run's roots"):
        c.resolve(str(tree["outside"] / "secret.txt"))
    with pytest.raises(ContainmentViolation):
        c.resolve("/etc/passwd")


def test_symlink_escape_is_refused(tree: dict[str, Path]) -> None:
    root = tree["root"]
    os.symlink(tree["outside"] / "secret.txt", root / "link.txt")
    os.symlink(tree["outside"], root / "linkdir")
    c = Containment(roots=(str(root),))
    with pytest.raises(ContainmentViolation, match="symlink"):
        c.resolve("link.txt")
    with pytest.raises(ContainmentViolation, match="symlink"):
        c.resolve("linkdir/secret.txt")
    # a dangling link pointing outside cannot be used to create a file out there either
    os.symlink(tree["outside"] / "new.txt", root / "dangling")
    with pytest.raises(ContainmentViolation, match="symlink"):
        c.resolve("dangling", "write")


def test_a_symlink_that_stays_inside_is_fine(tree: dict[str, Path]) -> None:
    root = tree["root"]
    os.symlink(root / "sub" / "a.txt", root / "alias.txt")
    assert Containment(roots=(str(root),)).resolve("alias.txt").read_text() == "inside"


def test_a_prefix_sibling_is_not_inside(tree: dict[str, Path], tmp_path: Path) -> None:
    sibling = tmp_path / "root-evil"
    sibling.mkdir()
    c = Containment(roots=(str(tree["root"]),))
    with pytest.raises(ContainmentViolation):
        c.resolve(str(sibling))


def test_read_only_roots_refuse_writes(tree: dict[str, Path]) -> None:
    c = Containment(read_only=(str(tree["root"]),))
    assert c.resolve("sub/a.txt", "read").exists()
    with pytest.raises(ContainmentViolation, match="no write access"):
        c.resolve("sub/a.txt", "write")


def test_no_roots_means_no_files(tree: dict[str, Path]) -> None:
    with pytest.raises(ContainmentViolation, match="no filesystem roots"):
        Containment().resolve(str(tree["root"] / "sub" / "a.txt"))


def test_nul_byte_refused(tree: dict[str, Path]) -> None:
    with pytest.raises(ContainmentViolation, match="NUL"):
        Containment(roots=(str(tree["root"]),)).resolve("a\x00b")


def test_network_allow_and_deny() -> None:
    net = NetworkPolicy(
        allow=("*.example.com", "127.0.0.1:8080", "10.0.0.0/8"), deny=("bad.example.com",)
    )
    assert net.permits("https://api.example.com/v1")
    assert net.permits("http://127.0.0.1:8080/x")
    assert net.permits("http://10.1.2.3/x")
    assert not net.permits("http://127.0.0.1:8081/x")
    assert "deny list" in (net.why_not("https://bad.example.com/") or "")
    assert "not on the network allow list" in (net.why_not("https://example.org/") or "")
    assert "scheme" in (net.why_not("file:///etc/passwd") or "")
    # the userinfo trick does not fool the host check
    assert not net.permits("https://api.example.com@evil.org/")
    assert not NetworkPolicy().permits("https://api.example.com/")


def test_containment_narrowing() -> None:
    parent = Containment(roots=("/srv/data",), network=NetworkPolicy(allow=("*.example.com",)))
    assert Containment(roots=("/srv/data/run1",)).narrows(parent)
    assert not Containment(roots=("/srv",)).narrows(parent)
    assert Containment(network=NetworkPolicy(allow=("api.example.com",))).narrows(parent)
    assert not Containment(network=NetworkPolicy(allow=("*",))).narrows(parent)
    round_trip = Containment.from_dict(parent.to_dict())
    assert round_trip == parent
