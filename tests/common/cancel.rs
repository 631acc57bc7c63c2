//! The cancellation harness: every async call dropped at every `.await`.
//!
//! A call's future is wrapped so that it is dropped at its k-th `Pending`
//! (`DropAt`), for k = 1, 2, … until it completes before its k-th. Each
//! kind of call (a single claim, a claim with a wait bound, a batch claim,
//! a stored result, a claim behind a stream position's fence) runs on a
//! pool of one connection (deadpool, recycled
//! `Fast` and `Verified`), with another delivery of the same key holding
//! its claim in a transaction (so the claim waits, and that holder then
//! rolls back) and without. After each drop:
//! - the connection the pool hands out next is outside any transaction
//!   and its session settings are those of a new connection, and another
//!   delivery on it commits;
//! - no inbox row of the key is without its business row;
//! - a new delivery of the key applies (or is a duplicate of a body that
//!   committed), and the key ends with one business row and one inbox row.
#![cfg(feature = "async")]

use super::backend::TestBackend;
use super::modes::runtime;
use super::{unique_run_id, AppError};
use diesel_async::pooled_connection::RecyclingMethod;
use diesel_inbox::{Inbox, Processed};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// What the harness needs of a backend beyond [`TestBackend`].
pub trait CancelBackend: TestBackend {
    /// A deadpool pool of one connection on `url`, recycled by `recycling`.
    fn one_connection_pool(url: &str, recycling: RecyclingMethod<Self::AsyncConn>)
        -> Self::OnePool;
    /// Such a pool (deadpool's, of `Self::AsyncConn`).
    type OnePool: Send + Sync;
    /// Its connection.
    type OnePooled: std::ops::DerefMut<Target = Self::AsyncConn> + Send;
    /// Its connection, once the pool has it.
    fn get(pool: &Self::OnePool) -> impl Future<Output = Self::OnePooled> + Send;
    /// A connection of its own, outside any pool.
    fn connect(url: &str) -> impl Future<Output = Self::AsyncConn> + Send;
    /// Whether a statement that fails inside a transaction leaves the
    /// transaction usable (MySQL, SQLite; PostgreSQL aborts it): the
    /// `Swallowing` call runs only there.
    const SWALLOWED_ERROR_KEEPS_TRANSACTION: bool;
    /// Whether `conn` is inside a transaction, and the session settings
    /// the runtime touches, as text.
    fn session(conn: &mut Self::AsyncConn) -> impl Future<Output = (bool, String)> + Send;
}

/// `inner`, dropped at its `at`-th `Pending`: `None` when it was dropped,
/// its output when it completed first.
struct DropAt<F: Future> {
    inner: Option<Pin<Box<F>>>,
    pendings: usize,
    at: usize,
}

impl<F: Future> Future for DropAt<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.inner.as_mut().expect("polled after it was ready");
        match inner.as_mut().poll(cx) {
            Poll::Ready(output) => Poll::Ready(Some(output)),
            Poll::Pending => {
                self.pendings += 1;
                if self.pendings < self.at {
                    return Poll::Pending;
                }
                // Dropped here, at the await it is parked on.
                self.inner = None;
                Poll::Ready(None)
            }
        }
    }
}

/// A kind of async call.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    /// `run_async`: one key.
    Single,
    /// `run_async` with the claim's wait bounded (the HTTP door's).
    Waiting,
    /// `run_batch_async`: the key and another of its own.
    Batch,
    /// `store_result`: the body's value written with the row (the HTTP
    /// door's stored response).
    #[cfg(feature = "serde")]
    Stored,
    /// `run_async` with a stream position in scope (the Kafka runners'
    /// fence): the position moves in the claim's transaction.
    Fenced,
    /// `run_async` whose body swallows a failed statement and returns
    /// `Ok`: the runtime asks whether the transaction is still open
    /// before it commits (an await of its own).
    Swallowing,
}

const CONSUMER: &str = "cancel-harness";

