//! The fault handlers, once as sync `fn`s and once as `async fn`s (generic
//! over the backend), and [`Session`]: how a scenario calls them. The
//! scenarios are written once against `Session`; `SyncSession` runs the sync
//! handlers on a diesel connection, `AsyncSession` runs the async ones on a
//! connection from the backend's pool, driven by the shared multi-thread
//! runtime from the session's own thread.

use crate::backend::FaultBackend;
use crate::common::backend::TestBackend;
use crate::{CrashPoint, Message};
use diesel::QueryResult;
use diesel_inbox::{idempotent, InboxError, Processed};
use std::sync::atomic::AtomicU32;
use std::sync::mpsc::Sender;
use std::sync::{Barrier, Mutex};

pub type Outcome = QueryResult<Processed<()>>;

/// A statement that fails on every backend (a table that does not exist).
const FAILING: &str = "INSERT INTO inbox_fault_no_such_table VALUES (1)";

/// How a delivery of the randomized schedules ends.
#[derive(Clone, Copy, Debug)]
pub enum Fate {
    Acked,
    BodyFails,
    Panics,
    CrashAfterCommit,
}

/// The README's kind of error type: only `Debug`, no `RetryableError`. A
/// deadlock in the body reaches the runtime only as this, yet it is retried
/// (the runtime observes the failed statement).
#[derive(Debug)]
#[allow(dead_code)] // read through Debug
pub enum PlainError {
    Db(diesel::result::Error),
    Inbox(InboxError),
}

impl From<diesel::result::Error> for PlainError {
    fn from(e: diesel::result::Error) -> Self {
        PlainError::Db(e)
    }
}

impl From<InboxError> for PlainError {
    fn from(e: InboxError) -> Self {
        PlainError::Inbox(e)
    }
}

/// One session of a scenario: a connection and the fault handlers on it.
pub trait Session: Sized {
    type B: FaultBackend;
    /// `sync` or `async`: in scenario names and worker environments.
    const MODE: &'static str;

    fn open(url: &str) -> Self;
    /// This session's server id (`None` on an embedded database).
    fn session_id(&mut self) -> Option<u64>;
    /// Runs `sql` on the session's connection.
    fn execute(&mut self, sql: &str) -> QueryResult<()>;
    /// Gives the connection back (to its pool, which must discard it if it
    /// is broken) and takes a working one.
    fn reconnect(&mut self);

    /// The main fault handler: two business rows per message, and an abort
    /// wherever the worker was told to crash.
    fn consume(&mut self, m: &Message, crash: Option<CrashPoint>) -> Outcome;
    /// Writes, tells the test, waits 700 ms, writes again.
    fn write_wait_write(&mut self, m: &Message, started: &Sender<()>) -> Outcome;
    /// Adds the message's amount to its run's shared counter.
    fn add_to_shared_counter(&mut self, m: &Message, runs: &AtomicU32) -> Outcome;
    /// `other` changes the counter after this transaction's snapshot on the
    /// first `interfere` attempts.
    fn interfered(
        &mut self,
        m: &Message,
        other: &Mutex<<Self::B as TestBackend>::Conn>,
        interfere: u32,
        runs: &AtomicU32,
    ) -> Outcome;
    /// Locks `first`, meets the other handler on the first attempt, then
    /// locks `second`.
    fn lock_two(
        &mut self,
        m: &Message,
        first: &str,
        second: &str,
        meet: &Barrier,
        runs: &AtomicU32,
    ) -> Result<Processed<()>, PlainError>;
    /// Claims, tells the test, holds 400 ms, fails.
    fn hold_then_fail(&mut self, m: &Message, claimed: &Sender<()>) -> Outcome;
    fn dupkey_apply(&mut self, m: &Message) -> Outcome;
    fn scheduled(&mut self, m: &Message, fate: Fate) -> Outcome;
    /// Writes, runs a statement that fails, ignores its error, returns `Ok`.
    fn swallow(&mut self, m: &Message) -> Outcome;
}

