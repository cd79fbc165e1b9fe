"""The frontmatter fix: proposed with its blast radius, written only under an approval of that
exact list of files; a file added after the approval needs an approval of its own, and a
revoked approval writes nothing. Who may approve is the policy's `[roles]` table's to say."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextos import Policy, Runtime
from contextos.errors import ApprovalRefused, ConfigError
from contextos.jobs.kb import Report, fix_frontmatter, fix_policy, scan_kb

MISSING = ["decisions/0012-deploy-with-argo.md", "runbooks/compaction-stuck.md"]
"""The sample's pages without frontmatter (FAULTS.json)."""
PEOPLE = Policy(name="people", roles={"kb-editor": ("erin",), "support": ("mallory",)})
"""The policy that says who is who: erin edits the knowledge base, mallory does not."""


def has_frontmatter(kb: Path, page: str) -> bool:
    return (kb / page).read_text().startswith("---\n")


async def report_of(kb: Path, tmp: Path) -> Report:
    return (await scan_kb(kb, index=tmp / "index.db")).report


async def test_the_fix_writes_exactly_the_approved_list_and_asks_again_for_a_new_file(
    kb: Path, tmp_path: Path
) -> None:
    store = str(tmp_path / "runs.db")
    first = await fix_frontmatter(store, kb, await report_of(kb, tmp_path), policy=PEOPLE)
    assert first.written == []
    (asked,) = first.waiting
    assert asked.action is not None
    assert asked.action.arguments["files"] == MISSING
    assert "writes 2 file(s)" in asked.action.blast_radius
    assert not any(has_frontmatter(kb, p) for p in MISSING)  # nothing written yet

    async with Runtime(store, policy=fix_policy(PEOPLE)) as rt:
        with pytest.raises(ApprovalRefused):  # only an editor approves
            await rt.approve(asked.id, approver="mallory")
        await rt.approve(asked.id, approver="erin")

    # a third page without frontmatter appears after the approval
    (kb / "docs/new-page.md").write_text("# New page\n\nText.\n")
    second = await fix_frontmatter(store, kb, await report_of(kb, tmp_path), policy=PEOPLE)
    assert sorted(second.written) == MISSING
    assert all(has_frontmatter(kb, p) for p in MISSING)
    assert (kb / MISSING[1]).read_text().startswith('---\ntitle: "Compaction stuck"\n---\n')
    assert not has_frontmatter(kb, "docs/new-page.md")  # not covered by that approval
    (again,) = second.waiting
    assert again.action is not None and again.action.arguments["files"] == ["docs/new-page.md"]


async def test_a_revoked_approval_writes_nothing(kb: Path, tmp_path: Path) -> None:
    store = str(tmp_path / "runs.db")
    report = await report_of(kb, tmp_path)
    (asked,) = (await fix_frontmatter(store, kb, report, policy=PEOPLE)).waiting
    async with Runtime(store, policy=fix_policy(PEOPLE)) as rt:
        approval = await rt.approve(asked.id, approver="erin")
        await rt.revoke(approval.id, revoked_by="erin", reason="not today")

    after = await fix_frontmatter(store, kb, report, policy=PEOPLE)
    assert after.written == []
    assert not any(has_frontmatter(kb, p) for p in MISSING)
    (waiting,) = after.waiting  # it asks again, for the same list
    assert waiting.action is not None and waiting.action.arguments["files"] == MISSING


async def test_an_editor_whose_role_is_taken_away_before_the_fix_ran_approved_nothing(
    kb: Path, tmp_path: Path
) -> None:
    store = str(tmp_path / "runs.db")
    report = await report_of(kb, tmp_path)
    (asked,) = (await fix_frontmatter(store, kb, report, policy=PEOPLE)).waiting
    async with Runtime(store, policy=fix_policy(PEOPLE)) as rt:
        await rt.approve(asked.id, approver="erin")

    demoted = Policy(name="people", roles={"kb-editor": ("frank",)})
    after = await fix_frontmatter(store, kb, report, policy=demoted)
    assert after.written == []
    assert not any(has_frontmatter(kb, p) for p in MISSING)


def test_a_policy_naming_no_editor_is_refused_before_anything_is_proposed(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('name = "people"\n[roles]\nsupport = ["mallory"]\n')
    with pytest.raises(ConfigError, match="give someone the role kb-editor"):
        fix_policy(policy)
