//! SQLite: a temporary file (WAL, `synchronous = NORMAL`).

use crate::bench::Bench;
#[cfg(feature = "async")]
use crate::Order;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_inbox::inbox_messages as inbox;

pub struct Sqlite;

#[cfg(feature = "async")]
type AsyncSqlite = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>;

/// `claim(key)`: the hand-written async claim.
#[cfg(feature = "async")]
fn claim(
    key: &str,
) -> impl diesel::query_builder::QueryFragment<diesel::sqlite::Sqlite>
       + diesel::query_builder::QueryId
       + Send
       + '_ {
    diesel::insert_into(inbox::table)
        .values((
            inbox::consumer.eq("bench-async-raw"),
            inbox::message_id.eq(key),
        ))
        .on_conflict((inbox::consumer, inbox::message_id))
        .do_nothing()
}

/// `BEGIN IMMEDIATE` (the write lock up front, as the sync variants and
/// the inbox take it), in a hop to the blocking thread.
#[cfg(feature = "async")]
async fn begin_immediate(conn: &mut AsyncSqlite) -> QueryResult<()> {
    conn.spawn_blocking(|c| c.batch_execute("BEGIN IMMEDIATE"))
        .await
}

/// `COMMIT` after `Ok`, `ROLLBACK` after `Err`.
#[cfg(feature = "async")]
async fn end<T>(conn: &mut AsyncSqlite, result: QueryResult<T>) -> QueryResult<T> {
    use diesel_async::SimpleAsyncConnection;
    match result {
        Ok(value) => conn.batch_execute("COMMIT").await.map(|()| value),
        Err(e) => {
            let _ = conn.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

impl Bench for Sqlite {
    const NAME: &'static str = "sqlite";
    const LABEL: &'static str = "SQLite";
    const VERSION_SQL: &'static str = "'SQLite ' || sqlite_version()";
    const OUTBOX_EMPTIED: Option<&'static str> = None;
    type Conn = SqliteConnection;

    fn open(url: &str) -> SqliteConnection {
        let mut conn = SqliteConnection::establish(url).expect("open sqlite");
        conn.batch_execute(
            "PRAGMA busy_timeout = 30000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;",
        )
        .expect("pragmas");
        conn
    }

    /// Writers must take the lock at BEGIN, as the inbox does.
    fn tx<T>(
        conn: &mut SqliteConnection,
        f: impl FnOnce(&mut SqliteConnection) -> QueryResult<T>,
    ) -> QueryResult<T> {
        conn.immediate_transaction(f)
    }

    fn claim_by_hand(conn: &mut SqliteConnection, consumer: &str, key: &str) -> QueryResult<usize> {
        diesel::insert_into(inbox::table)
            .values((inbox::consumer.eq(consumer), inbox::message_id.eq(key)))
            .on_conflict((inbox::consumer, inbox::message_id))
            .do_nothing()
            .execute(conn)
    }

    super::orders_access!(SqliteConnection);

    #[cfg(feature = "async")]
    type AsyncConn = AsyncSqlite;
    #[cfg(feature = "async")]
    const EXTRA: Option<&'static str> = Some("async_one_hop");

    #[cfg(feature = "async")]
    super::deadpool_types!(AsyncSqlite);

    /// Each connection set up with a busy timeout and `synchronous = NORMAL`.
    #[cfg(feature = "async")]
    fn pool(url: &str, size: usize) -> Self::Pool {
        use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
        use diesel_async::{AsyncConnection, SimpleAsyncConnection};
        let mut config = ManagerConfig::default();
        config.custom_setup = Box::new(|url| {
            let url = url.to_string();
            Box::pin(async move {
                let mut conn = AsyncSqlite::establish(&url).await?;
                conn.batch_execute("PRAGMA busy_timeout = 30000; PRAGMA synchronous = NORMAL;")
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        });
        let manager = AsyncDieselConnectionManager::new_with_config(url, config);
        diesel_async::pooled_connection::deadpool::Pool::builder(manager)
            .max_size(size)
            .build()
            .expect("a pool")
    }

    /// The write between `BEGIN IMMEDIATE` and `COMMIT`, each statement
    /// awaited as an `async fn` body's would be.
    #[cfg(feature = "async")]
    async fn bare_async(conn: &mut AsyncSqlite, order: &Order) -> QueryResult<()> {
        begin_immediate(conn).await?;
        let written = Self::insert_order_async(conn, order).await.map(drop);
        end(conn, written).await
    }

    /// The hand-written inbox the same way: `BEGIN IMMEDIATE`, the claim,
    /// the write if it inserted, `COMMIT`.
    #[cfg(feature = "async")]
    async fn raw_sql_async(conn: &mut AsyncSqlite, order: &Order) -> QueryResult<()> {
        begin_immediate(conn).await?;
        let written = async {
            if diesel_async::RunQueryDsl::execute(claim(&order.id), &mut *conn).await? == 1 {
                Self::insert_order_async(conn, order).await?;
            }
            Ok(())
        }
        .await;
        end(conn, written).await
    }

    /// `async_one_hop`: the sync `raw_sql` (`BEGIN IMMEDIATE`, claim,
    /// write, `COMMIT`) in one `spawn_blocking`.
    #[cfg(feature = "async")]
    async fn extra_async(conn: &mut AsyncSqlite, order: &Order) -> QueryResult<()> {
        let order = order.clone();
        conn.spawn_blocking(move |c| crate::variants::raw_sql::<Sqlite>(c, &order))
            .await
    }
}
