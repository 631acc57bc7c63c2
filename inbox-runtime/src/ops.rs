//! Operating the inbox: retention ([`purge`]), inspection ([`status`],
//! [`stats`]) and deliberate replays ([`forget`]), for sync connections and,
//! with the `async` feature, their async twins.
//!
//! The statements are written once (`backend::ops_statements`) and run by
//! each backend on its sync and its async connection; the purge loop's
//! decisions (when a batch was the last, which errors to retry, the report)
//! live once in [`PurgeLoop`], driven by a sync and an async loop of a few
//! lines.

#[cfg(feature = "async")]
use crate::backend::asynchronous::AsAsyncConnection;
use crate::backend::transaction;
#[cfg(feature = "async")]
use crate::backend::transaction::Scope;
use crate::backend::{InboxBackend, Internals, Statements};
use crate::error::InboxError;
use crate::key::validate_key;
use crate::rows::{attempts_of, failing_of, Attempts, ConsumerStats, InboxEntry};
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
/// a pause six times as long as the batch took. With it, a purge of
/// 1,000,000 rows in the default batches of 10,000 kept 4 handler threads'
/// p99 latency within 2× of their p99 without a purge on PostgreSQL and
/// MariaDB (the benchmark's `--purge`, `docs/performance.md`), at 30,000 to
/// 12,000 rows/s.
pub const DEFAULT_SLEEP_COEF: f64 = 6.0;

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

    /// Rows per batch (1 to [`MAX_PURGE_BATCH`]).
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
    /// cannot stall the handlers. The default, [`DEFAULT_SLEEP_COEF`], is
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
                tracing::debug!(target: "diesel_inbox", error = %e, attempt = self.failures, "diesel-inbox: purge batch failed transiently, retrying");
                let delay = crate::backoff::rerun(self.failures);
                self.batch_began = Instant::now() + delay;
                PurgeStep::Sleep(delay)
            }
            Err(e) => PurgeStep::Done(Err(e)),
        }
    }
}

/// A database error of an operation, named for what it is.
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

/// `statements` in a short transaction of their own: the backend's
/// isolation for short batches (no gap locks on MySQL), its `BEGIN`, the
/// statements, `COMMIT` (a failure rolls back). The inbox's and the
/// outbox's purge batches.
pub(crate) fn short_transaction<C, T>(
    conn: &mut C,
    statements: impl FnOnce(&mut C) -> diesel::QueryResult<T>,
) -> diesel::QueryResult<T>
where
    C: InboxConnection + LoadConnection,
{
    if let Some(isolation) = <C::Backend as Internals>::PURGE_ISOLATION {
        conn.batch_execute(isolation)?;
    }
    <C::Backend as Internals>::begin_top_level(conn)?;
    match statements(conn) {
        Ok(done) => <C::Backend as Internals>::commit_top_level(conn).map(|()| done),
        Err(e) => {
            transaction::rollback(conn);
            Err(e)
        }
    }
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
        diesel_async::SimpleAsyncConnection::batch_execute(conn, isolation).await?;
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

pub(crate) fn ops_error<B: InboxBackend>(error: Error) -> InboxError {
    if B::is_missing_table(&error) {
        InboxError::NoTable(error)
    } else {
        InboxError::Database(error)
    }
}

fn checked_ids(consumer: &str, key: &str) -> Result<(), InboxError> {
    validate_key(consumer).map_err(InboxError::InvalidConsumer)?;
    validate_key(key).map_err(InboxError::InvalidKey)
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

/// The inbox row of `key` for `consumer`, if the message was applied (and
/// not purged or forgotten since).
///
/// See [`InboxEntry`] for an example.
pub fn status<C>(conn: &mut C, consumer: &str, key: &str) -> Result<Option<InboxEntry>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    checked_ids(consumer, key)?;
    C::Backend::entry(conn, consumer, key).map_err(ops_error::<C::Backend>)
}

/// The failure count of `key` for `consumer` (handlers with
/// `max_attempts`), or `None` when its deliveries have not failed since the
/// last success or [`forget`]. Once `failures` reaches the handler's
/// `max_attempts`, its deliveries fail with
/// [`InboxError::AttemptsExhausted`].
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{attempts, forget, idempotent, InboxError};
///
/// #[derive(Debug)]
/// struct Rejected;
/// # impl From<InboxError> for Rejected { fn from(_: InboxError) -> Self { Rejected } }
/// # impl From<diesel::result::Error> for Rejected { fn from(_: diesel::result::Error) -> Self { Rejected } }
///
/// #[idempotent(key = "id", max_attempts = 2)]
/// fn import(conn: &mut SqliteConnection, id: i64) -> Result<(), Rejected> {
///     Err(Rejected)
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// assert!(import(&mut conn, 1).is_err());
/// assert!(import(&mut conn, 1).is_err());
/// let count = attempts(&mut conn, "import", "1")?.expect("counted");
/// assert_eq!((count.failures, count.last_error.as_str()), (2, "Rejected"));
/// assert!(forget(&mut conn, "import", "1")?); // a deliberate retry
/// assert!(attempts(&mut conn, "import", "1")?.is_none());
/// # Ok(())
/// # }
/// ```
pub fn attempts<C>(conn: &mut C, consumer: &str, key: &str) -> Result<Option<Attempts>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    checked_ids(consumer, key)?;
    C::Backend::attempts(conn, consumer, key)
        .map(|row| row.map(|row| attempts_of(consumer, key, row)))
        .map_err(ops_error::<C::Backend>)
}

