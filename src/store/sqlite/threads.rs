//! The threads that own the embedded store's connections (issue 20): one writer, a few readers and a
//! checkpointer. No async task ever touches SQLite, and no operation starts a thread of its own.
//!
//! The writer takes whatever is queued and applies it, in order, inside one open transaction; each write
//! is answered as soon as it is applied (it is not durable yet, as the [`super::super::Store`] contract
//! says). A commit request is answered after the `COMMIT` (WAL, `synchronous=FULL`: one fsync) that follows
//! the writes queued before it: every waiter queued meanwhile shares that one commit (group commit).
//!
//! A commit that fails stops the writer for good: the writes it rolled back were already answered, and a
//! failed fsync cannot be retried safely (PostgreSQL stops for the same reason). Every later operation
//! fails with 5005 and `/readyz` answers 503 until the process is restarted, when the store reopens from
//! what was committed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use super::super::{ChainHead, StoreError, StoreResult};

/// What the writer's work runs against: the write connection, and the chain head it has written.
pub(crate) struct Writable {
    pub(crate) conn: Connection,
    pub(crate) head: ChainHead,
}

type WriteWork = Box<dyn FnOnce(StoreResult<&mut Writable>) + Send>;
/// A write whose caller is answered after the commit that follows it: applying it gives that answer.
type DurableWork = Box<dyn FnOnce(StoreResult<&mut Writable>) -> CommitWaiter + Send>;
/// Told how the next commit went.
type CommitWaiter = Box<dyn FnOnce(&StoreResult<()>) + Send>;
type ReadWork = Box<dyn FnOnce(&Connection) + Send>;

/// Writes what was changed in memory and not yet in the tables (budget counts): `None` when nothing was.
/// The writer asks before each request it applies and before each commit, so nobody has to wake it for
/// such a change, and a failure to write it stops the writer: the calls it counted were already admitted.
pub(crate) type Unwritten =
    Box<dyn FnMut() -> Option<Box<dyn FnOnce(&Connection) -> StoreResult<()>>> + Send>;

enum Request {
    Write(WriteWork),
    /// A write and the commit after it, answered once: the caller wakes once, not twice.
    Durable(DurableWork),
    Commit(CommitWaiter),
    /// Commits what is open and ends the thread (the store is being dropped).
    Stop,
}

/// Requests taken in one turn at most: a steady stream of writes still reaches its commit.
const MAX_TURN: usize = 4096;

/// An open transaction that no waiter asked to commit is committed after this long idle, so that plain
/// writes become durable soon even when no audit event follows them.
const IDLE_COMMIT: Duration = Duration::from_millis(50);

/// Why the writer stopped, once it has (see the module comment).
type Failure = Arc<OnceLock<String>>;

/// The handle of the writer thread.
pub(crate) struct Writer {
    tx: Sender<Request>,
    failure: Failure,
    /// Commits made so far; the checkpointer works when it moves.
    commits: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// `wal_limit`: WAL bytes beyond which the writer starts the log over (see [`WriterLoop::bound_wal`]).
    pub(crate) fn start(
        state: Writable,
        wal_limit: u64,
        unwritten: Unwritten,
    ) -> StoreResult<Writer> {
        let (tx, rx) = mpsc::channel();
        let failure: Failure = Arc::default();
        let commits = Arc::new(AtomicU64::new(0));
        let thread = std::thread::Builder::new()
            .name("sg-store-writer".into())
            .spawn({
                let failure = failure.clone();
                let commits = commits.clone();
                move || WriterLoop::new(state, failure, commits, wal_limit, unwritten).run(rx)
            })
            .map_err(StoreError::unavailable)?;
        Ok(Writer {
            tx,
            failure,
            commits,
            thread: Some(thread),
        })
    }

