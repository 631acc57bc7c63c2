//! Retention: [`purge`] and its options ([`Purge`]), in batches of short
//! transactions; the loop's decisions live once in [`PurgeLoop`].

use super::transaction::{ops_error, short_transaction};
#[cfg(feature = "async")]
use crate::backend::asynchronous::AsAsyncConnection;
use crate::backend::transaction;
#[cfg(feature = "async")]
use crate::backend::transaction::Scope;
use crate::backend::{InboxBackend, Internals, Statements};
use crate::error::InboxError;
use crate::key::validate_key;
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;
use diesel::result::Error;
use std::time::{Duration, Instant};

/// What a purge did: see [`purge`] (which has an example).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PurgeReport {
    /// Rows deleted.
    pub rows: u64,
    /// Batches run, each in a transaction of its own (the last one finds
    /// fewer rows than the batch size, possibly none).
    pub batches: u64,
    /// Deadlocks, serialization failures and lock timeouts of batches that
    /// were retried.
    pub retries: u64,
    /// Time taken.
    pub elapsed: Duration,
    /// Failure counts (`inbox_attempts` rows, `max_attempts`) last updated
    /// before the same cutoff, deleted after the rows in one statement; 0
    /// without that table.
    pub attempts: u64,
}

/// The most a purge retries one batch that keeps failing transiently.
const PURGE_BATCH_RETRIES: u32 = 10;

/// The largest purge batch: one batch is one short transaction.
///
/// ```
/// assert!(diesel_inbox::Purge::new(std::time::Duration::from_secs(3600))
///     .batch_size(diesel_inbox::MAX_PURGE_BATCH + 1)
///     .count(&mut <diesel::SqliteConnection as diesel::Connection>::establish(":memory:").unwrap())
///     .is_err());
/// ```
pub const MAX_PURGE_BATCH: usize = 100_000;

/// A purge's default duty cycle ([`Purge::sleep_coef`]): after each batch,
/// a pause six times as long as the batch took, so that the handlers keep
/// most of the database (the measured effect on their latency:
/// `docs/performance.md`, the benchmark's `--purge`).
pub(crate) const DEFAULT_SLEEP_COEF: f64 = 6.0;

/// A purge with options: the consumer it is scoped to, a callback after
/// each batch (progress), and a dry run ([`Purge::count`]).
/// [`purge`] is `Purge::new(older_than).batch_size(n).run(conn)`.
///
/// Rows are deleted in batches of `batch_size`, oldest first, each batch in
/// a short transaction of its own: select up to `batch_size` keys through
/// the `received_at` index, then delete them by primary key (only those
/// rows are locked; on MySQL/MariaDB the batch runs at `READ COMMITTED`, so
/// no gap locks either). A claim never waits on a purge, except a claim of
/// a key the current batch is deleting, for that batch's duration. Several
/// purges may run at once: one that finds a row another is deleting waits
/// for that batch and then skips it. A deadlock or lock timeout reruns the
/// batch. After the batches, one statement deletes the failure counts
/// (`inbox_attempts`, `max_attempts`) of the same scope last updated
/// before the cutoff ([`PurgeReport::attempts`]): a key that has not failed
/// for the retention period starts its count afresh.
///
/// **Retention must exceed the longest redelivery horizon**: the broker's
/// redelivery delays, replays from a dead-letter queue, a consumer that was
/// down for a week. A message redelivered after its row was purged is
/// applied again.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::Purge;
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// let thirty_days = Duration::from_secs(30 * 24 * 3600);
/// let would = Purge::new(thirty_days).consumer("billing").count(&mut conn)?;
/// let report = Purge::new(thirty_days)
///     .consumer("billing")
///     .batch_size(5_000)
///     .on_batch(|so_far| println!("{} rows", so_far.rows))
///     .run(&mut conn)?;
/// assert_eq!((would, report.rows), (0, 0));
/// # Ok(())
/// # }
/// ```
pub struct Purge<'a> {
    older_than: Duration,
    batch_size: usize,
    pause: Duration,
    sleep_coef: f64,
    consumer: Option<&'a str>,
    on_batch: Option<OnBatch<'a>>,
}

/// The progress callback of a purge.
type OnBatch<'a> = Box<dyn FnMut(&PurgeReport) + Send + 'a>;

impl std::fmt::Debug for Purge<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Purge")
            .field("older_than", &self.older_than)
            .field("batch_size", &self.batch_size)
            .field("pause", &self.pause)
            .field("sleep_coef", &self.sleep_coef)
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

