use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id")]
fn handle(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = (conn, msg);
    let _ = __inbox_error;
    Ok(())
}

#[idempotent(key = "msg.id", retries = 0)]
fn handle_once(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = (conn, msg);
    let _ = __inbox_key;
    Ok(())
}

fn main() {}
