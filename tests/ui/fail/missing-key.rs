use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(consumer = "orders")]
fn handle(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {
    // The function is still emitted unchanged: no cascade of errors here.
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    let _: QueryResult<()> = handle(&mut conn, &Msg { id: String::new() });
}
