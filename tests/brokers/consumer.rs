//! What every consumer process shares: the database, the handler, the
//! counts it reports, and the crash between commit and ack.

use diesel::connection::SimpleConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl};
use diesel_inbox::brokers::{Handled, Message, Policy, Settlement};
use diesel_inbox::{idempotent, Batch, Processed};
use std::time::Duration;

pub type Conn = SyncConnectionWrapper<diesel::SqliteConnection>;

diesel::table! {
    broker_effects (id) {
        id -> Integer,
        message_id -> Text,
        amount -> BigInt,
    }
}

/// The business table: no unique key on `message_id`, so a message
/// applied twice shows as two rows.
pub const EFFECTS_DDL: &str = "CREATE TABLE IF NOT EXISTS broker_effects (\
    id INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT NOT NULL, amount BIGINT NOT NULL)";

pub use crate::support::AppError;

/// An order's amount: its body as a number; the poison fails every time.
pub fn order_amount(body: &[u8]) -> Result<i64, AppError> {
    if body == b"poison" {
        return Err(AppError::Poison);
    }
    std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(AppError::BadPayload)
}

/// The consumers' handler: one business row per order. Fingerprinted on
/// the body: an id published again with another body is `KeyReused`,
/// which every runner dead-letters through `AppError`'s `HasInboxError`.
#[idempotent(key = "id", consumer = "broker-orders", fingerprint = "body", shared)]
pub async fn apply_order(conn: &mut Conn, id: &str, body: &[u8]) -> Result<(), AppError> {
    let amount = order_amount(body)?;
    diesel::insert_into(broker_effects::table)
        .values((
            broker_effects::message_id.eq(id),
            broker_effects::amount.eq(amount),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

use diesel::ExpressionMethods;

/// The batch runners' handler: one business row per order of the batch
/// claimed for the first time (SQLite's async wrapper takes one row per
/// insert).
#[idempotent(
    batch = "messages",
    key = "|m| m.id()",
    consumer = "broker-orders",
    shared
)]
pub async fn apply_orders(conn: &mut Conn, messages: &[Message<'_>]) -> Result<(), AppError> {
    let amounts = messages
        .iter()
        .map(|m| order_amount(m.body()))
        .collect::<Result<Vec<_>, AppError>>()?;
    for (m, amount) in messages.iter().zip(amounts) {
        diesel::insert_into(broker_effects::table)
            .values((
                broker_effects::message_id.eq(m.id()),
                broker_effects::amount.eq(amount),
            ))
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// [`apply_orders`] on PostgreSQL.
#[cfg(feature = "postgres")]
#[idempotent(
    batch = "messages",
    key = "|m| m.id()",
    consumer = "broker-orders-pg",
    shared
)]
pub async fn apply_orders_pg(
    conn: &mut diesel_async::AsyncPgConnection,
    messages: &[Message<'_>],
) -> Result<(), AppError> {
    let rows = messages
        .iter()
        .map(|m| {
            let amount = order_amount(m.body())?;
            Ok((
                broker_effects::message_id.eq(m.id()),
                broker_effects::amount.eq(amount),
            ))
        })
        .collect::<Result<Vec<_>, AppError>>()?;
    diesel::insert_into(broker_effects::table)
        .values(rows)
        .execute(conn)
        .await?;
    Ok(())
}

/// The policy of the tests' consumers: a bad payload is permanent, the
/// poison is retried until its fifth delivery.
pub fn policy() -> Policy<AppError> {
    Policy::new(|e: &AppError| matches!(e, AppError::BadPayload))
        .max_deliveries(5)
        .retry_delay(Duration::from_millis(50))
}

/// A database file's tables.
pub fn create_tables(path: &str) -> Result<(), String> {
    use diesel::Connection;
    let mut conn = diesel::SqliteConnection::establish(path).map_err(|e| e.to_string())?;
    conn.batch_execute("PRAGMA journal_mode = WAL")
        .map_err(|e| e.to_string())?;
    diesel_inbox::migrate(&mut conn).map_err(|e| e.to_string())?;
    conn.batch_execute(EFFECTS_DDL).map_err(|e| e.to_string())
}

pub async fn open(path: &str) -> Result<Conn, String> {
    let mut conn = Conn::establish(path).await.map_err(|e| e.to_string())?;
    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, "PRAGMA busy_timeout = 30000")
        .await
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// What a consumer process did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub applied: u64,
    pub duplicates: u64,
    pub retried: u64,
    pub dead_lettered: u64,
    pub reconnects: u64,
}

impl Counts {
    pub fn record<T>(&mut self, handled: &Handled<Processed<T>, AppError>) {
        match (&handled.outcome, handled.settlement) {
            (Ok(Processed::Applied(_)), _) => self.applied += 1,
            (Ok(Processed::Duplicate), _) => {
                self.duplicates += 1;
                // Line by line: a process killed later has told it already.
                println!("duplicate {}", handled.message_id);
            }
            (Err(_), Settlement::Retry) => {
                self.retried += 1;
                // When the retry was settled (after RabbitMQ's hold).
                let ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
                println!("retry {} {ms}", handled.message_id);
            }
            (Err(_), _) => self.dead_lettered += 1,
        }
    }

    pub fn line(&self) -> String {
        format!(
            "counts applied={} duplicates={} retried={} dead_lettered={} reconnects={}",
            self.applied, self.duplicates, self.retried, self.dead_lettered, self.reconnects
        )
    }

    pub fn parse(output: &str) -> Option<Counts> {
        let line = output.lines().find(|l| l.starts_with("counts "))?;
        let n: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|kv| kv.split('=').nth(1)?.parse().ok())
            .collect();
        (n.len() == 5).then(|| Counts {
            applied: n[0],
            duplicates: n[1],
            retried: n[2],
            dead_lettered: n[3],
            reconnects: n[4],
        })
    }

    pub fn add(&mut self, other: Counts) {
        self.applied += other.applied;
        self.duplicates += other.duplicates;
        self.retried += other.retried;
        self.dead_lettered += other.dead_lettered;
        self.reconnects += other.reconnects;
    }
}

/// What a consumer process is told through its environment.
pub struct Options {
    pub url: String,
    pub db: String,
    pub queue: String,
    pub prefetch: u16,
    /// Kill the process after the commit, before the ack, of the first
    /// delivery of every message whose sequence is a multiple of this (0:
    /// never).
    pub crash_every: u64,
    /// Stop after this long without a message.
    pub idle: Duration,
}

impl Options {
    pub fn from_env() -> Options {
        let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
        Options {
            url: var("INBOX_BROKER_URL"),
            db: var("INBOX_BROKER_DB"),
            queue: var("INBOX_BROKER_QUEUE"),
            prefetch: var("INBOX_BROKER_PREFETCH").parse().expect("a prefetch"),
            crash_every: var("INBOX_BROKER_CRASH_EVERY").parse().expect("a number"),
            idle: Duration::from_millis(var("INBOX_BROKER_IDLE_MS").parse().expect("ms")),
        }
    }

    /// Whether to die between the commit and the ack of this delivery.
    pub fn crashes_at(
        &self,
        id: &str,
        deliveries: u32,
        outcome: &Result<Processed<()>, AppError>,
    ) -> bool {
        let seq: u64 = id
            .rsplit('-')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        self.crash_every > 0
            && seq % self.crash_every == 0
            && deliveries == 1
            && matches!(outcome, Ok(Processed::Applied(())))
    }
}

/// The consumers' handler step: `apply_order`, and the SIGKILL between
/// commit and ack where `options` asks for it.
pub async fn apply_or_crash(
    db: &mut Conn,
    options: &Options,
    deliveries: u32,
    id: &str,
    body: &[u8],
) -> Result<Processed<()>, AppError> {
    let outcome = apply_order(db, id, body).await;
    if options.crashes_at(id, deliveries, &outcome) {
        crash_now();
    }
    outcome
}

/// Runs `f` on a runtime of its own (the parent's broker administration).
pub fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}

