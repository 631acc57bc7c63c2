//! The behaviour suite on PostgreSQL. Set `INBOX_TEST_POSTGRES_URL`
//! (e.g. `postgres://postgres@127.0.0.1/diesel_inbox_test`) to run it.
#![cfg_attr(not(feature = "postgres"), allow(unused))]

#[macro_use]
mod common;

#[cfg(not(feature = "postgres"))]
#[test]
fn postgres_suite_skipped() {
    common::skipped("the postgres suite needs the `postgres` feature and INBOX_TEST_POSTGRES_URL; run with INBOX_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1/diesel_inbox_test cargo test --all-features");
}

#[cfg(feature = "postgres")]
mod suite {
    use super::common;
    use common::TestDb;

    use diesel::connection::SimpleConnection;
    use diesel::{Connection, PgConnection};
    use std::sync::OnceLock;

    const URL_VAR: &str = "INBOX_TEST_POSTGRES_URL";

    fn prepare(_test: &str) -> Option<TestDb> {
        static READY: OnceLock<Option<String>> = OnceLock::new();
        common::shared_server_database(
            &READY,
            URL_VAR,
            "postgres://postgres@127.0.0.1/diesel_inbox_test",
            open,
        )
    }

    fn open(url: &str) -> PgConnection {
        PgConnection::establish(url)
            .unwrap_or_else(|e| panic!("{URL_VAR} is set but PostgreSQL is unreachable: {e}"))
    }

    /// An empty schema of its own: the URL sets its `search_path`.
    fn fresh(test: &str) -> Option<TestDb> {
        let url = prepare(test)?.url.clone();
        let schema = common::unique_identifier(test);
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

    inbox_suite!(PgConnection, prepare, open, fresh);
}
