-- sealgate embedded schema (SPEC 18): the pinned definition of each MCP upstream's tool, and the withheld
-- definitions already seen (one ToolDefinitionChanged event per definition). `tool` is the upstream's own
-- name; `record` is the pin as JSON.
CREATE TABLE tool_pins (
    upstream TEXT NOT NULL,
    tool TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (upstream, tool)
);
CREATE TABLE tool_sightings (
    upstream TEXT NOT NULL,
    tool TEXT NOT NULL,
    definition_sha256 TEXT NOT NULL,
    seen_at_ms INTEGER NOT NULL,
    PRIMARY KEY (upstream, tool, definition_sha256)
);