/// The failing keys: each failure count (`max_attempts`) of at least
/// `min_failures` failures, of `consumer` or of every consumer (`None`), the
/// latest failure first, at most `limit` of them. A key is listed from its
/// first counted failure until a delivery of it succeeds or it is
/// [`forget`]-ed; with `min_failures` set to the handler's `max_attempts`
/// the list is the keys given up on ([`InboxError::AttemptsExhausted`]).
/// `limit` is 1 to [`MAX_PURGE_BATCH`].
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{attempts_list, idempotent, InboxError};
///
/// #[derive(Debug)]
/// struct Rejected;
/// # impl From<InboxError> for Rejected { fn from(_: InboxError) -> Self { Rejected } }
/// # impl From<diesel::result::Error> for Rejected { fn from(_: diesel::result::Error) -> Self { Rejected } }
///
/// #[idempotent(key = "id", max_attempts = 2)]
/// fn import(conn: &mut SqliteConnection, id: i64) -> Result<(), Rejected> {
///     Err(Rejected)
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// for id in [1, 1, 2] {
///     assert!(import(&mut conn, id).is_err());
/// }
/// let failing = attempts_list(&mut conn, Some("import"), 1, 100)?;
/// assert_eq!(failing.len(), 2);
/// let exhausted = attempts_list(&mut conn, Some("import"), 2, 100)?;
/// assert_eq!((exhausted[0].key.as_str(), exhausted[0].failures), ("1", 2));
/// # Ok(())
/// # }
/// ```
pub fn attempts_list<C>(
    conn: &mut C,
    consumer: Option<&str>,
    min_failures: u32,
    limit: usize,
) -> Result<Vec<Attempts>, InboxError>
where
    C: InboxConnection,
{
    let (min_failures, limit) = checked_list(consumer, min_failures, limit)?;
    C::Backend::failing(conn, consumer, min_failures, limit)
        .map(|rows| rows.into_iter().map(failing_of).collect())
        .map_err(ops_error::<C::Backend>)
}

/// `attempts_list`'s arguments as its statement takes them.
fn checked_list(
    consumer: Option<&str>,
    min_failures: u32,
    limit: usize,
) -> Result<(i32, i64), InboxError> {
    if let Some(consumer) = consumer {
        validate_key(consumer).map_err(InboxError::InvalidConsumer)?;
    }
    if limit == 0 || limit > MAX_PURGE_BATCH {
        return Err(InboxError::InvalidArgument(
            "attempts_list: limit must be 1 to MAX_PURGE_BATCH",
        ));
    }
    Ok((
        i32::try_from(min_failures).unwrap_or(i32::MAX),
        limit as i64,
    ))
}

/// Removes the inbox row of `key` for `consumer`, so that the next delivery
/// of that message is applied again: a deliberate replay. It also removes
/// the key's failure count (`max_attempts`), so that a message given up on
/// runs again. `true` if there was a row or a count. The message's earlier effects stay; replay only what is safe
/// to apply twice, or undo it first.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{forget, idempotent, Processed};
///
/// #[idempotent(key = "id")]
/// fn resend(conn: &mut SqliteConnection, id: i64) -> QueryResult<()> {
///     Ok(())
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// resend(&mut conn, 1)?;
/// assert!(forget(&mut conn, "resend", "1")?);
/// assert_eq!(resend(&mut conn, 1)?, Processed::Applied(()));
/// assert!(!forget(&mut conn, "resend", "2")?);
/// # Ok(())
/// # }
/// ```
pub fn forget<C>(conn: &mut C, consumer: &str, key: &str) -> Result<bool, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    checked_ids(consumer, key)?;
    C::Backend::forget(conn, consumer, key).map_err(ops_error::<C::Backend>)
}

/// Per consumer, ordered by name: how many rows the inbox holds, and when
/// the oldest and the newest were claimed. It reads every row (one
/// aggregate query): on a very large inbox, run it off the hot path.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{idempotent, stats};
///
/// #[idempotent(key = "id")]
/// fn bill(conn: &mut SqliteConnection, id: i64) -> QueryResult<()> {
///     Ok(())
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// for id in 0..3 {
///     bill(&mut conn, id)?;
/// }
/// let per_consumer = stats(&mut conn)?;
/// assert_eq!((per_consumer[0].consumer.as_str(), per_consumer[0].rows), ("bill", 3));
/// assert!(per_consumer[0].oldest <= per_consumer[0].newest);
/// # Ok(())
/// # }
/// ```
pub fn stats<C>(conn: &mut C) -> Result<Vec<ConsumerStats>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    C::Backend::stats(conn).map_err(ops_error::<C::Backend>)
}

