//! The `cargo fuzz` targets on stable Rust. Each target's body lives in `sealgate::fuzzing`; here it
//! replays the committed seeds of `fuzz/seeds/<target>/` and a few thousand inputs that a seeded PRNG
//! derives from them (byte edits, splices, tokens the parsers care about, plain noise), so CI runs every
//! target for a fixed number of iterations and a regression that `scripts/fuzz.sh` would find in hours
//! is often found here in seconds. Same inputs on every run: a failure is reproducible.

use std::collections::BTreeSet;
use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use sealgate::envelope::{parse_envelope, SessionKey};
use sealgate::fuzzing::{FUZZ_NOW, FUZZ_PUBLIC_KEY_PEM, TARGETS};

/// Derived inputs per target, on top of its seeds; keeps the whole file well under 20 s in debug.
const CASES_PER_TARGET: usize = 5_000;

/// Longest derived input: enough for an envelope with a token, short enough to stay fast.
const MAX_INPUT: usize = 2_048;

/// Fragments that open the parsers' interesting branches, spliced into seeds.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"\\u",
    b"\\ud800",
    b"\\udc00",
    b"\\ud83d\\ude00",
    b"\\",
    b"9007199254740991",
    b"9007199254740992",
    b"-0",
    b"1e400",
    b"1e-400",
    b"0.5",
    b"null",
    b"true",
    b"\x00",
    b"\xff",
    b"\xc3\xa9",
    b"\x01",
    b"\n",
    b" ",
    b".",
    b"..",
    b"/",
    b"//",
    b"/../",
    b"'",
    b"$(",
    b"`",
    b"#",
    b";",
    b"|",
    b"&",
    b"-c",
    b"--output=/etc/x",
    b"@",
    b"%40",
    b"xn--",
    b"http://",
    b"https://",
    b"[::1]",
    b"0x7f.1",
    b"*",
    b"?",
    b"[",
    b"{",
    b"~",
    b"if=/etc/",
    b"-O/etc/",
    b":/etc",
    b",/etc",
    b"@/etc",
    b"file:",
    b"Path",
    b"URL",
    b"&a",
    b"*a",
    b"<<:",
    b"- ",
    b": ",
    b"!!str",
    b"---\n",
    b"alg",
    b"EdDSA",
    b"none",
    b"kid",
    b"exp",
    b"=",
];

/// splitmix64: small, seeded, the same sequence everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: usize) -> usize {
        // The bias of a modulo is irrelevant for picking mutations.
        (self.next() % bound.max(1) as u64) as usize
    }
}

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = repository().join("fuzz/seeds").join(target);
    let mut paths: Vec<PathBuf> = match fs::read_dir(&dir) {
        Ok(entries) => entries.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(error) => panic!("no seeds for {target} in {}: {error}", dir.display()),
    };
    paths.sort();
    paths
        .iter()
        .map(|path| match fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) => panic!("cannot read {}: {error}", path.display()),
        })
        .collect()
}

/// One derived input: a seed edited a few times, two seeds spliced, or noise.
fn derive(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut input = match rng.below(10) {
        0 => (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
        1 => {
            let (a, b) = (
                &seeds[rng.below(seeds.len())],
                &seeds[rng.below(seeds.len())],
            );
            let (cut_a, cut_b) = (rng.below(a.len() + 1), rng.below(b.len() + 1));
            [&a[..cut_a], &b[cut_b..]].concat()
        }
        _ => seeds[rng.below(seeds.len())].clone(),
    };
    for _ in 0..=rng.below(4) {
        let at = rng.below(input.len() + 1);
        match rng.below(6) {
            0 if at < input.len() => input[at] ^= 1 << rng.below(8),
            1 if at < input.len() => input[at] = rng.next() as u8,
            2 if at < input.len() => {
                let end = (at + 1 + rng.below(16)).min(input.len());
                input.drain(at..end);
            }
            3 if at < input.len() => {
                let end = (at + 1 + rng.below(16)).min(input.len());
                let chunk = input[at..end].to_vec();
                input.splice(at..at, chunk);
            }
            _ => {
                let token = TOKENS[rng.below(TOKENS.len())];
                input.splice(at..at, token.iter().copied());
            }
        }
    }
    input.truncate(MAX_INPUT);
    input
}

fn run(target: &str) {
    let Some((_, body)) = TARGETS.iter().find(|(name, _)| *name == target) else {
        panic!("{target} is not in sealgate::fuzzing::TARGETS")
    };
    let seeds = seeds(target);
    assert!(seeds.len() >= 3, "{target}: a handful of seeds, please");
    // The target's name seeds the PRNG, so adding a target does not change the others' inputs.
    let mut rng = Rng(target.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }));
    let derived = (0..CASES_PER_TARGET).map(|_| derive(&mut rng, &seeds));
    for (case, input) in seeds.clone().into_iter().chain(derived).enumerate() {
        if catch_unwind(AssertUnwindSafe(|| body(&input))).is_err() {
            panic!(
                "fuzz target {target} failed on case {case}; input: {:?}\n(reproduce with \
                 sealgate::fuzzing::{target}(b\"...\") or save the bytes under fuzz/seeds/{target}/)",
                String::from_utf8_lossy(&input)
            );
        }
    }
}

