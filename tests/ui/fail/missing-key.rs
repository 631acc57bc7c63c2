use diesel::prelude::*;
use diesel_inbox::{idempotent, Processed};

struct Msg {
    id: String,
}

#[idempotent(consumer = "orders")]
fn handle(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {
    // The rewritten signature is still emitted: a caller written for the
    // working handler gets no cascade of errors.
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    let _: QueryResult<Processed<()>> = handle(&mut conn, &Msg { id: String::new() });
}
