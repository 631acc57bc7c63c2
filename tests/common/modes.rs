//! How the contract's handlers are called: sync handlers on a diesel
//! connection (`Sync`), or async handlers on a diesel-async connection from
//! a deadpool pool, on a multi-thread tokio runtime (`Async`). The contract
//! tests are written once against [`Mode`].

use super::backend::{Msg, TestBackend};
use super::handlers::{self, AppError, Fail, Receipt, ReceiptV2};
use diesel_inbox::{
    Attempts, Batch, ConsumerStats, InboxEntry, InboxError, Processed, Purge, PurgeReport, Stored,
};
use std::sync::atomic::AtomicU32;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Barrier};
use std::time::Duration;

pub type Outcome<T> = Result<Processed<T>, AppError>;

/// One session of the contract: a connection, and the handlers called on it.
pub trait Mode: Sized {
    type B: TestBackend;
    /// `sync` or `async`, in messages.
    const NAME: &'static str;

    fn open(db: &str) -> Self;
    /// A sync connection to the same database, for assertions.
    fn check(&mut self) -> &mut <Self::B as TestBackend>::Conn;

    fn apply_payment(&mut self, m: &Msg) -> Outcome<i64>;
    fn write_then_reject(&mut self, m: &Msg) -> Outcome<()>;
    fn write_then_accept(&mut self, m: &Msg) -> Outcome<()>;
    /// Panics after its write (the panic reaches the caller).
    fn write_then_panic(&mut self, m: &Msg) -> Outcome<()>;
    fn ledger(&mut self, m: &Msg) -> Outcome<i64>;
    fn mailer(&mut self, m: &Msg) -> Outcome<i64>;
    fn by_int(&mut self, run: &str, id: i64) -> Outcome<i64>;
    fn by_str(&mut self, run: &str, id: &str) -> Outcome<()>;
    fn by_uuid(&mut self, run: &str, id: uuid::Uuid) -> Outcome<()>;
    fn slow(&mut self, m: &Msg, claimed: &Sender<()>, fail: bool) -> Outcome<()>;
    fn apply_batch(&mut self, msgs: &[Msg]) -> Result<Batch<usize>, AppError>;
    fn apply_batch_then_reject(&mut self, msgs: &[Msg]) -> Result<Batch<()>, AppError>;
    // Fingerprints and stored results (`handlers::sync::fingerprinted`, ...).
    fn fingerprinted(&mut self, m: &Msg) -> Outcome<i64>;
    fn unfingerprinted(&mut self, m: &Msg) -> Outcome<i64>;
    fn fingerprinted_batch(&mut self, msgs: &[Msg]) -> Result<Batch<usize>, AppError>;
    fn receipt(&mut self, m: &Msg) -> Result<Stored<Receipt>, AppError>;
    fn receipt_v2(&mut self, m: &Msg) -> Result<Stored<ReceiptV2>, AppError>;
    fn receipt_unstored(&mut self, m: &Msg) -> Outcome<i64>;
    /// `max_attempts = 3`; a panic is caught here and reported as `None`.
    fn flaky(&mut self, m: &Msg, runs: &AtomicU32, fail: Fail) -> Option<Outcome<i64>>;
    fn attempts(&mut self, consumer: &str, key: &str) -> Result<Option<Attempts>, InboxError>;
    /// `attempts_list` (or `attempts_list_async`).
    fn attempts_list(
        &mut self,
        consumer: Option<&str>,
        min_failures: u32,
        limit: usize,
    ) -> Result<Vec<Attempts>, InboxError>;
    fn transient_once(&mut self, m: &Msg, runs: &AtomicU32) -> Outcome<()>;
    /// Delivers `m` twice inside a transaction of the caller's, which then
    /// commits (`commit`) or rolls back.
    fn twice_in_transaction(&mut self, m: &Msg, commit: bool) -> [Outcome<i64>; 2];
    fn migrate(&mut self) -> Result<(), InboxError>;

