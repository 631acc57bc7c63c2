use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id")]
fn handle(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = conn;
    let count: i64 = msg.id;
    let _ = count;
    Ok(())
}

fn main() {}