/// SIGKILL to this process: no unwinding, no ack, nothing flushed.
pub fn crash_now() -> ! {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Runs a consumer process's loop on a tokio runtime and prints its counts.
pub fn run_process<F>(consume: impl FnOnce(Options) -> F) -> i32
where
    F: std::future::Future<Output = Result<Counts, String>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    match runtime.block_on(consume(Options::from_env())) {
        Ok(counts) => {
            println!("{}", counts.line());
            0
        }
        Err(e) => {
            eprintln!("consumer failed: {e}");
            3
        }
    }
}

/// Whether this consumer process runs the library's consumer runner
/// (`diesel_inbox::{lapin,nats}::Consumer`) instead of its own loop.
pub fn runner_mode() -> bool {
    std::env::var("INBOX_BROKER_RUNNER").as_deref() == Ok("1")
}

/// The runner's database: the process's one SQLite connection, or (with
/// `INBOX_BROKER_PG` set to a PostgreSQL URL) a deadpool pool of 8.
pub enum Db {
    Sqlite(tokio::sync::Mutex<Conn>),
    #[cfg(feature = "postgres")]
    Pg(diesel_async::pooled_connection::deadpool::Pool<diesel_async::AsyncPgConnection>),
}

/// The business table on PostgreSQL.
#[cfg(feature = "postgres")]
pub const PG_EFFECTS_DDL: &str = "CREATE TABLE IF NOT EXISTS broker_effects (\
    id BIGSERIAL PRIMARY KEY, message_id TEXT NOT NULL, amount BIGINT NOT NULL)";

