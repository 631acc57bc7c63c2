// Inner attributes of an `async fn` handler's body apply to the handler.
use diesel::QueryResult;
use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

pub struct Msg {
    pub id: String,
}

#[idempotent(key = "msg.id")]
async fn allows_async(conn: &mut AsyncPgConnection, msg: &Msg) -> QueryResult<()> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok(())
}

#[idempotent(key = "msg.id", max_attempts = 3)]
async fn denies_async(conn: &mut AsyncPgConnection, msg: &Msg) -> QueryResult<u32> {
    #![deny(unused_mut)]
    let value = 7;
    Ok(value)
}

pub fn main() {
    // Compiling is the test: the handlers need a server to run.
    let _ = (allows_async, denies_async);
}
