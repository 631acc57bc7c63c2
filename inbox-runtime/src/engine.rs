//! The decisions of a handler call, without any I/O.
//!
//! A call is a sequence of steps: open a transaction (or a savepoint), claim
//! the key(s), run the body, store its value (`store_result`), commit, or
//! roll back and count the failure (`max_attempts`); and, when a transient
//! error ends an attempt, sleep and start again. [`Engine`] says which step
//! comes next and what each result means: which failures are retried, what
//! the caller gets when they are not (a reused key and a key given up on
//! are refusals, never retried), when a body's `Ok` must not be reported as
//! applied. A driver performs each step on its connection and
//! feeds the result back:
//!
//! ```text
//! let mut step = Step::Begin;
//! loop {
//!     let event = perform(step);            // sync, or `.await`ed
//!     match engine.next(event) {
//!         Next::Do(next) => step = next,
//!         Next::Done(result) => return result,
//!     }
//! }
//! ```
//!
//! The sync driver (`transaction.rs`) and the async one (`asynchronous.rs`)
//! are that loop; what differs between databases (the claim's SQL, which
//! errors are transient, the commit guard) lives in each backend's module.
//! So sync and async, single and batch, and every backend share this one
//! engine.

use crate::backend::transaction::Scope;
use crate::backend::InboxBackend;
use crate::error::InboxError;
use crate::fence::{Fenced, Position, Taken};
use crate::observe::FailedStatement;
use crate::retry::ErrorClass;
use crate::telemetry::{Outcome, Telemetry};
use diesel::result::Error;
use std::marker::PhantomData;
use std::time::Duration;

/// What the driver does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Open a transaction, or a savepoint inside the caller's.
    Begin,
    /// Insert the inbox row(s); report whether there is anything to run.
    Claim,
    /// Check the inbox tables' shape, once per call: before the first
    /// `Begin`, or on SQLite after the first claim (its write, or its
    /// rollback); see
    /// [`InboxBackend::CHECK_SHAPE_AFTER_CLAIM`](crate::InboxBackend::CHECK_SHAPE_AFTER_CLAIM).
    /// A driver answers at once when the connection was checked before.
    CheckShape,
    /// Read the key's stored result before any transaction
    /// (`store_result`): a committed row with one is the call's answer
    /// at once (a replay, or a reused key); no row, or one without a
    /// result, goes on to `Begin`. A driver answers "nothing found"
    /// without reading inside the caller's transaction or before the
    /// connection's tables were checked.
    Lookup,
    /// Move the stream position in scope behind its fence (`fence`), in
    /// the claim's transaction: after a new claim, before the body; after
    /// a duplicate, before committing the move alone.
    Fence(Vec<Position>),
    /// Run the body (observing its failed statements).
    Body,
    /// Write the body's value, serialized, into the claimed row
    /// (`store_result`).
    Store(Vec<u8>),
    /// Count a failure of the body (`max_attempts`), after the rollback:
    /// in a short transaction of its own at top level, in the caller's
    /// transaction inside one. The text is the failure's.
    Count(Scope, String),
    /// Commit what `Begin` opened.
    Commit(Scope),
    /// Roll back what `Begin` opened.
    Rollback,
    /// Wait before the next attempt.
    Sleep(Duration),
}

/// What a step did.
pub(crate) enum Event<T, E> {
    Begun(Result<Scope, (Scope, Error)>),
    Claimed(Result<Claimed, Error>),
    /// The shape check: `Err` refuses the tables (or could not read them).
    ShapeChecked(Result<(), InboxError>),
    /// The replay's read: a verdict found before any transaction
    /// (`Claimed::Duplicate` with the stored result, or `Claimed::Reused`),
    /// or `None`, the claim's path.
    LookedUp(Result<Option<Claimed>, Error>),
    Stored(Result<(), Error>),
    #[cfg_attr(not(feature = "async"), allow(dead_code))] // the async driver's
    Fenced(Result<Fenced, Error>),
    /// The failure was counted (a failed count is logged, not returned:
    /// the body's error is what the caller gets).
    Counted,
    Ran {
        result: Result<T, E>,
        /// The statements of the body that failed, oldest first.
        failed: Vec<FailedStatement>,
        /// Whether the transaction is still open, asked (see [`wants_probe`])
        /// when the body returned `Ok` after statements of its own failed,
        /// where the backend can tell; `Ok(None)` otherwise.
        open: Result<Option<bool>, Error>,
    },
    Committed(Result<(), Error>),
    RolledBack,
    Slept,
}

