-- sealgate schema, version 10 (SPEC 19): the labels each session holds, with the seq of the completion event
-- that first brought each, shared by every replica. Rows are written by the statement that appends their event
-- (one transaction), only ever added (a label held keeps its first seq), and never removed by retention (SPEC
-- 20 rule 1).
CREATE TABLE session_labels (
    session_id text NOT NULL,
    label text NOT NULL,
    seq bigint NOT NULL,
    PRIMARY KEY (session_id, label)
);
