use diesel::prelude::*;
use diesel_inbox::idempotent;

#[idempotent(key = "id")]
fn handle(conn: &mut SqliteConnection, id: i64) -> QueryResult<impl std::fmt::Display> {
    let _ = conn;
    Ok(id)
}

fn main() {}
