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

/// The statements the guards name, in their refusals ([`misrouted`] and
/// PostgreSQL's `push_guard`).
const GUARDED: [&str; 7] = [
    "inbox claim",
    "inbox duplicate check",
    "inbox replay read",
    "inbox result store",
    "outbox enqueue",
    "claim",
    "replay read",
];

/// The server's refusal, raised by the view `diesel_inbox_refused`
/// (`postgres_refuse.sql`), after [`REFUSAL`].
pub(crate) const SERVER_REFUSAL: &str = "a statement of diesel-inbox ran with another \
     statement's parameters, or another statement ran under its prepared name";

/// Whether `text` (after [`REFUSAL`]) is exactly one of the refusals'
/// texts: the server's, the fallback casts' (PostgreSQL's `push_guard`,
/// its stored commit and store) or the runtime's own ([`misrouted`]).
/// Exactly, so that a message's content quoted in an error (a payload's
/// field cast to a number, say) is not taken for one.
fn is_refusal_text(text: &str) -> bool {
    if text == SERVER_REFUSAL
        || text == "the commit refused: the result was not stored in this transaction"
    {
        return true;
    }
    if let Some(rows) = text
        .strip_prefix("storing the result updated ")
        .and_then(|t| t.strip_suffix(" inbox rows, not the 1 just claimed"))
    {
        return !rows.is_empty() && rows.bytes().all(|b| b.is_ascii_digit());
    }
    if let Some(statement) = text
        .strip_prefix("this prepared statement is the ")
        .and_then(|t| t.strip_suffix(", run with the parameters of another statement"))
    {
        return GUARDED.contains(&statement);
    }
    GUARDED.iter().any(|statement| {
        text.strip_prefix("the ")
            .and_then(|t| t.strip_prefix(statement))
            .is_some_and(|t| t.starts_with("'s prepared statement "))
            && text.ends_with(&format!(
                ", so it was another statement under the {statement}'s name"
            ))
    })
}

/// The quotes a server's messages put around a value, in its languages.
const QUOTES: [char; 9] = ['"', '\'', '«', '»', '„', '“', '”', '「', '」'];

/// The refusal of a guard, read from a database error: the server's
/// (raised by the view `diesel_inbox_refused` that `migrate` creates, or,
/// where it is missing, quoted in a failed cast's text, whatever the
/// server's language and its quotes) or the runtime's own ([`misrouted`]):
/// the text after [`REFUSAL`], when it is exactly one of the refusals'
/// ([`is_refusal_text`]).
pub(crate) fn refusal(error: &Error) -> Option<String> {
    let (kind, message) = database_error(error)?;
    if kind != DatabaseErrorKind::Unknown {
        return None;
    }
    let at = message.find(REFUSAL)?;
    let text = match at {
        0 => &message[REFUSAL.len()..],
        _ if message[..at].trim_end().ends_with(QUOTES) => message[at + REFUSAL.len()..]
            .trim_end_matches(QUOTES)
            .trim_end(),
        _ => return None,
    };
    is_refusal_text(text).then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown(message: &str) -> Error {
        Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_owned()))
    }

    /// The refusals' own texts, raised, quoted (in any quotes) or the
    /// runtime's own, are refusals; a message's content that merely
    /// starts like one, quoted in an input error, is not.
    #[test]
    fn only_the_refusals_own_texts_are_refusals() {
        let claim = "this prepared statement is the inbox claim, run with the parameters of another statement";
        for message in [
            format!("diesel-inbox: {SERVER_REFUSAL}"),
            format!("invalid input syntax for type integer: \"diesel-inbox: {claim}\""),
            format!("ungültige Eingabesyntax für Typ integer: »diesel-inbox: {claim}«"),
            format!("syntaxe en entrée invalide pour le type integer : « diesel-inbox: {claim} »"),
            "invalid input syntax for type integer: \"diesel-inbox: storing the result updated 0 inbox rows, not the 1 just claimed\"".to_owned(),
            misrouted("outbox enqueue", "returned no row of its own").to_string(),
        ] {
            assert!(refusal(&unknown(&message)).is_some(), "{message}");
        }
        for message in [
            "invalid input syntax for type uuid: \"diesel-inbox: this prepared statement is the payload's field\"".to_owned(),
            format!("invalid input syntax for type integer: \"diesel-inbox: {claim} and more\""),
            format!("a user's message that quotes diesel-inbox: {SERVER_REFUSAL}"),
            "diesel-inbox: storing the result updated many inbox rows, not the 1 just claimed".to_owned(),
        ] {
            assert_eq!(refusal(&unknown(&message)), None, "{message}");
        }
        // Only databases' errors of no known kind.
        let unique = Error::DatabaseError(
            DatabaseErrorKind::UniqueViolation,
            Box::new(format!("diesel-inbox: {SERVER_REFUSAL}")),
        );
        assert_eq!(refusal(&unique), None);
    }
}
