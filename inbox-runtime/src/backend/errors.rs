//! What a database error means, by backend: pure functions of diesel's
//! error, with no connection and no other module of the crate, so that the
//! error type itself can use them (the privilege hint of a failed
//! `migrate`). Each backend's `InboxBackend` implementation asks these.
//!
//! A condition is read from what the server does not translate: diesel's
//! kind (its driver's SQLSTATE or error number), the names PostgreSQL
//! writes into a deadlock's detail, or a mark of the runtime's own
//! ([`AbortedTransaction`]). A message's wording follows the server's
//! `lc_messages`; the few checks that still read it say so.

#[cfg(feature = "_any-backend")]
use diesel::result::DatabaseErrorKind;
use diesel::result::Error;

/// The kind and message of a database error, also when it is the commit
/// error of a failed commit's rollback.
#[cfg(feature = "_any-backend")]
pub(crate) fn database_error(error: &Error) -> Option<(DatabaseErrorKind, &str)> {
    match error {
        Error::DatabaseError(kind, info) => Some((*kind, info.message())),
        Error::RollbackErrorOnCommit { commit_error, .. } => database_error(commit_error),
        _ => None,
    }
}

/// PostgreSQL's lock modes, as its deadlock report names them
/// (`GetLockmodeName`: never translated, whatever `lc_messages` is).
#[cfg(feature = "postgres")]
const POSTGRES_LOCK_MODES: [&str; 8] = [
    "AccessShareLock",
    "RowShareLock",
    "RowExclusiveLock",
    "ShareUpdateExclusiveLock",
    "ShareLock",
    "ShareRowExclusiveLock",
    "ExclusiveLock",
    "AccessExclusiveLock",
];

/// PostgreSQL's deadlock (40P01), which diesel reports as `Unknown`
/// without its SQLSTATE: a hint, and a detail of one line per process in
/// the cycle ("Process 1 waits for ShareLock on transaction 7; blocked by
/// process 2."), each naming the lock mode it waits for. The sentences are
/// translated, the lock modes are not.
#[cfg(feature = "postgres")]
pub(crate) fn postgres_deadlock(error: &Error) -> bool {
    let info = match error {
        Error::DatabaseError(DatabaseErrorKind::Unknown, info) => info,
        Error::RollbackErrorOnCommit { commit_error, .. } => {
            return postgres_deadlock(commit_error)
        }
        _ => return false,
    };
    let Some(detail) = info.details() else {
        return false;
    };
    info.hint().is_some()
        && detail.lines().count() >= 2
        && detail
            .lines()
            .all(|line| POSTGRES_LOCK_MODES.iter().any(|mode| line.contains(mode)))
}

/// The error of a top-level commit that found its transaction aborted by
/// a statement the body ran (PostgreSQL's 25P02), marked by the runtime
/// from the transaction's state after the commit's guard failed: the
/// server's message says it only in its own language.
#[derive(Debug)]
pub(crate) struct AbortedTransaction(pub(crate) Error);

impl std::fmt::Display for AbortedTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for AbortedTransaction {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// `error`, marked as the failure of a commit whose transaction a
/// statement of the body had aborted.
#[cfg(feature = "postgres")]
pub(crate) fn aborted_transaction(error: Error) -> Error {
    Error::QueryBuilderError(Box::new(AbortedTransaction(error)))
}

/// Whether `error` carries the runtime's [`AbortedTransaction`] mark.
#[cfg(feature = "postgres")]
pub(crate) fn is_aborted_transaction(error: &Error) -> bool {
    matches!(error, Error::QueryBuilderError(e) if e.is::<AbortedTransaction>())
}

/// The server's own error inside an [`AbortedTransaction`] mark; any
/// other error as it is.
pub(crate) fn without_abort_mark(error: Error) -> Error {
    match error {
        Error::QueryBuilderError(e) if e.is::<AbortedTransaction>() => {
            match e.downcast::<AbortedTransaction>() {
                Ok(aborted) => aborted.0,
                Err(e) => Error::QueryBuilderError(e),
            }
        }
        other => other,
    }
}

/// PostgreSQL's privilege errors: 42501, by its message text ("permission
/// denied for …", "must be owner of table …").
#[cfg(feature = "postgres")]
pub(crate) fn postgres_privilege(error: &Error) -> bool {
    database_error(error).is_some_and(|(_, message)| {
        message.starts_with("permission denied") || message.starts_with("must be owner")
    })
}

/// MySQL's and MariaDB's: 1142 "... command denied to user ...", 1044
/// "Access denied for user ...".
#[cfg(feature = "mysql")]
pub(crate) fn mysql_privilege(error: &Error) -> bool {
    database_error(error).is_some_and(|(_, message)| {
        message.contains("command denied to user") || message.contains("Access denied for user")
    })
}

/// A privilege error on any enabled backend (SQLite has no roles: a
/// read-only file is not a grant to ask for).
pub(crate) fn is_privilege_error(error: &Error) -> bool {
    let _ = error;
    #[cfg(feature = "postgres")]
    if postgres_privilege(error) {
        return true;
    }
    #[cfg(feature = "mysql")]
    if mysql_privilege(error) {
        return true;
    }
    false
}

/// The error of a guarded statement (`Internals::GUARDED`: the claim, the
/// outbox's enqueue) that did not return its own marker: `what` it
/// returned instead. Another statement ran under its prepared name.
pub(crate) fn misrouted(statement: &str, what: &str) -> Error {
    Error::DatabaseError(
        diesel::result::DatabaseErrorKind::Unknown,
        Box::new(format!(
            "diesel-inbox: the {statement}'s prepared statement {what}, so it was another \
             statement under the {statement}'s name: a connection proxy in transaction mode \
             (PgBouncer before 1.21) shares prepared statements between clients. Use session \
             pooling, PgBouncer 1.21 or later with max_prepared_statements, or disable \
             diesel's statement cache (CacheSize::Disabled); see diesel_inbox::guide::proxies"
        )),
    )
}
