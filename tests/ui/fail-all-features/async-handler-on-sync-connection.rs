use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id")]
async fn handle(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
