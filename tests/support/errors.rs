//! The tests' handler error: the README's kind (only `Debug`, no
//! `RetryableError`), with the variants every harness needs, and
//! `HasInboxError` for the broker runners' policies.

use diesel_inbox::InboxError;

#[derive(Debug)]
#[allow(dead_code)] // read through Debug
pub enum AppError {
    Db(diesel::result::Error),
    Inbox(InboxError),
    /// A body that refuses its message: permanent.
    Rejected,
    /// A body that is not a number: permanent.
    BadPayload,
    /// The poison message: fails every time, transiently.
    Poison,
    /// No connection from the pool (the database is down): transient.
    Pool(String),
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}

impl From<InboxError> for AppError {
    fn from(e: InboxError) -> Self {
        AppError::Inbox(e)
    }
}

#[cfg(any(feature = "lapin", feature = "nats", feature = "kafka"))]
impl diesel_inbox::brokers::HasInboxError for AppError {
    fn inbox_error(&self) -> Option<&InboxError> {
        match self {
            AppError::Inbox(e) => Some(e),
            _ => None,
        }
    }
}
