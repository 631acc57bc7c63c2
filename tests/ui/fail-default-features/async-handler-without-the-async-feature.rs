use diesel::prelude::*;
use diesel_inbox::idempotent;

#[idempotent(key = "id")]
async fn handle(conn: &mut SqliteConnection, id: i64) -> QueryResult<()> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
