//! What the fault scenarios need that differs per backend.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

pub trait FaultConnection: Sized {
    /// Label in reports.
    const LABEL: &'static str;

    /// A database for one scenario: the server's (shared, rows isolated by
    /// run id) or, for SQLite, a new file.
    fn scenario_database(server_url: &str) -> String;

    fn open(url: &str) -> Self;

    /// The server session id, for killing it from another session.
    fn session_id(&mut self) -> Option<u64>;

    /// Ends `id`'s session from another session.
    fn kill(&mut self, id: u64) -> QueryResult<()>;

    /// Makes a waiting claim give up after a short lock wait, so that a
    /// body outlasting it exercises the retry of lock timeouts.
    fn short_lock_wait(&mut self) -> QueryResult<()>;

    /// Removes a scenario database made by `scenario_database`.
    fn discard(url: &str);
}

#[cfg(feature = "sqlite")]
impl FaultConnection for diesel::SqliteConnection {
    const LABEL: &'static str = "SQLite (file, WAL)";

    fn scenario_database(_: &str) -> String {
        let path = std::env::temp_dir().join(format!("diesel-inbox-{}.db", crate::fault_run_id()));
        path.to_str().expect("utf-8 temp dir").to_string()
    }

    fn open(url: &str) -> Self {
        let mut conn = diesel::SqliteConnection::establish(url).expect("open sqlite file");
        conn.batch_execute(
            "PRAGMA busy_timeout = 30000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;",
        )
        .expect("pragmas");
        conn
    }

    fn session_id(&mut self) -> Option<u64> {
        None
    }

    fn kill(&mut self, _: u64) -> QueryResult<()> {
        Ok(())
    }

    fn short_lock_wait(&mut self) -> QueryResult<()> {
        self.batch_execute("PRAGMA busy_timeout = 300")
    }

    fn discard(url: &str) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{url}{suffix}"));
        }
    }
}

#[cfg(feature = "postgres")]
impl FaultConnection for diesel::PgConnection {
    const LABEL: &'static str = "PostgreSQL";

    fn scenario_database(server_url: &str) -> String {
        server_url.to_string()
    }

    fn open(url: &str) -> Self {
        crate::common::connected(
            "INBOX_TEST_POSTGRES_URL",
            diesel::PgConnection::establish(url),
        )
    }

    fn session_id(&mut self) -> Option<u64> {
        diesel::select(diesel::dsl::sql::<diesel::sql_types::Integer>(
            "pg_backend_pid()",
        ))
        .get_result::<i32>(self)
        .ok()
        .map(|pid| pid as u64)
    }

    fn kill(&mut self, id: u64) -> QueryResult<()> {
        self.batch_execute(&format!("SELECT pg_terminate_backend({id})"))
    }

    fn short_lock_wait(&mut self) -> QueryResult<()> {
        self.batch_execute("SET lock_timeout = '300ms'")
    }

    fn discard(_: &str) {}
}

#[cfg(feature = "mysql")]
impl FaultConnection for diesel::MysqlConnection {
    const LABEL: &'static str = "MariaDB";

    fn scenario_database(server_url: &str) -> String {
        server_url.to_string()
    }

    fn open(url: &str) -> Self {
        crate::common::connected(
            "INBOX_TEST_MYSQL_URL",
            diesel::MysqlConnection::establish(url),
        )
    }

    fn session_id(&mut self) -> Option<u64> {
        diesel::select(diesel::dsl::sql::<
            diesel::sql_types::Unsigned<diesel::sql_types::BigInt>,
        >("CONNECTION_ID()"))
        .get_result::<u64>(self)
        .ok()
    }

    fn kill(&mut self, id: u64) -> QueryResult<()> {
        self.batch_execute(&format!("KILL {id}"))
    }

    fn short_lock_wait(&mut self) -> QueryResult<()> {
        self.batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
    }

    fn discard(_: &str) {}
}
