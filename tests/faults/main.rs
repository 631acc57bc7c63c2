//! Fault-injection suite: the guarantee under the failures of production.
//!
//! Every scenario ends with the same check: the business table equals one
//! application of each delivered message, no key applied twice, none lost.
//! It runs against real servers (SQLite always; PostgreSQL and MySQL/MariaDB
//! when `INBOX_TEST_POSTGRES_URL` / `INBOX_TEST_MYSQL_URL` are set and the
//! features are on) and re-runs its own binary as worker processes that
//! crash with `std::process::abort()`. The backends run side by side, one
//! thread each; a backend's scenarios run one after another.
//!
//! `cargo test --test faults -- [FILTER]` runs the scenarios whose name
//! contains FILTER. `INBOX_PROPTEST_CASES=N` runs the randomized schedules
//! longer (default 24 cases per backend). The table of the last run is
//! written to `target/inbox-faults/report.md`.

#[path = "../support/mod.rs"]
mod support;
#[path = "../common/mod.rs"]
#[macro_use]
mod common;

mod backend;
mod conflicts;
mod input;
mod killed;
mod language;
mod nesting;
mod processes;
mod scenario;
mod schedules;
mod session;

use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

/// The consumer name of the main fault handler.
pub const CONSUMER: &str = "fault-consumer";

/// Where a worker process aborts (no unwinding, no destructors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    BeforeClaim,
    AfterClaim,
    MidBody,
    AfterCommit,
    DuringAck,
}

