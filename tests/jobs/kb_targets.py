"""The scan workflow with a scripted summary writer, imported by reference in processes that
get killed (`tests/jobs/kb_targets.py:flow`). CRASH_LOG_DIR says where the model logs its
requests, so a test can count them across processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from contextos.jobs.kb import kb_scan_workflow
from contextos.testing import ScriptedModel, reply

LOG_DIR = os.environ.get("CRASH_LOG_DIR")

flow = kb_scan_workflow(
    ScriptedModel(
        [lambda request: reply(json.dumps({"text": "Six dead external links; fix those first."}))],
        by_turn=True,
        log_path=Path(LOG_DIR) / "model.jsonl" if LOG_DIR else None,
    )
)

nonsense = kb_scan_workflow(
    ScriptedModel(
        [lambda request: reply(json.dumps({"text": "0 new, 0 open: nothing is wrong at all."}))],
        by_turn=True,
    )
)
"""A writer that answers badly: the report's counts must not move."""

capped = kb_scan_workflow(
    ScriptedModel(
        [lambda request: reply(json.dumps({"text": "One scan."}), input_tokens=5_800)],
        by_turn=True,
    ),
    daily_tokens=6_000,
)
"""A writer whose one summary spends most of the day's 6,000 tokens."""
