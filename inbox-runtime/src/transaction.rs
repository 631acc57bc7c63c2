//! The sync driver: performs the steps the [engine](crate::engine) asks
//! for on a diesel `Connection`.

use crate::backend::{shape, InboxBackend};
use crate::claim::{single_key, BatchPlan, One, Read};
use crate::engine::{Claimed, Engine, Event, Next, Step};
use crate::error::InboxError;
use crate::key::InboxKey;
use crate::observe;
use crate::options::{describe, describe_panic, encoder, Options, SingleOutcome};
use crate::processed::Batch;
use crate::registry::ConsumerName;
use crate::retry::ErrorClass;
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection};
use diesel::result::Error;
use std::panic::{self, AssertUnwindSafe};

pub(crate) use crate::backend::transaction::{begin, commit, rollback, Scope};

/// A sync diesel connection the inbox runs on: `PgConnection`,
/// `MysqlConnection`, `SqliteConnection`, or any connection that loads rows
/// (`LoadConnection`) with diesel's `AnsiTransactionManager` on one of
/// those backends (an r2d2 `PooledConnection` of one, say). Implemented for
/// every such connection; a generic handler can bound its connection with
/// it.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{idempotent, InboxConnection};
///
/// #[idempotent(key = "id")]
/// fn handle<C: InboxConnection>(conn: &mut C, id: i64) -> QueryResult<i64> {
///     Ok(id)
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a connection diesel-inbox can run a sync handler on",
    label = "not a diesel connection of a supported backend",
    note = "a sync `fn` handler takes `&mut PgConnection`, `&mut MysqlConnection` or `&mut SqliteConnection` (for a pooled one, pass `&mut pooled`); an async connection (`AsyncPgConnection`, ...) goes with an `async fn` handler (feature `async`); a `#[derive(MultiConnection)]` enum is not supported"
)]
pub trait InboxConnection:
    LoadConnection<TransactionManager = AnsiTransactionManager, Backend: InboxBackend>
{
}

impl<C> InboxConnection for C
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
}

/// A single call (what [`Inbox::run`](crate::Inbox::run) and
/// [`run_once`](crate::Inbox::run_once) run): `steps` are the plain claim of
/// a call without options, or the claim that reads rows, stores results and
/// counts failures.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_one<C, N, K, T, E, F, R, O>(
    conn: &mut C,
    consumer: &N,
    key: &K,
    options: &Options,
    retries: u32,
    mut body: F,
    classify: R,
    steps: Steps<C, E>,
) -> Result<O, E>
where
    O: SingleOutcome<T>,
    C: InboxConnection,
    N: ConsumerName + ?Sized,
    K: InboxKey + ?Sized,
    F: FnMut(&mut C) -> Result<T, E>,
    R: Fn(&E) -> ErrorClass<E>,
    E: From<InboxError> + From<Error> + std::fmt::Debug,
{
    let consumer = consumer.consumer_name()?;
    let key = single_key(key)?;
    let one = options.single_claim::<T, O>(consumer, &key)?;
    let engine = Engine::new(consumer, &key, retries, classify)
        .storing(encoder::<T, O>())
        .counting(one.max_attempts.and(steps.describe))
        .looking_up(one.looks_up());
    let ended = drive(
        conn,
        engine,
        |conn| (steps.lookup)(conn, &one),
        |conn| (steps.claim)(conn, &one).map(|claimed| (claimed, ())),
        |conn, value| (steps.store)(conn, consumer, &key, value),
        |conn, scope, error| (steps.count)(conn, scope, consumer, &key, error),
        |conn, ()| body(conn),
    )?;
    Ok(O::outcome(consumer, &key, ended.0)?)
}

