use diesel::prelude::*;
use diesel_inbox::idempotent;

#[idempotent(key = "id")]
fn handle(conn: &mut SqliteConnection, id: i64) -> QueryResult<()> {
    let _ = (conn, id);
    Ok(())
}

async fn consume(conn: &mut SqliteConnection) -> QueryResult<()> {
    handle(conn, 1).await?;
    Ok(())
}

fn main() {}
