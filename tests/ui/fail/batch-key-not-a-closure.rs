use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(batch = "msgs", key = "msgs.len()")]
fn handle(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    let _ = (conn, msgs);
    Ok(())
}

fn main() {}