/// What a claim found (see `claim.rs`, which judges it).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// Something was claimed for the first time: run the body.
    New,
    /// Nothing to run; the value the first delivery stored, if the call
    /// asked for it and there is one.
    Duplicate(Option<Vec<u8>>),
    /// This key was applied before with a different fingerprint.
    Reused(String),
    /// This key's deliveries failed `failures` times, as many as
    /// `max_attempts` allows: the body does not run again.
    GaveUp { failures: u32, last_error: String },
}

/// How a call ended without an error.
#[derive(Debug, PartialEq, Eq)]
#[doc(hidden)]
pub enum Ended<T> {
    /// Applied and committed.
    Applied(T),
    /// Nothing to run, with the first delivery's stored value, if any.
    Duplicate(Option<Vec<u8>>),
}

/// The engine's answer to an event.
pub(crate) enum Next<T, E> {
    Do(Step),
    /// The outcome, or the handler's error.
    Done(Result<Ended<T>, E>),
}

/// Serializes a body's value for `store_result`.
pub(crate) type Encode<T> = fn(&T) -> Result<Vec<u8>, String>;

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
    /// The inbox refuses the call (a reused key, a value it cannot store):
    /// never retried.
    Refused(InboxError),
}

impl<E: From<InboxError> + From<Error>> Failure<E> {
    /// The error the handler returns when this failure is not retried.
    fn into_error(self) -> E {
        match self {
            Failure::Inbox(e) => InboxError::from(e).into(),
            Failure::Ignored(e) => InboxError::BodyIgnoredError(e).into(),
            Failure::Commit(e) => e.into(),
            Failure::Body { error, .. } => error,
            Failure::Refused(e) => e.into(),
        }
    }
}

enum State<T, E> {
    Beginning,
    Claiming,
    /// Checking the tables' shape before the first `Begin` (`None`), or
    /// after the claim, with what it found (its verdict still unused) or
    /// its failure (already rolled back).
    CheckingShape(Option<Result<Claimed, Failure<E>>>),
    /// Reading the key's stored result before the first `Begin`.
    LookingUp,
    /// Moving the stream position, then running the body (`None`), or
    /// committing the move of a duplicate (with its stored value).
    Fencing(Option<Option<Vec<u8>>>),
    Running,
    Storing(T),
    Committing(T),
    /// Committing the position a duplicate moved.
    CommittingDuplicate(Option<Vec<u8>>),
    /// Rolling back, then: a duplicate, or a failure to judge.
    RollingBack(Result<Option<Vec<u8>>, Failure<E>>),
    Sleeping,
    /// Counting a failure, then returning its error.
    Counting(E),
    Finished,
}

/// One handler call: the attempts, and the decision after each step.
pub(crate) struct Engine<'a, B, T, E, R> {
    consumer: &'a str,
    /// The message(s), for logs.
    what: &'a str,
    retries: u32,
    attempts: u32,
    /// How the body's errors are treated (see [`ErrorClass`]).
    classify: R,
    scope: Scope,
    state: State<T, E>,
    /// `store_result`: how the body's value is stored.
    encode: Option<Encode<T>>,
    /// `max_attempts`: failures are counted, described with this.
    count: Option<fn(&E) -> String>,
    backend: PhantomData<B>,
    telemetry: Telemetry,
    /// The outbox's enqueue count when the body started (`wake`).
    enqueues: u64,
    /// Whether the shape check ran in this call.
    shape_checked: bool,
    /// The bound on waiting for an in-flight claim of the same key, if
    /// the call set one: its running out is [`InboxError::InFlight`].
    wait: Option<Duration>,
    /// The stream position this call moves in its transaction (a Kafka
    /// runner's), reported when the call ends.
    fence: Option<Taken>,
    /// Whether the call reads its key's stored result before its first
    /// transaction ([`Step::Lookup`]).
    lookup: bool,
}

