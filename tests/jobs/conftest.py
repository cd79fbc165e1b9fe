"""Fixtures for the knowledge-base scan: the loopback site, an editable copy of the sample."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kbsample import SAMPLE

from contextos.jobs.kb import Fixture


@pytest.fixture
def site() -> Iterator[Fixture]:
    with Fixture(delay_s=3.0) as running:
        yield running


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    """A copy of the sample to edit."""
    return Path(shutil.copytree(SAMPLE, tmp_path / "kb"))
