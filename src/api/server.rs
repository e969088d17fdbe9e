//! The connection loop: HTTP/1.1 through hyper, with the read timeouts of SPEC 11 r2 and a graceful
//! drain. A client that sends nothing, or part of a request head and then nothing, must not hold a
//! connection and a task forever: after `header_read_timeout_secs` it gets 408 and the connection closes.
//! (Body timeouts are applied where bodies are read, in `invoke.rs` and `ControlBody`.)

use std::future::Future;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

use crate::error::{ApiError, Code};

/// Serves `app` until `shutdown` resolves, then waits for the connections in flight to finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let graceful = GracefulShutdown::new();
    // HTTP/1.1 alone: hyper-util's auto builder first reads up to 24 bytes, with no timer, to tell
    // HTTP/2's preface apart, so a client that sent nothing, or "P", held its connection for ever.
    // hyper's own head timer runs from the moment a head is awaited.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    tokio::pin!(shutdown);
    loop {
        let (stream, client) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        // A second handle on the socket answers 408 after hyper gives up on a slow request head.
        let spare = match duplicate(&stream) {
            Ok(spare) => spare,
            Err(e) => {
                tracing::warn!(error = %e, "cannot duplicate a client socket; connection dropped");
                continue;
            }
        };
        let app = app.clone();
        // The router learns the client's address as `ConnectInfo` (the audit of unreadable bodies uses it).
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(client));
            app.clone().oneshot(request)
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                if error.is_timeout() {
                    request_timeout(spare).await;
                }
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

fn duplicate(stream: &TcpStream) -> std::io::Result<TcpStream> {
    use std::os::fd::{AsFd, BorrowedFd};
    let fd: BorrowedFd<'_> = stream.as_fd();
    let owned = fd.try_clone_to_owned()?;
    let std_stream = std::net::TcpStream::from(owned);
    std_stream.set_nonblocking(true)?;
    TcpStream::from_std(std_stream)
}

/// Writes a 408 with the SPEC error body on a connection whose request head did not arrive in time.
async fn request_timeout(mut stream: TcpStream) {
    let body = ApiError::new(
        Code::InvalidRequest,
        "the request head did not arrive within limits.header_read_timeout_secs",
    )
    .body()
    .to_string();
    let response = format!(
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
