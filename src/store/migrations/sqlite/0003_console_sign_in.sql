-- sealgate embedded schema, version 3 (SPEC 16): sign-ins in progress, found by their `state` and taken
-- once, and console sessions, found by the SHA-256 of their identifier (never the identifier itself).
-- `ends_at_ms` is when a session ends unless it is used again (its idle or its absolute end, the sooner).
CREATE TABLE sign_in_attempts (
    state TEXT PRIMARY KEY,
    created_at_ms INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE console_sessions (
    id_hash TEXT PRIMARY KEY,
    ends_at_ms INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX console_sessions_by_end ON console_sessions (ends_at_ms);
