//! The async driver: performs the steps the [engine](crate::engine) asks
//! for on a diesel-async connection, with the same decisions as the sync
//! driver (the engine is shared; each backend's module supplies its async
//! statements next to its sync ones).

use crate::backend::asynchronous::AsyncInboxConnection;
use crate::backend::outbox::{Answer, Op};
use crate::backend::shape;
use crate::backend::transaction::{state_known, state_unknown, Scope};
use crate::claim::{single_key, BatchPlan, One, Read};
use crate::engine::{Claimed, Ended, Engine, Event, Next, Step};
use crate::error::InboxError;
use crate::fence::Fenced;
use crate::key::InboxKey;
use crate::observe;
use crate::options::{describe_panic, encoder, Options, SingleOutcome};
use crate::processed::Batch;
use crate::registry::ConsumerName;
use crate::retry::ErrorClass;
use diesel::result::{Error, QueryResult};
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::task::Poll;
use tracing::Instrument;

/// An `async` body: `async |conn| { .. }`.
///
/// Implemented for every async closure over `&mut C`; it exists to name the
/// closure's future, so that the runtime can require it to be `Send` (this
/// is how diesel-async's own `transaction` bounds its callback). A body that
/// may run again on a retry is also `Clone`: each attempt runs a copy (a
/// closure that borrows its captures, the default for `async |..|`, is).
pub trait AsyncBody<C, R>:
    AsyncFnOnce(C) -> R + FnOnce(C) -> <Self as AsyncBody<C, R>>::Fut
{
    /// The future of one run of the body.
    type Fut: Future<Output = R>;
}

impl<F, C, R, Fut> AsyncBody<C, R> for F
where
    F: AsyncFnOnce(C) -> R + FnOnce(C) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}

/// An `async` body of a batch handler: `async |conn, messages| { .. }`.
pub trait AsyncBatchBody<C, M, R>:
    AsyncFnOnce(C, M) -> R + FnOnce(C, M) -> <Self as AsyncBatchBody<C, M, R>>::Fut
{
    /// The future of one run of the body.
    type Fut: Future<Output = R>;
}

impl<F, C, M, R, Fut> AsyncBatchBody<C, M, R> for F
where
    F: AsyncFnOnce(C, M) -> R + FnOnce(C, M) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}

/// A single call (what [`Inbox::run_async`](crate::Inbox::run_async) and
/// `run_once_async` run); `next_body` gives the body of each attempt (a
/// copy, or the one body of a call without retries), `describe` how a
/// counted failure reads (`None`: failures are not counted).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_one<C, N, K, T, E, F, R, O>(
    conn: &mut C,
    consumer: &N,
    key: &K,
    options: &Options,
    retries: u32,
    next_body: impl FnMut() -> F + Send,
    classify: R,
    describe: Option<fn(&E) -> String>,
) -> Result<O, E>
where
    O: SingleOutcome<T>,
    C: AsyncInboxConnection,
    N: ConsumerName + ?Sized,
    K: InboxKey + ?Sized,
    for<'c> F: AsyncBody<&'c mut C, Result<T, E>, Fut: Send> + Send,
    T: Send,
    E: From<InboxError> + From<Error> + std::fmt::Debug + Send,
    R: Fn(&E) -> ErrorClass<E> + Send,
{
    let consumer = consumer.consumer_name()?;
    let key = single_key(key)?;
    let one = options.single_claim::<T, O>(consumer, &key)?;
    let engine = Engine::new(consumer, &key, retries, classify)
        .storing(encoder::<T, O>())
        .counting(one.max_attempts.and(describe))
        .waiting(one.wait)
        .looking_up(one.looks_up())
        .fencing(crate::fence::take());
    let span = engine.span().clone();
    let ended = drive_one(conn, engine, &one, next_body)
        .instrument(span)
        .await?;
    Ok(O::outcome(consumer, &key, ended)?)
}

