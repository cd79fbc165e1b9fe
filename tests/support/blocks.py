"""Reading what the model was shown inside the sanitizer's untrusted-data block."""

from __future__ import annotations

import re
import unicodedata

from contextos.untrusted import CLOSE, OPEN

_BLOCK = re.compile(
    r"\A<<untrusted-data [^\n]*>>\n(?P<body>.*)\n<<end untrusted-data [^\n]*>>\Z", re.S
)


def block_body(text: str) -> str:
    """The text of a message that is exactly one untrusted-data block; fails on anything else."""
    found = _BLOCK.match(text)
    assert found is not None, f"not one untrusted-data block: {text!r}"
    return found.group("body")


SPOTLIT = re.compile(
    rf'{re.escape(OPEN)} source="(?P<source>[^"]+)"[^\n]* id="(?P<id>[0-9a-f]{{10}})">>\n'
    rf'(?P<body>.*?)\n{re.escape(CLOSE)} id="(?P=id)">>',
    re.DOTALL,
)
"""One spotlighted block, its source, id and body; the closing delimiter names the same id."""


def reader_view(text: str) -> str:
    """Text as a tokenizer would read it, worked out independently of the sanitizer: every
    format character (zero-width, bidi, tags) dropped, NFKC, every line break a newline."""
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    text = unicodedata.normalize("NFKC", text)
    return "\n".join(text.splitlines())


_ROLE_AT_LINE_START = re.compile(
    r"(?im)^[\s>#*]*(?:system|assistant|human|user|developer|instruction|response)"
    r"(?:\s+(?:message|note|prompt))?\s*\**:"
)
_LIVE = re.compile(
    r"<<|>>|<\|[^|]*\|>|</?(?:s|system|bos|eos|think|start_of_turn|end_of_turn|information)>"
    r"|\[/?(?:INST|SYSTEM_PROMPT|TOOL_CALLS|TOOL_RESULTS|AVAILABLE_TOOLS|system)\]",
    re.IGNORECASE,
)


def live_markers(body: str) -> list[str]:
    """Markers in a block's body that a model could still take for a turn or a delimiter."""
    seen = reader_view(body)
    return _LIVE.findall(seen) + _ROLE_AT_LINE_START.findall(seen)


def only_block(seen: str) -> re.Match[str]:
    """The one spotlighted block `seen` consists of, with nothing live inside."""
    m = SPOTLIT.fullmatch(seen)
    assert m is not None, f"not a single spotlighted block: {seen!r}"
    assert seen.count(OPEN) == 1 and seen.count(CLOSE) == 1
    assert live_markers(m.group("body")) == [], m.group("body")
    return m
