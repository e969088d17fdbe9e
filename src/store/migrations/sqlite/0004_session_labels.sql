-- sealgate embedded schema, version 4 (SPEC 19): the labels each session holds, with the seq of the completion
-- event that first brought each. Rows are written in the same transaction as that event (the audit batch), only
-- ever added, and never removed by retention (SPEC 20 rule 1): a session's labels outlive its archived events.
CREATE TABLE session_labels (
    session_id TEXT NOT NULL,
    label TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (session_id, label)
) WITHOUT ROWID;