    // The operations (`status`, `forget`, `stats`, `purge`) on the
    // session's connection: the sync functions or their async twins.
    fn status(&mut self, consumer: &str, key: &str) -> Result<Option<InboxEntry>, InboxError>;
    fn forget(&mut self, consumer: &str, key: &str) -> Result<bool, InboxError>;
    fn stats(&mut self) -> Result<Vec<ConsumerStats>, InboxError>;
    /// `diesel_inbox::purge` (or `purge_async`) itself.
    fn purge(&mut self, older_than: Duration, batch: usize) -> Result<PurgeReport, InboxError>;
    /// `Purge::run` (or `run_async`).
    fn run_purge(&mut self, purge: Purge<'_>) -> Result<PurgeReport, InboxError>;
    /// `Purge::count` (or `count_async`).
    fn count_purge(&mut self, purge: Purge<'_>) -> Result<u64, InboxError>;
    /// `n` sessions purge at once while `deliveries` are delivered on
    /// another session; the purges' reports and the deliveries' outcomes.
    fn purge_during_deliveries(
        db: &str,
        n: usize,
        older_than: Duration,
        batch: usize,
        deliveries: Vec<Msg>,
    ) -> (Vec<Result<PurgeReport, InboxError>>, Vec<Outcome<i64>>);

    // What runs at once: sync on threads, each with a connection of its
    // own; async as tasks of a multi-thread runtime over one pool.

    /// Each worker delivers its messages in order through `apply_payment`.
    fn deliver_concurrently(db: &str, workers: Vec<Vec<Msg>>) -> Vec<Vec<Outcome<i64>>>;
    /// Each worker delivers its messages in order through `fingerprinted`.
    fn fingerprinted_concurrently(db: &str, workers: Vec<Vec<Msg>>) -> Vec<Vec<Outcome<i64>>>;
    /// `workers` sessions at once each deliver `m` through a failing
    /// `flaky` until it is given up on (at most `rounds` times); the
    /// outcomes.
    fn flaky_concurrently(
        db: &str,
        workers: usize,
        m: Msg,
        rounds: usize,
        runs: Arc<AtomicU32>,
    ) -> Vec<Vec<Outcome<i64>>>;
    /// Each worker delivers its batches in order through `apply_batch`.
    fn batches_concurrently(
        db: &str,
        workers: Vec<Vec<Vec<Msg>>>,
    ) -> Vec<Vec<Result<Batch<usize>, AppError>>>;
    /// `n` sessions migrate the database at once.
    fn migrate_concurrently(db: &str, n: usize) -> Vec<Result<(), InboxError>>;
    /// A first delivery claims and holds its transaction (through `slow`),
    /// then commits or fails; the redelivery arrives while it holds.
    fn redelivery_during_first(
        db: &str,
        first: Msg,
        second: Msg,
        fail_first: bool,
    ) -> [Outcome<()>; 2];
}

/// Runs `worker` on each input at once, on threads with a session each.
fn on_threads<M, I, T>(
    db: &str,
    inputs: Vec<I>,
    worker: impl Fn(&mut M, I) -> T + Copy + Send + 'static,
) -> Vec<T>
where
    M: Mode,
    I: Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(inputs.len()));
    let threads: Vec<_> = inputs
        .into_iter()
        .map(|input| {
            let (db, barrier) = (db.to_string(), barrier.clone());
            std::thread::spawn(move || {
                let mut session = M::open(&db);
                barrier.wait();
                worker(&mut session, input)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("a worker panicked"))
        .collect()
}

/// Sync handlers on a diesel connection.
pub struct Sync<B: TestBackend> {
    conn: B::Conn,
}

/// The error of a caller's transaction that the test rolls back.
#[derive(Debug)]
pub enum Outer {
    Db(diesel::result::Error),
    RolledBack([Outcome<i64>; 2]),
}

impl From<diesel::result::Error> for Outer {
    fn from(e: diesel::result::Error) -> Self {
        Outer::Db(e)
    }
}

impl<B: TestBackend> Mode for Sync<B> {
    type B = B;
    const NAME: &'static str = "sync";

    fn open(db: &str) -> Self {
        Sync { conn: B::open(db) }
    }

    fn check(&mut self) -> &mut B::Conn {
        &mut self.conn
    }

    fn apply_payment(&mut self, m: &Msg) -> Outcome<i64> {
        handlers::sync::apply_payment::<B>(&mut self.conn, m)
    }

    fn write_then_reject(&mut self, m: &Msg) -> Outcome<()> {
        handlers::sync::write_then_reject::<B>(&mut self.conn, m)
    }

    fn write_then_accept(&mut self, m: &Msg) -> Outcome<()> {
        handlers::sync::write_then_accept::<B>(&mut self.conn, m)
    }

    fn write_then_panic(&mut self, m: &Msg) -> Outcome<()> {
        handlers::sync::write_then_panic::<B>(&mut self.conn, m)
    }

    fn ledger(&mut self, m: &Msg) -> Outcome<i64> {
        handlers::sync::ledger::<B>(&mut self.conn, m)
    }

    fn mailer(&mut self, m: &Msg) -> Outcome<i64> {
        handlers::sync::mailer::<B>(&mut self.conn, m)
    }

    fn by_int(&mut self, run: &str, id: i64) -> Outcome<i64> {
        handlers::sync::by_int::<B>(&mut self.conn, run, id)
    }

    fn by_str(&mut self, run: &str, id: &str) -> Outcome<()> {
        handlers::sync::by_str::<B>(&mut self.conn, run, id)
    }

    fn by_uuid(&mut self, run: &str, id: uuid::Uuid) -> Outcome<()> {
        handlers::sync::by_uuid::<B>(&mut self.conn, run, id)
    }

    fn slow(&mut self, m: &Msg, claimed: &Sender<()>, fail: bool) -> Outcome<()> {
        handlers::sync::slow::<B>(&mut self.conn, m, claimed, fail)
    }

    fn apply_batch(&mut self, msgs: &[Msg]) -> Result<Batch<usize>, AppError> {
        handlers::sync::apply_batch::<B>(&mut self.conn, msgs)
    }

    fn apply_batch_then_reject(&mut self, msgs: &[Msg]) -> Result<Batch<()>, AppError> {
        handlers::sync::apply_batch_then_reject::<B>(&mut self.conn, msgs)
    }

    fn fingerprinted(&mut self, m: &Msg) -> Outcome<i64> {
        handlers::sync::fingerprinted::<B>(&mut self.conn, m)
    }

    fn unfingerprinted(&mut self, m: &Msg) -> Outcome<i64> {
        handlers::sync::unfingerprinted::<B>(&mut self.conn, m)
    }

    fn fingerprinted_batch(&mut self, msgs: &[Msg]) -> Result<Batch<usize>, AppError> {
        handlers::sync::fingerprinted_batch::<B>(&mut self.conn, msgs)
    }

    fn receipt(&mut self, m: &Msg) -> Result<Stored<Receipt>, AppError> {
        handlers::sync::receipt::<B>(&mut self.conn, m)
    }

    fn receipt_v2(&mut self, m: &Msg) -> Result<Stored<ReceiptV2>, AppError> {
        handlers::sync::receipt_v2::<B>(&mut self.conn, m)
    }

    fn receipt_unstored(&mut self, m: &Msg) -> Outcome<i64> {
        handlers::sync::receipt_unstored::<B>(&mut self.conn, m)
    }

    fn flaky(&mut self, m: &Msg, runs: &AtomicU32, fail: Fail) -> Option<Outcome<i64>> {
        let conn = &mut self.conn;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            handlers::sync::flaky::<B>(conn, m, runs, fail)
        }))
        .ok()
    }

