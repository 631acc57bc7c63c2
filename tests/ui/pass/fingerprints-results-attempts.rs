//! Every combination of the options compiles, with the types a user would
//! write: bytes and `Serialize` fingerprints, stored results, attempt limits.
use diesel::prelude::*;
use diesel_inbox::{idempotent, Batch, Processed, Stored};

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    total: i64,
}

#[derive(serde::Serialize)]
struct Order {
    id: String,
    body: Vec<u8>,
    lines: Vec<(String, u32)>,
}

#[idempotent(key = "order.id", fingerprint = "order.body")]
fn by_bytes(conn: &mut SqliteConnection, order: &Order) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(key = "order.id", fingerprint = "order.lines")]
fn by_serialize(conn: &mut SqliteConnection, order: &Order) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(
    key = "order.id",
    fingerprint = "order",
    store_result,
    max_attempts = 5
)]
fn everything(conn: &mut SqliteConnection, order: Order) -> QueryResult<Receipt> {
    let _ = conn;
    Ok(Receipt {
        total: order.lines.len() as i64,
    })
}

#[idempotent(key = "id", store_result, retries = 0)]
fn once(conn: &mut SqliteConnection, id: i64) -> QueryResult<String> {
    let _ = conn;
    Ok(id.to_string())
}

#[idempotent(
    batch = "orders",
    key = "|o| o.id.as_str()",
    fingerprint = "|o| &o.body"
)]
fn batch_of_orders(conn: &mut SqliteConnection, orders: &[Order]) -> QueryResult<usize> {
    let _ = conn;
    Ok(orders.len())
}

pub fn main() {
    let mut conn = SqliteConnection::establish(":memory:").expect("sqlite");
    diesel_inbox::migrate(&mut conn).expect("migrate");
    let order = || Order {
        id: "o-1".into(),
        body: b"x".to_vec(),
        lines: vec![("a".into(), 1)],
    };
    let _: QueryResult<Processed<()>> = by_bytes(&mut conn, &order());
    let _: QueryResult<Processed<()>> = by_serialize(&mut conn, &order());
    let stored: QueryResult<Stored<Receipt>> = everything(&mut conn, order());
    assert!(stored.expect("applied").is_applied());
    let _: QueryResult<Stored<String>> = once(&mut conn, 1);
    let _: QueryResult<Batch<usize>> = batch_of_orders(&mut conn, &[order()]);
}
