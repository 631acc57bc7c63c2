use diesel::prelude::*;
use diesel_inbox::idempotent;

#[idempotent(key = "id")]
fn handle(conn: &mut SqliteConnection, id: i64) -> Option<i64> {
    let _ = conn;
    Some(id)
}

fn main() {}