    /// Runs `work` in the writer's open transaction and returns its answer, once applied (not yet durable).
    /// A failed `work` leaves nothing behind: it runs inside a savepoint that its error rolls back.
    pub(crate) async fn write<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Writable) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.queue(move |state| {
            let _ = reply.send(state.and_then(|state| in_savepoint(state, work)));
        })?;
        answer
            .await
            .map_err(|_| StoreError::unavailable("the store's writer has stopped"))?
    }

    /// Runs `work` in the writer's open transaction, like [`Writer::write`], and returns its answer once
    /// the commit after it holds it (durable), as `write` then `commit` would, with one answer for both.
    pub(crate) async fn write_durably<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Writable) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Durable(Box::new(move |state| {
            let written = state.and_then(|state| in_savepoint(state, work));
            Box::new(move |committed: &StoreResult<()>| {
                let _ = reply.send(written.and_then(|value| committed.clone().map(|()| value)));
            })
        })))?;
        answer
            .await
            .map_err(|_| StoreError::unavailable("the store's writer has stopped"))?
    }

    fn queue(
        &self,
        work: impl FnOnce(StoreResult<&mut Writable>) + Send + 'static,
    ) -> StoreResult<()> {
        self.send(Request::Write(Box::new(work)))
    }

    fn send(&self, request: Request) -> StoreResult<()> {
        self.tx
            .send(request)
            .map_err(|_| StoreError::unavailable("the store's writer has stopped"))
    }

    /// Returns once everything written before this call is committed (durable).
    pub(crate) async fn commit(&self) -> StoreResult<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Commit(Box::new(move |committed| {
            let _ = reply.send(committed.clone());
        })))?;
        answer
            .await
            .map_err(|_| StoreError::unavailable("the store's writer has stopped"))?
    }

    /// Why the writer stopped, when it has.
    pub(crate) fn failed(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    pub(crate) fn commits(&self) -> Arc<AtomicU64> {
        self.commits.clone()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.tx.send(Request::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub(crate) fn stopped(why: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "the embedded store stopped ({why}); restart the gateway"
    ))
}

/// Runs one write inside a savepoint of the open transaction, so that an error undoes all of it.
fn in_savepoint<T>(
    state: &mut Writable,
    work: impl FnOnce(&mut Writable) -> StoreResult<T>,
) -> StoreResult<T> {
    let sql = |state: &Writable, statement: &str| {
        state
            .conn
            .prepare_cached(statement)
            .and_then(|mut s| s.execute([]))
            .map_err(StoreError::unavailable)
    };
    sql(state, "SAVEPOINT work")?;
    let head = state.head.clone();
    match work(state) {
        Ok(value) => {
            sql(state, "RELEASE work")?;
            Ok(value)
        }
        Err(e) => {
            state.head = head;
            // An error that already ended the transaction (SQLite does so for some I/O errors) leaves no
            // savepoint to roll back to; the writer notices the lost transaction and stops.
            if !state.conn.is_autocommit() {
                sql(state, "ROLLBACK TO work")?;
                sql(state, "RELEASE work")?;
            }
            Err(e)
        }
    }
}

struct WriterLoop {
    state: Writable,
    failure: Failure,
    commits: Arc<AtomicU64>,
    /// A transaction is open (BEGIN IMMEDIATE ran and no COMMIT yet).
    open: bool,
    wal: PathBuf,
    wal_limit: u64,
    unwritten: Unwritten,
}

impl WriterLoop {
    fn new(
        state: Writable,
        failure: Failure,
        commits: Arc<AtomicU64>,
        wal_limit: u64,
        unwritten: Unwritten,
    ) -> WriterLoop {
        let wal = PathBuf::from(format!("{}-wal", state.conn.path().unwrap_or_default()));
        WriterLoop {
            state,
            failure,
            commits,
            open: false,
            wal,
            wal_limit,
            unwritten,
        }
    }

    fn run(mut self, rx: Receiver<Request>) {
        loop {
            let first = if self.open {
                match rx.recv_timeout(IDLE_COMMIT) {
                    Ok(request) => request,
                    Err(RecvTimeoutError::Timeout) => {
                        let _ = self.commit();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match rx.recv() {
                    Ok(request) => request,
                    Err(_) => break,
                }
            };
            let mut waiters = Vec::new();
            let mut next = Some(first);
            let mut taken = 0;
            while let Some(request) = next.take() {
                match request {
                    Request::Write(work) => self.apply(work),
                    Request::Durable(work) => waiters.push(self.apply(work)),
                    Request::Commit(waiter) => waiters.push(waiter),
                    Request::Stop => {
                        let result = self.commit();
                        answer_all(waiters, &result);
                        return;
                    }
                }
                taken += 1;
                if taken < MAX_TURN {
                    next = rx.try_recv().ok();
                }
            }
            if !waiters.is_empty() {
                let result = self.commit();
                answer_all(waiters, &result);
            }
        }
        let _ = self.commit();
    }

    fn apply<R>(&mut self, work: impl FnOnce(StoreResult<&mut Writable>) -> R) -> R {
        if let Some(why) = self.failure.get() {
            return work(Err(stopped(why)));
        }
        if let Err(e) = self.begin().and_then(|()| self.catch_up()) {
            return work(Err(e));
        }
        let answered = work(Ok(&mut self.state));
        if self.open && self.state.conn.is_autocommit() {
            // SQLite ended the transaction by itself (an I/O error): answered writes were lost.
            self.open = false;
            self.stop("an I/O error rolled the transaction back".into());
        }
        answered
    }

    /// Opens the transaction that requests are applied in, unless one is open.
    fn begin(&mut self) -> StoreResult<()> {
        if !self.open {
            // Nothing was applied, so nothing is lost: the request that needed it alone fails.
            self.state
                .conn
                .execute_batch("BEGIN IMMEDIATE")
                .map_err(|e| StoreError::unavailable(format!("cannot begin a transaction: {e}")))?;
            self.open = true;
        }
        Ok(())
    }

    /// Writes what was changed in memory since the last request (see [`Unwritten`]).
    fn catch_up(&mut self) -> StoreResult<()> {
        let Some(write) = (self.unwritten)() else {
            return Ok(());
        };
        // The changes were taken: unless they are written, the table would lag behind what was admitted.
        let written = self.begin().and_then(|()| write(&self.state.conn));
        written.map_err(|e| {
            let why = format!("budget counts kept in memory were not written: {e}");
            self.stop(why.clone());
            stopped(&why)
        })
    }

    /// Commits the open transaction, if any, with what was changed in memory; a failure stops the writer.
    fn commit(&mut self) -> StoreResult<()> {
        if let Some(why) = self.failure.get() {
            return Err(stopped(why));
        }
        self.catch_up()?;
        if !self.open {
            return Ok(());
        }
        self.open = false;
        match self.state.conn.execute_batch("COMMIT") {
            Ok(()) => {
                self.commits.fetch_add(1, Ordering::Release);
                self.bound_wal();
                Ok(())
            }
            Err(e) => {
                if !self.state.conn.is_autocommit() {
                    let _ = self.state.conn.execute_batch("ROLLBACK");
                }
                let why = format!("commit failed: {e}");
                self.stop(why.clone());
                Err(stopped(&why))
            }
        }
    }

    /// The checkpointer copies frames beside the commits, so under steady load it never reaches the end
    /// of the log and SQLite never starts it over: the bench grew it by about 20 KB a call, without end.
    /// Between two transactions the writer can: TRUNCATE copies the little the checkpointer left, waits
    /// for readers to move on, and empties the file. Should it not finish (a slow reader), the next
    /// commit tries again; the log is committed data either way.
    fn bound_wal(&self) {
        let written = std::fs::metadata(&self.wal).map_or(0, |m| m.len());
        if written < self.wal_limit {
            return;
        }
        let done = self
            .state
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                row.get::<_, i64>(0)
            });
        match done {
            Ok(0) => {}
            Ok(_) => {
                tracing::debug!(target: "store", "WAL restart waited too long for a reader; tried again at the next commit")
            }
            Err(e) => {
                tracing::warn!(target: "store", error = %e, "WAL restart failed; tried again at the next commit")
            }
        }
    }

    fn stop(&self, why: String) {
        tracing::error!(target: "store", error = %why, "the embedded store stopped: every call now gets 5005 until the gateway is restarted");
        let _ = self.failure.set(why);
    }
}

fn answer_all(waiters: Vec<CommitWaiter>, result: &StoreResult<()>) {
    for waiter in waiters {
        waiter(result);
    }
}

/// Read connections on threads of their own, sharing one queue: a lookup or listing never waits for the
/// writer (WAL readers see the last commit) and never blocks the async runtime.
pub(crate) struct Readers {
    tx: Sender<ReadWork>,
    threads: Vec<JoinHandle<()>>,
}

impl Readers {
    pub(crate) fn start(path: &Path, count: usize) -> StoreResult<Readers> {
        let (tx, rx) = mpsc::channel::<ReadWork>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(count);
        for n in 0..count {
            let conn = open_reader(path)?;
            let rx = rx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("sg-store-read-{n}"))
                .spawn(move || loop {
                    // The lock is held only while waiting: the next reader takes the next request.
                    let next = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
                    match next {
                        Ok(work) => work(&conn),
                        Err(_) => return,
                    }
                })
                .map_err(StoreError::unavailable)?;
            threads.push(thread);
        }
        Ok(Readers { tx, threads })
    }

    /// Runs `work` on a read connection (the last committed state) and returns its answer.
    pub(crate) async fn read<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Box::new(move |conn| {
                let _ = reply.send(work(conn));
            }))
            .map_err(|_| StoreError::unavailable("the store's readers have stopped"))?;
        answer
            .await
            .map_err(|_| StoreError::unavailable("the store's readers have stopped"))?
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        // Closing the queue ends every reader's loop.
        let (closed, _) = mpsc::channel();
        self.tx = closed;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

