-- sealgate embedded schema, version 1 (SQLite; PostgreSQL's migrations sit beside these, in ../postgres).
-- The records are the same JSON text as on PostgreSQL, and a compare-and-set compares that text. The shape
-- keeps a call's writes few and mostly at the end of a B-tree: audit events and claims are appended by
-- rowid; a claim is found through a compact index; replay records and rate windows are not stored here at
-- all (the embedded store keeps them in memory and rebuilds them from the chain at start-up).

CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    record TEXT NOT NULL,
    -- Expiry (Unix seconds) while the session is not revoked, NULL once it is: the live-sessions gauge
    -- counts a range of this index instead of reading every record.
    live_until INTEGER
);
CREATE INDEX sessions_live ON sessions (live_until) WHERE live_until IS NOT NULL;

CREATE TABLE claims (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    request_id TEXT NOT NULL,
    claimed_at_ms INTEGER NOT NULL,
    -- 1 while PENDING: the gauge and the listings of PENDING claims read this index only.
    pending INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE UNIQUE INDEX claims_by_request ON claims (kind, request_id);
CREATE INDEX claims_by_time ON claims (claimed_at_ms, kind, request_id);
CREATE INDEX claims_pending ON claims (claimed_at_ms) WHERE pending = 1;

-- Budgets: a session's count of allowed calls.
CREATE TABLE counters (
    key BLOB PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE contexts (
    name TEXT PRIMARY KEY,
    record TEXT NOT NULL
);

CREATE TABLE approvals (
    approval_id TEXT PRIMARY KEY,
    requested_at_ms INTEGER NOT NULL,
    pending INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX approvals_by_time ON approvals (requested_at_ms, approval_id);
CREATE INDEX approvals_pending ON approvals (requested_at_ms) WHERE pending = 1;

-- Per call (session and call digest), the id of its current approval request.
CREATE TABLE approval_calls (
    session_id TEXT NOT NULL,
    call_digest TEXT NOT NULL,
    approval_id TEXT NOT NULL,
    PRIMARY KEY (session_id, call_digest)
) WITHOUT ROWID;

-- The audit chain, one row per event, appended by seq in the same transaction as the state it describes.
CREATE TABLE audit_events (
    seq INTEGER PRIMARY KEY,
    event TEXT NOT NULL
);
