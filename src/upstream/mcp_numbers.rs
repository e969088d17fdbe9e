//! SPEC 20 rule 5 for MCP upstreams: rmcp reads each message into serde_json values, which keep no
//! number text, so a fraction with more digits than a double holds would pass unseen and one receipt
//! would bind two answers. The raw text of every message from the server (an HTTP body, an SSE event,
//! a stdio line) is checked here before rmcp reads it; a message holding an inexact number is reported
//! by the id of the request it answers, and the call refuses it (5003) once rmcp hands the answer over.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rmcp::model::RequestId;
use rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;
use serde::Deserialize;
use tokio::io::{AsyncRead, ReadBuf};

use crate::strict_json::{holds_inexact_number, parse_tool_answer, AnswerRefusal};

/// Where an inexact number is reported: `at` is the refusal naming the number's path.
pub(crate) trait InexactNumbers: Send + Sync {
    fn found(&self, id: RequestId, at: String);
}

/// Checks one JSON-RPC message from an MCP server. The scan allocates nothing; only a message that
/// holds an inexact number is read again, for the path and the id.
pub(crate) fn check_message(message: &[u8], numbers: &dyn InexactNumbers) {
    if !holds_inexact_number(message) {
        return;
    }
    // Text that is not strict JSON is left to rmcp, which refuses it or reads it as it reads any.
    let Err(AnswerRefusal::InexactNumber(at)) = parse_tool_answer(message) else {
        return;
    };
    if let Some(id) = answered_id(message) {
        numbers.found(id, at);
    }
}

/// The `id` of a JSON-RPC response (the rest of the message is skipped, numbers unread).
fn answered_id(message: &[u8]) -> Option<RequestId> {
    #[derive(Deserialize)]
    struct Answer {
        id: RequestId,
    }
    serde_json::from_slice::<Answer>(message)
        .ok()
        .map(|answer| answer.id)
}

/// A child's stdout as rmcp reads it, every byte passed through unchanged, with each complete line
/// checked on the way.
pub(crate) struct CheckedLines<R> {
    inner: R,
    /// The line in progress when a read ended inside it.
    partial: Vec<u8>,
    /// The line in progress is longer than rmcp reads (it drops such lines), so it is not kept.
    overlong: bool,
    numbers: Arc<dyn InexactNumbers>,
}

impl<R> CheckedLines<R> {
    pub(crate) fn new(inner: R, numbers: Arc<dyn InexactNumbers>) -> Self {
        Self {
            inner,
            partial: Vec::new(),
            overlong: false,
            numbers,
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        for piece in bytes.split_inclusive(|&byte| byte == b'\n') {
            let complete = piece.ends_with(b"\n");
            if self.partial.is_empty() && !self.overlong && complete {
                // A whole line within one read is checked where it lies, without a copy.
                check_message(piece, self.numbers.as_ref());
                continue;
            }
            self.keep(piece);
            if complete {
                if !self.overlong {
                    check_message(&self.partial, self.numbers.as_ref());
                }
                self.partial.clear();
                self.overlong = false;
            }
        }
    }

    fn keep(&mut self, piece: &[u8]) {
        if self.overlong {
            return;
        }
        if self.partial.len() + piece.len() > DEFAULT_MAX_LINE_LENGTH {
            self.overlong = true;
            self.partial = Vec::new();
        } else {
            self.partial.extend_from_slice(piece);
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for CheckedLines<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.feed(&buf.filled()[before..]);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::AsyncReadExt;

    use super::*;

    #[derive(Default)]
    struct Found(Mutex<Vec<(RequestId, String)>>);

    impl InexactNumbers for Found {
        fn found(&self, id: RequestId, at: String) {
            self.0.lock().unwrap().push((id, at));
        }
    }

    #[tokio::test]
    async fn lines_pass_unchanged_and_each_inexact_answer_is_reported_by_its_id() {
        let text = concat!(
            r#"{"jsonrpc":"2.0","id":1,"result":{"n":0.5}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"result":{"structuredContent":{"n":1.0000000000000000001}}}"#,
            "\r\n",
            r#"{"jsonrpc":"2.0","id":"three","result":{"n":[9007199254740993]}}"#,
            "\n",
        );
        let found = Arc::new(Found::default());
        // One byte per read, so that every line is put together from pieces.
        let (mut writer, reader) = tokio::io::duplex(1);
        let feeding = tokio::spawn(async move {
            tokio::io::AsyncWriteExt::write_all(&mut writer, text.as_bytes()).await
        });
        let mut passed = String::new();
        CheckedLines::new(reader, found.clone())
            .read_to_string(&mut passed)
            .await
            .unwrap();
        feeding.await.unwrap().unwrap();
        assert_eq!(passed, text);
        let found = found.0.lock().unwrap();
        let ids: Vec<&RequestId> = found.iter().map(|(id, _)| id).collect();
        assert_eq!(
            ids,
            [&RequestId::Number(2), &RequestId::String("three".into())]
        );
        assert!(found[0].1.contains("at $.result.structuredContent.n "));
        assert!(found[1].1.contains("at $.result.n[0] "));
    }
}
