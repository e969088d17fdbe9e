//! The one reader for untrusted JSON (SPEC section 2, "Strict parsing"): envelope bodies, control-API
//! bodies, JWT headers and claims, and the audit lines that `sealgate audit verify` checks. Two readers
//! of the same bytes that disagree (about a repeated key, say) are how a parser differential becomes a
//! bypass, so every one of those places reads through this module.
//!
//! serde_json alone cannot enforce the seal/v1 rules: it keeps the last of two equal keys, it cannot tell
//! `18446744073709551616` (an integer literal) from `1e19`, and it replaces nothing we can inspect later.
//! This parser refuses, with a message that names the place: input that is not UTF-8, any JSON syntax
//! error, trailing bytes, a repeated key in any object, nesting deeper than the caller's limit, an
//! integer literal outside ±[`MAX_SAFE_INTEGER`] (unless the caller's rules say otherwise), a number
//! that is not finite as f64, raw control characters in strings, and unpaired UTF-16 surrogates in `\u`
//! escapes. Recursion is bounded by the depth limit, so no input can overflow the stack.
//! [`refuse_case_folded_names`] holds a tool call's `arguments` to one more rule: no two names equal
//! under ASCII case folding (SPEC 6.3 r3).
//!
//! **Who reads with which rules.** The differences are deliberate, and they are all here:
//!
//! | caller | rules | depth | integer literals |
//! |---|---|---|---|
//! | envelope bodies (`envelope::parse_envelope`) | [`UNTRUSTED`] | 64 | ±(2^53−1) |
//! | control-API bodies (`api::json_body`) | [`UNTRUSTED`] | 64 | ±(2^53−1) |
//! | JWT header and claims (`token`, check 2) | [`UNTRUSTED`] | 64 | ±(2^53−1) |
//! | audit lines (`audit verify`, the file sink resuming its chain, the chain's JCS read-back) | [`AUDIT_LINES`] | 256 | any, read as serde_json reads them |
//! | tool answers (`upstream`, [`parse_tool_answer`]): plain JSON-RPC bodies, and MCP messages in which [`holds_inexact_number`] found one | [`TOOL_ANSWERS`] | 128 | ±(2^53−1), and every other number exact |
//!
//! Audit lines are the gateway's own output read back: an event may carry a tool answer that serde_json
//! read (up to 128 levels, with integers beyond 2^53) and JCS writes doubles in [2^53, 10^21) as plain
//! digits, so refusing those would break a chain the gateway wrote itself. Everything else (repeated
//! keys, surrogates, non-finite numbers, framing) is refused there exactly as in a request body.
//!
//! A tool's answer is what a receipt's `answer_sha256` binds (SPEC 20 rule 5): a number that JCS would write
//! as another number than the tool sent (an integer beyond ±(2^53−1), a fraction with more digits than a
//! double holds) would make one receipt prove two answers, so it is refused, naming where, never quoting it
//! (an answer is not recorded in the audit trail). The depth is serde_json's, which read answers before.
//!
//! (`api::json_body` also asks serde_json whether a body is JSON at all, but only to choose HTTP 400
//! over 422; the value it acts on comes from here.)

use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Number, Value};

/// Deepest allowed nesting of objects and arrays in untrusted input; the top-level container is level 1.
pub const MAX_DEPTH: usize = 64;

/// Deepest nesting of an audit line: twice serde_json's own limit of 128, which bounds every tool answer
/// an event can carry, and still shallow enough that recursion cannot overflow a thread's stack.
const MAX_AUDIT_DEPTH: usize = 256;

/// The largest integer that an IEEE double (and so every JavaScript client) holds exactly: 2^53 − 1.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Longest excerpt of a key or number that an error message quotes (messages stay readable and bounded).
const MESSAGE_EXCERPT_CHARS: usize = 48;

/// What one caller's reading allows; the only two sets are [`UNTRUSTED`] and [`AUDIT_LINES`] (see the
/// module documentation for who uses which, and why they differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    max_depth: usize,
    integers: Integers,
    /// Every number must read back as written once JCS writes its double (SPEC 20 rule 5), and messages
    /// never quote a number.
    exact_numbers: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Integers {
    /// SPEC 2: an integer literal outside ±(2^53 − 1) is refused.
    SafeOnly,
    /// As serde_json reads them: `u64` or `i64` when the value fits, else the nearest double.
    AnyFinite,
}

/// Request bodies, control-API bodies and JWT parts: SPEC section 2 as written.
pub const UNTRUSTED: Rules = Rules {
    max_depth: MAX_DEPTH,
    integers: Integers::SafeOnly,
    exact_numbers: false,
};

/// Lines of the audit chain, which the gateway wrote itself (see the module documentation).
pub const AUDIT_LINES: Rules = Rules {
    max_depth: MAX_AUDIT_DEPTH,
    integers: Integers::AnyFinite,
    exact_numbers: false,
};

/// A tool's answer, which a receipt binds (see the module documentation).
pub const TOOL_ANSWERS: Rules = Rules {
    max_depth: 128,
    integers: Integers::SafeOnly,
    exact_numbers: true,
};

/// Why a tool's answer was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnswerRefusal {
    /// A number that JCS cannot write as the tool sent it (SPEC 20 rule 5); the message names its path.
    InexactNumber(String),
    /// Not one strict JSON document (syntax, a repeated key, nesting).
    Malformed(String),
}

