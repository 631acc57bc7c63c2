//! Consumer scopes cannot be shared by accident: two handlers with the same
//! consumer name are refused (naming both) unless every one of them says
//! `shared`, and `consumers()` lists every handler of the program. The
//! registry is the same for every backend; these tests use SQLite.
#![cfg(feature = "sqlite")]

mod support;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_inbox::{idempotent, inbox_messages, InboxError, Processed};

/// An event two teams consume, each into its own business table row.
struct Event {
    id: String,
    run: String,
}

fn open() -> SqliteConnection {
    let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
    diesel_inbox::migrate(&mut conn).expect("migrate");
    conn.batch_execute(support::EFFECTS_DDL)
        .expect("effects table");
    conn
}

fn write(conn: &mut SqliteConnection, event: &Event, team: &str) -> QueryResult<usize> {
    use support::inbox_test_effects as effects;
    diesel::insert_into(effects::table)
        .values((
            effects::run_id.eq(&event.run),
            effects::message_key.eq(format!("{team}/{}", event.id)),
            effects::amount.eq(1_i64),
        ))
        .execute(conn)
}

fn rows(conn: &mut SqliteConnection) -> (i64, i64) {
    let effects: i64 = support::inbox_test_effects::table
        .count()
        .get_result(conn)
        .expect("count effects");
    let inbox: i64 = inbox_messages::table
        .count()
        .get_result(conn)
        .expect("count inbox");
    (effects, inbox)
}

// Two modules, one function name, no `consumer`: the default scope
// (`handle`) would be shared by accident.
mod billing {
    use super::*;

    #[idempotent(key = "evt.id")]
    pub fn handle(conn: &mut SqliteConnection, evt: &Event) -> QueryResult<()> {
        write(conn, evt, "billing").map(drop)
    }
}

mod shipping {
    use super::*;

    #[idempotent(key = "evt.id")]
    pub fn handle(conn: &mut SqliteConnection, evt: &Event) -> QueryResult<()> {
        write(conn, evt, "shipping").map(drop)
    }
}

fn conflict(result: QueryResult<Processed<()>>) -> (String, Vec<String>, String) {
    match result {
        Err(diesel::result::Error::QueryBuilderError(inner)) => {
            match inner.downcast_ref::<InboxError>() {
                Some(InboxError::ConsumerConflict { consumer, handlers }) => (
                    consumer.clone(),
                    handlers
                        .iter()
                        .map(|h| format!("{}@{}:{}", h.function(), h.file(), h.line()))
                        .collect(),
                    inner.to_string(),
                ),
                other => panic!("expected ConsumerConflict, got {other:?}"),
            }
        }
        other => panic!("expected ConsumerConflict, got {other:?}"),
    }
}

#[test]
fn same_named_functions_in_two_modules_are_refused_naming_both() {
    let mut conn = open();
    let evt = Event {
        id: "evt-1".into(),
        run: support::unique_run_id("modules"),
    };
    for result in [
        billing::handle(&mut conn, &evt),
        shipping::handle(&mut conn, &evt),
    ] {
        let (consumer, handlers, message) = conflict(result);
        assert_eq!(consumer, "handle");
        assert_eq!(handlers.len(), 2, "{handlers:?}");
        assert!(handlers[0].starts_with("consumers::billing::handle@tests/consumers.rs:"));
        assert!(handlers[1].starts_with("consumers::shipping::handle@tests/consumers.rs:"));
        assert!(message.contains("`consumer = \"...\"`"), "{message}");
        assert!(message.contains("`shared`"), "{message}");
    }
    // Neither ran, neither claimed.
    assert_eq!(rows(&mut conn), (0, 0));
}

trait Handler {
    fn on_event(&self, conn: &mut SqliteConnection, evt: &Event) -> QueryResult<Processed<()>>;
}

struct Audit;
struct Metrics;

impl Handler for Audit {
    #[idempotent(key = "evt.id")]
    fn on_event(&self, conn: &mut SqliteConnection, evt: &Event) -> QueryResult<()> {
        write(conn, evt, "audit").map(drop)
    }
}

impl Handler for Metrics {
    #[idempotent(key = "evt.id")]
    fn on_event(&self, conn: &mut SqliteConnection, evt: &Event) -> QueryResult<()> {
        write(conn, evt, "metrics").map(drop)
    }
}

