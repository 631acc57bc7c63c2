use diesel::prelude::*;
use diesel_inbox::idempotent;

#[idempotent(key = "id")]
fn handle(conn: &mut SqliteConnection, id: i64) -> Vec<i64> {
    let _ = conn;
    vec![id]
}

fn main() {}
