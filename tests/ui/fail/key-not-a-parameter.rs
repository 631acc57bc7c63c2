use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(key = "message.id")]
fn handle(conn: &mut SqliteConnection, msg: &Msg, tenant: u32) -> QueryResult<()> {
    let _ = (conn, msg, tenant);
    Ok(())
}

fn main() {}
