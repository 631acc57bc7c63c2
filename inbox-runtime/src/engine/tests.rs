//! The engine's decisions, step by step, without a database.

use super::*;
use diesel::sqlite::Sqlite;

type Outcome = Result<Ended<i32>, InboxError>;
type Classify = fn(&InboxError) -> ErrorClass<InboxError>;
type TestEngine<'a> = Engine<'a, Sqlite, i32, InboxError, Classify>;

fn engine<'a>() -> TestEngine<'a> {
    Engine::new("consumer", "key", 3, |_| ErrorClass::permanent())
}

/// Feeds `events` and returns the steps asked for and the outcome.
fn run(
    engine: TestEngine<'_>,
    events: Vec<Event<i32, InboxError>>,
) -> (Vec<Step>, Option<Outcome>) {
    run_on(engine, events)
}

/// [`run`], on any backend.
fn run_on<B: InboxBackend>(
    mut engine: Engine<'_, B, i32, InboxError, Classify>,
    events: Vec<Event<i32, InboxError>>,
) -> (Vec<Step>, Option<Outcome>) {
    let mut steps = Vec::new();
    for event in events {
        match engine.next(event) {
            Next::Do(step) => steps.push(step),
            Next::Done(result) => return (steps, Some(result)),
        }
    }
    (steps, None)
}

fn ran(result: Result<i32, InboxError>) -> Event<i32, InboxError> {
    Event::Ran {
        result,
        failed: Vec::new(),
        open: Ok(None),
    }
}

#[test]
fn a_reused_key_rolls_back_and_is_refused_once() {
    let (steps, outcome) = run(
        engine(),
        vec![
            Event::Begun(Ok(Scope::TopLevel)),
            Event::Claimed(Ok(Claimed::Reused("key".into()))),
            Event::ShapeChecked(Ok(())),
            Event::RolledBack,
        ],
    );
    assert_eq!(steps, vec![Step::Claim, Step::CheckShape, Step::Rollback]);
    assert!(matches!(outcome, Some(Err(InboxError::KeyReused { ref key, .. })) if key == "key"));
}

#[test]
fn a_stored_value_is_written_before_the_commit() {
    let engine = engine().storing(Some(|v: &i32| Ok(v.to_string().into_bytes())));
    let (steps, outcome) = run(
        engine,
        vec![
            Event::Begun(Ok(Scope::TopLevel)),
            Event::Claimed(Ok(Claimed::New)),
            Event::ShapeChecked(Ok(())),
            ran(Ok(7)),
            Event::Stored(Ok(())),
            Event::Committed(Ok(())),
        ],
    );
    assert_eq!(
        steps,
        vec![
            Step::Claim,
            Step::CheckShape,
            Step::Body,
            Step::Store(b"7".to_vec()),
            Step::Commit(Scope::TopLevel)
        ]
    );
    assert_eq!(outcome.map(|o| o.ok()), Some(Some(Ended::Applied(7))));
}

#[test]
fn a_counted_failure_is_counted_after_the_rollback() {
    let engine = engine().counting(Some(|e: &InboxError| e.to_string()));
    let (steps, outcome) = run(
        engine,
        vec![
            Event::Begun(Ok(Scope::TopLevel)),
            Event::Claimed(Ok(Claimed::New)),
            Event::ShapeChecked(Ok(())),
            ran(Err(InboxError::InvalidArgument("rejected"))),
            Event::RolledBack,
            Event::Counted,
        ],
    );
    assert_eq!(
        steps,
        vec![
            Step::Claim,
            Step::CheckShape,
            Step::Body,
            Step::Rollback,
            Step::Count(Scope::TopLevel, "invalid argument: rejected".into())
        ]
    );
    assert!(matches!(
        outcome,
        Some(Err(InboxError::InvalidArgument("rejected")))
    ));
}

#[test]
fn a_key_given_up_on_is_not_counted_again() {
    let engine = engine().counting(Some(|e: &InboxError| e.to_string()));
    let (steps, outcome) = run(
        engine,
        vec![
            Event::Begun(Ok(Scope::TopLevel)),
            Event::Claimed(Ok(Claimed::GaveUp {
                failures: 3,
                last_error: "boom".into(),
            })),
            Event::ShapeChecked(Ok(())),
            Event::RolledBack,
        ],
    );
    assert_eq!(steps, vec![Step::Claim, Step::CheckShape, Step::Rollback]);
    assert!(matches!(
        outcome,
        Some(Err(InboxError::AttemptsExhausted { failures: 3, .. }))
    ));
}

fn wrong_table() -> InboxError {
    InboxError::IncompatibleTable(Vec::new())
}

#[test]
fn the_shape_is_checked_once_after_the_claims_write() {
    let (steps, outcome) = run(
        engine(),
        vec![
            Event::Begun(Ok(Scope::Savepoint)),
            Event::Claimed(Ok(Claimed::New)),
            Event::ShapeChecked(Err(wrong_table())),
            Event::RolledBack,
        ],
    );
    assert_eq!(steps, vec![Step::Claim, Step::CheckShape, Step::Rollback]);
    assert!(matches!(
        outcome,
        Some(Err(InboxError::IncompatibleTable(_)))
    ));
}

