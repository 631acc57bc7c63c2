//! The outbox chain, end to end, with kills: service A consumes `orders`
//! with an inbox, writes an order row and enqueues a `stock` message (key:
//! the customer) in the same transaction; a relay process publishes it;
//! service B consumes `stock` with its own inbox, one message at a time.
//! A, the relay and B are processes of this binary (`INBOX_BROKER_ROLE`),
//! SIGKILLed at random points and restarted; the broker connections are
//! dropped mid-run. And the relay through a broker outage.

use crate::consumer::{create_tables, open, AppError, Conn};
use crate::scenarios::{ensure, Broker};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_inbox::brokers::{Policy, Source};
use diesel_inbox::outbox::{self, Outgoing, Relay};
use diesel_inbox::{idempotent, Processed};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHAIN_DDL: &str = "CREATE TABLE IF NOT EXISTS chain_orders (\
    id INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT NOT NULL, customer TEXT NOT NULL, n BIGINT NOT NULL); \
    CREATE TABLE IF NOT EXISTS chain_stock (\
    id INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT NOT NULL, order_id TEXT NOT NULL, \
    customer TEXT NOT NULL, n BIGINT NOT NULL);";

fn bad(_: impl std::fmt::Debug) -> AppError {
    AppError::BadPayload
}

/// Service A: the order's row and its stock message, in the claim's
/// transaction.
#[idempotent(key = "id", consumer = "chain-a")]
async fn place(conn: &mut Conn, id: &str, body: &[u8], stock: &str) -> Result<(), AppError> {
    use diesel::sql_types::{BigInt, Text};
    let text = std::str::from_utf8(body).map_err(bad)?;
    let (customer, n) = text.split_once(':').ok_or(AppError::BadPayload)?;
    let n: i64 = n.parse().map_err(bad)?;
    let insert =
        diesel::sql_query("INSERT INTO chain_orders (order_id, customer, n) VALUES (?, ?, ?)")
            .bind::<Text, _>(id)
            .bind::<Text, _>(customer)
            .bind::<BigInt, _>(n);
    diesel_async::RunQueryDsl::execute(insert, conn).await?;
    let message = Outgoing::new(stock, format!("{id}|{customer}|{n}")).ordering_key(customer);
    outbox::enqueue_async(conn, message).await?;
    Ok(())
}

/// Service A on PostgreSQL, its stock message written to the WAL outbox
/// (`outbox::set_wal`, on in that process).
#[cfg(feature = "postgres")]
#[idempotent(key = "id", consumer = "chain-a-wal")]
async fn place_pg(
    conn: &mut diesel_async::AsyncPgConnection,
    id: &str,
    body: &[u8],
    stock: &str,
) -> Result<(), AppError> {
    use diesel::sql_types::{BigInt, Text};
    let text = std::str::from_utf8(body).map_err(bad)?;
    let (customer, n) = text.split_once(':').ok_or(AppError::BadPayload)?;
    let n: i64 = n.parse().map_err(bad)?;
    let insert =
        diesel::sql_query("INSERT INTO chain_orders (order_id, customer, n) VALUES ($1, $2, $3)")
            .bind::<Text, _>(id)
            .bind::<Text, _>(customer)
            .bind::<BigInt, _>(n);
    diesel_async::RunQueryDsl::execute(insert, conn).await?;
    let message = Outgoing::new(stock, format!("{id}|{customer}|{n}")).ordering_key(customer);
    outbox::enqueue_async(conn, message).await?;
    Ok(())
}

/// A's orders on PostgreSQL.
#[cfg(feature = "postgres")]
const PG_CHAIN_DDL: &str = "CREATE TABLE IF NOT EXISTS chain_orders (\
    id BIGSERIAL PRIMARY KEY, order_id TEXT NOT NULL, customer TEXT NOT NULL, n BIGINT NOT NULL)";

/// Whether `db` is a PostgreSQL URL (A's database in the WAL chain).
fn on_postgres(db: &str) -> bool {
    db.starts_with("postgres")
}

/// Whether A on PostgreSQL enqueues to the outbox table rather than the
/// WAL (`INBOX_CHAIN_OUTBOX=table`: the failover chain, whose logical slot
/// would not survive the promotion of a standby).
fn table_outbox() -> bool {
    std::env::var("INBOX_CHAIN_OUTBOX").as_deref() == Ok("table")
}

/// Service B: one stock row per stock message.
#[idempotent(key = "id", consumer = "chain-b")]
async fn reserve(conn: &mut Conn, id: &str, body: &[u8]) -> Result<(), AppError> {
    use diesel::sql_types::{BigInt, Text};
    let text = std::str::from_utf8(body).map_err(bad)?;
    let mut parts = text.split('|');
    let (Some(order), Some(customer), Some(n)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(AppError::BadPayload);
    };
    let n: i64 = n.parse().map_err(bad)?;
    let insert = diesel::sql_query(
        "INSERT INTO chain_stock (message_id, order_id, customer, n) VALUES (?, ?, ?, ?)",
    )
    .bind::<Text, _>(id)
    .bind::<Text, _>(order)
    .bind::<Text, _>(customer)
    .bind::<BigInt, _>(n);
    diesel_async::RunQueryDsl::execute(insert, conn).await?;
    Ok(())
}

