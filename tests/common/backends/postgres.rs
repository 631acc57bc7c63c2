//! PostgreSQL as a test backend (`INBOX_TEST_POSTGRES_URL`): one shared
//! database, a schema of its own for `fresh`, async connections from bb8.

use crate::common::backend::TestBackend;
use crate::common::TestDb;

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use std::sync::OnceLock;

const URL_VAR: &str = "INBOX_TEST_POSTGRES_URL";

pub fn prepare(_test: &str) -> Option<TestDb> {
    static READY: OnceLock<Option<String>> = OnceLock::new();
    crate::common::shared_server_database(&READY, URL_VAR, crate::common::POSTGRES_HINT, open)
}

pub fn open(url: &str) -> PgConnection {
    crate::common::connected(URL_VAR, PgConnection::establish(url))
}

/// An empty schema of its own: the URL sets its `search_path`.
pub fn fresh(test: &str) -> Option<TestDb> {
    let url = prepare(test)?.url.clone();
    let schema = crate::common::unique_identifier(test);
    open(&url)
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .expect("create schema");
    let separator = if url.contains('?') { '&' } else { '?' };
    Some(TestDb::owned(
        format!("{url}{separator}options=-c%20search_path%3D{schema}"),
        discard,
    ))
}

fn discard(url: &str) {
    let schema = url.rsplit("search_path%3D").next().expect("a fresh() URL");
    let _ = open(url).batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// A database of its own whose server messages are in `locale`'s
/// language (`ALTER DATABASE .. SET lc_messages`, which needs a superuser,
/// as the test role is, and the locale installed before the server
/// started). `Err` says why the server refused it.
pub fn in_language(test: &str, locale: &str) -> Option<Result<TestDb, String>> {
    let url = prepare(test)?.url.clone();
    let name = crate::common::unique_identifier(test);
    let mut admin = open(&url);
    if let Err(e) = admin.batch_execute(&format!("CREATE DATABASE {name}")) {
        return Some(Err(format!("CREATE DATABASE: {e}")));
    }
    let db = TestDb::owned(super::pgbouncer::with_database(&url, &name), drop_database);
    let set = format!("ALTER DATABASE {name} SET lc_messages = '{locale}'");
    Some(admin.batch_execute(&set).map(|()| db).map_err(|e| {
        format!("{set}: {e} (install the locale and restart PostgreSQL, as .ci/run does)")
    }))
}

fn drop_database(url: &str) {
    let name = url.rsplit('/').next().expect("an in_language() URL");
    if let Some(db) = prepare(name) {
        let _ = open(&db).batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    }
}

/// A statement that fails as a deadlock victim does (SQLSTATE 40P01, and
/// the detail and hint by which the runtime knows it).
const FAIL_TRANSIENTLY: &str = "DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING \
     ERRCODE = '40P01', HINT = 'See server log for query details.', DETAIL = \
     'Process 1 waits for ShareLock on transaction 7; blocked by process 2.' || chr(10) || \
     'Process 2 waits for ShareLock on transaction 8; blocked by process 1.'; END $$";

/// PostgreSQL; its async connections come from a bb8 pool (the other
/// backends use deadpool, so both pool crates are covered).
pub struct Postgres;

#[cfg(feature = "async")]
type AsyncPg = diesel_async::AsyncPgConnection;
#[cfg(feature = "async")]
type Manager = diesel_async::pooled_connection::AsyncDieselConnectionManager<AsyncPg>;

impl TestBackend for Postgres {
    type Conn = PgConnection;
    #[cfg(feature = "async")]
    type AsyncConn = AsyncPg;
    #[cfg(feature = "async")]
    type Pool = diesel_async::pooled_connection::bb8::Pool<AsyncPg>;
    #[cfg(feature = "async")]
    type Pooled = diesel_async::pooled_connection::bb8::PooledConnection<'static, AsyncPg>;

    fn prepare(test: &str) -> Option<TestDb> {
        prepare(test)
    }

    fn fresh(test: &str) -> Option<TestDb> {
        fresh(test)
    }

    fn open(url: &str) -> PgConnection {
        open(url)
    }

    #[cfg(feature = "async")]
    fn pool(url: &str) -> Self::Pool {
        // bb8 starts its reaper on the current runtime.
        let _runtime = crate::common::modes::runtime().enter();
        diesel_async::pooled_connection::bb8::Pool::builder()
            .max_size(16)
            .build_unchecked(Manager::new(url))
    }

    #[cfg(feature = "async")]
    async fn pooled(pool: &Self::Pool) -> Self::Pooled {
        pool.get_owned().await.expect("a pooled connection")
    }

    fn fail_transiently(conn: &mut PgConnection) -> diesel::QueryResult<()> {
        conn.batch_execute(FAIL_TRANSIENTLY)
    }

    #[cfg(feature = "async")]
    async fn fail_transiently_async(conn: &mut AsyncPg) -> diesel::QueryResult<()> {
        diesel_async::SimpleAsyncConnection::batch_execute(conn, FAIL_TRANSIENTLY).await
    }

    const DEFERRED_FK: Option<(&'static str, &'static str)> = Some((
        "SELECT 1",
        "CREATE TABLE inbox_test_parent (id BIGINT PRIMARY KEY); \
         CREATE TABLE inbox_test_child (parent_id BIGINT NOT NULL \
           REFERENCES inbox_test_parent (id) DEFERRABLE INITIALLY DEFERRED);",
    ));

    crate::data_access!(PgConnection);
}

#[cfg(feature = "async")]
impl crate::common::cancel::CancelBackend for Postgres {
    const SWALLOWED_ERROR_KEEPS_TRANSACTION: bool = false;

    fn one_connection_pool(
        url: &str,
        recycling: diesel_async::pooled_connection::RecyclingMethod<AsyncPg>,
    ) -> Self::OnePool {
        let mut config: diesel_async::pooled_connection::ManagerConfig<AsyncPg> =
            Default::default();
        config.recycling_method = recycling;
        crate::support::pools::deadpool_with(url.to_owned(), 1, config).expect("a pool")
    }

    type OnePool = diesel_async::pooled_connection::deadpool::Pool<AsyncPg>;
    type OnePooled = diesel_async::pooled_connection::deadpool::Object<AsyncPg>;

    async fn get(pool: &Self::OnePool) -> Self::OnePooled {
        pool.get().await.expect("a pooled connection")
    }

    async fn connect(url: &str) -> AsyncPg {
        <AsyncPg as diesel_async::AsyncConnection>::establish(url)
            .await
            .expect("connect")
    }

    /// Inside a transaction when `now()`, the transaction's start, is the
    /// same in two statements apart (`now() <> statement_timestamp()` does
    /// not tell under the extended protocol, which stamps the statement at
    /// each of its messages); the settings the runtime sets, per
    /// transaction or (wrongly) per session.
    async fn session(conn: &mut AsyncPg) -> (bool, String) {
        let read = || {
            diesel::sql_query(
                "SELECT CAST(now() AS text) AS in_transaction, \
                 concat_ws(' ', current_setting('lock_timeout'), \
                 current_setting('synchronous_commit'), current_setting('statement_timeout'), \
                 current_setting('jit'), current_setting('transaction_isolation'), \
                 COALESCE(NULLIF(current_setting('diesel_inbox.lock_timeout', true), ''), '-')) \
                 AS settings",
            )
        };
        let first: crate::common::cancel::SessionRow =
            diesel_async::RunQueryDsl::get_result(read(), &mut *conn)
                .await
                .expect("read the session");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let second: crate::common::cancel::SessionRow =
            diesel_async::RunQueryDsl::get_result(read(), conn)
                .await
                .expect("read the session");
        (
            first.in_transaction == second.in_transaction,
            second.settings,
        )
    }
}
