from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from contextos import Runtime

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))

from payments_service import PaymentsService  # noqa: E402


@pytest.fixture
def payments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PaymentsService]:
    with PaymentsService(tmp_path) as service:
        monkeypatch.setenv("PAYMENTS_URL", service.url)
        yield service


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    rt = Runtime(str(tmp_path / "runs.db"), cancel_poll_s=0.05)
    yield rt
    await rt.close()
