-- sealgate schema (SPEC 18): the pinned definition of each MCP upstream's tool, shared by replicas, and the
-- withheld definitions already seen, so that one ToolDefinitionChanged event is written per definition
-- whichever replica sees it first. `tool` is the upstream's own name; `record` is the pin as JSON.
CREATE TABLE tool_pins (
    upstream text NOT NULL,
    tool text NOT NULL,
    record text NOT NULL,
    PRIMARY KEY (upstream, tool)
);
CREATE TABLE tool_sightings (
    upstream text NOT NULL,
    tool text NOT NULL,
    definition_sha256 text NOT NULL,
    seen_at_ms bigint NOT NULL,
    PRIMARY KEY (upstream, tool, definition_sha256)
);