/// One delivery of `key` of `kind` on `conn`, writing the business row of
/// each key it applies: `Ok(true)` when the body ran.
async fn deliver<B: CancelBackend>(
    kind: Call,
    conn: &mut B::AsyncConn,
    run: &str,
    key: &str,
) -> Result<bool, AppError> {
    let inbox = Inbox::consumer(CONSUMER).retries(0);
    let (run, key) = (run.to_owned(), key.to_owned());
    let body = {
        let (run, key) = (run.clone(), key.clone());
        async move |conn: &mut B::AsyncConn| -> Result<i64, AppError> {
            B::write_effect_async(conn, &run, &key, 1).await?;
            Ok(1)
        }
    };
    match kind {
        Call::Single => Ok(matches!(
            inbox.run_async(conn, key.as_str(), body).await?,
            Processed::Applied(_)
        )),
        Call::Waiting => Ok(matches!(
            inbox
                .wait(Duration::from_secs(5))
                .run_async(conn, key.as_str(), body)
                .await?,
            Processed::Applied(_)
        )),
        Call::Batch => {
            let keys = [key.clone(), format!("{key}/other")];
            let batch = inbox
                .run_batch_async(
                    conn,
                    &keys,
                    |k| k.clone(),
                    async |conn: &mut B::AsyncConn,
                           fresh: Vec<&String>|
                           -> Result<usize, AppError> {
                        for k in &fresh {
                            B::write_effect_async(conn, &run, k, 1).await?;
                        }
                        Ok(fresh.len())
                    },
                )
                .await?;
            Ok(batch.applied.contains(&0))
        }
        Call::Swallowing => {
            let (run, written) = (run.clone(), key.clone());
            let swallowing = async move |conn: &mut B::AsyncConn| -> Result<i64, AppError> {
                B::write_effect_async(conn, &run, &written, 1).await?;
                let failed = diesel_async::SimpleAsyncConnection::batch_execute(
                    conn,
                    "SELECT * FROM no_such_table_of_the_cancel_harness",
                )
                .await;
                assert!(failed.is_err(), "the statement did not fail");
                Ok(1)
            };
            Ok(matches!(
                inbox.run_async(conn, key.as_str(), swallowing).await?,
                Processed::Applied(_)
            ))
        }
        Call::Fenced => {
            // Every delivery of the key is the message at offset 0 of a
            // partition of its own: the first commit moves it to 1, and a
            // redelivery after that is a duplicate.
            let position = diesel_inbox::__testing::Position {
                topic: key.clone(),
                partition: 0,
                offset: 0,
                last: 0,
                floor: None,
            };
            let call = inbox.run_async(conn, key.as_str(), body);
            let (processed, _) = diesel_inbox::__testing::at_position(position, call).await;
            Ok(matches!(processed?, Processed::Applied(_)))
        }
        #[cfg(feature = "serde")]
        Call::Stored => Ok(inbox
            .store_result()
            .run_async(conn, key.as_str(), body)
            .await?
            .is_applied()),
    }
}

/// Another delivery of `key` that claims it and holds the claim until
/// `release`, then fails (its transaction rolls back). Resolves once the
/// claim is held.
async fn hold<B: CancelBackend>(
    url: &str,
    key: &str,
    release: Arc<tokio::sync::Notify>,
) -> tokio::task::JoinHandle<()> {
    let mut conn = B::connect(url).await;
    let key = key.to_owned();
    let (claimed, held) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let claimed = std::sync::Mutex::new(Some(claimed));
        let outcome = Inbox::consumer(CONSUMER)
            .retries(0)
            .run_async(&mut conn, key.as_str(), async |_conn: &mut B::AsyncConn| {
                if let Some(claimed) = claimed.lock().expect("lock").take() {
                    let _ = claimed.send(());
                }
                release.notified().await;
                Err::<(), _>(AppError::Rejected)
            })
            .await;
        assert!(
            matches!(outcome, Err(AppError::Rejected)),
            "the holder rolled back: {outcome:?}"
        );
    });
    held.await.expect("the holder claimed the key");
    task
}

