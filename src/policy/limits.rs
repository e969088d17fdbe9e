//! The size limits of names in a security context, shared by their checks and by the messages that
//! refuse them (a leaf, so that the policy's errors need not import the rules they describe).

/// Longest tool name (and pattern) accepted, in bytes (SPEC 2).
pub const MAX_TOOL_NAME_BYTES: usize = 128;

/// Longest context name, in bytes.
pub const MAX_CONTEXT_NAME_BYTES: usize = 128;

/// Longest capability id, in bytes.
pub const MAX_CAPABILITY_ID_BYTES: usize = 64;
