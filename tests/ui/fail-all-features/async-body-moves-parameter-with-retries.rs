use diesel::prelude::*;
use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

pub struct Payload;

pub struct Msg {
    id: u64,
    payload: Payload,
}

#[idempotent(key = "msg.id")]
async fn handle(conn: &mut AsyncPgConnection, msg: Msg) -> QueryResult<Payload> {
    let _ = conn;
    Ok(msg.payload)
}

fn main() {}
