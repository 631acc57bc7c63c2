//! A user trait with a method named like the runtime's helpers, in scope
//! for every type, does not make the generated calls ambiguous; and a crate
//! that forbids unsafe code can use the attribute.
#![forbid(unsafe_code)]
#![deny(warnings)]

use diesel::prelude::*;
use diesel_inbox::{idempotent, Processed};

pub trait Classify {
    fn classify(&self) -> &'static str {
        "user"
    }
    fn is_retryable(&self) -> bool {
        false
    }
}
impl<T: ?Sized> Classify for T {}

#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Inbox(diesel_inbox::InboxError),
}
impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}
impl From<diesel_inbox::InboxError> for AppError {
    fn from(e: diesel_inbox::InboxError) -> Self {
        AppError::Inbox(e)
    }
}

#[idempotent(key = "id")]
fn handle(conn: &mut SqliteConnection, id: i64) -> Result<&'static str, AppError> {
    let _ = conn;
    Ok(id.classify())
}

pub fn main() {
    let mut conn = SqliteConnection::establish(":memory:").expect("sqlite");
    diesel_inbox::migrate(&mut conn).expect("migrate");
    assert!(matches!(
        handle(&mut conn, 1),
        Ok(Processed::Applied("user"))
    ));
    assert!(matches!(handle(&mut conn, 1), Ok(Processed::Duplicate)));
}
