//! The stdio transport of an MCP upstream: the child process and rmcp's line transport over its stdin
//! and stdout. rmcp's own `TokioChildProcess` keeps stdout to itself; this one reads it through
//! [`CheckedLines`], so that the raw text of every answer is checked for inexact numbers (SPEC 20
//! rule 5). Its ending is rmcp's: stdin closed, then SIGTERM, then SIGKILL, to the process group.

use std::future::Future;
use std::io;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use process_wrap::tokio::{ChildWrapper, CommandWrap};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use rmcp::RoleClient;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

use super::mcp_numbers::{CheckedLines, InexactNumbers};

/// How long the child has to exit after each step of its ending (as rmcp's own child transport).
const EXIT_WAIT: Duration = Duration::from_secs(3);

pub(crate) struct ChildTransport {
    /// `None` once the child has exited or been killed; a child still here is killed on drop.
    child: Option<Box<dyn ChildWrapper>>,
    lines: AsyncRwTransport<RoleClient, CheckedLines<ChildStdout>, ChildStdin>,
}

impl ChildTransport {
    /// Starts `command` with piped stdio; returns the transport and the child's stderr.
    pub(crate) fn spawn(
        mut command: CommandWrap,
        numbers: Arc<dyn InexactNumbers>,
    ) -> io::Result<(Self, ChildStderr)> {
        command
            .command_mut()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn()?;
        let taken = |what: &str| io::Error::other(format!("the child's {what} was not piped"));
        let process = child.inner_mut();
        let stdin = process.stdin().take().ok_or_else(|| taken("stdin"))?;
        let stdout = process.stdout().take().ok_or_else(|| taken("stdout"))?;
        let stderr = process.stderr().take().ok_or_else(|| taken("stderr"))?;
        let transport = ChildTransport {
            child: Some(child),
            lines: AsyncRwTransport::new(CheckedLines::new(stdout, numbers), stdin),
        };
        Ok((transport, stderr))
    }

    /// The MCP stdio shutdown: close the child's stdin and wait; then SIGTERM and wait; then kill.
    async fn end_child(&mut self) -> io::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        self.lines.close().await?;
        if exited_within_wait(child).await? {
            self.child = None;
            return Ok(());
        }
        match child.signal(nix::libc::SIGTERM) {
            Ok(()) if exited_within_wait(child).await? => {
                self.child = None;
                return Ok(());
            }
            Ok(()) => {}
            Err(e) => tracing::warn!("cannot send SIGTERM to the MCP server: {e}"),
        }
        let killed = Box::into_pin(child.kill()).await;
        // Forgotten either way: a failed kill is reported, not retried on drop.
        self.child = None;
        killed
    }
}

async fn exited_within_wait(child: &mut Box<dyn ChildWrapper>) -> io::Result<bool> {
    match tokio::time::timeout(EXIT_WAIT, child.wait()).await {
        Ok(status) => status.map(|_| true),
        Err(_) => Ok(false),
    }
}

impl Drop for ChildTransport {
    fn drop(&mut self) {
        // `kill` also reaps the child, so it needs the runtime; without one, the signal is still sent.
        let Some(mut child) = self.child.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = Box::into_pin(child.kill()).await {
                        tracing::warn!("cannot kill the MCP server: {e}");
                    }
                });
            }
            Err(_) => {
                let _ = child.start_kill();
            }
        }
    }
}

impl Transport<RoleClient> for ChildTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.lines.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        self.lines.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.end_child()
    }
}
