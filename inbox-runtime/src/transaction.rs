//! One claim and one body in one transaction, with rollback on error and on
//! panic, and bounded retries of transient failures.

use crate::backend::InboxBackend;
use crate::error::InboxError;
use crate::key::{validate_key, InboxKey};
use crate::observe;
use crate::processed::{Batch, Processed};
use crate::registry::ConsumerName;
use crate::retry::ErrorClass;
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection, TransactionManager};
use diesel::result::Error;
use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};
use std::time::Duration;

/// Whether [`begin`] opened the transaction or a savepoint inside the caller's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Scope {
    TopLevel,
    Savepoint,
}

/// Opens a transaction with the backend's `BEGIN` (SQLite: `BEGIN IMMEDIATE`,
/// so a writer takes the lock up front instead of failing at its first write),
/// or a savepoint when the caller already has a transaction open.
pub(crate) fn begin<C>(conn: &mut C) -> Result<Scope, (Scope, Error)>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    // diesel keeps the depth private; begin_transaction_sql refuses inside a
    // transaction, which is exactly the test we need.
    match AnsiTransactionManager::begin_transaction_sql(conn, <C::Backend as InboxBackend>::BEGIN) {
        Ok(()) => Ok(Scope::TopLevel),
        Err(Error::AlreadyInTransaction) => AnsiTransactionManager::begin_transaction(conn)
            .map(|()| Scope::Savepoint)
            .map_err(|e| (Scope::Savepoint, e)),
        Err(e) => Err((Scope::TopLevel, e)),
    }
}

/// Whether diesel has a transaction open on `conn` (a broken transaction
/// manager counts as none: nothing can be done with it).
pub(crate) fn transaction_open<C>(conn: &mut C) -> bool
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    matches!(
        AnsiTransactionManager::transaction_manager_status_mut(conn).transaction_depth(),
        Ok(Some(_))
    )
}

/// Rolls back the innermost transaction or savepoint, if one is open.
pub(crate) fn rollback<C>(conn: &mut C)
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    // Nothing to undo when the transaction already ended: PostgreSQL leaves
    // it after a failed COMMIT, and diesel resyncs its depth from libpq.
    if !transaction_open(conn) {
        return;
    }
    // A failed rollback leaves diesel's manager marked broken (pools discard
    // such connections) and the server rolls back when the session ends.
    if let Err(e) = AnsiTransactionManager::rollback_transaction(conn) {
        tracing::warn!(error = %e, "diesel-inbox: rollback failed");
    }
}

/// Runs `f` in [`begin`]'s transaction: commit on `Ok`, rollback on `Err`.
/// (MySQL's `migrate` cannot use it: its DDL commits implicitly.)
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn in_transaction<C, T, E>(
    conn: &mut C,
    f: impl FnOnce(&mut C) -> Result<T, E>,
) -> Result<T, E>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
    E: From<Error>,
{
    begin(conn).map_err(|(_, e)| e)?;
    match f(conn) {
        Ok(value) => {
            AnsiTransactionManager::commit_transaction(conn)?;
            Ok(value)
        }
        Err(e) => {
            rollback(conn);
            Err(e)
        }
    }
}

/// How one attempt ended short of success.
enum Failure<E> {
    /// The claim or the commit failed for a reason of the inbox's own.
    Inbox(Error),
    /// The body returned an error; `transient` is the first statement of
    /// the body that failed with a transient error, if one was observed.
    Body { error: E, transient: Option<Error> },
    /// The commit failed for a reason the body caused (a deferred
    /// constraint): returned as the body's own database error.
    Commit(Error),
    /// The body returned `Ok` over a statement failure that ended the
    /// transaction.
    Ignored(Error),
}

impl<E: From<InboxError> + From<Error>> Failure<E> {
    /// The error the handler returns when this failure is not retried.
    fn into_error(self) -> E {
        match self {
            Failure::Inbox(e) => InboxError::Database(e).into(),
            Failure::Ignored(e) => InboxError::BodyIgnoredError(e).into(),
            Failure::Commit(e) => e.into(),
            Failure::Body { error, .. } => error,
        }
    }
}

/// PostgreSQL's refusal to run anything in a transaction a failed statement aborted.
fn is_aborted_transaction(error: &Error) -> bool {
    matches!(error, Error::DatabaseError(_, info) if info.message().contains("current transaction is aborted"))
}

