//! The connection loop: HTTP/1.1 through hyper, over TCP or TLS, with the connection limits of SPEC 11
//! (r2: read timeouts; r3: `max_connections`, write and idle timeouts, one descriptor per connection,
//! the open-file limit raised at start-up) and a graceful drain. A client that sends nothing, trickles
//! a head, or never reads its answers holds a connection only for a bounded time, and never more of
//! them than `max_connections`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

use super::connection::{AnsweredBody, Exchanges, Guarded, Timeouts};
use crate::config::Config;
use crate::tls::Acceptor;

/// How often, at most, a full listener says so in the log.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// What the listener needs from the configuration: its timers, its cap and its TLS.
pub struct Front {
    timeouts: Timeouts,
    max_connections: usize,
    tls: Option<Acceptor>,
}

impl Front {
    /// Reads the TLS files when `tls` is set; an error names the key whose file does not load.
    pub fn from_config(config: &Config) -> Result<Front, String> {
        Ok(Front {
            tls: Acceptor::from_files(config.tls_files())?,
            ..Front::plain(config)
        })
    }

    /// The limits of `config` without TLS: the metrics listener, which a scraper reaches on an internal
    /// address.
    pub fn plain(config: &Config) -> Front {
        let limits = &config.limits;
        Front {
            timeouts: Timeouts {
                head: Duration::from_secs(limits.header_read_timeout_secs),
                idle: Duration::from_secs(limits.idle_timeout_secs),
                write: Duration::from_secs(limits.write_timeout_secs),
            },
            max_connections: limits.max_connections,
            tls: None,
        }
    }

    /// `https` when the listener speaks TLS.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

/// Serves `app` until `shutdown` resolves, then waits for the connections in flight to finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    front: Front,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let graceful = GracefulShutdown::new();
    let front = Arc::new(front);
    let slots = Arc::new(Semaphore::new(front.max_connections));
    let mut refusals = Refusals::default();
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
        // Beyond the cap a connection is closed at once (SPEC 11 r3): the descriptors the gateway
        // needs for its store, its audit file and its upstreams stay free.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refusals.note(front.max_connections);
            continue;
        };
        let _ = stream.set_nodelay(true);
        fail_untaken_answers(&stream, front.timeouts.write);
        let accepted = Accepted {
            stream,
            client,
            _slot: slot,
        };
        tokio::spawn(accepted.serve(front.clone(), app.clone(), graceful.watcher()));
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Makes the kernel fail the connection when what the gateway wrote stays unacknowledged, or the client's
/// window stays shut, for `write_timeout` (SPEC 11 r3). Answers that fit in the socket's send buffer
/// (megabytes on Linux) leave no write of ours stalled, so only the kernel sees a client that pipelines
/// requests and never reads: the failure then wakes the connection's wait for its next request, and its
/// descriptor is released. `Guarded` times the writes that do stall.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn fail_untaken_answers(stream: &TcpStream, write_timeout: Duration) {
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_user_timeout(Some(write_timeout)) {
        tracing::debug!(error = %e, "cannot set TCP_USER_TIMEOUT");
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn fail_untaken_answers(_stream: &TcpStream, _write_timeout: Duration) {}

/// A connection taken within the cap; its slot is given back when it closes.
struct Accepted {
    stream: TcpStream,
    client: SocketAddr,
    _slot: OwnedSemaphorePermit,
}

impl Accepted {
    async fn serve(self, front: Arc<Front>, app: Router, watcher: Watcher) {
        let Accepted {
            stream,
            client,
            _slot,
        } = self;
        let Some(tls) = &front.tls else {
            return http(stream, client, front.timeouts, app, watcher).await;
        };
        // A handshake is part of the head: it gets the head's time.
        match tokio::time::timeout(front.timeouts.head, tls.accept(stream)).await {
            Ok(Ok(stream)) => http(stream, client, front.timeouts, app, watcher).await,
            Ok(Err(e)) => tracing::debug!(%client, error = %e, "TLS handshake failed"),
            Err(_) => tracing::debug!(%client, "TLS handshake timed out"),
        }
    }
}

/// HTTP/1.1 on one connection until it closes, fails or times out.
async fn http<S>(io: S, client: SocketAddr, timeouts: Timeouts, app: Router, watcher: Watcher)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let exchanges = Arc::new(Exchanges::default());
    // The router learns the client's address as `ConnectInfo` (the audit of unreadable bodies uses it).
    let service = {
        let exchanges = exchanges.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(client));
            let answering = exchanges.begin();
            let answer = app.clone().oneshot(request);
            async move {
                let response = answer.await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|body| AnsweredBody::new(body, answering)),
                )
            }
        })
    };
    // HTTP/1.1 alone: hyper-util's auto builder first reads up to 24 bytes, with no timer, to tell
    // HTTP/2's preface apart. hyper's own head timer is off: it also runs while a kept-alive connection
    // idles, which has a time of its own; `Guarded` keeps both.
    let connection = http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(Guarded::new(io, timeouts, exchanges)), service);
    // Its error (a timeout, a client gone) ends this connection only; each timeout has done its part.
    let _ = watcher.watch(connection).await;
}

/// Says in the log, at most every [`REFUSAL_LOG_EVERY`], that connections are being closed at the cap.
#[derive(Default)]
struct Refusals {
    last_logged: Option<Instant>,
    since_logged: u64,
}

impl Refusals {
    fn note(&mut self, cap: usize) {
        metrics::counter!("sealgate_connections_refused_total").increment(1);
        self.since_logged += 1;
        if self
            .last_logged
            .is_some_and(|at| at.elapsed() < REFUSAL_LOG_EVERY)
        {
            return;
        }
        tracing::warn!(
            limit = cap,
            refused = self.since_logged,
            "limits.max_connections connections are open: new ones are closed at once"
        );
        self.last_logged = Some(Instant::now());
        self.since_logged = 0;
    }
}

/// Raises the soft open-file limit to the hard one (SPEC 11 r3): a listener's connections need a
/// descriptor each, and a soft limit of 1024 is still common. Logged once, with what `max_connections`
/// leaves for the store, the audit file and the upstreams.
#[cfg(unix)]
pub fn raise_open_file_limit(max_connections: usize) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-file limit");
            return;
        }
    };
    let now = match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => hard,
        Err(e) => {
            tracing::warn!(error = %e, soft, hard, "cannot raise the open-file limit");
            soft
        }
    };
    tracing::info!(before = soft, now, hard, "open-file limit");
    if max_connections as u64 >= now {
        tracing::warn!(
            max_connections,
            open_files = now,
            "limits.max_connections is not below the open-file limit: connections may fail to be \
             accepted, and calls to find no descriptor, before the cap; raise the hard limit or \
             lower limits.max_connections"
        );
    }
}

#[cfg(not(unix))]
pub fn raise_open_file_limit(_max_connections: usize) {}
