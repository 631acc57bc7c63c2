use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
    body: String,
}

#[idempotent(key = "msg.id", fingerprint = "|m| m.body")]
fn single(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(batch = "msgs", key = "|m| m.id.as_str()", fingerprint = "msgs.len()")]
fn batch(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<usize> {
    let _ = conn;
    Ok(msgs.len())
}

fn main() {}
