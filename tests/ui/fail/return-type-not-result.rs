use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id")]
fn handle(conn: &mut SqliteConnection, msg: &Msg) -> bool {
    let _ = (conn, msg);
    true
}

fn main() {}
