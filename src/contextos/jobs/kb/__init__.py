"""The knowledge-base scan: dead links and anchors, frontmatter, structure; only what is new.

Everything here is deterministic and needs no model: contained read-only tools for a scan
node, the checks, the index that makes scans incremental and streaming, the reduce, the link
verifier and the report. `scan_kb` runs them end to end; `kb_scan` is the same scan as a
durable workflow, with a model writing the report's prose and judging the working links that
look moved (listed apart, never counted).
"""

from contextos.jobs.kb.checks import Rules
from contextos.jobs.kb.doubts import Doubt, Judgement, Suspect
from contextos.jobs.kb.findings import Finding, FindingKind
from contextos.jobs.kb.fix import (
    FixOutcome,
    Proposal,
    fix_frontmatter,
    fix_policy,
    propose_frontmatter,
)
from contextos.jobs.kb.fixture import Fixture
from contextos.jobs.kb.flow import (
    SCANNER,
    ScanRequest,
    Summary,
    default_index,
    kb_scan,
    kb_scan_workflow,
)
from contextos.jobs.kb.gate import Gated, gate
from contextos.jobs.kb.index import Index, Occurrence
from contextos.jobs.kb.job import Outcome, scan_kb
from contextos.jobs.kb.reduce import Delta, dedupe, reduce
from contextos.jobs.kb.report import Counts, Report
from contextos.jobs.kb.scan import Plan, Scan, Scanner, parts
from contextos.jobs.kb.tools import ReadOnlyDir
from contextos.jobs.kb.verify import LinkStatus, LinkVerdict, LinkVerifier, Reason

__all__ = [
    "Counts",
    "Delta",
    "Doubt",
    "Finding",
    "FindingKind",
    "FixOutcome",
    "Fixture",
    "Gated",
    "Index",
    "Judgement",
    "LinkStatus",
    "LinkVerdict",
    "LinkVerifier",
    "Occurrence",
    "Outcome",
    "Plan",
    "Proposal",
    "ReadOnlyDir",
    "Reason",
    "Report",
    "Rules",
    "SCANNER",
    "Scan",
    "ScanRequest",
    "Scanner",
    "Summary",
    "Suspect",
    "dedupe",
    "default_index",
    "fix_frontmatter",
    "fix_policy",
    "gate",
    "kb_scan",
    "kb_scan_workflow",
    "parts",
    "propose_frontmatter",
    "reduce",
    "scan_kb",
]