    fn attempts(&mut self, consumer: &str, key: &str) -> Result<Option<Attempts>, InboxError> {
        diesel_inbox::attempts(&mut self.conn, consumer, key)
    }

    fn attempts_list(
        &mut self,
        consumer: Option<&str>,
        min_failures: u32,
        limit: usize,
    ) -> Result<Vec<Attempts>, InboxError> {
        diesel_inbox::attempts_list(&mut self.conn, consumer, min_failures, limit)
    }

    fn transient_once(&mut self, m: &Msg, runs: &AtomicU32) -> Outcome<()> {
        handlers::sync::transient_once::<B>(&mut self.conn, m, runs)
    }

    fn twice_in_transaction(&mut self, m: &Msg, commit: bool) -> [Outcome<i64>; 2] {
        use diesel::Connection;
        let outer = self.conn.transaction(|conn| {
            let both = [
                handlers::sync::apply_payment::<B>(conn, m),
                handlers::sync::apply_payment::<B>(conn, m),
            ];
            if commit {
                Ok(both)
            } else {
                Err(Outer::RolledBack(both))
            }
        });
        match outer {
            Ok(both) | Err(Outer::RolledBack(both)) => both,
            Err(Outer::Db(e)) => panic!("the caller's transaction failed: {e}"),
        }
    }