impl CrashPoint {
    pub const ALL: [CrashPoint; 5] = [
        CrashPoint::BeforeClaim,
        CrashPoint::AfterClaim,
        CrashPoint::MidBody,
        CrashPoint::AfterCommit,
        CrashPoint::DuringAck,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::BeforeClaim => "before-claim",
            CrashPoint::AfterClaim => "after-claim",
            CrashPoint::MidBody => "mid-body",
            CrashPoint::AfterCommit => "after-commit",
            CrashPoint::DuringAck => "during-ack",
        }
    }

    pub fn parse(name: &str) -> Option<CrashPoint> {
        CrashPoint::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// One message of a run: its key is unique to the run.
pub struct Message {
    pub run: String,
    pub seq: i64,
    pub key: String,
    pub amount: i64,
}

pub fn message(run: &str, seq: i64) -> Message {
    Message {
        run: run.to_string(),
        seq,
        key: format!("{run}:{seq}"),
        amount: seq * 7 % 100 + 1,
    }
}

/// The business rows one application of each of `seqs` gives (the fault
/// handler writes two rows per message, so a torn body would show).
pub fn expected_effects(run: &str, seqs: impl IntoIterator<Item = i64>) -> Vec<(String, i64)> {
    let mut rows: Vec<(String, i64)> = seqs
        .into_iter()
        .flat_map(|seq| {
            let m = message(run, seq);
            [(format!("{}/second", m.key), 0), (m.key, m.amount)]
        })
        .collect();
    rows.sort();
    rows
}

/// A run id of letters and digits only (safe in LIKE patterns and names).
pub fn fault_run_id() -> String {
    common::unique_identifier("f").replace('_', "x")
}

/// A small deterministic generator (the same stream in every process).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// `messages` distinct messages plus `duplicate_percent`% redeliveries of
/// random ones, shuffled.
pub fn delivery_stream(messages: usize, duplicate_percent: usize, seed: u64) -> Vec<i64> {
    let mut rng = Lcg(seed);
    let mut stream: Vec<i64> = (0..messages as i64).collect();
    for _ in 0..messages * duplicate_percent / 100 {
        stream.push(rng.below(messages) as i64);
    }
    for i in (1..stream.len()).rev() {
        stream.swap(i, rng.below(i + 1));
    }
    stream
}

/// What a scenario reports: a row of the README's table, or why it did not run.
pub enum Outcome {
    Pass(String),
    Skip(String),
}

pub type ScenarioResult = Result<Outcome, String>;

/// Fails the scenario with a message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

type Scenario = (&'static str, fn() -> ScenarioResult);

/// The scenarios of one backend: each that applies to async handlers runs
/// for sync and for async ones (`sync::many_processes`,
/// `async::many_processes`, ...).
fn scenarios<B: backend::FaultBackend>() -> Vec<Scenario> {
    use session::SyncSession;
    #[allow(unused_mut)] // async adds its own
    let mut all: Vec<Scenario> = vec![
        (
            "sync::many_processes",
            processes::many_processes::<SyncSession<B>>,
        ),
        (
            "sync::crash_at_every_point",
            processes::crash_at_every_point::<SyncSession<B>>,
        ),
        (
            "sync::connection_killed_mid_transaction",
            killed::connection_killed_mid_transaction::<SyncSession<B>>,
        ),
        (
            "sync::serializable_overlapping_writes",
            conflicts::serializable_overlapping_writes::<SyncSession<B>>,
        ),
        (
            "sync::serialization_failure_retried_then_exhausted",
            conflicts::serialization_failure_retried_then_exhausted::<SyncSession<B>>,
        ),
        (
            "sync::deadlock_retried",
            conflicts::deadlock_retried::<SyncSession<B>>,
        ),
        (
            "sync::fault_cases_in_another_language",
            language::fault_cases_in_another_language::<SyncSession<B>>,
        ),
        ("sync::bad_input", input::bad_input::<B>),
        ("sync::least_privilege", input::least_privilege::<B>),
        (
            "sync::nested_and_long_transactions",
            nesting::nested_and_long_transactions::<B>,
        ),
        (
            "sync::randomized_schedules",
            schedules::randomized_schedules::<SyncSession<B>>,
        ),
    ];
    #[cfg(feature = "async")]
    {
        use session::AsyncSession;
        all.extend([
            (
                "async::many_processes",
                processes::many_processes::<AsyncSession<B>> as fn() -> ScenarioResult,
            ),
            (
                "async::crash_at_every_point",
                processes::crash_at_every_point::<AsyncSession<B>>,
            ),
            (
                "async::connection_killed_mid_transaction",
                killed::connection_killed_mid_transaction::<AsyncSession<B>>,
            ),
            (
                "async::serializable_overlapping_writes",
                conflicts::serializable_overlapping_writes::<AsyncSession<B>>,
            ),
            (
                "async::serialization_failure_retried_then_exhausted",
                conflicts::serialization_failure_retried_then_exhausted::<AsyncSession<B>>,
            ),
            (
                "async::deadlock_retried",
                conflicts::deadlock_retried::<AsyncSession<B>>,
            ),
            (
                "async::fault_cases_in_another_language",
                language::fault_cases_in_another_language::<AsyncSession<B>>,
            ),
            (
                "async::randomized_schedules",
                schedules::randomized_schedules::<AsyncSession<B>>,
            ),
        ]);
    }
    all
}

struct Backend {
    name: &'static str,
    /// Why its scenarios cannot run, if they cannot.
    url: Result<String, String>,
    scenarios: Vec<Scenario>,
}

#[allow(clippy::vec_init_then_push)] // each push is behind its own feature
fn backends() -> Vec<Backend> {
    let mut all = Vec::new();
    #[cfg(feature = "sqlite")]
    all.push(Backend {
        name: "sqlite",
        url: Ok(String::new()),
        scenarios: scenarios::<common::backends::sqlite::Sqlite>(),
    });
    #[cfg(feature = "postgres")]
    all.push(Backend {
        name: "postgres",
        url: server_url("INBOX_TEST_POSTGRES_URL", common::POSTGRES_HINT),
        scenarios: scenarios::<common::backends::postgres::Postgres>(),
    });
    #[cfg(not(feature = "postgres"))]
    all.push(Backend {
        name: "postgres",
        url: Err("needs the `postgres` feature: cargo test --all-features".into()),
        scenarios: Vec::new(),
    });
    #[cfg(feature = "mysql")]
    all.push(Backend {
        name: "mysql",
        url: server_url("INBOX_TEST_MYSQL_URL", common::MYSQL_HINT),
        scenarios: scenarios::<common::backends::mysql::Mysql>(),
    });
    #[cfg(not(feature = "mysql"))]
    all.push(Backend {
        name: "mysql",
        url: Err("needs the `mysql` feature: cargo test --all-features".into()),
        scenarios: Vec::new(),
    });
    all
}

#[allow(dead_code)]
fn server_url(var: &str, hint: &str) -> Result<String, String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Ok(url),
        _ => Err(format!("{var} is not set; {hint}")),
    }
}

