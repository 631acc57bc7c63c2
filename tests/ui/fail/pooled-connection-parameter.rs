use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, PooledConnection};
use diesel_inbox::idempotent;

#[idempotent(key = "id")]
fn handle(
    conn: &mut PooledConnection<ConnectionManager<SqliteConnection>>,
    id: i64,
) -> QueryResult<()> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
