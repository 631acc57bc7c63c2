use diesel::prelude::*;
use diesel_inbox::idempotent;

struct Receipt {
    total: i64,
}

#[idempotent(key = "id", store_result)]
fn handle(conn: &mut SqliteConnection, id: i64) -> QueryResult<Receipt> {
    let _ = conn;
    Ok(Receipt { total: id })
}

fn main() {
    let _ = Receipt { total: 1 }.total;
}
