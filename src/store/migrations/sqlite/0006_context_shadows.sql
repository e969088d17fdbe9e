-- sealgate embedded schema (SPEC 6.4 r4): shadow versions of security contexts set through the API, apart
-- from the contexts in force so that a shadow is never read as one, and the tally of the calls each shadow
-- version decided, by tool and pair of decisions (calls decided alike are counted under the tool '').
CREATE TABLE context_shadows (
    name TEXT PRIMARY KEY,
    record TEXT NOT NULL
);
CREATE TABLE shadow_tallies (
    context TEXT NOT NULL,
    version TEXT NOT NULL,
    tool TEXT NOT NULL,
    live TEXT NOT NULL,
    shadow TEXT NOT NULL,
    calls INTEGER NOT NULL,
    first_at_ms INTEGER NOT NULL,
    PRIMARY KEY (context, version, tool, live, shadow)
);
