use diesel::prelude::*;
use diesel_inbox::idempotent;

#[derive(diesel::MultiConnection)]
enum AnyConnection {
    Sqlite(SqliteConnection),
}

#[idempotent(key = "id")]
fn handle(conn: &mut AnyConnection, id: i64) -> QueryResult<()> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
