//! What the guarantee stands on, as the server reports it: [`durability`]
//! and [`durability_async`] read the backend's catalog query and list each
//! prerequisite with its verdict (`diesel-inbox doctor` prints them).

#[cfg(feature = "async")]
use crate::backend::asynchronous::{AsAsyncConnection, AsyncInboxConnection};
use crate::error::InboxError;
use crate::prerequisite::Prerequisite;
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;

/// Every durability prerequisite of the guarantee that this connection's
/// server reports, and those it cannot read (as [`Verdict::Unknown`]),
/// each with the fix: that a commit is on disk before it is acknowledged
/// (`fsync`, `synchronous_commit`, `innodb_flush_log_at_trx_commit`), and
/// that a failover cannot promote a replica that missed it (PostgreSQL's
/// streaming standbys, read from `pg_stat_replication` and
/// `synchronous_standby_names`; which standby is synchronous needs
/// `pg_read_all_stats`). The same judgement is logged once per process and
/// setting, as a WARN, wherever the catalog is read and finds a problem:
/// `migrate`, a connection's first claim, the relay at start, and this
/// call.
///
/// [`Verdict::Unknown`]: crate::Verdict::Unknown
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::Verdict;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// for prerequisite in diesel_inbox::durability(&mut conn)? {
///     println!("{prerequisite}");
/// }
/// // SQLite's `synchronous` is a setting of each connection: unknown.
/// let listed = diesel_inbox::durability(&mut conn)?;
/// assert!(listed.iter().any(|p| p.name == "synchronous" && p.verdict == Verdict::Unknown));
/// # Ok(())
/// # }
/// ```
pub fn durability<C>(conn: &mut C) -> Result<Vec<Prerequisite>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let catalog = <C::Backend as crate::backend::Internals>::catalog(conn)
        .map_err(super::transaction::ops_error::<C::Backend>)?;
    Ok(catalog.prerequisites)
}

/// The async twin of [`durability`].
#[cfg(feature = "async")]
pub async fn durability_async<P, C, Via>(conn: &mut P) -> Result<Vec<Prerequisite>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    use crate::backend::transaction::{state_known, state_unknown};
    let conn = conn.connection();
    // A call dropped while the query is out leaves a connection its pool
    // discards.
    let status = state_unknown(conn);
    let catalog = conn.catalog().await;
    state_known(conn, status);
    Ok(catalog
        .map_err(super::transaction::ops_error::<C::Backend>)?
        .prerequisites)
}
