use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(key = "|m| m.id.clone()")]
fn handle(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
