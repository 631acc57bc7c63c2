use diesel::prelude::*;
use diesel_inbox::idempotent;

pub struct Payload;

struct Msg {
    id: u64,
    payload: Payload,
}

#[idempotent(key = "msg.id")]
fn handle(conn: &mut SqliteConnection, msg: Msg) -> QueryResult<Payload> {
    let _ = conn;
    Ok(msg.payload)
}

fn main() {}