/// A batch call (what [`Inbox::run_batch_async`](crate::Inbox::run_batch_async)
/// runs): one transaction and one multi-row claim for the plan's keys; the
/// body gets the messages claimed for the first time.
pub(crate) async fn run_batch<C, M, T, E, F, R>(
    conn: &mut C,
    consumer: &str,
    messages: &[M],
    plan: &BatchPlan,
    retries: u32,
    body: F,
    classify: R,
) -> Result<Batch<T>, E>
where
    C: AsyncInboxConnection,
    M: Sync,
    for<'c, 'm> F: AsyncBatchBody<&'c mut C, Vec<&'m M>, Result<T, E>, Fut: Send> + Clone + Send,
    T: Send,
    E: From<InboxError> + From<Error> + std::fmt::Debug + Send,
    R: Fn(&E) -> ErrorClass<E> + Send,
{
    let what = plan.describe();
    let mut engine: Engine<'_, C::Backend, T, E, R> =
        Engine::new(consumer, &what, retries, classify).fencing(crate::fence::take());
    let claim = Claim::Many(consumer, plan);
    let mut positions = Vec::new();
    // The claim done together with the begin, for the engine's next step.
    let mut claimed = None;
    let mut step = engine.first_step();
    let span = engine.span().clone();
    let ended = async {
        loop {
            let event = match step {
                Step::Body => {
                    let fresh: Vec<&M> = positions.iter().map(|&i| &messages[i]).collect();
                    let body = body.clone();
                    run_body(conn, async move |conn| body(conn, fresh).await, None).await
                }
                Step::Begin => {
                    let fingerprints = plan.distinct_fingerprints();
                    let (begun, inserted) = conn
                        .inbox_begin_claim_batch(
                            consumer,
                            &plan.distinct(),
                            fingerprints.as_deref(),
                        )
                        .await;
                    claimed = inserted;
                    Event::Begun(begun)
                }
                Step::Claim if claimed.is_some() => {
                    let inserted = claimed.take().expect("checked");
                    Event::Claimed(judge_many(conn, consumer, plan, &mut positions, inserted).await)
                }
                other => perform(conn, other, &claim, &mut positions).await,
            };
            step = match engine.next(event) {
                Next::Do(step) => step,
                Next::Done(result) => break result,
            };
        }
    }
    .instrument(span)
    .await?;
    Ok(plan.outcome(ended, positions))
}

/// The sync driver's shape check of a connection's first claim, on an
/// async one.
async fn check_shape<C: AsyncInboxConnection>(conn: &mut C) -> Result<(), InboxError> {
    if observe::shape_unchecked::<C::Backend>(conn.instrumentation()) {
        // Outside any transaction (as the lookup below).
        let status = state_unknown(conn);
        let catalog = conn.catalog().await;
        state_known(conn, status);
        let catalog = catalog?;
        if shape::checked_at_claim(
            &catalog,
            <C::Backend as crate::backend::Internals>::KEY_TYPE,
        )? {
            observe::shape_checked_async(conn);
        }
    }
    Ok(())
}

/// What one call claims.
enum Claim<'a> {
    One(&'a One<'a>),
    Many(&'a str, &'a BatchPlan),
}

/// Performs the engine's steps for a single message until the call is
/// done; `next_body` gives the body of each attempt (a copy, or the one
/// body of a call without retries).
async fn drive_one<C, T, E, F, R>(
    conn: &mut C,
    mut engine: Engine<'_, C::Backend, T, E, R>,
    one: &One<'_>,
    mut next_body: impl FnMut() -> F,
) -> Result<Ended<T>, E>
where
    C: AsyncInboxConnection,
    for<'c> F: AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
    E: From<InboxError> + From<Error> + std::fmt::Debug,
    R: Fn(&E) -> ErrorClass<E>,
{
    let claim = Claim::One(one);
    let mut positions = Vec::new();
    // The claim done together with the begin, for the engine's next step.
    let mut claimed = None;
    // The transaction's scope, and the commit sent behind the stored
    // result, for the engine's next step.
    let mut scope = Scope::TopLevel;
    let mut committed = None;
    let mut step = engine.first_step();
    loop {
        let sent_commit = committed.take();
        let event = match step {
            Step::Body => {
                let counted = engine.counted_scope().map(|scope| (scope, one));
                run_body(conn, next_body(), counted).await
            }
            Step::Store(value) => {
                let (stored, commit) = conn
                    .inbox_store_commit(one.consumer, one.key, &value, scope)
                    .await;
                committed = commit;
                Event::Stored(stored)
            }
            Step::Commit(_) if sent_commit.is_some() => {
                Event::Committed(sent_commit.expect("checked"))
            }
            Step::Begin => {
                let (begun, inserted) = match one.wait {
                    None => {
                        conn.inbox_begin_claim(one.consumer, one.key, one.fingerprint())
                            .await
                    }
                    Some(wait) => {
                        conn.inbox_begin_claim_waiting(
                            one.consumer,
                            one.key,
                            one.fingerprint(),
                            wait,
                        )
                        .await
                    }
                };
                claimed = inserted;
                if let Ok(begun) = &begun {
                    scope = *begun;
                }
                Event::Begun(begun)
            }
            Step::Claim if claimed.is_some() => {
                let inserted = claimed.take().expect("checked");
                Event::Claimed(judge_one(conn, one, inserted).await)
            }
            other => perform(conn, other, &claim, &mut positions).await,
        };
        step = match engine.next(event) {
            Next::Do(step) => step,
            Next::Done(result) => return result,
        };
    }
}

