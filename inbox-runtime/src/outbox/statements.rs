//! Running the backend's outbox statements ([`Op`]) in short
//! transactions, and reading their answers.

#[cfg(feature = "async")]
use crate::backend::asynchronous::AsyncInboxConnection;
use crate::backend::outbox::Answer;
#[cfg(feature = "async")]
use crate::backend::outbox::Op;
#[cfg(feature = "async")]
use crate::backend::Internals;
use crate::error::InboxError;
use diesel::result::Error;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One short transaction of an [`Op`] on an async connection: the
/// backend's isolation for short batches, its `BEGIN`, the operation,
/// `COMMIT` (a failure rolls back).
#[cfg(feature = "async")]
pub(super) async fn short_transaction_async<C: AsyncInboxConnection>(
    conn: &mut C,
    op: Op,
) -> diesel::QueryResult<Answer> {
    let mut answers = transaction_of(conn, vec![op], None).await?;
    answers
        .pop()
        .ok_or_else(|| Error::QueryBuilderError("an outbox statement returned nothing".into()))
}

/// A relay's claim or settlement: [`short_transaction_async`] of `ops`,
/// with the backend's setting for the relay's transactions
/// (the backend's `RELAY_SETUP`).
#[cfg(feature = "async")]
pub(super) async fn relay_transaction<C: AsyncInboxConnection>(
    conn: &mut C,
    ops: Vec<Op>,
) -> diesel::QueryResult<Vec<Answer>> {
    transaction_of(conn, ops, <C::Backend as Internals>::RELAY_SETUP).await
}

#[cfg(feature = "async")]
pub(super) async fn transaction_of<C: AsyncInboxConnection>(
    conn: &mut C,
    ops: Vec<Op>,
    setup: Option<&str>,
) -> diesel::QueryResult<Vec<Answer>> {
    if let Some(isolation) = <C::Backend as Internals>::PURGE_ISOLATION {
        // Pending until the `BEGIN` below (sent without an await between):
        // a future dropped meanwhile leaves a connection pools discard.
        let status = crate::backend::transaction::state_unknown(conn);
        let set = diesel_async::SimpleAsyncConnection::batch_execute(conn, isolation).await;
        crate::backend::transaction::state_known(conn, status);
        set?;
    }
    conn.inbox_begin().await.map_err(|(_, e)| e)?;
    let mut answers = Vec::with_capacity(ops.len());
    let mut failed = match setup {
        Some(sql) => diesel_async::SimpleAsyncConnection::batch_execute(conn, sql)
            .await
            .err(),
        None => None,
    };
    for op in ops {
        if failed.is_some() {
            break;
        }
        match conn.inbox_outbox(op).await {
            Ok(answer) => answers.push(answer),
            Err(e) => failed = Some(e),
        }
    }
    match failed {
        None => conn
            .inbox_commit(crate::backend::transaction::Scope::TopLevel)
            .await
            .map(|()| answers),
        Some(e) => {
            conn.inbox_rollback().await;
            Err(e)
        }
    }
}

pub(super) fn counted(answer: Answer) -> diesel::QueryResult<usize> {
    match answer {
        Answer::Count(n) => Ok(n),
        other => Err(mismatch(other)),
    }
}

pub(super) fn count_of(answer: Answer) -> Result<u64, InboxError> {
    counted(answer)
        .map(|n| n as u64)
        .map_err(InboxError::Database)
}

pub(crate) fn unexpected(answer: Answer) -> InboxError {
    InboxError::Database(mismatch(answer))
}

/// An answer of another kind than the operation's (a bug, not a state).
pub(super) fn mismatch(answer: Answer) -> Error {
    Error::QueryBuilderError(format!("an outbox statement returned {answer:?}").into())
}

pub(super) fn checked_limit(limit: usize) -> Result<i64, InboxError> {
    match limit {
        1..=100_000 => Ok(limit as i64),
        _ => Err(InboxError::InvalidArgument(
            "the limit must be between 1 and 100000",
        )),
    }
}

pub(super) fn micros(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

pub(super) fn time(us: i64) -> SystemTime {
    UNIX_EPOCH + micros(us)
}

#[cfg(feature = "async")]
pub(super) fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}
