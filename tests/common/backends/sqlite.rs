//! SQLite as a test backend: a database file per test, WAL, a busy timeout.

use crate::common::backend::TestBackend;
use crate::common::TestDb;
use diesel::connection::SimpleConnection;
use diesel::{Connection, SqliteConnection};

/// An empty database file of the test's own, removed at its end.
pub fn fresh(test: &str) -> Option<TestDb> {
    let path = std::env::temp_dir().join(format!(
        "diesel-inbox-{}.db",
        crate::common::unique_run_id(test)
    ));
    let path = path.to_str().expect("utf-8 temp dir").to_string();
    // WAL is a property of the file: set it once, before connections race
    // to open it (switching the journal mode takes an exclusive lock that
    // does not wait on the busy timeout).
    SqliteConnection::establish(&path)
        .expect("create sqlite file")
        .batch_execute("PRAGMA journal_mode = WAL")
        .expect("journal mode");
    Some(TestDb::owned(path, discard))
}

fn discard(path: &str) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
}

/// Each connection waits on a busy database file rather than failing.
const PRAGMAS: &str = "PRAGMA busy_timeout = 10000; PRAGMA synchronous = NORMAL;";

pub fn open(path: &str) -> SqliteConnection {
    let mut conn = SqliteConnection::establish(path).expect("open sqlite file");
    conn.batch_execute(PRAGMAS).expect("pragmas");
    conn
}

/// A table whose inserts fail with SQLite's busy message (the error of a
/// writer that waited past `busy_timeout`), for `fail_transiently`.
const BUSY_DDL: &str = "CREATE TABLE inbox_test_busy (x INTEGER); \
    CREATE TRIGGER inbox_test_busy_raise BEFORE INSERT ON inbox_test_busy \
    BEGIN SELECT RAISE(ABORT, 'database is locked'); END;";
const FAIL_TRANSIENTLY: &str = "INSERT INTO inbox_test_busy VALUES (1)";

/// SQLite, a database file per test.
pub struct Sqlite;

/// How a pool makes a connection: opened, then [`PRAGMAS`].
#[cfg(feature = "async")]
fn manager_config() -> diesel_async::pooled_connection::ManagerConfig<AsyncSqlite> {
    use diesel_async::{AsyncConnection, SimpleAsyncConnection};
    let mut config = diesel_async::pooled_connection::ManagerConfig::default();
    config.custom_setup = Box::new(|url| {
        let url = url.to_string();
        Box::pin(async move {
            let mut conn = AsyncSqlite::establish(&url).await?;
            conn.batch_execute(PRAGMAS)
                .await
                .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
            Ok(conn)
        })
    });
    config
}

#[cfg(feature = "async")]
type AsyncSqlite = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>;

impl TestBackend for Sqlite {
    type Conn = SqliteConnection;
    #[cfg(feature = "async")]
    type AsyncConn = AsyncSqlite;

    /// A database file of its own for each test, with the tables in place.
    fn prepare(test: &str) -> Option<TestDb> {
        let path = fresh(test)?;
        let mut conn = open(&path);
        diesel_inbox::migrate(&mut conn).expect("migrate");
        conn.batch_execute(crate::common::EFFECTS_DDL)
            .expect("effects table");
        conn.batch_execute(BUSY_DDL).expect("busy table");
        Some(path)
    }

    fn fresh(test: &str) -> Option<TestDb> {
        fresh(test)
    }

    fn open(url: &str) -> SqliteConnection {
        open(url)
    }

    #[cfg(feature = "async")]
    type Pool = diesel_async::pooled_connection::deadpool::Pool<AsyncSqlite>;
    #[cfg(feature = "async")]
    type Pooled = diesel_async::pooled_connection::deadpool::Object<AsyncSqlite>;

    #[cfg(feature = "async")]
    async fn pooled(pool: &Self::Pool) -> Self::Pooled {
        pool.get().await.expect("a pooled connection")
    }

    #[cfg(feature = "async")]
    fn pool(url: &str) -> Self::Pool {
        crate::support::pools::deadpool_with(url.to_owned(), 16, manager_config()).expect("a pool")
    }

    fn fail_transiently(conn: &mut SqliteConnection) -> diesel::QueryResult<()> {
        conn.batch_execute(FAIL_TRANSIENTLY)
    }

    #[cfg(feature = "async")]
    async fn fail_transiently_async(conn: &mut AsyncSqlite) -> diesel::QueryResult<()> {
        diesel_async::SimpleAsyncConnection::batch_execute(conn, FAIL_TRANSIENTLY).await
    }

    /// Foreign keys are off by default in SQLite; a deferred one is checked at COMMIT.
    const DEFERRED_FK: Option<(&'static str, &'static str)> = Some((
        "PRAGMA foreign_keys = ON",
        "CREATE TABLE inbox_test_parent (id BIGINT PRIMARY KEY); \
         CREATE TABLE inbox_test_child (parent_id BIGINT NOT NULL \
           REFERENCES inbox_test_parent (id) DEFERRABLE INITIALLY DEFERRED);",
    ));

    crate::data_access!(SqliteConnection);
}

#[cfg(feature = "async")]
impl crate::common::cancel::CancelBackend for Sqlite {
    const SWALLOWED_ERROR_KEEPS_TRANSACTION: bool = true;

    fn one_connection_pool(
        url: &str,
        recycling: diesel_async::pooled_connection::RecyclingMethod<AsyncSqlite>,
    ) -> Self::OnePool {
        let mut config = manager_config();
        config.recycling_method = recycling;
        crate::support::pools::deadpool_with(url.to_owned(), 1, config).expect("a pool")
    }

    type OnePool = diesel_async::pooled_connection::deadpool::Pool<AsyncSqlite>;
    type OnePooled = diesel_async::pooled_connection::deadpool::Object<AsyncSqlite>;

    async fn get(pool: &Self::OnePool) -> Self::OnePooled {
        pool.get().await.expect("a pooled connection")
    }

    async fn connect(url: &str) -> AsyncSqlite {
        use diesel_async::{AsyncConnection, SimpleAsyncConnection};
        let mut conn = AsyncSqlite::establish(url).await.expect("open");
        conn.batch_execute(PRAGMAS).await.expect("pragmas");
        conn
    }

    /// Inside a transaction when a `BEGIN` is refused as nested (one that
    /// works is rolled back at once); the busy timeout the runtime bounds.
    async fn session(conn: &mut AsyncSqlite) -> (bool, String) {
        use diesel_async::SimpleAsyncConnection;
        let in_transaction = match conn.batch_execute("BEGIN").await {
            Ok(()) => {
                conn.batch_execute("ROLLBACK").await.expect("rollback");
                false
            }
            Err(e) if e.to_string().contains("within a transaction") => true,
            Err(e) => panic!("BEGIN failed: {e}"),
        };
        #[derive(diesel::QueryableByName)]
        struct Busy {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            timeout: i32,
        }
        let busy: Busy =
            diesel_async::RunQueryDsl::get_result(diesel::sql_query("PRAGMA busy_timeout"), conn)
                .await
                .expect("busy_timeout");
        (in_transaction, format!("busy_timeout={}", busy.timeout))
    }
}
