//! PostgreSQL through PgBouncer in transaction mode
//! (`INBOX_TEST_PGBOUNCER_URL`, started by `scripts/pgbouncer.sh`), with
//! diesel's statement cache disabled as the guide's proxy section says:
//! every statement runs unnamed, in one round trip, so that no client
//! reaches another's prepared statement. A fresh database per test (the
//! proxy does not pass a `search_path` through `options`), created and
//! dropped on the server directly (`INBOX_TEST_POSTGRES_URL`).

use crate::common::backend::TestBackend;
use crate::common::TestDb;

use diesel::connection::{CacheSize, SimpleConnection};
use diesel::{Connection, PgConnection};
use std::sync::OnceLock;

pub const URL_VAR: &str = "INBOX_TEST_PGBOUNCER_URL";
pub const HINT: &str = "start PgBouncer with `bash scripts/pgbouncer.sh start`, set INBOX_TEST_PGBOUNCER_URL=$(bash scripts/pgbouncer.sh url) and INBOX_TEST_POSTGRES_URL, and run cargo test --all-features --test pgbouncer";

pub fn prepare(_test: &str) -> Option<TestDb> {
    static READY: OnceLock<Option<String>> = OnceLock::new();
    crate::common::shared_server_database(&READY, URL_VAR, HINT, open)
}

/// A connection through the proxy with diesel's statement cache disabled.
pub fn open(url: &str) -> PgConnection {
    let mut conn = open_cached(url);
    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
    conn
}

/// A connection through the proxy with diesel's default statement cache.
pub fn open_cached(url: &str) -> PgConnection {
    crate::common::connected(URL_VAR, PgConnection::establish(url))
}

/// The server's own URL (for `CREATE DATABASE`, checks without the proxy).
pub fn direct_url() -> Option<String> {
    crate::common::server_url("INBOX_TEST_POSTGRES_URL", crate::common::POSTGRES_HINT)
}

/// `url` with its database replaced by `name`.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, _) = url.rsplit_once('/').expect("a URL with a database");
    format!("{base}/{name}")
}

/// An empty database of its own, reached through the proxy.
pub fn fresh(test: &str) -> Option<TestDb> {
    let url = prepare(test)?.url.clone();
    let direct = direct_url()?;
    let name = crate::common::unique_identifier(test);
    super::postgres::open(&direct)
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create database");
    Some(TestDb::owned(with_database(&url, &name), discard))
}

fn discard(url: &str) {
    let name = url.rsplit('/').next().expect("a fresh() URL");
    if let Some(direct) = direct_url() {
        let _ = super::postgres::open(&direct)
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    }
}

/// PostgreSQL behind PgBouncer; its async connections (unused by the sync
/// suites) come from bb8 through the proxy.
pub struct PgBouncer;

#[cfg(feature = "async")]
type AsyncPg = diesel_async::AsyncPgConnection;

impl TestBackend for PgBouncer {
    type Conn = PgConnection;
    #[cfg(feature = "async")]
    type AsyncConn = AsyncPg;
    #[cfg(feature = "async")]
    type Pool = <super::postgres::Postgres as TestBackend>::Pool;
    #[cfg(feature = "async")]
    type Pooled = <super::postgres::Postgres as TestBackend>::Pooled;

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
        <super::postgres::Postgres as TestBackend>::pool(url)
    }

    #[cfg(feature = "async")]
    async fn pooled(pool: &Self::Pool) -> Self::Pooled {
        <super::postgres::Postgres as TestBackend>::pooled(pool).await
    }

    fn fail_transiently(conn: &mut PgConnection) -> diesel::QueryResult<()> {
        <super::postgres::Postgres as TestBackend>::fail_transiently(conn)
    }

    #[cfg(feature = "async")]
    async fn fail_transiently_async(conn: &mut AsyncPg) -> diesel::QueryResult<()> {
        <super::postgres::Postgres as TestBackend>::fail_transiently_async(conn).await
    }

    const DEFERRED_FK: Option<(&'static str, &'static str)> =
        <super::postgres::Postgres as TestBackend>::DEFERRED_FK;

    crate::data_access!(PgConnection);
}
