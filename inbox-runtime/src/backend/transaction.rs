//! The transaction primitives of the inbox's connections, sync and async:
//! open a transaction at top level with the backend's `BEGIN` (or a
//! savepoint inside the caller's), commit, roll back, and the depth
//! diesel's transaction manager records. Below the engine and the drivers,
//! so that a backend can open a transaction for its own `migrate` lock.

use super::InboxBackend;
use diesel::connection::{AnsiTransactionManager, Connection, TransactionManager};
use diesel::result::Error;

/// Whether the transaction is the call's own or a savepoint inside the
/// caller's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[doc(hidden)]
pub enum Scope {
    #[doc(hidden)]
    TopLevel,
    #[doc(hidden)]
    Savepoint,
}

/// Opens a transaction with the backend's `BEGIN` (SQLite: `BEGIN IMMEDIATE`,
/// so a writer takes the lock up front instead of failing at its first write),
/// or a savepoint when the caller already has a transaction open.
pub(crate) fn begin<C>(conn: &mut C) -> Result<Scope, (Scope, Error)>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    // diesel keeps the depth private; begin_transaction_sql refuses inside a
    // transaction, which is exactly the test we need.
    match <C::Backend as crate::backend::Internals>::begin_top_level(conn) {
        Ok(()) => Ok(Scope::TopLevel),
        Err(Error::AlreadyInTransaction) => AnsiTransactionManager::begin_transaction(conn)
            .map(|()| Scope::Savepoint)
            .map_err(|e| (Scope::Savepoint, e)),
        Err(e) => Err((Scope::TopLevel, e)),
    }
}

/// Commits the call's transaction (through the backend's guarded commit at
/// top level) or releases its savepoint.
pub(crate) fn commit<C>(conn: &mut C, scope: Scope) -> Result<(), Error>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    match scope {
        Scope::TopLevel => <C::Backend as crate::backend::Internals>::commit_top_level(conn),
        Scope::Savepoint => AnsiTransactionManager::commit_transaction(conn),
    }
}

/// Whether diesel has a transaction open on `conn` (a broken transaction
/// manager counts as none: nothing can be done with it).
pub(crate) fn transaction_open<C>(conn: &mut C) -> bool
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    matches!(
        AnsiTransactionManager::transaction_manager_status_mut(conn).transaction_depth(),
        Ok(Some(_))
    )
}

/// Rolls back the innermost transaction or savepoint, if one is open.
pub(crate) fn rollback<C>(conn: &mut C)
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    let depth = AnsiTransactionManager::transaction_manager_status_mut(conn).transaction_depth();
    let rolled_back = match depth {
        // Nothing to undo when the transaction already ended: PostgreSQL
        // leaves it after a failed COMMIT, and diesel resyncs its depth
        // from libpq.
        Ok(None) | Err(_) => return,
        Ok(Some(depth)) if depth.get() == 1 => {
            <C::Backend as crate::backend::Internals>::rollback_top_level(conn)
        }
        Ok(Some(_)) => AnsiTransactionManager::rollback_transaction(conn),
    };
    // A failed rollback leaves diesel's manager marked broken (pools discard
    // such connections) and the server rolls back when the session ends.
    if let Err(e) = rolled_back {
        tracing::warn!(target: crate::target::TARGET, error = %e, "diesel-inbox: rollback failed");
    }
}

/// Ends the transaction (or savepoint) a `migrate` lock opened with
/// [`begin`]: commit when `keep`, else roll back.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn end_migrations<C>(
    conn: &mut C,
    scope: Scope,
    keep: bool,
) -> Result<(), crate::error::InboxError>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    if keep {
        return commit(conn, scope).map_err(crate::error::InboxError::MigrationFailed);
    }
    rollback(conn);
    Ok(())
}

#[cfg(all(feature = "async", feature = "_server-backend"))]
pub(crate) mod ansi {
    //! The transaction steps of connections with diesel-async's
    //! `AnsiTransactionManager` (PostgreSQL, MySQL/MariaDB).

    use super::Scope;
    use diesel::result::Error;
    use diesel_async::{AnsiTransactionManager, AsyncConnection, TransactionManager};

