//! Async handlers on a shared pool, under at-least-once delivery.
//!
//! `cargo run --example async_consumer --features async` runs 16 tokio tasks
//! that take connections from one deadpool pool of diesel-async
//! connections (embedded SQLite through `SyncConnectionWrapper`, in a
//! temporary file) and consume a stream in which every message arrives one
//! to three times, in any order, on any task.
//! `DATABASE_URL=postgres://… cargo run --example async_consumer --features async,postgres`
//! (or `mysql://…` with `--features async,mysql`) runs it on a server, on
//! `AsyncPgConnection` or `AsyncMysqlConnection`. Some deliveries stall
//! mid-handler and are cancelled by a 50 ms timeout, as a shutdown or a
//! `select!` would; under contention the 1 s timeout of the others also
//! cancels some at other points, including during their COMMIT. At the end
//! every balance must equal exactly one application of each payment.

use diesel_inbox::InboxError;

const MESSAGES: u64 = 2_000;
const ACCOUNTS: i64 = 10;
const TASKS: usize = 16;

diesel::table! {
    async_accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

/// The handler's error type: anything from Diesel or the inbox.
#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Inbox(InboxError),
}
impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}
impl From<InboxError> for AppError {
    fn from(e: InboxError) -> Self {
        AppError::Inbox(e)
    }
}

#[derive(Clone, Debug)]
pub struct Payment {
    pub id: String,
    pub account: i64,
    pub amount: i64,
}

/// A small deterministic generator, so that every run sees the same stream.
fn next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

