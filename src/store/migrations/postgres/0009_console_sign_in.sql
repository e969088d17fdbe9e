-- sealgate schema, version 9 (SPEC 16): sign-ins in progress, found by their `state` and taken once, and
-- console sessions, found by the SHA-256 of their identifier (never the identifier itself), so that every
-- replica honours them. `ends_at_ms` is when a session ends unless it is used again.
CREATE TABLE sign_in_attempts (
    state text PRIMARY KEY,
    created_at_ms bigint NOT NULL,
    record text NOT NULL
);
CREATE TABLE console_sessions (
    id_hash text PRIMARY KEY,
    ends_at_ms bigint NOT NULL,
    record text NOT NULL
);
CREATE INDEX console_sessions_by_end ON console_sessions (ends_at_ms);