/// The handlers, generic over the backend; `asynchronous` holds the same
/// ones as `async fn`s under the same consumer names (`shared`).
pub mod sync {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    type Conn<B> = <B as TestBackend>::Conn;

    fn second_row<B: FaultBackend>(conn: &mut Conn<B>, m: &Message) -> QueryResult<usize> {
        B::write_effect(conn, &m.run, &format!("{}/second", m.key), 0)
    }

    #[idempotent(key = "m.key", consumer = "fault-consumer", shared, retries = 10)]
    pub fn consume<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        crash: Option<CrashPoint>,
    ) -> QueryResult<()> {
        if crash == Some(CrashPoint::AfterClaim) {
            std::process::abort();
        }
        B::write_effect(conn, &m.run, &m.key, m.amount)?;
        if crash == Some(CrashPoint::MidBody) {
            std::process::abort();
        }
        second_row::<B>(conn, m).map(drop)
    }

    #[idempotent(key = "m.key", consumer = "fault-consumer", shared, retries = 0)]
    pub fn write_wait_write<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        started: &Sender<()>,
    ) -> QueryResult<()> {
        B::write_effect(conn, &m.run, &m.key, m.amount)?;
        let _ = started.send(());
        std::thread::sleep(Duration::from_millis(700));
        second_row::<B>(conn, m).map(drop)
    }

    #[idempotent(key = "m.key", consumer = "fault-counter", shared, retries = 100)]
    pub fn add_to_shared_counter<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        runs: &AtomicU32,
    ) -> QueryResult<()> {
        runs.fetch_add(1, Ordering::SeqCst);
        B::add(conn, &format!("{}:total", m.run), m.amount)?;
        B::write_effect(conn, &m.run, &m.key, m.amount).map(drop)
    }

    #[idempotent(
        key = "m.key",
        consumer = "fault-interfered",
        shared,
        conn = "conn",
        retries = 2
    )]
    pub fn interfered<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        other: &Mutex<Conn<B>>,
        interfere: u32,
        runs: &AtomicU32,
    ) -> QueryResult<()> {
        let attempt = runs.fetch_add(1, Ordering::SeqCst) + 1;
        let name = format!("{}:total", m.run);
        if attempt <= interfere {
            B::add(&mut other.lock().expect("the other session"), &name, 1000)?;
        }
        B::add(conn, &name, m.amount).map(drop)
    }

    #[idempotent(key = "m.key", consumer = "fault-deadlock", shared, retries = 5)]
    pub fn lock_two<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        first: &str,
        second: &str,
        meet: &Barrier,
        runs: &AtomicU32,
    ) -> Result<(), PlainError> {
        let attempt = runs.fetch_add(1, Ordering::SeqCst) + 1;
        B::add(conn, first, 1)?;
        if attempt == 1 {
            meet.wait();
        }
        B::add(conn, second, 1)?;
        B::write_effect(conn, &m.run, &m.key, m.amount)?;
        Ok(())
    }

    #[idempotent(key = "m.key", consumer = "fault-dupkey", shared, retries = 0)]
    pub fn hold_then_fail<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        claimed: &Sender<()>,
    ) -> QueryResult<()> {
        let _ = (conn, m, claimed.send(()));
        std::thread::sleep(Duration::from_millis(400));
        Err(diesel::result::Error::RollbackTransaction)
    }

    #[idempotent(key = "m.key", consumer = "fault-dupkey", shared, retries = 10)]
    pub fn dupkey_apply<B: FaultBackend>(conn: &mut Conn<B>, m: &Message) -> QueryResult<()> {
        B::write_effect(conn, &m.run, &m.key, m.amount).map(drop)
    }

    #[idempotent(key = "m.key", consumer = "fault-swallow", shared)]
    pub fn swallow<B: FaultBackend>(conn: &mut Conn<B>, m: &Message) -> QueryResult<()> {
        B::write_effect(conn, &m.run, &m.key, m.amount)?;
        let failed = diesel::connection::SimpleConnection::batch_execute(conn, FAILING);
        assert!(failed.is_err(), "the failing statement worked");
        Ok(())
    }

    #[idempotent(key = "m.key", consumer = "fault-consumer", shared, retries = 3)]
    pub fn scheduled<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        fate: Fate,
    ) -> QueryResult<()> {
        B::write_effect(conn, &m.run, &m.key, m.amount)?;
        match fate {
            Fate::BodyFails => Err(diesel::result::Error::RollbackTransaction),
            Fate::Panics => panic!("injected panic"),
            _ => second_row::<B>(conn, m).map(drop),
        }
    }
}

