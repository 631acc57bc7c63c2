use diesel::prelude::*;
use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;
use std::rc::Rc;

#[idempotent(key = "id")]
async fn handle(conn: &mut AsyncPgConnection, id: i64) -> QueryResult<()> {
    let _ = conn;
    let seen = Rc::new(id);
    tokio::task::yield_now().await;
    assert_eq!(*seen, id);
    Ok(())
}

fn main() {}
