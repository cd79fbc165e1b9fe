"""Ordered schema migrations per backend: the list index (from 1) is the schema version.

Never edit a released entry; append a new one.
"""

from __future__ import annotations

_TERMINAL = "('completed', 'failed', 'cancelled', 'expired')"


def is_terminal(column: str) -> str:
    """`column` names an ended status, as comparisons rather than an IN list.

    SQLite builds a temporary b-tree for an IN list of more than two constants each time the
    statement runs; on the append path (an UPDATE of the run's row and the triggers it fires)
    that cost more than the rest of the statement.
    """
    return "(" + " OR ".join(f"{column} = {s}" for s in _TERMINAL.strip("()").split(", ")) + ")"


SQLITE_MIGRATIONS: list[str] = [
    # 1: runs and their append-only event logs; terminal runs are frozen by the database itself.
    f"""
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    agent_name TEXT NOT NULL,
    agent_version TEXT NOT NULL,
    status TEXT NOT NULL,
    last_seq INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    turns INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0
);
CREATE INDEX runs_by_status ON runs (status, updated_at);
CREATE INDEX runs_by_update ON runs (updated_at);
-- A rowid table on purpose: WITHOUT ROWID tables spill rows over ~1 kB (a model answer with its
-- context lineage) into overflow pages, nearly doubling the file.
CREATE TABLE events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    occurred_at TEXT NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TRIGGER events_are_append_only_u BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_are_append_only_d BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER terminal_run_takes_no_events BEFORE INSERT ON events
WHEN (SELECT status FROM runs WHERE run_id = NEW.run_id) IN {_TERMINAL}
BEGIN SELECT RAISE(ABORT, 'run is terminal'); END;
CREATE TRIGGER terminal_run_status_is_final BEFORE UPDATE OF status ON runs
WHEN OLD.status IN {_TERMINAL}
BEGIN SELECT RAISE(ABORT, 'run is terminal'); END;
""",
    # 2: the run queue (priorities, idempotency keys, leases, durable timers), concurrency
    # limits, the worker registry and cron schedules. Times are UNIX seconds (REAL): one machine
    # shares one clock.
    """
CREATE TABLE run_queue (
    run_id TEXT PRIMARY KEY,
    priority INTEGER NOT NULL DEFAULT 0,
    tenant TEXT NOT NULL DEFAULT '',
    agent_name TEXT NOT NULL DEFAULT '',
    idempotency_key TEXT UNIQUE,
    enqueued_at REAL NOT NULL,
    not_before REAL,
    lease_owner TEXT,
    lease_token INTEGER NOT NULL DEFAULT 0,
    lease_expires_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX run_queue_by_owner ON run_queue (lease_owner);
CREATE TABLE concurrency_limits (
    scope TEXT NOT NULL CHECK (scope IN ('global', 'tenant', 'agent')),
    name TEXT NOT NULL,
    max_running INTEGER NOT NULL CHECK (max_running >= 0),
    PRIMARY KEY (scope, name)
);
CREATE TABLE workers (
    worker_id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    concurrency INTEGER NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);
CREATE TABLE schedules (
    name TEXT PRIMARY KEY,
    agent_ref TEXT NOT NULL,
    cron TEXT NOT NULL,
    input TEXT NOT NULL,
    timezone TEXT NOT NULL,
    catch_up TEXT NOT NULL CHECK (catch_up IN ('skip', 'run_once')),
    misfire_grace_s REAL NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    tenant TEXT NOT NULL DEFAULT '',
    next_tick_at REAL NOT NULL,
    last_tick_at REAL,
    last_run_id TEXT,
    created_at REAL NOT NULL
);
""",
    # 3: daily model usage per principal, derived from the event log by a trigger so it is
    # written in the same transaction as the events and can never drift from them. The
    # principal key mirrors contextos.middleware.base.principal_of; existing events backfill it.
    """
CREATE TABLE principal_usage (
    principal TEXT NOT NULL,
    day TEXT NOT NULL,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    calls INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (principal, day)
) WITHOUT ROWID;
CREATE TRIGGER principal_usage_from_events AFTER INSERT ON events
WHEN NEW.type IN ('model_responded', 'context_compacted')
BEGIN
    INSERT INTO principal_usage (principal, day, input_tokens, output_tokens, cost_usd, calls)
    SELECT
        coalesce(json_extract(CAST(c.payload AS TEXT), '$.metadata.principal'),
            coalesce(json_extract(CAST(c.payload AS TEXT), '$.metadata.tenant_id'), '-') || '/'
            || coalesce(json_extract(CAST(c.payload AS TEXT), '$.metadata.user_id'), '-')),
        substr(NEW.occurred_at, 1, 10),
        coalesce(json_extract(CAST(NEW.payload AS TEXT), '$.usage.input_tokens'), 0),
        coalesce(json_extract(CAST(NEW.payload AS TEXT), '$.usage.output_tokens'), 0),
        coalesce(json_extract(CAST(NEW.payload AS TEXT), '$.usage.cost_usd'), 0),
        1
    FROM events c WHERE c.run_id = NEW.run_id AND c.seq = 1
    ON CONFLICT (principal, day) DO UPDATE SET
        input_tokens = input_tokens + excluded.input_tokens,
        output_tokens = output_tokens + excluded.output_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        calls = calls + excluded.calls;
END;
INSERT INTO principal_usage (principal, day, input_tokens, output_tokens, cost_usd, calls)
SELECT
    coalesce(json_extract(CAST(c.payload AS TEXT), '$.metadata.principal'),
        coalesce(json_extract(CAST(c.payload AS TEXT), '$.metadata.tenant_id'), '-') || '/'
        || coalesce(json_extract(CAST(c.payload AS TEXT), '$.metadata.user_id'), '-')),
    substr(e.occurred_at, 1, 10),
    sum(coalesce(json_extract(CAST(e.payload AS TEXT), '$.usage.input_tokens'), 0)),
    sum(coalesce(json_extract(CAST(e.payload AS TEXT), '$.usage.output_tokens'), 0)),
    sum(coalesce(json_extract(CAST(e.payload AS TEXT), '$.usage.cost_usd'), 0)),
    count(*)
FROM events e JOIN events c ON c.run_id = e.run_id AND c.seq = 1
WHERE e.type IN ('model_responded', 'context_compacted')
GROUP BY 1, 2;
""",
    # 4: snapshots of a run's folded state, a cache that spares a load most of the log. One row
    # per run (the newest); `format` names the code that folded and encoded it, and a load
    # ignores a snapshot of another format. Not events: rewritten freely, even for ended runs.
    """
CREATE TABLE snapshots (
    run_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    format TEXT NOT NULL,
    state BLOB NOT NULL,
    written_at TEXT NOT NULL DEFAULT (datetime('now'))
);
""",
    # 5: triggers (a run of an agent started when a run of another agent ends, or by a
    # webhook) and the firings they still owe. A firing is written by the database in the same
    # transaction as the run's ending, so no ending is lost whoever ended the run; workers
    # delete it once the triggered run is started. Times are UNIX seconds (REAL).
    f"""
CREATE TABLE triggers (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('run', 'webhook')),
    agent_ref TEXT NOT NULL,
    agent_name TEXT NOT NULL,
    source_agent TEXT,
    on_status TEXT NOT NULL CHECK (on_status IN ('completed', 'failed', 'any')),
    input_template TEXT,
    secret_env TEXT,
    allow_cycle INTEGER NOT NULL DEFAULT 0,
    max_depth INTEGER NOT NULL DEFAULT 10,
    priority INTEGER NOT NULL DEFAULT 0,
    tenant TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL
);
CREATE INDEX triggers_by_source ON triggers (source_agent);
CREATE TABLE trigger_firings (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    trigger_name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    not_before REAL,
    UNIQUE (trigger_name, run_id)
);
CREATE INDEX trigger_firings_by_run ON trigger_firings (run_id);
CREATE TRIGGER trigger_firings_on_end AFTER UPDATE OF status ON runs
WHEN NEW.status IN {_TERMINAL} AND OLD.status NOT IN {_TERMINAL}
BEGIN
    INSERT OR IGNORE INTO trigger_firings (trigger_name, run_id, status)
    SELECT name, NEW.run_id, NEW.status FROM triggers
    WHERE kind = 'run' AND source_agent = NEW.agent_name
      AND (on_status = 'any' OR on_status = NEW.status
           OR (on_status = 'failed' AND NEW.status = 'expired'));
END;
""",
    # 6: a run's row and its log stay as written whatever SQL reaches them, not only an UPDATE
    # of the status. REPLACE deletes the row it collides with without firing DELETE triggers,
    # so an insert is refused outright where it would land on a recorded event, or recreate a
    # run that has events. Runs are never deleted; a terminal run's row never changes at all,
    # and no run's id ever changes (UPDATE OR REPLACE of an id deletes the row it lands on).
    f"""
CREATE TRIGGER events_are_never_replaced BEFORE INSERT ON events
WHEN EXISTS (SELECT 1 FROM events WHERE run_id = NEW.run_id AND seq = NEW.seq)
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER runs_are_never_deleted BEFORE DELETE ON runs
BEGIN SELECT RAISE(ABORT, 'runs are never deleted'); END;
CREATE TRIGGER runs_with_events_are_never_recreated BEFORE INSERT ON runs
WHEN EXISTS (SELECT 1 FROM events WHERE run_id = NEW.run_id)
BEGIN SELECT RAISE(ABORT, 'the run already has events'); END;
CREATE TRIGGER run_ids_are_final BEFORE UPDATE OF run_id ON runs
WHEN NEW.run_id IS NOT OLD.run_id
BEGIN SELECT RAISE(ABORT, 'a run id never changes'); END;
DROP TRIGGER terminal_run_status_is_final;
CREATE TRIGGER terminal_run_is_final BEFORE UPDATE ON runs
WHEN OLD.status IN {_TERMINAL}
BEGIN SELECT RAISE(ABORT, 'run is terminal'); END;
""",
    # 7: the daily usage counters only ever grow: an event whose usage is negative (written
    # by code that did not check a provider's numbers) adds nothing instead of a credit.
    """
DROP TRIGGER principal_usage_from_events;
CREATE TRIGGER principal_usage_from_events AFTER INSERT ON events
WHEN NEW.type IN ('model_responded', 'context_compacted')
BEGIN
    INSERT INTO principal_usage (principal, day, input_tokens, output_tokens, cost_usd, calls)
    SELECT
        coalesce(json_extract(CAST(c.payload AS TEXT), '$.metadata.principal'),
            coalesce(json_extract(CAST(c.payload AS TEXT), '$.metadata.tenant_id'), '-') || '/'
            || coalesce(json_extract(CAST(c.payload AS TEXT), '$.metadata.user_id'), '-')),
        substr(NEW.occurred_at, 1, 10),
        max(0, coalesce(json_extract(CAST(NEW.payload AS TEXT), '$.usage.input_tokens'), 0)),
        max(0, coalesce(json_extract(CAST(NEW.payload AS TEXT), '$.usage.output_tokens'), 0)),
        max(0, coalesce(json_extract(CAST(NEW.payload AS TEXT), '$.usage.cost_usd'), 0)),
        1
    FROM events c WHERE c.run_id = NEW.run_id AND c.seq = 1
    ON CONFLICT (principal, day) DO UPDATE SET
        input_tokens = input_tokens + excluded.input_tokens,
        output_tokens = output_tokens + excluded.output_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        calls = calls + excluded.calls;
END;
""",
    # 8: API tokens: each acts for one user of one tenant with the roles and scopes it was
    # issued with. Only a hash of the secret is kept; a revoked token stays, marked.
    """
CREATE TABLE api_tokens (
    token_id TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    roles TEXT NOT NULL,
    scopes TEXT NOT NULL,
    label TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    revoked_at REAL
);
""",
    # 9: artifacts and the content-addressed blobs they name (store/artifacts.py). A blob is
    # stored once per sha256; both tables are append-only, like the log.
    """
CREATE TABLE blobs (
    sha256 TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    content BLOB NOT NULL
);
CREATE TABLE artifacts (
    artifact_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    type TEXT NOT NULL,
    schema_version TEXT NOT NULL,
    content_hash TEXT NOT NULL REFERENCES blobs (sha256),
    media_type TEXT NOT NULL,
    classification TEXT NOT NULL,
    policy_snapshot TEXT NOT NULL,
    lineage TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX artifacts_by_run ON artifacts (run_id, created_at);
CREATE TRIGGER blobs_are_append_only_u BEFORE UPDATE ON blobs
BEGIN SELECT RAISE(ABORT, 'artifacts are append-only'); END;
CREATE TRIGGER blobs_are_append_only_d BEFORE DELETE ON blobs
BEGIN SELECT RAISE(ABORT, 'artifacts are append-only'); END;
CREATE TRIGGER artifacts_are_append_only_u BEFORE UPDATE ON artifacts
BEGIN SELECT RAISE(ABORT, 'artifacts are append-only'); END;
CREATE TRIGGER artifacts_are_append_only_d BEFORE DELETE ON artifacts
BEGIN SELECT RAISE(ABORT, 'artifacts are append-only'); END;
""",  # 10: the same guards as migrations 1, 5 and 6, with their status tests written as
    # comparisons (see is_terminal): every append runs them.
    f"""
DROP TRIGGER terminal_run_takes_no_events;
CREATE TRIGGER terminal_run_takes_no_events BEFORE INSERT ON events
WHEN EXISTS (SELECT 1 FROM runs WHERE run_id = NEW.run_id AND {is_terminal("status")})
BEGIN SELECT RAISE(ABORT, 'run is terminal'); END;
DROP TRIGGER terminal_run_is_final;
CREATE TRIGGER terminal_run_is_final BEFORE UPDATE ON runs
WHEN {is_terminal("OLD.status")}
BEGIN SELECT RAISE(ABORT, 'run is terminal'); END;
DROP TRIGGER trigger_firings_on_end;
CREATE TRIGGER trigger_firings_on_end AFTER UPDATE OF status ON runs
WHEN {is_terminal("NEW.status")} AND NOT {is_terminal("OLD.status")}
BEGIN
    INSERT OR IGNORE INTO trigger_firings (trigger_name, run_id, status)
    SELECT name, NEW.run_id, NEW.status FROM triggers
    WHERE kind = 'run' AND source_agent = NEW.agent_name
      AND (on_status = 'any' OR on_status = NEW.status
           OR (on_status = 'failed' AND NEW.status = 'expired'));
END;
""",
]


