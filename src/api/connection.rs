//! One client connection as hyper sees it: its socket (TCP, or TLS over TCP) with the timers of SPEC 11
//! that hyper does not keep. A request head must arrive within `header_read_timeout_secs`, else it gets
//! 408, written here on the connection's one descriptor; a keep-alive connection waiting for its next
//! request is closed after `idle_timeout_secs`; a write that the client does not take for
//! `write_timeout_secs` fails the connection. Bodies are timed where they are read (`read_body`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use futures_util::task::AtomicWaker;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::error::{ApiError, Code};

/// The connection timers of SPEC 11.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// From the moment a head is awaited (or, between keep-alive requests, from its first byte).
    pub head: Duration,
    /// A kept-alive connection with no byte of a next request.
    pub idle: Duration,
    /// A write that makes no progress.
    pub write: Duration,
}

/// Whether a request is being answered on a connection: the service that answers tells the socket, which
/// sees only bytes. Between a head handed to the router and the end of its answer no read timer runs.
#[derive(Default)]
pub struct Exchanges {
    started: AtomicU64,
    answering: AtomicBool,
    /// The read side that waited while an answer was being made: woken when it ends, to start the
    /// wait for the next request (hyper, itself keeping no head timer, would not look again).
    reader: AtomicWaker,
}

impl Exchanges {
    /// A request head reached the router; its answer has ended when the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Answering {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.answering.store(true, Ordering::SeqCst);
        Answering(self.clone())
    }
}

/// Held by a response body (or the service's future) until the answer is written or abandoned.
pub struct Answering(Arc<Exchanges>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.store(false, Ordering::SeqCst);
        self.0.reader.wake();
    }
}

/// A response body that keeps its request's exchange open until hyper has taken its last frame.
pub struct AnsweredBody {
    body: axum::body::Body,
    _answering: Answering,
}

impl AnsweredBody {
    pub fn new(body: axum::body::Body, answering: Answering) -> Self {
        AnsweredBody {
            body,
            _answering: answering,
        }
    }
}

impl HttpBody for AnsweredBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// What the read side waits for when no request is being answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaiting {
    /// A request head, begun or due: 408 when it does not arrive in time.
    Head,
    /// The next request of a kept-alive connection: closed without an answer when none comes.
    Idle,
}

/// A connection's socket with its timers.
pub struct Guarded<S> {
    io: S,
    timeouts: Timeouts,
    exchanges: Arc<Exchanges>,
    /// `Exchanges::started` when the read side last looked: a change means a new request began.
    seen_started: u64,
    /// Bytes have arrived since the last request began (or since the connection opened).
    heard: bool,
    awaiting: Option<Awaiting>,
    read_deadline: Option<Pin<Box<Sleep>>>,
    write_stalled: bool,
    write_deadline: Option<Pin<Box<Sleep>>>,
}

impl<S> Guarded<S> {
    pub fn new(io: S, timeouts: Timeouts, exchanges: Arc<Exchanges>) -> Self {
        Guarded {
            io,
            timeouts,
            exchanges,
            seen_started: 0,
            heard: false,
            awaiting: None,
            read_deadline: None,
            write_stalled: false,
            write_deadline: None,
        }
    }

    /// Forgets the read side's wait when a request began since it last looked.
    fn note_request_start(&mut self) {
        let started = self.exchanges.started.load(Ordering::SeqCst);
        if started != self.seen_started {
            self.seen_started = started;
            self.heard = false;
            self.awaiting = None;
        }
    }

    fn note_bytes(&mut self) {
        self.heard = true;
        // The first byte of a next request: from now its head has the head's own, shorter time.
        if self.awaiting == Some(Awaiting::Idle) {
            self.awaiting = None;
        }
    }

