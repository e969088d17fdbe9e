-- sealgate embedded schema, version 2 (SPEC 20 rule 3): the clock window that the replay records cover,
-- as the last start recorded it (one row, a JSON record: crate::replay::ReplayCover). The records
-- themselves stay in memory, rebuilt from the chain at start-up.
CREATE TABLE replay_cover (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    record TEXT NOT NULL
);