/// Claims `key` for `consumer` and runs `body` in the same transaction.
///
/// This is what `#[idempotent]` expands to; call it directly when a macro does
/// not fit. `consumer` is the scope of deduplication (a `&str`). `retries`
/// bounds how often a transient failure (a deadlock, a serialization
/// failure, a lock timeout, SQLite busy) reruns the whole transaction, claim
/// and commit included; `classify` says how the body's own errors are
/// treated: [`ErrorClass::by_statements`] retries them when a statement of
/// the body failed with a transient error (whatever `E` is),
/// [`ErrorClass::of`] asks `E`'s [`RetryableError`](crate::RetryableError)
/// implementation, [`ErrorClass::permanent`] never retries. Retries happen
/// only when this call owns the transaction: inside the caller's transaction
/// a transient error is returned at once, since the caller's work is lost too.
///
/// A commit that fails for a reason the body caused (a deferred foreign key,
/// say) returns the database error as the body's own `E`.
///
/// ```
/// use diesel::prelude::*;
/// use inbox_runtime::{run, migrate, ErrorClass, Processed};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// migrate(&mut conn)?;
/// let handle = |conn: &mut SqliteConnection| -> QueryResult<Processed<()>> {
///     run(conn, "mailer", "m-1", 3, |_conn| Ok(()), |_| ErrorClass::by_statements())
/// };
/// assert_eq!(handle(&mut conn)?, Processed::Applied(()));
/// assert_eq!(handle(&mut conn)?, Processed::Duplicate);
/// # Ok(())
/// # }
/// ```
pub fn run<C, N, K, T, E, F, R>(
    conn: &mut C,
    consumer: &N,
    key: &K,
    retries: u32,
    mut body: F,
    classify: R,
) -> Result<Processed<T>, E>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
    N: ConsumerName + ?Sized,
    K: InboxKey + ?Sized,
    F: FnMut(&mut C) -> Result<T, E>, // reruns on a retry: clone what the body moves, or set `retries = 0`
    R: Fn(&E) -> ErrorClass<E>,
    E: From<InboxError> + From<Error>,
{
    let consumer = consumer.consumer_name()?;
    let key = key.inbox_key();
    validate_key(&key).map_err(InboxError::InvalidKey)?;
    with_retries(conn, consumer, &key, retries, &classify, |conn| {
        let scope = begin(conn).map_err(|(scope, e)| (scope, Failure::Inbox(e)))?;
        match <C::Backend as InboxBackend>::claim(conn, consumer, &key) {
            Ok(true) => run_claimed(conn, scope, &mut body).map(Processed::Applied),
            Ok(false) => {
                // Nothing was written; ending the transaction either way is the same.
                rollback(conn);
                Ok(Processed::Duplicate)
            }
            Err(e) => {
                rollback(conn);
                Err((scope, Failure::Inbox(e)))
            }
        }
    })
}