/// The harness for one kind of call on backend `B`: every recycling
/// method, with and without a holder, dropped at every `Pending`.
pub fn dropped_at_every_await<B: CancelBackend>(kind: Call) {
    if matches!(kind, Call::Swallowing) && !B::SWALLOWED_ERROR_KEEPS_TRANSACTION {
        // PostgreSQL aborts the transaction: such a body is never applied
        // (`BodyIgnoredError`, tests/postgres).
        println!("SKIPPED: a body that swallows an error never applies here");
        return;
    }
    let Some(db) = B::prepare("cancel_harness") else {
        return;
    };
    let run = unique_run_id("cancel-harness");
    runtime().block_on(async {
        for (name, recycling) in [
            ("fast", RecyclingMethod::Fast),
            ("verified", RecyclingMethod::Verified),
        ] {
            let pool = B::one_connection_pool(&db, recycling);
            // The settings of a connection nobody has used.
            let baseline = {
                let mut conn = B::connect(&db).await;
                B::session(&mut conn).await
            };
            assert!(!baseline.0, "a new connection is outside any transaction");
            for held in [true, false] {
                let mut drops = 0;
                for at in 1.. {
                    let key = format!("{run}:{kind:?}:{name}:{held}:{at}");
                    let release = Arc::new(tokio::sync::Notify::new());
                    let holder = match held {
                        true => Some(hold::<B>(&db, &key, release.clone()).await),
                        false => None,
                    };
                    // The holder lets go a little later, whether or not
                    // the call was dropped by then.
                    let releasing = {
                        let release = release.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            release.notify_one();
                        })
                    };
                    let completed = {
                        let mut conn = B::get(&pool).await;
                        DropAt {
                            inner: Some(Box::pin(deliver::<B>(kind, &mut *conn, &run, &key))),
                            pendings: 0,
                            at,
                        }
                        .await
                    };
                    releasing.await.expect("released");
                    if let Some(holder) = holder {
                        holder.await.expect("the holder's task");
                    }
                    let context = format!("{kind:?}, {name}, held {held}, dropped at {at}");
                    after_the_drop::<B>(&pool, &db, &run, &key, kind, &baseline, &context).await;
                    match completed {
                        Some(outcome) => {
                            outcome.unwrap_or_else(|e| panic!("{context}: completed with {e:?}"));
                            break;
                        }
                        None => drops += 1,
                    }
                }
                // A claim that waits is pending at least there (without a
                // holder, SQLite's steps may finish before they are polled).
                assert!(
                    drops > 0 || !held,
                    "{kind:?}, {name}, held: dropped at least once"
                );
            }
        }
    });
}

/// The operations (what the CLI and the console run) dropped at every
/// `Pending` on a pool of one connection: the next user of the pool reads
/// the right rows, outside any transaction.
pub fn operations_dropped_at_every_await<B: CancelBackend>() {
    let Some(db) = B::prepare("cancel_operations") else {
        return;
    };
    let run = unique_run_id("cancel-operations");
    runtime().block_on(async {
        let pool = B::one_connection_pool(&db, RecyclingMethod::Fast);
        let key = format!("{run}:known");
        {
            let mut conn = B::get(&pool).await;
            let applied = deliver::<B>(Call::Single, &mut conn, &run, &key).await;
            assert!(matches!(applied, Ok(true)), "{applied:?}");
        }
        let baseline = B::session(&mut B::connect(&db).await).await;
        for at in 1.. {
            let completed = {
                let mut conn = B::get(&pool).await;
                let missing = format!("{run}:missing");
                let read = async move {
                    let status = diesel_inbox::status_async(&mut conn, CONSUMER, &missing).await;
                    let stats = diesel_inbox::stats_async(&mut conn).await;
                    (status, stats)
                };
                DropAt {
                    inner: Some(Box::pin(read)),
                    pendings: 0,
                    at,
                }
                .await
            };
            let mut conn = B::get(&pool).await;
            let session = B::session(&mut conn).await;
            assert_eq!(
                session, baseline,
                "dropped at {at}: the connection handed out next"
            );
            let known = diesel_inbox::status_async(&mut conn, CONSUMER, &key).await;
            assert!(
                matches!(known, Ok(Some(_))),
                "dropped at {at}: the next read finds the key: {known:?}"
            );
            if let Some((status, stats)) = completed {
                assert!(matches!(status, Ok(None)), "{status:?}");
                assert!(stats.is_ok(), "{stats:?}");
                break;
            }
        }
    });
}