impl<'a, B, T, E, R> Engine<'a, B, T, E, R>
where
    B: InboxBackend,
    E: From<InboxError> + From<Error> + std::fmt::Debug,
    R: Fn(&E) -> ErrorClass<E>,
{
    /// A call that may rerun its transaction `retries` times; its first
    /// step is [`first_step`](Self::first_step).
    pub(crate) fn new(consumer: &'a str, what: &'a str, retries: u32, classify: R) -> Self {
        Engine {
            consumer,
            what,
            retries,
            attempts: 1,
            classify,
            scope: Scope::TopLevel,
            state: match B::CHECK_SHAPE_AFTER_CLAIM {
                true => State::Beginning,
                false => State::CheckingShape(None),
            },
            encode: None,
            count: None,
            backend: PhantomData,
            telemetry: Telemetry::start(consumer, what),
            enqueues: 0,
            shape_checked: false,
            wait: None,
            fence: None,
            lookup: false,
        }
    }

    /// Reads the key's stored result before the first transaction
    /// ([`Step::Lookup`]) when `on`; never for a call that moves a stream
    /// position (a duplicate moves it in a transaction).
    pub(crate) fn looking_up(mut self, on: bool) -> Self {
        self.lookup = on;
        self
    }

    /// Whether the first `Begin` is preceded by the replay's read.
    fn looks_up(&self) -> bool {
        self.lookup && self.fence.is_none()
    }

    /// Moves `fence`'s stream position in the call's transaction, and
    /// reports what became of it.
    #[cfg_attr(not(feature = "async"), allow(dead_code))] // taken by the async driver
    pub(crate) fn fencing(mut self, fence: Option<Taken>) -> Self {
        self.fence = fence;
        self
    }

    /// Reports the claim's wait running out under `wait` as
    /// [`InboxError::InFlight`], never retried (the driver set the bound).
    #[cfg_attr(not(feature = "async"), allow(dead_code))] // read by the async driver
    pub(crate) fn waiting(mut self, wait: Option<Duration>) -> Self {
        self.wait = wait;
        self
    }

    /// Stores the body's value with `encode` before the commit.
    pub(crate) fn storing(mut self, encode: Option<Encode<T>>) -> Self {
        self.encode = encode;
        self
    }

    /// Counts the body's failures (`max_attempts`), describing each with
    /// `describe`.
    pub(crate) fn counting(mut self, describe: Option<fn(&E) -> String>) -> Self {
        self.count = describe;
        self
    }

    /// Whether the call's failures are counted, and in which scope: what a
    /// driver needs to count a panic of the body.
    pub(crate) fn counted_scope(&self) -> Option<Scope> {
        self.count.map(|_| self.scope)
    }

    /// The call's span: drivers enter it while they drive the call.
    pub(crate) fn span(&self) -> &tracing::Span {
        self.telemetry.span()
    }

    /// The call's first step: the shape check, or (SQLite) the replay's
    /// read or `Begin`.
    pub(crate) fn first_step(&mut self) -> Step {
        match self.state {
            State::CheckingShape(None) => Step::CheckShape,
            _ if self.looks_up() => {
                self.state = State::LookingUp;
                Step::Lookup
            }
            _ => Step::Begin,
        }
    }

    pub(crate) fn next(&mut self, event: Event<T, E>) -> Next<T, E> {
        let next = self.advance(event);
        if let Next::Done(result) = &next {
            self.report(result);
        }
        next
    }

    /// The span's fields, the event and the metrics of a finished call.
    fn report(&self, result: &Result<Ended<T>, E>) {
        let outcome = match result {
            Ok(Ended::Applied(_)) => Outcome::Applied,
            Ok(Ended::Duplicate(_)) => Outcome::Duplicate,
            Err(e) => return self.failed(e),
        };
        self.telemetry
            .finished(self.consumer, self.what, outcome, self.attempts);
    }

    /// [`report`](Self::report) of a call that failed with `error`.
    fn failed(&self, error: &E) {
        let outcome = Outcome::Error(format!("{error:?}"));
        self.telemetry
            .finished(self.consumer, self.what, outcome, self.attempts);
    }

    fn advance(&mut self, event: Event<T, E>) -> Next<T, E> {
        let state = std::mem::replace(&mut self.state, State::Finished);
        match (state, event) {
            (State::Beginning, Event::Begun(begun)) => match begun {
                Ok(scope) => {
                    self.scope = scope;
                    self.move_to(State::Claiming, Step::Claim)
                }
                // Nothing was opened: judge the failure at once.
                Err((scope, e)) => {
                    self.scope = scope;
                    let failure = self.inbox_failure(e);
                    self.judge(failure)
                }
            },
            (State::Claiming, Event::Claimed(claimed)) => {
                let claimed = claimed.map_err(|e| self.inbox_failure(e));
                match (self.shape_checked, claimed) {
                    (false, Ok(claimed)) => {
                        self.move_to(State::CheckingShape(Some(Ok(claimed))), Step::CheckShape)
                    }
                    (true, Ok(claimed)) => self.claimed(claimed),
                    // Rolled back first; the check follows (`RolledBack`).
                    (_, Err(failure)) => {
                        self.move_to(State::RollingBack(Err(failure)), Step::Rollback)
                    }
                }
            }
            (State::CheckingShape(pending), Event::ShapeChecked(checked)) => {
                self.shape_checked = true;
                match (checked, pending) {
                    (Ok(()), None) if self.looks_up() => {
                        self.move_to(State::LookingUp, Step::Lookup)
                    }
                    (Ok(()), None) => self.move_to(State::Beginning, Step::Begin),
                    (Ok(()), Some(Ok(claimed))) => self.claimed(claimed),
                    (Ok(()), Some(Err(failure))) => self.judge(failure),
                    // The claim's verdict is not used: a table of that
                    // shape cannot be trusted to give it.
                    (Err(refused), Some(Ok(_))) => self.move_to(
                        State::RollingBack(Err(Failure::Refused(refused))),
                        Step::Rollback,
                    ),
                    // Nothing ran, or the claim that failed on a wrong
                    // table (rolled back) fails for the table's reason.
                    (Err(refused), None | Some(Err(_))) => Next::Done(Err(refused.into())),
                }
            }
            (State::LookingUp, Event::LookedUp(found)) => match found {
                Ok(None) => self.move_to(State::Beginning, Step::Begin),
                Ok(Some(Claimed::Duplicate(stored))) => Next::Done(Ok(Ended::Duplicate(stored))),
                Ok(Some(Claimed::Reused(key))) => Next::Done(Err(InboxError::KeyReused {
                    consumer: self.consumer.to_owned(),
                    key,
                }
                .into())),
                Ok(Some(other)) => unreachable!("the replay's read found {other:?}"),
                // Nothing was opened: judged like a failed begin.
                Err(e) => {
                    let failure = self.inbox_failure(e);
                    self.judge(failure)
                }
            },
            (
                State::Running,
                Event::Ran {
                    result,
                    failed,
                    open,
                },
            ) => {
                let mut failed = failed.iter().map(FailedStatement::to_error);
                // A guard refused a statement of the body (an enqueue, or
                // the body's own statement run under a guarded name): the
                // inbox's refusal, whatever the body returned (it may have
                // swallowed it), never the body's failure; nothing is
                // committed of a transaction a proxy mixed up.
                if let Some(refused) = failed
                    .clone()
                    .find(|e| crate::backend::errors::refusal(e).is_some())
                {
                    return self.move_to(
                        State::RollingBack(Err(Failure::Refused(InboxError::from(refused)))),
                        Step::Rollback,
                    );
                }
                match result {
                    Ok(value) => match failure_that_ended_it::<B>(open, failed) {
                        // The state could not be read: nothing is committed.
                        Err(unknown) => self.move_to(
                            State::RollingBack(Err(Failure::Inbox(unknown))),
                            Step::Rollback,
                        ),
                        // The server already rolled the transaction back (and
                        // the inbox row with it): committing would report a
                        // false Applied.
                        Ok(Some(ended)) => self.move_to(
                            State::RollingBack(Err(Failure::Ignored(ended))),
                            Step::Rollback,
                        ),
                        Ok(None) => match self.encode.map(|encode| encode(&value)) {
                            None => {
                                self.move_to(State::Committing(value), Step::Commit(self.scope))
                            }
                            Some(Ok(bytes)) => {
                                self.move_to(State::Storing(value), Step::Store(bytes))
                            }
                            Some(Err(reason)) => {
                                let refused = InboxError::ResultNotStored {
                                    consumer: self.consumer.into(),
                                    key: self.what.into(),
                                    reason: reason.into(),
                                };
                                self.move_to(
                                    State::RollingBack(Err(Failure::Refused(refused))),
                                    Step::Rollback,
                                )
                            }
                        },
                    },
                    Err(error) => {
                        let transient = failed.find(B::is_transient);
                        self.move_to(
                            State::RollingBack(Err(Failure::Body { error, transient })),
                            Step::Rollback,
                        )
                    }
                }
            }
            (State::Storing(value), Event::Stored(stored)) => match stored {
                Ok(()) => self.move_to(State::Committing(value), Step::Commit(self.scope)),
                Err(e) => self.move_to(State::RollingBack(Err(Failure::Inbox(e))), Step::Rollback),
            },
            (State::Committing(value), Event::Committed(committed)) => match committed {
                Ok(()) => {
                    // Inside the caller's transaction nothing is visible
                    // yet: its relays find the rows by polling.
                    if self.scope == Scope::TopLevel {
                        crate::wake::after_commit(self.enqueues);
                    }
                    self.report_fence();
                    Next::Done(Ok(Ended::Applied(value)))
                }
                // The failed commit rolled back (the backend's commit does).
                Err(e) if B::is_aborted_commit(&e) => {
                    let aborted = crate::backend::errors::without_abort_mark(e);
                    self.judge(Failure::Ignored(aborted))
                }
                Err(e) if B::is_transient(&e) => self.judge(Failure::Inbox(e)),
                Err(e) => self.judge(Failure::Commit(e)),
            },
            (State::Fencing(duplicate), Event::Fenced(fenced)) => match (fenced, duplicate) {
                (Ok(Fenced::Moved), None) => self.move_to(State::Running, Step::Body),
                (Ok(Fenced::Moved), Some(stored)) => {
                    self.move_to(State::CommittingDuplicate(stored), Step::Commit(self.scope))
                }
                // Nothing is applied past the fence: the call is a duplicate.
                (Ok(Fenced::Refused { index, stored }), _) => {
                    if let Some(fence) = &self.fence {
                        fence.refused(index, stored);
                    }
                    self.move_to(State::RollingBack(Ok(None)), Step::Rollback)
                }
                (Err(e), _) => {
                    self.move_to(State::RollingBack(Err(Failure::Inbox(e))), Step::Rollback)
                }
            },
            (State::CommittingDuplicate(stored), Event::Committed(committed)) => match committed {
                Ok(()) => {
                    self.report_fence();
                    Next::Done(Ok(Ended::Duplicate(stored)))
                }
                Err(e) => self.judge(Failure::Inbox(e)),
            },
            (State::RollingBack(ending), Event::RolledBack) => match ending {
                Ok(stored) => Next::Done(Ok(Ended::Duplicate(stored))),
                // The claim failed before the shape check: check now, so
                // that a wrong table is named rather than its symptom.
                Err(failure) if !self.shape_checked => {
                    self.move_to(State::CheckingShape(Some(Err(failure))), Step::CheckShape)
                }
                Err(failure) => self.judge(failure),
            },
            (State::Counting(error), Event::Counted) => Next::Done(Err(error)),
            (State::Sleeping, Event::Slept) => {
                self.attempts += 1;
                self.move_to(State::Beginning, Step::Begin)
            }
            _ => unreachable!("a driver reported an event for another step"),
        }
    }

    /// What the claim found, once the tables can be trusted to say it.
    fn claimed(&mut self, claimed: Claimed) -> Next<T, E> {
        let fence = self.fence.as_ref().map(|fence| fence.positions().to_vec());
        match (claimed, fence) {
            (Claimed::New, fence) => {
                self.enqueues = crate::wake::mark();
                match fence {
                    None => self.move_to(State::Running, Step::Body),
                    Some(position) => self.move_to(State::Fencing(None), Step::Fence(position)),
                }
            }
            // Nothing was written; ending the transaction either way is the same.
            (Claimed::Duplicate(stored), None) => {
                self.move_to(State::RollingBack(Ok(stored)), Step::Rollback)
            }
            // A duplicate settles like a success: the position moves past it.
            (Claimed::Duplicate(stored), Some(position)) => {
                self.move_to(State::Fencing(Some(stored)), Step::Fence(position))
            }
            (
                Claimed::GaveUp {
                    failures,
                    last_error,
                },
                _,
            ) => {
                let refused = InboxError::AttemptsExhausted {
                    consumer: self.consumer.into(),
                    key: self.what.into(),
                    failures,
                    last_error: last_error.into(),
                };
                self.move_to(
                    State::RollingBack(Err(Failure::Refused(refused))),
                    Step::Rollback,
                )
            }
            (Claimed::Reused(key), _) => {
                let refused = InboxError::KeyReused {
                    consumer: self.consumer.to_owned(),
                    key,
                };
                self.move_to(
                    State::RollingBack(Err(Failure::Refused(refused))),
                    Step::Rollback,
                )
            }
        }
    }

    /// A failure of the begin or the claim: the wait bound running out
    /// is a refusal (another call holds the key), any other an error of
    /// the inbox's own.
    fn inbox_failure(&self, error: Error) -> Failure<E> {
        match self.wait {
            Some(wait) if B::is_wait_timeout(&error) => Failure::Refused(InboxError::InFlight {
                consumer: self.consumer.into(),
                key: self.what.into(),
                wait,
            }),
            _ => Failure::Inbox(error),
        }
    }

    /// Reports that the stream positions this call moved are written.
    fn report_fence(&self) {
        if let Some(fence) = &self.fence {
            fence.written();
        }
    }

    /// Moves to `state` and asks the driver to perform `step`.
    fn move_to(&mut self, state: State<T, E>, step: Step) -> Next<T, E> {
        self.state = state;
        Next::Do(step)
    }

    /// Retry the transaction, or give the handler its error.
    fn judge(&mut self, failure: Failure<E>) -> Next<T, E> {
        // A guard's refusal is the inbox's, wherever it surfaced (the
        // claim, the store, the commit): never retried, never counted.
        let failure = match failure {
            Failure::Inbox(e) | Failure::Commit(e) | Failure::Ignored(e)
                if crate::backend::errors::refusal(&e).is_some() =>
            {
                Failure::Refused(InboxError::from(e))
            }
            other => other,
        };
        let (retryable, class) = match &failure {
            Failure::Inbox(e) => (B::is_transient(e), None),
            Failure::Commit(_) | Failure::Ignored(_) | Failure::Refused(_) => (false, None),
            Failure::Body { error, transient } => {
                let class = (self.classify)(error);
                let retryable = class.is_retryable().unwrap_or(transient.is_some());
                (retryable, Some(class))
            }
        };
        // Inside the caller's transaction a rerun cannot help: the caller's
        // work is lost too.
        if !retryable || self.scope == Scope::Savepoint {
            let counted = self.count_text(&failure);
            return self.give_up(failure.into_error(), counted);
        }
        let cause = match &failure {
            Failure::Inbox(e)
            | Failure::Body {
                transient: Some(e), ..
            } => e.to_string(),
            _ => "the body's error type says it is retryable".to_string(),
        };
        let (consumer, key, attempts) = (self.consumer, self.what, self.attempts);
        if attempts > self.retries {
            tracing::debug!(target: crate::target::TARGET, consumer, key, attempts, error = %cause, "diesel-inbox: giving up on a transient error");
            let counted = self.count_text(&failure);
            let error = match (failure, class) {
                (Failure::Inbox(source), _) => {
                    InboxError::RetriesExhausted { attempts, source }.into()
                }
                (Failure::Body { error, .. }, Some(class)) => class.exhausted(error, attempts),
                (other, _) => other.into_error(),
            };
            return self.give_up(error, counted);
        }
        tracing::debug!(target: crate::target::TARGET, consumer, key, attempt = attempts, error = %cause, "diesel-inbox: transient error, retrying");
        self.telemetry.retried();
        self.move_to(
            State::Sleeping,
            Step::Sleep(crate::backoff::rerun(attempts)),
        )
    }
}

