//! Unicode general category Cf ("format") characters: zero-width spaces and joiners, bidirectional
//! controls, the tag block U+E0000–U+E007F. They change how text is read or shown without being seen,
//! which is how instructions are hidden in an answer (SPEC 18).
//!
//! A table of ranges rather than a lookup per character in a general-purpose crate: the guard runs on
//! every answer, and a range match is a few comparisons per character. A unit test checks the table
//! against `unicode-general-category` (Unicode 16.0) for every code point, so a Unicode update that adds
//! a Cf character fails the test instead of slipping through.

/// Every Cf code point of Unicode 16.0, as inclusive ranges in ascending order.
const CF: [(u32, u32); 21] = [
    (0xAD, 0xAD),
    (0x600, 0x605),
    (0x61C, 0x61C),
    (0x6DD, 0x6DD),
    (0x70F, 0x70F),
    (0x890, 0x891),
    (0x8E2, 0x8E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
];

/// Whether `c` is of general category Cf.
pub fn is_hidden(c: char) -> bool {
    let c = c as u32;
    if c < 0xAD {
        return false;
    }
    CF.iter().any(|&(low, high)| low <= c && c <= high)
}

/// Whether a byte can begin the UTF-8 form of a Cf character: the first bytes of the ranges above
/// (U+00AD → C2, U+0600–U+070F → D8–DC, U+0890–U+08E2 → E0, U+180E → E1, U+200B–U+206F → E2,
/// U+FEFF–U+FFFB → EF, U+110BD–U+1D17A → F0, the tags → F3).
fn may_begin_hidden(byte: u8) -> bool {
    matches!(byte, 0xC2 | 0xD8..=0xDC | 0xE0..=0xE2 | 0xEF | 0xF0 | 0xF3)
}

/// Bytes looked at together: a block without a byte of 0xC2 or above holds no Cf character (one vector
/// comparison per block; testing for the exact first bytes here measured slower).
const BLOCK: usize = 32;

/// Calls `each` with the byte range of every Cf character of `text`, in order. Most of an answer is
/// ASCII: blocks of it are skipped whole; in the others only the bytes that may begin a Cf character are
/// decoded.
fn find(text: &str, mut each: impl FnMut(usize, usize)) {
    for (index, block) in text.as_bytes().chunks(BLOCK).enumerate() {
        if !block.iter().fold(false, |any, &b| any | (b >= 0xC2)) {
            continue;
        }
        for (offset, &byte) in block.iter().enumerate() {
            if may_begin_hidden(byte) {
                // Each of these bytes begins a character (none is a continuation byte): a boundary.
                let at = index * BLOCK + offset;
                if let Some(c) = text[at..].chars().next().filter(|&c| is_hidden(c)) {
                    each(at, at + c.len_utf8());
                }
            }
        }
    }
}

/// How many Cf characters `text` holds.
pub fn count(text: &str) -> usize {
    let mut found = 0;
    find(text, |_, _| found += 1);
    found
}

/// `text` without its Cf characters, and how many there were; None when it has none. The text between
/// them is copied in slices (`String::retain` goes character by character).
pub fn strip(text: &str) -> Option<(String, usize)> {
    let mut kept = String::new();
    let (mut last, mut found) = (0, 0);
    find(text, |start, end| {
        kept.push_str(&text[last..start]);
        last = end;
        found += 1;
    });
    if found == 0 {
        return None;
    }
    kept.push_str(&text[last..]);
    Some((kept, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use unicode_general_category::{get_general_category, GeneralCategory};

    #[test]
    fn guard_table_is_exactly_the_cf_category() {
        for code in 0..=0x10FFFFu32 {
            let Some(c) = char::from_u32(code) else {
                continue;
            };
            assert_eq!(
                is_hidden(c),
                get_general_category(c) == GeneralCategory::Format,
                "U+{code:04X}"
            );
        }
    }

    #[test]
    fn guard_lead_bytes_cover_every_cf_character() {
        for code in 0..=0x10FFFFu32 {
            if let Some(c) = char::from_u32(code).filter(|&c| is_hidden(c)) {
                let mut utf8 = [0; 4];
                let first = c.encode_utf8(&mut utf8).as_bytes()[0];
                assert!(may_begin_hidden(first), "U+{code:04X}");
                let text = format!("{}{c}{}", "é".repeat(code as usize % 40), "x".repeat(33));
                assert_eq!(count(&text), 1, "U+{code:04X}");
            }
        }
    }

    #[test]
    fn guard_counts_tags_joiners_and_bidi_controls() {
        assert_eq!(count("plain ascii"), 0);
        assert_eq!(
            count("caf\u{e9} and cafe\u{301}"),
            0,
            "NFC and NFD are not Cf"
        );
        assert_eq!(count("a\u{200d}b\u{202e}c\u{e0041}\u{e007f}"), 4);
        assert_eq!(count("\u{feff}bom"), 1);
        assert_eq!(
            strip("a\u{200d}b\u{e0041}\u{e007f}c\u{ad}"),
            Some(("abc".to_owned(), 4))
        );
        assert_eq!(strip("caf\u{e9}"), None);
    }
}
