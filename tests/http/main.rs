//! The HTTP front door over TCP: a real axum server process (this binary
//! run again, `INBOX_HTTP_ROLE=server`) with idempotent endpoints on a
//! deadpool pool, a real HTTP client (reqwest), real databases: SQLite
//! (a file), PostgreSQL (`INBOX_TEST_POSTGRES_URL`) and MySQL/MariaDB
//! (`INBOX_TEST_MYSQL_URL`); a server that is not configured is reported
//! as skipped. The backends run side by side, one thread each.
//!
//! Per backend: 100 concurrent requests with one key; a reused key, a
//! key of another scope, a missing or invalid key; a body that fails or
//! panics; a request in flight past the wait (409); a binary body, one
//! over the stored-body cap; a stored response not yet committed (never
//! replayed); the server SIGKILLed inside the body and
//! after the commit; the database refusing connections (PostgreSQL and
//! MySQL, through a TCP proxy).

#[path = "../support/mod.rs"]
mod support;
#[cfg(all(feature = "axum", feature = "sqlite"))]
use support::proxy;
#[cfg(all(feature = "axum", feature = "sqlite"))]
mod scenarios;
#[cfg(all(feature = "axum", feature = "sqlite"))]
mod server;

#[cfg(all(feature = "axum", feature = "sqlite"))]
fn main() {
    scenarios::main();
}

#[cfg(not(all(feature = "axum", feature = "sqlite")))]
fn main() {
    println!("SKIPPED: the HTTP front door's tests need the `axum` and `sqlite` features: cargo test --all-features --test http");
}
