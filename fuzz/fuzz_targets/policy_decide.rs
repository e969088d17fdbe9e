//! cargo fuzz target; the body (and what it checks) is `sealgate::fuzzing::policy_decide`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sealgate::fuzzing::policy_decide(data));
