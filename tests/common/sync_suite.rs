//! The behaviour tests of sync handlers that go beyond the shared contract:
//! swallowed errors, methods, `QueryResult`, retries and their limits for
//! every kind of error type, deferred constraints, small and destructured
//! keys. Generic over the backend; the backend files stamp out the
//! `#[test]` shims (`sync_tests!`).

use crate::common::backend::{msg, Msg, TestBackend};
use crate::common::handlers::AppError;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_inbox::{idempotent, InboxError, InvalidKey, Processed, RetryableError};
use std::sync::atomic::{AtomicU32, Ordering};

/// A handler of the error-type tests, its error as text.
type Handler<C> = fn(&mut C, &Msg, &AtomicU32) -> Result<Processed<()>, String>;

/// Writes, then runs a failing statement and ignores its error.
#[idempotent(key = "msg.key", consumer = "swallowing")]
fn swallow_a_failed_statement<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
) -> Result<(), AppError> {
    B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
    let ignored = conn.batch_execute("INSERT INTO inbox_no_such_table VALUES (1)");
    assert!(ignored.is_err());
    Ok(())
}

pub fn the_reported_outcome_matches_what_was_committed_when_the_body_swallows_an_error<
    B: TestBackend,
>() {
    let Some(db) = B::prepare("swallow") else {
        return;
    };
    let mut conn = B::open(&db);
    let run = crate::common::unique_run_id("swallow");
    let m = msg(&run, format!("{run}:1"), 4);
    match swallow_a_failed_statement::<B>(&mut conn, &m) {
        // MySQL and SQLite undo only the failed statement: the rest commits.
        Ok(Processed::Applied(())) => {
            assert_eq!(B::effects_of(&mut conn, &run), vec![(m.key.clone(), 4)]);
            assert_eq!(B::inbox_rows(&mut conn, "swallowing", &m.key), 1);
            assert!(swallow_a_failed_statement::<B>(&mut conn, &m)
                .expect("again")
                .is_duplicate());
        }
        // PostgreSQL aborted the whole transaction: nothing was kept,
        // and the handler must not say Applied.
        Err(AppError::Inbox(InboxError::BodyIgnoredError(_))) => {
            assert_eq!(B::effects_of(&mut conn, &run), vec![]);
            assert_eq!(B::inbox_rows(&mut conn, "swallowing", &m.key), 0);
            // The connection is usable and the message can still be applied.
            assert!(
                crate::common::handlers::sync::apply_payment::<B>(&mut conn, &m)
                    .expect("after the abort")
                    .is_applied()
            );
        }
        other => panic!("unexpected outcome {other:?}"),
    }
}

struct Projector {
    consumer_label: &'static str,
    seen: u32,
}

impl Projector {
    #[idempotent(key = "msg.key", consumer = "projector")]
    fn project<B: TestBackend>(
        &self,
        conn: &mut B::Conn,
        msg: &Msg,
    ) -> Result<&'static str, AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        Ok(self.consumer_label)
    }

    #[idempotent(key = "msg.key", consumer = "counting-projector", conn = "db")]
    fn count<B: TestBackend>(&mut self, db: &mut B::Conn, msg: &Msg) -> Result<u32, AppError> {
        B::write_effect(db, &msg.run, &msg.key, msg.amount)?;
        self.seen += 1;
        Ok(self.seen)
    }
}

