//! cargo fuzz target; the body (and what it checks) is `sealgate::fuzzing::strict_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sealgate::fuzzing::strict_json(data));