/// Reads a tool's answer under the [`TOOL_ANSWERS`] rules.
pub fn parse_tool_answer(bytes: &[u8]) -> Result<Value, AnswerRefusal> {
    parse(bytes, TOOL_ANSWERS).map_err(|error| {
        if error.inexact_number {
            AnswerRefusal::InexactNumber(error.to_string())
        } else {
            AnswerRefusal::Malformed(error.to_string())
        }
    })
}

/// Whether the JSON text `bytes` holds a number that [`parse_tool_answer`] refuses as inexact. It reads
/// no structure and allocates nothing: it skips strings and checks each number token by the same rule as
/// the parser. It runs on every message of an MCP server, whose library keeps no number text; only a hit
/// is worth [`parse_tool_answer`]'s full reading, for the path. Bytes that are not JSON can hit too.
pub fn holds_inexact_number(bytes: &[u8]) -> bool {
    let mut pos = 0;
    while let Some(&byte) = bytes.get(pos) {
        pos = match byte {
            b'"' => end_of_string(bytes, pos + 1),
            b'-' | b'0'..=b'9' => {
                let end = end_of_number(bytes, pos);
                if !is_exact_number(&bytes[pos..end]) {
                    return true;
                }
                end
            }
            _ => pos + 1,
        };
    }
    false
}

/// The position just after the string whose contents start at `pos` (escapes skipped whole).
fn end_of_string(bytes: &[u8], mut pos: usize) -> usize {
    while let Some(&byte) = bytes.get(pos) {
        match byte {
            b'"' => return pos + 1,
            b'\\' => pos += 2,
            _ => pos += 1,
        }
    }
    pos
}

/// The position just after the number token that starts at `pos`.
fn end_of_number(bytes: &[u8], pos: usize) -> usize {
    let length = bytes[pos..]
        .iter()
        .take_while(|&&b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
        .count();
    pos + length
}

/// Whether a number token is one that [`TOOL_ANSWERS`] reads as sent; on the normal path (it is)
/// nothing is allocated.
fn is_exact_number(token: &[u8]) -> bool {
    let Ok(literal) = std::str::from_utf8(token) else {
        return false;
    };
    let negative = literal.starts_with('-');
    let is_integer_literal = !literal.contains(['.', 'e', 'E']);
    if is_integer_literal {
        let shown = Shown {
            literal,
            quoted: false,
        };
        let digits = literal.len() - usize::from(negative);
        safe_integer(shown, negative, digits, 0).is_ok()
    } else {
        exact_double(literal, 0).is_ok()
    }
}

/// Parses `bytes` as one strict JSON value under the [`UNTRUSTED`] rules (see the module documentation
/// for what is refused).
///
/// Integers written without fraction or exponent become `u64` (non-negative) or `i64` (negative)
/// numbers; every other number becomes an `f64` number.
pub fn parse_strict_json(bytes: &[u8]) -> Result<Value, String> {
    parse_strict_json_with(bytes, UNTRUSTED)
}

/// Parses `bytes` as one strict JSON value under `rules`.
pub fn parse_strict_json_with(bytes: &[u8], rules: Rules) -> Result<Value, String> {
    parse(bytes, rules).map_err(|error| error.to_string())
}

/// One step of the location of an error inside the document.
#[derive(Debug)]
enum PathSegment {
    Key(String),
    Index(usize),
}

/// A refusal: what is wrong, at which byte (when it is read from bytes), and under which keys / indexes.
#[derive(Debug)]
struct ParseError {
    problem: String,
    offset: Option<usize>,
    /// Innermost segment first: each enclosing container appends its own segment while the error
    /// travels up, so the happy path never pays for path bookkeeping.
    reversed_path: Vec<PathSegment>,
    /// A number that JCS cannot write as it was written (SPEC 20 rule 5), as opposed to bad JSON.
    inexact_number: bool,
}

impl ParseError {
    fn new(problem: impl Into<String>, offset: usize) -> Self {
        ParseError {
            problem: problem.into(),
            offset: Some(offset),
            reversed_path: Vec::new(),
            inexact_number: false,
        }
    }

    /// A number that JCS would not write as it was written.
    fn inexact_number(problem: impl Into<String>, offset: usize) -> Self {
        ParseError {
            inexact_number: true,
            ..ParseError::new(problem, offset)
        }
    }

    /// A problem of a value already parsed, which has no byte offset.
    fn in_value(problem: impl Into<String>) -> Self {
        ParseError {
            problem: problem.into(),
            offset: None,
            reversed_path: Vec::new(),
            inexact_number: false,
        }
    }

    fn inside(mut self, segment: PathSegment) -> Self {
        self.reversed_path.push(segment);
        self
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at $", self.problem)?;
        for segment in self.reversed_path.iter().rev() {
            match segment {
                PathSegment::Index(index) => write!(f, "[{index}]")?,
                PathSegment::Key(key) if is_plain_identifier(key) => write!(f, ".{key}")?,
                PathSegment::Key(key) => write!(f, "[{}]", quote_excerpt(key))?,
            }
        }
        match self.offset {
            Some(offset) => write!(f, " (byte {offset})"),
            None => Ok(()),
        }
    }
}

/// Refuses an object, at any depth of `object`, that holds two names equal under ASCII case folding
/// (SPEC 6.3 r3): many tools' JSON decoders match names without regard to case, so of `path` and
/// `Path` the policy might check one while the tool reads the other. The message names both, and where
/// (`$` is `object` itself).
pub fn refuse_case_folded_names(object: &Map<String, Value>) -> Result<(), String> {
    case_folded_names_in_object(object).map_err(|error| error.to_string())
}

fn case_folded_names_in_object(object: &Map<String, Value>) -> Result<(), ParseError> {
    if let Some((one, other)) = case_folded_twins(object) {
        return Err(ParseError::in_value(format!(
            "the names {} and {} are equal under ASCII case folding",
            quote_excerpt(one),
            quote_excerpt(other)
        )));
    }
    for (key, value) in object {
        case_folded_names_in_value(value)
            .map_err(|error| error.inside(PathSegment::Key(key.clone())))?;
    }
    Ok(())
}

fn case_folded_names_in_value(value: &Value) -> Result<(), ParseError> {
    match value {
        Value::Object(object) => case_folded_names_in_object(object),
        Value::Array(items) => items.iter().enumerate().try_for_each(|(index, item)| {
            case_folded_names_in_value(item)
                .map_err(|error| error.inside(PathSegment::Index(index)))
        }),
        _ => Ok(()),
    }
}

/// Two names of `object` equal under ASCII case folding, if any. Names without an ASCII capital are
/// already distinct from each other, so only names with one are folded (no allocation otherwise).
fn case_folded_twins(object: &Map<String, Value>) -> Option<(&str, &str)> {
    let mut folded: HashMap<String, &str> = HashMap::new();
    for name in object
        .keys()
        .filter(|name| name.bytes().any(|b| b.is_ascii_uppercase()))
    {
        let lower = name.to_ascii_lowercase();
        if let Some((twin, _)) = object.get_key_value(&lower) {
            return Some((twin, name));
        }
        if let Some(twin) = folded.insert(lower, name) {
            return Some((twin, name));
        }
    }
    None
}

fn is_plain_identifier(key: &str) -> bool {
    let mut bytes = key.bytes();
    match bytes.next() {
        Some(first) if first.is_ascii_alphabetic() || first == b'_' => {}
        _ => return false,
    }
    key.len() <= MESSAGE_EXCERPT_CHARS && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// JSON-quotes `text` for an error message, shortened so that a huge key cannot bloat logs.
pub(crate) fn quote_excerpt(text: &str) -> String {
    let mut excerpt: String = text.chars().take(MESSAGE_EXCERPT_CHARS).collect();
    let shortened = excerpt.len() < text.len();
    if shortened {
        excerpt.push('…');
    }
    // serde_json escapes exactly what JCS does (quote, backslash, control characters), so a quoted key
    // reads the same here as in a canonical message.
    Value::String(excerpt).to_string()
}

fn parse(bytes: &[u8], rules: Rules) -> Result<Value, ParseError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|error| ParseError::new("body is not valid UTF-8", error.valid_up_to()))?;
    if text.is_empty() {
        return Err(ParseError::new("empty body", 0));
    }
    let mut parser = Parser {
        text,
        bytes,
        pos: 0,
        rules,
    };
    parser.skip_whitespace();
    if parser.pos == bytes.len() {
        return Err(ParseError::new(
            "no JSON value (only white space)",
            parser.pos,
        ));
    }
    let value = parser.parse_value(0)?;
    parser.skip_whitespace();
    if parser.pos != bytes.len() {
        return Err(ParseError::new(
            format!(
                "trailing characters after the JSON value ({})",
                parser.describe_current()
            ),
            parser.pos,
        ));
    }
    Ok(value)
}

