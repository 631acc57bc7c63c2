use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id")]
fn handle(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = (conn, msg);
    let total = ;
    Ok(())
}

fn main() {}