/// A worker process of `processes`: its backend and mode come from
/// `INBOX_FAULT_BACKEND` and `INBOX_FAULT_MODE`.
fn worker(role: &str) -> i32 {
    fn of<B: backend::FaultBackend>(role: &str) -> i32 {
        match std::env::var("INBOX_FAULT_MODE").as_deref() {
            Ok("sync") => processes::worker::<session::SyncSession<B>>(role),
            #[cfg(feature = "async")]
            Ok("async") => processes::worker::<session::AsyncSession<B>>(role),
            other => {
                eprintln!("unknown worker mode {other:?}");
                2
            }
        }
    }
    let backend = std::env::var("INBOX_FAULT_BACKEND").unwrap_or_default();
    match backend.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => of::<common::backends::sqlite::Sqlite>(role),
        #[cfg(feature = "postgres")]
        "postgres" => of::<common::backends::postgres::Postgres>(role),
        #[cfg(feature = "mysql")]
        "mysql" => of::<common::backends::mysql::Mysql>(role),
        other => {
            eprintln!("unknown worker backend {other:?}");
            2
        }
    }
}

fn main() {
    if let Ok(role) = std::env::var("INBOX_FAULT_ROLE") {
        std::process::exit(worker(&role));
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    // The backends' scenarios run side by side, one thread per backend
    // (each backend is its own server, and each scenario's databases and
    // files are its own); within a backend they run one after another.
    let runs: Vec<Run> = std::thread::scope(|s| {
        let runs: Vec<_> = backends()
            .into_iter()
            .map(|backend| s.spawn(|| run_backend(backend, filter.as_deref())))
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a backend's scenarios panicked"))
            .collect()
    });
    let rows: Vec<String> = runs.iter().flat_map(|r| r.rows.iter().cloned()).collect();
    let passed: u32 = runs.iter().map(|r| r.passed).sum();
    let failed: u32 = runs.iter().map(|r| r.failed).sum();
    let skipped: u32 = runs.iter().map(|r| r.skipped).sum();
    write_report(&rows);
    let _ = writeln!(
        std::io::stdout(),
        "\n{passed} passed, {failed} failed, {skipped} skipped"
    );
    std::process::exit(if failed > 0 { 1 } else { 0 });
}

/// What one backend's scenarios did.
#[derive(Default)]
struct Run {
    passed: u32,
    failed: u32,
    skipped: u32,
    /// The report's rows of the scenarios that passed.
    rows: Vec<String>,
}

/// Runs `backend`'s scenarios (those whose name contains `filter`) one
/// after another, printing each result as it ends. A quick run
/// (`support::quick`) skips the slow ones: the crash at every point (30 s
/// or more on a server).
fn run_backend(backend: Backend, filter: Option<&str>) -> Run {
    let mut run = Run::default();
    let say = |line: String| {
        let _ = writeln!(std::io::stdout().lock(), "{line}");
    };
    if let Err(why) = &backend.url {
        say(format!(
            "SKIPPED: {} fault scenarios: {why}; run with the server URL set and --all-features",
            backend.name
        ));
        run.skipped += 1;
        return run;
    }
    for (name, scenario) in &backend.scenarios {
        let full = format!("{}::{name}", backend.name);
        if filter.is_some_and(|f| !full.contains(f)) {
            continue;
        }
        if support::quick() && name.ends_with("crash_at_every_point") {
            run.skipped += 1;
            say(format!("test {full} ... SKIPPED: {}", support::SLOW));
            continue;
        }
        let started = Instant::now();
        let result = panic::catch_unwind(AssertUnwindSafe(scenario));
        let secs = started.elapsed().as_secs_f64();
        match result {
            Ok(Ok(Outcome::Pass(row))) => {
                run.passed += 1;
                say(format!("test {full} ... ok ({secs:.1}s)"));
                run.rows.push(row);
            }
            Ok(Ok(Outcome::Skip(why))) => {
                run.skipped += 1;
                say(format!("test {full} ... SKIPPED: {why}"));
            }
            Ok(Err(why)) => {
                run.failed += 1;
                say(format!("test {full} ... FAILED ({secs:.1}s): {why}"));
            }
            Err(panic) => {
                run.failed += 1;
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                say(format!("test {full} ... FAILED (panic): {why}"));
            }
        }
    }
    run
}

fn write_report(rows: &[String]) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|target| target.join("inbox-faults"));
    let Some(dir) = dir else { return };
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let mut table = String::from(
        "| backend | scenario | processes / threads | messages | faults injected | result |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for row in rows {
        table.push_str(row);
        table.push('\n');
    }
    let _ = std::fs::write(dir.join("report.md"), table);
}