pub fn methods_with_shared_and_mutable_receivers<B: TestBackend>() {
    let Some(db) = B::prepare("methods") else {
        return;
    };
    let mut conn = B::open(&db);
    let run = crate::common::unique_run_id("methods");
    let mut projector = Projector {
        consumer_label: "p",
        seen: 0,
    };
    let a = msg(&run, format!("{run}:a"), 1);
    let b = msg(&run, format!("{run}:b"), 2);

    assert_eq!(
        projector.project::<B>(&mut conn, &a).expect("project"),
        Processed::Applied("p")
    );
    assert_eq!(
        projector.project::<B>(&mut conn, &a).expect("again"),
        Processed::Duplicate
    );
    assert_eq!(
        projector.count::<B>(&mut conn, &b).expect("count"),
        Processed::Applied(1)
    );
    assert_eq!(
        projector.count::<B>(&mut conn, &b).expect("count again"),
        Processed::Duplicate
    );
    assert_eq!(projector.seen, 1);
    assert_eq!(
        B::effects_of(&mut conn, &run),
        vec![(a.key.clone(), 1), (b.key.clone(), 2)]
    );
}

#[idempotent(key = "key", consumer = "query-result")]
fn query_result_handler<B: TestBackend>(
    conn: &mut B::Conn,
    run: &str,
    key: &str,
) -> QueryResult<usize> {
    B::write_effect(conn, run, key, 0)
}

pub fn query_result_handlers_get_inbox_errors_as_diesel_errors<B: TestBackend>() {
    let Some(db) = B::prepare("query_result") else {
        return;
    };
    let mut conn = B::open(&db);
    let run = crate::common::unique_run_id("qr");
    let key = format!("{run}:1");
    assert_eq!(
        query_result_handler::<B>(&mut conn, &run, &key).expect("apply"),
        Processed::Applied(1)
    );
    assert_eq!(
        query_result_handler::<B>(&mut conn, &run, &key).expect("again"),
        Processed::Duplicate
    );
    match query_result_handler::<B>(&mut conn, &run, "") {
        Err(diesel::result::Error::QueryBuilderError(inner)) => {
            let inbox = inner
                .downcast_ref::<InboxError>()
                .expect("an InboxError inside");
            assert!(matches!(inbox, InboxError::InvalidKey(InvalidKey::Empty)));
        }
        other => panic!("expected a QueryBuilderError, got {other:?}"),
    }
}

static TRANSIENT_ATTEMPTS: AtomicU32 = AtomicU32::new(0);

#[derive(Debug)]
struct RetryingError(diesel::result::Error);
impl From<diesel::result::Error> for RetryingError {
    fn from(e: diesel::result::Error) -> Self {
        RetryingError(e)
    }
}
impl From<InboxError> for RetryingError {
    fn from(e: InboxError) -> Self {
        RetryingError(e.into())
    }
}
impl RetryableError for RetryingError {
    fn is_retryable(&self) -> bool {
        self.0.is_retryable()
    }

    fn retries_exhausted(self, attempts: u32) -> Self {
        RetryingError(self.0.retries_exhausted(attempts))
    }
}

fn serialization_failure() -> diesel::result::Error {
    diesel::result::Error::DatabaseError(
        diesel::result::DatabaseErrorKind::SerializationFailure,
        Box::new("could not serialize access due to concurrent update".to_string()),
    )
}

/// Writes, then fails with a serialization failure on its first
/// `fail_times` attempts (as a conflicting writer would make it).
#[idempotent(key = "msg.key", consumer = "retrying", retries = 2)]
fn flaky<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
    fail_times: u32,
) -> Result<u32, RetryingError> {
    B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
    let attempt = TRANSIENT_ATTEMPTS.fetch_add(1, Ordering::SeqCst) + 1;
    if attempt <= fail_times {
        return Err(serialization_failure().into());
    }
    Ok(attempt)
}

#[idempotent(key = "msg.key", consumer = "not-retrying")]
fn opaque_error<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
    attempts: &AtomicU32,
) -> Result<(), AppError> {
    B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
    attempts.fetch_add(1, Ordering::SeqCst);
    Err(AppError::Db(serialization_failure()))
}

