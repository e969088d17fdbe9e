-- sealgate schema, version 6 (SPEC r3). The gauges of /metrics count a range of a small index instead of
-- decoding every record (SPEC 11 r3), and retention removes settled claims and decided approvals by index
-- (SPEC 12 r3). The columns are computed from each record by PostgreSQL itself, so no write path can
-- forget them; the embedded store keeps the same columns (migrations/sqlite/0001_initial.sql).
-- A stored answer may hold the escape "\u0000", which the JSON operators refuse; as "\u0001" it reads.

ALTER TABLE sessions ADD COLUMN live_until bigint GENERATED ALWAYS AS (
    CASE WHEN replace(record, '\u0000', '\u0001')::json ->> 'revoked_at_ms' IS NULL
         THEN (replace(record, '\u0000', '\u0001')::json ->> 'expires_at')::bigint END
) STORED;
CREATE INDEX sessions_live ON sessions (live_until) WHERE live_until IS NOT NULL;

ALTER TABLE claims ADD COLUMN pending boolean GENERATED ALWAYS AS (
    replace(record, '\u0000', '\u0001')::json ->> 'status' = 'PENDING'
) STORED;
CREATE INDEX claims_pending ON claims (claimed_at_ms) WHERE pending;

ALTER TABLE approvals ADD COLUMN pending boolean GENERATED ALWAYS AS (
    replace(record, '\u0000', '\u0001')::json ->> 'status' = 'pending'
) STORED;
CREATE INDEX approvals_pending ON approvals (requested_at_ms) WHERE pending;

-- Retention runs on one replica at a time: the holder of this lease until it runs out.
CREATE TABLE retention_lease (
    id integer PRIMARY KEY CHECK (id = 1),
    holder text NOT NULL,
    until_ms bigint NOT NULL
);
INSERT INTO retention_lease (id, holder, until_ms) VALUES (1, '', 0);