fn policy() -> Policy<AppError> {
    Policy::new(|e: &AppError| matches!(e, AppError::BadPayload))
        .unlimited_deliveries()
        .retry_delay(Duration::from_millis(50))
        .max_retry_delay(Duration::from_millis(500))
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"))
}

async fn sigterm() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    term.recv().await;
}

/// Runs `consumer` with service A's or B's handler until SIGTERM.
async fn serve<S: Source>(
    consumer: diesel_inbox::brokers::Consumer<S, AppError>,
    service: &str,
    in_flight: usize,
) -> Result<(), String> {
    let url = var("INBOX_CHAIN_DB");
    #[cfg(feature = "postgres")]
    if on_postgres(&url) {
        use diesel_async::pooled_connection::{deadpool::Pool, AsyncDieselConnectionManager};
        outbox::set_wal(!table_outbox());
        // A pool of one: a connection lost with its server (a failover)
        // is replaced by the next `get`, and A applies one order at a
        // time, so that its rows' ids are its commit order, which
        // `check_chain` compares B's order with.
        let pool = Pool::builder(AsyncDieselConnectionManager::<
            diesel_async::AsyncPgConnection,
        >::new(url))
        .max_size(1)
        .build()
        .map_err(|e| e.to_string())?;
        let stock = var("INBOX_CHAIN_STOCK_DEST");
        let handle = async |id: &str, body: &[u8]| -> Result<Processed<()>, AppError> {
            match pool.get().await {
                Ok(mut conn) => place_pg(&mut conn, id, body, &stock).await,
                Err(e) => Err(AppError::Pool(e.to_string())),
            }
        };
        return consumer
            .in_flight(in_flight)
            .run(handle, sigterm())
            .await
            .map(drop)
            .map_err(|e| e.to_string());
    }
    let db = tokio::sync::Mutex::new(open(&url).await?);
    let stock = var("INBOX_CHAIN_STOCK_DEST");
    let handle = async |id: &str, body: &[u8]| -> Result<Processed<()>, AppError> {
        let mut conn = db.lock().await;
        match service {
            "a" => place(&mut conn, id, body, &stock).await,
            _ => reserve(&mut conn, id, body).await,
        }
    };
    consumer
        .in_flight(in_flight)
        .run(handle, sigterm())
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A consumer process of the chain (`chain-a` or `chain-b`).
async fn consume(service: &str) -> Result<(), String> {
    let url = var("INBOX_BROKER_URL");
    let queue = var("INBOX_CHAIN_QUEUE");
    // B applies one message at a time: per-key order needs it.
    let in_flight = if service == "a" { 8 } else { 1 };
    match var("INBOX_BROKER").as_str() {
        #[cfg(feature = "lapin")]
        "rabbitmq" => {
            // A cluster's nodes, comma-separated: the first that answers.
            let consumer = match url.contains(',') {
                true => diesel_inbox::lapin::Consumer::connect_any(url.split(','), queue, policy()),
                false => diesel_inbox::lapin::Consumer::connect(url, queue, policy()),
            };
            serve(consumer, service, in_flight).await
        }
        #[cfg(feature = "nats")]
        "nats" => {
            let consumer = crate::nats::pull_consumer(&url, &queue).await?;
            serve(
                diesel_inbox::nats::Consumer::new(consumer, policy()),
                service,
                in_flight,
            )
            .await
        }
        #[cfg(feature = "sqs")]
        broker @ ("sqs" | "sqs_fifo") => {
            let client = crate::sqs::client(&crate::sqs::endpoint(&url));
            let name = match broker {
                "sqs_fifo" => format!("{queue}.fifo"),
                _ => queue,
            };
            let queue_url = crate::sqs::queue_url(&client, &name).await?;
            serve(
                diesel_inbox::sqs::Consumer::new(client, queue_url, policy())
                    .id_attribute("message-id")
                    .wait_time(Duration::from_secs(1)),
                service,
                in_flight,
            )
            .await
        }
        other => Err(format!("unknown broker {other}")),
    }
}

/// The relay process: service A's outbox to the broker, until SIGTERM.
async fn relay() -> Result<(), String> {
    use diesel_async::pooled_connection::{
        deadpool::Pool, AsyncDieselConnectionManager, ManagerConfig,
    };
    use diesel_async::{AsyncConnection, SimpleAsyncConnection};
    let url = var("INBOX_BROKER_URL");
    let mut config = ManagerConfig::default();
    config.custom_setup = Box::new(|db| {
        let db = db.to_string();
        Box::pin(async move {
            let mut conn = Conn::establish(&db).await?;
            conn.batch_execute("PRAGMA busy_timeout = 30000")
                .await
                .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
            Ok(conn)
        })
    });
    #[cfg(feature = "postgres")]
    if on_postgres(&var("INBOX_CHAIN_DB")) {
        let manager = AsyncDieselConnectionManager::<diesel_async::AsyncPgConnection>::new(var(
            "INBOX_CHAIN_DB",
        ));
        let pool = Pool::builder(manager)
            .max_size(2)
            .build()
            .map_err(|e| e.to_string())?;
        let wal = (!table_outbox()).then(|| var("INBOX_CHAIN_DB"));
        return relay_on(pool, wal, &url).await;
    }
    let manager =
        AsyncDieselConnectionManager::<Conn>::new_with_config(var("INBOX_CHAIN_DB"), config);
    let pool = Pool::builder(manager)
        .max_size(2)
        .build()
        .map_err(|e| e.to_string())?;
    relay_on(pool, None, &url).await
}

/// Runs a relay of `pool`'s outbox (and, with `wal`, its WAL outbox) to
/// the chain's broker until SIGTERM, then prints its report.
/// The relay (with `wal`, the WAL outbox's too: its database's URL).
async fn relay_on<D: outbox::RelayPool>(
    pool: D,
    wal: Option<String>,
    url: &str,
) -> Result<(), String> {
    fn with_wal<D: outbox::RelayPool, P: outbox::Publish>(
        relay: Relay<D, P>,
        wal: Option<String>,
    ) -> Relay<D, P> {
        match wal {
            Some(db) => relay.wal(db),
            None => relay,
        }
    }
    let report = match var("INBOX_BROKER").as_str() {
        #[cfg(feature = "lapin")]
        "rabbitmq" => {
            let publisher = match url.contains(',') {
                true => outbox::lapin::Publisher::connect_any(url.split(','), ""),
                false => outbox::lapin::Publisher::connect(url, ""),
            };
            with_wal(Relay::new(pool, publisher), wal)
                .batch_size(20)
                .poll_interval(Duration::from_millis(50))
                .lease(Duration::from_secs(5))
                .run(sigterm())
                .await
        }
        #[cfg(feature = "nats")]
        "nats" => {
            let client = async_nats::ConnectOptions::new()
                .retry_on_initial_connect()
                .connect(url)
                .await
                .map_err(|e| e.to_string())?;
            let publisher = outbox::nats::Publisher::new(async_nats::jetstream::new(client));
            with_wal(Relay::new(pool, publisher), wal)
                .batch_size(20)
                .poll_interval(Duration::from_millis(50))
                .lease(Duration::from_secs(5))
                .run(sigterm())
                .await
        }
        #[cfg(feature = "sqs")]
        "sqs" | "sqs_fifo" => {
            let client = crate::sqs::client(&crate::sqs::endpoint(url));
            let publisher = outbox::sqs::Publisher::new(client);
            with_wal(Relay::new(pool, publisher), wal)
                .batch_size(20)
                .poll_interval(Duration::from_millis(50))
                .lease(Duration::from_secs(5))
                .run(sigterm())
                .await
        }
        other => return Err(format!("unknown broker {other}")),
    }
    .map_err(|e| e.to_string())?;
    eprintln!(
        "relay published={} failed={} dead={} released={} errors={}",
        report.published, report.failed, report.dead, report.released, report.errors
    );
    Ok(())
}

/// The chain's processes: `Some(exit code)` when this process is one.
pub fn role() -> Option<i32> {
    let role = std::env::var("INBOX_BROKER_ROLE").ok()?;
    // `INBOX_BROKER_LOG=1`: the library's INFO and WARN lines on stderr
    // (the chain's log), for a scenario being debugged.
    if std::env::var_os("INBOX_BROKER_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_writer(std::io::stderr)
            .try_init();
    }
    let run = |f: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>>>>| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        match runtime.block_on(f) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{role} failed: {e}");
                3
            }
        }
    };
    match role.as_str() {
        "chain-a" => Some(run(Box::pin(consume("a")))),
        "chain-b" => Some(run(Box::pin(consume("b")))),
        "chain-relay" => Some(run(Box::pin(relay()))),
        _ => None,
    }
}

