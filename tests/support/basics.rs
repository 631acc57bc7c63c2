//! The business table, unique run ids, test databases, server URLs and
//! captured `tracing` events.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

diesel::table! {
    /// The "business" table of the tests: one row per applied message.
    inbox_test_effects (run_id, message_key) {
        run_id -> Text,
        message_key -> Text,
        amount -> BigInt,
    }
}

/// Portable DDL for the business table (no unique key: a double apply must
/// show up as two rows, not as an error).
pub const EFFECTS_DDL: &str = "CREATE TABLE IF NOT EXISTS inbox_test_effects (\
    run_id VARCHAR(64) NOT NULL, message_key VARCHAR(255) NOT NULL, amount BIGINT NOT NULL)";

/// A test database's URL (or SQLite path); removes the database when
/// dropped if it belongs to this test alone.
pub struct TestDb {
    pub url: String,
    pub discard: Option<fn(&str)>,
}

impl TestDb {
    /// A database shared by the tests of this process (kept).
    pub fn shared(url: String) -> Self {
        TestDb { url, discard: None }
    }

    /// A database of this test alone (removed at the end).
    pub fn owned(url: String, discard: fn(&str)) -> Self {
        TestDb {
            url,
            discard: Some(discard),
        }
    }
}

impl std::ops::Deref for TestDb {
    type Target = str;
    fn deref(&self) -> &str {
        &self.url
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(discard) = self.discard {
            discard(&self.url);
        }
    }
}

/// A run's stamp: the current time in microseconds, in hex (short enough
/// for a topic, a queue or a database name).
pub fn run_stamp() -> String {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    format!("{micros:x}")
}

/// A prefix no other test, thread or earlier run uses.
pub fn unique_run_id(test: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{test}-{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// [`unique_run_id`] as an SQL identifier (schema or database name).
pub fn unique_identifier(test: &str) -> String {
    unique_run_id(test)
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

/// The server database named by `var`, with the inbox and business tables
/// created once per process (`ready` remembers it); `None`, and one line
/// saying so, when the variable is unset.
pub fn shared_server_database<C>(
    ready: &'static std::sync::OnceLock<Option<String>>,
    var: &str,
    hint: &str,
    open: fn(&str) -> C,
) -> Option<TestDb>
where
    C: diesel::connection::LoadConnection<
        TransactionManager = diesel::connection::AnsiTransactionManager,
    >,
    C::Backend: diesel_inbox::InboxBackend,
{
    ready
        .get_or_init(|| {
            let url = server_url(var, hint)?;
            let mut conn = open(&url);
            diesel_inbox::migrate(&mut conn).expect("migrate");
            // Another test binary may create it at the same moment (the CI
            // runs the waiting suites beside the rest): PostgreSQL's
            // `CREATE TABLE IF NOT EXISTS` can then fail on its catalog's
            // unique index; once the other one committed, it is a no-op.
            let mut created = conn.batch_execute(EFFECTS_DDL);
            for _ in 0..5 {
                if created.is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
                created = conn.batch_execute(EFFECTS_DDL);
            }
            created.expect("effects table");
            Some(url)
        })
        .clone()
        .map(TestDb::shared)
}

/// A base for integer keys that earlier runs did not use.
pub fn unique_int_base() -> i64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    // Room for a million keys per test under one base.
    // Microseconds modulo 10^12, times 10^6: at most 10^18 < i64::MAX.
    i64::try_from(nanos / 1000 % 1_000_000_000_000).unwrap_or(1) * 1_000_000
}

/// How to run the PostgreSQL suites; the README and `.ci/run` name the same
/// variable, role and database.
pub const POSTGRES_HINT: &str = "set INBOX_TEST_POSTGRES_URL=postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test and run cargo test --all-features; the role and the database must exist (bash .ci/run creates both)";

/// How to run the MySQL/MariaDB suites.
pub const MYSQL_HINT: &str = "set INBOX_TEST_MYSQL_URL=mysql://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test and run cargo test --all-features; the user and the database must exist (bash .ci/run creates both)";

/// The URL in `var`, or `None` after one line saying the tests were skipped
/// and how to run them.
pub fn server_url(var: &str, hint: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            skipped(&format!("{var} is not set; {hint}"));
            None
        }
    }
}

/// A connection, or a panic that says what is wrong: a database that does
/// not exist is not an unreachable server.
pub fn connected<C>(var: &str, result: diesel::ConnectionResult<C>) -> C {
    result.unwrap_or_else(|error| {
        let text = error.to_string();
        if text.contains("does not exist") || text.contains("Unknown database") {
            panic!("{var} names a database that does not exist ({text}); create it first (bash .ci/run creates it)")
        }
        panic!("{var} is set but the server refused or did not answer: {text}")
    })
}