/// The writes an operator or a handler starts outside the engine, dropped
/// at every await in turn: `migrate_async`, the inbox's `purge_async` and
/// `forget_async`, the console's outbox actions (`retry_async`,
/// `discard_async`), the outbox's `purge_async` and `status_async`, and an
/// `enqueue_async` in the caller's own transaction. After each drop the
/// pool's next connection is outside any transaction with the session of a
/// new one, the known key is still there, and the message enqueued by the
/// dropped call is there only if its transaction committed (whole: its
/// payload as sent).
pub fn writes_dropped_at_every_await<B: CancelBackend>() {
    use diesel_async::AsyncConnection;
    use diesel_inbox::outbox::{self, DeadFilter, Outgoing};
    let Some(db) = B::prepare("cancel_writes") else {
        return;
    };
    let run = unique_run_id("cancel-writes");
    runtime().block_on(async {
        let pool = B::one_connection_pool(&db, RecyclingMethod::Fast);
        let key = format!("{run}:known");
        {
            let mut conn = B::get(&pool).await;
            let applied = deliver::<B>(Call::Single, &mut conn, &run, &key).await;
            assert!(matches!(applied, Ok(true)), "{applied:?}");
        }
        let baseline = B::session(&mut B::connect(&db).await).await;
        let destination = format!("{run}:nowhere");
        let payload = b"whole".to_vec();
        for at in 1.. {
            let id = format!("{run}:{at}");
            let completed = {
                let mut conn = B::get(&pool).await;
                let (missing, destination, id) =
                    (format!("{run}:missing"), destination.clone(), id.clone());
                let payload = payload.clone();
                let writes = async move {
                    let month = Duration::from_secs(30 * 24 * 3600);
                    let migrated = diesel_inbox::migrate_async(&mut *conn).await;
                    let purged = diesel_inbox::purge_async(&mut conn, month, 100).await;
                    let forgot = diesel_inbox::forget_async(&mut conn, CONSUMER, &missing).await;
                    let none = DeadFilter::new().destination(destination.clone());
                    let retried = outbox::retry_async(&mut conn, &none).await;
                    let discarded = outbox::discard_async(&mut conn, &none).await;
                    let swept = outbox::purge_async(&mut conn, month, 100).await;
                    let status = outbox::status_async(&mut conn).await;
                    let message = Outgoing::new(destination, payload).id(id);
                    let enqueued = (*conn)
                        .transaction::<_, diesel_inbox::InboxError, _>(async move |conn| {
                            outbox::enqueue_async(conn, message).await
                        })
                        .await;
                    assert!(migrated.is_ok(), "{migrated:?}");
                    assert!(matches!(&purged, Ok(r) if r.rows == 0), "{purged:?}");
                    assert!(matches!(forgot, Ok(false)), "{forgot:?}");
                    assert!(matches!(retried, Ok(0)), "{retried:?}");
                    assert!(matches!(discarded, Ok(0)), "{discarded:?}");
                    assert!(swept.is_ok() && status.is_ok(), "{swept:?} {status:?}");
                    enqueued
                };
                DropAt {
                    inner: Some(Box::pin(writes)),
                    pendings: 0,
                    at,
                }
                .await
            };
            let mut conn = B::get(&pool).await;
            let session = B::session(&mut conn).await;
            assert_eq!(
                session, baseline,
                "dropped at {at}: the connection handed out next"
            );
            let known = diesel_inbox::status_async(&mut conn, CONSUMER, &key).await;
            assert!(
                matches!(known, Ok(Some(_))),
                "dropped at {at}: the next read finds the key: {known:?}"
            );
            drop(conn);
            let rows = B::outbox_payloads(&mut B::open(&db), &id);
            assert!(
                rows.iter().all(|row| *row == payload),
                "dropped at {at}: a partial message {rows:?}"
            );
            if let Some(enqueued) = completed {
                assert_eq!(enqueued.as_deref().ok(), Some(id.as_str()), "{enqueued:?}");
                assert_eq!(rows.len(), 1, "the completed enqueue's row");
                break;
            }
        }
    });
}

/// `migrate_async` on an empty database, dropped at every await in turn
/// (its catalog reads, its lock, its DDL, its unlock). After each drop the
/// pool's next connection is outside any transaction with the session of
/// a new one; `migrate_async` on it completes within 20 s (no lock left
/// held: MySQL's `GET_LOCK` would make it wait 60 s) from whatever the
/// dropped call left, and a delivery then applies.
pub fn migrate_dropped_at_every_await<B: CancelBackend>() {
    runtime().block_on(async {
        for at in 1.. {
            let Some(db) = B::fresh("cancel_migrate") else {
                return;
            };
            let pool = B::one_connection_pool(&db, RecyclingMethod::Fast);
            let baseline = B::session(&mut B::connect(&db).await).await;
            let completed = {
                let mut conn = B::get(&pool).await;
                let migrate = async move { diesel_inbox::migrate_async(&mut *conn).await };
                DropAt {
                    inner: Some(Box::pin(migrate)),
                    pendings: 0,
                    at,
                }
                .await
            };
            let mut conn = B::get(&pool).await;
            let session = B::session(&mut conn).await;
            assert_eq!(
                session, baseline,
                "dropped at {at}: the connection handed out next"
            );
            let again = tokio::time::timeout(
                Duration::from_secs(20),
                diesel_inbox::migrate_async(&mut *conn),
            )
            .await;
            assert!(
                matches!(again, Ok(Ok(()))),
                "dropped at {at}: migrate after the drop: {again:?}"
            );
            diesel::connection::SimpleConnection::batch_execute(
                &mut B::open(&db),
                super::EFFECTS_DDL,
            )
            .expect("the business table");
            let run = unique_run_id("cancel-migrate");
            let applied = deliver::<B>(Call::Single, &mut conn, &run, &format!("{run}:k")).await;
            assert!(matches!(applied, Ok(true)), "dropped at {at}: {applied:?}");
            if let Some(migrated) = completed {
                migrated.expect("the undropped migrate");
                break;
            }
        }
    });
}