/// Claims the keys of a whole batch in one transaction with one multi-row
/// insert, runs `body` once with only the messages claimed for the first
/// time, and commits once: the guarantees of [`run`], for many messages at
/// the cost of one transaction.
///
/// `key` gives each message's key (a key repeated within the batch counts
/// once: its first message is the one applied). Invalid keys refuse the
/// whole batch before anything runs. When every message is a duplicate the
/// body does not run and `value` is `None`.
///
/// ```
/// use diesel::prelude::*;
/// use inbox_runtime::{run_batch, migrate, ErrorClass};
///
/// struct Order { id: u64 }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// migrate(&mut conn)?;
/// let orders = [Order { id: 1 }, Order { id: 2 }];
/// let first = run_batch(&mut conn, "shipping", &orders, |o| o.id.to_string(), 3,
///     |_conn, fresh: Vec<&Order>| -> QueryResult<usize> { Ok(fresh.len()) }, |_| ErrorClass::by_statements())?;
/// assert_eq!((first.value, first.applied, first.duplicates), (Some(2), vec![0, 1], 0));
///
/// let again = [Order { id: 2 }, Order { id: 3 }, Order { id: 3 }];
/// let second = run_batch(&mut conn, "shipping", &again, |o| o.id.to_string(), 3,
///     |_conn, fresh: Vec<&Order>| -> QueryResult<usize> { Ok(fresh.len()) }, ErrorClass::of)?;
/// assert_eq!((second.value, second.applied, second.duplicates), (Some(1), vec![1], 2));
/// # Ok(())
/// # }
/// ```
pub fn run_batch<C, N, M, T, E, F, R>(
    conn: &mut C,
    consumer: &N,
    messages: &[M],
    key: impl Fn(&M) -> String,
    retries: u32,
    mut body: F,
    classify: R,
) -> Result<Batch<T>, E>
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
    N: ConsumerName + ?Sized,
    F: FnMut(&mut C, Vec<&M>) -> Result<T, E>, // reruns on a retry: clone what the body moves, or set `retries = 0`
    R: Fn(&E) -> ErrorClass<E>,
    E: From<InboxError> + From<Error>,
{
    let consumer = consumer.consumer_name()?;
    let keys: Vec<String> = messages.iter().map(key).collect();
    for key in &keys {
        validate_key(key).map_err(InboxError::InvalidKey)?;
    }
    // The first message of each distinct key, in input order.
    let mut seen = HashSet::with_capacity(keys.len());
    let firsts: Vec<usize> = (0..keys.len())
        .filter(|&i| seen.insert(keys[i].as_str()))
        .collect();
    let mut distinct: Vec<&str> = firsts.iter().map(|&i| keys[i].as_str()).collect();
    // One lock order for every batch: overlapping batches wait, not deadlock.
    distinct.sort_unstable();
    let what = format!("batch of {}", messages.len());
    with_retries(conn, consumer, &what, retries, &classify, |conn| {
        let scope = begin(conn).map_err(|(scope, e)| (scope, Failure::Inbox(e)))?;
        let claimed = match <C::Backend as InboxBackend>::claim_batch(conn, consumer, &distinct) {
            Ok(claimed) => claimed,
            Err(e) => {
                rollback(conn);
                return Err((scope, Failure::Inbox(e)));
            }
        };
        let claimed: HashSet<&str> = claimed.iter().map(String::as_str).collect();
        let applied: Vec<usize> = firsts
            .iter()
            .copied()
            .filter(|&i| claimed.contains(keys[i].as_str()))
            .collect();
        let duplicates = messages.len() - applied.len();
        if applied.is_empty() {
            rollback(conn);
            return Ok(Batch {
                value: None,
                applied,
                duplicates,
            });
        }
        let fresh: Vec<&M> = applied.iter().map(|&i| &messages[i]).collect();
        let value = run_claimed(conn, scope, |conn| body(conn, fresh))?;
        Ok(Batch {
            value: Some(value),
            applied,
            duplicates,
        })
    })
}

/// Runs `attempt` (one transaction) until it succeeds, fails for good, or
/// `retries` reruns of a transient failure are spent. `what` names the
/// message(s) in logs.
fn with_retries<C, O, E>(
    conn: &mut C,
    consumer: &str,
    what: &str,
    retries: u32,
    classify: &dyn Fn(&E) -> ErrorClass<E>,
    mut attempt: impl FnMut(&mut C) -> Result<O, (Scope, Failure<E>)>,
) -> Result<O, E>
where
    C: Connection,
    C::Backend: InboxBackend,
    E: From<InboxError> + From<Error>,
{
    let mut attempts: u32 = 1;
    loop {
        let (scope, failure) = match attempt(conn) {
            Ok(outcome) => return Ok(outcome),
            Err(failed) => failed,
        };
        let (retryable, class) = match &failure {
            Failure::Inbox(e) => (<C::Backend as InboxBackend>::is_transient(e), None),
            Failure::Commit(_) | Failure::Ignored(_) => (false, None),
            Failure::Body { error, transient } => {
                let class = classify(error);
                let retryable = class.is_retryable().unwrap_or(transient.is_some());
                (retryable, Some(class))
            }
        };
        if !retryable || scope == Scope::Savepoint {
            return Err(failure.into_error());
        }
        let cause = match &failure {
            Failure::Inbox(e)
            | Failure::Body {
                transient: Some(e), ..
            } => e.to_string(),
            _ => "the body's error type says it is retryable".to_string(),
        };
        if attempts > retries {
            tracing::warn!(
                consumer,
                key = what,
                attempts,
                error = %cause,
                "diesel-inbox: giving up on a transient error"
            );
            return Err(match (failure, class) {
                (Failure::Inbox(source), _) => {
                    InboxError::RetriesExhausted { attempts, source }.into()
                }
                (Failure::Body { error, .. }, Some(class)) => class.exhausted(error, attempts),
                (other, _) => other.into_error(),
            });
        }
        tracing::debug!(
            consumer,
            key = what,
            attempt = attempts,
            error = %cause,
            "diesel-inbox: transient error, retrying"
        );
        std::thread::sleep(backoff(attempts));
        attempts += 1;
    }
}

