//! cargo fuzz target; the body (and what it checks) is `sealgate::fuzzing::domains`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sealgate::fuzzing::domains(data));
