-- sealgate schema, version 2. A change counter for the API-managed contexts: each replica polls this one
-- row (cheap) and reads the contexts again only when it moved (SPEC 12: context changes within 2 s).

CREATE TABLE contexts_version (
    id integer PRIMARY KEY CHECK (id = 1),
    version bigint NOT NULL
);
INSERT INTO contexts_version (id, version) VALUES (1, 0);

CREATE FUNCTION sealgate_contexts_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE contexts_version SET version = version + 1 WHERE id = 1;
    RETURN NULL;
END
$$;
CREATE TRIGGER contexts_changed AFTER INSERT OR UPDATE OR DELETE ON contexts
    FOR EACH STATEMENT EXECUTE FUNCTION sealgate_contexts_changed();
