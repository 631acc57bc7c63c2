//! What a measured database supplies, as the tests' `TestBackend` has it:
//! its connections, its transaction and hand-written claim, the business
//! writes, and for the server backends what `--scale` and `--purge` need.
//! Each backend file implements the traits once; the variants and modes
//! are generic over them.

use crate::args::Args;
use crate::output::Cell;
use crate::Order;
use diesel::connection::LoadConnection;
use diesel::QueryResult;
use diesel_inbox::InboxConnection;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// A database the variants run on.
pub trait Bench: Sized + 'static {
    /// `sqlite`, `postgres` or `mysql`: `--backend`'s value, the results' key.
    const NAME: &'static str;
    /// The name in print (MariaDB, not mysql).
    const LABEL: &'static str;
    /// A query for the server's version, for the results.
    const VERSION_SQL: &'static str;
    /// What `--outbox` runs after each round empties `outbox_messages`
    /// (untimed), if anything.
    const OUTBOX_EMPTIED: Option<&'static str>;
    /// The sync connection.
    type Conn: InboxConnection + LoadConnection + Send + 'static;

    fn open(url: &str) -> Self::Conn;
    /// The hand-written variants' transaction (SQLite takes the write lock
    /// at BEGIN, as the inbox does).
    fn tx<T>(
        conn: &mut Self::Conn,
        f: impl FnOnce(&mut Self::Conn) -> QueryResult<T>,
    ) -> QueryResult<T>;
    /// `raw_sql`'s claim: one conflict-ignoring insert into the inbox.
    fn claim_by_hand(conn: &mut Self::Conn, consumer: &str, key: &str) -> QueryResult<usize>;

    /// The business write: one `bench_orders` row.
    fn insert_order(conn: &mut Self::Conn, order: &Order) -> QueryResult<usize>;
    /// One multi-row insert of `orders`.
    fn insert_orders<'o>(
        conn: &mut Self::Conn,
        orders: impl Iterator<Item = &'o Order>,
    ) -> QueryResult<usize>;
    /// `naive`'s SELECT: the inbox rows of `key`.
    fn seen(conn: &mut Self::Conn, consumer: &str, key: &str) -> QueryResult<i64>;
    /// The server's version, for the results (`VERSION_SQL`).
    fn version(url: &str) -> String;
    /// `naive`'s INSERT of the inbox row.
    fn record(conn: &mut Self::Conn, consumer: &str, key: &str) -> QueryResult<usize>;
    /// `outbox_by_hand`: the outbox row written with diesel's insert, the
    /// times by the client's clock.
    fn enqueue_by_hand(
        conn: &mut Self::Conn,
        id: &str,
        key: &str,
        payload: &[u8],
    ) -> QueryResult<usize>;
    /// The hand-written relay's claim (`--outbox`): the relay's own SQL
    /// (the oldest due row of each key, `SKIP LOCKED`), `limit` rows, in
    /// the caller's transaction: (seq, id, destination, payload).
    fn hand_claim(conn: &mut Self::Conn, limit: usize) -> QueryResult<Vec<HandRow>>;
    /// The hand-written relay's delete of the published rows.
    fn hand_delete(conn: &mut Self::Conn, seqs: &[i64]) -> QueryResult<usize>;

    /// The async connection (diesel-async) from a deadpool pool.
    #[cfg(feature = "async")]
    type AsyncConn: diesel_inbox::AsyncInboxConnection<Backend: Send>
        + diesel_async::pooled_connection::PoolableConnection
        + 'static;
    /// The async variant only this backend runs (`async_one_hop`,
    /// `async_pipelined`), measured by `extra_async`.
    #[cfg(feature = "async")]
    const EXTRA: Option<&'static str>;
    /// A deadpool pool of `size` connections, and the connection it hands out.
    #[cfg(feature = "async")]
    type Pool: Send + Sync + 'static;
    #[cfg(feature = "async")]
    type Pooled: std::ops::DerefMut<Target = Self::AsyncConn> + Send + 'static;
    #[cfg(feature = "async")]
    fn pool(url: &str, size: usize) -> Self::Pool;
    /// The same pool, as the outbox relay takes it (`--outbox`).
    #[cfg(all(feature = "async", feature = "lapin"))]
    type RelayPool: diesel_inbox::outbox::RelayPool<Connection = Self::AsyncConn> + Clone + 'static;
    #[cfg(all(feature = "async", feature = "lapin"))]
    fn relay_pool(url: &str, size: usize) -> Self::RelayPool;
    #[cfg(feature = "async")]
    fn pooled(
        pool: &Self::Pool,
    ) -> impl std::future::Future<Output = Result<Self::Pooled, String>> + Send;
    #[cfg(feature = "async")]
    fn insert_order_async(
        conn: &mut Self::AsyncConn,
        order: &Order,
    ) -> impl std::future::Future<Output = QueryResult<usize>> + Send;
    /// `async_bare`: the write in the backend's async transaction.
    #[cfg(feature = "async")]
    fn bare_async(
        conn: &mut Self::AsyncConn,
        order: &Order,
    ) -> impl std::future::Future<Output = QueryResult<()>> + Send;
    /// `async_raw_sql`: the hand-written inbox.
    #[cfg(feature = "async")]
    fn raw_sql_async(
        conn: &mut Self::AsyncConn,
        order: &Order,
    ) -> impl std::future::Future<Output = QueryResult<()>> + Send;
    /// [`Bench::EXTRA`]'s variant.
    #[cfg(feature = "async")]
    fn extra_async(
        conn: &mut Self::AsyncConn,
        order: &Order,
    ) -> impl std::future::Future<Output = QueryResult<()>> + Send;
}