POSTGRES_MIGRATIONS: list[str] = [
    # 1: runs and their append-only event logs; terminal runs are frozen by the database itself.
    f"""
CREATE TABLE runs (
    run_id text PRIMARY KEY,
    agent_name text NOT NULL,
    agent_version text NOT NULL,
    status text NOT NULL,
    last_seq bigint NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    turns integer NOT NULL DEFAULT 0,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cost_usd double precision NOT NULL DEFAULT 0
);
CREATE INDEX runs_by_status ON runs (status, updated_at);
CREATE INDEX runs_by_update ON runs (updated_at);
CREATE TABLE events (
    run_id text NOT NULL,
    seq bigint NOT NULL,
    type text NOT NULL,
    schema_version integer NOT NULL,
    occurred_at timestamptz NOT NULL,
    payload bytea NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE FUNCTION contextos_events_are_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only';
END $$;
CREATE TRIGGER events_are_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION contextos_events_are_append_only();
CREATE TRIGGER events_are_never_truncated BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION contextos_events_are_append_only();
-- An append moves the run's row and inserts its events in one statement, so the events of
-- the batch that ends a run may meet the row already terminal: only events past the run's
-- last seq are refused.
CREATE FUNCTION contextos_terminal_run_takes_no_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM runs WHERE run_id = NEW.run_id
               AND status IN {_TERMINAL} AND NEW.seq > last_seq) THEN
        RAISE EXCEPTION 'run % is terminal', NEW.run_id;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER terminal_run_takes_no_events BEFORE INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION contextos_terminal_run_takes_no_events();
CREATE FUNCTION contextos_terminal_run_status_is_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run % is terminal', OLD.run_id;
END $$;
CREATE TRIGGER terminal_run_status_is_final BEFORE UPDATE OF status ON runs
    FOR EACH ROW WHEN (OLD.status IN {_TERMINAL})
    EXECUTE FUNCTION contextos_terminal_run_status_is_final();
""",
    # 2: the run queue (priorities, idempotency keys, leases, durable timers), concurrency
    # limits, the worker registry and cron schedules. Lease times come from the database's
    # clock, so workers on many machines agree on when a lease has expired.
    """
CREATE TABLE run_queue (
    run_id text PRIMARY KEY,
    priority integer NOT NULL DEFAULT 0,
    tenant text NOT NULL DEFAULT '',
    agent_name text NOT NULL DEFAULT '',
    idempotency_key text UNIQUE,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    not_before timestamptz,
    lease_owner text,
    lease_token bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    attempts integer NOT NULL DEFAULT 0
);
CREATE INDEX run_queue_by_owner ON run_queue (lease_owner) WHERE lease_owner IS NOT NULL;
CREATE TABLE concurrency_limits (
    scope text NOT NULL CHECK (scope IN ('global', 'tenant', 'agent')),
    name text NOT NULL,
    max_running integer NOT NULL CHECK (max_running >= 0),
    PRIMARY KEY (scope, name)
);
CREATE TABLE workers (
    worker_id text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    concurrency integer NOT NULL,
    status text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE schedules (
    name text PRIMARY KEY,
    agent_ref text NOT NULL,
    cron text NOT NULL,
    input text NOT NULL,
    timezone text NOT NULL,
    catch_up text NOT NULL CHECK (catch_up IN ('skip', 'run_once')),
    misfire_grace_s double precision NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    tenant text NOT NULL DEFAULT '',
    next_tick_at timestamptz NOT NULL,
    last_tick_at timestamptz,
    last_run_id text,
    created_at timestamptz NOT NULL DEFAULT now()
);
""",
    # 3: daily model usage per principal, as SQLite's migration 3: derived from the event log by
    # a trigger, in the same transaction as the events. PostgreSQL text cannot hold NUL, so
    # `contextos_json` reads a payload with its \u0000 escapes made harmless first: a model
    # answer with a NUL in it must not fail its append.
    r"""
CREATE FUNCTION contextos_json(payload bytea) RETURNS json LANGUAGE sql IMMUTABLE AS $$
    SELECT replace(convert_from(payload, 'UTF8'), '\u0000', '\ufffd')::json
$$;
CREATE TABLE principal_usage (
    principal text NOT NULL,
    day text NOT NULL,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cost_usd double precision NOT NULL DEFAULT 0,
    calls bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (principal, day)
);
CREATE FUNCTION contextos_principal_of(created bytea) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(m ->> 'principal',
                    coalesce(m ->> 'tenant_id', '-') || '/' || coalesce(m ->> 'user_id', '-'))
    FROM (SELECT contextos_json(created) -> 'metadata' AS m) AS x
$$;
CREATE FUNCTION contextos_principal_usage() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    usage json := contextos_json(NEW.payload) -> 'usage';
BEGIN
    INSERT INTO principal_usage AS u (principal, day, input_tokens, output_tokens, cost_usd, calls)
    SELECT contextos_principal_of(c.payload),
           to_char(NEW.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD'),
           coalesce((usage ->> 'input_tokens')::bigint, 0),
           coalesce((usage ->> 'output_tokens')::bigint, 0),
           coalesce((usage ->> 'cost_usd')::double precision, 0),
           1
    FROM events c WHERE c.run_id = NEW.run_id AND c.seq = 1
    ON CONFLICT (principal, day) DO UPDATE SET
        input_tokens = u.input_tokens + EXCLUDED.input_tokens,
        output_tokens = u.output_tokens + EXCLUDED.output_tokens,
        cost_usd = u.cost_usd + EXCLUDED.cost_usd,
        calls = u.calls + EXCLUDED.calls;
    RETURN NULL;
END $$;
CREATE TRIGGER principal_usage_from_events AFTER INSERT ON events
    FOR EACH ROW WHEN (NEW.type IN ('model_responded', 'context_compacted'))
    EXECUTE FUNCTION contextos_principal_usage();
INSERT INTO principal_usage (principal, day, input_tokens, output_tokens, cost_usd, calls)
SELECT contextos_principal_of(c.payload),
       to_char(e.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD'),
       sum(coalesce((e.usage ->> 'input_tokens')::bigint, 0)),
       sum(coalesce((e.usage ->> 'output_tokens')::bigint, 0)),
       sum(coalesce((e.usage ->> 'cost_usd')::double precision, 0)),
       count(*)
FROM (SELECT run_id, occurred_at, contextos_json(payload) -> 'usage' AS usage
      FROM events WHERE type IN ('model_responded', 'context_compacted')) AS e
JOIN events c ON c.run_id = e.run_id AND c.seq = 1
GROUP BY 1, 2;
""",
    # 4: snapshots of a run's folded state, as SQLite's migration 4.
    """
CREATE TABLE snapshots (
    run_id text PRIMARY KEY,
    seq bigint NOT NULL,
    format text NOT NULL,
    state bytea NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
""",
    # 5: triggers and the firings they still owe, as SQLite's migration 5. Runs the first
    # append creates already ended (one batch from RunCreated to the end) fire too.
    f"""
CREATE TABLE triggers (
    name text PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('run', 'webhook')),
    agent_ref text NOT NULL,
    agent_name text NOT NULL,
    source_agent text,
    on_status text NOT NULL CHECK (on_status IN ('completed', 'failed', 'any')),
    input_template text,
    secret_env text,
    allow_cycle boolean NOT NULL DEFAULT false,
    max_depth integer NOT NULL DEFAULT 10,
    priority integer NOT NULL DEFAULT 0,
    tenant text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX triggers_by_source ON triggers (source_agent) WHERE kind = 'run';
CREATE TABLE trigger_firings (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trigger_name text NOT NULL,
    run_id text NOT NULL,
    status text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    not_before timestamptz,
    UNIQUE (trigger_name, run_id)
);
CREATE INDEX trigger_firings_by_run ON trigger_firings (run_id);
CREATE FUNCTION contextos_trigger_firings() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO trigger_firings (trigger_name, run_id, status)
    SELECT name, NEW.run_id, NEW.status FROM triggers
    WHERE kind = 'run' AND source_agent = NEW.agent_name
      AND (on_status = 'any' OR on_status = NEW.status
           OR (on_status = 'failed' AND NEW.status = 'expired'))
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER trigger_firings_on_end AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (NEW.status IN {_TERMINAL} AND OLD.status NOT IN {_TERMINAL})
    EXECUTE FUNCTION contextos_trigger_firings();
CREATE TRIGGER trigger_firings_on_create AFTER INSERT ON runs
    FOR EACH ROW WHEN (NEW.status IN {_TERMINAL})
    EXECUTE FUNCTION contextos_trigger_firings();
""",
    # 6: wake idle workers (LISTEN contextos_work) when work becomes ready, from the same
    # transaction: a rolled-back start wakes nobody, and a committed one is claimable when the
    # wake-up arrives. A run is ready when it is created, when a person's answer puts it back
    # in the queue, and when its lease is given back; a new schedule may tick sooner than any
    # a worker knows of. Payload: `KIND SCHEMA` (the channel is shared by all schemas).
    """
CREATE FUNCTION contextos_work_ready() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('contextos_work', TG_ARGV[0] || ' ' || TG_TABLE_SCHEMA);
    RETURN NULL;
END $$;
CREATE TRIGGER work_ready_on_create AFTER INSERT ON runs
    FOR EACH ROW WHEN (NEW.status IN ('queued', 'running'))
    EXECUTE FUNCTION contextos_work_ready('runs');
CREATE TRIGGER work_ready_on_answer AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (NEW.status IN ('queued', 'running')
                       AND OLD.status NOT IN ('queued', 'running'))
    EXECUTE FUNCTION contextos_work_ready('runs');
CREATE TRIGGER work_ready_on_release AFTER UPDATE OF lease_owner ON run_queue
    FOR EACH ROW WHEN (NEW.lease_owner IS NULL AND OLD.lease_owner IS NOT NULL)
    EXECUTE FUNCTION contextos_work_ready('runs');
CREATE TRIGGER work_ready_on_schedule AFTER INSERT ON schedules
    FOR EACH ROW EXECUTE FUNCTION contextos_work_ready('schedules');
""",
    # 7: as SQLite's migration 6. Here a DELETE (or TRUNCATE) of a run's row and a new INSERT
    # would reopen it, so runs are never deleted; with the row always in place, inserting it
    # again fails on the key, or updates it through ON CONFLICT. A terminal run's row never
    # changes at all (its last seq included), and no run's id ever changes. A terminal run takes
    # only the events of the append that ended it, which may meet its row already terminal
    # (migration 1): each must follow the run's last stored event without passing its final
    # seq, so no later insert fits, not even into a gap or below seq 1.
    f"""
CREATE FUNCTION contextos_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', TG_ARGV[0];
END $$;
CREATE TRIGGER runs_are_never_deleted BEFORE DELETE ON runs
    FOR EACH ROW EXECUTE FUNCTION contextos_refuse('runs are never deleted');
CREATE TRIGGER runs_are_never_truncated BEFORE TRUNCATE ON runs
    FOR EACH STATEMENT EXECUTE FUNCTION contextos_refuse('runs are never deleted');
CREATE TRIGGER run_ids_are_final BEFORE UPDATE OF run_id ON runs
    FOR EACH ROW WHEN (NEW.run_id IS DISTINCT FROM OLD.run_id)
    EXECUTE FUNCTION contextos_refuse('a run id never changes');
DROP TRIGGER terminal_run_status_is_final ON runs;
CREATE TRIGGER terminal_run_is_final BEFORE UPDATE ON runs
    FOR EACH ROW WHEN (OLD.status IN {_TERMINAL})
    EXECUTE FUNCTION contextos_terminal_run_status_is_final();
CREATE OR REPLACE FUNCTION contextos_terminal_run_takes_no_events() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    final_seq bigint;
BEGIN
    SELECT last_seq INTO final_seq FROM runs
    WHERE run_id = NEW.run_id AND status IN {_TERMINAL};
    IF FOUND AND (NEW.seq > final_seq OR NEW.seq <= (
            SELECT coalesce(max(seq), 0) FROM events WHERE run_id = NEW.run_id)) THEN
        RAISE EXCEPTION 'run % is terminal', NEW.run_id;
    END IF;
    RETURN NEW;
END $$;
""",
    # 8: the daily usage counters only ever grow, as SQLite's migration 7.
    """
CREATE OR REPLACE FUNCTION contextos_principal_usage() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    usage json := contextos_json(NEW.payload) -> 'usage';
BEGIN
    INSERT INTO principal_usage AS u (principal, day, input_tokens, output_tokens, cost_usd, calls)
    SELECT contextos_principal_of(c.payload),
           to_char(NEW.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD'),
           greatest(coalesce((usage ->> 'input_tokens')::bigint, 0), 0),
           greatest(coalesce((usage ->> 'output_tokens')::bigint, 0), 0),
           greatest(coalesce((usage ->> 'cost_usd')::double precision, 0), 0),
           1
    FROM events c WHERE c.run_id = NEW.run_id AND c.seq = 1
    ON CONFLICT (principal, day) DO UPDATE SET
        input_tokens = u.input_tokens + EXCLUDED.input_tokens,
        output_tokens = u.output_tokens + EXCLUDED.output_tokens,
        cost_usd = u.cost_usd + EXCLUDED.cost_usd,
        calls = u.calls + EXCLUDED.calls;
    RETURN NULL;
END $$;
""",
    # 9: API tokens, as SQLite's migration 8.
    """
CREATE TABLE api_tokens (
    token_id text PRIMARY KEY,
    secret_hash text NOT NULL,
    tenant text NOT NULL,
    user_id text NOT NULL,
    roles text NOT NULL,
    scopes text NOT NULL,
    label text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    revoked_at timestamptz
);
""",
    # 10: artifacts and their blobs, as SQLite's migration 9.
    """
CREATE TABLE blobs (
    sha256 text PRIMARY KEY,
    size bigint NOT NULL,
    content bytea NOT NULL
);
CREATE TABLE artifacts (
    artifact_id text PRIMARY KEY,
    run_id text NOT NULL,
    type text NOT NULL,
    schema_version text NOT NULL,
    content_hash text NOT NULL REFERENCES blobs (sha256),
    media_type text NOT NULL,
    classification text NOT NULL,
    policy_snapshot text NOT NULL,
    lineage text NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX artifacts_by_run ON artifacts (run_id, created_at);
CREATE TRIGGER blobs_are_append_only BEFORE UPDATE OR DELETE ON blobs
    FOR EACH ROW EXECUTE FUNCTION contextos_refuse('artifacts are append-only');
CREATE TRIGGER blobs_are_never_truncated BEFORE TRUNCATE ON blobs
    FOR EACH STATEMENT EXECUTE FUNCTION contextos_refuse('artifacts are append-only');
CREATE TRIGGER artifacts_are_append_only BEFORE UPDATE OR DELETE ON artifacts
    FOR EACH ROW EXECUTE FUNCTION contextos_refuse('artifacts are append-only');
CREATE TRIGGER artifacts_are_never_truncated BEFORE TRUNCATE ON artifacts
    FOR EACH STATEMENT EXECUTE FUNCTION contextos_refuse('artifacts are append-only');
""",
    # 11: run ids compared byte by byte, whatever the database's collation, so that the runs
    # whose id starts with a prefix are a range of this index (`list_runs(prefix=…)`).
    """
CREATE INDEX runs_by_id_bytes ON runs (run_id text_pattern_ops);
""",
]
