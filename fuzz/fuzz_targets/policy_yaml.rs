//! cargo fuzz target; the body (and what it checks) is `sealgate::fuzzing::policy_yaml`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sealgate::fuzzing::policy_yaml(data));