/// A publisher that records the payloads it was given (an endpoint of the
/// user's, as `Publish` allows): what the relay published.
#[cfg(feature = "relay")]
#[derive(Clone, Default)]
struct Recorded(Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

#[cfg(feature = "relay")]
impl diesel_inbox::outbox::Publish for Recorded {
    async fn publish(
        &self,
        messages: &[diesel_inbox::outbox::OutboxMessage],
    ) -> Vec<Result<(), diesel_inbox::outbox::PublishError>> {
        // A broker's round trip: the relay's settlement runs beside it.
        tokio::task::yield_now().await;
        let mut published = self.0.lock().expect("not poisoned");
        published.extend(messages.iter().map(|m| m.payload.clone()));
        messages.iter().map(|_| Ok(())).collect()
    }
}

/// The relay's pass (`Relay::run_once`, which a caller's `select!` or
/// timeout may drop) dropped at every await in turn, over messages
/// enqueued before. After each drop the pool's next connection is outside
/// any transaction with the session of a new one, and every message that
/// left the outbox was published; once a pass completes (after the leases
/// of the dropped ones ran out), every message was published and none is
/// left.
#[cfg(feature = "relay")]
pub fn relay_dropped_at_every_await<B: CancelBackend>()
where
    B::OnePool: diesel_inbox::outbox::RelayPool + Clone + 'static,
{
    use diesel_inbox::outbox::{self, Outgoing, Relay};
    let Some(db) = B::prepare("cancel_relay") else {
        return;
    };
    let run = unique_run_id("cancel-relay");
    // Five new messages (a key of their own) before each pass: rows a
    // dropped pass holds wait for their lease, and the next pass has new
    // ones to claim, publish and settle.
    let enqueue = |at: usize| -> Vec<String> {
        let mut conn = B::open(&db);
        let key = format!("{run}:{at}");
        (0..5)
            .map(|n| {
                let id = format!("{key}:m{n}");
                diesel::Connection::transaction::<_, diesel_inbox::InboxError, _>(
                    &mut conn,
                    |conn| {
                        let message =
                            Outgoing::new(format!("{run}:relay"), id.clone().into_bytes())
                                .ordering_key(&key)
                                .id(id.clone());
                        outbox::enqueue(conn, message).map(drop)
                    },
                )
                .expect("enqueue");
                id
            })
            .collect()
    };
    let published = Recorded::default();
    // How many of `ids` are still in the outbox; every other was published.
    let left_and_published = |ids: &[String]| {
        let mut conn = B::open(&db);
        let sent = published.0.lock().expect("not poisoned").clone();
        let mut left = 0;
        for id in ids {
            match B::outbox_payloads(&mut conn, id).is_empty() {
                false => left += 1,
                true => assert!(
                    sent.contains(&id.as_bytes().to_vec()),
                    "{id} left the outbox unpublished"
                ),
            }
        }
        left
    };
    let mut ids = Vec::new();
    runtime().block_on(async {
        let pool = B::one_connection_pool(&db, RecyclingMethod::Fast);
        let baseline = B::session(&mut B::connect(&db).await).await;
        for at in 1.. {
            ids.extend(enqueue(at));
            let relay = Relay::new(pool.clone(), published.clone())
                .batch_size(2)
                .lease(Duration::from_secs(1));
            let completed = DropAt {
                inner: Some(Box::pin(async move { relay.run_once().await })),
                pendings: 0,
                at,
            }
            .await;
            let mut conn = B::get(&pool).await;
            let session = B::session(&mut conn).await;
            assert_eq!(
                session, baseline,
                "dropped at {at}: the connection handed out next"
            );
            drop(conn);
            left_and_published(&ids);
            if let Some(report) = completed {
                report.expect("a pass");
                break;
            }
        }
        // The dropped passes' leases run out; a whole pass publishes the rest.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        Relay::new(pool.clone(), published.clone())
            .run_once()
            .await
            .expect("the last pass");
    });
    assert_eq!(left_and_published(&ids), 0, "messages left");
}

/// The checks after a drop at one await.
async fn after_the_drop<B: CancelBackend>(
    pool: &B::OnePool,
    db: &str,
    run: &str,
    key: &str,
    kind: Call,
    baseline: &(bool, String),
    context: &str,
) {
    // The next user of the pool: outside any transaction, the session as
    // new, and what it commits is its own alone.
    {
        let mut conn = B::get(pool).await;
        let session = B::session(&mut *conn).await;
        assert_eq!(
            &session, baseline,
            "{context}: the connection handed out next"
        );
        let other = format!("{key}/next-user");
        let applied = deliver::<B>(Call::Single, &mut *conn, run, &other).await;
        assert!(
            matches!(applied, Ok(true)),
            "{context}: the next user applies: {applied:?}"
        );
    }
    let mut check = B::open(db);
    let effects = |check: &mut B::Conn| {
        B::effects_of(check, run)
            .into_iter()
            .filter(|(k, _)| k == key)
            .count()
    };
    let (rows, applied) = (
        B::inbox_rows(&mut check, CONSUMER, key),
        effects(&mut check),
    );
    assert!(
        applied <= 1 && rows as usize == applied,
        "{context}: {rows} inbox row(s) and {applied} business row(s) of the key"
    );
    // Behind the fence: the position moved exactly when the body committed.
    let moved = |check: &mut B::Conn| {
        diesel_inbox::positions(check, Some(CONSUMER))
            .expect("the positions")
            .into_iter()
            .find(|p| p.topic == key)
            .map(|p| p.next_offset)
    };
    if matches!(kind, Call::Fenced) {
        assert_eq!(
            moved(&mut check),
            (applied == 1).then_some(1),
            "{context}: the stream position and the business row"
        );
    }
    // A new delivery of the key applies, unless the body committed.
    let mut conn = B::get(pool).await;
    let redelivered = deliver::<B>(kind, &mut *conn, run, key).await;
    assert_eq!(
        redelivered.unwrap_or_else(|e| panic!("{context}: the redelivery failed: {e:?}")),
        applied == 0,
        "{context}: the redelivery applies exactly when nothing was committed"
    );
    assert_eq!(
        (
            B::inbox_rows(&mut check, CONSUMER, key),
            effects(&mut check)
        ),
        (1, 1),
        "{context}: one inbox row and one business row in the end"
    );
    if matches!(kind, Call::Fenced) {
        assert_eq!(
            moved(&mut check),
            Some(1),
            "{context}: the position in the end"
        );
    }
}

/// Stamps out one `#[test]` per kind of call for a backend.
#[macro_export]
macro_rules! cancel_tests {
    ($B:ty, runs_if = $runs_if:meta, else_ignored = $why:literal) => {
        $crate::cancel_tests!(@test $B, $runs_if, $why, single_claim_dropped_at_every_await, Single);
        $crate::cancel_tests!(@test $B, $runs_if, $why, waiting_claim_dropped_at_every_await, Waiting);
        $crate::cancel_tests!(@test $B, $runs_if, $why, batch_claim_dropped_at_every_await, Batch);
        #[cfg(feature = "serde")]
        $crate::cancel_tests!(@test $B, $runs_if, $why, stored_result_dropped_at_every_await, Stored);
        $crate::cancel_tests!(@test $B, $runs_if, $why, fenced_dropped_at_every_await, Fenced);
        $crate::cancel_tests!(@test $B, $runs_if, $why, swallowing_dropped_at_every_await, Swallowing);
        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn operations_dropped_at_every_await() {
            $crate::common::cancel::operations_dropped_at_every_await::<$B>();
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn writes_dropped_at_every_await() {
            $crate::common::cancel::writes_dropped_at_every_await::<$B>();
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn migrate_dropped_at_every_await() {
            $crate::common::cancel::migrate_dropped_at_every_await::<$B>();
        }

        #[cfg(feature = "relay")]
        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn relay_dropped_at_every_await() {
            $crate::common::cancel::relay_dropped_at_every_await::<$B>();
        }
    };
    (@test $B:ty, $runs_if:meta, $why:literal, $test:ident, $kind:ident) => {
        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn $test() {
            $crate::common::cancel::dropped_at_every_await::<$B>(
                $crate::common::cancel::Call::$kind,
            );
        }
    };
}

/// A session's state as [`CancelBackend::session`] reads it: two texts.
#[derive(diesel::QueryableByName)]
pub struct SessionRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub in_transaction: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub settings: String,
}