#[test]
fn a_claim_that_failed_on_a_wrong_table_is_refused_for_the_table() {
    let failed = Error::DatabaseError(
        diesel::result::DatabaseErrorKind::NotNullViolation,
        Box::new("NOT NULL constraint failed: inbox_messages.note".to_string()),
    );
    let (steps, outcome) = run(
        engine(),
        vec![
            Event::Begun(Ok(Scope::TopLevel)),
            Event::Claimed(Err(failed)),
            Event::RolledBack,
            Event::ShapeChecked(Err(wrong_table())),
        ],
    );
    assert_eq!(steps, vec![Step::Claim, Step::Rollback, Step::CheckShape]);
    assert!(matches!(
        outcome,
        Some(Err(InboxError::IncompatibleTable(_)))
    ));
}

#[test]
fn a_retried_call_checks_the_shape_once() {
    let busy = Error::DatabaseError(
        diesel::result::DatabaseErrorKind::Unknown,
        Box::new("database is locked".to_string()),
    );
    let (steps, outcome) = run(
        engine(),
        vec![
            Event::Begun(Ok(Scope::TopLevel)),
            Event::Claimed(Err(busy)),
            Event::RolledBack,
            Event::ShapeChecked(Ok(())),
            Event::Slept,
            Event::Begun(Ok(Scope::TopLevel)),
            Event::Claimed(Ok(Claimed::Duplicate(None))),
            Event::RolledBack,
        ],
    );
    assert_eq!(steps[..3], [Step::Claim, Step::Rollback, Step::CheckShape]);
    assert!(matches!(steps[3], Step::Sleep(_)));
    assert_eq!(steps[4..], [Step::Begin, Step::Claim, Step::Rollback]);
    assert!(matches!(outcome, Some(Ok(Ended::Duplicate(None)))));
}

#[test]
fn a_wait_that_runs_out_is_in_flight_and_not_retried() {
    let busy = || {
        Error::DatabaseError(
            diesel::result::DatabaseErrorKind::Unknown,
            Box::new("database is locked".to_string()),
        )
    };
    let wait = Duration::from_millis(250);
    // At the begin (SQLite's wait) and at the claim: refused at once.
    let (steps, outcome) = run(
        engine().waiting(Some(wait)),
        vec![Event::Begun(Err((Scope::TopLevel, busy())))],
    );
    assert!(steps.is_empty());
    assert!(
        matches!(&outcome, Some(Err(InboxError::InFlight { wait: w, .. })) if *w == wait),
        "{outcome:?}"
    );
    let (steps, outcome) = run(
        engine().waiting(Some(wait)),
        vec![
            Event::Begun(Ok(Scope::TopLevel)),
            Event::Claimed(Err(busy())),
            Event::RolledBack,
            Event::ShapeChecked(Ok(())),
        ],
    );
    assert_eq!(steps, vec![Step::Claim, Step::Rollback, Step::CheckShape]);
    assert!(matches!(outcome, Some(Err(InboxError::InFlight { .. }))));
    // Without a bound the same error is transient: retried.
    let (steps, _) = run(engine(), vec![Event::Begun(Err((Scope::TopLevel, busy())))]);
    assert!(matches!(steps[..], [Step::Sleep(_)]));
}

/// MySQL: after a body that returned `Ok` with failed statements, the
/// transaction's state as the server reports it decides, whatever the
/// failed statements' messages say; the messages decide only where the
/// server cannot tell (MySQL, which has no `@@in_transaction`).
#[cfg(feature = "mysql")]
#[test]
fn the_transaction_state_decides_over_the_messages() {
    use diesel::mysql::Mysql;
    let deadlock = "Deadlock found when trying to get lock; try restarting transaction";
    let german = "Beim Versuch, eine Sperre anzufordern, ist ein Deadlock aufgetreten";
    use diesel::result::DatabaseErrorKind::{SerializationFailure, Unknown};
    let cases = [
        // (kind, message, the server's answer, committed)
        (Unknown, german, Ok(Some(false)), false),
        // A raised 1213 that left the transaction open (`SIGNAL`).
        (Unknown, deadlock, Ok(Some(true)), true),
        (Unknown, deadlock, Ok(None), false),
        (Unknown, german, Ok(None), true),
        (Unknown, german, Err(Error::NotFound), false),
        // Sync diesel's deadlock ended it, whatever the state says now (a
        // session without autocommit is in a new transaction).
        (SerializationFailure, german, Ok(Some(true)), false),
    ];
    for (kind, message, open, committed) in cases {
        let engine: Engine<'_, Mysql, i32, InboxError, Classify> =
            Engine::new("consumer", "key", 0, |_| ErrorClass::permanent());
        let (steps, outcome) = run_on(
            engine,
            vec![
                // MySQL checks the shape before its first claim.
                Event::ShapeChecked(Ok(())),
                Event::Begun(Ok(Scope::TopLevel)),
                Event::Claimed(Ok(Claimed::New)),
                Event::Ran {
                    result: Ok(7),
                    failed: vec![FailedStatement::with_message(kind, message)],
                    open,
                },
                match committed {
                    true => Event::Committed(Ok(())),
                    false => Event::RolledBack,
                },
            ],
        );
        let last = steps.last();
        match committed {
            true => {
                assert_eq!(last, Some(&Step::Commit(Scope::TopLevel)), "{message}");
                assert_eq!(outcome.map(|o| o.ok()), Some(Some(Ended::Applied(7))));
            }
            false => {
                assert_eq!(last, Some(&Step::Rollback), "{message}");
                assert!(matches!(outcome, Some(Err(_))), "{message}: {outcome:?}");
            }
        }
    }
}
