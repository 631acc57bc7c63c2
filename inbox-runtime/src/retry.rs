//! Which errors rerun the transaction, and what is returned when they keep coming.

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
///
///     // Optional: say how many attempts were made when retries run out.
///     fn retries_exhausted(self, attempts: u32) -> Self {
///         match self {
///             AppError::Db(source) => AppError::Inbox(InboxError::RetriesExhausted { attempts, source }),
///             other => other,
///         }
///     }
/// }
/// assert!(!AppError::Rejected.is_retryable());
/// ```
pub trait RetryableError: Sized {
    /// `true` when rerunning the whole transaction may succeed.
    fn is_retryable(&self) -> bool;

    /// The error to return when it was still retryable after the last
    /// allowed attempt; `attempts` counts every run of the transaction. The
    /// default returns the error unchanged.
    fn retries_exhausted(self, attempts: u32) -> Self {
        let _ = attempts;
        self
    }
}

impl RetryableError for Error {
    fn is_retryable(&self) -> bool {
        match self {
            Error::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => true,
            // diesel has no deadlock or lock-timeout kind: PostgreSQL 40P01
            // and 55P03, MySQL 1205 (and 1213 through diesel-async) and SQLite
            // busy arrive as `Unknown`. A lock timeout means another delivery
            // still holds the key: once it ends, a rerun sees its outcome.
            Error::DatabaseError(_, info) => {
                let message = info.message();
                message.contains("deadlock detected")
                    || message.contains("Deadlock found")
                    || message.contains("database is locked")
                    || message.contains("database table is locked")
                    || message.contains("canceling statement due to lock timeout")
                    || message.contains("Lock wait timeout exceeded")
            }
            Error::RollbackErrorOnCommit { commit_error, .. } => commit_error.is_retryable(),
            _ => false,
        }
    }

    /// Wraps the error in [`InboxError::RetriesExhausted`] (inside
    /// [`Error::QueryBuilderError`]), which names the attempts; its `source()`
    /// is the original error.
    fn retries_exhausted(self, attempts: u32) -> Self {
        InboxError::RetriesExhausted {
            attempts,
            source: self,
        }
        .into()
    }
}

impl RetryableError for InboxError {
    fn is_retryable(&self) -> bool {
        match self {
            InboxError::Database(e) => e.is_retryable(),
            _ => false,
        }
    }

    fn retries_exhausted(self, attempts: u32) -> Self {
        match self {
            InboxError::Database(source) => InboxError::RetriesExhausted { attempts, source },
            other => other,
        }
    }
}

/// How the runtime treats an error of the body: whether to rerun the
/// transaction, and what to return when the retries run out.
///
/// ```
/// use inbox_runtime::ErrorClass;
///
/// let busy = diesel::result::Error::DatabaseError(
///     diesel::result::DatabaseErrorKind::Unknown,
///     Box::new("database is locked".to_string()),
/// );
/// assert!(ErrorClass::of(&busy).is_retryable());
/// assert!(!ErrorClass::<String>::permanent().is_retryable());
/// ```
pub struct ErrorClass<E> {
    retryable: bool,
    exhausted: fn(E, u32) -> E,
}

impl<E> ErrorClass<E> {
    /// Never retried, returned unchanged.
    pub fn permanent() -> Self {
        ErrorClass {
            retryable: false,
            exhausted: |error, _| error,
        }
    }

    /// Whether the transaction is rerun for this error.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    pub(crate) fn exhausted(&self, error: E, attempts: u32) -> E {
        (self.exhausted)(error, attempts)
    }
}

impl<E: RetryableError> ErrorClass<E> {
    /// As the error's [`RetryableError`] implementation says.
    pub fn of(error: &E) -> Self {
        ErrorClass {
            retryable: error.is_retryable(),
            exhausted: E::retries_exhausted,
        }
    }
}

/// Autoref specialization, used by expanded code on the body's error type:
/// `(&&Probe(err)).classify()` is [`ErrorClass::of`] when `E` implements
/// [`RetryableError`] and [`ErrorClass::permanent`] otherwise.
#[doc(hidden)]
pub struct Probe<'a, E>(pub &'a E);

#[doc(hidden)]
pub trait ViaRetryableError<E> {
    fn classify(&self) -> ErrorClass<E>;
}

impl<E: RetryableError> ViaRetryableError<E> for &Probe<'_, E> {
    fn classify(&self) -> ErrorClass<E> {
        ErrorClass::of(self.0)
    }
}

#[doc(hidden)]
pub trait NotRetryable<E> {
    fn classify(&self) -> ErrorClass<E>;
}

impl<E> NotRetryable<E> for Probe<'_, E> {
    fn classify(&self) -> ErrorClass<E> {
        ErrorClass::permanent()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Opaque;

    fn serialization_failure() -> Error {
        Error::DatabaseError(
            DatabaseErrorKind::SerializationFailure,
            Box::new("could not serialize access".to_string()),
        )
    }

    #[test]
    #[allow(clippy::needless_borrow)] // the double reference is the point
    fn probe_uses_the_trait_when_implemented_and_permanent_otherwise() {
        assert!((&&Probe(&serialization_failure()))
            .classify()
            .is_retryable());
        assert!(!(&&Probe(&Error::NotFound)).classify().is_retryable());
        assert!(!(&&Probe(&Opaque)).classify().is_retryable());
    }

    #[test]
    fn deadlock_and_busy_messages_are_retryable() {
        for message in [
            "deadlock detected",
            "database is locked",
            "canceling statement due to lock timeout",
            "Lock wait timeout exceeded; try restarting transaction",
        ] {
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

    #[test]
    fn exhausted_diesel_errors_name_the_attempts() {
        let class = ErrorClass::of(&serialization_failure());
        match class.exhausted(serialization_failure(), 4) {
            Error::QueryBuilderError(inner) => {
                let inbox = inner.downcast_ref::<InboxError>().expect("an InboxError");
                assert!(matches!(
                    inbox,
                    InboxError::RetriesExhausted { attempts: 4, .. }
                ));
                assert_eq!(
                    inbox.to_string(),
                    "inbox transaction failed after 4 attempts: could not serialize access"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