    fn migrate(&mut self) -> Result<(), InboxError> {
        diesel_inbox::migrate(&mut self.conn)
    }

    fn status(&mut self, consumer: &str, key: &str) -> Result<Option<InboxEntry>, InboxError> {
        diesel_inbox::status(&mut self.conn, consumer, key)
    }

    fn forget(&mut self, consumer: &str, key: &str) -> Result<bool, InboxError> {
        diesel_inbox::forget(&mut self.conn, consumer, key)
    }

    fn stats(&mut self) -> Result<Vec<ConsumerStats>, InboxError> {
        diesel_inbox::stats(&mut self.conn)
    }

    fn purge(&mut self, older_than: Duration, batch: usize) -> Result<PurgeReport, InboxError> {
        diesel_inbox::purge(&mut self.conn, older_than, batch)
    }

    fn run_purge(&mut self, purge: Purge<'_>) -> Result<PurgeReport, InboxError> {
        purge.run(&mut self.conn)
    }

    fn count_purge(&mut self, purge: Purge<'_>) -> Result<u64, InboxError> {
        purge.count(&mut self.conn)
    }

    fn purge_during_deliveries(
        db: &str,
        n: usize,
        older_than: Duration,
        batch: usize,
        deliveries: Vec<Msg>,
    ) -> (Vec<Result<PurgeReport, InboxError>>, Vec<Outcome<i64>>) {
        let barrier = Barrier::new(n + 1);
        std::thread::scope(|scope| {
            let purges: Vec<_> = (0..n)
                .map(|_| {
                    scope.spawn(|| {
                        let mut session = Self::open(db);
                        barrier.wait();
                        session.purge(older_than, batch)
                    })
                })
                .collect();
            let handler = scope.spawn(|| {
                let mut session = Self::open(db);
                barrier.wait();
                deliveries
                    .iter()
                    .map(|m| session.apply_payment(m))
                    .collect::<Vec<_>>()
            });
            let purged = purges
                .into_iter()
                .map(|p| p.join().expect("a purge panicked"))
                .collect();
            (purged, handler.join().expect("the handler panicked"))
        })
    }

    fn deliver_concurrently(db: &str, workers: Vec<Vec<Msg>>) -> Vec<Vec<Outcome<i64>>> {
        on_threads(db, workers, |session: &mut Self, msgs: Vec<Msg>| {
            msgs.iter().map(|m| session.apply_payment(m)).collect()
        })
    }

    fn fingerprinted_concurrently(db: &str, workers: Vec<Vec<Msg>>) -> Vec<Vec<Outcome<i64>>> {
        on_threads(db, workers, |session: &mut Self, msgs: Vec<Msg>| {
            msgs.iter().map(|m| session.fingerprinted(m)).collect()
        })
    }

    fn flaky_concurrently(
        db: &str,
        workers: usize,
        m: Msg,
        rounds: usize,
        runs: Arc<AtomicU32>,
    ) -> Vec<Vec<Outcome<i64>>> {
        let inputs = (0..workers).map(|_| (m.clone(), runs.clone())).collect();
        on_threads(
            db,
            inputs,
            move |session: &mut Self, (m, runs): (Msg, Arc<AtomicU32>)| {
                let mut out = Vec::new();
                for _ in 0..rounds {
                    let outcome =
                        handlers::sync::flaky::<B>(&mut session.conn, &m, &runs, Fail::Error);
                    let given_up = matches!(
                        outcome,
                        Err(AppError::Inbox(InboxError::AttemptsExhausted { .. }))
                    );
                    out.push(outcome);
                    if given_up {
                        break;
                    }
                }
                out
            },
        )
    }

