//! The consumer process: `diesel_inbox::kafka::Consumer` over a
//! deadpool pool, an inbox handler that writes one business row per
//! message, and the faults a scenario asks for.

use diesel::sql_types::{BigInt, Text};
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::pooled_connection::PoolableConnection;
use diesel_async::RunQueryDsl;
use diesel_inbox::brokers::{Message, Policy};
use diesel_inbox::outbox::Outgoing;
use diesel_inbox::{AsyncInboxConnection, Batch, Inbox, Processed};
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::ClientConfig;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The inbox consumer of every scenario (message ids are unique per run).
pub const CONSUMER: &str = "kafka-orders";

pub use crate::support::AppError;

/// What differs between the backends: the connection, its pool, and the
/// business table's DDL and insert.
pub trait Db: Send + Sync + 'static {
    type Conn: AsyncInboxConnection + PoolableConnection + 'static;
    type Pool: diesel_inbox::outbox::RelayPool + Clone + 'static;
    type Pooled: std::ops::DerefMut<Target = Self::Conn> + Send;
    const CREATE: &'static str;
    fn pool(url: String) -> Result<Self::Pool, String>;
    fn get(
        pool: &Self::Pool,
    ) -> impl std::future::Future<Output = Result<Self::Pooled, String>> + Send;
    /// Whether the database answers (the runner's health probe).
    fn ping(pool: Self::Pool) -> impl std::future::Future<Output = bool> + Send + 'static;
    /// Inserts a business row.
    fn insert<'a>(
        conn: &'a mut Self::Conn,
        topic: &'a str,
        id: &'a str,
        key: &'a str,
        seq: i64,
    ) -> impl std::future::Future<Output = diesel::QueryResult<()>> + Send + 'a;
}

pub struct Sqlite;
#[cfg(feature = "postgres")]
pub struct Postgres;
#[cfg(feature = "mysql")]
pub struct Mysql;

macro_rules! db {
    ($db:ty, $conn:ty, $create:expr, $insert:expr) => {
        impl Db for $db {
            type Conn = $conn;
            type Pool = Pool<$conn>;
            type Pooled = Object<$conn>;
            const CREATE: &'static str = $create;
            fn pool(url: String) -> Result<Self::Pool, String> {
                crate::support::pools::deadpool(url, 4)
            }
            fn get(
                pool: &Self::Pool,
            ) -> impl std::future::Future<Output = Result<Self::Pooled, String>> + Send {
                async move { pool.get().await.map_err(|e| e.to_string()) }
            }
            fn ping(pool: Self::Pool) -> impl std::future::Future<Output = bool> + Send + 'static {
                async move {
                    match pool.get().await {
                        Ok(mut conn) => diesel::sql_query("SELECT 1")
                            .execute(&mut *conn)
                            .await
                            .is_ok(),
                        Err(_) => false,
                    }
                }
            }
            fn insert<'a>(
                conn: &'a mut Self::Conn,
                topic: &'a str,
                id: &'a str,
                key: &'a str,
                seq: i64,
            ) -> impl std::future::Future<Output = diesel::QueryResult<()>> + Send + 'a {
                async move {
                    diesel::sql_query($insert)
                        .bind::<Text, _>(topic)
                        .bind::<Text, _>(id)
                        .bind::<Text, _>(key)
                        .bind::<BigInt, _>(seq)
                        .execute(conn)
                        .await
                        .map(drop)
                }
            }
        }
    };
}

db!(
    Sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    "CREATE TABLE IF NOT EXISTS kafka_effects (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, message_id TEXT NOT NULL, k TEXT NOT NULL, seq BIGINT NOT NULL)",
    "INSERT INTO kafka_effects (topic, message_id, k, seq) VALUES (?, ?, ?, ?)"
);
#[cfg(feature = "postgres")]
db!(
    Postgres,
    diesel_async::AsyncPgConnection,
    "CREATE TABLE IF NOT EXISTS kafka_effects (id BIGSERIAL PRIMARY KEY, topic TEXT NOT NULL, message_id TEXT NOT NULL, k TEXT NOT NULL, seq BIGINT NOT NULL)",
    "INSERT INTO kafka_effects (topic, message_id, k, seq) VALUES ($1, $2, $3, $4)"
);
#[cfg(feature = "mysql")]
db!(
    Mysql,
    diesel_async::AsyncMysqlConnection,
    "CREATE TABLE IF NOT EXISTS kafka_effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, topic VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL, k VARCHAR(64) NOT NULL, seq BIGINT NOT NULL)",
    "INSERT INTO kafka_effects (topic, message_id, k, seq) VALUES (?, ?, ?, ?)"
);

