use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(batch = "messages", key = "|m| m.id.as_str()")]
fn handle(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    let _ = (conn, msgs);
    Ok(())
}

fn main() {}
