use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(batch = "msgs", key = "|m| m.id.as_str()", store_result)]
fn handle(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<usize> {
    let _ = conn;
    Ok(msgs.len())
}

fn main() {}