/// Whether the body's transaction ended under it although the body
/// returned `Ok` (a statement of its own failed and the server rolled the
/// transaction back): the failed statement to report, if so. `Err`: the
/// state could not be read.
///
/// A failed statement whose kind says it ended the transaction (sync
/// diesel's MySQL deadlock, `SerializationFailure`) ended it, whatever the
/// server's state says now (a session without autocommit opens a new
/// transaction at the next statement). Otherwise the state the server
/// reports (`open`) decides where there is one, and the backend judges the
/// failed statements' messages where there is not.
fn failure_that_ended_it<B: InboxBackend>(
    open: Result<Option<bool>, Error>,
    failed: impl Iterator<Item = Error>,
) -> Result<Option<Error>, Error> {
    let open = open?;
    let mut failed: Vec<Error> = failed.collect();
    let by_kind = |e: &Error| {
        matches!(
            e,
            Error::DatabaseError(diesel::result::DatabaseErrorKind::SerializationFailure, _)
        ) && B::ends_transaction(e)
    };
    let by_message = failed.iter().position(B::ends_transaction);
    let which = match open {
        Some(true) => failed.iter().position(by_kind),
        // The statement that ended it: the one its message names, else
        // the first that failed (the later ones ran outside it).
        Some(false) => Some(by_message.unwrap_or(0)),
        None => by_message,
    };
    Ok(which
        .filter(|&i| i < failed.len())
        .map(|i| failed.swap_remove(i)))
}

