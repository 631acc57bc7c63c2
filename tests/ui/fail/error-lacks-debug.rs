use diesel::prelude::*;
use diesel_inbox::{idempotent, InboxError};

struct Msg {
    id: String,
}

// No `Debug`: the library writes a failed call's error to its WARN line.
struct AppError;

impl From<diesel::result::Error> for AppError {
    fn from(_: diesel::result::Error) -> Self {
        AppError
    }
}

impl From<InboxError> for AppError {
    fn from(_: InboxError) -> Self {
        AppError
    }
}

#[idempotent(key = "msg.id")]
fn handle(conn: &mut SqliteConnection, msg: &Msg) -> Result<(), AppError> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
