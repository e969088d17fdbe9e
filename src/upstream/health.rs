//! Whether an MCP upstream's server is running, as `GET /readyz?verbose`, the console and
//! `sealgate_upstream_up{upstream}` show it (SPEC 20 r11). The gateway starts a server on its first call or
//! tool list, so until then nothing is known: the gauge has no series for it yet.

use std::sync::{Mutex, PoisonError};

const UP_GAUGE: &str = "sealgate_upstream_up";

/// What the gateway last saw of an upstream's server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UpstreamState {
    /// Not started yet: it starts on its first call or tool list.
    NotStarted,
    /// Its last start succeeded and it has not exited since.
    Up,
    /// It failed to start, or exited: `error` says which, in a fixed phrase. The details (an address, what
    /// it wrote on stderr) are in the gateway's log only, since `/readyz` answers without a token.
    Down { error: &'static str },
    /// The gateway is stopping.
    Stopped,
}

impl UpstreamState {
    /// The name `GET /readyz?verbose` gives it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            UpstreamState::NotStarted => "not_started",
            UpstreamState::Up => "up",
            UpstreamState::Down { .. } => "down",
            UpstreamState::Stopped => "stopped",
        }
    }
}

/// One upstream's state, shared by its client and the tasks that read its servers' stderr.
pub(crate) struct Health {
    upstream: String,
    state: Mutex<Current>,
}

struct Current {
    state: UpstreamState,
    /// Counts starts, so that a server replaced since cannot report over its successor.
    start: u64,
}

/// One start of the upstream's server; what it reports counts while no later start has begun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Start(u64);

impl Health {
    pub(crate) fn new(upstream: &str) -> Health {
        Health {
            upstream: upstream.to_owned(),
            state: Mutex::new(Current {
                state: UpstreamState::NotStarted,
                start: 0,
            }),
        }
    }

    pub(crate) fn state(&self) -> UpstreamState {
        self.lock().state.clone()
    }

    pub(crate) fn starting(&self) -> Start {
        let mut current = self.lock();
        current.start += 1;
        Start(current.start)
    }

    pub(crate) fn up(&self, start: Start) {
        self.set(start, UpstreamState::Up);
    }

    /// Records a failed start or an exit; false, and nothing changed, when a later start has begun or the
    /// gateway is stopping (its server's exit is then no failure).
    pub(crate) fn down(&self, start: Start, error: &'static str) -> bool {
        self.set(start, UpstreamState::Down { error })
    }

    pub(crate) fn stopped(&self) {
        self.lock().state = UpstreamState::Stopped;
    }

    fn set(&self, start: Start, state: UpstreamState) -> bool {
        let mut current = self.lock();
        if current.start != start.0 || current.state == UpstreamState::Stopped {
            return false;
        }
        let up = if state == UpstreamState::Up { 1.0 } else { 0.0 };
        current.state = state;
        metrics::gauge!(UP_GAUGE, "upstream" => self.upstream.clone()).set(up);
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_latest_start_reports_and_an_exit_while_stopping_is_no_failure() {
        let health = Health::new("py");
        assert_eq!(health.state(), UpstreamState::NotStarted);
        let first = health.starting();
        health.up(first);
        assert!(health.down(first, "exited"));
        let down = UpstreamState::Down { error: "exited" };
        assert_eq!(health.state(), down);
        let second = health.starting();
        health.up(second);
        assert!(!health.down(first, "late"));
        assert_eq!(health.state(), UpstreamState::Up);
        health.stopped();
        assert!(!health.down(second, "exited"));
        assert_eq!(health.state(), UpstreamState::Stopped);
    }
}