    fn depth<C>(conn: &mut C) -> Result<Option<std::num::NonZeroU32>, Error>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        AnsiTransactionManager::transaction_manager_status_mut(conn).transaction_depth()
    }

    /// `BEGIN` at top level, a savepoint inside the caller's transaction.
    pub(crate) async fn begin<C>(conn: &mut C) -> Result<Scope, (Scope, Error)>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        let scope = match depth(conn) {
            Ok(None) => Scope::TopLevel,
            Ok(Some(_)) => Scope::Savepoint,
            Err(e) => return Err((Scope::TopLevel, e)),
        };
        AnsiTransactionManager::begin_transaction(conn)
            .await
            .map(|()| scope)
            .map_err(|e| (scope, e))
    }

    /// Rolls back the innermost transaction (or savepoint) through the
    /// transaction manager; a failure leaves the connection marked broken.
    #[cfg(feature = "postgres")]
    pub(crate) async fn rollback<C>(conn: &mut C)
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        rollback_unless_ended(conn, |_| false).await
    }

    /// [`rollback`], where a failed top-level `ROLLBACK` whose error says
    /// the server ended the transaction already (`ended`, the backend's
    /// judgement) leaves the connection outside any transaction rather than
    /// marked broken.
    pub(crate) async fn rollback_unless_ended<C>(conn: &mut C, ended: fn(&Error) -> bool)
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        let top_level = match depth(conn) {
            Ok(Some(depth)) => depth.get() == 1,
            _ => return,
        };
        if let Err(e) = AnsiTransactionManager::rollback_transaction(conn).await {
            if top_level && ended(&e) {
                *AnsiTransactionManager::transaction_manager_status_mut(conn) = Default::default();
                return;
            }
            tracing::warn!(target: crate::target::TARGET, error = %e, "diesel-inbox: rollback failed");
        }
    }

    /// Commits at top level, releases the savepoint inside the caller's
    /// transaction (a failed top-level commit is rolled back by diesel-async).
    pub(crate) async fn commit<C>(conn: &mut C) -> Result<(), Error>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        AnsiTransactionManager::commit_transaction(conn).await
    }

    /// Before the runtime sends a batch of its own that opens a top-level
    /// transaction (MySQL's `BEGIN` with the wait bound): the manager is
    /// marked broken until the batch has answered ([`opened`]). A future
    /// dropped while the batch is on its way leaves the connection in a
    /// state nobody knows: pools then discard it, and diesel-async refuses
    /// transactions on a connection of the caller's own with
    /// `BrokenTransactionManager` (which must be dropped: a plain statement
    /// would still run inside the orphan transaction). Fails where the
    /// manager is broken or has a transaction open already.
    #[cfg(feature = "mysql")]
    pub(crate) fn opening<C>(conn: &mut C) -> Result<(), (Scope, Error)>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        match depth(conn) {
            Ok(None) => {
                AnsiTransactionManager::transaction_manager_status_mut(conn).set_in_error();
                Ok(())
            }
            Ok(Some(_)) => Err((Scope::TopLevel, Error::AlreadyInTransaction)),
            Err(e) => Err((Scope::TopLevel, e)),
        }
    }

    /// After the batch of [`opening`] answered (`begun`): the transaction
    /// is recorded as diesel-async's. A failed batch may have run its
    /// `BEGIN`: it is rolled back by the manager (which marks the
    /// connection broken if that fails too), and the error reported as the
    /// begin's.
    #[cfg(feature = "mysql")]
    pub(crate) async fn opened<C>(
        conn: &mut C,
        begun: Result<(), Error>,
    ) -> Result<Scope, (Scope, Error)>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        reopened(conn).map_err(|e| (Scope::TopLevel, e))?;
        match begun {
            Ok(()) => Ok(Scope::TopLevel),
            Err(e) => {
                let _ = AnsiTransactionManager::rollback_transaction(conn).await;
                Err((Scope::TopLevel, e))
            }
        }
    }

    /// Before the runtime sends a statement of its own that ends the
    /// top-level transaction (PostgreSQL's guarded `COMMIT`): as
    /// [`opening`], the manager is marked broken until [`closed`] says how
    /// it ended, so a future dropped meanwhile leaves a connection that
    /// pools discard.
    #[cfg(feature = "postgres")]
    pub(crate) fn closing<C>(conn: &mut C)
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        AnsiTransactionManager::transaction_manager_status_mut(conn).set_in_error();
    }

    /// After the statement of [`closing`] answered that it worked: outside
    /// any transaction. One that failed goes back to [`reopened`] and is
    /// rolled back.
    #[cfg(feature = "postgres")]
    pub(crate) fn closed<C>(conn: &mut C) -> Result<(), Error>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        *AnsiTransactionManager::transaction_manager_status_mut(conn) = Default::default();
        Ok(())
    }

    /// Records a top-level transaction open, whatever the status said (a
    /// `COMMIT` of [`closing`] that failed may have left it open).
    pub(crate) fn reopened<C>(conn: &mut C) -> Result<(), Error>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        let status = AnsiTransactionManager::transaction_manager_status_mut(conn);
        *status = Default::default();
        crate::backend::record_boundary(
            status,
            diesel::connection::TransactionDepthChange::IncreaseDepth,
        )
    }
}

/// Marks diesel-async's manager of `conn` broken while the runtime sends a
/// statement of its own outside any transaction: one that leaves state for
/// the connection's next transaction (MySQL's `SET TRANSACTION ISOLATION
/// LEVEL`, pending until the `BEGIN` that follows), or any other (MySQL's
/// driver cannot tell the answer of a statement whose future was dropped
/// from the next statement's). A future dropped before [`state_known`]
/// puts the status back leaves a connection that pools discard, and that
/// diesel-async refuses transactions on. Inside a transaction it does
/// nothing: the open transaction already makes pools discard a connection
/// dropped there. Costs two writes of the status.
#[cfg(feature = "async")]
pub(crate) fn state_unknown<C: diesel_async::AsyncConnection>(
    conn: &mut C,
) -> Option<diesel::connection::TransactionManagerStatus> {
    use diesel_async::TransactionManager;
    let status = C::TransactionManager::transaction_manager_status_mut(conn);
    match status.transaction_depth() {
        Ok(None) => Some(std::mem::replace(
            status,
            diesel::connection::TransactionManagerStatus::InError,
        )),
        _ => None,
    }
}

/// Puts back the status [`state_unknown`] set aside.
#[cfg(feature = "async")]
pub(crate) fn state_known<C: diesel_async::AsyncConnection>(
    conn: &mut C,
    status: Option<diesel::connection::TransactionManagerStatus>,
) {
    use diesel_async::TransactionManager;
    if let Some(status) = status {
        *C::TransactionManager::transaction_manager_status_mut(conn) = status;
    }
}

/// Whether diesel-async has a transaction open on `conn`.
#[cfg(feature = "async")]
pub(crate) fn transaction_open_async<C: diesel_async::AsyncConnection>(conn: &mut C) -> bool {
    use diesel_async::TransactionManager;
    matches!(
        C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth(),
        Ok(Some(_))
    )
}