pub fn retryable_body_errors_rerun_the_transaction_up_to_retries<B: TestBackend>() {
    let Some(db) = B::prepare("retries") else {
        return;
    };
    let mut conn = B::open(&db);
    let run = crate::common::unique_run_id("retry");

    // Fails twice, succeeds on the third and last allowed attempt.
    TRANSIENT_ATTEMPTS.store(0, Ordering::SeqCst);
    let ok = msg(&run, format!("{run}:ok"), 1);
    assert_eq!(
        flaky::<B>(&mut conn, &ok, 2).expect("third attempt"),
        Processed::Applied(3)
    );
    assert_eq!(B::effects_of(&mut conn, &run), vec![(ok.key.clone(), 1)]);

    // Fails three times: 1 + retries = 3 attempts, then the error.
    TRANSIENT_ATTEMPTS.store(0, Ordering::SeqCst);
    let bad = msg(&run, format!("{run}:bad"), 2);
    let err = flaky::<B>(&mut conn, &bad, 100).expect_err("retries exhausted");
    match &err.0 {
        diesel::result::Error::QueryBuilderError(inner) => {
            let inbox = inner
                .downcast_ref::<InboxError>()
                .expect("an InboxError inside");
            assert!(
                matches!(inbox, InboxError::RetriesExhausted { attempts: 3, source } if source.is_retryable()),
                "{inbox:?}"
            );
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    assert_eq!(TRANSIENT_ATTEMPTS.load(Ordering::SeqCst), 3);
    assert_eq!(B::inbox_rows(&mut conn, "retrying", &bad.key), 0);

    // Without RetryableError, an error the body made up (no
    // statement failed) is returned at once.
    let attempts = AtomicU32::new(0);
    let once = msg(&run, format!("{run}:once"), 3);
    assert!(
        matches!(opaque_error::<B>(&mut conn, &once, &attempts), Err(AppError::Db(e)) if e.is_retryable())
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(B::effects_of(&mut conn, &run), vec![(ok.key.clone(), 1)]);
}

// ---- transient errors raised by a body statement, whatever `E` is ----

#[derive(Debug, thiserror::Error)]
enum ThisError {
    #[error("database: {0}")]
    Db(#[from] diesel::result::Error),
    #[error("inbox: {0}")]
    Inbox(#[from] InboxError),
}

/// Writes, then on its first run executes a statement that fails
/// transiently; `?` turns that into whatever `E` is.
fn write_then_fail_once<B: TestBackend, E: From<diesel::result::Error>>(
    conn: &mut B::Conn,
    msg: &Msg,
    runs: &AtomicU32,
) -> Result<(), E> {
    B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
        B::fail_transiently(conn)?;
    }
    Ok(())
}

#[idempotent(key = "msg.key", consumer = "transient-plain-enum")]
fn transient_plain_enum<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
    runs: &AtomicU32,
) -> Result<(), AppError> {
    write_then_fail_once::<B, _>(conn, msg, runs)
}

#[idempotent(key = "msg.key", consumer = "transient-thiserror")]
fn transient_thiserror<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
    runs: &AtomicU32,
) -> Result<(), ThisError> {
    write_then_fail_once::<B, _>(conn, msg, runs)
}

#[idempotent(key = "msg.key", consumer = "transient-anyhow")]
fn transient_anyhow<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
    runs: &AtomicU32,
) -> anyhow::Result<()> {
    write_then_fail_once::<B, diesel::result::Error>(conn, msg, runs)?;
    Ok(())
}

#[idempotent(key = "msg.key", consumer = "transient-boxed")]
fn transient_boxed<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
    runs: &AtomicU32,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    write_then_fail_once::<B, diesel::result::Error>(conn, msg, runs)?;
    Ok(())
}

#[idempotent(key = "msg.key", consumer = "transient-query-result")]
fn transient_query_result<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
    runs: &AtomicU32,
) -> QueryResult<()> {
    write_then_fail_once::<B, _>(conn, msg, runs)
}

#[idempotent(key = "msg.key", consumer = "transient-generic")]
fn transient_generic<B: TestBackend, E>(
    conn: &mut B::Conn,
    msg: &Msg,
    runs: &AtomicU32,
) -> Result<(), E>
where
    E: From<diesel::result::Error> + From<InboxError> + std::fmt::Debug,
{
    write_then_fail_once::<B, _>(conn, msg, runs)
}

