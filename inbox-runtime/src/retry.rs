//! Which errors rerun the transaction, and what is returned when they keep coming.

use crate::error::InboxError;
use diesel::result::Error;

/// Overrides whether a handler's error is transient: the transaction that
/// raised it was rolled back and running it again may succeed.
///
/// You rarely need it. The runtime classifies the errors of the claim and
/// the commit itself, and it watches the body's statements (see
/// [`ErrorObserver`](crate::ErrorObserver)): a deadlock, serialization
/// failure, lock timeout or SQLite busy error raised by a statement of the
/// body reruns the transaction whatever the handler's error type (a plain
/// enum, `anyhow::Error`, `Box<dyn Error>`, a generic `E`). Which database
/// errors are transient is decided by each backend.
///
/// Implement it to decide yourself: to mark an error of your own as
/// retryable (a remote service said "try again"), or a database error as
/// permanent. When `E` implements it, its answer is final. It is
/// implemented for `diesel::result::Error` and [`InboxError`] (transient
/// on any enabled backend), so `QueryResult<T>` handlers retry even on a
/// connection whose instrumentation is your own.
///
/// ```
/// use diesel_inbox::{InboxError, RetryableError};
///
/// #[derive(Debug)]
/// enum AppError { Db(diesel::result::Error), Inbox(InboxError), RateLimited }
///
/// impl RetryableError for AppError {
///     fn is_retryable(&self) -> bool {
///         match self {
///             AppError::Db(e) => e.is_retryable(),
///             AppError::Inbox(e) => e.is_retryable(),
///             AppError::RateLimited => true,
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
/// assert!(AppError::RateLimited.is_retryable());
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
    /// Transient on any of the enabled backends (each backend module
    /// decides for its own errors).
    fn is_retryable(&self) -> bool {
        crate::backend::is_transient(self)
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
/// use diesel_inbox::ErrorClass;
///
/// let busy = diesel::result::Error::DatabaseError(
///     diesel::result::DatabaseErrorKind::Unknown,
///     Box::new("database is locked".to_string()),
/// );
/// assert_eq!(ErrorClass::of(&busy).is_retryable(), Some(true));
/// assert_eq!(ErrorClass::<String>::permanent().is_retryable(), Some(false));
/// // Decided by the body's failed statements, as the runtime observes them:
/// assert_eq!(ErrorClass::<String>::by_statements().is_retryable(), None);
/// ```
pub struct ErrorClass<E> {
    verdict: Verdict,
    exhausted: fn(E, u32) -> E,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verdict {
    Retryable,
    Permanent,
    /// Retryable if a statement of the body failed with a transient error.
    ByStatements,
}

impl<E> ErrorClass<E> {
    /// Never retried, returned unchanged.
    pub fn permanent() -> Self {
        ErrorClass {
            verdict: Verdict::Permanent,
            exhausted: |error, _| error,
        }
    }

    /// Retried when a statement of the body failed with an error its
    /// backend classifies as transient (see
    /// [`ErrorObserver`](crate::ErrorObserver)); returned unchanged when
    /// the retries run out. What `#[idempotent]` uses when the handler's
    /// error type does not implement [`RetryableError`].
    pub fn by_statements() -> Self {
        ErrorClass {
            verdict: Verdict::ByStatements,
            exhausted: |error, _| error,
        }
    }

    /// `Some(true)` or `Some(false)` when decided by the error itself,
    /// `None` when decided by the body's failed statements.
    pub fn is_retryable(&self) -> Option<bool> {
        match self.verdict {
            Verdict::Retryable => Some(true),
            Verdict::Permanent => Some(false),
            Verdict::ByStatements => None,
        }
    }

    pub(crate) fn exhausted(&self, error: E, attempts: u32) -> E {
        (self.exhausted)(error, attempts)
    }
}

impl<E: RetryableError> ErrorClass<E> {
    /// As the error's [`RetryableError`] implementation says.
    pub fn of(error: &E) -> Self {
        ErrorClass {
            verdict: if error.is_retryable() {
                Verdict::Retryable
            } else {
                Verdict::Permanent
            },
            exhausted: E::retries_exhausted,
        }
    }
}

/// Autoref specialization, used by expanded code on the body's error type:
/// `(&&Probe(err)).__diesel_inbox_error_class()` is [`ErrorClass::of`] when
/// `E` implements [`RetryableError`] and [`ErrorClass::by_statements`]
/// otherwise. The method name is one no user trait is likely to share (a
/// method of the same name in scope would make the call ambiguous).
#[doc(hidden)]
pub struct Probe<'a, E>(pub &'a E);

#[doc(hidden)]
pub trait ViaRetryableError<E> {
    fn __diesel_inbox_error_class(&self) -> ErrorClass<E>;
}

impl<E: RetryableError> ViaRetryableError<E> for &Probe<'_, E> {
    fn __diesel_inbox_error_class(&self) -> ErrorClass<E> {
        ErrorClass::of(self.0)
    }
}

#[doc(hidden)]
pub trait ViaStatements<E> {
    fn __diesel_inbox_error_class(&self) -> ErrorClass<E>;
}

impl<E> ViaStatements<E> for Probe<'_, E> {
    fn __diesel_inbox_error_class(&self) -> ErrorClass<E> {
        ErrorClass::by_statements()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::result::DatabaseErrorKind;

    struct Opaque;

    fn serialization_failure() -> Error {
        Error::DatabaseError(
            DatabaseErrorKind::SerializationFailure,
            Box::new("could not serialize access".to_string()),
        )
    }

    #[test]
    #[allow(clippy::needless_borrow)] // the double reference is the point
    fn probe_uses_the_trait_when_implemented_and_the_statements_otherwise() {
        let class = |probe: &&Probe<'_, Error>| probe.__diesel_inbox_error_class().is_retryable();
        assert_eq!(class(&&Probe(&serialization_failure())), Some(true));
        assert_eq!(class(&&Probe(&Error::NotFound)), Some(false));
        assert_eq!(
            (&&Probe(&Opaque))
                .__diesel_inbox_error_class()
                .is_retryable(),
            None
        );
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