/// Asks whether the body's transaction is still open (the backend's
/// [`OPEN_PROBE`](crate::backend::Internals::OPEN_PROBE)), only when the body returned `Ok`
/// after statements of its own failed: the drivers' input to
/// [`Event::Ran`].
pub(crate) fn wants_probe<T, E>(result: &Result<T, E>, failed: &[FailedStatement]) -> bool {
    result.is_ok() && !failed.is_empty()
}

impl<B, T, E, R> Engine<'_, B, T, E, R> {
    /// What a failure the body caused counts as (`max_attempts`), if it
    /// counts: not the inbox's own failures, nor its refusals.
    fn count_text(&self, failure: &Failure<E>) -> Option<String> {
        let describe = self.count?;
        match failure {
            Failure::Body { error, .. } => Some(describe(error)),
            Failure::Commit(e) => Some(format!("the commit failed: {e}")),
            Failure::Ignored(e) => {
                Some(format!("the body returned Ok over a failed statement: {e}"))
            }
            Failure::Inbox(_) | Failure::Refused(_) => None,
        }
    }

    /// Return `error`, after counting the failure when it counts.
    fn give_up(&mut self, error: E, counted: Option<String>) -> Next<T, E> {
        match counted {
            None => Next::Done(Err(error)),
            Some(text) => {
                self.state = State::Counting(error);
                Next::Do(Step::Count(self.scope, text))
            }
        }
    }
}
#[cfg(all(test, feature = "sqlite"))]
mod tests;
