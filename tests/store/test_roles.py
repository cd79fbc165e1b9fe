"""The PostgreSQL store run as a role that may only read and write rows (docs/deploying.md).

The roles, the schema and the grants come from the statements in the guide, run as they are
(with names of the test's own) against the real server: one role owns the schema and migrates
it with `contextos migrate`, the other drives runs and cannot touch the schema or its triggers.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from contextos import Runtime, load_agent
from contextos import events as ev
from contextos.errors import MigrationError, RunIsTerminal
from contextos.runs import RunStatus
from contextos.store import open_store
from contextos.store.migrations import POSTGRES_MIGRATIONS
from contextos.store.queue import LimitScope, Trigger, TriggerKind, queue_of
from contextos.workers import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
QUICK = f"{ROOT / 'tests' / 'workers' / 'agents.py'}:quick"
PASSWORDS = {"contextos_owner": "owner-secret", "contextos_runtime": "runtime-secret"}
"""As the guide creates them (a server that trusts loopback ignores them)."""


def guide() -> tuple[str, str, str]:
    """The guide's statements: the administrator's, the owner's migrate command, the grants."""
    text = (ROOT / "docs" / "deploying.md").read_text()
    section = text[text.index("### Running with a role that cannot") :]
    section = section[: section.index("\n#", 1)]
    admin, grants = re.findall(r"```sql\n(.*?)```", section, re.S)
    (migrate,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    return admin, migrate, grants


@dataclass(frozen=True, slots=True)
class Deployment:
    """A schema owned by one new role and used by another, on the test server."""

    names: dict[str, str]
    """The guide's role and schema names -> this test's."""
    urls: dict[str, str]
    """The guide's role names -> a store URL connecting as that role."""

    def localise(self, text: str) -> str:
        for guide_name, name in self.names.items():
            text = re.sub(rf"\b{guide_name}\b", name, text)
        return text

    def sql(self, role: str, script: str) -> None:
        import psycopg

        with psycopg.connect(self.urls[role], autocommit=True) as conn:
            conn.execute(self.localise(script).encode())


def store_url(server_url: str, role: str, password: str, schema: str) -> str:
    """The test server's URL, connecting as `role`, with its tables in `schema`."""
    parts = urlsplit(server_url)
    netloc = f"{role}:{password}@{parts.netloc.split('@')[-1]}"
    query = "&".join(q for q in (parts.query, f"options={quote(f'-csearch_path={schema}')}") if q)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


@pytest.fixture
def deployment(postgres_server: str) -> Iterator[Deployment]:
    import psycopg

    tag = uuid.uuid4().hex[:12]
    names = {
        "contextos_owner": f"o_{tag}",
        "contextos_runtime": f"r_{tag}",
        "contextos": f"s_{tag}",
    }
    urls = {
        role: store_url(postgres_server, names[role], pw, names["contextos"])
        for role, pw in PASSWORDS.items()
    }
    deployed = Deployment(names=names, urls=urls)
    admin, _, _ = guide()
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(deployed.localise(admin).encode())
    try:
        yield deployed
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {names['contextos']} CASCADE")  # type: ignore[arg-type]
            for role in PASSWORDS:
                conn.execute(f"DROP OWNED BY {names[role]}")  # type: ignore[arg-type]
                conn.execute(f"DROP ROLE {names[role]}")  # type: ignore[arg-type]


def migrate_as_owner(deployed: Deployment) -> subprocess.CompletedProcess[str]:
    """The guide's `contextos migrate` command, as a real process, on the test's schema."""
    _, command, _ = guide()
    args = shlex.split(command.replace("\\\n", " "))
    assert args[:2] == ["contextos", "migrate"]
    args = [deployed.urls["contextos_owner"] if a.startswith("postgresql://") else a for a in args]
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args[1:]],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_the_runtime_role_drives_runs_and_cannot_touch_the_schema(
    deployment: Deployment,
) -> None:
    runtime_url = deployment.urls["contextos_runtime"]

    # Before the owner migrates, the runtime role may not create the schema, and says so.
    early = open_store(runtime_url)
    try:
        with pytest.raises(MigrationError, match=r"run `contextos migrate` as the role"):
            await early.list_runs()
    finally:
        await early.close()

    migrated = migrate_as_owner(deployment)
    assert migrated.returncode == 0, migrated.stderr
    assert f"schema at version {len(POSTGRES_MIGRATIONS)}" in migrated.stdout
    _, _, grants = guide()
    deployment.sql("contextos_owner", grants)

    # Everything the runtime does, as the runtime role: a run driven here, a run started and
    # driven by a worker, a limit, a trigger and the run its firing starts.
    agent = load_agent(QUICK)
    async with Runtime(runtime_url, worker_id="starter") as rt:
        here = await rt.run(agent, "check A-1", agent_ref=QUICK)
        assert here.status is RunStatus.COMPLETED, here
        queue = queue_of(rt.store)
        assert queue is not None
        await queue.set_limit(LimitScope.AGENT, "quick", 2)
        await queue.add_trigger(
            Trigger(
                name="again",
                kind=TriggerKind.RUN,
                agent_ref=QUICK,
                agent_name="quick",
                source_agent="quick",
                max_depth=1,
                allow_cycle=True,
            )
        )
        started = await rt.start(agent, "check A-1 later", agent_ref=QUICK)
        worker = Worker(
            runtime_url,
            config=WorkerConfig(poll_s=0.05, lease_s=5.0, heartbeat_s=0.5, trigger_poll_s=0.1),
            worker_id="w1",
        )
        task = asyncio.create_task(worker.run())
        try:
            for _ in range(1200):  # a hang fails here, after a minute; no timing is asserted
                runs = await rt.store.list_runs()
                if len(runs) == 3 and all(r.status.is_terminal for r in runs):
                    break
                await asyncio.sleep(0.05)
        finally:
            worker.stop()
            await task
        runs = await rt.store.list_runs()
        assert [r.status for r in runs] == [RunStatus.COMPLETED] * 3, runs
        assert started in {r.run_id for r in runs}
        last = (await rt.store.get_run(started)).last_seq
        late = ev.UserMessageAdded(run_id=started, seq=last + 1, content="late")
        with pytest.raises(RunIsTerminal):
            await rt.store.append(started, [late], expected_seq=last)

    # What the runtime role cannot do, triggers or not.
    refused = [
        "UPDATE events SET type = 'x'",
        "DELETE FROM events",
        "TRUNCATE events",
        "DELETE FROM runs",
        "TRUNCATE runs",
        "ALTER TABLE events DISABLE TRIGGER ALL",
        "DROP TRIGGER events_are_append_only ON events",
        "DROP TABLE events",
        "CREATE TABLE contextos.shadow (x int)",
        "CREATE OR REPLACE FUNCTION contextos.contextos_refuse() RETURNS trigger"
        " LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
        "SET session_replication_role = replica",
    ]
    assert let_through(deployment, "contextos_runtime", refused) == []

    # The owner still can, as the guide says: here inside a transaction that is rolled back.
    assert let_through(
        deployment,
        "contextos_owner",
        ["BEGIN; ALTER TABLE events DISABLE TRIGGER events_are_append_only; ROLLBACK"],
    ) == ["BEGIN; ALTER TABLE events DISABLE TRIGGER events_are_append_only; ROLLBACK"]


def let_through(deployed: Deployment, role: str, statements: list[str]) -> list[str]:
    """The statements `role` was allowed to run."""
    import psycopg

    passed = []
    with psycopg.connect(deployed.urls[role], autocommit=True) as conn:
        for sql in statements:
            try:
                conn.execute(deployed.localise(sql).encode())
            except psycopg.Error:
                continue
            passed.append(sql)
    return passed
