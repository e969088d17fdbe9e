-- sealgate schema, version 3. Counter keys are bytes: a budget's key holds a NUL separator
-- ("budget\0<session>"), which a PostgreSQL text value cannot hold.

ALTER TABLE counters ALTER COLUMN key TYPE bytea USING convert_to(key, 'UTF8');