/// What `--scale` and `--purge` need of a server backend besides [`Bench`].
pub trait Server: Bench {
    /// A schema or database of its own named `name`: (its URL, the
    /// statement that drops it).
    fn fresh(url: &str, name: &str) -> Result<(String, String), String>;
    /// `VACUUM ANALYZE`, `ANALYZE TABLE`: fresh statistics after a fill.
    const ANALYZE: &'static str;
    /// INSERT of `rows` random UUIDv4 keys under consumer `bench`, in key
    /// order (`--scale`).
    fn scale_fill(rows: usize) -> String;
    /// Bytes of the inbox's primary key (the clustered index on InnoDB).
    fn key_bytes(url: &str) -> Result<i64, String>;
    /// INSERT of `rows` rows of slice `slice` under consumer `bench-old`,
    /// `days` old (`--purge`).
    fn purge_fill(slice: usize, rows: usize, days: u64) -> String;
}

/// Runs SQL on a URL.
pub fn execute<B: Bench>(url: &str, sql: &str) -> Result<(), String> {
    use diesel::connection::SimpleConnection;
    B::open(url).batch_execute(sql).map_err(|e| e.to_string())
}

pub type Measure = fn(&str, &'static str, usize, usize, usize, &str) -> Result<f64, String>;
#[cfg(feature = "async")]
pub type MeasureAsync = fn(&str, &'static str, usize, usize, &str) -> Result<f64, String>;
/// `--scale` on one target: the cells (a sample list per size) and each
/// size's primary-key bytes.
pub type Scale = fn(&Target, &Args) -> Result<(Vec<Cell>, crate::scale::KeySizes), String>;
/// `--purge` on one target: its JSON result.
pub type Purge = fn(&str, &Args) -> Result<String, String>;

/// One backend to measure, its generic code instantiated.
pub struct Target {
    pub name: &'static str,
    pub label: &'static str,
    pub url: String,
    pub setup: fn(&str) -> Result<(), String>,
    pub measure: Measure,
    /// The server's version string.
    pub version: fn(&str) -> String,
    /// The async measurement and which async variants run here.
    #[cfg(feature = "async")]
    pub measure_async: (MeasureAsync, fn(&str) -> bool),
    /// `--scale` and `--purge`, on the server backends.
    pub server: Option<(Scale, Purge)>,
    /// `--outbox`: its JSON result.
    #[cfg(all(feature = "async", feature = "lapin"))]
    pub outbox: fn(&str, &Args, &str) -> Result<String, String>,
}

impl Target {
    fn of<B: Bench>(url: String) -> Target {
        Target {
            name: B::NAME,
            label: B::LABEL,
            url,
            setup: crate::variants::setup::<B>,
            measure: crate::variants::measure::<B>,
            version: B::version,
            #[cfg(feature = "async")]
            measure_async: (
                crate::variants::measure_async::<B>,
                crate::variants::has_async::<B>,
            ),
            server: None,
            #[cfg(all(feature = "async", feature = "lapin"))]
            outbox: crate::outbox::measure::<B>,
        }
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn server<B: Server>(url: String) -> Target {
        Target {
            server: Some((crate::scale::measure::<B>, crate::purge::measure::<B>)),
            ..Target::of::<B>(url)
        }
    }

    /// A server target from its URL variable; `None` after a SKIPPED line.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn from_env<B: Server>(var: &str) -> Option<Target> {
        match std::env::var(var) {
            Ok(url) if !url.is_empty() => Some(Target::server::<B>(url)),
            _ => {
                println!(
                    "SKIPPED: {}: {var} is not set (e.g. {}://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test; the database must exist)",
                    B::NAME,
                    B::NAME
                );
                None
            }
        }
    }
}

/// The `--backend` targets compiled in and configured.
pub fn targets(args: &Args) -> Vec<Target> {
    let wanted = |name: &str| args.backends.iter().any(|b| b == "all" || b == name);
    let mut all = Vec::new();
    #[cfg(feature = "sqlite")]
    if wanted(sqlite::Sqlite::NAME) {
        let file = format!("diesel-inbox-bench-{}.db", crate::run_id());
        let path = std::env::temp_dir().join(file);
        all.push(Target::of::<sqlite::Sqlite>(
            path.to_string_lossy().into_owned(),
        ));
    }
    #[cfg(feature = "postgres")]
    if wanted(postgres::Postgres::NAME) {
        all.extend(Target::from_env::<postgres::Postgres>(
            "INBOX_TEST_POSTGRES_URL",
        ));
    }
    #[cfg(feature = "mysql")]
    if wanted(mysql::Mysql::NAME) {
        all.extend(Target::from_env::<mysql::Mysql>("INBOX_TEST_MYSQL_URL"));
    }
    let _ = wanted;
    all
}

/// A row the hand-written relay claimed.
#[derive(diesel::QueryableByName)]
pub struct HandRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub seq: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub destination: String,
    #[diesel(sql_type = diesel::sql_types::Binary)]
    pub payload: Vec<u8>,
}

/// The business-table and inbox access of [`Bench`], the same code for
/// every connection type: `orders_access!(Conn)` inside its impl.
macro_rules! orders_access {
    ($Conn:ty) => {
        fn insert_order(conn: &mut $Conn, order: &$crate::Order) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use $crate::bench_orders;
            diesel::insert_into(bench_orders::table)
                .values((
                    bench_orders::id.eq(&order.id),
                    bench_orders::amount.eq(order.amount),
                ))
                .execute(conn)
        }

        fn insert_orders<'o>(
            conn: &mut $Conn,
            orders: impl Iterator<Item = &'o $crate::Order>,
        ) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use $crate::bench_orders;
            let rows: Vec<_> = orders
                .map(|o| {
                    (
                        bench_orders::id.eq(&o.id),
                        bench_orders::amount.eq(o.amount),
                    )
                })
                .collect();
            diesel::insert_into(bench_orders::table)
                .values(&rows)
                .execute(conn)
        }

        fn version(url: &str) -> String {
            use diesel::prelude::*;
            diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
                Self::VERSION_SQL,
            ))
            .get_result(&mut Self::open(url))
            .unwrap_or_else(|e| format!("unknown ({e})"))
        }

        fn seen(conn: &mut $Conn, consumer: &str, key: &str) -> diesel::QueryResult<i64> {
            use diesel::prelude::*;
            use diesel_inbox::inbox_messages as inbox;
            inbox::table
                .filter(inbox::consumer.eq(consumer))
                .filter(inbox::message_id.eq(key))
                .count()
                .get_result(conn)
        }

        fn enqueue_by_hand(
            conn: &mut $Conn,
            id: &str,
            key: &str,
            payload: &[u8],
        ) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use diesel_inbox::outbox_messages as o;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64);
            diesel::insert_into(o::table)
                .values((
                    o::id.eq(id),
                    o::destination.eq("bench.stock"),
                    o::ordering_key.eq(key),
                    o::payload.eq(payload),
                    o::created_at.eq(now),
                    o::available_at.eq(now),
                    o::attempts.eq(0),
                ))
                .execute(conn)
        }

        fn hand_claim(conn: &mut $Conn, limit: usize) -> diesel::QueryResult<Vec<$crate::backends::HandRow>> {
            use diesel::prelude::*;
            type B = <$Conn as diesel::Connection>::Backend;
            // The relay's own settings (PostgreSQL: no JIT, no wait for the
            // WAL flush).
            let (setup, now, skip_locked) = diesel_inbox::__testing::relay_sql::<B>();
            if let Some(setup) = setup {
                diesel::connection::SimpleConnection::batch_execute(conn, setup)?;
            }
            diesel::sql_query(format!(
                "SELECT o.seq, o.id, o.destination, o.payload FROM outbox_messages o \
                 WHERE o.dead_at IS NULL AND o.available_at <= {now} \
                 AND (o.locked_until IS NULL OR o.locked_until < {now}) \
                 AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM outbox_messages e \
                 WHERE e.ordering_key = o.ordering_key AND e.seq < o.seq AND e.dead_at IS NULL)) \
                 ORDER BY o.seq LIMIT {limit}{skip_locked}"
            ))
            .load(conn)
        }

        fn hand_delete(conn: &mut $Conn, seqs: &[i64]) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use diesel_inbox::outbox_messages as o;
            diesel::delete(o::table.filter(o::seq.eq_any(seqs))).execute(conn)
        }

        fn record(conn: &mut $Conn, consumer: &str, key: &str) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use diesel_inbox::inbox_messages as inbox;
            diesel::insert_into(inbox::table)
                .values((inbox::consumer.eq(consumer), inbox::message_id.eq(key)))
                .execute(conn)
        }

        #[cfg(feature = "async")]
        async fn insert_order_async(
            conn: &mut Self::AsyncConn,
            order: &$crate::Order,
        ) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use $crate::bench_orders;
            let insert = diesel::insert_into(bench_orders::table).values((
                bench_orders::id.eq(&order.id),
                bench_orders::amount.eq(order.amount),
            ));
            diesel_async::RunQueryDsl::execute(insert, conn).await
        }
    };
}
use orders_access;