/// The verdict of a single claim that `inserted` (or not): a duplicate's
/// row is read when the call checks a fingerprint or wants a stored result.
async fn judge_one<C: AsyncInboxConnection>(
    conn: &mut C,
    one: &One<'_>,
    inserted: QueryResult<bool>,
) -> Result<Claimed, Error> {
    Ok(match one.next_read(inserted?) {
        Read::Done(claimed) => claimed,
        Read::Stored => one.duplicate(conn.inbox_stored(one.consumer, &[one.key]).await?),
        Read::Attempts => {
            let row = conn.inbox_attempts(one.consumer, one.key).await?;
            let (claimed, clear) = one.attempted(row);
            if clear {
                conn.inbox_clear_attempts(one.consumer, one.key).await?;
            }
            claimed
        }
    })
}

/// Performs a step other than the body; a batch's claim records the input
/// positions claimed for the first time in `positions`.
async fn perform<C, T, E>(
    conn: &mut C,
    step: Step,
    claim: &Claim<'_>,
    positions: &mut Vec<usize>,
) -> Event<T, E>
where
    C: AsyncInboxConnection,
{
    match step {
        Step::Begin => Event::Begun(conn.inbox_begin().await),
        Step::Claim => Event::Claimed(match claim {
            Claim::One(one) => {
                let inserted = conn
                    .inbox_claim(one.consumer, one.key, one.fingerprint())
                    .await;
                judge_one(conn, one, inserted).await
            }
            Claim::Many(consumer, plan) => claim_many(conn, consumer, plan, positions).await,
        }),
        Step::Fence(positions) => {
            let consumer = match claim {
                Claim::One(one) => one.consumer,
                Claim::Many(consumer, _) => consumer,
            };
            let op = Op::Fence {
                consumer: consumer.to_owned(),
                positions,
            };
            Event::Fenced(conn.inbox_outbox(op).await.and_then(fenced))
        }
        Step::Store(value) => Event::Stored(match claim {
            Claim::One(one) => conn.inbox_store_result(one.consumer, one.key, &value).await,
            Claim::Many(..) => unreachable!("a batch stores no result"),
        }),
        Step::Count(scope, error) => {
            match claim {
                Claim::One(one) => crate::transaction::counted(
                    count_failure(conn, scope, one.consumer, one.key, &error).await,
                ),
                Claim::Many(..) => unreachable!("a batch counts no failures"),
            }
            Event::Counted
        }
        Step::CheckShape => Event::ShapeChecked(check_shape(conn).await),
        Step::Lookup => Event::LookedUp(match claim {
            Claim::One(one) => look_up(conn, one).await,
            Claim::Many(..) => unreachable!("a batch reads no stored result"),
        }),
        Step::Commit(scope) => Event::Committed(conn.inbox_commit(scope).await),
        Step::Rollback => {
            conn.inbox_rollback().await;
            Event::RolledBack
        }
        Step::Sleep(delay) => {
            tokio::time::sleep(delay).await;
            Event::Slept
        }
        Step::Body => unreachable!("the driver runs the body itself"),
    }
}

/// The replay's read of a single call, outside any transaction and once
/// the connection's tables were checked; nothing found otherwise.
async fn look_up<C: AsyncInboxConnection>(
    conn: &mut C,
    one: &One<'_>,
) -> Result<Option<Claimed>, Error> {
    if crate::backend::transaction::transaction_open_async(conn)
        || observe::shape_unchecked::<C::Backend>(conn.instrumentation())
    {
        return Ok(None);
    }
    // Outside any transaction: a future dropped while the read is on its
    // way leaves a connection its pool discards ([`state_unknown`]).
    let status = state_unknown(conn);
    let found = conn.inbox_lookup(one.consumer, one.key).await;
    state_known(conn, status);
    Ok(one.looked_up(found?))
}

