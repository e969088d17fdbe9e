//! cargo fuzz target; the body (and what it checks) is `sealgate::fuzzing::paths`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sealgate::fuzzing::paths(data));
