//! RFC 8785 (JCS) canonical bytes of a `serde_json::Value`: the bytes that seal/v1 signs and hashes.
//!
//! Why not `serde_jcs` 0.2? Its output is right for these inputs (a differential property test below
//! compares the two), but it is built as a serde formatter: it buffers every nested object into its own
//! `Vec`, re-parses each key with serde_json to sort it, allocates a boxed writer per fragment, and can
//! only report failures through `Result`. Working on `Value` directly is a single infallible pass that
//! writes into one buffer, which is what the per-request signature check wants. Number formatting uses
//! `ryu-js` (the ECMAScript `Number::toString` algorithm, the same crate serde_jcs relies on).

use serde_json::{Map, Number, Value};

/// 2^53: every integer of at most this magnitude is an exact double, and ECMAScript prints it as plain
/// decimal digits (it switches to exponent form only from 1e21).
const EXACT_INTEGER_LIMIT: u64 = 1 << 53;

/// The JCS canonical bytes of `value`.
pub fn jcs(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_value(&mut out, value);
    out
}

pub(crate) fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => write_number(out, number),
        Value::String(text) => write_string(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => write_object(out, map),
    }
}

/// The JCS canonical bytes of an object, without wrapping (and so copying) it into a `Value`.
pub fn jcs_object(map: &Map<String, Value>) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    write_object(&mut out, map);
    out
}

fn write_object(out: &mut Vec<u8>, map: &Map<String, Value>) {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    // RFC 8785 3.2.3: sort by UTF-16 code units. This differs from UTF-8 byte order when a key holds
    // characters above U+FFFF (surrogates 0xD800..) next to characters in U+E000..U+FFFF.
    entries.sort_unstable_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
    out.push(b'{');
    for (index, (key, value)) in entries.into_iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_string(out, key);
        out.push(b':');
        write_value(out, value);
    }
    out.push(b'}');
}

/// Writes `text` as JSON.stringify does: `"` and `\` escaped, the short escapes `\b \t \n \f \r`,
/// other control characters as `\u00xx` (lower-case hex), everything else (including `/`, DEL, U+2028
/// and all non-ASCII) raw.
pub(crate) fn write_string(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = text.as_bytes();
    let mut run_start = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        let short_escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(bytes.get(run_start..index).unwrap_or_default());
        if short_escape.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0x0f)]);
        } else {
            out.extend_from_slice(short_escape);
        }
        run_start = index + 1;
    }
    out.extend_from_slice(bytes.get(run_start..).unwrap_or_default());
    out.push(b'"');
}

/// Writes a number in its ECMAScript shortest form (RFC 8785 3.2.2.3).
pub(crate) fn write_number(out: &mut Vec<u8>, number: &Number) {
    if let Some(unsigned) = number.as_u64() {
        if unsigned <= EXACT_INTEGER_LIMIT {
            out.extend_from_slice(unsigned.to_string().as_bytes());
            return;
        }
    } else if let Some(signed) = number.as_i64() {
        write_i64(out, signed);
        return;
    }
    match number.as_f64() {
        Some(double) if double.is_finite() => write_f64(out, double),
        // Unreachable without serde_json's arbitrary_precision feature (a Number always holds a
        // finite f64); with it, serde_json's own text is the best available answer.
        _ => out.extend_from_slice(number.to_string().as_bytes()),
    }
}

/// Writes an integer as JCS does, i.e. as the double nearest to it.
pub(crate) fn write_i64(out: &mut Vec<u8>, value: i64) {
    if value.unsigned_abs() <= EXACT_INTEGER_LIMIT {
        out.extend_from_slice(value.to_string().as_bytes());
    } else {
        // Beyond 2^53 the value is rounded to a double first, exactly as a JavaScript signer would.
        write_f64(out, value as f64);
    }
}

