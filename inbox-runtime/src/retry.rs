//! Which errors rerun the transaction.

use crate::error::InboxError;
use diesel::result::{DatabaseErrorKind, Error};

/// Tells whether an error is transient: the transaction that raised it was
/// rolled back and running it again may succeed (serialization failure,
/// deadlock, SQLite "database is locked").
///
/// The runtime classifies the errors of the inbox insert and of the commit
/// itself. An error raised **inside the body** reaches it only as the
/// handler's own error type `E`; it is retried only if `E` implements this
/// trait (implemented here for `diesel::result::Error` and [`InboxError`], so
/// `QueryResult<T>` handlers get it for free). Without it, a body's error is
/// returned at once, never retried.
///
/// ```
/// use inbox_runtime::{InboxError, RetryableError};
///
/// #[derive(Debug)]
/// enum AppError { Db(diesel::result::Error), Inbox(InboxError), Rejected }
///
/// impl RetryableError for AppError {
///     fn is_retryable(&self) -> bool {
///         match self {
///             AppError::Db(e) => e.is_retryable(),
///             AppError::Inbox(e) => e.is_retryable(),
///             AppError::Rejected => false,
///         }
///     }
/// }
/// assert!(!AppError::Rejected.is_retryable());
/// ```
pub trait RetryableError {
    /// `true` when rerunning the whole transaction may succeed.
    fn is_retryable(&self) -> bool;
}

impl RetryableError for Error {
    fn is_retryable(&self) -> bool {
        match self {
            Error::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => true,
            // diesel has no deadlock kind: PostgreSQL 40P01 and diesel-async's
            // MySQL 1213 arrive as `Unknown`; SQLite busy does too.
            Error::DatabaseError(_, info) => {
                let message = info.message();
                message.contains("deadlock detected")
                    || message.contains("Deadlock found")
                    || message.contains("database is locked")
                    || message.contains("database table is locked")
            }
            Error::RollbackErrorOnCommit { commit_error, .. } => commit_error.is_retryable(),
            _ => false,
        }
    }
}

impl RetryableError for InboxError {
    fn is_retryable(&self) -> bool {
        match self {
            InboxError::Database(e) => e.is_retryable(),
            _ => false,
        }
    }
}

/// Autoref specialization, used by expanded code on the body's error type:
/// `(&&Probe(err)).is_retryable()` uses [`RetryableError`] when `E` implements
/// it and answers `false` otherwise.
#[doc(hidden)]
pub struct Probe<'a, E>(pub &'a E);

#[doc(hidden)]
pub trait ViaRetryableError {
    fn is_retryable(&self) -> bool;
}

impl<E: RetryableError> ViaRetryableError for &Probe<'_, E> {
    fn is_retryable(&self) -> bool {
        self.0.is_retryable()
    }
}

#[doc(hidden)]
pub trait NotRetryable {
    fn is_retryable(&self) -> bool;
}

impl<E> NotRetryable for Probe<'_, E> {
    fn is_retryable(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Opaque;

    #[test]
    #[allow(clippy::needless_borrow)] // the double reference is the point
    fn probe_uses_the_trait_when_implemented_and_false_otherwise() {
        let serialization = Error::DatabaseError(
            DatabaseErrorKind::SerializationFailure,
            Box::new("could not serialize access".to_string()),
        );
        assert!((&&Probe(&serialization)).is_retryable());
        assert!(!(&&Probe(&Error::NotFound)).is_retryable());
        assert!(!(&&Probe(&Opaque)).is_retryable());
    }

    #[test]
    fn deadlock_and_busy_messages_are_retryable() {
        for message in ["deadlock detected", "database is locked"] {
            let err =
                Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_string()));
            assert!(err.is_retryable(), "{message}");
        }
        let unique = Error::DatabaseError(
            DatabaseErrorKind::UniqueViolation,
            Box::new("dup".to_string()),
        );
        assert!(!unique.is_retryable());
    }
}
