"""Reading what the model was shown inside the sanitizer's untrusted-data block."""

from __future__ import annotations

import re

_BLOCK = re.compile(
    r"\A<<untrusted-data [^\n]*>>\n(?P<body>.*)\n<<end untrusted-data [^\n]*>>\Z", re.S
)


def block_body(text: str) -> str:
    """The text of a message that is exactly one untrusted-data block; fails on anything else."""
    found = _BLOCK.match(text)
    assert found is not None, f"not one untrusted-data block: {text!r}"
    return found.group("body")