/// An error type that overrides the runtime: database errors are permanent.
#[derive(Debug)]
struct NeverRetry(diesel::result::Error);
impl From<diesel::result::Error> for NeverRetry {
    fn from(e: diesel::result::Error) -> Self {
        NeverRetry(e)
    }
}
impl From<InboxError> for NeverRetry {
    fn from(e: InboxError) -> Self {
        NeverRetry(e.into())
    }
}
impl RetryableError for NeverRetry {
    fn is_retryable(&self) -> bool {
        false
    }
}

#[idempotent(key = "msg.key", consumer = "transient-never-retry")]
fn transient_never_retry<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
    runs: &AtomicU32,
) -> Result<(), NeverRetry> {
    write_then_fail_once::<B, _>(conn, msg, runs)
}

pub fn a_transient_error_of_a_body_statement_is_retried_whatever_the_error_type<B: TestBackend>() {
    let Some(db) = B::prepare("transient_any_e") else {
        return;
    };
    let mut conn = B::open(&db);
    let run = crate::common::unique_run_id("transient");
    let handlers: [(&str, &str, Handler<B::Conn>); 6] = [
        (
            "plain enum with only Debug",
            "transient-plain-enum",
            |c, m, r| transient_plain_enum::<B>(c, m, r).map_err(|e| format!("{e:?}")),
        ),
        ("thiserror enum", "transient-thiserror", |c, m, r| {
            transient_thiserror::<B>(c, m, r).map_err(|e| e.to_string())
        }),
        ("anyhow::Error", "transient-anyhow", |c, m, r| {
            transient_anyhow::<B>(c, m, r).map_err(|e| e.to_string())
        }),
        (
            "Box<dyn Error + Send + Sync>",
            "transient-boxed",
            |c, m, r| transient_boxed::<B>(c, m, r).map_err(|e| e.to_string()),
        ),
        ("QueryResult", "transient-query-result", |c, m, r| {
            transient_query_result::<B>(c, m, r).map_err(|e| e.to_string())
        }),
        ("generic E", "transient-generic", |c, m, r| {
            transient_generic::<B, AppError>(c, m, r).map_err(|e| format!("{e:?}"))
        }),
    ];
    for (n, (what, consumer, handler)) in handlers.into_iter().enumerate() {
        let m = msg(&run, format!("{run}:{n}"), n as i64);
        let runs = AtomicU32::new(0);
        assert_eq!(
            handler(&mut conn, &m, &runs),
            Ok(Processed::Applied(())),
            "{what}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "{what}: one failed run, one retry"
        );
        assert_eq!(B::inbox_rows(&mut conn, consumer, &m.key), 1, "{what}");
        // The redelivery is a duplicate.
        assert_eq!(
            handler(&mut conn, &m, &runs),
            Ok(Processed::Duplicate),
            "{what}"
        );
    }
    // Each message written exactly once: the failed run rolled back.
    let expected: Vec<(String, i64)> = (0..6).map(|n| (format!("{run}:{n}"), n)).collect();
    assert_eq!(B::effects_of(&mut conn, &run), expected);
}

