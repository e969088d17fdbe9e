-- sealgate schema, version 5. The public keys that replicas sign receipts and audit checkpoints with
-- (SPEC 14): each replica adds its own at start-up, and every replica's GET /v1/keys lists them all, so that
-- whatever any replica signed verifies with the set that any replica serves.

CREATE TABLE signing_keys (
    kid text COLLATE "C" PRIMARY KEY,
    public_key bytea NOT NULL CHECK (octet_length(public_key) = 32),
    replica_id text NOT NULL,
    published_at timestamptz NOT NULL DEFAULT now()
);
