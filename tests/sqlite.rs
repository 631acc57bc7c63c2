//! The behaviour suite on embedded SQLite (always runs). Denies warnings and
//! clippy lints: code that uses `#[idempotent]` stays clean under them.
#![cfg(feature = "sqlite")]
#![deny(warnings, clippy::all)]

#[macro_use]
mod common;

use diesel::connection::SimpleConnection;
use diesel::{Connection, SqliteConnection};

/// A database file of its own for each test, so tests run in parallel.
fn prepare(test: &str) -> Option<String> {
    let path = std::env::temp_dir().join(format!("{}.db", common::unique_run_id(test)));
    let path = path.to_str().expect("utf-8 temp dir").to_string();
    let mut conn = open(&path);
    diesel_inbox::migrate(&mut conn).expect("migrate");
    conn.batch_execute(common::EFFECTS_DDL)
        .expect("effects table");
    Some(path)
}

fn open(path: &str) -> SqliteConnection {
    let mut conn = SqliteConnection::establish(path).expect("open sqlite file");
    conn.batch_execute(
        "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;",
    )
    .expect("pragmas");
    conn
}

inbox_suite!(SqliteConnection, prepare, open);