#[test]
fn strict_json() {
    run("strict_json");
}

#[test]
fn envelope() {
    run("envelope");
}

#[test]
fn jwt() {
    run("jwt");
}

#[test]
fn commands() {
    run("commands");
}

#[test]
fn domains() {
    run("domains");
}

#[test]
fn paths() {
    run("paths");
}

#[test]
fn policy_yaml() {
    run("policy_yaml");
}

#[test]
fn policy_decide() {
    run("policy_decide");
}

/// `[[bin]]` names of the fuzz crate.
fn fuzz_binaries() -> BTreeSet<String> {
    let manifest = match fs::read_to_string(repository().join("fuzz/Cargo.toml")) {
        Ok(text) => text,
        Err(error) => panic!("fuzz/Cargo.toml: {error}"),
    };
    manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|section| {
            let line = section
                .lines()
                .find(|l| l.trim_start().starts_with("name"))?;
            Some(line.split('"').nth(1)?.to_owned())
        })
        .collect()
}

#[test]
fn every_target_has_a_fuzz_binary_that_calls_its_body_and_seeds() {
    let names: BTreeSet<String> = TARGETS.iter().map(|(name, _)| (*name).to_owned()).collect();
    assert_eq!(
        fuzz_binaries(),
        names,
        "fuzz/Cargo.toml and sealgate::fuzzing::TARGETS differ"
    );
    // Each test above runs one target; this keeps the list and the tests from drifting apart.
    let this_file = include_str!("fuzz_targets.rs");
    for name in &names {
        let source = repository().join(format!("fuzz/fuzz_targets/{name}.rs"));
        let text = fs::read_to_string(&source).unwrap_or_default();
        assert!(
            text.contains(&format!("sealgate::fuzzing::{name}(data)")),
            "{} does not call sealgate::fuzzing::{name}",
            source.display()
        );
        assert!(
            this_file.contains(&format!("run(\"{name}\")")),
            "no test runs {name}"
        );
        assert!(repository().join("fuzz/seeds").join(name).is_dir());
    }
}

/// The signed seeds must pass the signature checks, or the targets never reach what lies behind them.
#[test]
fn signed_seeds_verify_with_the_fuzz_keys() {
    let key = match SessionKey::parse(FUZZ_PUBLIC_KEY_PEM) {
        Ok(key) => key,
        Err(error) => panic!("fuzz public key: {error}"),
    };
    for name in ["tools_call", "tools_list_rfc3339", "unicode_arguments"] {
        let path = repository().join("fuzz/seeds/envelope").join(name);
        let envelope = match parse_envelope(&fs::read(&path).unwrap_or_default()) {
            Ok(envelope) => envelope,
            Err(error) => panic!("{}: {error}", path.display()),
        };
        assert!(envelope.verify_signature(&key).is_ok(), "{name}");
        let token = sealgate::fuzzing::token_verifier().verify(&envelope.security_token, FUZZ_NOW);
        assert!(token.is_ok_and(|claims| claims.sub == "agent-1"), "{name}");
    }
}
