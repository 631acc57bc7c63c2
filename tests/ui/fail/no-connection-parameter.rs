use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id")]
fn handle(msg: &Msg) -> QueryResult<()> {
    let _ = msg;
    Ok(())
}

fn main() {}
