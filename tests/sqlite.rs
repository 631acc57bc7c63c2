//! The behaviour suite on embedded SQLite (always runs). Denies warnings and
//! clippy lints: code that uses `#[idempotent]` stays clean under them.
#![cfg(feature = "sqlite")]
#![deny(warnings, clippy::all)]

#[macro_use]
mod common;

use common::TestDb;
use diesel::connection::SimpleConnection;
use diesel::{Connection, SqliteConnection};

/// An empty database file of the test's own, removed at its end.
fn fresh(test: &str) -> Option<TestDb> {
    let path =
        std::env::temp_dir().join(format!("diesel-inbox-{}.db", common::unique_run_id(test)));
    let path = path.to_str().expect("utf-8 temp dir").to_string();
    // WAL is a property of the file: set it once, before connections race
    // to open it (switching the journal mode takes an exclusive lock that
    // does not wait on the busy timeout).
    SqliteConnection::establish(&path)
        .expect("create sqlite file")
        .batch_execute("PRAGMA journal_mode = WAL")
        .expect("journal mode");
    Some(TestDb::owned(path, discard))
}

fn discard(path: &str) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
}

/// A database file of its own for each test, with the tables in place.
fn prepare(test: &str) -> Option<TestDb> {
    let path = fresh(test)?;
    let mut conn = open(&path);
    diesel_inbox::migrate(&mut conn).expect("migrate");
    conn.batch_execute(common::EFFECTS_DDL)
        .expect("effects table");
    Some(path)
}

fn open(path: &str) -> SqliteConnection {
    let mut conn = SqliteConnection::establish(path).expect("open sqlite file");
    conn.batch_execute("PRAGMA busy_timeout = 10000; PRAGMA synchronous = NORMAL;")
        .expect("pragmas");
    conn
}

inbox_suite!(SqliteConnection, prepare, open, fresh);
