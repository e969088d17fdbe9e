//! Audit events and claim records are most of what the embedded store holds: a claimed call leaves two
//! events and one claim of about 2.7 KB of JSON, whose field names, tool names and prefixes repeat from
//! record to record. They are stored as zstd frames compressed with a dictionary trained on such records
//! (`records.zdict`, made by `scripts/train-store-dictionary.sh`), about a third of their text.
//!
//! The frames are standard: `zstd -d -D records.zdict` reads a row's bytes. Rows that an earlier build
//! wrote hold plain text and are read as they are; sessions, approvals and contexts stay text, so an
//! operator's `sqlite3` shell reads them directly.

use std::cell::RefCell;
use std::sync::LazyLock;

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ValueRef};
use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

use super::super::{StoreError, StoreResult};

/// The dictionary every packed row of this format is compressed with. Its bytes must never change:
/// rows written with it are read with it for as long as the store keeps them.
const DICTIONARY: &[u8] = include_bytes!("records.zdict");

/// The id `records.zdict` carries (set when it was trained); a frame naming another is refused.
const DICTIONARY_ID: u32 = 0x5EA1_0001;

/// zstd's fastest level: with the dictionary it packs these records as small as the default level 3 does
/// (395 against 398 bytes for an event of 1,028, measured on records the dictionary was not trained on).
const LEVEL: i32 = 1;

/// The largest text a frame may unpack to: far above any record the gateway writes (a claim's stored
/// answer is capped by the response limits), so only a damaged frame reaches it.
const LARGEST_TEXT: usize = 256 << 20;

static ENCODER: LazyLock<EncoderDictionary<'static>> =
    LazyLock::new(|| EncoderDictionary::copy(DICTIONARY, LEVEL));
static DECODER: LazyLock<DecoderDictionary<'static>> =
    LazyLock::new(|| DecoderDictionary::copy(DICTIONARY));

thread_local! {
    // One context per thread, made on first use: a context holds about a megabyte of tables, so calls
    // reuse it instead of making one each.
    static COMPRESSOR: RefCell<Option<Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

fn packing_failed(what: &str, err: std::io::Error) -> StoreError {
    StoreError::Corrupt(format!("zstd could not {what} a store record: {err}"))
}

/// `text` as the row stores it.
pub(super) fn pack(text: &str) -> StoreResult<Vec<u8>> {
    COMPRESSOR.with_borrow_mut(|slot| {
        let compressor = match slot {
            Some(compressor) => compressor,
            None => slot.insert(
                Compressor::with_prepared_dictionary(&ENCODER)
                    .map_err(|e| packing_failed("prepare to compress", e))?,
            ),
        };
        compressor
            .compress(text.as_bytes())
            .map_err(|e| packing_failed("compress", e))
    })
}

fn unpack(frame: &[u8]) -> Result<String, String> {
    match zstd::zstd_safe::get_dict_id_from_frame(frame) {
        Some(id) if id.get() == DICTIONARY_ID => {}
        other => {
            return Err(format!(
                "a packed record names dictionary {:?}, not the {DICTIONARY_ID:#x} this build has",
                other.map(|id| id.get())
            ))
        }
    }
    let bytes = DECOMPRESSOR.with_borrow_mut(|slot| {
        let decompressor = match slot {
            Some(decompressor) => decompressor,
            None => slot.insert(
                Decompressor::with_prepared_dictionary(&DECODER).map_err(|e| e.to_string())?,
            ),
        };
        decompressor
            .decompress(frame, LARGEST_TEXT)
            .map_err(|e| format!("a packed record does not unpack: {e}"))
    })?;
    String::from_utf8(bytes).map_err(|_| "a packed record is not UTF-8 text".to_owned())
}

/// A record or an event as a row holds it: packed, or plain text from an earlier build.
pub(super) struct Stored(pub String);

impl FromSql for Stored {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        match value {
            ValueRef::Text(text) => std::str::from_utf8(text)
                .map(|text| Stored(text.to_owned()))
                .map_err(|e| FromSqlError::Other(Box::new(e))),
            ValueRef::Blob(frame) => unpack(frame)
                .map(Stored)
                .map_err(|e| FromSqlError::Other(e.into())),
            _ => Err(FromSqlError::InvalidType),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_comes_back_as_it_went_in_and_smaller() {
        let text = r#"{"kind":"tool_call","decision":"allow","tool":"fs.read","session_id":"s-1"}"#
            .repeat(8);
        let frame = pack(&text).unwrap();
        assert!(frame.len() < text.len() / 2, "{} bytes", frame.len());
        assert_eq!(
            Stored::column_result(ValueRef::Blob(&frame)).unwrap().0,
            text
        );
        assert_eq!(
            Stored::column_result(ValueRef::Text(text.as_bytes()))
                .unwrap()
                .0,
            text
        );
    }

    #[test]
    fn a_frame_of_another_dictionary_or_damaged_is_refused() {
        let plain = zstd::bulk::compress(b"{\"a\":1}", 3).unwrap();
        let err = unpack(&plain).unwrap_err();
        assert!(err.contains("names dictionary None"), "{err}");
        let mut frame = pack(&"{\"tool\":\"fs.read\"}".repeat(20)).unwrap();
        let end = frame.len() - 1;
        frame.truncate(end);
        assert!(unpack(&frame).unwrap_err().contains("does not unpack"));
        assert!(Stored::column_result(ValueRef::Integer(1)).is_err());
    }
}
