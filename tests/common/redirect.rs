//! A server that answers every request with a redirect (SPEC 20 rule 8: no outbound client follows
//! one), pointing at a decoy on the same server that counts whatever reaches it. It runs on the test's
//! runtime: a test that waits for a log line ([`super::Lines::wait_for`] blocks its thread) runs on a
//! multi-thread runtime, so that the server goes on answering meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::{header::LOCATION, StatusCode};

/// The query of the `Location`: a secret that no log line may show.
pub const SECRET: &str = "S3cret-in-the-location";

pub struct Redirector {
    /// `http://127.0.0.1:PORT`: every path under it but `/decoy` answers 307.
    pub base: String,
    redirected: Arc<AtomicU64>,
    decoy: Arc<AtomicU64>,
}

impl Redirector {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Redirector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (redirected, decoy) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let location = format!("{base}/decoy?token={SECRET}");
        let counted = decoy.clone();
        let counting = redirected.clone();
        let app = axum::Router::new()
            .route(
                "/decoy",
                axum::routing::any(move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async { StatusCode::OK }
                }),
            )
            .fallback(move || {
                counting.fetch_add(1, Ordering::SeqCst);
                let location = location.clone();
                async move { (StatusCode::TEMPORARY_REDIRECT, [(LOCATION, location)]) }
            });
        tokio::spawn(async move { axum::serve(listener, app).await });
        Redirector {
            base,
            redirected,
            decoy,
        }
    }

    /// Requests answered with the redirect.
    pub fn redirected(&self) -> u64 {
        self.redirected.load(Ordering::SeqCst)
    }

    /// Requests that followed the redirect: always 0 when the client is right.
    pub fn followed(&self) -> u64 {
        self.decoy.load(Ordering::SeqCst)
    }

    /// How a failure names the redirect: its status and where it pointed, without the query.
    pub fn named(&self) -> String {
        format!(
            "HTTP 307 Temporary Redirect to {}/decoy (redirects are not followed)",
            self.base
        )
    }
}
