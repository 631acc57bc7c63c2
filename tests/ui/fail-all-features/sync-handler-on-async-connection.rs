use diesel::prelude::*;
use diesel_inbox::idempotent;

#[idempotent(key = "id")]
fn handle(conn: &mut diesel_async::AsyncPgConnection, id: i64) -> QueryResult<()> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
