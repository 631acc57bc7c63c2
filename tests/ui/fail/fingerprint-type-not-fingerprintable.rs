use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Payload {
    amount: i64,
}

struct Msg {
    id: String,
    payload: Payload,
}

#[idempotent(key = "msg.id", fingerprint = "msg.payload")]
fn handle(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<i64> {
    let _ = conn;
    Ok(msg.payload.amount)
}

fn main() {}