/// The consumer, once per connection type.
macro_rules! async_consumer {
    ($module:ident, $Conn:ty) => {
        mod $module {
            use super::*;
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::pooled_connection::deadpool::{Object, Pool};
            use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
            use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
            use diesel_inbox::{idempotent, Processed};
            use std::sync::Arc;
            use std::time::Duration;

            type Conn = $Conn;

            /// Credits an account once per payment id, however often it is delivered.
            /// `slow` makes it wait mid-body, after its write, so that a timeout
            /// cancels it there. (One copy per backend module, one consumer:
            /// `shared` says the copies share it on purpose.)
            #[idempotent(key = "payment.id", consumer = "credit", shared)]
            async fn credit(conn: &mut Conn, payment: &Payment, slow: bool) -> Result<(), AppError> {
                diesel::update(async_accounts::table.find(payment.account))
                    .set(async_accounts::balance.eq(async_accounts::balance + payment.amount))
                    .execute(conn)
                    .await?;
                if slow {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                Ok(())
            }

            /// The consumer on `Conn`; `sqlite` is `(once, per connection)` setup SQL.
            pub async fn run(
                url: &str,
                label: &str,
                sqlite: Option<(&'static str, &'static str)>,
                messages: u64,
            ) -> Result<(), Box<dyn std::error::Error>> {
                // The tables, once.
                let mut setup = Conn::establish(url).await?;
                if let Some((once, _)) = sqlite {
                    setup.batch_execute(once).await?;
                }
                diesel_inbox::migrate_async(&mut setup).await?;
                // A server database may hold an earlier run's table and inbox rows:
                // a fresh table, and payment ids of this run's own.
                setup.batch_execute("DROP TABLE IF EXISTS async_accounts").await?;
                setup
                    .batch_execute(
                        "CREATE TABLE async_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
                    )
                    .await?;
                let run_id = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_nanos();
                for id in 0..ACCOUNTS {
                    diesel::insert_into(async_accounts::table)
                        .values((async_accounts::id.eq(id), async_accounts::balance.eq(0)))
                        .execute(&mut setup)
                        .await?;
                }

                // One pool for every task.
                let mut config = ManagerConfig::default();
                if let Some((_, per_connection)) = sqlite {
                    config.custom_setup = Box::new(move |url| {
                        let url = url.to_string();
                        Box::pin(async move {
                            let mut conn = Conn::establish(&url).await?;
                            conn.batch_execute(per_connection)
                                .await
                                .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                            Ok(conn)
                        })
                    });
                }
                let manager = AsyncDieselConnectionManager::<Conn>::new_with_config(url, config);
                let pool = Pool::builder(manager).max_size(TASKS).build()?;

                // The stream: each payment one to three times, shuffled.
                let mut seed = 7;
                let mut stream = Vec::new();
                let mut expected = vec![0i64; ACCOUNTS as usize];
                for n in 0..messages {
                    let payment = Payment {
                        id: format!("payment-{run_id}-{n}"),
                        account: (next(&mut seed) % ACCOUNTS as u64) as i64,
                        amount: 1 + (next(&mut seed) % 100) as i64,
                    };
                    expected[payment.account as usize] += payment.amount;
                    for _ in 0..1 + next(&mut seed) % 3 {
                        stream.push(payment.clone());
                    }
                }
                for i in (1..stream.len()).rev() {
                    stream.swap(i, (next(&mut seed) % (i as u64 + 1)) as usize);
                }
                // A broker keeps redelivering what was not acked: a cancelled delivery
                // goes back on the stream.
                let stream = Arc::new(tokio::sync::Mutex::new(stream));

                let tasks: Vec<_> = (0..TASKS)
                    .map(|task| {
                        let (pool, stream) = (pool.clone(), stream.clone());
                        tokio::spawn(async move {
                            let mut seed = task as u64 + 1;
                            // Applied, duplicates, cancelled.
                            let mut counts = [0u64; 3];
                            loop {
                                let Some(payment) = stream.lock().await.pop() else {
                                    break;
                                };
                                let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                                // One delivery in 50 stalls mid-body, after its write,
                                // and is cancelled after 50 ms, as a shutdown or a
                                // `select!` would. A healthy one gets a second, far
                                // above its time even on a new connection's first
                                // claim on a loaded machine: a short limit for every
                                // delivery cancels the same ones over and over (on
                                // SQLite a stalled delivery holds the write lock while
                                // it waits).
                                let slow = next(&mut seed) % 50 == 0;
                                let limit = if slow {
                                    Duration::from_millis(50)
                                } else {
                                    Duration::from_secs(1)
                                };
                                let delivery = credit(&mut conn, &payment, slow);
                                match tokio::time::timeout(limit, delivery).await {
                                    Ok(Ok(Processed::Applied(()))) => counts[0] += 1,
                                    Ok(Ok(Processed::Duplicate)) => counts[1] += 1,
                                    Ok(Err(e)) => return Err(format!("{}: {e:?}", payment.id)),
                                    Err(_) => {
                                        // Nothing of it was committed. The connection is
                                        // still inside its transaction; the pool would
                                        // discard it when it next hands it out, but until
                                        // then it holds its locks (on SQLite the write
                                        // lock, on a server the account's row): close it
                                        // now.
                                        drop(Object::take(conn));
                                        counts[2] += 1;
                                        stream.lock().await.insert(0, payment);
                                    }
                                }
                            }
                            Ok::<_, String>(counts)
                        })
                    })
                    .collect();
                let mut counts = [0u64; 3];
                for task in tasks {
                    for (total, n) in counts.iter_mut().zip(task.await??) {
                        *total += n;
                    }
                }
                let [applied, duplicates, cancelled] = counts;

                let balances: Vec<i64> = async_accounts::table
                    .order(async_accounts::id)
                    .select(async_accounts::balance)
                    .load(&mut setup)
                    .await?;
                println!(
                    "{label}: {} payments: {} applied, {} duplicates skipped, {} deliveries cancelled and redelivered",
                    messages, applied, duplicates, cancelled,
                );
                // A delivery cancelled while its COMMIT was on the wire may
                // have committed (as when a connection drops at that
                // moment): its outcome is unknown, the broker redelivers,
                // and the redelivery reports `Duplicate`.
                let committed_then_cancelled = messages - applied;
                if committed_then_cancelled > 0 {
                    println!(
                        "{committed_then_cancelled} cancelled deliveries had committed (cancelled during COMMIT); their redelivery was a duplicate"
                    );
                }
                assert!(applied <= messages, "no payment applied twice");
                assert_eq!(
                    balances, expected,
                    "every balance is one application of each payment"
                );
                println!("balances match: every payment was applied exactly once");
                Ok(())
            }
        }
    };
}

async_consumer!(
    sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
);
#[cfg(feature = "postgres")]
async_consumer!(postgres, diesel_async::AsyncPgConnection);
#[cfg(feature = "mysql")]
async_consumer!(mysql, diesel_async::AsyncMysqlConnection);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").unwrap_or_default();
    run_on(&url, MESSAGES).await
}

/// The consumer over `messages` payments on `url` (a PostgreSQL or MySQL
/// URL, an SQLite file, or "" for a temporary SQLite file). The
/// benchmark's `--memory` runs it too.
pub async fn run_on(url: &str, messages: u64) -> Result<(), Box<dyn std::error::Error>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        return postgres::run(url, "PostgreSQL", None, messages).await;
        #[cfg(not(feature = "postgres"))]
        return Err("DATABASE_URL is a PostgreSQL URL: run with --features async,postgres".into());
    }
    if url.starts_with("mysql://") {
        #[cfg(feature = "mysql")]
        return mysql::run(url, "MySQL/MariaDB", None, messages).await;
        #[cfg(not(feature = "mysql"))]
        return Err("DATABASE_URL is a MySQL URL: run with --features async,mysql".into());
    }
    let path = match url {
        "" => std::env::temp_dir().join(format!(
            "diesel-inbox-async-{}-{}.db",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos()
        )),
        file => std::path::PathBuf::from(file),
    };
    let url = path.to_str().ok_or("temp dir is not UTF-8")?.to_string();
    // WAL lets readers run beside the writer; each connection waits on a
    // busy file rather than failing.
    let result = sqlite::run(
        &url,
        "SQLite",
        Some(("PRAGMA journal_mode = WAL", "PRAGMA busy_timeout = 10000")),
        messages,
    )
    .await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{url}{suffix}"));
    }
    result
}
