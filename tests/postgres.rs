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

    /// The configured URL, with the inbox and business tables created once per
    /// process; `None` (and one line saying so) when the variable is unset.
    fn prepare(_test: &str) -> Option<TestDb> {
        static READY: OnceLock<Option<String>> = OnceLock::new();
        READY
            .get_or_init(|| {
                let url =
                    common::server_url(URL_VAR, "postgres://postgres@127.0.0.1/diesel_inbox_test")?;
                let mut conn = open(&url);
                diesel_inbox::migrate(&mut conn).expect("migrate");
                conn.batch_execute(common::EFFECTS_DDL)
                    .expect("effects table");
                Some(url)
            })
            .clone()
            .map(TestDb::shared)
    }

    fn open(url: &str) -> PgConnection {
        PgConnection::establish(url)
            .unwrap_or_else(|e| panic!("{URL_VAR} is set but PostgreSQL is unreachable: {e}"))
    }

    /// An empty schema of its own: the URL sets its `search_path`.
    fn fresh(test: &str) -> Option<TestDb> {
        let url = prepare(test)?.url.clone();
        let schema = schema_name(test);
        open(&url)
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .expect("create schema");
        let separator = if url.contains('?') { '&' } else { '?' };
        Some(TestDb::owned(
            format!("{url}{separator}options=-c%20search_path%3D{schema}"),
            discard,
        ))
    }

    fn schema_name(test: &str) -> String {
        common::unique_run_id(test)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect()
    }

    fn discard(url: &str) {
        let schema = url.rsplit("search_path%3D").next().expect("a fresh() URL");
        let _ = open(url).batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
    }

    inbox_suite!(PgConnection, prepare, open, fresh);
}
