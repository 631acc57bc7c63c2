//! Inspection and deliberate replays of single keys and consumers:
//! [`status`], [`attempts`], [`attempts_list`], [`forget`], [`stats`] and
//! their async twins.

use super::purge::MAX_PURGE_BATCH;
use super::transaction::ops_error;
#[cfg(feature = "async")]
use crate::backend::asynchronous::AsAsyncConnection;
use crate::backend::Statements;
use crate::error::InboxError;
use crate::key::validate_key;
use crate::rows::{attempts_of, failing_of, Attempts, ConsumerStats, InboxEntry};
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;

fn checked_ids(consumer: &str, key: &str) -> Result<(), InboxError> {
    validate_key(consumer).map_err(InboxError::InvalidConsumer)?;
    validate_key(key).map_err(InboxError::InvalidKey)
}

/// The inbox row of `key` for `consumer`, if the message was applied (and
/// not purged or forgotten since).
///
/// See [`InboxEntry`] for an example.
pub fn status<C>(conn: &mut C, consumer: &str, key: &str) -> Result<Option<InboxEntry>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    checked_ids(consumer, key)?;
    C::Backend::entry(conn, consumer, key).map_err(ops_error::<C::Backend>)
}

/// The failure count of `key` for `consumer` (handlers with
/// `max_attempts`), or `None` when its deliveries have not failed since the
/// last success or [`forget`]. Once `failures` reaches the handler's
/// `max_attempts`, its deliveries fail with
/// [`InboxError::AttemptsExhausted`].
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{attempts, forget, idempotent, InboxError};
///
/// #[derive(Debug)]
/// struct Rejected;
/// # impl From<InboxError> for Rejected { fn from(_: InboxError) -> Self { Rejected } }
/// # impl From<diesel::result::Error> for Rejected { fn from(_: diesel::result::Error) -> Self { Rejected } }
///
/// #[idempotent(key = "id", max_attempts = 2)]
/// fn import(conn: &mut SqliteConnection, id: i64) -> Result<(), Rejected> {
///     Err(Rejected)
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// assert!(import(&mut conn, 1).is_err());
/// assert!(import(&mut conn, 1).is_err());
/// let count = attempts(&mut conn, "import", "1")?.expect("counted");
/// assert_eq!((count.failures, count.last_error.as_str()), (2, "Rejected"));
/// assert!(forget(&mut conn, "import", "1")?); // a deliberate retry
/// assert!(attempts(&mut conn, "import", "1")?.is_none());
/// # Ok(())
/// # }
/// ```
pub fn attempts<C>(conn: &mut C, consumer: &str, key: &str) -> Result<Option<Attempts>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    checked_ids(consumer, key)?;
    C::Backend::attempts(conn, consumer, key)
        .map(|row| row.map(|row| attempts_of(consumer, key, row)))
        .map_err(ops_error::<C::Backend>)
}

/// The failing keys: each failure count (`max_attempts`) of at least
/// `min_failures` failures, of `consumer` or of every consumer (`None`), the
/// latest failure first, at most `limit` of them. A key is listed from its
/// first counted failure until a delivery of it succeeds or it is
/// [`forget`]-ed; with `min_failures` set to the handler's `max_attempts`
/// the list is the keys given up on ([`InboxError::AttemptsExhausted`]).
/// `limit` is 1 to [`MAX_PURGE_BATCH`].
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{attempts_list, idempotent, InboxError};
///
/// #[derive(Debug)]
/// struct Rejected;
/// # impl From<InboxError> for Rejected { fn from(_: InboxError) -> Self { Rejected } }
/// # impl From<diesel::result::Error> for Rejected { fn from(_: diesel::result::Error) -> Self { Rejected } }
///
/// #[idempotent(key = "id", max_attempts = 2)]
/// fn import(conn: &mut SqliteConnection, id: i64) -> Result<(), Rejected> {
///     Err(Rejected)
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// for id in [1, 1, 2] {
///     assert!(import(&mut conn, id).is_err());
/// }
/// let failing = attempts_list(&mut conn, Some("import"), 1, 100)?;
/// assert_eq!(failing.len(), 2);
/// let exhausted = attempts_list(&mut conn, Some("import"), 2, 100)?;
/// assert_eq!((exhausted[0].key.as_str(), exhausted[0].failures), ("1", 2));
/// # Ok(())
/// # }
/// ```
pub fn attempts_list<C>(
    conn: &mut C,
    consumer: Option<&str>,
    min_failures: u32,
    limit: usize,
) -> Result<Vec<Attempts>, InboxError>
where
    C: InboxConnection,
{
    let (min_failures, limit) = checked_list(consumer, min_failures, limit)?;
    C::Backend::failing(conn, consumer, min_failures, limit)
        .map(|rows| rows.into_iter().map(failing_of).collect())
        .map_err(ops_error::<C::Backend>)
}