/// The async twin of [`purge`]; on every async connection
/// ([`AsyncInboxConnection`](crate::AsyncInboxConnection)), like the other
/// async twins:
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

/// The async twin of [`status`] (example: [`purge_async`]).
#[cfg(feature = "async")]
pub async fn status_async<P, C, Via>(
    conn: &mut P,
    consumer: &str,
    key: &str,
) -> Result<Option<InboxEntry>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    checked_ids(consumer, key)?;
    conn.connection()
        .inbox_entry(consumer, key)
        .await
        .map_err(ops_error::<C::Backend>)
}

/// The async twin of [`attempts`].
#[cfg(feature = "async")]
pub async fn attempts_async<P, C, Via>(
    conn: &mut P,
    consumer: &str,
    key: &str,
) -> Result<Option<Attempts>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    checked_ids(consumer, key)?;
    conn.connection()
        .inbox_attempts(consumer, key)
        .await
        .map(|row| row.map(|row| attempts_of(consumer, key, row)))
        .map_err(ops_error::<C::Backend>)
}

/// The async twin of [`attempts_list`].
#[cfg(feature = "async")]
pub async fn attempts_list_async<P, C, Via>(
    conn: &mut P,
    consumer: Option<&str>,
    min_failures: u32,
    limit: usize,
) -> Result<Vec<Attempts>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    let (min_failures, limit) = checked_list(consumer, min_failures, limit)?;
    conn.connection()
        .inbox_failing(consumer, min_failures, limit)
        .await
        .map(|rows| rows.into_iter().map(failing_of).collect())
        .map_err(ops_error::<C::Backend>)
}

/// The async twin of [`forget`] (example: [`purge_async`]).
#[cfg(feature = "async")]
pub async fn forget_async<P, C, Via>(
    conn: &mut P,
    consumer: &str,
    key: &str,
) -> Result<bool, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    checked_ids(consumer, key)?;
    conn.connection()
        .inbox_forget(consumer, key)
        .await
        .map_err(ops_error::<C::Backend>)
}

/// The async twin of [`stats`] (example: [`purge_async`]).
#[cfg(feature = "async")]
pub async fn stats_async<P, C, Via>(conn: &mut P) -> Result<Vec<ConsumerStats>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    conn.connection()
        .inbox_stats()
        .await
        .map_err(ops_error::<C::Backend>)
}

/// Where a Kafka runner's consumer stands in one partition, as the
/// handlers' transactions wrote it (`diesel_inbox::kafka`): the offset of
/// the next message to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamPosition {
    /// The inbox consumer whose handler wrote it.
    pub consumer: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// `offset + 1` of the last message applied.
    pub next_offset: i64,
    /// When it last moved, by the database's clock.
    pub updated_at: std::time::SystemTime,
    /// How long ago that was, by the database's clock.
    pub age: Duration,
}

fn position_of(row: crate::backend::outbox::PositionRow) -> StreamPosition {
    let micros = |m: i64| Duration::from_micros(m.max(0) as u64);
    StreamPosition {
        consumer: row.consumer,
        topic: row.topic,
        partition: row.partition_id,
        next_offset: row.next_offset,
        updated_at: std::time::SystemTime::UNIX_EPOCH + micros(row.updated_at),
        age: micros(row.now - row.updated_at),
    }
}

fn positions_of(answer: crate::backend::outbox::Answer) -> Result<Vec<StreamPosition>, InboxError> {
    match answer {
        crate::backend::outbox::Answer::Positions(rows) => {
            Ok(rows.into_iter().map(position_of).collect())
        }
        other => Err(InboxError::Database(Error::QueryBuilderError(
            format!("a positions statement returned {other:?}").into(),
        ))),
    }
}

/// The stream positions the Kafka runner's handlers keep (of `consumer`,
/// or of all), ordered by consumer, topic and partition: the CLI's
/// `status CONSUMER` prints them.
///
/// ```
/// use diesel::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// assert!(diesel_inbox::positions(&mut conn, Some("shipping"))?.is_empty());
/// # Ok(())
/// # }
/// ```
pub fn positions<C>(conn: &mut C, consumer: Option<&str>) -> Result<Vec<StreamPosition>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let op = crate::backend::outbox::Op::Positions {
        consumer: consumer.map(str::to_owned),
    };
    positions_of(C::Backend::outbox(conn, op).map_err(ops_error::<C::Backend>)?)
}

/// The async twin of [`positions`].
#[cfg(feature = "async")]
pub async fn positions_async<P, C, Via>(
    conn: &mut P,
    consumer: Option<&str>,
) -> Result<Vec<StreamPosition>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    let op = crate::backend::outbox::Op::Positions {
        consumer: consumer.map(str::to_owned),
    };
    let answer = conn
        .connection()
        .inbox_outbox(op)
        .await
        .map_err(ops_error::<C::Backend>)?;
    positions_of(answer)
}
