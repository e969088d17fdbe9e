-- sealgate schema (SPEC 6.4 r4): shadow versions of security contexts set through the API, apart from the
-- contexts in force so that a shadow is never read as one, and the tally of the calls each shadow version
-- decided on any replica, by tool and pair of decisions (calls decided alike are counted under the tool '').
-- A shadow change moves the contexts' change counter, so replicas apply it with the same poll.
CREATE TABLE context_shadows (
    name text PRIMARY KEY,
    record text NOT NULL
);
CREATE TRIGGER context_shadows_changed AFTER INSERT OR UPDATE OR DELETE ON context_shadows
    FOR EACH STATEMENT EXECUTE FUNCTION sealgate_contexts_changed();
CREATE TABLE shadow_tallies (
    context text NOT NULL,
    version text NOT NULL,
    tool text NOT NULL,
    live text NOT NULL,
    shadow text NOT NULL,
    calls bigint NOT NULL,
    first_at_ms bigint NOT NULL,
    PRIMARY KEY (context, version, tool, live, shadow)
);
