-- sealgate schema, version 4. Approval requests (SPEC 13): each record as JSON text (compare-and-set on
-- the text, as for claims), and per call (session and call digest) the id of its current request, which
-- a new request replaces only by a conditional UPDATE, so that replicas never make two at once.

CREATE TABLE approvals (
    approval_id text COLLATE "C" PRIMARY KEY,
    requested_at_ms bigint NOT NULL,
    record text NOT NULL
);
CREATE INDEX approvals_by_time ON approvals (requested_at_ms, approval_id);

CREATE TABLE approval_calls (
    session_id text COLLATE "C" NOT NULL,
    call_digest text COLLATE "C" NOT NULL,
    approval_id text COLLATE "C" NOT NULL,
    PRIMARY KEY (session_id, call_digest)
);