/// A chain process: `role` on `db`, consuming `queue` (A, B).
struct Process {
    role: &'static str,
    db: String,
    queue: String,
    child: Option<Child>,
    kills: u32,
    /// More of the process's environment.
    env: Vec<(&'static str, String)>,
}

impl Process {
    fn new(role: &'static str, db: &str, queue: &str) -> Process {
        Process {
            role,
            db: db.to_string(),
            queue: queue.to_string(),
            child: None,
            kills: 0,
            env: Vec::new(),
        }
    }

    fn start<B: Broker>(&mut self, url: &str, stock_dest: &str, log: &str) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| e.to_string())?;
        let child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .env("INBOX_BROKER_ROLE", self.role)
            .env("INBOX_BROKER", B::NAME)
            .env("INBOX_BROKER_URL", url)
            .env("INBOX_CHAIN_DB", &self.db)
            .env("INBOX_CHAIN_QUEUE", &self.queue)
            .env("INBOX_CHAIN_STOCK_DEST", stock_dest)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.role))?;
        self.child = Some(child);
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            self.kills += 1;
        }
    }

    /// SIGTERM, and the exit.
    fn stop(&mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return match status.success() {
                    true => Ok(()),
                    false => Err(format!("{} exited with {status}", self.role)),
                };
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(format!("{} did not stop on SIGTERM", self.role));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A process that died by itself is an error.
    fn alive(&mut self) -> Result<(), String> {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("{} exited by itself: {status}", self.role));
            }
        }
        Ok(())
    }
}

