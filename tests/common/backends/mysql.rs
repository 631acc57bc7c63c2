//! MySQL/MariaDB as a test backend (`INBOX_TEST_MYSQL_URL`): one shared
//! database, a database of its own for `fresh`, async connections from deadpool.

use crate::common::backend::TestBackend;
use crate::common::TestDb;

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection};
use std::sync::OnceLock;

const URL_VAR: &str = "INBOX_TEST_MYSQL_URL";

pub fn prepare(_test: &str) -> Option<TestDb> {
    static READY: OnceLock<Option<String>> = OnceLock::new();
    crate::common::shared_server_database(&READY, URL_VAR, crate::common::MYSQL_HINT, open)
}

pub fn open(url: &str) -> MysqlConnection {
    crate::common::connected(URL_VAR, MysqlConnection::establish(url))
}

/// An empty database of its own on the same server.
pub fn fresh(test: &str) -> Option<TestDb> {
    let url = prepare(test)?.url.clone();
    let name = crate::common::unique_identifier(test);
    Some(TestDb::owned(create_database(&url, &name, open), discard))
}

/// Creates database `name` through `open(url)`; the URL of that database
/// on the same server.
pub(crate) fn create_database(url: &str, name: &str, open: fn(&str) -> MysqlConnection) -> String {
    open(url)
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create database");
    let base = url.split('?').next().expect("split yields one part");
    let server = &base[..base.rfind('/').expect("a database path in the URL")];
    format!("{server}/{name}")
}

/// Drops the database a `fresh()` URL names.
pub(crate) fn discard(url: &str) {
    let name = url.rsplit('/').next().expect("a fresh() URL");
    let _ = open(url).batch_execute(&format!("DROP DATABASE {name}"));
}

/// A statement that fails as a deadlock victim (or a Galera
/// certification loser) does: error 1213.
pub(crate) const FAIL_TRANSIENTLY: &str = "SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, \
     MESSAGE_TEXT = 'Deadlock found when trying to get lock; try restarting transaction'";

/// MySQL/MariaDB; its async connections come from a deadpool pool.
pub struct Mysql;

#[cfg(feature = "async")]
type AsyncMysql = diesel_async::AsyncMysqlConnection;

impl TestBackend for Mysql {
    type Conn = MysqlConnection;
    #[cfg(feature = "async")]
    type AsyncConn = AsyncMysql;
    #[cfg(feature = "async")]
    type Pool = diesel_async::pooled_connection::deadpool::Pool<AsyncMysql>;
    #[cfg(feature = "async")]
    type Pooled = diesel_async::pooled_connection::deadpool::Object<AsyncMysql>;

    fn prepare(test: &str) -> Option<TestDb> {
        prepare(test)
    }

    fn fresh(test: &str) -> Option<TestDb> {
        fresh(test)
    }

    fn open(url: &str) -> MysqlConnection {
        open(url)
    }

    #[cfg(feature = "async")]
    fn pool(url: &str) -> Self::Pool {
        let manager =
            diesel_async::pooled_connection::AsyncDieselConnectionManager::<AsyncMysql>::new(url);
        diesel_async::pooled_connection::deadpool::Pool::builder(manager)
            .max_size(16)
            .build()
            .expect("a pool")
    }

    #[cfg(feature = "async")]
    async fn pooled(pool: &Self::Pool) -> Self::Pooled {
        pool.get().await.expect("a pooled connection")
    }

    fn fail_transiently(conn: &mut MysqlConnection) -> diesel::QueryResult<()> {
        conn.batch_execute(FAIL_TRANSIENTLY)
    }

    #[cfg(feature = "async")]
    async fn fail_transiently_async(conn: &mut AsyncMysql) -> diesel::QueryResult<()> {
        diesel_async::SimpleAsyncConnection::batch_execute(conn, FAIL_TRANSIENTLY).await
    }

    /// MySQL and MariaDB check foreign keys at once, never at COMMIT.
    const DEFERRED_FK: Option<(&'static str, &'static str)> = None;

    crate::data_access!(MysqlConnection);
}

#[cfg(feature = "async")]
impl crate::common::cancel::CancelBackend for Mysql {
    const SWALLOWED_ERROR_KEEPS_TRANSACTION: bool = true;

    fn one_connection_pool(
        url: &str,
        recycling: diesel_async::pooled_connection::RecyclingMethod<AsyncMysql>,
    ) -> Self::OnePool {
        let mut config: diesel_async::pooled_connection::ManagerConfig<AsyncMysql> =
            Default::default();
        config.recycling_method = recycling;
        crate::support::pools::deadpool_with(url.to_owned(), 1, config).expect("a pool")
    }

    type OnePool = diesel_async::pooled_connection::deadpool::Pool<AsyncMysql>;
    type OnePooled = diesel_async::pooled_connection::deadpool::Object<AsyncMysql>;

    async fn get(pool: &Self::OnePool) -> Self::OnePooled {
        pool.get().await.expect("a pooled connection")
    }

    async fn connect(url: &str) -> AsyncMysql {
        <AsyncMysql as diesel_async::AsyncConnection>::establish(url)
            .await
            .expect("connect")
    }

    /// `@@in_transaction`, and the settings the runtime sets.
    async fn session(conn: &mut AsyncMysql) -> (bool, String) {
        let row: crate::common::cancel::SessionRow = diesel_async::RunQueryDsl::get_result(
            diesel::sql_query(
                "SELECT CONCAT(@@in_transaction) AS in_transaction, \
                 CONCAT_WS(' ', @@innodb_lock_wait_timeout, @@autocommit) AS settings",
            ),
            conn,
        )
        .await
        .expect("read the session");
        (row.in_transaction == "1", row.settings)
    }
}