    fn batches_concurrently(
        db: &str,
        workers: Vec<Vec<Vec<Msg>>>,
    ) -> Vec<Vec<Result<Batch<usize>, AppError>>> {
        on_threads(db, workers, |session: &mut Self, batches: Vec<Vec<Msg>>| {
            batches.iter().map(|b| session.apply_batch(b)).collect()
        })
    }

    fn migrate_concurrently(db: &str, n: usize) -> Vec<Result<(), InboxError>> {
        on_threads(db, vec![(); n], |session: &mut Self, ()| session.migrate())
    }

    fn redelivery_during_first(
        db: &str,
        first: Msg,
        second: Msg,
        fail_first: bool,
    ) -> [Outcome<()>; 2] {
        let (claimed, first_claimed) = std::sync::mpsc::channel();
        let holder = {
            let db = db.to_string();
            std::thread::spawn(move || Self::open(&db).slow(&first, &claimed, fail_first))
        };
        first_claimed
            .recv()
            .expect("the first delivery claimed the key");
        let (idle, _) = std::sync::mpsc::channel();
        let second = Self::open(db).slow(&second, &idle, false);
        [holder.join().expect("the first delivery panicked"), second]
    }
}

#[cfg(feature = "async")]
#[allow(unused_imports)]
pub use self::asynchronous::{runtime, Async};