/// A small random generator for the kill schedule (its seed is printed).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

fn count(db: &str, sql: &str) -> i64 {
    let Ok(mut conn) = SqliteConnection::establish(db) else {
        return 0;
    };
    let _ = conn.batch_execute("PRAGMA busy_timeout = 5000");
    diesel::dsl::sql::<diesel::sql_types::BigInt>(sql)
        .get_result(&mut conn)
        .unwrap_or(0)
}

#[derive(QueryableByName, Debug)]
struct Applied {
    #[diesel(sql_type = diesel::sql_types::Text)]
    order_id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    customer: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn rows(db: &str, table: &str) -> Result<Vec<Applied>, String> {
    let query = diesel::sql_query(format!(
        "SELECT order_id, customer, n FROM {table} ORDER BY id"
    ));
    #[cfg(feature = "postgres")]
    if on_postgres(db) {
        let mut conn = PgConnection::establish(db).map_err(|e| e.to_string())?;
        return query.load(&mut conn).map_err(|e| e.to_string());
    }
    let mut conn = SqliteConnection::establish(db).map_err(|e| e.to_string())?;
    query.load(&mut conn).map_err(|e| e.to_string())
}

/// A's outbox table's status.
fn a_status(db: &str) -> Result<outbox::OutboxStatus, String> {
    #[cfg(feature = "postgres")]
    if on_postgres(db) {
        let mut conn = PgConnection::establish(db).map_err(|e| e.to_string())?;
        return outbox::status(&mut conn).map_err(|e| e.to_string());
    }
    let mut conn = SqliteConnection::establish(db).map_err(|e| e.to_string())?;
    outbox::status(&mut conn).map_err(|e| e.to_string())
}

/// Every order applied once by A, each stock message applied once by B,
/// and per customer B's order is A's enqueue order; nothing pending or
/// dead in A's outbox.
fn check_chain(a: &str, b: &str, n: u64, ordered: bool) -> Result<String, String> {
    let placed = rows(a, "chain_orders")?;
    let reserved = rows(b, "chain_stock")?;
    let distinct = |rows: &[Applied]| {
        rows.iter()
            .map(|r| r.order_id.as_str())
            .collect::<std::collections::HashSet<_>>()
            .len() as u64
    };
    ensure!(
        placed.len() as u64 == n && distinct(&placed) == n,
        "A applied {} rows for {} of {n} orders",
        placed.len(),
        distinct(&placed)
    );
    ensure!(
        reserved.len() as u64 == n && distinct(&reserved) == n,
        "B applied {} stock messages for {} of {n} orders (lost or doubled)",
        reserved.len(),
        distinct(&reserved)
    );
    let per_customer = |rows: &[Applied]| {
        let mut by: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
        for r in rows {
            by.entry(r.customer.clone()).or_default().push(r.n);
        }
        by
    };
    let (enqueued, applied) = (per_customer(&placed), per_customer(&reserved));
    for (customer, order) in enqueued.iter().filter(|_| ordered) {
        ensure!(
            applied.get(customer) == Some(order),
            "customer {customer}: A enqueued {order:?}, B applied {:?}",
            applied.get(customer)
        );
    }
    let status = a_status(a)?;
    ensure!(
        status.pending == 0 && status.dead == 0,
        "A's outbox after the run: {status:?}"
    );
    let order = match ordered {
        true => "in A's order per customer",
        false => "per customer order not checked (the queue does not keep it)",
    };
    Ok(format!(
        "{n} orders, {} customers: each applied once by A and by B, {order}",
        enqueued.len()
    ))
}

struct Chain {
    /// A's database when it is PostgreSQL (dropped at the end).
    #[cfg(feature = "postgres")]
    a_pg: Option<crate::scenarios::PgDb>,
    orders: String,
    stock: String,
    url: String,
    a_db: String,
    b_db: String,
    log: String,
    teardown: fn(&str, &str),
}

impl Chain {
    /// Orders 1 to `n` for the orders queue, `c<seq % customers>:<seq>`.
    fn orders_of(&self, n: u64, customers: u64) -> Vec<(String, Vec<u8>)> {
        (1..=n)
            .map(|seq| {
                (
                    format!("{}-{seq}", self.orders),
                    format!("c{}:{seq}", seq % customers).into_bytes(),
                )
            })
            .collect()
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        (self.teardown)(&self.url, &self.orders);
        (self.teardown)(&self.url, &self.stock);
        for db in [&self.a_db, &self.b_db] {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{db}{suffix}"));
            }
        }
    }
}

