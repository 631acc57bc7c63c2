use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id")]
fn handle(primary: &mut SqliteConnection, replica: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = (primary, replica, msg);
    Ok(())
}

fn main() {}