/// Sync handlers on a diesel connection.
pub struct SyncSession<B: FaultBackend> {
    url: String,
    conn: B::Conn,
}

impl<B: FaultBackend> Session for SyncSession<B> {
    type B = B;
    const MODE: &'static str = "sync";

    fn open(url: &str) -> Self {
        SyncSession {
            url: url.to_string(),
            conn: B::open(url),
        }
    }

    fn session_id(&mut self) -> Option<u64> {
        B::session_id(&mut self.conn)
    }

    fn execute(&mut self, sql: &str) -> QueryResult<()> {
        diesel::connection::SimpleConnection::batch_execute(&mut self.conn, sql)
    }

    fn reconnect(&mut self) {
        self.conn = B::open(&self.url);
    }

    fn consume(&mut self, m: &Message, crash: Option<CrashPoint>) -> Outcome {
        sync::consume::<B>(&mut self.conn, m, crash)
    }

    fn write_wait_write(&mut self, m: &Message, started: &Sender<()>) -> Outcome {
        sync::write_wait_write::<B>(&mut self.conn, m, started)
    }

    fn add_to_shared_counter(&mut self, m: &Message, runs: &AtomicU32) -> Outcome {
        sync::add_to_shared_counter::<B>(&mut self.conn, m, runs)
    }

    fn interfered(
        &mut self,
        m: &Message,
        other: &Mutex<B::Conn>,
        n: u32,
        runs: &AtomicU32,
    ) -> Outcome {
        sync::interfered::<B>(&mut self.conn, m, other, n, runs)
    }

    fn lock_two(
        &mut self,
        m: &Message,
        first: &str,
        second: &str,
        meet: &Barrier,
        runs: &AtomicU32,
    ) -> Result<Processed<()>, PlainError> {
        sync::lock_two::<B>(&mut self.conn, m, first, second, meet, runs)
    }

    fn hold_then_fail(&mut self, m: &Message, claimed: &Sender<()>) -> Outcome {
        sync::hold_then_fail::<B>(&mut self.conn, m, claimed)
    }

    fn dupkey_apply(&mut self, m: &Message) -> Outcome {
        sync::dupkey_apply::<B>(&mut self.conn, m)
    }

    fn scheduled(&mut self, m: &Message, fate: Fate) -> Outcome {
        sync::scheduled::<B>(&mut self.conn, m, fate)
    }

    fn swallow(&mut self, m: &Message) -> Outcome {
        sync::swallow::<B>(&mut self.conn, m)
    }
}

#[cfg(feature = "async")]
pub use self::asynchronous::AsyncSession;

#[cfg(feature = "async")]
pub mod asynchronous {
    use super::*;
    use crate::common::modes::runtime;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    type Conn<B> = <B as TestBackend>::AsyncConn;

    async fn second_row<B: FaultBackend>(conn: &mut Conn<B>, m: &Message) -> QueryResult<usize> {
        B::write_effect_async(conn, &m.run, &format!("{}/second", m.key), 0).await
    }