fn write_f64(out: &mut Vec<u8>, value: f64) {
    // ECMAScript prints −0 as "0"; normalise it before formatting.
    let value = if value == 0.0 { 0.0 } else { value };
    let mut buffer = ryu_js::Buffer::new();
    out.extend_from_slice(buffer.format_finite(value).as_bytes());
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn canonical(value: &Value) -> String {
        String::from_utf8(jcs(value)).unwrap()
    }

    #[test]
    fn numbers_take_their_ecmascript_form() {
        let cases: [(Value, &str); 14] = [
            (json!(1.0), "1"),
            (json!(1e21), "1e+21"),
            (json!(1e20), "100000000000000000000"),
            (json!(-0.0), "0"),
            (json!(0), "0"),
            (json!(1.5e-7), "1.5e-7"),
            (json!(0.000001), "0.000001"),
            (json!(0.1), "0.1"),
            (json!(2.5), "2.5"),
            (json!(-1), "-1"),
            (json!(9_007_199_254_740_991_u64), "9007199254740991"),
            (json!(u64::MAX), "18446744073709552000"),
            (json!(i64::MIN), "-9223372036854776000"),
            (json!(5e-324), "5e-324"),
        ];
        for (value, expected) in cases {
            assert_eq!(canonical(&value), expected, "{value:?}");
        }
    }

    #[test]
    fn strings_escape_like_json_stringify() {
        let value = json!("q\" b\\ /\u{8}\u{c}\n\r\t\u{1}\u{1f}\u{7f}\u{2028}é😀");
        assert_eq!(
            canonical(&value),
            "\"q\\\" b\\\\ /\\b\\f\\n\\r\\t\\u0001\\u001f\u{7f}\u{2028}é😀\""
        );
    }

    #[test]
    fn keys_sort_by_utf16_code_units_at_every_depth() {
        let value = json!({"\u{fb01}": 1, "😀": 2, "z": 3, "a": [{"b": 1, "a": 2}], "": 0});
        assert_eq!(
            canonical(&value),
            "{\"\":0,\"a\":[{\"a\":2,\"b\":1}],\"z\":3,\"😀\":2,\"\u{fb01}\":1}"
        );
    }

    #[test]
    fn writes_no_white_space() {
        assert_eq!(
            canonical(&json!({"b": [1, null, true, false, {}], "a": []})),
            r#"{"a":[],"b":[1,null,true,false,{}]}"#
        );
    }

    /// Values with finite numbers, unicode keys and strings, nested a few levels deep; integers span
    /// all of i64/u64 when `full_range`, else only the safe integers that the strict parser accepts.
    fn arbitrary_value(full_range: bool) -> impl Strategy<Value = Value> {
        let safe = crate::strict_json::MAX_SAFE_INTEGER as i64;
        let (signed, unsigned) = if full_range {
            (i64::MIN..=i64::MAX, 0..=u64::MAX)
        } else {
            (-safe..=safe, 0..=safe as u64)
        };
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            signed.prop_map(|n| json!(n)),
            unsigned.prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter(
                    "integral doubles that JCS prints as unsafe integer literals",
                    move |f| { full_range || strict_reparsable(*f) }
                )
                .prop_filter_map("finite doubles only", Number::from_f64)
                .prop_map(Value::Number),
            "\\PC*".prop_map(Value::String),
            ".*".prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 48, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(".{0,6}", inner, 0..5)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn agrees_with_serde_jcs(value in arbitrary_value(true)) {
            prop_assert_eq!(jcs(&value), serde_jcs::to_vec(&value).unwrap());
        }

        #[test]
        fn output_reparses_to_an_equal_value_and_is_a_fixed_point(value in arbitrary_value(false)) {
            let bytes = jcs(&value);
            let reparsed = crate::envelope::parse_strict_json(&bytes).unwrap();
            // Numbers may change representation (1.0 → 1) but never their value as a double.
            prop_assert!(same_json(&reparsed, &value), "{} vs {}", reparsed, value);
            prop_assert_eq!(jcs(&reparsed), bytes);
        }
    }

    /// Doubles in [2^53, 1e21) are integral and JCS writes them as plain digits, which the strict
    /// parser (rightly) refuses as integer literals outside ±(2^53−1); the others re-parse.
    pub(crate) fn strict_reparsable(double: f64) -> bool {
        double.abs() <= crate::envelope::MAX_SAFE_INTEGER as f64 || double.abs() >= 1e21
    }

    #[test]
    fn large_integral_doubles_are_written_as_digits() {
        assert_eq!(canonical(&json!(4.0e17)), "400000000000000000");
        assert!(!strict_reparsable(4.0e17));
        assert!(crate::envelope::parse_strict_json(b"400000000000000000").is_err());
    }

    /// Equality of JSON values where numbers compare as doubles (the JCS data model).
    fn same_json(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
            (Value::Array(xs), Value::Array(ys)) => {
                xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| same_json(x, y))
            }
            (Value::Object(xs), Value::Object(ys)) => {
                xs.len() == ys.len()
                    && xs
                        .iter()
                        .all(|(key, x)| ys.get(key).is_some_and(|y| same_json(x, y)))
            }
            _ => a == b,
        }
    }
}
