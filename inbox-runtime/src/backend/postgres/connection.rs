//! PostgreSQL's async connection (diesel-async's `AsyncPgConnection`):
//! its transactions, the claim's round trips, the migration lock, and the
//! outbox's `LISTEN`/`NOTIFY`.

use super::claim::{Claim, ClaimBatch};
use super::*;
use crate::backend::asynchronous::{
    AsyncInboxConnection, AsyncInternals, AsyncMigration, AsyncStatements,
};
use crate::backend::transaction::{ansi, Scope};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};

impl crate::backend::execute::asynchronous::RunsStatements for AsyncPgConnection {}

impl AsyncInboxConnection for AsyncPgConnection {}

impl AsyncInternals for AsyncPgConnection {
    async fn inbox_begin(&mut self) -> Result<Scope, (Scope, Error)> {
        ansi::begin(self).await
    }

    const NOTIFIES: bool = true;

    /// `LISTEN` on the outbox's channel and the probe's, in the simple
    /// query protocol (no prepared statement: it may pass a proxy). No
    /// session setting: until the probe arrives, this may be a proxy's
    /// server connection that other clients share.
    async fn outbox_listen(&mut self, probe: &str) -> QueryResult<bool> {
        debug_assert!(probe
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        self.batch_execute(&format!("LISTEN {OUTBOX_CHANNEL}; LISTEN {probe}"))
            .await?;
        Ok(true)
    }

    async fn outbox_notify(&mut self, probe: &str) -> QueryResult<()> {
        debug_assert!(probe
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        self.batch_execute(&format!("SELECT pg_notify('{probe}', '')"))
            .await
    }

    /// The next notification diesel-async's driver task received; its
    /// stream ends when the connection is gone.
    async fn outbox_notified(&mut self) -> Option<QueryResult<String>> {
        let mut notifications = std::pin::pin!(self.notifications_stream());
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(notifications.as_mut(), cx))
            .await
            .map(|notified| notified.map(|n| n.channel))
    }

    /// The lock waits at most [`ASLEEP_LOCK_WAIT`]: only an enqueue's
    /// probe, one expression long, holds it. The bound is `SET LOCAL`, in
    /// the implicit transaction of the lock's simple query, so it ends
    /// there; the lock is the session's (the relay's listener, proved its
    /// own by the probe). The transactions in progress are read by a
    /// statement of its own, after the lock: a transaction that probed
    /// before it has its id by then ([`IN_PROGRESS`]).
    async fn outbox_asleep(&mut self, held: bool) -> QueryResult<Option<(String, bool)>> {
        if !held {
            let locked = self
                .batch_execute(&format!(
                    "SET LOCAL lock_timeout = '{}ms'; SELECT pg_advisory_lock_shared({ASLEEP_LOCK})",
                    ASLEEP_LOCK_WAIT.as_millis()
                ))
                .await;
            match locked {
                Ok(_) => {}
                Err(e) if <Pg as Internals>::is_wait_timeout(&e) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        let read = diesel::sql_query(IN_PROGRESS);
        let snapshot = diesel_async::RunQueryDsl::get_result::<Snapshot>(read, self).await?;
        Ok(Some((snapshot.snapshot, snapshot.settled)))
    }

    async fn outbox_settled(&mut self, snapshot: &str) -> QueryResult<bool> {
        let check = diesel::sql_query(
            "SELECT NOT EXISTS (SELECT FROM unnest(string_to_array($1, ',')) AS x \
             WHERE pg_xact_status(CAST(x AS xid8)) = 'in progress') AS held",
        )
        .bind::<diesel::sql_types::Text, _>(snapshot);
        diesel_async::RunQueryDsl::get_result::<Held>(check, self)
            .await
            .map(|row| row.held)
    }

    async fn outbox_awake(&mut self) -> QueryResult<()> {
        self.batch_execute(&format!("SELECT pg_advisory_unlock_shared({ASLEEP_LOCK})"))
            .await
    }

    async fn inbox_claim(
        &mut self,
        consumer_name: &str,
        key: &str,
        fingerprint_bytes: Option<&[u8]>,
    ) -> QueryResult<bool> {
        match fingerprint_bytes {
            None => Claim::plain(consumer_name, key).run_async(self).await,
            Some(bytes) => {
                Claim::fingerprinted(consumer_name, key, bytes)
                    .run_async(self)
                    .await
            }
        }
    }

    async fn inbox_lookup(
        &mut self,
        consumer_name: &str,
        key: &str,
    ) -> QueryResult<Option<crate::rows::StoredRow>> {
        super::claim::Lookup {
            consumer: consumer_name,
            key,
        }
        .run_async(self)
        .await
    }

    async fn inbox_claim_batch(
        &mut self,
        consumer_name: &str,
        keys: &[&str],
        fingerprints: Option<&[&[u8]]>,
    ) -> QueryResult<Vec<String>> {
        match fingerprints {
            None => ClaimBatch::plain(consumer_name, keys).run_async(self).await,
            Some(fingerprints) => {
                ClaimBatch::fingerprinted(consumer_name, keys, fingerprints)
                    .run_async(self)
                    .await
            }
        }
    }

    /// At top level, the guarded write ([`claim::Store`]), then, once it
    /// answered, the commit that requires it ([`claim::STORED_COMMIT`]).
    /// Never sent together: a write not yet prepared on the session (its
    /// first run, a failed prepare, a statement cache resized or turned
    /// off) would let the commit overtake it, and sending both at once
    /// measured no faster (`docs/performance.md`). A failed write is left
    /// to the engine's rollback; a failed commit is rolled back. Dropped
    /// at either await, the transaction stays recorded in diesel-async's
    /// manager, so a pool discards the connection.
    async fn inbox_store_commit(
        &mut self,
        consumer_name: &str,
        key: &str,
        value: &[u8],
        scope: Scope,
    ) -> (QueryResult<()>, Option<QueryResult<()>>) {
        if scope == Scope::Savepoint {
            let stored = AsyncStatements::inbox_store_result(self, consumer_name, key, value);
            return (stored.await, None);
        }
        let store = claim::Store {
            consumer: consumer_name,
            key,
            value,
        };
        if let Err(e) = store.run_async(self).await {
            return (Err(e), None);
        }
        ansi::closing(self);
        let committed = match self.batch_execute(&claim::STORED_COMMIT).await {
            Ok(()) => ansi::closed(self),
            Err(e) => Err(failed_commit(self, e).await),
        };
        (Ok(()), Some(committed))
    }

    async fn inbox_commit(&mut self, scope: Scope) -> QueryResult<()> {
        if scope == Scope::Savepoint {
            return ansi::commit(self).await;
        }
        // diesel-async does not read the session's transaction status:
        // the manager is marked broken while the guard's COMMIT is on its
        // way, and told how it ended once it answered.
        ansi::closing(self);
        match self.batch_execute(GUARDED_COMMIT).await {
            Ok(()) => ansi::closed(self),
            Err(e) => Err(failed_commit(self, e).await),
        }
    }

    async fn inbox_rollback(&mut self) {
        ansi::rollback(self).await
    }
}

/// The error of a failed guarded commit ([`GUARDED_COMMIT`],
/// [`claim::STORED_COMMIT`]), after its rollback: marked when the
/// transaction was already aborted by a statement of the body (25P02). A
/// guard stops the batch before its `COMMIT`, so the transaction is then
/// still open, which a failed `COMMIT` never leaves it. diesel-async does
/// not read the session's status: a statement asks, refused only inside an
/// aborted transaction. A guard's own refusal names the runtime.
async fn failed_commit(conn: &mut AsyncPgConnection, error: Error) -> Error {
    // Still inside the transaction until the rollback below says otherwise.
    if let Err(e) = ansi::reopened(conn) {
        return e;
    }
    let asks = matches!(&error, Error::DatabaseError(DatabaseErrorKind::Unknown, info)
        if !info.message().contains(claim::GUARD));
    // Refused by a live server (a code, so `Unknown`), not by a connection
    // that closed (no code: `UnableToSendCommand`), as after a COMMIT the
    // server answered with FATAL: that commit is not the body's doing.
    let aborted = asks
        && matches!(
            conn.batch_execute("SELECT 1").await,
            Err(Error::DatabaseError(DatabaseErrorKind::Unknown, _))
        );
    ansi::rollback(conn).await;
    match aborted {
        true => crate::backend::errors::aborted_transaction(error),
        false => error,
    }
}

impl AsyncMigration for AsyncPgConnection {
    async fn catalog(&mut self) -> QueryResult<Catalog> {
        crate::backend::shape::catalog_async(self).await
    }

    async fn lock(&mut self) -> Result<Scope, InboxError> {
        // DDL is transactional: the lock and every change end together.
        let scope = ansi::begin(self).await.map_err(|(_, e)| e)?;
        let lock = format!("SELECT pg_advisory_xact_lock({MIGRATE_LOCK})");
        if let Err(e) = self.batch_execute(&lock).await {
            ansi::rollback(self).await;
            return Err(InboxError::MigrationFailed(e));
        }
        Ok(scope)
    }

    async fn unlock(&mut self, scope: Scope, keep: bool) -> Result<(), InboxError> {
        if !keep {
            ansi::rollback(self).await;
            return Ok(());
        }
        // A commit at top level, a release inside the caller's transaction.
        let _ = scope;
        ansi::commit(self)
            .await
            .map_err(InboxError::MigrationFailed)
    }
}

/// How long a relay going to sleep waits for the lock an enqueue's probe
/// holds for one expression.
const ASLEEP_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// A boolean answer.
#[derive(diesel::QueryableByName)]
struct Held {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    held: bool,
}

/// The transactions in progress, and whether they still are.
#[derive(diesel::QueryableByName)]
struct Snapshot {
    #[diesel(sql_type = diesel::sql_types::Text)]
    snapshot: String,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    settled: bool,
}

/// The transactions in progress now, as a list of ids, and whether none
/// of them is (`settled`, checked in the same statement). A snapshot
/// lists those below its `xmax` (the latest finished id, plus one); the
/// ids from there up to one taken now (this statement's own, excluded)
/// were all in progress at the snapshot and are added. Its own commit
/// does not wait for the WAL flush (it takes an id and writes nothing):
/// `synchronous_commit` off for this transaction only.
const IN_PROGRESS: &str = "WITH t AS MATERIALIZED (SELECT pg_current_snapshot() AS s, \
     pg_current_xact_id() AS me, set_config('synchronous_commit', 'off', true) AS local) \
     SELECT COALESCE(string_agg(CAST(x AS text), ','), '') AS snapshot, \
     NOT COALESCE(bool_or(pg_xact_status(x) = 'in progress'), false) AS settled \
     FROM (SELECT pg_snapshot_xip(s) AS x FROM t UNION ALL \
     SELECT CAST(CAST(g AS text) AS xid8) FROM t, generate_series(\
     CAST(CAST(pg_snapshot_xmax(s) AS text) AS bigint), CAST(CAST(me AS text) AS bigint) - 1) AS g) AS w";
