//! sealgate: a security gateway for AI agent tool calls (see README.md and SPEC.md).
pub mod api;
pub mod audit;
pub mod claim;
pub mod clock;
pub mod config;
pub mod demo;
pub mod envelope;
pub mod error;
pub mod fuzzing;
pub mod gateway;
pub mod pipeline;
pub mod policy;
pub mod session;
pub mod store;
pub mod strict_json;
pub mod token;
pub mod upstream;