/// `attempts_list`'s arguments as its statement takes them.
fn checked_list(
    consumer: Option<&str>,
    min_failures: u32,
    limit: usize,
) -> Result<(i32, i64), InboxError> {
    if let Some(consumer) = consumer {
        validate_key(consumer).map_err(InboxError::InvalidConsumer)?;
    }
    if limit == 0 || limit > MAX_PURGE_BATCH {
        return Err(InboxError::InvalidArgument(
            "attempts_list: limit must be 1 to MAX_PURGE_BATCH",
        ));
    }
    Ok((
        i32::try_from(min_failures).unwrap_or(i32::MAX),
        limit as i64,
    ))
}

/// Removes the inbox row of `key` for `consumer`, so that the next delivery
/// of that message is applied again: a deliberate replay. It also removes
/// the key's failure count (`max_attempts`), so that a message given up on
/// runs again. `true` if there was a row or a count. The message's earlier effects stay; replay only what is safe
/// to apply twice, or undo it first.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{forget, idempotent, Processed};
///
/// #[idempotent(key = "id")]
/// fn resend(conn: &mut SqliteConnection, id: i64) -> QueryResult<()> {
///     Ok(())
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// resend(&mut conn, 1)?;
/// assert!(forget(&mut conn, "resend", "1")?);
/// assert_eq!(resend(&mut conn, 1)?, Processed::Applied(()));
/// assert!(!forget(&mut conn, "resend", "2")?);
/// # Ok(())
/// # }
/// ```
pub fn forget<C>(conn: &mut C, consumer: &str, key: &str) -> Result<bool, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    checked_ids(consumer, key)?;
    C::Backend::forget(conn, consumer, key).map_err(ops_error::<C::Backend>)
}

/// Per consumer, ordered by name: how many rows the inbox holds, and when
/// the oldest and the newest were claimed. It reads every row (one
/// aggregate query): on a very large inbox, run it off the hot path.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{idempotent, stats};
///
/// #[idempotent(key = "id")]
/// fn bill(conn: &mut SqliteConnection, id: i64) -> QueryResult<()> {
///     Ok(())
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// for id in 0..3 {
///     bill(&mut conn, id)?;
/// }
/// let per_consumer = stats(&mut conn)?;
/// assert_eq!((per_consumer[0].consumer.as_str(), per_consumer[0].rows), ("bill", 3));
/// assert!(per_consumer[0].oldest <= per_consumer[0].newest);
/// # Ok(())
/// # }
/// ```
pub fn stats<C>(conn: &mut C) -> Result<Vec<ConsumerStats>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    C::Backend::stats(conn).map_err(ops_error::<C::Backend>)
}

/// The async twin of [`status`] (example: [`purge_async`](crate::purge_async)).
#[cfg(feature = "async")]
pub async fn status_async<P, C, Via>(
    conn: &mut P,
    consumer: &str,
    key: &str,
) -> Result<Option<InboxEntry>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    checked_ids(consumer, key)?;
    conn.connection()
        .inbox_entry(consumer, key)
        .await
        .map_err(ops_error::<C::Backend>)
}

/// The async twin of [`attempts`].
#[cfg(feature = "async")]
pub async fn attempts_async<P, C, Via>(
    conn: &mut P,
    consumer: &str,
    key: &str,
) -> Result<Option<Attempts>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    checked_ids(consumer, key)?;
    conn.connection()
        .inbox_attempts(consumer, key)
        .await
        .map(|row| row.map(|row| attempts_of(consumer, key, row)))
        .map_err(ops_error::<C::Backend>)
}

/// The async twin of [`attempts_list`].
#[cfg(feature = "async")]
pub async fn attempts_list_async<P, C, Via>(
    conn: &mut P,
    consumer: Option<&str>,
    min_failures: u32,
    limit: usize,
) -> Result<Vec<Attempts>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    let (min_failures, limit) = checked_list(consumer, min_failures, limit)?;
    conn.connection()
        .inbox_failing(consumer, min_failures, limit)
        .await
        .map(|rows| rows.into_iter().map(failing_of).collect())
        .map_err(ops_error::<C::Backend>)
}

/// The async twin of [`forget`] (example: [`purge_async`](crate::purge_async)).
#[cfg(feature = "async")]
pub async fn forget_async<P, C, Via>(
    conn: &mut P,
    consumer: &str,
    key: &str,
) -> Result<bool, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    checked_ids(consumer, key)?;
    conn.connection()
        .inbox_forget(consumer, key)
        .await
        .map_err(ops_error::<C::Backend>)
}

/// The async twin of [`stats`] (example: [`purge_async`](crate::purge_async)).
#[cfg(feature = "async")]
pub async fn stats_async<P, C, Via>(conn: &mut P) -> Result<Vec<ConsumerStats>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    conn.connection()
        .inbox_stats()
        .await
        .map_err(ops_error::<C::Backend>)
}
