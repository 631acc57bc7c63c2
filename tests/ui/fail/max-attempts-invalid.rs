use diesel::prelude::*;
use diesel_inbox::idempotent;

#[idempotent(key = "id", max_attempts = 0)]
fn never(conn: &mut SqliteConnection, id: i64) -> QueryResult<i64> {
    let _ = conn;
    Ok(id)
}

struct Msg {
    id: String,
}

#[idempotent(batch = "msgs", key = "|m| m.id.as_str()", max_attempts = 3)]
fn batch(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<usize> {
    let _ = conn;
    Ok(msgs.len())
}

fn main() {}