    /// Starts the wait for a head (or for the next request) when none runs; which one ran out, if one did.
    fn read_timed_out(&mut self, cx: &mut Context<'_>) -> Option<Awaiting> {
        let awaiting = match self.awaiting {
            Some(awaiting) => awaiting,
            None => {
                let (awaiting, limit) = if self.seen_started > 0 && !self.heard {
                    (Awaiting::Idle, self.timeouts.idle)
                } else {
                    (Awaiting::Head, self.timeouts.head)
                };
                arm(&mut self.read_deadline, limit);
                self.awaiting = Some(awaiting);
                awaiting
            }
        };
        ran_out(&mut self.read_deadline, cx).then_some(awaiting)
    }

    /// Whether a request is being answered; if so, this task is woken when the answer ends.
    fn still_answering(&self, cx: &mut Context<'_>) -> bool {
        let answering = || self.exchanges.answering.load(Ordering::SeqCst);
        if !answering() {
            return false;
        }
        self.exchanges.reader.register(cx.waker());
        // Checked again: the answer may have ended before the waker was in place.
        answering()
    }

    /// A write that makes progress clears the stall; one that cannot starts (or checks) its deadline.
    fn timed_write<T>(
        &mut self,
        polled: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.write_stalled = false;
            return polled;
        }
        if !self.write_stalled {
            self.write_stalled = true;
            arm(&mut self.write_deadline, self.timeouts.write);
        }
        if ran_out(&mut self.write_deadline, cx) {
            return Poll::Ready(Err(timed_out(
                "the client did not take the answer within limits.write_timeout_secs",
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncWrite + Unpin> Guarded<S> {
    /// The 408 of a head that did not arrive in time, written as far as the socket takes it at once,
    /// so that a client that reads nothing does not hold the connection any longer. Not while an earlier
    /// answer is still stuck in the socket: the 408 would land in its middle.
    fn answer_request_timeout(&mut self, cx: &mut Context<'_>) {
        if self.write_stalled {
            return;
        }
        let response = request_timeout_response();
        let mut written = 0;
        while written < response.len() {
            match Pin::new(&mut self.io).poll_write(cx, &response[written..]) {
                Poll::Ready(Ok(n)) if n > 0 => written += n,
                _ => return,
            }
        }
        let _ = Pin::new(&mut self.io).poll_flush(cx);
        let _ = Pin::new(&mut self.io).poll_shutdown(cx);
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        this.note_request_start();
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.note_bytes();
        }
        if polled.is_ready() || this.still_answering(cx) {
            return polled;
        }
        match this.read_timed_out(cx) {
            None => Poll::Pending,
            Some(Awaiting::Idle) => {
                Poll::Ready(Err(timed_out("no request within limits.idle_timeout_secs")))
            }
            Some(Awaiting::Head) => {
                this.answer_request_timeout(cx);
                Poll::Ready(Err(timed_out(
                    "the request head did not arrive within limits.header_read_timeout_secs",
                )))
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.timed_write(polled, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.timed_write(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.timed_write(polled, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.timed_write(polled, cx)
    }
}

/// Sets `deadline` to `after` from now, reusing its timer.
fn arm(deadline: &mut Option<Pin<Box<Sleep>>>, after: Duration) {
    let at = tokio::time::Instant::now() + after;
    match deadline {
        Some(sleep) => sleep.as_mut().reset(at),
        None => *deadline = Some(Box::pin(tokio::time::sleep_until(at))),
    }
}

/// Whether `deadline` has passed; if not, the task is woken when it does.
fn ran_out(deadline: &mut Option<Pin<Box<Sleep>>>, cx: &mut Context<'_>) -> bool {
    deadline
        .as_mut()
        .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
}

fn timed_out(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, why)
}

/// A whole HTTP/1.1 408 with the SPEC error body, closing the connection.
fn request_timeout_response() -> Vec<u8> {
    let body = ApiError::new(
        Code::InvalidRequest,
        "the request head did not arrive within limits.header_read_timeout_secs",
    )
    .body()
    .to_string();
    format!(
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
