//! Errors of the inbox itself (the body's own errors stay the handler's `E`).

use crate::key::InvalidKey;

/// An error raised by the inbox rather than by the handler's body.
///
/// A handler's error type must implement `From<InboxError>` (and
/// `From<diesel::result::Error>`); `InboxError` itself converts into
/// `diesel::result::Error`, so handlers returning `QueryResult<T>` work.
///
/// ```
/// use inbox_runtime::{InboxError, InvalidKey};
///
/// let err = InboxError::InvalidKey(InvalidKey::Empty);
/// assert_eq!(err.to_string(), "invalid inbox key: it is empty");
///
/// // Into diesel's error type, for `QueryResult` handlers:
/// let diesel_err: diesel::result::Error = err.into();
/// assert!(matches!(diesel_err, diesel::result::Error::QueryBuilderError(_)));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The message key is empty, too long or contains NUL; nothing was written
    /// and the body did not run.
    #[error("invalid inbox key: {0}")]
    InvalidKey(InvalidKey),
    /// The consumer name is empty, too long or contains NUL.
    #[error("invalid inbox consumer name: {0}")]
    InvalidConsumer(InvalidKey),
    /// The database refused the claim, the commit or the migration.
    #[error("inbox database error: {0}")]
    Database(#[from] diesel::result::Error),
    /// A retryable error (serialization failure, deadlock, SQLite busy) kept
    /// coming back; the transaction was rolled back each time.
    #[error("inbox transaction failed after {attempts} attempts: {source}")]
    RetriesExhausted {
        /// How many times the transaction ran.
        attempts: u32,
        /// The error of the last attempt.
        #[source]
        source: diesel::result::Error,
    },
    /// A statement in the body failed and PostgreSQL aborted the
    /// transaction, but the body returned `Ok` (it swallowed the error).
    /// Nothing was committed, the inbox row neither: propagate database
    /// errors with `?`.
    #[error("the handler body returned Ok after a failed statement aborted its transaction; nothing was committed (propagate database errors with `?`): {0}")]
    BodyIgnoredError(#[source] diesel::result::Error),
    /// `migrate` could not create the table or its index, typically for want
    /// of the privilege to create objects in the schema.
    #[error("inbox migration failed: {0}; the role running migrate() needs to create tables in the schema, or create inbox_messages beforehand with diesel_inbox::ddl")]
    MigrationFailed(#[source] diesel::result::Error),
    /// `migrate` was called inside an open transaction on MySQL/MariaDB,
    /// where DDL would implicitly commit the caller's transaction.
    #[error("inbox migration refused: MySQL/MariaDB would implicitly commit the open transaction; call migrate() outside any transaction")]
    MigrationInTransaction,
}

impl From<InboxError> for diesel::result::Error {
    /// Database errors come back as they were; the inbox's own errors become
    /// [`QueryBuilderError`](diesel::result::Error::QueryBuilderError) holding
    /// the [`InboxError`] (downcast it to inspect it).
    fn from(err: InboxError) -> Self {
        match err {
            InboxError::Database(source) => source,
            other => diesel::result::Error::QueryBuilderError(Box::new(other)),
        }
    }
}