/// The pool and pooled connection types of a diesel-async connection
/// `$Conn` on deadpool, and taking a connection: `deadpool_types!(Conn)`
/// inside a [`Bench`] impl (its `pool` stays its own).
#[cfg(feature = "async")]
macro_rules! deadpool_types {
    ($Conn:ty) => {
        type Pool = diesel_async::pooled_connection::deadpool::Pool<$Conn>;
        type Pooled = diesel_async::pooled_connection::deadpool::Object<$Conn>;
        #[cfg(feature = "lapin")]
        type RelayPool = Self::Pool;

        #[cfg(feature = "lapin")]
        fn relay_pool(url: &str, size: usize) -> Self::Pool {
            Self::pool(url, size)
        }

        async fn pooled(pool: &Self::Pool) -> Result<Self::Pooled, String> {
            pool.get().await.map_err(|e| format!("pool: {e}"))
        }
    };
}
#[cfg(feature = "async")]
use deadpool_types;

/// The hand-written async variants on diesel-async's transaction (the
/// server backends), with the backend's `claim(key)` statement.
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
macro_rules! async_variants {
    () => {
        async fn bare_async(conn: &mut Self::AsyncConn, order: &$crate::Order) -> QueryResult<()> {
            use diesel_async::AsyncConnection;
            conn.transaction(async |c| {
                Self::insert_order_async(c, order).await?;
                Ok(())
            })
            .await
        }

        async fn raw_sql_async(
            conn: &mut Self::AsyncConn,
            order: &$crate::Order,
        ) -> QueryResult<()> {
            use diesel_async::AsyncConnection;
            conn.transaction(async |c| {
                if diesel_async::RunQueryDsl::execute(claim(&order.id), c).await? == 1 {
                    Self::insert_order_async(c, order).await?;
                }
                Ok(())
            })
            .await
        }
    };
}
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
use async_variants;
