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

    use diesel::connection::SimpleConnection;
    use diesel::{Connection, MysqlConnection};
    use std::sync::OnceLock;

    const URL_VAR: &str = "INBOX_TEST_MYSQL_URL";

    /// The configured URL, with the inbox and business tables created once per
    /// process; `None` (and one line saying so) when the variable is unset.
    fn prepare(_test: &str) -> Option<String> {
        static READY: OnceLock<Option<String>> = OnceLock::new();
        READY
            .get_or_init(|| {
                let url = common::server_url(URL_VAR, "mysql://root@127.0.0.1/diesel_inbox_test")?;
                let mut conn = open(&url);
                diesel_inbox::migrate(&mut conn).expect("migrate");
                conn.batch_execute(common::EFFECTS_DDL)
                    .expect("effects table");
                Some(url)
            })
            .clone()
    }

    fn open(url: &str) -> MysqlConnection {
        MysqlConnection::establish(url)
            .unwrap_or_else(|e| panic!("{URL_VAR} is set but MySQL/MariaDB is unreachable: {e}"))
    }

    inbox_suite!(MysqlConnection, prepare, open);

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