impl<'a> Purge<'a> {
    /// Rows claimed longer than `older_than` ago, in batches of 10,000.
    pub fn new(older_than: Duration) -> Self {
        Purge {
            older_than,
            batch_size: 10_000,
            pause: Duration::ZERO,
            sleep_coef: DEFAULT_SLEEP_COEF,
            consumer: None,
            on_batch: None,
        }
    }

    /// Rows per batch (default 10,000; 1 to [`MAX_PURGE_BATCH`]).
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// A fixed pause after each full batch (default none), on top of the
    /// duty cycle's ([`sleep_coef`](Self::sleep_coef)). The report's
    /// `elapsed` includes the pauses.
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// A duty cycle: after each full batch, pause `coef` times as long as
    /// that batch took (on top of [`pause`](Self::pause)), as pt-archiver's
    /// `--sleep-coef` does. The pause follows the database's load: a batch
    /// slowed by busy handlers waits longer, so a purge of millions of rows
    /// cannot stall the handlers. The default, 6, is
    /// what the benchmark's `--purge` measured (`docs/performance.md`);
    /// 0 runs the batches back to back. At most 100.
    pub fn sleep_coef(mut self, coef: f64) -> Self {
        self.sleep_coef = coef;
        self
    }

    /// Only this consumer's rows.
    pub fn consumer(mut self, consumer: &'a str) -> Self {
        self.consumer = Some(consumer);
        self
    }

    /// Called after each batch with the totals so far.
    pub fn on_batch(mut self, f: impl FnMut(&PurgeReport) + Send + 'a) -> Self {
        self.on_batch = Some(Box::new(f));
        self
    }

    /// The arguments, checked; the cutoff as this backend's SQL.
    fn checked<B: InboxBackend>(&self) -> Result<(String, Option<String>, i64), InboxError> {
        if self.batch_size == 0 || self.batch_size > MAX_PURGE_BATCH {
            return Err(InboxError::InvalidArgument(
                "the purge batch size must be between 1 and 100000",
            ));
        }
        if !(0.0..=100.0).contains(&self.sleep_coef) {
            return Err(InboxError::InvalidArgument(
                "a purge's sleep_coef must be between 0 and 100",
            ));
        }
        if self.older_than > Duration::from_secs(100 * 366 * 24 * 3600) {
            return Err(InboxError::InvalidArgument(
                "a purge's older_than must be at most 100 years",
            ));
        }
        if let Some(consumer) = self.consumer {
            validate_key(consumer).map_err(InboxError::InvalidConsumer)?;
        }
        Ok((
            B::cutoff_sql(self.older_than),
            self.consumer.map(str::to_owned),
            self.batch_size as i64,
        ))
    }

    /// Deletes the rows, batch by batch, outside any transaction (inside
    /// one it is refused: [`InboxError::InTransaction`]).
    pub fn run<C>(mut self, conn: &mut C) -> Result<PurgeReport, InboxError>
    where
        C: InboxConnection + LoadConnection,
    {
        let (cutoff, consumer, limit) = self.checked::<C::Backend>()?;
        if transaction::transaction_open(conn) {
            return Err(InboxError::InTransaction { operation: "purge" });
        }
        let mut purge = PurgeLoop::new(
            consumer.clone(),
            limit,
            (self.pause, self.sleep_coef),
            self.on_batch.take(),
        );
        loop {
            let batch = purge_batch(conn, &cutoff, consumer.as_deref(), limit);
            match purge.next(batch, C::Backend::is_transient) {
                PurgeStep::Again => {}
                PurgeStep::Sleep(delay) => std::thread::sleep(delay),
                PurgeStep::Done(report) => {
                    let mut report = report.map_err(ops_error::<C::Backend>)?;
                    let deleted = C::Backend::purge_attempts(conn, &cutoff, consumer.as_deref());
                    report.attempts = attempts_purged::<C::Backend>(deleted)?;
                    return Ok(report);
                }
            }
        }
    }

    /// How many rows [`run`](Self::run) would delete now (a dry run; the
    /// failure counts are not counted).
    pub fn count<C>(self, conn: &mut C) -> Result<u64, InboxError>
    where
        C: InboxConnection + LoadConnection,
    {
        let (cutoff, consumer, _) = self.checked::<C::Backend>()?;
        C::Backend::count_older(conn, &cutoff, consumer.as_deref())
            .map(|n| n as u64)
            .map_err(ops_error::<C::Backend>)
    }