/// Says, past libtest's output capture, that tests were skipped.
pub fn skipped(why: &str) {
    use std::io::Write;
    // `eprintln!` is captured (and hidden) for passing tests; the raw handle is not.
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

/// Whether this is a quick local run: `INBOX_TEST_QUICK=1 cargo test
/// --all-features` skips the few slow tests and scenarios (long outages,
/// session timeouts, hundreds of messages through moto), each with a
/// SKIPPED line. Unset (CI, and `cargo test` by default), every test runs.
pub fn quick() -> bool {
    std::env::var("INBOX_TEST_QUICK")
        .is_ok_and(|v| !matches!(v.to_ascii_lowercase().as_str(), "" | "0" | "false" | "no"))
}

/// The reason a quick run gives for skipping a slow test or scenario.
pub const SLOW: &str = "slow, and INBOX_TEST_QUICK is set (unset it to run every test)";

/// At the start of a slow test: in a quick run ([`quick`]), says it is
/// skipped and returns true.
pub fn skip_slow() -> bool {
    let skip = quick();
    if skip {
        skipped(SLOW);
    }
    skip
}

/// Runs `f` and returns what it returned with the WARN and ERROR events it
/// logged through `tracing` (on this thread), each as "field=value ...".
pub fn warnings_during<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    let (value, events) = events_during(f);
    let warnings = events
        .into_iter()
        .filter(|e| e.level == tracing::Level::WARN || e.level == tracing::Level::ERROR)
        .map(|e| e.fields)
        .collect();
    (value, warnings)
}

/// One `tracing` event: its level, the span it happened in (if any) and its
/// fields as "field=value ...".
#[derive(Debug, Clone)]
pub struct LoggedEvent {
    pub level: tracing::Level,
    pub span: Option<&'static str>,
    pub fields: String,
}

/// Runs `f` and returns what it returned with every `tracing` event it
/// logged on this thread, and how many spans it opened, by name.
pub fn events_during<T>(f: impl FnOnce() -> T) -> (T, Vec<LoggedEvent>) {
    events_watched(|_| f())
}

/// The events logged so far inside [`events_watched`].
pub struct Watched(std::sync::Arc<Collector>);

impl Watched {
    /// Every event logged so far.
    pub fn events(&self) -> Vec<LoggedEvent> {
        self.0.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

#[derive(Default)]
struct Collector {
    events: std::sync::Mutex<Vec<LoggedEvent>>,
    spans: std::sync::Mutex<Vec<&'static str>>,
    current: std::sync::Mutex<Vec<u64>>,
    next: std::sync::atomic::AtomicU64,
}

/// [`events_during`], where `f` can also look at the events logged so far
/// (to wait for one rather than sleep).
pub fn events_watched<T>(f: impl FnOnce(&Watched) -> T) -> (T, Vec<LoggedEvent>) {
    let watched = Watched(std::sync::Arc::new(Collector::default()));
    let value = tracing::subscriber::with_default(watched.0.clone(), || f(&watched));
    let events = watched.events();
    (value, events)
}

/// An event's fields as "field=value ...".
struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl tracing::Subscriber for Collector {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attributes: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut spans) = self.spans.lock() {
            spans.push(attributes.metadata().name());
        }
        tracing::span::Id::from_u64(id + 1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let span = self.current.lock().ok().and_then(|current| {
            let id = *current.last()?;
            self.spans.lock().ok()?.get(id as usize - 1).copied()
        });
        if let Ok(mut events) = self.events.lock() {
            events.push(LoggedEvent {
                level: *event.metadata().level(),
                span,
                fields: fields.0,
            });
        }
    }
    fn enter(&self, id: &tracing::span::Id) {
        if let Ok(mut current) = self.current.lock() {
            current.push(id.into_u64());
        }
    }
    fn exit(&self, _: &tracing::span::Id) {
        if let Ok(mut current) = self.current.lock() {
            current.pop();
        }
    }
}

/// The value of the server variable `var`, or `None` after a line saying
/// the test is skipped (`bash .ci/run` sets them all).
pub fn server_var(var: &str) -> Option<String> {
    let value = std::env::var(var).ok().filter(|v| !v.is_empty());
    if value.is_none() {
        eprintln!("SKIPPED: {var} is not set (bash .ci/run sets it)");
    }
    value
}

/// A RabbitMQ connection and a channel on it, with `queue` declared (its
/// name is the routing key on the default exchange).
#[cfg(feature = "lapin")]
pub async fn rabbit_queue(url: &str, queue: &str) -> (lapin::Connection, lapin::Channel) {
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ");
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .expect("declare the queue");
    (connection, channel)
}

/// Each backend's scenarios, one thread each, side by side: `runs` yields
/// each thread's count of failed scenarios. Prints the suite's verdict and
/// exits 1 when one failed.
pub fn side_by_side(
    suite: &str,
    runs: Vec<std::thread::JoinHandle<usize>>,
    cleanup: impl FnOnce(),
) {
    let mut failed = 0;
    for run in runs {
        failed += run.join().expect("a backend's thread panicked");
    }
    cleanup();
    if failed > 0 {
        println!("{failed} scenario(s) FAILED");
        std::process::exit(1);
    }
    println!("{suite}: all scenarios passed");
}

/// The `diesel-inbox` binary (built with the feature `cli`) on `url`, with
/// no `DATABASE_URL` or `RUST_LOG` of the environment.
pub fn cli(url: &str) -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("diesel-inbox").expect("the diesel-inbox binary");
    cmd.env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .arg("--database-url")
        .arg(url);
    cmd
}

/// Runs [`cli`]'s command: (exit code, stdout, stderr).
pub fn run_cli(cmd: &mut assert_cmd::Command) -> (i32, String, String) {
    let out = cmd.output().expect("run diesel-inbox");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