#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use std::sync::OnceLock;

    /// The multi-thread runtime the async sessions run on.
    pub fn runtime() -> &'static tokio::runtime::Runtime {
        static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
        RUNTIME.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_all()
                .build()
                .expect("a tokio runtime")
        })
    }

    /// Async handlers on a pooled diesel-async connection.
    pub struct Async<B: TestBackend> {
        /// The session's pooled connection, passed as `&mut conn`.
        conn: B::Pooled,
        check: B::Conn,
    }

    impl<B: TestBackend> Mode for Async<B> {
        type B = B;
        const NAME: &'static str = "async";

        fn open(db: &str) -> Self {
            let pool = B::pool(db);
            let conn = runtime().block_on(B::pooled(&pool));
            Async {
                conn,
                check: B::open(db),
            }
        }

        fn check(&mut self) -> &mut B::Conn {
            &mut self.check
        }

        fn apply_payment(&mut self, m: &Msg) -> Outcome<i64> {
            runtime().block_on(handlers::asynchronous::apply_payment::<B>(
                &mut self.conn,
                m,
            ))
        }

        fn write_then_reject(&mut self, m: &Msg) -> Outcome<()> {
            runtime().block_on(handlers::asynchronous::write_then_reject::<B>(
                &mut self.conn,
                m,
            ))
        }

        fn write_then_accept(&mut self, m: &Msg) -> Outcome<()> {
            runtime().block_on(handlers::asynchronous::write_then_accept::<B>(
                &mut self.conn,
                m,
            ))
        }

        fn write_then_panic(&mut self, m: &Msg) -> Outcome<()> {
            runtime().block_on(handlers::asynchronous::write_then_panic::<B>(
                &mut self.conn,
                m,
            ))
        }

        fn ledger(&mut self, m: &Msg) -> Outcome<i64> {
            runtime().block_on(handlers::asynchronous::ledger::<B>(&mut self.conn, m))
        }

        fn mailer(&mut self, m: &Msg) -> Outcome<i64> {
            runtime().block_on(handlers::asynchronous::mailer::<B>(&mut self.conn, m))
        }

        fn by_int(&mut self, run: &str, id: i64) -> Outcome<i64> {
            runtime().block_on(handlers::asynchronous::by_int::<B>(&mut self.conn, run, id))
        }

        fn by_str(&mut self, run: &str, id: &str) -> Outcome<()> {
            runtime().block_on(handlers::asynchronous::by_str::<B>(&mut self.conn, run, id))
        }

        fn by_uuid(&mut self, run: &str, id: uuid::Uuid) -> Outcome<()> {
            runtime().block_on(handlers::asynchronous::by_uuid::<B>(
                &mut self.conn,
                run,
                id,
            ))
        }

        fn slow(&mut self, m: &Msg, claimed: &Sender<()>, fail: bool) -> Outcome<()> {
            runtime().block_on(handlers::asynchronous::slow::<B>(
                &mut self.conn,
                m,
                claimed,
                fail,
            ))
        }

        fn apply_batch(&mut self, msgs: &[Msg]) -> Result<Batch<usize>, AppError> {
            runtime().block_on(handlers::asynchronous::apply_batch::<B>(
                &mut self.conn,
                msgs,
            ))
        }

        fn apply_batch_then_reject(&mut self, msgs: &[Msg]) -> Result<Batch<()>, AppError> {
            runtime().block_on(handlers::asynchronous::apply_batch_then_reject::<B>(
                &mut self.conn,
                msgs,
            ))
        }

        fn fingerprinted(&mut self, m: &Msg) -> Outcome<i64> {
            runtime().block_on(handlers::asynchronous::fingerprinted::<B>(
                &mut self.conn,
                m,
            ))
        }

        fn unfingerprinted(&mut self, m: &Msg) -> Outcome<i64> {
            runtime().block_on(handlers::asynchronous::unfingerprinted::<B>(
                &mut self.conn,
                m,
            ))
        }

        fn fingerprinted_batch(&mut self, msgs: &[Msg]) -> Result<Batch<usize>, AppError> {
            runtime().block_on(handlers::asynchronous::fingerprinted_batch::<B>(
                &mut self.conn,
                msgs,
            ))
        }

        fn receipt(&mut self, m: &Msg) -> Result<Stored<Receipt>, AppError> {
            runtime().block_on(handlers::asynchronous::receipt::<B>(&mut self.conn, m))
        }

        fn receipt_v2(&mut self, m: &Msg) -> Result<Stored<ReceiptV2>, AppError> {
            runtime().block_on(handlers::asynchronous::receipt_v2::<B>(&mut self.conn, m))
        }

        fn receipt_unstored(&mut self, m: &Msg) -> Outcome<i64> {
            runtime().block_on(handlers::asynchronous::receipt_unstored::<B>(
                &mut self.conn,
                m,
            ))
        }

        fn flaky(&mut self, m: &Msg, runs: &AtomicU32, fail: Fail) -> Option<Outcome<i64>> {
            let conn = &mut self.conn;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                runtime().block_on(handlers::asynchronous::flaky::<B>(conn, m, runs, fail))
            }))
            .ok()
        }

        fn attempts(&mut self, consumer: &str, key: &str) -> Result<Option<Attempts>, InboxError> {
            runtime().block_on(diesel_inbox::attempts_async(&mut self.conn, consumer, key))
        }

        fn attempts_list(
            &mut self,
            consumer: Option<&str>,
            min_failures: u32,
            limit: usize,
        ) -> Result<Vec<Attempts>, InboxError> {
            runtime().block_on(diesel_inbox::attempts_list_async(
                &mut self.conn,
                consumer,
                min_failures,
                limit,
            ))
        }

        fn transient_once(&mut self, m: &Msg, runs: &AtomicU32) -> Outcome<()> {
            runtime().block_on(handlers::asynchronous::transient_once::<B>(
                &mut self.conn,
                m,
                runs,
            ))
        }

        fn twice_in_transaction(&mut self, m: &Msg, commit: bool) -> [Outcome<i64>; 2] {
            use diesel_async::AsyncConnection;
            let conn: &mut B::AsyncConn = &mut self.conn;
            let outer = runtime().block_on(conn.transaction(async |conn| {
                let both = [
                    handlers::asynchronous::apply_payment::<B>(conn, m).await,
                    handlers::asynchronous::apply_payment::<B>(conn, m).await,
                ];
                if commit {
                    Ok(both)
                } else {
                    Err(Outer::RolledBack(both))
                }
            }));
            match outer {
                Ok(both) | Err(Outer::RolledBack(both)) => both,
                Err(Outer::Db(e)) => panic!("the caller's transaction failed: {e}"),
            }
        }

        fn migrate(&mut self) -> Result<(), InboxError> {
            runtime().block_on(diesel_inbox::migrate_async(&mut self.conn))
        }

        fn status(&mut self, consumer: &str, key: &str) -> Result<Option<InboxEntry>, InboxError> {
            runtime().block_on(diesel_inbox::status_async(&mut self.conn, consumer, key))
        }

        fn forget(&mut self, consumer: &str, key: &str) -> Result<bool, InboxError> {
            runtime().block_on(diesel_inbox::forget_async(&mut self.conn, consumer, key))
        }

        fn stats(&mut self) -> Result<Vec<ConsumerStats>, InboxError> {
            runtime().block_on(diesel_inbox::stats_async(&mut self.conn))
        }

        fn purge(&mut self, older_than: Duration, batch: usize) -> Result<PurgeReport, InboxError> {
            runtime().block_on(diesel_inbox::purge_async(&mut self.conn, older_than, batch))
        }

        fn run_purge(&mut self, purge: Purge<'_>) -> Result<PurgeReport, InboxError> {
            runtime().block_on(purge.run_async(&mut self.conn))
        }

        fn count_purge(&mut self, purge: Purge<'_>) -> Result<u64, InboxError> {
            runtime().block_on(purge.count_async(&mut self.conn))
        }

        fn purge_during_deliveries(
            db: &str,
            n: usize,
            older_than: Duration,
            batch: usize,
            deliveries: Vec<Msg>,
        ) -> (Vec<Result<PurgeReport, InboxError>>, Vec<Outcome<i64>>) {
            /// What a task did: a purge's report, or the deliveries' outcomes.
            enum Done {
                Purged(Result<PurgeReport, InboxError>),
                Delivered(Vec<Outcome<i64>>),
            }
            type Task = std::pin::Pin<Box<dyn std::future::Future<Output = Done> + Send>>;
            let pool = B::pool(db);
            let barrier = Arc::new(tokio::sync::Barrier::new(n + 1));
            let mut tasks: Vec<Task> = (0..n)
                .map(|_| {
                    let (pool, barrier) = (pool.clone(), barrier.clone());
                    Box::pin(async move {
                        let mut conn = B::pooled(&pool).await;
                        barrier.wait().await;
                        let conn: &mut B::AsyncConn = &mut conn;
                        Done::Purged(diesel_inbox::purge_async(conn, older_than, batch).await)
                    }) as Task
                })
                .collect();
            tasks.push(Box::pin(async move {
                let mut conn = B::pooled(&pool).await;
                barrier.wait().await;
                let mut out = Vec::with_capacity(deliveries.len());
                for m in &deliveries {
                    out.push(handlers::asynchronous::apply_payment::<B>(&mut conn, m).await);
                }
                Done::Delivered(out)
            }));
            let (mut purged, mut delivered) = (Vec::new(), Vec::new());
            for done in run_tasks(tasks.into_iter()) {
                match done {
                    Done::Purged(report) => purged.push(report),
                    Done::Delivered(outcomes) => delivered = outcomes,
                }
            }
            (purged, delivered)
        }

        fn deliver_concurrently(db: &str, workers: Vec<Vec<Msg>>) -> Vec<Vec<Outcome<i64>>> {
            let pool = B::pool(db);
            let barrier = Arc::new(tokio::sync::Barrier::new(workers.len()));
            run_tasks(workers.into_iter().map(|msgs| {
                let (pool, barrier) = (pool.clone(), barrier.clone());
                async move {
                    let mut conn = B::pooled(&pool).await;
                    barrier.wait().await;
                    let mut out = Vec::with_capacity(msgs.len());
                    for m in &msgs {
                        out.push(handlers::asynchronous::apply_payment::<B>(&mut conn, m).await);
                    }
                    out
                }
            }))
        }

        fn flaky_concurrently(
            db: &str,
            workers: usize,
            m: Msg,
            rounds: usize,
            runs: Arc<AtomicU32>,
        ) -> Vec<Vec<Outcome<i64>>> {
            let pool = B::pool(db);
            let barrier = Arc::new(tokio::sync::Barrier::new(workers));
            run_tasks((0..workers).map(|_| {
                let (pool, barrier, m, runs) =
                    (pool.clone(), barrier.clone(), m.clone(), runs.clone());
                async move {
                    let mut conn = B::pooled(&pool).await;
                    barrier.wait().await;
                    let mut out = Vec::new();
                    for _ in 0..rounds {
                        let outcome =
                            handlers::asynchronous::flaky::<B>(&mut conn, &m, &runs, Fail::Error)
                                .await;
                        let given_up = matches!(
                            outcome,
                            Err(AppError::Inbox(InboxError::AttemptsExhausted { .. }))
                        );
                        out.push(outcome);
                        if given_up {
                            break;
                        }
                    }
                    out
                }
            }))
        }

        fn fingerprinted_concurrently(db: &str, workers: Vec<Vec<Msg>>) -> Vec<Vec<Outcome<i64>>> {
            let pool = B::pool(db);
            let barrier = Arc::new(tokio::sync::Barrier::new(workers.len()));
            run_tasks(workers.into_iter().map(|msgs| {
                let (pool, barrier) = (pool.clone(), barrier.clone());
                async move {
                    let mut conn = B::pooled(&pool).await;
                    barrier.wait().await;
                    let mut out = Vec::with_capacity(msgs.len());
                    for m in &msgs {
                        out.push(handlers::asynchronous::fingerprinted::<B>(&mut conn, m).await);
                    }
                    out
                }
            }))
        }

        fn batches_concurrently(
            db: &str,
            workers: Vec<Vec<Vec<Msg>>>,
        ) -> Vec<Vec<Result<Batch<usize>, AppError>>> {
            let pool = B::pool(db);
            let barrier = Arc::new(tokio::sync::Barrier::new(workers.len()));
            run_tasks(workers.into_iter().map(|batches| {
                let (pool, barrier) = (pool.clone(), barrier.clone());
                async move {
                    let mut conn = B::pooled(&pool).await;
                    barrier.wait().await;
                    let mut out = Vec::with_capacity(batches.len());
                    for batch in &batches {
                        out.push(handlers::asynchronous::apply_batch::<B>(&mut conn, batch).await);
                    }
                    out
                }
            }))
        }

        fn migrate_concurrently(db: &str, n: usize) -> Vec<Result<(), InboxError>> {
            let pool = B::pool(db);
            let barrier = Arc::new(tokio::sync::Barrier::new(n));
            run_tasks((0..n).map(|_| {
                let (pool, barrier) = (pool.clone(), barrier.clone());
                async move {
                    let mut conn = B::pooled(&pool).await;
                    barrier.wait().await;
                    diesel_inbox::migrate_async(&mut conn).await
                }
            }))
        }

        fn redelivery_during_first(
            db: &str,
            first: Msg,
            second: Msg,
            fail_first: bool,
        ) -> [Outcome<()>; 2] {
            let pool = B::pool(db);
            runtime().block_on(async move {
                let (claimed, first_claimed) = std::sync::mpsc::channel();
                let holder = {
                    let pool = pool.clone();
                    tokio::spawn(async move {
                        let mut conn = B::pooled(&pool).await;
                        handlers::asynchronous::slow::<B>(&mut conn, &first, &claimed, fail_first)
                            .await
                    })
                };
                // The claim is signalled from the task; wait without blocking the runtime.
                tokio::task::spawn_blocking(move || first_claimed.recv())
                    .await
                    .expect("a blocking wait")
                    .expect("the first delivery claimed the key");
                let (idle, _) = std::sync::mpsc::channel();
                let mut conn = B::pooled(&pool).await;
                let second =
                    handlers::asynchronous::slow::<B>(&mut conn, &second, &idle, false).await;
                [holder.await.expect("the first delivery panicked"), second]
            })
        }
    }

    /// Spawns each future as a task of the multi-thread runtime and waits
    /// for all of them, in order.
    fn run_tasks<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let tasks: Vec<_> = futures.map(|f| runtime().spawn(f)).collect();
        runtime().block_on(async move {
            let mut outputs = Vec::with_capacity(tasks.len());
            for task in tasks {
                outputs.push(task.await.expect("a task panicked"));
            }
            outputs
        })
    }
}
