//! What every scenario uses: the fault tables, the database of a scenario,
//! the exactness check, worker processes.

use crate::backend::FaultBackend;
use crate::common::TestDb;
use crate::{expected_effects, CONSUMER};
use diesel::connection::SimpleConnection;
use std::process::{Command, Stdio};

diesel::table! {
    /// The durable "broker": a message stays until a worker acks it.
    inbox_fault_queue (run_id, seq) {
        run_id -> Text,
        seq -> BigInt,
        message_key -> Text,
        amount -> BigInt,
        deliveries -> Integer,
        acked -> Bool,
    }
}

diesel::table! {
    /// Shared counters that concurrent handlers update (conflicts on purpose).
    inbox_fault_counters (name) {
        name -> Text,
        value -> BigInt,
    }
}

const QUEUE_DDL: &str = "CREATE TABLE IF NOT EXISTS inbox_fault_queue (\
    run_id VARCHAR(64) NOT NULL, seq BIGINT NOT NULL, message_key VARCHAR(255) NOT NULL, \
    amount BIGINT NOT NULL, deliveries INTEGER NOT NULL DEFAULT 0, \
    acked BOOLEAN NOT NULL DEFAULT FALSE, PRIMARY KEY (run_id, seq))";

const COUNTERS_DDL: &str = "CREATE TABLE IF NOT EXISTS inbox_fault_counters (\
    name VARCHAR(128) NOT NULL PRIMARY KEY, value BIGINT NOT NULL)";

/// The database of one scenario (a file of its own on SQLite; the shared
/// test database on a server, rows kept apart by run id), with the inbox,
/// business and fault tables in place, and a sync connection to it.
pub fn setup<B: FaultBackend>(scenario: &str) -> Result<(TestDb, B::Conn), String> {
    setup_on::<B>(B::prepare(scenario).ok_or("the server is not configured")?)
}

/// [`setup`] on a database of the scenario's own.
pub fn setup_on<B: FaultBackend>(db: TestDb) -> Result<(TestDb, B::Conn), String> {
    let mut conn = B::open(&db);
    diesel_inbox::migrate(&mut conn).map_err(|e| format!("migrate: {e}"))?;
    for ddl in [crate::common::EFFECTS_DDL, QUEUE_DDL, COUNTERS_DDL] {
        conn.batch_execute(ddl).map_err(|e| format!("{ddl}: {e}"))?;
    }
    Ok((db, conn))
}

/// Business rows and inbox rows equal one application of `seqs`.
pub fn check_exact<B: FaultBackend>(
    conn: &mut B::Conn,
    run: &str,
    seqs: impl IntoIterator<Item = i64> + Clone,
) -> Result<(), String> {
    let expected = expected_effects(run, seqs.clone());
    let actual = B::effects_of(conn, run);
    if actual != expected {
        let doubled = actual.windows(2).filter(|w| w[0] == w[1]).count();
        return Err(format!(
            "business rows differ: {} expected, {} found ({doubled} doubled)",
            expected.len(),
            actual.len()
        ));
    }
    let inbox = B::inbox_rows_of_run(conn, CONSUMER, run);
    let distinct = seqs.into_iter().count() as i64;
    crate::ensure!(
        inbox == distinct,
        "{inbox} inbox rows for {distinct} messages"
    );
    Ok(())
}

/// A worker process of this binary in `role`, for backend `B` in `mode`.
pub fn spawn_worker<B: FaultBackend>(mode: &str, role: &str, envs: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("own executable"));
    cmd.env("INBOX_FAULT_ROLE", role)
        .env("INBOX_FAULT_BACKEND", B::NAME)
        .env("INBOX_FAULT_MODE", mode);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

pub fn env_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("worker needs {name}"))
}

pub fn env_num(name: &str) -> usize {
    env_var(name)
        .parse()
        .unwrap_or_else(|_| panic!("{name} is a number"))
}

/// `Err(e.to_string())` for `?` in scenarios.
pub fn text<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<T, String> {
    r.map_err(|e| e.to_string())
}
