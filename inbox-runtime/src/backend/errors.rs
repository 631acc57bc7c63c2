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

use diesel::result::DatabaseErrorKind;
use diesel::result::Error;

/// The kind and message of a database error, also when it is the commit
/// error of a failed commit's rollback.
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

/// What every refusal of the runtime's guards starts with, in the
/// server's error (a guard's `RAISE`, or the text of its fallback cast)
/// and in the runtime's own ([`misrouted`]).
pub(crate) const REFUSAL: &str = "diesel-inbox: ";

/// The error of a guarded statement (`Internals::GUARDED`: the claim, the
/// outbox's enqueue) that did not return its own marker: `what` it
/// returned instead. Another statement ran under its prepared name;
/// [`refusal`] reads it back as the inbox's
/// [`InboxError::StatementsSharedByProxy`](crate::InboxError::StatementsSharedByProxy).
pub(crate) fn misrouted(statement: &str, what: &str) -> Error {
    Error::DatabaseError(
        diesel::result::DatabaseErrorKind::Unknown,
        Box::new(format!(
            "{REFUSAL}the {statement}'s prepared statement {what}, so it was another \
             statement under the {statement}'s name"
        )),
    )
}

/// How each of the guards' refusals begins, after [`REFUSAL`]: the
/// server's (the view `diesel_inbox_refused`), the fallback casts' (the
/// guard, the stored commit, the store) and the runtime's own
/// ([`misrouted`]).
const REFUSALS: [&str; 5] = [
    "a statement of diesel-inbox ran with another statement's parameters",
    "this prepared statement is the ",
    "the commit refused: the result was not stored",
    "storing the result updated ",
    "the ",
];

/// The refusal of a guard, read from a database error: the server's
/// (raised by the view `diesel_inbox_refused` that `migrate` creates, or,
/// where it is missing, quoted in a failed cast's text, whatever the
/// server's language and its quotes) or the runtime's own ([`misrouted`]).
/// Only the refusals' own texts, at the start of the message or quoted
/// (a user's value quoted in an input error is not one): the text after
/// [`REFUSAL`], without the closing quote.
pub(crate) fn refusal(error: &Error) -> Option<String> {
    let (kind, message) = database_error(error)?;
    if kind != DatabaseErrorKind::Unknown {
        return None;
    }
    let at = message.find(REFUSAL)?;
    let quoted = message[..at]
        .trim_end()
        .ends_with(['"', '\'', '«', '„', '“', '「']);
    if at != 0 && !quoted {
        return None;
    }
    let rest = &message[at + REFUSAL.len()..];
    let ours = REFUSALS[..4].iter().any(|start| rest.starts_with(start))
        || (rest.starts_with(REFUSALS[4])
            && rest.contains("'s prepared statement ")
            && rest.contains(", so it was another statement under the "));
    if !ours {
        return None;
    }
    let rest = match quoted {
        true => rest.trim_end_matches(['"', '\'', '»', '“', '”', '」', ' ', '\u{a0}']),
        false => rest,
    };
    Some(rest.to_owned())
}
