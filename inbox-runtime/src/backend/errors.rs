//! What a database error means, by backend: pure functions of diesel's
//! error (its kind and message text), with no connection and no other
//! module of the crate, so that the error type itself can use them (the
//! privilege hint of a failed `migrate`). Each backend's `InboxBackend`
//! implementation asks these.

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
