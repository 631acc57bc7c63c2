// Inner attributes at the top of a body apply to the handler, as they do on
// any function: the attribute moves them out of the closure it makes.
use diesel::prelude::*;
use diesel_inbox::{idempotent, Processed};

pub struct Msg {
    pub id: String,
}

#[idempotent(key = "msg.id")]
fn allows(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok(())
}

#[idempotent(key = "msg.id", retries = 0)]
fn denies(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<u32> {
    #![deny(unused_mut)]
    #![allow(clippy::let_and_return)]
    let value = 7;
    Ok(value)
}

pub fn main() {
    let mut conn = SqliteConnection::establish(":memory:").expect("sqlite");
    diesel_inbox::migrate(&mut conn).expect("migrate");
    let msg = Msg { id: "m-1".into() };
    assert_eq!(
        allows(&mut conn, &msg).expect("first"),
        Processed::Applied(())
    );
    assert_eq!(
        denies(&mut conn, &msg).expect("first"),
        Processed::Applied(7)
    );
    assert_eq!(
        denies(&mut conn, &msg).expect("again"),
        Processed::Duplicate
    );
}