    #[idempotent(key = "m.key", consumer = "fault-consumer", shared, retries = 10)]
    pub async fn consume<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        crash: Option<CrashPoint>,
    ) -> QueryResult<()> {
        if crash == Some(CrashPoint::AfterClaim) {
            std::process::abort();
        }
        B::write_effect_async(conn, &m.run, &m.key, m.amount).await?;
        if crash == Some(CrashPoint::MidBody) {
            std::process::abort();
        }
        second_row::<B>(conn, m).await.map(drop)
    }

    #[idempotent(key = "m.key", consumer = "fault-consumer", shared, retries = 0)]
    pub async fn write_wait_write<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        started: &Sender<()>,
    ) -> QueryResult<()> {
        B::write_effect_async(conn, &m.run, &m.key, m.amount).await?;
        let _ = started.send(());
        tokio::time::sleep(Duration::from_millis(700)).await;
        second_row::<B>(conn, m).await.map(drop)
    }

    #[idempotent(key = "m.key", consumer = "fault-counter", shared, retries = 100)]
    pub async fn add_to_shared_counter<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        runs: &AtomicU32,
    ) -> QueryResult<()> {
        runs.fetch_add(1, Ordering::SeqCst);
        B::add_async(conn, &format!("{}:total", m.run), m.amount).await?;
        B::write_effect_async(conn, &m.run, &m.key, m.amount)
            .await
            .map(drop)
    }

    /// `other` is a sync session: another client, whatever this one is
    /// (behind a lock: a retried async body must be `Clone`).
    #[idempotent(
        key = "m.key",
        consumer = "fault-interfered",
        shared,
        conn = "conn",
        retries = 2
    )]
    pub async fn interfered<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        other: &Mutex<<B as TestBackend>::Conn>,
        interfere: u32,
        runs: &AtomicU32,
    ) -> QueryResult<()> {
        let attempt = runs.fetch_add(1, Ordering::SeqCst) + 1;
        let name = format!("{}:total", m.run);
        if attempt <= interfere {
            B::add(&mut other.lock().expect("the other session"), &name, 1000)?;
        }
        B::add_async(conn, &name, m.amount).await.map(drop)
    }

    /// The barrier blocks the session's own thread (each session drives its
    /// handler from a thread of its own).
    #[idempotent(key = "m.key", consumer = "fault-deadlock", shared, retries = 5)]
    pub async fn lock_two<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        first: &str,
        second: &str,
        meet: &Barrier,
        runs: &AtomicU32,
    ) -> Result<(), PlainError> {
        let attempt = runs.fetch_add(1, Ordering::SeqCst) + 1;
        B::add_async(conn, first, 1).await?;
        if attempt == 1 {
            meet.wait();
        }
        B::add_async(conn, second, 1).await?;
        B::write_effect_async(conn, &m.run, &m.key, m.amount).await?;
        Ok(())
    }

    #[idempotent(key = "m.key", consumer = "fault-dupkey", shared, retries = 0)]
    pub async fn hold_then_fail<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        claimed: &Sender<()>,
    ) -> QueryResult<()> {
        let _ = (conn, m, claimed.send(()));
        tokio::time::sleep(Duration::from_millis(400)).await;
        Err(diesel::result::Error::RollbackTransaction)
    }

    #[idempotent(key = "m.key", consumer = "fault-dupkey", shared, retries = 10)]
    pub async fn dupkey_apply<B: FaultBackend>(conn: &mut Conn<B>, m: &Message) -> QueryResult<()> {
        B::write_effect_async(conn, &m.run, &m.key, m.amount)
            .await
            .map(drop)
    }

    #[idempotent(key = "m.key", consumer = "fault-swallow", shared)]
    pub async fn swallow<B: FaultBackend>(conn: &mut Conn<B>, m: &Message) -> QueryResult<()> {
        B::write_effect_async(conn, &m.run, &m.key, m.amount).await?;
        let failed = diesel_async::SimpleAsyncConnection::batch_execute(conn, FAILING).await;
        assert!(failed.is_err(), "the failing statement worked");
        Ok(())
    }

    #[idempotent(key = "m.key", consumer = "fault-consumer", shared, retries = 3)]
    pub async fn scheduled<B: FaultBackend>(
        conn: &mut Conn<B>,
        m: &Message,
        fate: Fate,
    ) -> QueryResult<()> {
        B::write_effect_async(conn, &m.run, &m.key, m.amount).await?;
        match fate {
            Fate::BodyFails => Err(diesel::result::Error::RollbackTransaction),
            Fate::Panics => panic!("injected panic"),
            _ => second_row::<B>(conn, m).await.map(drop),
        }
    }

    /// Async handlers on a connection from the backend's pool (bb8 on
    /// PostgreSQL, deadpool elsewhere), driven by the shared multi-thread
    /// runtime.
    pub struct AsyncSession<B: FaultBackend> {
        pool: B::Pool,
        conn: Option<B::Pooled>,
    }

    impl<B: FaultBackend> AsyncSession<B> {
        fn conn(&mut self) -> &mut B::AsyncConn {
            self.conn.as_deref_mut().expect("a pooled connection")
        }
    }

    impl<B: FaultBackend> Session for AsyncSession<B> {
        type B = B;
        const MODE: &'static str = "async";

        fn open(url: &str) -> Self {
            let pool = B::pool(url);
            let conn = runtime().block_on(B::pooled(&pool));
            AsyncSession {
                pool,
                conn: Some(conn),
            }
        }

        fn session_id(&mut self) -> Option<u64> {
            runtime().block_on(B::session_id_async(self.conn()))
        }

        fn execute(&mut self, sql: &str) -> QueryResult<()> {
            let conn = self.conn();
            runtime().block_on(diesel_async::SimpleAsyncConnection::batch_execute(
                conn, sql,
            ))
        }

        fn reconnect(&mut self) {
            drop(self.conn.take());
            self.conn = Some(runtime().block_on(B::pooled(&self.pool)));
        }

        fn consume(&mut self, m: &Message, crash: Option<CrashPoint>) -> Outcome {
            runtime().block_on(consume::<B>(self.conn(), m, crash))
        }

        fn write_wait_write(&mut self, m: &Message, started: &Sender<()>) -> Outcome {
            runtime().block_on(write_wait_write::<B>(self.conn(), m, started))
        }

        fn add_to_shared_counter(&mut self, m: &Message, runs: &AtomicU32) -> Outcome {
            runtime().block_on(add_to_shared_counter::<B>(self.conn(), m, runs))
        }

        fn interfered(
            &mut self,
            m: &Message,
            other: &Mutex<<B as TestBackend>::Conn>,
            n: u32,
            runs: &AtomicU32,
        ) -> Outcome {
            runtime().block_on(interfered::<B>(self.conn(), m, other, n, runs))
        }

        fn lock_two(
            &mut self,
            m: &Message,
            first: &str,
            second: &str,
            meet: &Barrier,
            runs: &AtomicU32,
        ) -> Result<Processed<()>, PlainError> {
            runtime().block_on(lock_two::<B>(self.conn(), m, first, second, meet, runs))
        }

        fn hold_then_fail(&mut self, m: &Message, claimed: &Sender<()>) -> Outcome {
            runtime().block_on(hold_then_fail::<B>(self.conn(), m, claimed))
        }

        fn dupkey_apply(&mut self, m: &Message) -> Outcome {
            runtime().block_on(dupkey_apply::<B>(self.conn(), m))
        }

        fn scheduled(&mut self, m: &Message, fate: Fate) -> Outcome {
            runtime().block_on(scheduled::<B>(self.conn(), m, fate))
        }

        fn swallow(&mut self, m: &Message) -> Outcome {
            runtime().block_on(swallow::<B>(self.conn(), m))
        }
    }
}