/// [`apply_order`] on PostgreSQL (a consumer name of its own: one program,
/// two handlers).
#[cfg(feature = "postgres")]
#[idempotent(key = "id", consumer = "broker-orders-pg", shared)]
pub async fn apply_order_pg(
    conn: &mut diesel_async::AsyncPgConnection,
    id: &str,
    body: &[u8],
) -> Result<(), AppError> {
    let amount = order_amount(body)?;
    diesel::insert_into(broker_effects::table)
        .values((
            broker_effects::message_id.eq(id),
            broker_effects::amount.eq(amount),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// The runners' policy: a production's (a bad payload permanent, the
/// inbox's refusals too, the default backoff and safety-net delivery
/// limit), unless `INBOX_BROKER_MAX_DELIVERIES` and `INBOX_BROKER_RETRY_MS`
/// say otherwise.
pub fn runner_policy() -> Policy<AppError> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    let mut policy = Policy::new(|e: &AppError| matches!(e, AppError::BadPayload));
    if let Some(n) = var("INBOX_BROKER_MAX_DELIVERIES") {
        policy = policy.max_deliveries(n);
    }
    if let Some(ms) = var("INBOX_BROKER_RETRY_MS") {
        policy = policy.retry_delay(Duration::from_millis(u64::from(ms)));
    }
    policy
}

/// The runner's handler: `apply_order` on the process's database, the
/// applied and duplicate counts, and the time of the last delivery.
pub struct Shared {
    pub db: Db,
    pub counts: std::sync::Mutex<Counts>,
    pub last: std::sync::Mutex<std::time::Instant>,
    /// `INBOX_BROKER_CRASH_EVERY` (batches): SIGKILL after the commit of a
    /// batch that applied an order whose sequence is a multiple of it, on
    /// its first delivery, before the runner settles the batch (0: never).
    pub crash_every: u64,
    /// `INBOX_BROKER_FLAKY=1`: the sets of ids handed to the batch handler
    /// so far; a set seen for the first time fails transiently (printed
    /// as `flaky <its size>`).
    pub flaky: Option<std::sync::Mutex<std::collections::HashSet<Vec<String>>>>,
}

impl Shared {
    pub async fn new(path: &str) -> Result<Shared, String> {
        let db = match std::env::var("INBOX_BROKER_PG") {
            #[cfg(feature = "postgres")]
            Ok(url) if !url.is_empty() => {
                use diesel_async::pooled_connection::{
                    deadpool::Pool, AsyncDieselConnectionManager,
                };
                Db::Pg(
                    Pool::builder(AsyncDieselConnectionManager::new(url))
                        .max_size(8)
                        .build()
                        .map_err(|e| e.to_string())?,
                )
            }
            _ => Db::Sqlite(tokio::sync::Mutex::new(open(path).await?)),
        };
        Ok(Shared {
            db,
            counts: std::sync::Mutex::new(Counts::default()),
            last: std::sync::Mutex::new(std::time::Instant::now()),
            crash_every: std::env::var("INBOX_BROKER_CRASH_EVERY")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
            flaky: (std::env::var("INBOX_BROKER_FLAKY").as_deref() == Ok("1"))
                .then(Default::default),
        })
    }

    /// A health probe of the database: `SELECT 1` on a pooled connection
    /// (SQLite has no outage to wait for).
    pub fn probe(
        &self,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>
           + Send
           + Sync
           + 'static {
        #[cfg(feature = "postgres")]
        let pool = match &self.db {
            Db::Pg(pool) => Some(pool.clone()),
            Db::Sqlite(_) => None,
        };
        move || {
            #[cfg(feature = "postgres")]
            if let Some(pool) = pool.clone() {
                return Box::pin(async move {
                    let Ok(mut conn) = pool.get().await else {
                        return false;
                    };
                    diesel::sql_query("SELECT 1")
                        .execute(&mut conn)
                        .await
                        .is_ok()
                });
            }
            Box::pin(async { true })
        }
    }

    pub async fn apply(&self, id: &str, body: &[u8]) -> Result<Processed<()>, AppError> {
        // `INBOX_BROKER_SLOW_MS=a,b,..`: a handler call takes that long
        // first, by the order's number (the id's last part) in turn.
        if let Ok(slow) = std::env::var("INBOX_BROKER_SLOW_MS") {
            let times: Vec<u64> = slow.split(',').filter_map(|ms| ms.parse().ok()).collect();
            let n: usize = id
                .rsplit('-')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if let Some(ms) = times.get(n % times.len().max(1)) {
                tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
            }
        }
        let outcome = match &self.db {
            Db::Sqlite(conn) => apply_order(&mut *conn.lock().await, id, body).await,
            #[cfg(feature = "postgres")]
            Db::Pg(pool) => match pool.get().await {
                Ok(mut conn) => apply_order_pg(&mut conn, id, body).await,
                Err(e) => Err(AppError::Pool(e.to_string())),
            },
        };
        *self.last.lock().unwrap() = std::time::Instant::now();
        let mut counts = self.counts.lock().unwrap();
        match &outcome {
            Ok(Processed::Applied(())) => counts.applied += 1,
            Ok(Processed::Duplicate) => counts.duplicates += 1,
            Err(_) => {}
        }
        outcome
    }

    /// A batch through [`apply_orders`] (or its PostgreSQL twin).
    pub async fn apply_batch(&self, messages: &[Message<'_>]) -> Result<Batch<()>, AppError> {
        // `INBOX_BROKER_BATCH_SLOW_MS`: each batch call takes that long first.
        if let Some(ms) = std::env::var("INBOX_BROKER_BATCH_SLOW_MS")
            .ok()
            .and_then(|ms| ms.parse::<u64>().ok())
        {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        if let Some(seen) = &self.flaky {
            let ids: Vec<String> = messages.iter().map(|m| m.id().to_owned()).collect();
            if seen.lock().unwrap().insert(ids) {
                println!("flaky {}", messages.len());
                return Err(AppError::Pool(
                    "refused once for this set of messages".into(),
                ));
            }
        }
        let outcome = match &self.db {
            Db::Sqlite(conn) => apply_orders(&mut *conn.lock().await, messages).await,
            #[cfg(feature = "postgres")]
            Db::Pg(pool) => match pool.get().await {
                Ok(mut conn) => apply_orders_pg(&mut conn, messages).await,
                Err(e) => Err(AppError::Pool(e.to_string())),
            },
        };
        *self.last.lock().unwrap() = std::time::Instant::now();
        if let Ok(batch) = &outcome {
            // Line by line, as `Counts::add`: a process killed later has
            // told them already.
            for (at, message) in messages.iter().enumerate() {
                if !batch.applied.contains(&at) {
                    println!("duplicate {}", message.id());
                }
            }
            let mut counts = self.counts.lock().unwrap();
            counts.applied += batch.applied.len() as u64;
            counts.duplicates += batch.duplicates as u64;
            drop(counts);
            let crashes = |at: &usize| {
                let message = &messages[*at];
                let seq: u64 = message
                    .id()
                    .rsplit('-')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(1);
                seq % self.crash_every == 0 && message.deliveries() == 1
            };
            if self.crash_every > 0 {
                if let Some(&at) = batch.applied.iter().find(|at| crashes(at)) {
                    println!("crash {}", messages[at].id());
                    crash_now();
                }
            }
        }
        outcome
    }

    /// Whether as many orders were applied as `INBOX_BROKER_EXPECT_APPLIED`
    /// says (unset: never).
    fn all_applied(&self) -> bool {
        std::env::var("INBOX_BROKER_EXPECT_APPLIED")
            .ok()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| self.counts.lock().unwrap().applied >= n)
    }

    /// Resolves on SIGTERM (printing `sigterm`), once no delivery has
    /// finished for `idle`, or a second after the expected orders were
    /// all applied.
    pub async fn stop(&self, idle: Duration) {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        loop {
            tokio::select! {
                _ = term.recv() => {
                    println!("sigterm");
                    return;
                }
                () = tokio::time::sleep(Duration::from_millis(100)) => {
                    let quiet = self.last.lock().unwrap().elapsed();
                    if quiet > idle || (self.all_applied() && quiet > Duration::from_secs(1)) {
                        return;
                    }
                }
            }
        }
    }

    /// Runs `consumer` (a broker's runner) with this process's handler,
    /// probe and stop, `in_flight` = the prefetch; its counts. The
    /// scenarios set through the environment: `INBOX_BROKER_PROBE=frozen`
    /// (a probe that never answers), `INBOX_BROKER_DEADLINE_MS` (the
    /// shutdown deadline), `INBOX_BROKER_PROBE_TIMEOUT_MS`, and
    /// `INBOX_BROKER_DRAIN_MS` (exit when idle after that quiet time; then
    /// only SIGTERM stops it otherwise).
    pub async fn serve<S: diesel_inbox::brokers::Source>(
        &self,
        consumer: diesel_inbox::brokers::Consumer<S, AppError>,
        options: &Options,
    ) -> Result<Counts, String> {
        let ms = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis)
        };
        let live = crate::live::install();
        let mut consumer = consumer.in_flight(usize::from(options.prefetch));
        consumer = match std::env::var("INBOX_BROKER_PROBE").as_deref() {
            Ok("frozen") => consumer.health_probe(std::future::pending::<bool>),
            _ => consumer.health_probe(self.probe()),
        };
        if let Some(deadline) = ms("INBOX_BROKER_DEADLINE_MS") {
            consumer = consumer.shutdown_deadline(deadline);
        }
        if let Some(timeout) = ms("INBOX_BROKER_PROBE_TIMEOUT_MS") {
            consumer = consumer.health_probe_timeout(timeout);
        }
        let drain = ms("INBOX_BROKER_DRAIN_MS");
        if let Some(quiet) = drain {
            consumer = consumer.exit_when_idle(quiet);
        }
        let stop = async {
            match drain {
                Some(_) => self.stop(Duration::from_secs(3600)).await,
                None => self.stop(options.idle).await,
            }
        };
        // `INBOX_BROKER_BATCH`: `run_batch` with batches of up to that many.
        let batch = std::env::var("INBOX_BROKER_BATCH")
            .ok()
            .and_then(|n| n.parse::<usize>().ok());
        let report = match batch {
            Some(max) => {
                consumer
                    .batch(max, Duration::from_millis(10))
                    .run_batch(
                        async |messages: &[Message<'_>]| self.apply_batch(messages).await,
                        stop,
                    )
                    .await
            }
            None => {
                consumer
                    .run(
                        async |id: &str, body: &[u8]| self.apply(id, body).await,
                        stop,
                    )
                    .await
            }
        }
        .map_err(|e| e.to_string())?;
        if let Some(live) = live {
            println!("{}", live.line());
        }
        Ok(self.finish(&report))
    }

    /// The counts, with the runner's report's retries and dead letters; the
    /// report is printed as a line of its own.
    pub fn finish(&self, report: &diesel_inbox::brokers::RunReport) -> Counts {
        println!(
            "report acked={} retried={} released_early={} dead_lettered={} unsettled={} abandoned={} returned={} pauses={} probe_timeouts={} reconnects={} idle={}",
            report.acked,
            report.retried,
            report.released_early,
            report.dead_lettered,
            report.unsettled,
            report.abandoned,
            report.returned,
            report.pauses,
            report.probe_timeouts,
            report.reconnects,
            report.idle
        );
        let mut counts = *self.counts.lock().unwrap();
        counts.retried = report.retried;
        counts.dead_lettered = report.dead_lettered;
        counts.reconnects = report.reconnects;
        counts
    }
}