/// [`chain_setup`] with A on a PostgreSQL database of its own, its
/// outbox the WAL's (the slot created); `None` without
/// `INBOX_TEST_POSTGRES_URL`.
#[cfg(feature = "postgres")]
fn wal_chain_setup<B: Broker>(url: &str) -> Result<Option<Chain>, String> {
    let mut chain = chain_setup::<B>(url, "walchain")?;
    let Some(db) =
        crate::scenarios::PgDb::named(&format!("walchain_{}", crate::scenarios::run_id()))?
    else {
        return Ok(None);
    };
    let mut conn = PgConnection::establish(&db.url).map_err(|e| e.to_string())?;
    conn.batch_execute(PG_CHAIN_DDL)
        .map_err(|e| e.to_string())?;
    // PostgreSQL 15 once failed the slot's creation with an internal
    // error ("relcache reference pg_database_datname_index is not owned
    // by resource owner TopTransaction") while other scenarios and suites
    // created and dropped databases beside it. The creation rolls back
    // with the error; the test tries it again, at most twice, saying so.
    let mut tries = 0;
    loop {
        tries += 1;
        match outbox::wal::create(&mut conn) {
            Ok(_) => break,
            Err(e) if tries < 3 && e.to_string().contains("is not owned by resource owner") => {
                eprintln!("the WAL outbox's slot, try {tries}: {e}; trying again");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => return Err(format!("the WAL outbox's slot: {e}")),
        }
    }
    chain.a_db = db.url.clone();
    chain.a_pg = Some(db);
    Ok(Some(chain))
}

fn chain_setup<B: Broker>(url: &str, name: &str) -> Result<Chain, String> {
    chain_setup_with::<B>(url, name, &|url, queue, ordered| match ordered {
        true => B::setup_ordered(url, queue),
        false => B::setup(url, queue),
    })
}

/// [`chain_setup`] with the queues made by `setup(url, queue, ordered)`
/// (`ordered`: the stock queue, which keeps per-key order).
type Setup<'a> = &'a dyn Fn(&str, &str, bool) -> Result<(), String>;

fn chain_setup_with<B: Broker>(url: &str, name: &str, setup: Setup) -> Result<Chain, String> {
    let run = crate::scenarios::run_id();
    let dir = std::env::temp_dir();
    let path = |what: &str| {
        dir.join(format!("diesel-inbox-{name}-{run}-{what}"))
            .to_string_lossy()
            .into_owned()
    };
    let chain = Chain {
        #[cfg(feature = "postgres")]
        a_pg: None,
        orders: format!("inbox-test-{run}-orders"),
        stock: format!("inbox-test-{run}-stock"),
        url: url.to_string(),
        a_db: path("a.db"),
        b_db: path("b.db"),
        log: path("log"),
        teardown: B::teardown,
    };
    for db in [&chain.a_db, &chain.b_db] {
        create_tables(db)?;
        SqliteConnection::establish(db)
            .map_err(|e| e.to_string())?
            .batch_execute(CHAIN_DDL)
            .map_err(|e| e.to_string())?;
    }
    setup(url, &chain.orders, false)?;
    setup(url, &chain.stock, true)?;
    Ok(chain)
}

/// The chain with SIGKILLs of A, the relay and B at random points (3 each)
/// and one drop of every broker connection.
pub fn chain_with_kills<B: Broker>(url: &str) -> Result<String, String> {
    killed_at_random::<B>(url, chain_setup::<B>(url, "chain")?)
}

/// [`chain_with_kills`] with A on PostgreSQL, enqueuing to the WAL
/// outbox (`outbox::set_wal`), and the relay reading it (`Relay::wal`).
#[cfg(feature = "postgres")]
pub fn wal_chain_with_kills<B: Broker>(url: &str) -> Result<String, String> {
    match wal_chain_setup::<B>(url)? {
        Some(chain) => killed_at_random::<B>(url, chain).map(|s| format!("WAL outbox: {s}")),
        None => Ok(format!(
            "{}INBOX_TEST_POSTGRES_URL is not set",
            crate::scenarios::SKIPPED
        )),
    }
}

fn killed_at_random<B: Broker>(url: &str, chain: Chain) -> Result<String, String> {
    let n: u64 = 480 / B::SCALE;
    const CUSTOMERS: u64 = 8;
    const WAVES: usize = 8;
    const KILLS: u32 = 3;
    let stock_dest = B::destination(&chain.stock);
    let orders = chain.orders_of(n, CUSTOMERS);
    let mut waves = orders.chunks(orders.len() / WAVES);
    let mut all = [
        Process::new("chain-a", &chain.a_db, &chain.orders),
        Process::new("chain-relay", &chain.a_db, ""),
        Process::new("chain-b", &chain.b_db, &chain.stock),
    ];
    for p in all.iter_mut() {
        p.start::<B>(url, &stock_dest, &chain.log)?;
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut random = Lcg(seed);
    let applied = || count(&chain.b_db, "SELECT COUNT(*) FROM chain_stock") as u64;
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut dropped = None;
    let result = (|| {
        // The orders arrive in waves, and the kills land among them.
        let mut published = 0;
        loop {
            if let Some(wave) = waves.next() {
                B::publish(url, &chain.orders, wave)?;
                published += 1;
            }
            let victims: Vec<usize> = (0..3).filter(|&i| all[i].kills < KILLS).collect();
            if published >= WAVES && (victims.is_empty() || applied() >= n) {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "the kills did not finish in time"
            );
            std::thread::sleep(Duration::from_millis(300 + random.next(900)));
            for p in all.iter_mut() {
                p.alive()?;
            }
            if !victims.is_empty() && applied() < n {
                let victim = &mut all[victims[random.next(victims.len() as u64) as usize]];
                victim.kill();
                victim.start::<B>(url, &stock_dest, &chain.log)?;
            }
            if dropped.is_none() && published >= WAVES / 2 {
                dropped = Some(B::drop_connections()?);
            }
        }
        settle(&mut all, &chain, n, deadline)
    })();
    let mut stopped = Ok(());
    for p in all.iter_mut() {
        let s = p.stop();
        stopped = stopped.and(s);
    }
    result?;
    stopped.map_err(|e| format!("{e} (log: {})", chain.log))?;
    let summary = check_chain(&chain.a_db, &chain.b_db, n, B::ORDERED)?;
    let kills: Vec<String> = all
        .iter()
        .map(|p| format!("{} {}", p.role, p.kills))
        .collect();
    let _ = std::fs::remove_file(&chain.log);
    Ok(format!(
        "{summary}; SIGKILLs: {} (seed {seed}); {}",
        kills.join(", "),
        dropped.unwrap_or_else(|| "no connection drop (finished first)".into())
    ))
}

/// The last publish errors in A's outbox (SQLite), for a failure's
/// message.
#[cfg(any(feature = "lapin", feature = "nats"))]
fn last_errors(db: &str) -> String {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        e: String,
    }
    SqliteConnection::establish(db)
        .ok()
        .and_then(|mut c| {
            diesel::sql_query(
                "SELECT attempts || ' attempts: ' || last_error AS e FROM outbox_messages WHERE last_error IS NOT NULL ORDER BY seq LIMIT 3",
            )
            .load::<Row>(&mut c)
            .ok()
        })
        .map(|rows| rows.into_iter().map(|r| r.e).collect::<Vec<_>>().join("; "))
        .unwrap_or_default()
}

/// What the relay processes of a chain's log published in all (each
/// prints `relay published=N ...` when it stops).
#[cfg(any(feature = "lapin", feature = "nats", feature = "postgres"))]
fn relay_published(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| {
            l.strip_prefix("relay published=")?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Waits until B has applied all `n` orders (by `deadline`) and A's
/// outbox is empty (30 s more at most), every process still running.
fn settle(all: &mut [Process], chain: &Chain, n: u64, deadline: Instant) -> Result<(), String> {
    let applied = || count(&chain.b_db, "SELECT COUNT(*) FROM chain_stock") as u64;
    while applied() < n {
        ensure!(
            Instant::now() < deadline,
            "{} of {n} stock messages applied by B in time (log: {})",
            applied(),
            chain.log
        );
        for p in all.iter_mut() {
            p.alive()?;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // A relay killed between the broker's confirm and its delete left
    // rows claimed: the next one publishes them again once their lease
    // (5 s) has run out, and B settles them as duplicates.
    let drained = Instant::now() + Duration::from_secs(30);
    while a_status(&chain.a_db).is_ok_and(|s| s.pending > 0) && Instant::now() < drained {
        for p in all.iter_mut() {
            p.alive()?;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Redeliveries of the last messages settle as duplicates.
    std::thread::sleep(Duration::from_secs(1));
    Ok(())
}

/// The chain (A, the relay and B on SQLite) on a broker cluster. The
/// queues are made (and the orders published) through `seed` by `setup`
/// (replicated); the processes are given `nodes` (RabbitMQ: every node's
/// URL, comma-separated, the first answering taken; NATS: one node's, the
/// client learns the rest).
/// Once A has placed a third of the orders, `lose_node` SIGKILLs the
/// node they are connected to. Every order must reach B exactly once, in
/// order per customer, without that node coming back.
#[cfg(any(feature = "lapin", feature = "nats"))]
pub(crate) fn across_node_loss<B: Broker>(
    seed: &str,
    nodes: &str,
    setup: Setup,
    lose_node: &mut dyn FnMut() -> Result<String, String>,
) -> Result<String, String> {
    const CUSTOMERS: u64 = 8;
    let n: u64 = 600;
    let chain = chain_setup_with::<B>(seed, "nodeloss", setup)?;
    let stock_dest = B::destination(&chain.stock);
    let orders = chain.orders_of(n, CUSTOMERS);
    let _ = std::fs::remove_file(&chain.log);
    let mut all = [
        Process::new("chain-a", &chain.a_db, &chain.orders),
        Process::new("chain-relay", &chain.a_db, ""),
        Process::new("chain-b", &chain.b_db, &chain.stock),
    ];
    for p in all.iter_mut() {
        p.start::<B>(nodes, &stock_dest, &chain.log)?;
    }
    let placed = || count(&chain.a_db, "SELECT COUNT(*) FROM chain_orders") as u64;
    let result = (|| {
        B::publish(seed, &chain.orders, &orders)?;
        let began = Instant::now();
        while placed() < n / 3 {
            ensure!(
                began.elapsed() < Duration::from_secs(120),
                "A placed fewer than {} orders in 120 s (log: {})",
                n / 3,
                chain.log
            );
            for p in all.iter_mut() {
                p.alive()?;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let at = (
            placed(),
            count(&chain.b_db, "SELECT COUNT(*) FROM chain_stock"),
        );
        let lost = lose_node()?;
        let killed = Instant::now();
        settle(&mut all, &chain, n, killed + Duration::from_secs(180))
            .map_err(|e| format!("{e}; A's outbox: {}", last_errors(&chain.a_db)))?;
        Ok(format!(
            "{lost} when A had placed {} and B applied {}; settled {:.1} s later",
            at.0,
            at.1,
            killed.elapsed().as_secs_f64()
        ))
    })();
    let mut stopped = Ok(());
    for p in all.iter_mut() {
        let s = p.stop();
        stopped = stopped.and(s);
    }
    let said = result?;
    stopped.map_err(|e| format!("{e} (log: {})", chain.log))?;
    let summary = check_chain(&chain.a_db, &chain.b_db, n, B::ORDERED)?;
    let log = std::fs::read_to_string(&chain.log).unwrap_or_default();
    let published = relay_published(&log);
    let _ = std::fs::remove_file(&chain.log);
    Ok(format!(
        "{said}: {summary}; the relay published {published} (a publish whose confirm was lost with the node is made again, and B absorbs it)"
    ))
}

/// The broker unavailable for `INBOX_TEST_BROKER_OUTAGE_SECS` (default
/// 30) while the relay publishes: everything is published after it
/// returns, and nothing is dead.
pub fn relay_survives_a_broker_outage<B: Broker>(url: &str) -> Result<String, String> {
    let n: u64 = 300 / B::SCALE;
    let outage = std::env::var("INBOX_TEST_BROKER_OUTAGE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30u64);
    let chain = chain_setup::<B>(url, "outage")?;
    let stock_dest = B::destination(&chain.stock);
    let mut relay = Process::new("chain-relay", &chain.a_db, "");
    let mut b = Process::new("chain-b", &chain.b_db, &chain.stock);
    let enqueue = |from: u64, to: u64| -> Result<(), String> {
        let mut conn = SqliteConnection::establish(&chain.a_db).map_err(|e| e.to_string())?;
        conn.batch_execute("PRAGMA busy_timeout = 30000")
            .map_err(|e| e.to_string())?;
        for seq in from..=to {
            conn.transaction(|conn| {
                let customer = format!("c{}", seq % 8);
                diesel::sql_query(
                    "INSERT INTO chain_orders (order_id, customer, n) VALUES (?, ?, ?)",
                )
                .bind::<diesel::sql_types::Text, _>(format!("o-{seq}"))
                .bind::<diesel::sql_types::Text, _>(&customer)
                .bind::<diesel::sql_types::BigInt, _>(seq as i64)
                .execute(conn)?;
                let body = format!("o-{seq}|{customer}|{seq}");
                outbox::enqueue(
                    conn,
                    Outgoing::new(stock_dest.as_str(), body).ordering_key(&customer),
                )?;
                Ok::<_, diesel::result::Error>(())
            })
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    let applied = || count(&chain.b_db, "SELECT COUNT(*) FROM chain_stock") as u64;
    let result = (|| {
        relay.start::<B>(url, &stock_dest, &chain.log)?;
        b.start::<B>(url, &stock_dest, &chain.log)?;
        enqueue(1, n / 3)?;
        let began = Instant::now();
        while applied() < n / 3 {
            ensure!(
                began.elapsed() < Duration::from_secs(60),
                "no progress before the outage"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // The outage, with messages enqueued while the broker is away.
        let how = std::thread::scope(|s| {
            let down = s.spawn(|| B::outage(Duration::from_secs(outage)));
            std::thread::sleep(Duration::from_secs(2));
            let enqueued = enqueue(n / 3 + 1, n);
            let how = down
                .join()
                .map_err(|_| "the outage thread panicked".to_string())?;
            enqueued.and(how)
        })?;
        let back = Instant::now();
        while applied() < n {
            ensure!(
                back.elapsed() < Duration::from_secs(120),
                "{} of {n} applied 120 s after the broker came back (log: {})",
                applied(),
                chain.log
            );
            relay.alive()?;
            b.alive()?;
            std::thread::sleep(Duration::from_millis(100));
        }
        // `check_chain` below: nothing pending or dead.
        Ok(format!(
            "{how}; {n} messages published after it and applied once by B in {:.1} s, 0 dead",
            back.elapsed().as_secs_f64()
        ))
    })();
    let stopped = relay.stop().and(b.stop());
    let summary = result?;
    stopped?;
    check_chain(&chain.a_db, &chain.b_db, n, B::ORDERED)?;
    let _ = std::fs::remove_file(&chain.log);
    Ok(summary)
}

/// What the chain kept across a failover of A's database, per order.
#[cfg(feature = "postgres")]
pub(crate) struct AcrossFailover {
    pub(crate) n: u64,
    /// Orders neither A (its new primary) nor B has: acked, and gone.
    pub(crate) lost: u64,
    /// Orders B applied whose order row A no longer has (published before
    /// the failover, then lost on A).
    pub(crate) stray: u64,
    /// Orders A has and B never got.
    pub(crate) unpublished: u64,
    /// Rows applied twice, by A or by B.
    pub(crate) doubled: u64,
    /// What the relay published in all (more than the orders kept: rows
    /// deleted after their confirm came back with the failover).
    pub(crate) published: u64,
    /// `check_chain`'s verdict on the new primary (exact, in order).
    pub(crate) exact: Result<String, String>,
    pub(crate) failover: String,
}

/// The chain with A on PostgreSQL at `a_url` (through the caller's
/// virtual IP), enqueuing to the outbox table: A with 8 in flight, one
/// relay process, B. Once A has placed `at` orders, `fail_over` fails A's
/// database over (`a_after` is the new primary); when the chain is quiet
/// again, every order is looked up in A and in B.
#[cfg(feature = "postgres")]
pub(crate) fn across_failover<B: Broker>(
    url: &str,
    a_url: &str,
    a_before: &str,
    a_after: &str,
    n: u64,
    at: u64,
    fail_over: &mut dyn FnMut() -> Result<String, String>,
) -> Result<AcrossFailover, String> {
    const CUSTOMERS: u64 = 8;
    let mut chain = chain_setup::<B>(url, "pgfailover")?;
    {
        let mut conn = PgConnection::establish(a_before).map_err(|e| e.to_string())?;
        diesel_inbox::migrate(&mut conn).map_err(|e| e.to_string())?;
        conn.batch_execute(PG_CHAIN_DDL)
            .map_err(|e| e.to_string())?;
    }
    chain.a_db = a_url.to_owned();
    let stock_dest = B::destination(&chain.stock);
    let orders = chain.orders_of(n, CUSTOMERS);
    let mut all = [
        Process::new("chain-a", &chain.a_db, &chain.orders),
        Process::new("chain-relay", &chain.a_db, ""),
        Process::new("chain-b", &chain.b_db, &chain.stock),
    ];
    for p in all.iter_mut() {
        p.env.push(("INBOX_CHAIN_OUTBOX", "table".into()));
        p.start::<B>(url, &stock_dest, &chain.log)?;
    }
    let placed_on = |db: &str| -> u64 {
        PgConnection::establish(db)
            .ok()
            .and_then(|mut c| {
                diesel::dsl::sql::<diesel::sql_types::BigInt>("SELECT COUNT(*) FROM chain_orders")
                    .get_result::<i64>(&mut c)
                    .ok()
            })
            .unwrap_or(0) as u64
    };
    let applied = || count(&chain.b_db, "SELECT COUNT(*) FROM chain_stock") as u64;
    let result = (|| {
        B::publish(url, &chain.orders, &orders)?;
        let began = Instant::now();
        while placed_on(a_before) < at {
            ensure!(
                began.elapsed() < Duration::from_secs(120),
                "A placed fewer than {at} orders in 120 s (log: {})",
                chain.log
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let said = fail_over()?;
        // Quiet: B has every order, or nothing moved for 8 s with A's
        // outbox empty.
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut last = (0, 0);
        let mut still = Instant::now();
        loop {
            for p in all.iter_mut() {
                p.alive()?;
            }
            let now = (placed_on(a_after), applied());
            if now.1 >= n {
                break;
            }
            if now != last {
                last = now;
                still = Instant::now();
            } else if still.elapsed() > Duration::from_secs(8)
                && a_status(a_after).is_ok_and(|s| s.pending == 0)
            {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "the chain did not settle within 180 s of the failover: A {} placed, B {} applied (log: {})",
                now.0,
                now.1,
                chain.log
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // Redeliveries of the last messages settle as duplicates.
        std::thread::sleep(Duration::from_secs(1));
        Ok(said)
    })();
    let mut stopped = Ok(());
    for p in all.iter_mut() {
        let s = p.stop();
        stopped = stopped.and(s);
    }
    let failover = result?;
    stopped.map_err(|e| format!("{e} (log: {})", chain.log))?;
    let placed = rows(a_after, "chain_orders")?;
    let reserved = rows(&chain.b_db, "chain_stock")?;
    let ids = |rows: &[Applied]| {
        rows.iter()
            .map(|r| r.order_id.clone())
            .collect::<std::collections::HashSet<_>>()
    };
    let (in_a, in_b) = (ids(&placed), ids(&reserved));
    let lost = orders
        .iter()
        .filter(|(id, _)| !in_a.contains(id) && !in_b.contains(id))
        .count() as u64;
    let log = std::fs::read_to_string(&chain.log).unwrap_or_default();
    let published = relay_published(&log);
    let exact = check_chain(a_after, &chain.b_db, n, B::ORDERED);
    let _ = std::fs::remove_file(&chain.log);
    Ok(AcrossFailover {
        n,
        lost,
        stray: in_b.difference(&in_a).count() as u64,
        unpublished: in_a.difference(&in_b).count() as u64,
        doubled: (placed.len() - in_a.len() + reserved.len() - in_b.len()) as u64,
        published,
        exact,
        failover,
    })
}
