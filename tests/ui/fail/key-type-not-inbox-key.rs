use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

struct Envelope {
    id: (u8, u8),
}

#[idempotent(key = "msg.id")]
fn handle(conn: &mut SqliteConnection, msg: &Envelope) -> QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {
    let _ = Msg { id: String::new() }.id;
}
