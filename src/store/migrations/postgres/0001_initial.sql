-- sealgate schema, version 1. Records are kept as JSON text (not jsonb): text keeps every record byte for
-- byte, so a compare-and-set compares exactly what was read, and it accepts "\u0000" inside strings.

CREATE TABLE sessions (
    session_id text COLLATE "C" PRIMARY KEY,
    record text NOT NULL,
    -- When the record last changed (server clock, ms): a replica whose listener reconnects catches up
    -- on the changes it may have missed.
    changed_at_ms bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
);
CREATE INDEX sessions_by_change ON sessions (changed_at_ms);

-- A changed session (a revocation) is announced to every replica, which drops it from its cache.
CREATE FUNCTION sealgate_session_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_at_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    PERFORM pg_notify('sealgate_sessions', NEW.session_id);
    RETURN NEW;
END
$$;
CREATE TRIGGER sessions_changed BEFORE UPDATE ON sessions
    FOR EACH ROW EXECUTE FUNCTION sealgate_session_changed();

CREATE TABLE seen_signatures (
    signature bytea PRIMARY KEY,
    expires_at_ms bigint NOT NULL
);
CREATE INDEX seen_signatures_by_expiry ON seen_signatures (expires_at_ms);

CREATE TABLE claims (
    kind text COLLATE "C" NOT NULL,
    request_id text COLLATE "C" NOT NULL,
    claimed_at_ms bigint NOT NULL,
    record text NOT NULL,
    PRIMARY KEY (kind, request_id)
);
CREATE INDEX claims_by_time ON claims (claimed_at_ms, kind, request_id);

-- Rate windows and budgets: the same cell bytes as the embedded store.
CREATE TABLE counters (
    key text COLLATE "C" PRIMARY KEY,
    state bytea
);

CREATE TABLE contexts (
    name text COLLATE "C" PRIMARY KEY,
    record text NOT NULL
);

CREATE TABLE audit_events (
    seq bigint PRIMARY KEY,
    event text NOT NULL
);

-- The chain head: one row, locked by every append so that replicas extend one chain.
CREATE TABLE audit_head (
    id integer PRIMARY KEY CHECK (id = 1),
    seq bigint NOT NULL,
    hash text NOT NULL
);
INSERT INTO audit_head (id, seq, hash)
VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');