    /// The async twin of [`run`](Self::run).
    #[cfg(feature = "async")]
    pub async fn run_async<P, C, Via>(mut self, conn: &mut P) -> Result<PurgeReport, InboxError>
    where
        P: AsAsyncConnection<C, Via>,
        C: crate::AsyncInboxConnection,
    {
        let conn = conn.connection();
        let (cutoff, consumer, limit) = self.checked::<C::Backend>()?;
        if transaction::transaction_open_async(conn) {
            return Err(InboxError::InTransaction { operation: "purge" });
        }
        let mut purge = PurgeLoop::new(
            consumer.clone(),
            limit,
            (self.pause, self.sleep_coef),
            self.on_batch.take(),
        );
        loop {
            let batch = purge_batch_async(conn, &cutoff, consumer.as_deref(), limit).await;
            match purge.next(batch, <C::Backend as Internals>::is_transient) {
                PurgeStep::Again => {}
                PurgeStep::Sleep(delay) => tokio::time::sleep(delay).await,
                PurgeStep::Done(report) => {
                    let mut report = report.map_err(ops_error::<C::Backend>)?;
                    let deleted = conn
                        .inbox_purge_attempts(&cutoff, consumer.as_deref())
                        .await;
                    report.attempts = attempts_purged::<C::Backend>(deleted)?;
                    return Ok(report);
                }
            }
        }
    }

    /// The async twin of [`count`](Self::count).
    #[cfg(feature = "async")]
    pub async fn count_async<P, C, Via>(self, conn: &mut P) -> Result<u64, InboxError>
    where
        P: AsAsyncConnection<C, Via>,
        C: crate::AsyncInboxConnection,
    {
        let (cutoff, consumer, _) = self.checked::<C::Backend>()?;
        conn.connection()
            .inbox_count_older(cutoff, consumer)
            .await
            .map(|n| n as u64)
            .map_err(ops_error::<C::Backend>)
    }
}

/// What the purge driver does next.
pub(crate) enum PurgeStep {
    /// Run the next batch.
    Again,
    /// Wait, then run the next batch (a pause) or rerun the one that
    /// failed transiently.
    Sleep(Duration),
    /// Stop, with the report or the error.
    Done(Result<PurgeReport, Error>),
}

/// The purge loop's decisions, shared by the sync and the async driver:
/// a batch that deleted fewer rows than the limit was the last; a transient
/// failure reruns the batch after a backoff, up to a limit.
pub(crate) struct PurgeLoop<'a> {
    consumer: Option<String>,
    /// Where the deleted rows are reported (the inbox's or the outbox's
    /// counter).
    record: fn(Option<&str>, u64),
    limit: i64,
    pause: Duration,
    sleep_coef: f64,
    /// When the current batch began (the end of the previous step).
    batch_began: Instant,
    report: PurgeReport,
    failures: u32,
    started: Instant,
    on_batch: Option<OnBatch<'a>>,
}

impl<'a> PurgeLoop<'a> {
    fn new(
        consumer: Option<String>,
        limit: i64,
        (pause, sleep_coef): (Duration, f64),
        on_batch: Option<OnBatch<'a>>,
    ) -> Self {
        PurgeLoop {
            consumer,
            record: crate::telemetry::purged,
            limit,
            pause,
            sleep_coef,
            batch_began: Instant::now(),
            report: PurgeReport::default(),
            failures: 0,
            started: Instant::now(),
            on_batch,
        }
    }

    /// The loop of an outbox purge (dead messages), with the default duty
    /// cycle.
    pub(crate) fn outbox(limit: i64) -> Self {
        PurgeLoop {
            record: crate::telemetry::outbox_purged,
            ..PurgeLoop::new(None, limit, (Duration::ZERO, DEFAULT_SLEEP_COEF), None)
        }
    }

    pub(crate) fn next(
        &mut self,
        batch: Result<usize, Error>,
        transient: fn(&Error) -> bool,
    ) -> PurgeStep {
        match batch {
            Ok(deleted) => {
                self.failures = 0;
                self.report.rows += deleted as u64;
                (self.record)(self.consumer.as_deref(), deleted as u64);
                self.report.batches += 1;
                self.report.elapsed = self.started.elapsed();
                if let Some(f) = self.on_batch.as_mut() {
                    f(&self.report);
                }
                let took = self.batch_began.elapsed();
                let pause = self.pause + took.mul_f64(self.sleep_coef);
                self.batch_began = Instant::now() + pause;
                if (deleted as i64) < self.limit {
                    PurgeStep::Done(Ok(self.report))
                } else if pause > Duration::ZERO {
                    PurgeStep::Sleep(pause)
                } else {
                    PurgeStep::Again
                }
            }
            Err(e) if transient(&e) && self.failures < PURGE_BATCH_RETRIES => {
                self.failures += 1;
                self.report.retries += 1;
                tracing::debug!(target: crate::target::TARGET, error = %e, attempt = self.failures, "diesel-inbox: purge batch failed transiently, retrying");
                let delay = crate::backoff::rerun(self.failures);
                self.batch_began = Instant::now() + delay;
                PurgeStep::Sleep(delay)
            }
            Err(e) => PurgeStep::Done(Err(e)),
        }
    }
}