pub fn retryable_error_overrides_the_observed_statement<B: TestBackend>() {
    let Some(db) = B::prepare("transient_override") else {
        return;
    };
    let mut conn = B::open(&db);
    let run = crate::common::unique_run_id("never");
    let m = msg(&run, format!("{run}:1"), 1);
    let runs = AtomicU32::new(0);
    match transient_never_retry::<B>(&mut conn, &m, &runs) {
        Err(NeverRetry(e)) => assert!(e.is_retryable(), "a transient error, kept permanent: {e}"),
        other => panic!("expected the error at once, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not retried");
    assert_eq!(B::effects_of(&mut conn, &run), vec![]);
    assert_eq!(B::inbox_rows(&mut conn, "transient-never-retry", &m.key), 0);
}

pub fn inside_a_callers_transaction_a_transient_body_error_is_returned_at_once<B: TestBackend>() {
    let Some(db) = B::prepare("transient_nested") else {
        return;
    };
    let mut conn = B::open(&db);
    let run = crate::common::unique_run_id("nested");
    let m = msg(&run, format!("{run}:1"), 1);
    let runs = AtomicU32::new(0);
    let outer: Result<(), AppError> =
        conn.transaction(|conn| transient_plain_enum::<B>(conn, &m, &runs).map(drop));
    assert!(matches!(outer, Err(AppError::Db(_))), "{outer:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the caller owns the transaction"
    );
    assert_eq!(B::effects_of(&mut conn, &run), vec![]);
}

// ---- a commit that fails because of the body ----

#[idempotent(key = "msg.key", consumer = "deferred-fk")]
fn orphan_child<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
    parent: i64,
) -> Result<(), AppError> {
    B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
    conn.batch_execute(&format!(
        "INSERT INTO inbox_test_child (parent_id) VALUES ({parent})"
    ))?;
    Ok(())
}

pub fn a_commit_failure_the_body_caused_is_the_bodys_database_error<B: TestBackend>() {
    let Some((per_connection, ddl)) = B::DEFERRED_FK else {
        crate::common::skipped("this backend checks no constraint at COMMIT");
        return;
    };
    let Some(db) = B::fresh("deferred_fk") else {
        return;
    };
    let mut conn = B::open(&db);
    diesel_inbox::migrate(&mut conn).expect("migrate");
    conn.batch_execute(&format!("{}; {ddl}", crate::common::EFFECTS_DDL))
        .expect("tables");
    conn.batch_execute(per_connection)
        .expect("connection setup");
    let run = crate::common::unique_run_id("deferred");
    let m = msg(&run, format!("{run}:1"), 1);
    let (outcome, warnings) =
        crate::common::warnings_during(|| orphan_child::<B>(&mut conn, &m, 7));
    match outcome {
        Err(AppError::Db(diesel::result::Error::DatabaseError(kind, info))) => {
            assert!(
                matches!(kind, diesel::result::DatabaseErrorKind::ForeignKeyViolation)
                    || info.message().contains("FOREIGN KEY"),
                "{kind:?}: {}",
                info.message()
            );
        }
        other => panic!("expected the body's own database error, got {other:?}"),
    }
    // No rollback warning: a WARN seen is the failed call's own, with the
    // body's error. (Whether this thread's collector sees the library's
    // callsite races with tests on other threads that ran it without a
    // subscriber; tests/observability.rs pins that WARN itself.)
    assert!(
        warnings
            .iter()
            .all(|w| w.starts_with("message=diesel-inbox: the call failed")
                && w.contains("ForeignKey")
                && !w.contains("rollback")),
        "{warnings:#?}"
    );
    let ((), probe) = crate::common::warnings_during(|| tracing::warn!("probe"));
    assert_eq!(probe.len(), 1, "the collector sees warnings");
    assert_eq!(B::effects_of(&mut conn, &run), vec![]);
    assert_eq!(B::inbox_rows(&mut conn, "deferred-fk", &m.key), 0);
    // Nothing half-written: once the parent exists the redelivery applies.
    conn.batch_execute("INSERT INTO inbox_test_parent (id) VALUES (7)")
        .expect("parent");
    assert!(matches!(
        orphan_child::<B>(&mut conn, &m, 7),
        Ok(Processed::Applied(()))
    ));
    assert_eq!(B::effects_of(&mut conn, &run), vec![(m.key.clone(), 1)]);
}

// ---- small integer keys ----

#[idempotent(key = "id", consumer = "u8-keys")]
fn by_u8<B: TestBackend>(conn: &mut B::Conn, run: &str, id: u8) -> QueryResult<()> {
    B::write_effect(conn, run, &format!("u8/{id}"), i64::from(id)).map(drop)
}