/// A message's body: `key:seq`.
fn parse(body: &[u8]) -> Result<(String, i64), AppError> {
    let text = std::str::from_utf8(body).map_err(|_| AppError::BadPayload)?;
    let (key, seq) = text.split_once(':').ok_or(AppError::BadPayload)?;
    Ok((
        key.to_owned(),
        seq.parse().map_err(|_| AppError::BadPayload)?,
    ))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Runs the consumer until SIGTERM; prints `REPORT <RunReport>` at the end.
pub async fn run<D: Db>() -> Result<(), String> {
    let url = env("INBOX_KAFKA_DB").ok_or("INBOX_KAFKA_DB")?;
    let topic = env("INBOX_KAFKA_TOPIC").ok_or("INBOX_KAFKA_TOPIC")?;
    let brokers = env("INBOX_KAFKA_BROKERS").ok_or("INBOX_KAFKA_BROKERS")?;
    let group = env("INBOX_KAFKA_GROUP").ok_or("INBOX_KAFKA_GROUP")?;
    // SIGKILL after the nth message applied: its transaction committed,
    // the runner has not committed its offset to Kafka.
    let die_after: Option<u64> = env("INBOX_KAFKA_DIE_AFTER").and_then(|n| n.parse().ok());
    // A message held before its inbox call (the zombie's), said on stdout.
    let stall = env("INBOX_KAFKA_STALL");
    // A message held inside its transaction, after the fence moved its
    // position (the zombie that holds the position's row).
    let stall_in_tx = env("INBOX_KAFKA_STALL_IN_TX");
    // Service A of a chain: each message is enqueued to this topic through
    // the outbox instead of written.
    let forward = env("INBOX_KAFKA_FORWARD_TO");
    // A slow handler (so that rebalances happen mid-run).
    let delay = env("INBOX_KAFKA_DELAY_MS")
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis);
    // `run_batch` with batches of up to this many messages.
    let batch: Option<usize> = env("INBOX_KAFKA_BATCH").and_then(|n| n.parse().ok());
    let pool = D::pool(url)?;
    // The runner's metrics, when asked: which partitions got a lag gauge.
    let metrics = env("INBOX_KAFKA_METRICS").map(|_| {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only recorder");
        snapshotter
    });
    let consumer = subscribed(&brokers, &group, &topic)?;
    let applied = AtomicU64::new(0);
    let probe = pool.clone();
    let (topic, pool, applied, stall, forward) = (&topic, &pool, &applied, &stall, &forward);
    let stall_in_tx = &stall_in_tx;
    println!("RUNNING");
    // A body that is not `key:seq` is permanent (the poison of a batch).
    let policy = Policy::new(|e: &AppError| matches!(e, AppError::BadPayload));
    let runner = diesel_inbox::kafka::Consumer::new(consumer, policy)
        .in_flight(4)
        .shutdown_deadline(Duration::from_secs(5))
        .health_probe(move || D::ping(probe.clone()))
        .health_probe_timeout(Duration::from_secs(2));
    let report = match batch {
        Some(max) => {
            let handler = Batched::<D> {
                pool,
                topic,
                stall,
                stall_in_tx,
                forward,
                applied,
                die_after,
                delay,
            };
            runner
                .batch(max, Duration::from_millis(5))
                .run_batch(
                    async |messages: &[Message<'_>]| handler.handle(messages).await,
                    sigterm(),
                )
                .await
        }
        None => {
            runner
                .run(
                    async |id: &str, body: &[u8]| -> Result<Processed<()>, AppError> {
                        let (key, seq) = parse(body)?;
                        if let Some(delay) = delay {
                            tokio::time::sleep(delay).await;
                        }
                        let stalled = stall.as_deref() == Some(id);
                        if stalled {
                            // SIGSTOPped here; the timer has run out at SIGCONT.
                            println!("STALL {id}");
                            tokio::time::sleep(Duration::from_secs(3)).await;
                        }
                        let mut conn = D::get(pool).await.map_err(AppError::Pool)?;
                        let (key, seq) = (&key, seq);
                        let forward = forward.as_deref();
                        let done: Result<Processed<()>, AppError> = Inbox::consumer(CONSUMER)
                            .run_async(&mut *conn, id, async |conn: &mut D::Conn| {
                                stall_in_transaction(stall_in_tx, [id]).await;
                                match forward {
                                    // Service A of a chain: the message goes on to
                                    // `forward`, through the outbox, in this transaction.
                                    Some(next) => {
                                        let message = Outgoing::new(next, format!("{key}:{seq}"))
                                            .ordering_key(key);
                                        diesel_inbox::outbox::enqueue_async(conn, message)
                                            .await
                                            .map(drop)
                                            .map_err(AppError::Inbox)
                                    }
                                    None => D::insert(conn, topic, id, key, seq)
                                        .await
                                        .map_err(AppError::Db),
                                }
                            })
                            .await;
                        if stalled {
                            println!("OUTCOME {id} {done:?}");
                        }
                        let done = done?;
                        count_applied(&done, applied, die_after).await;
                        Ok(done)
                    },
                    sigterm(),
                )
                .await
        }
    }
    .map_err(|e| e.to_string())?;
    let mut lagging: Vec<String> = Vec::new();
    if let Some(snapshotter) = metrics {
        for (key, _, _, _) in snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let on_topic = key
                .labels()
                .any(|l| l.key() == "messaging.destination.name" && l.value() == topic.as_str());
            if key.name() == "diesel_inbox.kafka.lag" && on_topic {
                lagging.extend(
                    key.labels()
                        .filter(|l| l.key() == "messaging.destination.partition.id")
                        .map(|l| l.value().to_owned()),
                );
            }
        }
        lagging.sort();
    }
    println!("REPORT {report:?} LAG GAUGES {}", lagging.join(","));
    Ok(())
}

