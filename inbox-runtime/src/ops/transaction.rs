//! The operations' short transactions, and how their database errors
//! read.

use crate::backend::transaction;
use crate::backend::{InboxBackend, Internals};
use crate::error::InboxError;
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;
use diesel::result::Error;

/// `statements` in a short transaction of their own: the backend's
/// isolation for short batches (no gap locks on MySQL), its `BEGIN`, the
/// statements, `COMMIT` (a failure rolls back). The inbox's and the
/// outbox's purge batches.
pub(crate) fn short_transaction<C, T>(
    conn: &mut C,
    statements: impl FnOnce(&mut C) -> diesel::QueryResult<T>,
) -> diesel::QueryResult<T>
where
    C: InboxConnection + LoadConnection,
{
    if let Some(isolation) = <C::Backend as Internals>::PURGE_ISOLATION {
        conn.batch_execute(isolation)?;
    }
    <C::Backend as Internals>::begin_top_level(conn)?;
    match statements(conn) {
        Ok(done) => <C::Backend as Internals>::commit_top_level(conn).map(|()| done),
        Err(e) => {
            transaction::rollback(conn);
            Err(e)
        }
    }
}

/// A database error of an operation, named for what it is: the table
/// missing, a guard's refusal, or another database error.
pub(crate) fn ops_error<B: InboxBackend>(error: Error) -> InboxError {
    if B::is_missing_table(&error) {
        InboxError::NoTable(error)
    } else {
        InboxError::from(error)
    }
}