#[idempotent(key = "id", consumer = "i8-keys")]
fn by_i8<B: TestBackend>(conn: &mut B::Conn, run: &str, id: i8) -> QueryResult<()> {
    B::write_effect(conn, run, &format!("i8/{id}"), i64::from(id)).map(drop)
}

// ---- a key read from a destructured parameter ----

#[idempotent(key = "id", consumer = "destructured")]
fn destructured<B: TestBackend>(
    conn: &mut B::Conn,
    run: &str,
    (id, amount): (String, i64),
) -> QueryResult<i64> {
    B::write_effect(conn, run, &id, amount)?;
    Ok(amount)
}

pub fn u8_i8_and_destructured_keys<B: TestBackend>() {
    let Some(db) = B::prepare("small_keys") else {
        return;
    };
    let mut conn = B::open(&db);
    let run = crate::common::unique_run_id("small");
    // Consumers are shared by every run: clear this test's keys first.
    conn.batch_execute("DELETE FROM inbox_messages WHERE consumer IN ('u8-keys', 'i8-keys')")
        .expect("clear");
    assert!(by_u8::<B>(&mut conn, &run, 255).expect("u8").is_applied());
    assert!(by_u8::<B>(&mut conn, &run, 255)
        .expect("u8 again")
        .is_duplicate());
    assert!(by_i8::<B>(&mut conn, &run, -128).expect("i8").is_applied());
    assert!(by_i8::<B>(&mut conn, &run, -128)
        .expect("i8 again")
        .is_duplicate());
    assert_eq!(B::inbox_rows(&mut conn, "u8-keys", "255"), 1);
    assert_eq!(B::inbox_rows(&mut conn, "i8-keys", "-128"), 1);
    let key = format!("{run}:destructured");
    assert_eq!(
        destructured::<B>(&mut conn, &run, (key.clone(), 5)).expect("first"),
        Processed::Applied(5)
    );
    assert_eq!(
        destructured::<B>(&mut conn, &run, (key.clone(), 5)).expect("again"),
        Processed::Duplicate
    );
    assert_eq!(B::inbox_rows(&mut conn, "destructured", &key), 1);
    assert_eq!(B::effects_of(&mut conn, &run).len(), 3);
}

/// Stamps out one `#[test]` per sync-only test for a backend:
/// `sync_tests!(Sqlite, runs_if = all(), else_ignored = "..")`.
/// A purge runs its own short transactions: inside the caller's it would
/// be one long transaction holding every lock, so it is refused.
pub fn purge_inside_a_callers_transaction_is_refused<B: TestBackend>() {
    let Some(db) = B::prepare("purge_in_tx") else {
        return;
    };
    let mut conn = B::open(&db);
    let refused = conn.transaction(|conn| {
        Ok::<_, diesel::result::Error>(diesel_inbox::purge(
            conn,
            std::time::Duration::from_secs(3600),
            100,
        ))
    });
    assert!(matches!(
        refused,
        Ok(Err(InboxError::InTransaction { operation: "purge" }))
    ));
}