/// The consumer of a subscription to `topic` in `group`, from the
/// earliest offset, committing nothing itself.
fn subscribed(brokers: &str, group: &str, topic: &str) -> Result<StreamConsumer, String> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set(
            "session.timeout.ms",
            env("INBOX_KAFKA_SESSION_MS").unwrap_or_else(|| "10000".into()),
        )
        .set("heartbeat.interval.ms", "1000")
        .create()
        .map_err(|e| e.to_string())?;
    consumer.subscribe(&[topic]).map_err(|e| e.to_string())?;
    Ok(consumer)
}

/// Counts a message `done` applied; SIGKILLs the process at the
/// `die_after`th (its transaction committed, its offset not yet committed
/// to Kafka).
async fn count_applied(done: &Processed<()>, applied: &AtomicU64, die_after: Option<u64>) {
    if *done != Processed::Applied(()) {
        return;
    }
    let n = applied.fetch_add(1, Ordering::SeqCst) + 1;
    if die_after == Some(n) {
        println!("DYING after {n}");
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
}

/// The tenant a record's key names: `k0`, `k2`, ... are `acme`'s, `k1`,
/// `k3`, ... `globex`'s; any other key (`stray`) names `nobody`, a tenant
/// of neither.
pub fn tenant_of(key: &str) -> &'static str {
    match key.strip_prefix('k').and_then(|n| n.parse::<u32>().ok()) {
        Some(n) if n % 2 == 0 => "acme",
        Some(_) => "globex",
        None => "nobody",
    }
}

/// The consumer over tenants (`INBOX_KAFKA_TENANTS`, `NAME=URL` pairs
/// separated by `;`): `run_tenants`, each message's business row and inbox
/// row (and its partition's position) in the database of the tenant its
/// key names ([`tenant_of`]), SQLite files. Until SIGTERM; prints
/// `REPORT <RunReport>`.
pub async fn tenants() -> Result<(), String> {
    type D = Sqlite;
    let listed = env("INBOX_KAFKA_TENANTS").ok_or("INBOX_KAFKA_TENANTS")?;
    let topic = env("INBOX_KAFKA_TOPIC").ok_or("INBOX_KAFKA_TOPIC")?;
    let brokers = env("INBOX_KAFKA_BROKERS").ok_or("INBOX_KAFKA_BROKERS")?;
    let group = env("INBOX_KAFKA_GROUP").ok_or("INBOX_KAFKA_GROUP")?;
    let die_after: Option<u64> = env("INBOX_KAFKA_DIE_AFTER").and_then(|n| n.parse().ok());
    let tenants: diesel_inbox::tenants::Tenants<Pool<<D as Db>::Conn>> =
        diesel_inbox::tenants::Tenants::list(
            listed
                .split(';')
                .filter_map(|pair| pair.split_once('='))
                .map(|(name, url)| (name.to_owned(), url.to_owned())),
        );
    let consumer = subscribed(&brokers, &group, &topic)?;
    let applied = AtomicU64::new(0);
    let (topic, applied) = (&topic, &applied);
    println!("RUNNING");
    let policy = Policy::new(|e: &AppError| matches!(e, AppError::BadPayload));
    let report = diesel_inbox::kafka::Consumer::new(consumer, policy)
        .in_flight(4)
        // `run_batch`'s setting, which `run_tenants` ignores: a partition's
        // messages still one at a time, in order (they were handed out as
        // they arrived, 4 at once, with it).
        .batch(50, Duration::from_millis(5))
        .shutdown_deadline(Duration::from_secs(5))
        .tenant_by(|m: &Message<'_>| {
            let key = std::str::from_utf8(m.key()?).ok()?;
            Some(tenant_of(key).to_owned())
        })
        .run_tenants(
            &tenants,
            async |conn: &mut <D as Db>::Conn,
                   m: &Message<'_>|
                   -> Result<Processed<()>, AppError> {
                let (key, seq) = parse(m.body())?;
                let id = m.id();
                let done = Inbox::consumer(CONSUMER)
                    .run_async(conn, id, async |conn: &mut <D as Db>::Conn| {
                        D::insert(conn, topic, id, &key, seq)
                            .await
                            .map_err(AppError::Db)
                    })
                    .await?;
                count_applied(&done, applied, die_after).await;
                Ok(done)
            },
            sigterm(),
        )
        .await
        .map_err(|e| e.to_string())?;
    println!("REPORT {report:?}");
    Ok(())
}

