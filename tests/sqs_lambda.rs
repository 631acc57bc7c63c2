//! The Lambda adapter (`diesel_inbox::sqs::lambda`): an SQS event, as
//! Lambda delivers it (its JSON), through an `#[idempotent]` handler on a
//! SQLite file: a redelivered record is a `Duplicate` and succeeds, a
//! failing one is reported in `batch_item_failures` and leaves no row, and
//! from a FIFO queue the records after a failure fail too, unrun.
#![cfg(all(feature = "sqs", feature = "sqlite"))]

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_inbox::{idempotent, InboxError, Processed};
use std::sync::Mutex;

diesel::table! {
    lambda_orders (id) {
        id -> Integer,
        message_id -> Text,
        amount -> BigInt,
    }
}

#[idempotent(key = "id", consumer = "lambda-orders")]
fn apply(conn: &mut SqliteConnection, id: &str, body: &[u8]) -> Result<(), InboxError> {
    let amount: i64 = std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(InboxError::InvalidArgument("not an amount"))?;
    diesel::insert_into(lambda_orders::table)
        .values((
            lambda_orders::message_id.eq(id),
            lambda_orders::amount.eq(amount),
        ))
        .execute(conn)?;
    Ok(())
}

fn database() -> (SqliteConnection, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!(
        "diesel-inbox-lambda-{}-{:?}.db",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_file(&path);
    let mut conn = SqliteConnection::establish(&path.to_string_lossy()).expect("a database");
    diesel_inbox::migrate(&mut conn).expect("migrated");
    conn.batch_execute(
        "CREATE TABLE lambda_orders (id INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT NOT NULL, amount BIGINT NOT NULL)",
    )
    .expect("the business table");
    (conn, path)
}

/// An event as Lambda's SQS event source delivers it: `(message id,
/// body)` records from the queue `queue`.
fn sqs_event(queue: &str, records: &[(&str, &str)]) -> SqsEvent {
    let records: Vec<serde_json::Value> = records
        .iter()
        .map(|(id, body)| {
            serde_json::json!({
                "messageId": id,
                "receiptHandle": format!("receipt-{id}"),
                "body": body,
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1764979200000",
                    "SenderId": "AIDAEXAMPLE",
                    "ApproximateFirstReceiveTimestamp": "1764979200001"
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": format!("arn:aws:sqs:eu-west-1:123456789012:{queue}"),
                "awsRegion": "eu-west-1"
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({ "Records": records })).expect("an SQS event")
}

fn failed(response: &SqsBatchResponse) -> Vec<String> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect()
}

fn rows(conn: &mut SqliteConnection) -> Vec<String> {
    lambda_orders::table
        .select(lambda_orders::message_id)
        .order(lambda_orders::id)
        .load(conn)
        .expect("rows")
}

#[tokio::test]
async fn a_duplicate_a_failure_and_a_success_report_exactly_the_failure() {
    let (mut conn, path) = database();
    // m-1 was applied by an earlier invocation (Lambda delivers it again).
    assert!(matches!(
        apply(&mut conn, "m-1", b"10"),
        Ok(Processed::Applied(()))
    ));
    let conn = Mutex::new(conn);
    let event = sqs_event("orders", &[("m-1", "10"), ("m-2", "poison"), ("m-3", "30")]);
    let outcomes = Mutex::new(Vec::new());
    let response = diesel_inbox::sqs::lambda(&event, async |id: &str, body: &[u8]| {
        let outcome = apply(&mut conn.lock().unwrap(), id, body);
        outcomes
            .lock()
            .unwrap()
            .push((id.to_owned(), format!("{outcome:?}")));
        outcome
    })
    .await;
    assert_eq!(failed(&response), vec!["m-2".to_string()]);
    let outcomes = outcomes.into_inner().unwrap();
    assert_eq!(outcomes[0], ("m-1".into(), "Ok(Duplicate)".into()));
    assert!(outcomes[1].1.starts_with("Err("), "{outcomes:?}");
    assert_eq!(outcomes[2], ("m-3".into(), "Ok(Applied(()))".into()));
    let mut conn = conn.into_inner().unwrap();
    assert_eq!(rows(&mut conn), vec!["m-1", "m-3"]);
    // The failed record's next delivery, fixed, applies it once.
    let again = sqs_event("orders", &[("m-2", "20"), ("m-3", "30")]);
    let conn = Mutex::new(conn);
    let response = diesel_inbox::sqs::lambda(again, async |id: &str, body: &[u8]| {
        apply(&mut conn.lock().unwrap(), id, body)
    })
    .await;
    assert!(failed(&response).is_empty());
    assert_eq!(rows(&mut conn.lock().unwrap()), vec!["m-1", "m-3", "m-2"]);
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn from_a_fifo_queue_the_records_after_a_failure_fail_unrun() {
    let (conn, path) = database();
    let conn = Mutex::new(conn);
    let event = sqs_event(
        "orders.fifo",
        &[("f-1", "1"), ("f-2", "poison"), ("f-3", "3"), ("f-4", "4")],
    );
    let ran = Mutex::new(Vec::new());
    let response = diesel_inbox::sqs::lambda(&event, async |id: &str, body: &[u8]| {
        ran.lock().unwrap().push(id.to_owned());
        apply(&mut conn.lock().unwrap(), id, body)
    })
    .await;
    assert_eq!(failed(&response), vec!["f-2", "f-3", "f-4"]);
    assert_eq!(ran.into_inner().unwrap(), vec!["f-1", "f-2"]);
    assert_eq!(rows(&mut conn.lock().unwrap()), vec!["f-1"]);
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn the_id_can_come_from_a_message_attribute() {
    let (conn, path) = database();
    let conn = Mutex::new(conn);
    let mut records: serde_json::Value = serde_json::to_value(sqs_event(
        "orders",
        &[("sqs-a", "5"), ("sqs-b", "5"), ("sqs-c", "7")],
    ))
    .expect("json");
    // The relay sent order-1 twice (two SQS ids); order-2 has no attribute.
    for (i, id) in ["order-1", "order-1"].iter().enumerate() {
        records["Records"][i]["messageAttributes"] = serde_json::json!({
            "message-id": { "stringValue": id, "dataType": "String", "stringListValues": [], "binaryListValues": [] }
        });
    }
    let event: SqsEvent = serde_json::from_value(records).expect("an SQS event");
    let response = diesel_inbox::sqs::lambda_by_attribute(
        &event,
        "message-id",
        async |id: &str, body: &[u8]| apply(&mut conn.lock().unwrap(), id, body),
    )
    .await;
    // The record without the attribute fails (no id to deduplicate on).
    assert_eq!(failed(&response), vec!["sqs-c"]);
    assert_eq!(rows(&mut conn.lock().unwrap()), vec!["order-1"]);
    let _ = std::fs::remove_file(path);
}
