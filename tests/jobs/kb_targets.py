"""The scan workflow with a scripted model, imported by reference in processes that get killed
(`tests/jobs/kb_targets.py:flow`). The model writes the summary and judges the doubted links
(yes, each is a soft 404). CRASH_LOG_DIR says where the model logs its requests, so a test can
count them across processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from contextos.jobs.kb import kb_scan_workflow
from contextos.models import ModelRequest, ModelResponse
from contextos.testing import ScriptedModel, reply

LOG_DIR = os.environ.get("CRASH_LOG_DIR")

SOFT_404 = json.dumps({"soft_404": True, "reason": "The page reads 'Page not found'."})


def is_judge(request: ModelRequest) -> bool:
    """A call of the link judge (its answer's schema has `soft_404`), not of the writer."""
    return "soft_404" in json.dumps(request.output_schema or {})


def answers(
    summary: str, judgement: str = SOFT_404, *, log_path: Path | None = None, **usage: int
) -> ScriptedModel:
    """A model whose writer says `summary` and whose judge says `judgement`."""

    def answer(request: ModelRequest) -> ModelResponse:
        if is_judge(request):
            return reply(judgement)
        return reply(json.dumps({"text": summary}), **usage)

    return ScriptedModel([answer], by_turn=True, log_path=log_path)


_model = answers(
    "Six dead external links; fix those first.",
    log_path=Path(LOG_DIR) / "model.jsonl" if LOG_DIR else None,
)
flow = kb_scan_workflow(_model, judge=_model)


_bad = answers("0 new, 0 open: nothing is wrong at all.", "Yes! Definitely 404, all of them.")
nonsense = kb_scan_workflow(_bad, judge=_bad)
"""A model that answers badly, as the writer and as the judge: the report's counts must not
move."""

_capped = answers("One scan.", input_tokens=5_800)
capped = kb_scan_workflow(_capped, judge=_capped, daily_tokens=6_000)
"""A writer whose one summary spends most of the day's 6,000 tokens."""