/// [`run`] for a body that can run only once (it moves a captured value):
/// no retries.
///
/// ```
/// use diesel::prelude::*;
/// use inbox_runtime::{run_once, migrate, Processed};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// migrate(&mut conn)?;
/// let payload = String::from("owned");
/// let out: QueryResult<_> = run_once(&mut conn, "archiver", "m-1", move |_conn| Ok(payload));
/// assert_eq!(out?, Processed::Applied("owned".to_string()));
/// # Ok(())
/// # }
/// ```
pub fn run_once<C, N, K, T, E, F>(
    conn: &mut C,
    consumer: &N,
    key: &K,
    body: F,
) -> Result<Processed<T>, E>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
    N: ConsumerName + ?Sized,
    K: InboxKey + ?Sized,
    F: FnOnce(&mut C) -> Result<T, E>,
    E: From<InboxError> + From<Error>,
{
    let mut body = Some(body);
    run(
        conn,
        consumer,
        key,
        0,
        |conn| match body.take() {
            Some(body) => body(conn),
            None => unreachable!("with retries = 0 the body runs at most once"),
        },
        |_| ErrorClass::permanent(),
    )
}

/// Runs the body of a transaction whose claim succeeded: commit on `Ok`,
/// rollback on `Err` and on panic (the panic then keeps unwinding). The
/// body's failed statements are observed (see [`observe`]) so that a
/// transient one can rerun the transaction whatever the body's error type.
fn run_claimed<C, T, E>(
    conn: &mut C,
    scope: Scope,
    body: impl FnOnce(&mut C) -> Result<T, E>,
) -> Result<T, (Scope, Failure<E>)>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    let fail = |failure| (scope, failure);
    let mark = observe::mark(conn);
    match panic::catch_unwind(AssertUnwindSafe(|| body(conn))) {
        Ok(Ok(value)) => {
            let ended = observe::failed_since(conn, mark)
                .into_iter()
                .map(|failed| failed.to_error())
                .find(<C::Backend as InboxBackend>::ends_transaction);
            if let Some(error) = ended {
                // The server already rolled the transaction back (and the
                // inbox row with it): committing would report a false Applied.
                rollback(conn);
                return Err(fail(Failure::Ignored(error)));
            }
            let committed = match scope {
                Scope::TopLevel => <C::Backend as InboxBackend>::commit_top_level(conn),
                Scope::Savepoint => AnsiTransactionManager::commit_transaction(conn),
            };
            match committed {
                Ok(()) => Ok(value),
                Err(e) if is_aborted_transaction(&e) => Err(fail(Failure::Ignored(e))),
                Err(e) if <C::Backend as InboxBackend>::is_transient(&e) => {
                    Err(fail(Failure::Inbox(e)))
                }
                Err(e) => Err(fail(Failure::Commit(e))),
            }
        }
        Ok(Err(error)) => {
            let transient = observe::failed_since(conn, mark)
                .into_iter()
                .map(|failed| failed.to_error())
                .find(<C::Backend as InboxBackend>::is_transient);
            rollback(conn);
            Err(fail(Failure::Body { error, transient }))
        }
        Err(panic_payload) => {
            // diesel does not roll back on unwind; without this the
            // connection (and its pool) would keep the open transaction.
            rollback(conn);
            panic::resume_unwind(panic_payload)
        }
    }
}

/// 2, 4, 8 … ms (capped at 256 ms) plus up to the same again of jitter, so
/// that two deadlocked transactions do not collide again in lockstep.
fn backoff(attempt: u32) -> Duration {
    let base_ms = 1u64 << attempt.clamp(1, 8);
    let jitter_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()))
        .unwrap_or(0)
        % base_ms;
    Duration::from_millis(base_ms + jitter_ms)
}