/// The statement layer's answer to a fence.
fn fenced(answer: Answer) -> QueryResult<Fenced> {
    match answer {
        Answer::Fenced(fenced) => Ok(fenced),
        other => unreachable!("a fence answered {other:?}"),
    }
}

/// The batch claim: the distinct keys (with their fingerprints), then the
/// rows of the duplicates when the batch checks fingerprints.
async fn claim_many<C: AsyncInboxConnection>(
    conn: &mut C,
    consumer: &str,
    plan: &BatchPlan,
    positions: &mut Vec<usize>,
) -> Result<Claimed, Error> {
    let fingerprints = plan.distinct_fingerprints();
    let claimed = conn
        .inbox_claim_batch(consumer, &plan.distinct(), fingerprints.as_deref())
        .await;
    judge_many(conn, consumer, plan, positions, claimed).await
}

/// The verdict of a batch claim that inserted `claimed` (or failed),
/// reading the duplicates' rows when the batch checks fingerprints; the
/// input positions claimed for the first time go to `positions`.
async fn judge_many<C: AsyncInboxConnection>(
    conn: &mut C,
    consumer: &str,
    plan: &BatchPlan,
    positions: &mut Vec<usize>,
    claimed: QueryResult<Vec<String>>,
) -> Result<Claimed, Error> {
    let claimed = claimed?;
    *positions = plan.applied(&claimed);
    let check = plan.to_check(&claimed);
    let rows = match check.is_empty() {
        true => Vec::new(),
        false => conn.inbox_stored(consumer, &check).await?,
    };
    Ok(plan.verdict(positions, &rows))
}

/// Runs one attempt's body, observing its failed statements; a panic rolls
/// back and then keeps unwinding.
/// `counted`: the scope and the claim whose failure a panic counts
/// (`max_attempts`).
async fn run_body<C, T, E, F>(
    conn: &mut C,
    body: F,
    counted: Option<(Scope, &One<'_>)>,
) -> Event<T, E>
where
    C: AsyncInboxConnection,
    for<'c> F: AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
{
    let mark = observe::mark_async(conn);
    let result = caught(body(&mut *conn)).await;
    match result {
        Ok(result) => {
            let failed = observe::failed_since_async(conn, mark);
            let open = match crate::engine::wants_probe(&result, &failed) {
                true => conn.inbox_still_open().await,
                false => Ok(None),
            };
            Event::Ran {
                result,
                failed,
                open,
            }
        }
        // diesel-async does not roll back on unwind either.
        Err(panic) => {
            conn.inbox_rollback().await;
            if let Some((scope, one)) = counted {
                let text = describe_panic(&*panic);
                crate::transaction::counted(
                    count_failure(conn, scope, one.consumer, one.key, &text).await,
                );
            }
            panic::resume_unwind(panic)
        }
    }
}

/// Runs `future` to its end, or to a panic in one of its polls, which is
/// returned instead of unwinding further (the body's panics, and the HTTP
/// front door's).
pub async fn caught<F: Future>(future: F) -> Result<F::Output, Box<dyn std::any::Any + Send>> {
    let mut running = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        match panic::catch_unwind(AssertUnwindSafe(|| running.as_mut().poll(cx))) {
            Ok(Poll::Ready(result)) => Poll::Ready(Ok(result)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    })
    .await
}

/// Counts a failure of `(consumer, key)` as the sync driver does: in a
/// short transaction of its own at top level, rerun while
/// [`count_again`](crate::transaction::count_again) says so; in the
/// caller's transaction inside one.
async fn count_failure<C: AsyncInboxConnection>(
    conn: &mut C,
    scope: Scope,
    consumer: &str,
    key: &str,
    error: &str,
) -> QueryResult<()> {
    if scope == Scope::Savepoint {
        return conn.inbox_count_failure(consumer, key, error).await;
    }
    let mut attempt = 1;
    loop {
        let counted = match conn.inbox_begin().await {
            Err((_, e)) => Err(e),
            Ok(_) => match conn.inbox_count_failure(consumer, key, error).await {
                Ok(()) => conn.inbox_commit(Scope::TopLevel).await,
                Err(e) => {
                    conn.inbox_rollback().await;
                    Err(e)
                }
            },
        };
        match counted {
            Err(e) => match crate::transaction::count_again::<C::Backend>(attempt, &e) {
                Some(delay) => {
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                None => return Err(e),
            },
            Ok(()) => return Ok(()),
        }
    }
}
