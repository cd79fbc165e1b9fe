"""Containment: roots, traversal, symlink escape, absolute paths, hard links, nested roots,
network allow/deny on every spelling of an address."""

from __future__ import annotations

import os
from ipaddress import ip_address
from pathlib import Path

import pytest

from contextos.errors import ContainmentViolation, PolicyLoadError
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


# -- the network setting on normalised hosts and addresses ------------------------------------

LOOPBACK_SPELLINGS = (
    "127.1",
    "127.0.1",
    "2130706433",
    "0x7f000001",
    "0x7f.1",
    "017700000001",
    "0177.0.0.1",
    "0",
    "0.0.0.0",
    "[::]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::127.0.0.1]",
    "[64:ff9b::7f00:1]",
    "[0:0:0:0:0:0:0:1]",
)


@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS)
def test_every_spelling_of_loopback_is_denied(spelling: str) -> None:
    net = NetworkPolicy(allow=("*",), deny=("127.0.0.0/8", "::1", "localhost"))
    why = net.why_not(f"http://{spelling}:8080/x")
    assert why is not None and ("deny list" in why or "unspecified" in why), why


def test_shorthand_ipv4_falls_in_its_range() -> None:
    net = NetworkPolicy(allow=("*", "10.0.0.0/8"), deny=("10.0.0.0/8",))
    assert "deny list" in (net.why_not("http://10.1/") or "")
    assert "deny list" in (net.why_not("http://012.1/") or "")  # octal 10
    assert "deny list" in (net.why_not("http://167772161/") or "")  # 10.0.0.1 in decimal
    # an address pattern matches every spelling of that address
    assert NetworkPolicy(allow=("127.0.0.1:8080",)).permits("http://2130706433:8080/")


@pytest.mark.parametrize(
    "url",
    [
        "http://evil\u3002example/",  # ideographic full stop
        "http://EVIL\uff0eexample./",  # fullwidth full stop, a trailing dot
        "http://evil\uff61example/",  # halfwidth ideographic full stop
    ],
)
def test_host_names_are_normalised_before_matching(url: str) -> None:
    net = NetworkPolicy(allow=("*",), deny=("evil.example",))
    assert "deny list" in (net.why_not(url) or ""), url


def test_internationalised_names_match_in_punycode() -> None:
    net = NetworkPolicy(allow=("*",), deny=("bücher.example",))
    assert not net.permits("http://xn--bcher-kva.example/")
    assert not net.permits("http://BÜCHER.example/")
    assert not NetworkPolicy(allow=("*",), deny=("xn--bcher-kva.example",)).permits(
        "http://bücher.example/"
    )


@pytest.mark.parametrize(
    "host",
    [
        "169.254.169.254",
        "10.0.0.5",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "127.0.0.1",
        "224.0.0.1",
        "[fd00::1]",
        "[fe80::1]",
        "[::1]",
        "[::ffff:169.254.169.254]",
    ],
)
def test_a_wildcard_never_reaches_internal_addresses(host: str) -> None:
    why = NetworkPolicy(allow=("*",)).why_not(f"http://{host}/latest/meta-data/")
    assert why is not None and "internal address" in why


def test_internal_ranges_are_reached_only_when_named() -> None:
    assert NetworkPolicy(allow=("*",)).permits("http://93.184.216.34/")
    assert NetworkPolicy(allow=("*",)).permits("https://example.com/")
    assert NetworkPolicy(allow=("*", "10.0.0.0/8")).permits("http://10.0.0.5/")
    assert not NetworkPolicy(allow=("*", "10.0.0.0/8")).permits("http://169.254.169.254/")
    # a name is checked again on the addresses it resolves to
    internal = NetworkPolicy(allow=("*.example.com",))
    assert internal.why_not_reach("db.example.com", 443, [ip_address("93.184.216.34")]) is None
    why = internal.why_not_reach("db.example.com", 443, [ip_address("10.0.0.5")])
    assert why is not None and "resolves to 10.0.0.5" in why and "internal address" in why
    named = NetworkPolicy(allow=("*.example.com", "10.0.0.0/8"), deny=("10.9.0.0/16",))
    assert named.why_not_reach("db.example.com", 443, [ip_address("10.0.0.5")]) is None
    # every address is checked, not only the first
    why = named.why_not_reach(
        "db.example.com", 443, [ip_address("10.0.0.5"), ip_address("10.9.0.1")]
    )
    assert why is not None and "10.9.0.1" in why and "deny list" in why


def test_a_malformed_network_pattern_is_refused_at_once() -> None:
    for bad in ("10.0.0.0/33", "host:port", "[::1]x", "a:99999"):
        with pytest.raises(PolicyLoadError, match="network pattern"):
            NetworkPolicy(deny=(bad,))


def test_network_narrowing_keeps_internal_ranges_closed() -> None:
    anywhere = NetworkPolicy(allow=("*",))
    assert NetworkPolicy(allow=("*.example.com", "93.184.216.0/24")).narrows(anywhere)
    assert not NetworkPolicy(allow=("10.0.0.0/8",)).narrows(anywhere)
    assert NetworkPolicy(allow=("10.1.0.0/16",)).narrows(NetworkPolicy(allow=("10.0.0.0/8",)))
    assert NetworkPolicy(allow=("[::1]:8080",)).narrows(NetworkPolicy(allow=("::1",)))
    assert not NetworkPolicy(allow=("::1",)).narrows(NetworkPolicy(allow=("[::1]:8080",)))


# -- nested roots and hard links ----------------------------------------------------------------


def test_the_most_specific_root_decides(tree: dict[str, Path]) -> None:
    root = tree["root"]
    (root / "sub" / "out").mkdir()
    c = Containment(roots=(str(root),), read_only=(str(root / "sub"),))
    assert c.resolve("sub/a.txt", "read").exists()
    with pytest.raises(ContainmentViolation, match="which is read-only"):
        c.resolve("sub/a.txt", "write")
    c.resolve("elsewhere.txt", "write")
    # a writable root inside a read-only one is writable
    inner = Containment(roots=(str(root / "sub" / "out"),), read_only=(str(root),))
    inner.resolve(str(root / "sub" / "out" / "x.txt"), "write")
    with pytest.raises(ContainmentViolation, match="read-only"):
        inner.resolve(str(root / "sub" / "a.txt"), "write")


def test_a_child_cannot_write_where_the_parent_is_read_only(tree: dict[str, Path]) -> None:
    root = tree["root"]
    parent = Containment(roots=(str(root),), read_only=(str(root / "sub"),))
    assert Containment(roots=(str(root),), read_only=(str(root / "sub"),)).narrows(parent)
    assert not Containment(roots=(str(root),)).narrows(parent)
    assert not Containment(roots=(str(root / "sub"),)).narrows(parent)
    assert Containment(read_only=(str(root / "sub"),)).narrows(parent)
    assert not Containment(roots=(str(root),), allow_hard_links=True).narrows(
        Containment(roots=(str(root),))
    )


def test_a_hard_link_to_a_file_outside_is_refused(tree: dict[str, Path]) -> None:
    root = tree["root"]
    os.link(tree["outside"] / "secret.txt", root / "linked.txt")
    c = Containment(roots=(str(root),))
    for access in ("read", "write"):
        with pytest.raises(ContainmentViolation, match="2 hard links"):
            c.resolve("linked.txt", access)  # type: ignore[arg-type]
    allowed = Containment(roots=(str(root),), allow_hard_links=True)
    assert allowed.resolve("linked.txt").read_text() == "secret"
    assert Containment.from_dict(allowed.to_dict()) == allowed
