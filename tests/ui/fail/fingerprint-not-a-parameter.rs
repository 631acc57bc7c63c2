use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
    body: Vec<u8>,
}

#[idempotent(key = "msg.id", fingerprint = "message.body")]
fn handle(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<usize> {
    let _ = conn;
    Ok(msg.body.len())
}

fn main() {}
