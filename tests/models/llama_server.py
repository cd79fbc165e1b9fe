"""Runs llama-cpp-python's OpenAI-compatible server with llama.cpp's extra CPU buffer types off.

The same guard the embedded model uses (`--no-repack` in llama.cpp's own server): on CPUs with
AMX, the repacked weights crash a natively built llama.cpp on prompts longer than one token.
Arguments are the server's own (`--model`, `--host`, `--port`, ...).
"""

from __future__ import annotations

import llama_cpp.llama_cpp as lib
from llama_cpp.server.__main__ import main

from contextos.models.local import _extra_buffer_types_off

if __name__ == "__main__":
    with _extra_buffer_types_off(lib):
        main()  # type: ignore[no-untyped-call]
