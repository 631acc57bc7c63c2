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