struct Parser<'a> {
    /// The same input as `bytes`, already checked to be UTF-8, for slicing out string runs.
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    rules: Rules,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Names the character at the current position for error messages.
    fn describe_current(&self) -> String {
        match self
            .text
            .get(self.pos..)
            .and_then(|rest| rest.chars().next())
        {
            None => "end of input".to_string(),
            Some(c) if c.is_ascii_graphic() => format!("'{c}'"),
            Some(c) => format!("U+{:04X}", u32::from(c)),
        }
    }

    fn unexpected(&self, expected: &str) -> ParseError {
        ParseError::new(
            format!("expected {expected}, found {}", self.describe_current()),
            self.pos,
        )
    }

    /// Parses the value at the current position; `parent_depth` is the nesting level around it.
    fn parse_value(&mut self, parent_depth: usize) -> Result<Value, ParseError> {
        match self.peek() {
            Some(b'{') => self.parse_object(parent_depth + 1),
            Some(b'[') => self.parse_array(parent_depth + 1),
            Some(b'"') => self.parse_string().map(Value::String),
            Some(b'-' | b'0'..=b'9') => self.parse_number().map(Value::Number),
            Some(b't') => self.parse_literal("true", Value::Bool(true)),
            Some(b'f') => self.parse_literal("false", Value::Bool(false)),
            Some(b'n') => self.parse_literal("null", Value::Null),
            _ => Err(self.unexpected("a JSON value")),
        }
    }

    fn parse_literal(&mut self, word: &str, value: Value) -> Result<Value, ParseError> {
        let end = self.pos + word.len();
        if self.bytes.get(self.pos..end) == Some(word.as_bytes()) {
            self.pos = end;
            Ok(value)
        } else {
            Err(self.unexpected("a JSON value"))
        }
    }

    fn check_depth(&self, depth: usize) -> Result<(), ParseError> {
        if depth > self.rules.max_depth {
            Err(ParseError::new(
                format!("nesting deeper than {} levels", self.rules.max_depth),
                self.pos,
            ))
        } else {
            Ok(())
        }
    }

    fn parse_object(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.check_depth(depth)?;
        self.pos += 1; // '{'
        let mut map = Map::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.unexpected("a string key"));
            }
            let key_offset = self.pos;
            let key = self.parse_string()?;
            // Compared after unescaping, so "a" and "\u0061" are the same key.
            if map.contains_key(&key) {
                return Err(ParseError::new(
                    format!("duplicate key {}", quote_excerpt(&key)),
                    key_offset,
                ));
            }
            self.skip_whitespace();
            if self.peek() != Some(b':') {
                return Err(self.unexpected("':' after an object key"));
            }
            self.pos += 1;
            self.skip_whitespace();
            let value = match self.parse_value(depth) {
                Ok(value) => value,
                Err(error) => return Err(error.inside(PathSegment::Key(key))),
            };
            map.insert(key, value);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                _ => return Err(self.unexpected("',' or '}' in an object")),
            }
        }
    }

    fn parse_array(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.check_depth(depth)?;
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_whitespace();
            match self.parse_value(depth) {
                Ok(value) => items.push(value),
                Err(error) => return Err(error.inside(PathSegment::Index(items.len()))),
            }
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.unexpected("',' or ']' in an array")),
            }
        }
    }

    /// Copies `start..end` of the input; both ends sit next to ASCII bytes, so they are char boundaries.
    fn push_run(&self, out: &mut String, start: usize, end: usize) -> Result<(), ParseError> {
        match self.text.get(start..end) {
            Some(run) => {
                out.push_str(run);
                Ok(())
            }
            None => Err(ParseError::new(
                "string split inside a UTF-8 sequence",
                start,
            )),
        }
    }

    fn parse_string(&mut self) -> Result<String, ParseError> {
        let opening = self.pos;
        self.pos += 1; // '"'
        let mut out = String::new();
        let mut run_start = self.pos;
        loop {
            match self.peek() {
                None => return Err(ParseError::new("unterminated string", opening)),
                Some(b'"') => {
                    self.push_run(&mut out, run_start, self.pos)?;
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.push_run(&mut out, run_start, self.pos)?;
                    let decoded = self.parse_escape()?;
                    out.push(decoded);
                    run_start = self.pos;
                }
                Some(control @ 0x00..=0x1f) => {
                    return Err(ParseError::new(
                        format!("unescaped control character U+{control:04X} in a string"),
                        self.pos,
                    ))
                }
                Some(_) => self.pos += 1,
            }
        }
    }

    /// Decodes the escape sequence at the current backslash, joining surrogate pairs.
    fn parse_escape(&mut self) -> Result<char, ParseError> {
        let escape_offset = self.pos;
        self.pos += 1; // '\\'
        let Some(kind) = self.peek() else {
            return Err(ParseError::new("unterminated string", escape_offset));
        };
        self.pos += 1;
        let simple = match kind {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{08}',
            b'f' => '\u{0c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.parse_unicode_escape(escape_offset),
            _ => {
                return Err(ParseError::new(
                    "invalid escape sequence in a string",
                    escape_offset,
                ))
            }
        };
        Ok(simple)
    }

    fn parse_unicode_escape(&mut self, escape_offset: usize) -> Result<char, ParseError> {
        let first = self.parse_hex4(escape_offset)?;
        let code_point = match first {
            0xD800..=0xDBFF => {
                let low_offset = self.pos;
                if self.bytes.get(self.pos..self.pos + 2) != Some(b"\\u".as_slice()) {
                    return Err(unpaired_surrogate(first, escape_offset));
                }
                self.pos += 2;
                let second = self.parse_hex4(low_offset)?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(unpaired_surrogate(first, escape_offset));
                }
                0x10000 + ((u32::from(first) - 0xD800) << 10) + (u32::from(second) - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(unpaired_surrogate(first, escape_offset)),
            other => u32::from(other),
        };
        char::from_u32(code_point)
            .ok_or_else(|| ParseError::new("invalid \\u escape", escape_offset))
    }

    fn parse_hex4(&mut self, escape_offset: usize) -> Result<u16, ParseError> {
        let digits = self
            .bytes
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| ParseError::new("incomplete \\u escape", escape_offset))?;
        let mut value: u16 = 0;
        for &digit in digits {
            let nibble = char::from(digit).to_digit(16).ok_or_else(|| {
                ParseError::new("invalid hex digit in a \\u escape", escape_offset)
            })?;
            // Four nibbles fill exactly 16 bits, so the shift never loses a set bit.
            value = (value << 4) | nibble as u16;
        }
        self.pos += 4;
        Ok(value)
    }

    fn count_digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    fn parse_number(&mut self) -> Result<Number, ParseError> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let integer_start = self.pos;
        let integer_digits = self.count_digits();
        if integer_digits == 0 {
            return Err(self.unexpected("a digit in a number"));
        }
        if integer_digits > 1 && self.bytes.get(integer_start) == Some(&b'0') {
            return Err(ParseError::new("number with a leading zero", start));
        }
        let mut is_integer_literal = true;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            is_integer_literal = false;
            if self.count_digits() == 0 {
                return Err(self.unexpected("a digit after the decimal point"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            is_integer_literal = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.count_digits() == 0 {
                return Err(self.unexpected("a digit in the exponent"));
            }
        }
        let literal = self.text.get(start..self.pos).unwrap_or_default();
        let shown = Shown {
            literal,
            quoted: !self.rules.exact_numbers,
        };
        match (is_integer_literal, self.rules.integers) {
            (true, Integers::SafeOnly) => safe_integer(shown, negative, integer_digits, start),
            (true, Integers::AnyFinite) => match exact_integer(literal, negative) {
                Some(number) => Ok(number),
                None => double(shown, start),
            },
            (false, _) if self.rules.exact_numbers => exact_double(literal, start),
            (false, _) => double(shown, start),
        }
    }
}