/// Writes, then runs a transaction of its own that writes and fails, then
/// one that writes and commits; reports diesel's depth inside each.
#[idempotent(key = "msg.key", consumer = "nesting-body", conn = "conn", retries = 0)]
fn body_with_transactions<B: TestBackend>(
    conn: &mut B::Conn,
    msg: &Msg,
    depths: &mut Vec<Option<u32>>,
) -> Result<(), AppError> {
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    let depth = |conn: &mut B::Conn| {
        AnsiTransactionManager::transaction_manager_status_mut(conn)
            .transaction_depth()
            .ok()
            .flatten()
            .map(|d| d.get())
    };
    depths.push(depth(conn));
    B::write_effect(conn, &msg.run, &msg.key, 1)?;
    let failed: Result<(), diesel::result::Error> = conn.transaction(|conn| {
        depths.push(depth(conn));
        B::write_effect(conn, &msg.run, &format!("{}/inner-failed", msg.key), 2)?;
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(failed.is_err());
    conn.transaction(|conn| {
        depths.push(depth(conn));
        B::write_effect(conn, &msg.run, &format!("{}/inner-kept", msg.key), 3).map(drop)
    })?;
    depths.push(depth(conn));
    Ok(())
}

/// The runtime keeps diesel's transaction depth in step with what it sends
/// (on MySQL/MariaDB it sends BEGIN and COMMIT itself): a transaction the
/// body opens is a savepoint that rolls back alone, and nothing stays open.
pub fn a_transaction_inside_the_body_is_a_savepoint<B: TestBackend>() {
    let Some(db) = B::prepare("nesting_body") else {
        return;
    };
    let mut conn = B::open(&db);
    let run = crate::common::unique_run_id("nestbody");
    let m = msg(&run, format!("{run}:1"), 1);
    let mut depths = Vec::new();
    let out = body_with_transactions::<B>(&mut conn, &m, &mut depths).expect("handler");
    assert!(out.is_applied());
    assert_eq!(depths, vec![Some(1), Some(2), Some(2), Some(1)]);
    {
        use diesel::connection::{AnsiTransactionManager, TransactionManager};
        let after = AnsiTransactionManager::transaction_manager_status_mut(&mut conn)
            .transaction_depth()
            .expect("a valid manager");
        assert_eq!(after, None, "the handler left a transaction open");
    }
    let mut expected = vec![(m.key.clone(), 1), (format!("{}/inner-kept", m.key), 3)];
    expected.sort();
    assert_eq!(B::effects_of(&mut conn, &run), expected);
    // The duplicate path (BEGIN, claim, ROLLBACK) leaves nothing open either.
    let again = body_with_transactions::<B>(&mut conn, &m, &mut Vec::new()).expect("handler");
    assert!(again.is_duplicate());
    assert_eq!(B::effects_of(&mut conn, &run), expected);
    let mut inner = Vec::new();
    let nested: diesel::QueryResult<()> = conn.transaction(|conn| {
        let m2 = msg(&run, format!("{run}:2"), 1);
        let out = body_with_transactions::<B>(conn, &m2, &mut inner)
            .map_err(|e| diesel::result::Error::QueryBuilderError(format!("{e:?}").into()))?;
        assert!(out.is_applied());
        Ok(())
    });
    nested.expect("inside the caller's transaction");
    assert_eq!(inner, vec![Some(2), Some(3), Some(3), Some(2)]);
}

#[macro_export]
macro_rules! sync_tests {
    ($B:ty, runs_if = $runs_if:meta, else_ignored = $why:literal) => {
        $crate::sync_tests!(@tests $B, $runs_if, $why,
            the_reported_outcome_matches_what_was_committed_when_the_body_swallows_an_error,
            methods_with_shared_and_mutable_receivers,
            query_result_handlers_get_inbox_errors_as_diesel_errors,
            retryable_body_errors_rerun_the_transaction_up_to_retries,
            a_transient_error_of_a_body_statement_is_retried_whatever_the_error_type,
            retryable_error_overrides_the_observed_statement,
            inside_a_callers_transaction_a_transient_body_error_is_returned_at_once,
            a_commit_failure_the_body_caused_is_the_bodys_database_error,
            u8_i8_and_destructured_keys,
            purge_inside_a_callers_transaction_is_refused,
            a_transaction_inside_the_body_is_a_savepoint,
        );
    };
    (@tests $B:ty, $runs_if:meta, $why:literal, $($test:ident,)*) => {
        $(
            #[test]
            #[cfg_attr(not($runs_if), ignore = $why)]
            fn $test() {
                $crate::common::sync_suite::$test::<$B>();
            }
        )*
    };
}
