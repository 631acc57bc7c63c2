//! The behaviour suite on MySQL/MariaDB. Set `INBOX_TEST_MYSQL_URL`
//! (e.g. `mysql://root@127.0.0.1/diesel_inbox_test`) to run it.
#![cfg_attr(not(feature = "mysql"), allow(unused))]

#[macro_use]
mod common;

#[cfg(not(feature = "mysql"))]
#[test]
fn mysql_suite_skipped() {
    common::skipped("the mysql suite needs the `mysql` feature and INBOX_TEST_MYSQL_URL; run with INBOX_TEST_MYSQL_URL=mysql://root@127.0.0.1/diesel_inbox_test cargo test --all-features");
}

#[cfg(feature = "mysql")]
mod suite {
    use super::common;
    use common::TestDb;

    use diesel::connection::SimpleConnection;
    use diesel::{Connection, MysqlConnection};
    use std::sync::OnceLock;

    const URL_VAR: &str = "INBOX_TEST_MYSQL_URL";

    fn prepare(_test: &str) -> Option<TestDb> {
        static READY: OnceLock<Option<String>> = OnceLock::new();
        common::shared_server_database(
            &READY,
            URL_VAR,
            "mysql://root@127.0.0.1/diesel_inbox_test",
            open,
        )
    }

    fn open(url: &str) -> MysqlConnection {
        MysqlConnection::establish(url)
            .unwrap_or_else(|e| panic!("{URL_VAR} is set but MySQL/MariaDB is unreachable: {e}"))
    }

    /// An empty database of its own on the same server.
    fn fresh(test: &str) -> Option<TestDb> {
        let url = prepare(test)?.url.clone();
        let name = common::unique_identifier(test);
        open(&url)
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create database");
        let base = url.split('?').next().expect("split yields one part");
        let server = &base[..base.rfind('/').expect("a database path in the URL")];
        Some(TestDb::owned(format!("{server}/{name}"), discard))
    }

    fn discard(url: &str) {
        let name = url.rsplit('/').next().expect("a fresh() URL");
        let _ = open(url).batch_execute(&format!("DROP DATABASE {name}"));
    }

    inbox_suite!(MysqlConnection, prepare, open, fresh);

    #[test]
    fn migrate_refuses_to_run_inside_a_transaction() {
        let Some(url) = prepare("migrate_in_tx") else {
            return;
        };
        let mut conn = open(&url);
        let result =
            conn.transaction(|conn| Ok::<_, diesel::result::Error>(diesel_inbox::migrate(conn)));
        assert!(matches!(
            result,
            Ok(Err(diesel_inbox::InboxError::MigrationInTransaction))
        ));
        // Outside a transaction it runs.
        diesel_inbox::migrate(&mut conn).expect("migrate outside a transaction");
    }
}