/// A number literal as a message shows it: quoted, or (in a tool's answer, which is not recorded) not.
#[derive(Clone, Copy)]
struct Shown<'a> {
    literal: &'a str,
    quoted: bool,
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.quoted {
            write!(f, " {}", excerpt(self.literal))
        } else {
            Ok(())
        }
    }
}

/// A number literal read as the nearest double, refused when that is not finite.
fn double(shown: Shown<'_>, offset: usize) -> Result<Number, ParseError> {
    let value: f64 = shown
        .literal
        .parse()
        .map_err(|_| ParseError::new("invalid number", offset))?;
    Number::from_f64(value).ok_or_else(|| {
        ParseError::inexact_number(format!("number{shown} is not finite as a double"), offset)
    })
}

/// A number literal with a fraction or exponent in a tool's answer: its nearest double, refused unless
/// the shortest form that reads back as that double (what JCS writes) is the number the tool sent.
fn exact_double(literal: &str, offset: usize) -> Result<Number, ParseError> {
    let unquoted = Shown {
        literal,
        quoted: false,
    };
    let number = double(unquoted, offset)?;
    let shortest = ShortestForm::of(number.as_f64().unwrap_or_default());
    if Decimal::of(literal) == Decimal::of(shortest.as_str()) {
        Ok(number)
    } else {
        Err(ParseError::inexact_number(
            "number whose shortest round-trip form (what JCS writes) is another number than the one sent",
            offset,
        ))
    }
}

