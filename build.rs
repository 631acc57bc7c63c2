//! Lets the server test suites report themselves as ignored, not passed,
//! when their server is not configured: `cfg(inbox_test_postgres)` and
//! `cfg(inbox_test_mysql)` (and `cfg(inbox_test_galera)`, `cfg(inbox_test_pgbouncer)`) are set when
//! `INBOX_TEST_POSTGRES_URL` / `INBOX_TEST_MYSQL_URL` (`INBOX_TEST_GALERA_URLS`, `INBOX_TEST_PGBOUNCER_URL`)
//! is set at build time. Nothing in the library reads
//! them.
fn main() {
    for (var, cfg) in [
        ("INBOX_TEST_POSTGRES_URL", "inbox_test_postgres"),
        ("INBOX_TEST_MYSQL_URL", "inbox_test_mysql"),
        ("INBOX_TEST_GALERA_URLS", "inbox_test_galera"),
        ("INBOX_TEST_PGBOUNCER_URL", "inbox_test_pgbouncer"),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo::rerun-if-env-changed={var}");
        if std::env::var_os(var).is_some_and(|url| !url.is_empty()) {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
