-- sealgate schema, version 8 (SPEC 20 rule 3): the clock window that the replay records in
-- seen_signatures cover, as the last start recorded it (one row, a JSON record: crate::replay::ReplayCover).
CREATE TABLE replay_cover (
    id integer PRIMARY KEY CHECK (id = 1),
    record text NOT NULL
);
