//! What every mode of the benchmark shares: the measured database's
//! traits ([`Bench`], [`Server`], implemented once per backend in
//! `backends/`), a [`Target`] (one backend with its generic code
//! instantiated, made in `targets.rs`), and a [`Cell`] of samples. It
//! imports no mode, so that the modes and the backends import it without
//! a cycle.

use crate::args::Args;
use crate::Order;
use diesel::connection::LoadConnection;
use diesel::QueryResult;
use diesel_inbox::InboxConnection;

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
    /// What runs after the outbox's fill, untimed (PostgreSQL: `ANALYZE`,
    /// as autovacuum's analyze of a table that changed this much would).
    const OUTBOX_FILLED: Option<&'static str> = None;
    /// `--outbox-horizon`'s long transaction: opened, with a read that
    /// takes its snapshot (`None`: not measured on this backend).
    const HOLD_SNAPSHOT: Option<&'static str> = None;
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
pub type Scale = fn(&Target, &Args) -> Result<(Vec<Cell>, KeySizes), String>;

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

/// One (backend, mode, threads or tasks) cell: the samples of each variant
/// in messages/s.
pub struct Cell {
    pub backend: &'static str,
    /// The backend's name in print (MariaDB, not mysql).
    pub label: &'static str,
    /// `sync` (threads, a connection each) or `async` (tasks over a pool).
    pub mode: &'static str,
    pub threads: usize,
    pub samples: Vec<(&'static str, Vec<f64>)>,
}

/// (backend, inbox rows, primary-key bytes) of each size.
pub type KeySizes = Vec<(&'static str, i64, i64)>;