pub(crate) fn open_reader(path: &Path) -> StoreResult<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::unavailable(format!("cannot open {}: {e}", path.display())))?;
    conn.execute_batch(READER_PRAGMAS)
        .map_err(StoreError::unavailable)?;
    Ok(conn)
}

/// Small page caches keep the resident set small; the OS page cache holds the rest.
const READER_PRAGMAS: &str = "PRAGMA cache_size = -2048; PRAGMA busy_timeout = 5000;";

/// How often the checkpointer looks for new commits.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// Copies committed WAL frames into the database file, on its own connection and thread, so that no commit
/// waits for a checkpoint (the writer's automatic checkpoints are off).
pub(crate) struct Checkpointer {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    pub(crate) fn start(path: &Path, commits: Arc<AtomicU64>) -> StoreResult<Checkpointer> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(StoreError::unavailable)?;
        conn.execute_batch("PRAGMA cache_size = -512; PRAGMA busy_timeout = 1000;")
            .map_err(StoreError::unavailable)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sg-checkpoint".into())
            .spawn(move || {
                let mut seen = commits.load(Ordering::Acquire);
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_EVERY) {
                    let now = commits.load(Ordering::Acquire);
                    if now == seen {
                        continue;
                    }
                    seen = now;
                    // PASSIVE copies what no reader still needs and never waits for the writer.
                    if let Err(e) = conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                        tracing::warn!(target: "store", error = %e, "WAL checkpoint failed; retried later");
                    }
                }
            })
            .map_err(StoreError::unavailable)?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