/// The statements of a single call beyond the body: the plain claim of a
/// call without options, or the claim that reads rows, stores results and
/// counts failures.
#[doc(hidden)]
pub struct Steps<C, E> {
    lookup: fn(&mut C, &One<'_>) -> Result<Option<Claimed>, Error>,
    claim: fn(&mut C, &One<'_>) -> Result<Claimed, Error>,
    store: fn(&mut C, &str, &str, &[u8]) -> Result<(), Error>,
    count: fn(&mut C, Scope, &str, &str, &str) -> Result<(), Error>,
    /// How a counted failure reads (`None`: failures are not counted).
    describe: Option<fn(&E) -> String>,
}

impl<C: InboxConnection, E> Steps<C, E> {
    /// No options, so the claim reads nothing and nothing is stored or
    /// counted.
    pub(crate) fn plain() -> Self {
        Steps {
            lookup: |_, _| unreachable!("a call without options reads no stored result"),
            claim: |conn, one| {
                let inserted = <C::Backend as crate::backend::Internals>::claim(
                    conn,
                    one.consumer,
                    one.key,
                    None,
                )?;
                match one.next_read(inserted) {
                    Read::Done(claimed) => Ok(claimed),
                    _ => unreachable!("a call without options reads nothing after its claim"),
                }
            },
            store: |_, _, _, _| unreachable!("a call without options stores nothing"),
            count: |_, _, _, _, _| unreachable!("a call without options counts nothing"),
            describe: None,
        }
    }
}

impl<C: InboxConnection + LoadConnection, E: std::fmt::Debug> Steps<C, E> {
    /// With options.
    pub(crate) fn with_options() -> Self {
        Steps {
            lookup: look_up,
            claim: claim_one,
            store: <C::Backend as crate::backend::Statements>::store_result,
            count: count_failure,
            describe: Some(describe::<E>),
        }
    }
}

/// The replay's read of a single call, outside any transaction and once
/// the connection's tables were checked; nothing found otherwise.
fn look_up<C: InboxConnection + LoadConnection>(
    conn: &mut C,
    one: &One<'_>,
) -> Result<Option<Claimed>, Error> {
    type B<C> = <C as Connection>::Backend;
    if crate::backend::transaction::transaction_open(conn)
        || observe::shape_unchecked::<B<C>>(conn.instrumentation())
    {
        return Ok(None);
    }
    let row = <B<C> as crate::backend::Internals>::lookup(conn, one.consumer, one.key)?;
    Ok(one.looked_up(row))
}

/// The single claim: insert the row; for a duplicate, read its row when
/// the call checks a fingerprint or wants a stored result.
fn claim_one<C: InboxConnection + LoadConnection>(
    conn: &mut C,
    one: &One<'_>,
) -> Result<Claimed, Error> {
    type B<C> = <C as Connection>::Backend;
    let inserted =
        <B<C> as crate::backend::Internals>::claim(conn, one.consumer, one.key, one.fingerprint())?;
    Ok(match one.next_read(inserted) {
        Read::Done(claimed) => claimed,
        Read::Stored => one.duplicate(<B<C> as crate::backend::Statements>::stored(
            conn,
            one.consumer,
            &[one.key],
        )?),
        Read::Attempts => {
            let row = <B<C> as crate::backend::Statements>::attempts(conn, one.consumer, one.key)?;
            let (claimed, clear) = one.attempted(row);
            if clear {
                <B<C> as crate::backend::Statements>::clear_attempts(conn, one.consumer, one.key)?;
            }
            claimed
        }
    })
}

/// How often a failure's count runs in all when it keeps failing
/// transiently.
const COUNT_ATTEMPTS: u32 = 10;

/// The wait before counting a failure again after `error` ended attempt
/// `attempt` of its short transaction, or `None`: give up. Concurrent
/// failures of one key can deadlock on its row; [`COUNT_ATTEMPTS`] runs in
/// all. The sync and the async driver both ask this.
pub(crate) fn count_again<B: InboxBackend>(
    attempt: u32,
    error: &Error,
) -> Option<std::time::Duration> {
    (attempt < COUNT_ATTEMPTS && B::is_transient(error)).then(|| crate::backoff::rerun(attempt))
}

/// Counts a failure of `(consumer, key)`: in a short transaction of its
/// own at top level (rerun while [`count_again`] says so), in the caller's
/// transaction inside one.
pub(crate) fn count_failure<C>(
    conn: &mut C,
    scope: Scope,
    consumer: &str,
    key: &str,
    error: &str,
) -> Result<(), Error>
where
    C: InboxConnection + LoadConnection,
{
    type B<C> = <C as Connection>::Backend;
    if scope == Scope::Savepoint {
        return <B<C> as crate::backend::Statements>::count_failure(conn, consumer, key, error);
    }
    let mut attempt = 1;
    loop {
        let counted = <B<C> as crate::backend::Internals>::begin_top_level(conn).and_then(|()| {
            match <B<C> as crate::backend::Statements>::count_failure(conn, consumer, key, error) {
                Ok(()) => <B<C> as crate::backend::Internals>::commit_top_level(conn),
                Err(e) => {
                    rollback(conn);
                    Err(e)
                }
            }
        });
        match counted {
            Err(e) => match count_again::<B<C>>(attempt, &e) {
                Some(delay) => {
                    std::thread::sleep(delay);
                    attempt += 1;
                }
                None => return Err(e),
            },
            Ok(()) => return Ok(()),
        }
    }
}

/// A batch call (what [`Inbox::run_batch`](crate::Inbox::run_batch)
/// runs): one transaction, one multi-row claim of the plan's distinct keys,
/// the body once with the messages claimed for the first time.
pub(crate) fn run_batch<C, M, T, E, F, R>(
    conn: &mut C,
    consumer: &str,
    messages: &[M],
    plan: &BatchPlan,
    retries: u32,
    mut body: F,
    classify: R,
) -> Result<Batch<T>, E>
where
    C: InboxConnection + LoadConnection,
    F: FnMut(&mut C, Vec<&M>) -> Result<T, E>,
    R: Fn(&E) -> ErrorClass<E>,
    E: From<InboxError> + From<Error> + std::fmt::Debug,
{
    let what = plan.describe();
    let engine = Engine::new(consumer, &what, retries, classify);
    let distinct = plan.distinct();
    let fingerprints = plan.distinct_fingerprints();
    let claim = |conn: &mut C| {
        type B<C> = <C as Connection>::Backend;
        let claimed = <B<C> as crate::backend::Internals>::claim_batch(
            conn,
            consumer,
            &distinct,
            fingerprints.as_deref(),
        )?;
        let applied = plan.applied(&claimed);
        let check = plan.to_check(&claimed);
        let rows = match check.is_empty() {
            true => Vec::new(),
            false => <B<C> as crate::backend::Statements>::stored(conn, consumer, &check)?,
        };
        Ok((plan.verdict(&applied, &rows), applied))
    };
    let (ended, applied) = drive(
        conn,
        engine,
        |_| unreachable!("a batch reads no stored result"),
        claim,
        |_, _| unreachable!("a batch stores no result"),
        |_, _, _| unreachable!("a batch counts no failures"),
        |conn, applied: &Vec<usize>| body(conn, applied.iter().map(|&i| &messages[i]).collect()),
    )?;
    Ok(plan.outcome(ended, applied))
}

/// Performs the engine's steps until the call is done. `claim` inserts the
/// inbox row(s) and returns the verdict and what is new (`W`); `store`
/// writes a stored result; `body` runs with what is new. Returns how the
/// call ended and that work.
fn drive<C, T, E, W: Default>(
    conn: &mut C,
    mut engine: Engine<'_, C::Backend, T, E, impl Fn(&E) -> ErrorClass<E>>,
    mut lookup: impl FnMut(&mut C) -> Result<Option<Claimed>, Error>,
    mut claim: impl FnMut(&mut C) -> Result<(Claimed, W), Error>,
    mut store: impl FnMut(&mut C, &[u8]) -> Result<(), Error>,
    mut count: impl FnMut(&mut C, Scope, &str) -> Result<(), Error>,
    mut body: impl FnMut(&mut C, &W) -> Result<T, E>,
) -> Result<(crate::engine::Ended<T>, W), E>
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
    E: From<InboxError> + From<Error> + std::fmt::Debug,
{
    let span = engine.span().clone();
    let _entered = span.enter();
    let mut work = W::default();
    let mut step = engine.first_step();
    loop {
        let event = match step {
            Step::Begin => Event::Begun(begin(conn)),
            Step::Claim => Event::Claimed(claim(conn).map(|(claimed, new)| {
                work = new;
                claimed
            })),
            Step::Body => {
                let mark = observe::mark(conn);
                // diesel does not roll back on unwind; without this the
                // connection (and its pool) would keep the open transaction.
                let result = match panic::catch_unwind(AssertUnwindSafe(|| body(conn, &work))) {
                    Ok(result) => result,
                    Err(panic) => {
                        rollback(conn);
                        if let Some(scope) = engine.counted_scope() {
                            counted(count(conn, scope, &describe_panic(&*panic)));
                        }
                        panic::resume_unwind(panic)
                    }
                };
                let failed = observe::failed_since(conn, mark);
                let open = match crate::engine::wants_probe(&result, &failed) {
                    true => <C::Backend as crate::backend::Statements>::still_open(conn),
                    false => Ok(None),
                };
                Event::Ran {
                    result,
                    failed,
                    open,
                }
            }
            Step::CheckShape => Event::ShapeChecked(check_shape(conn)),
            Step::Lookup => Event::LookedUp(lookup(conn)),
            Step::Store(value) => Event::Stored(store(conn, &value)),
            Step::Fence(_) => unreachable!("a sync call takes no stream position"),
            Step::Count(scope, error) => {
                counted(count(conn, scope, &error));
                Event::Counted
            }
            Step::Commit(scope) => Event::Committed(commit(conn, scope)),
            Step::Rollback => {
                rollback(conn);
                Event::RolledBack
            }
            Step::Sleep(delay) => {
                std::thread::sleep(delay);
                Event::Slept
            }
        };
        step = match engine.next(event) {
            Next::Do(step) => step,
            Next::Done(result) => return result.map(|ended| (ended, work)),
        };
    }
}

/// At the first claim on a connection (before it, or after its write: see
/// [`Step::CheckShape`](crate::engine::Step::CheckShape)): its inbox
/// tables' shape, in one catalog query, refused as `migrate` refuses it
/// (tables made by the application's own migrations never meet
/// `migrate`). The connection's [`ErrorObserver`](crate::ErrorObserver)
/// keeps that it was done.
fn check_shape<C>(conn: &mut C) -> Result<(), InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    if observe::shape_unchecked::<C::Backend>(conn.instrumentation()) {
        let catalog = <C::Backend as crate::backend::Internals>::catalog(conn)?;
        if shape::checked_at_claim(
            &catalog,
            <C::Backend as crate::backend::Internals>::KEY_TYPE,
        )? {
            observe::shape_checked(conn);
        }
    }
    Ok(())
}

/// A failed count is logged: the caller gets the body's failure either way.
pub(crate) fn counted(result: Result<(), Error>) {
    if let Err(e) = result {
        tracing::warn!(target: crate::target::TARGET, error = %e, "diesel-inbox: the failure could not be counted");
    }
}
