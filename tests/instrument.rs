//! `#[tracing::instrument]` with `#[idempotent]`: what each order records
//! (the README's "Tracing" section states these results).
#![cfg(feature = "sqlite")]

mod support;

use diesel::prelude::*;
use diesel_inbox::{idempotent, Processed};

fn open() -> SqliteConnection {
    let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
    diesel_inbox::migrate(&mut conn).expect("migrate");
    conn
}

// `instrument` above `idempotent`: it runs first and wraps the original
// body, which `idempotent` then puts inside the transaction. The span is
// entered per attempt, inside the transaction; `ret` records the body's `T`;
// a duplicate opens no span at all.
#[tracing::instrument(skip(conn), ret)]
#[idempotent(key = "id")]
fn instrumented_body(conn: &mut SqliteConnection, id: i64) -> QueryResult<i64> {
    let _ = conn;
    Ok(id * 10)
}

// `instrument` below `idempotent`: it wraps the rewritten handler. The span
// covers the claim, every retry and the commit; `ret` records the
// `Processed<T>`, duplicates included.
#[idempotent(key = "id")]
#[tracing::instrument(skip(conn), ret)]
fn instrumented_handler(conn: &mut SqliteConnection, id: i64) -> QueryResult<i64> {
    let _ = conn;
    Ok(id * 10)
}

fn returned(events: &[support::LoggedEvent], span: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.span == Some(span) && e.fields.starts_with("return="))
        .map(|e| e.fields.trim().to_string())
        .collect()
}

#[test]
fn instrument_above_idempotent_records_the_body_and_skips_duplicates() {
    let mut conn = open();
    let (outcomes, events) = support::events_during(|| {
        [
            instrumented_body(&mut conn, 1).expect("first"),
            instrumented_body(&mut conn, 1).expect("again"),
        ]
    });
    assert_eq!(outcomes, [Processed::Applied(10), Processed::Duplicate]);
    assert_eq!(
        returned(&events, "instrumented_body"),
        vec!["return=Ok(10)"]
    );
}

#[test]
fn instrument_below_idempotent_records_every_outcome() {
    let mut conn = open();
    let (outcomes, events) = support::events_during(|| {
        [
            instrumented_handler(&mut conn, 2).expect("first"),
            instrumented_handler(&mut conn, 2).expect("again"),
        ]
    });
    assert_eq!(outcomes, [Processed::Applied(20), Processed::Duplicate]);
    assert_eq!(
        returned(&events, "instrumented_handler"),
        vec!["return=Ok(Applied(20))", "return=Ok(Duplicate)"]
    );
}

/// A handler's connection keeps the instrumentation it had: with none
/// (diesel's no-op), the runtime installs its `ErrorObserver`; a user's
/// own, set on the connection (a closure without captures, zero-sized) or
/// by diesel's process-wide default, is left in place and sees the
/// handler's statements.
#[test]
fn a_users_instrumentation_is_kept_and_none_is_replaced_by_the_observer() {
    use diesel::connection::{Instrumentation, InstrumentationEvent};
    use diesel_inbox::{ErrorObserver, InboxError};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[idempotent(key = "id")]
    fn handle(conn: &mut SqliteConnection, id: i64) -> Result<(), InboxError> {
        let _ = (conn, id);
        Ok(())
    }
    fn observed(conn: &mut SqliteConnection) -> bool {
        let current: &mut dyn Instrumentation = conn.instrumentation();
        current.downcast_ref::<ErrorObserver>().is_some()
    }

    // None: the observer takes the no-op's place.
    let mut conn = open();
    assert!(!observed(&mut conn));
    assert!(handle(&mut conn, 1).expect("handled").is_applied());
    assert!(
        observed(&mut conn),
        "no observer after a handler on a connection without instrumentation"
    );

    // A user's zero-sized closure on the connection: kept, and it sees the
    // claim.
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    let mut conn = open();
    conn.set_instrumentation(|event: InstrumentationEvent<'_>| {
        if matches!(event, InstrumentationEvent::FinishQuery { .. }) {
            SEEN.fetch_add(1, Ordering::SeqCst);
        }
    });
    let before = SEEN.load(Ordering::SeqCst);
    assert!(handle(&mut conn, 2).expect("handled").is_applied());
    assert!(
        !observed(&mut conn),
        "the user's instrumentation was replaced"
    );
    assert!(
        SEEN.load(Ordering::SeqCst) > before,
        "the user's instrumentation saw nothing"
    );

    // diesel's default instrumentation (process-wide), counting: kept.
    static DEFAULTED: AtomicUsize = AtomicUsize::new(0);
    fn counting() -> Option<Box<dyn Instrumentation>> {
        Some(Box::new(|event: InstrumentationEvent<'_>| {
            if matches!(event, InstrumentationEvent::FinishQuery { .. }) {
                DEFAULTED.fetch_add(1, Ordering::SeqCst);
            }
        }))
    }
    diesel::connection::set_default_instrumentation(counting).expect("set the default");
    let mut conn = open();
    diesel::connection::set_default_instrumentation(|| None).expect("reset the default");
    let before = DEFAULTED.load(Ordering::SeqCst);
    assert!(handle(&mut conn, 3).expect("handled").is_applied());
    assert!(
        !observed(&mut conn),
        "the default instrumentation was replaced"
    );
    assert!(
        DEFAULTED.load(Ordering::SeqCst) > before,
        "the default instrumentation saw nothing"
    );
}