/// The shortest digits that read back as a double, in exponent form (`1.5e-7`), written on the stack:
/// this runs for every fractional number of every answer.
struct ShortestForm {
    bytes: [u8; 32],
    len: usize,
}

impl ShortestForm {
    fn of(value: f64) -> ShortestForm {
        let mut form = ShortestForm {
            bytes: [0; 32],
            len: 0,
        };
        // `{:e}` without a precision writes the shortest round-trip digits; the longest is 24 bytes.
        let _ = fmt::Write::write_fmt(&mut form, format_args!("{value:e}"));
        form
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for ShortestForm {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let end = self.len + text.len();
        self.bytes
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(text.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// A decimal number as a JSON number literal writes it, compared by value without allocating: its sign,
/// its significant digits (no leading or trailing zeros) and the power of ten just above the first one.
/// Zero has no digits, whatever its sign (JCS writes -0 as 0).
#[derive(Clone, Copy)]
struct Decimal<'a> {
    negative: bool,
    /// The mantissa as written (digits and at most one '.'), and how many of its digits to skip at the
    /// front (zeros) and to take.
    mantissa: &'a str,
    skip: usize,
    take: usize,
    exponent: i64,
}

impl<'a> Decimal<'a> {
    fn of(literal: &'a str) -> Decimal<'a> {
        let negative = literal.starts_with('-');
        let unsigned = literal.trim_start_matches('-');
        let (mantissa, written_exponent) = match unsigned.find(['e', 'E']) {
            Some(at) => (&unsigned[..at], saturating_exponent(&unsigned[at + 1..])),
            None => (unsigned, 0),
        };
        let digits = || mantissa.bytes().filter(u8::is_ascii_digit);
        let leading = digits().take_while(|&b| b == b'0').count();
        let trailing = digits().rev().take_while(|&b| b == b'0').count();
        let total = digits().count();
        let take = total.saturating_sub(leading + trailing);
        let integer_digits = mantissa.find('.').unwrap_or(mantissa.len()) as i64;
        Decimal {
            negative: negative && take > 0,
            mantissa,
            skip: leading,
            take,
            exponent: integer_digits - leading as i64 + written_exponent,
        }
    }

    fn digits(&self) -> impl Iterator<Item = u8> + 'a {
        let mantissa = self.mantissa;
        mantissa
            .bytes()
            .filter(u8::is_ascii_digit)
            .skip(self.skip)
            .take(self.take)
    }
}

impl PartialEq for Decimal<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self.take, other.take) {
            (0, 0) => true,
            (0, _) | (_, 0) => false,
            _ => {
                self.negative == other.negative
                    && self.exponent == other.exponent
                    && self.digits().eq(other.digits())
            }
        }
    }
}