/// The batch handler (`INBOX_KAFKA_BATCH`): the same writes as the
/// single one, for a batch in one inbox transaction.
struct Batched<'a, D: Db> {
    pool: &'a D::Pool,
    topic: &'a str,
    stall: &'a Option<String>,
    stall_in_tx: &'a Option<String>,
    forward: &'a Option<String>,
    applied: &'a AtomicU64,
    die_after: Option<u64>,
    /// Per message: a batch sleeps its length times it.
    delay: Option<Duration>,
}

impl<D: Db> Batched<'_, D> {
    async fn handle(&self, messages: &[Message<'_>]) -> Result<Batch<()>, AppError> {
        let mut items = Vec::with_capacity(messages.len());
        for message in messages {
            let (key, seq) = parse(message.body())?;
            items.push((message.id(), key, seq));
        }
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay * messages.len() as u32).await;
        }
        let held = self
            .stall
            .as_deref()
            .filter(|held| messages.iter().any(|m| m.id() == *held));
        if let Some(held) = held {
            // SIGSTOPped here; the timer has run out at SIGCONT.
            println!("STALL {held}");
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let mut conn = D::get(self.pool).await.map_err(AppError::Pool)?;
        let (topic, forward, stall_in_tx) = (self.topic, self.forward.as_deref(), self.stall_in_tx);
        let done: Result<Batch<()>, AppError> = Inbox::consumer(CONSUMER)
            .run_batch_async(
                &mut *conn,
                &items,
                |(id, _, _)| id.to_string(),
                async |conn: &mut D::Conn, fresh: Vec<&(&str, String, i64)>| {
                    stall_in_transaction(stall_in_tx, fresh.iter().map(|(id, _, _)| *id)).await;
                    for (id, key, seq) in fresh {
                        match forward {
                            Some(next) => {
                                let message =
                                    Outgoing::new(next, format!("{key}:{seq}")).ordering_key(key);
                                diesel_inbox::outbox::enqueue_async(conn, message)
                                    .await
                                    .map_err(AppError::Inbox)?;
                            }
                            None => D::insert(conn, topic, id, key, *seq)
                                .await
                                .map_err(AppError::Db)?,
                        }
                    }
                    Ok(())
                },
            )
            .await;
        if let Some(held) = held {
            match &done {
                Ok(batch) if batch.applied.is_empty() => println!("OUTCOME {held} Ok(Duplicate)"),
                other => println!("OUTCOME {held} {other:?}"),
            }
        }
        let done = done?;
        let now = done.applied.len() as u64;
        let before = self.applied.fetch_add(now, Ordering::SeqCst);
        if let Some(n) = self.die_after.filter(|n| before < *n && before + now >= *n) {
            println!("DYING after {n}");
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &std::process::id().to_string()])
                .status();
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Ok(done)
    }
}

/// Holds the transaction for 3 s when one of `ids` is the `held` one
/// (SIGSTOPped meanwhile), saying so on stdout.
async fn stall_in_transaction<'a>(held: &Option<String>, ids: impl IntoIterator<Item = &'a str>) {
    let Some(held) = held.as_deref() else {
        return;
    };
    if ids.into_iter().any(|id| id == held) {
        println!("STALL {held}");
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// Runs the outbox relay, publishing to Kafka, until SIGTERM.
pub async fn relay<D: Db>() -> Result<(), String> {
    let url = env("INBOX_KAFKA_DB").ok_or("INBOX_KAFKA_DB")?;
    let brokers = env("INBOX_KAFKA_BROKERS").ok_or("INBOX_KAFKA_BROKERS")?;
    let producer: rdkafka::producer::FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "true")
        .create()
        .map_err(|e| e.to_string())?;
    let publisher = diesel_inbox::outbox::kafka::Publisher::new(producer);
    println!("RUNNING");
    let report = diesel_inbox::outbox::Relay::new(D::pool(url)?, publisher)
        .batch_size(20)
        .poll_interval(Duration::from_millis(50))
        .lease(Duration::from_secs(5))
        .run(sigterm())
        .await
        .map_err(|e| e.to_string())?;
    println!("REPORT {report:?}");
    Ok(())
}

/// Resolves at SIGTERM.
async fn sigterm() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    term.recv().await;
}