/// One purge batch in a short transaction of its own: the backend's
/// isolation for purges, its `BEGIN`, the batch, `COMMIT` (a failure rolls
/// back): the rows deleted.
fn purge_batch<C>(
    conn: &mut C,
    cutoff: &str,
    consumer: Option<&str>,
    limit: i64,
) -> diesel::QueryResult<usize>
where
    C: InboxConnection + LoadConnection,
{
    short_transaction(conn, |conn| {
        <C::Backend as crate::backend::Statements>::purge_batch(conn, cutoff, consumer, limit)
    })
}

/// [`purge_batch`] on an async connection.
#[cfg(feature = "async")]
async fn purge_batch_async<C>(
    conn: &mut C,
    cutoff: &str,
    consumer: Option<&str>,
    limit: i64,
) -> diesel::QueryResult<usize>
where
    C: crate::AsyncInboxConnection,
{
    if let Some(isolation) = <C::Backend as Internals>::PURGE_ISOLATION {
        // Pending until the `BEGIN` below (sent without an await between):
        // a future dropped meanwhile leaves a connection pools discard.
        let status = crate::backend::transaction::state_unknown(conn);
        let set = diesel_async::SimpleAsyncConnection::batch_execute(conn, isolation).await;
        crate::backend::transaction::state_known(conn, status);
        set?;
    }
    conn.inbox_begin().await.map_err(|(_, e)| e)?;
    let batch = conn
        .inbox_purge_batch(cutoff.to_owned(), consumer.map(str::to_owned), limit)
        .await;
    match batch {
        Ok(deleted) => conn.inbox_commit(Scope::TopLevel).await.map(|()| deleted),
        Err(e) => {
            conn.inbox_rollback().await;
            Err(e)
        }
    }
}

/// What the failure counts' delete after a purge's batches deleted: 0
/// without the table (a schema-1 table that `migrate` has not upgraded).
fn attempts_purged<B: InboxBackend>(deleted: Result<usize, Error>) -> Result<u64, InboxError> {
    match deleted {
        Ok(rows) => Ok(rows as u64),
        Err(e) if B::is_missing_table(&e) => Ok(0),
        Err(e) => Err(ops_error::<B>(e)),
    }
}

/// Deletes the rows claimed longer than `older_than` ago, in batches of
/// `batch_size` rows, each in a short transaction of its own, and says how
/// many. See [`Purge`] for the locking, the options (one consumer, progress,
/// dry run) and the rule that retention must exceed the redelivery horizon.
///
/// ```
/// use diesel::prelude::*;
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// let report = diesel_inbox::purge(&mut conn, Duration::from_secs(7 * 24 * 3600), 10_000)?;
/// assert_eq!((report.rows, report.batches), (0, 1));
/// # Ok(())
/// # }
/// ```
pub fn purge<C>(
    conn: &mut C,
    older_than: Duration,
    batch_size: usize,
) -> Result<PurgeReport, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    Purge::new(older_than).batch_size(batch_size).run(conn)
}

/// The async twin of [`purge`]; on every async connection
/// ([`AsyncInboxConnection`](crate::AsyncInboxConnection)), like the other
/// async twins:
///
/// Cancel safety: each batch is a transaction of its own; a dropped call
/// keeps the batches it committed and rolls the current one back (the
/// connection, marked broken meanwhile, is discarded by its pool). The
/// other async operations (`status_async`, `forget_async`, ...) are one
/// statement each, and the same holds.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::SqliteConnection;
/// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
/// use diesel_async::AsyncConnection;
/// use diesel_inbox::{forget_async, migrate_async, purge_async, stats_async, status_async, Inbox};
/// use std::time::Duration;
///
/// let mut conn = SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await?;
/// migrate_async(&mut conn).await?;
/// let applied: diesel::QueryResult<_> =
///     Inbox::consumer("mailer").run_async(&mut conn, "m-1", async |_| Ok(())).await;
/// assert!(applied?.is_applied());
/// assert!(status_async(&mut conn, "mailer", "m-1").await?.is_some());
/// assert_eq!(stats_async(&mut conn).await?[0].rows, 1);
/// assert_eq!(purge_async(&mut conn, Duration::from_secs(86_400), 1_000).await?.rows, 0);
/// assert!(forget_async(&mut conn, "mailer", "m-1").await?);
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[cfg(feature = "async")]
pub async fn purge_async<P, C, Via>(
    conn: &mut P,
    older_than: Duration,
    batch_size: usize,
) -> Result<PurgeReport, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    Purge::new(older_than)
        .batch_size(batch_size)
        .run_async(conn)
        .await
}