/// An exponent's digits (with an optional sign) as a number, held far beyond any double's range instead
/// of overflowing.
fn saturating_exponent(text: &str) -> i64 {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = digits.bytes().fold(0_i64, |value, digit| {
        (value * 10 + i64::from(digit - b'0')).min(1 << 40)
    });
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// An integer literal as `u64` / `i64` when it fits one of them (`-0` is 0, as JCS writes it).
fn exact_integer(literal: &str, negative: bool) -> Option<Number> {
    let magnitude: u64 = literal.trim_start_matches('-').parse().ok()?;
    if !negative || magnitude == 0 {
        return Some(Number::from(magnitude));
    }
    // i64::MIN has no positive counterpart, hence the detour through i128.
    i64::try_from(-i128::from(magnitude)).ok().map(Number::from)
}

/// Turns an integer literal into a JSON number, refusing anything outside ±(2^53 − 1).
fn safe_integer(
    shown: Shown<'_>,
    negative: bool,
    digit_count: usize,
    offset: usize,
) -> Result<Number, ParseError> {
    let literal = shown.literal;
    let out_of_range =
        || ParseError::inexact_number(format!("integer{shown} is outside ±(2^53−1)"), offset);
    // 2^53 − 1 has 16 digits; longer literals are out of range and must not reach u64 parsing.
    if digit_count > 16 {
        return Err(out_of_range());
    }
    let digits = literal.trim_start_matches('-');
    let magnitude: u64 = digits.parse().map_err(|_| out_of_range())?;
    if magnitude > MAX_SAFE_INTEGER {
        return Err(out_of_range());
    }
    if negative && magnitude != 0 {
        // magnitude ≤ 2^53 − 1, so the conversion and the negation are exact.
        Ok(Number::from(-(magnitude as i64)))
    } else {
        // "-0" written as an integer means 0; JCS writes both as 0.
        Ok(Number::from(magnitude))
    }
}

fn excerpt(literal: &str) -> String {
    if literal.chars().count() <= MESSAGE_EXCERPT_CHARS {
        literal.to_string()
    } else {
        let mut short: String = literal.chars().take(MESSAGE_EXCERPT_CHARS).collect();
        short.push('…');
        short
    }
}

fn unpaired_surrogate(code_unit: u16, offset: usize) -> ParseError {
    ParseError::new(
        format!("unpaired surrogate \\u{code_unit:04x} in a string"),
        offset,
    )
}

/// Whether JCS writes every number in `value` as exactly the integer it is.
pub fn exact_in_jcs(value: &Value) -> bool {
    const SAFE: u64 = MAX_SAFE_INTEGER;
    match value {
        Value::Number(n) => n
            .as_i64()
            .map(|i| i.unsigned_abs() <= SAFE)
            .or_else(|| n.as_u64().map(|u| u <= SAFE))
            .unwrap_or(false),
        Value::Array(items) => items.iter().all(exact_in_jcs),
        Value::Object(map) => map.values().all(exact_in_jcs),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn refused(input: &[u8]) -> String {
        match parse_strict_json(input) {
            Ok(value) => panic!("accepted {:?} as {value}", String::from_utf8_lossy(input)),
            Err(message) => message,
        }
    }

    fn nested_arrays(levels: usize) -> String {
        format!("{}{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn accepts_ordinary_documents() {
        let value =
            parse_strict_json(br#" {"a": [1, -2, 3.5, true, false, null, "x\n\u00e9"], "b": {}} "#)
                .unwrap();
        assert_eq!(
            value,
            json!({"a": [1, -2, 3.5, true, false, null, "x\né"], "b": {}})
        );
        assert!(value["a"][0].is_u64());
        assert!(value["a"][1].is_i64());
        assert!(value["a"][2].is_f64());
    }

    #[test]
    fn a_tool_answer_holds_only_numbers_that_jcs_writes_as_sent() {
        let exact = [
            "0",
            "-0",
            "-0.0",
            "0.1",
            "1.0",
            "1.50",
            "100",
            "9007199254740991",
            "-9007199254740991",
            "1e21",
            "1E+21",
            "123.456e2",
            "0.30000000000000004",
            "5e-324",
            "1.7976931348623157e308",
            "0.000001",
            "1e-7",
        ];
        for number in exact {
            let answer = format!(r#"{{"n": {number}}}"#);
            assert!(parse_tool_answer(answer.as_bytes()).is_ok(), "{number}");
            assert!(!holds_inexact_number(answer.as_bytes()), "{number}");
        }
        let inexact = [
            ("9007199254740992", "integer is outside ±(2^53−1)"),
            ("-9007199254740993", "integer is outside ±(2^53−1)"),
            ("18446744073709551616", "integer is outside ±(2^53−1)"),
            ("1e400", "number is not finite as a double"),
            ("-1e400", "number is not finite as a double"),
            ("1.0000000000000000001", "shortest round-trip form"),
            ("0.3000000000000000444", "shortest round-trip form"),
            ("1e-400", "shortest round-trip form"),
            ("9007199254740993.0", "shortest round-trip form"),
        ];
        for (number, problem) in inexact {
            let answer = format!(r#"{{"result": {{"items": [{{"n": {number}}}]}}}}"#);
            assert!(holds_inexact_number(answer.as_bytes()), "{number}");
            match parse_tool_answer(answer.as_bytes()) {
                Err(AnswerRefusal::InexactNumber(message)) => assert!(
                    message.contains(problem)
                        && message.contains("at $.result.items[0].n (byte")
                        && !message.contains(number.trim_start_matches('-')),
                    "{number}: {message}"
                ),
                other => panic!("{number}: {other:?}"),
            }
        }
        // Numbers inside strings (keys included, escaped quotes too) are text, not numbers.
        let quoted = br#"{"s": "1.0000000000000000001", "k\"9007199254740993": ["\\", 0.5]}"#;
        assert!(parse_tool_answer(quoted).is_ok() && !holds_inexact_number(quoted));
        assert!(matches!(
            parse_tool_answer(br#"{"n": 1, "n": 2}"#),
            Err(AnswerRefusal::Malformed(message)) if message.starts_with("duplicate key")
        ));
    }

    #[test]
    fn refuses_duplicate_keys_at_any_depth() {
        let top = refused(br#"{"id":1,"id":2}"#);
        assert!(top.starts_with("duplicate key \"id\" at $ "), "{top}");

        let nested = refused(br#"{"payload":{"params":{"x":1,"x":1}}}"#);
        assert!(
            nested.starts_with("duplicate key \"x\" at $.payload.params "),
            "{nested}"
        );

        let in_array = refused(br#"{"ops":[{}, {"k":1,"k":2}]}"#);
        assert!(
            in_array.starts_with("duplicate key \"k\" at $.ops[1] "),
            "{in_array}"
        );

        let escaped = refused(br#"{"a":1,"\u0061":2}"#);
        assert!(escaped.starts_with("duplicate key \"a\""), "{escaped}");
    }

    #[test]
    fn names_equal_under_ascii_case_folding_are_refused_at_any_depth() {
        let check = |text: &str| match parse_strict_json(text.as_bytes()) {
            Ok(Value::Object(object)) => refuse_case_folded_names(&object),
            other => panic!("{text} is not an object: {other:?}"),
        };
        assert_eq!(
            check(r#"{"path": 1, "Path": 2}"#),
            Err("the names \"path\" and \"Path\" are equal under ASCII case folding at $".into())
        );
        assert_eq!(
            check(r#"{"a": [{}, {"x": {"URL": 1, "uRl": 2}}]}"#),
            Err(
                "the names \"URL\" and \"uRl\" are equal under ASCII case folding at $.a[1].x"
                    .into()
            )
        );
        assert!(check(r#"{"ok": 1, "odd key": {"K": 1, "k": 2}}"#)
            .is_err_and(|message| message.ends_with("at $[\"odd key\"]")));
        for accepted in [
            r#"{"path": 1, "paths": 2, "Pathx": 3}"#,
            r#"{"a": {"b": 1}, "c": {"B": 2}}"#,
            r#"{"\u00e4": 1, "\u00c4": 2}"#,
            r#"{"list": [{"k": 1}, {"K": 2}]}"#,
            r#"{}"#,
        ] {
            assert_eq!(check(accepted), Ok(()), "{accepted}");
        }
    }

    #[test]
    fn depth_limit_counts_the_top_level_as_one() {
        assert!(parse_strict_json(nested_arrays(MAX_DEPTH).as_bytes()).is_ok());
        let too_deep = refused(nested_arrays(MAX_DEPTH + 1).as_bytes());
        assert!(
            too_deep.starts_with("nesting deeper than 64 levels"),
            "{too_deep}"
        );

        let objects_64 = format!("{}1{}", r#"{"a":"#.repeat(MAX_DEPTH), "}".repeat(MAX_DEPTH));
        assert!(parse_strict_json(objects_64.as_bytes()).is_ok());
        let objects_65 = format!("{}1{}", r#"{"a":"#.repeat(65), "}".repeat(65));
        assert!(refused(objects_65.as_bytes()).contains("nesting deeper"));
    }

    #[test]
    fn huge_nesting_is_refused_without_overflowing_the_stack() {
        let bomb = "[".repeat(1_000_000);
        assert!(refused(bomb.as_bytes()).contains("nesting deeper"));
    }

    #[test]
    fn integer_literals_must_be_safe_integers() {
        assert_eq!(
            parse_strict_json(b"9007199254740991").unwrap(),
            json!(9_007_199_254_740_991_u64)
        );
        assert_eq!(
            parse_strict_json(b"-9007199254740991").unwrap(),
            json!(-9_007_199_254_740_991_i64)
        );
        assert!(refused(b"9007199254740992").contains("outside ±(2^53−1)"));
        assert!(refused(b"-9007199254740992").contains("outside"));
        assert!(refused(b"18446744073709551616").contains("outside"));
        assert!(refused(b"123456789012345678901234567890").contains("outside"));
        // Written with an exponent, a large value is a double and allowed.
        assert!(parse_strict_json(b"1e19").unwrap().is_f64());
        assert_eq!(parse_strict_json(b"-0").unwrap(), json!(0));
    }

    #[test]
    fn numbers_must_be_finite_doubles() {
        assert!(refused(b"1e400").contains("not finite"));
        assert!(refused(b"-1e400").contains("not finite"));
        assert_eq!(parse_strict_json(b"1.5e300").unwrap(), json!(1.5e300));
        assert_eq!(parse_strict_json(b"1E-7").unwrap(), json!(1e-7));
    }

    #[test]
    fn refuses_malformed_numbers_and_literals() {
        for bad in [
            "01",
            "-01",
            "-",
            "1.",
            ".5",
            "+1",
            "1e",
            "1e+",
            "NaN",
            "Infinity",
            "-Infinity",
            "0x10",
            "tru",
            "nul",
            "True",
        ] {
            let message = refused(bad.as_bytes());
            assert!(!message.is_empty(), "{bad}");
        }
        assert!(refused(b"01").contains("leading zero"));
    }

    #[test]
    fn surrogates_must_be_paired() {
        assert!(refused(br#""\ud800""#).contains("unpaired surrogate \\ud800"));
        assert!(refused(br#""\udc00""#).contains("unpaired surrogate \\udc00"));
        assert!(refused(br#""\ud800x""#).contains("unpaired surrogate"));
        assert!(refused(br#""\ud800\u0041""#).contains("unpaired surrogate"));
        assert!(refused(br#""\ud800\ud800""#).contains("unpaired surrogate"));
        assert_eq!(
            parse_strict_json(br#""\ud83d\ude00""#).unwrap(),
            json!("😀")
        );
        assert_eq!(
            parse_strict_json(br#""\uD83D\uDE00""#).unwrap(),
            json!("😀")
        );
    }

    #[test]
    fn refuses_bad_encodings_and_framing() {
        assert!(refused(b"{\"a\":\"\xff\"}").contains("not valid UTF-8"));
        assert!(refused(b"\xef\xbb\xbf{}").contains("U+FEFF"));
        assert_eq!(refused(b""), "empty body at $ (byte 0)");
        assert!(refused(b"   ").contains("no JSON value"));
        assert!(refused(b"{} x").contains("trailing characters"));
        assert!(refused(b"{}{}").contains("trailing characters"));
        assert!(refused(b"{\"a\":1,}").contains("expected a string key"));
        assert!(refused(b"[1,]").contains("expected a JSON value"));
        assert!(refused(b"{\"a\" 1}").contains("':'"));
        assert!(refused(b"{'a':1}").contains("string key"));
        assert!(refused(b"\"abc").contains("unterminated string"));
        assert!(refused(b"\"a\\x\"").contains("invalid escape"));
        assert!(refused(b"\"\\u12\"").contains("\\u escape"));
    }

    #[test]
    fn refuses_raw_control_characters_in_strings() {
        assert!(refused(b"\"a\x01b\"").contains("control character U+0001"));
        assert!(refused(b"\"line\nbreak\"").contains("control character U+000A"));
        assert!(refused(b"\"tab\there\"").contains("U+0009"));
        assert_eq!(
            parse_strict_json(b"\"\\u0001\\n\\t\"").unwrap(),
            json!("\u{1}\n\t")
        );
    }

    #[test]
    fn error_paths_quote_unusual_keys() {
        let message = refused(br#"{"a b":{"c":[0, 01]}}"#);
        assert!(message.contains(r#"at $["a b"].c[1]"#), "{message}");
    }

    fn audit(input: &[u8]) -> Result<Value, String> {
        parse_strict_json_with(input, AUDIT_LINES)
    }

    #[test]
    fn audit_lines_read_every_finite_integer_as_serde_json_does() {
        // JCS writes the double 2^53 as plain digits; serde_json tool answers hold any u64 / i64.
        for literal in [
            "9007199254740992",
            "-9007199254740993",
            "18446744073709551615",
            "-9223372036854775808",
            "18446744073709552000",
            "-9223372036854775809",
            "123456789012345678901234567890",
        ] {
            let ours = audit(literal.as_bytes());
            let theirs: Result<Value, _> = serde_json::from_str(literal);
            assert_eq!(ours.ok(), theirs.ok(), "{literal}");
            assert!(refused(literal.as_bytes()).contains("outside ±(2^53−1)"));
        }
        assert!(audit(b"18446744073709551615").is_ok_and(|v| v.is_u64()));
        assert!(audit(b"-9223372036854775808").is_ok_and(|v| v.is_i64()));
        assert!(audit(b"18446744073709551616").is_ok_and(|v| v.is_f64()));
        // Past f64's range an integer is not finite, under both rules.
        let huge = "9".repeat(400);
        assert!(
            audit(huge.as_bytes()).is_err_and(|message| message.contains("not finite as a double"))
        );
        assert_eq!(audit(b"-0"), Ok(json!(0)));
    }

    #[test]
    fn audit_lines_nest_deeper_but_not_without_bound() {
        assert!(refused(nested_arrays(MAX_AUDIT_DEPTH).as_bytes()).contains("deeper than 64"));
        assert!(audit(nested_arrays(MAX_AUDIT_DEPTH).as_bytes()).is_ok());
        assert!(audit(nested_arrays(MAX_AUDIT_DEPTH + 1).as_bytes())
            .is_err_and(|message| message.contains("nesting deeper than 256 levels")));
        assert!(audit("[".repeat(1_000_000).as_bytes()).is_err());
    }

    #[test]
    fn audit_lines_refuse_everything_else_that_untrusted_input_refuses() {
        for bad in [
            &br#"{"seq":1,"seq":2}"#[..],
            br#"{"a":"\ud800"}"#,
            b"1e400",
            b"{\"a\":\"\x01\"}",
            b"{} {}",
            b"",
            b"\xff",
            b"01",
            b"NaN",
        ] {
            let strict = refused(bad);
            assert_eq!(
                audit(bad),
                Err(strict),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// Values inside the limits that serde_json can print: safe integers, finite doubles, any strings.
    fn arbitrary_value() -> impl Strategy<Value = Value> {
        let safe = MAX_SAFE_INTEGER as i64;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-safe..=safe).prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter_map("finite doubles only", Number::from_f64)
                .prop_map(Value::Number),
            ".*".prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,8}", inner, 0..6)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn round_trips_serde_json_output(value in arbitrary_value()) {
            let compact = serde_json::to_vec(&value).unwrap();
            prop_assert_eq!(parse_strict_json(&compact).unwrap(), value.clone());
            let pretty = serde_json::to_vec_pretty(&value).unwrap();
            prop_assert_eq!(parse_strict_json(&pretty).unwrap(), value);
        }

        #[test]
        fn every_double_in_its_shortest_form_is_an_exact_answer(double in any::<f64>()) {
            prop_assume!(double.is_finite());
            let answer = format!("[{double:e}]");
            let read = parse_tool_answer(answer.as_bytes());
            prop_assert_eq!(read.map(|v| v[0].as_f64()), Ok(Some(double)), "{}", answer);
            prop_assert!(!holds_inexact_number(answer.as_bytes()), "{}", answer);
        }

        #[test]
        fn never_panics_on_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_strict_json(&bytes);
        }

        #[test]
        fn never_panics_on_json_like_noise(text in r#"[\[\]{}",:0-9eE.+\-\\ua-f tnrl]{0,128}"#) {
            // Agrees with serde_json whenever serde_json refuses (we are only ever stricter).
            let ours = parse_strict_json(text.as_bytes());
            if serde_json::from_str::<Value>(&text).is_err() {
                prop_assert!(ours.is_err());
            }
        }
    }
}