#[test]
fn two_trait_impls_of_one_method_are_refused() {
    let mut conn = open();
    let evt = Event {
        id: "evt-2".into(),
        run: support::unique_run_id("impls"),
    };
    let handlers: [&dyn Handler; 2] = [&Audit, &Metrics];
    for handler in handlers {
        let (consumer, found, _) = conflict(handler.on_event(&mut conn, &evt));
        // Methods are named by their module and name; the lines tell them apart.
        assert_eq!(consumer, "on_event");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|f| f.starts_with("consumers::on_event@")));
        assert_ne!(found[0], found[1]);
    }
    assert_eq!(rows(&mut conn), (0, 0));
}

// Deliberate sharing: both say `shared`. A message applied by one is a
// duplicate for the other (that is what sharing a scope means).
#[idempotent(key = "evt.id", consumer = "ledger", shared)]
fn ledger_from_orders(conn: &mut SqliteConnection, evt: &Event) -> QueryResult<()> {
    write(conn, evt, "ledger").map(drop)
}

#[idempotent(key = "evt.id", consumer = "ledger", shared)]
fn ledger_from_refunds(conn: &mut SqliteConnection, evt: &Event) -> QueryResult<()> {
    write(conn, evt, "ledger").map(drop)
}

#[test]
fn deliberate_sharing_is_accepted_and_deduplicates_across_the_handlers() {
    let mut conn = open();
    let evt = Event {
        id: "evt-3".into(),
        run: support::unique_run_id("shared"),
    };
    assert_eq!(
        ledger_from_orders(&mut conn, &evt).expect("first"),
        Processed::Applied(())
    );
    assert_eq!(
        ledger_from_refunds(&mut conn, &evt).expect("second"),
        Processed::Duplicate
    );
    assert_eq!(rows(&mut conn), (1, 1));
}

// Sharing declared on one side only is still an accident on the other.
#[idempotent(key = "evt.id", consumer = "mailer", shared)]
fn mailer_welcome(conn: &mut SqliteConnection, evt: &Event) -> QueryResult<()> {
    write(conn, evt, "welcome").map(drop)
}

#[idempotent(key = "evt.id", consumer = "mailer")]
fn mailer_receipt(conn: &mut SqliteConnection, evt: &Event) -> QueryResult<()> {
    write(conn, evt, "receipt").map(drop)
}

#[test]
fn sharing_must_be_declared_by_every_handler_of_the_scope() {
    let mut conn = open();
    let evt = Event {
        id: "evt-4".into(),
        run: support::unique_run_id("half"),
    };
    let (_, handlers, message) = conflict(mailer_welcome(&mut conn, &evt));
    assert_eq!(handlers.len(), 2);
    assert!(message.contains("consumers::mailer_welcome"), "{message}");
    assert!(message.contains(", shared)"), "{message}");
    conflict(mailer_receipt(&mut conn, &evt));
    assert_eq!(rows(&mut conn), (0, 0));
}

#[test]
fn consumers_lists_every_handler_with_its_location() {
    let listed: Vec<(String, String, bool)> = diesel_inbox::consumers()
        .iter()
        .map(|h| {
            assert_eq!(h.file(), "tests/consumers.rs");
            assert!(h.line() > 0);
            (
                h.consumer().to_string(),
                h.function().to_string(),
                h.is_shared(),
            )
        })
        .collect();
    let expected = [
        ("handle", "consumers::billing::handle", false),
        ("handle", "consumers::shipping::handle", false),
        ("on_event", "consumers::on_event", false),
        ("on_event", "consumers::on_event", false),
        ("ledger", "consumers::ledger_from_orders", true),
        ("ledger", "consumers::ledger_from_refunds", true),
        ("mailer", "consumers::mailer_welcome", true),
        ("mailer", "consumers::mailer_receipt", false),
    ];
    for (consumer, function, shared) in expected {
        assert!(
            listed
                .iter()
                .any(|(c, f, s)| c == consumer && f == function && *s == shared),
            "{consumer} {function} missing from {listed:#?}"
        );
    }
    assert_eq!(listed.len(), expected.len(), "{listed:#?}");
    // Sorted by consumer, then file and line.
    let consumers: Vec<&str> = listed.iter().map(|(c, _, _)| c.as_str()).collect();
    let mut sorted = consumers.clone();
    sorted.sort();
    assert_eq!(consumers, sorted);
}
