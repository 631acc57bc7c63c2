//! What the consumer benchmarks (`--brokers`, `--kafka`, `--sqs`) share:
//! the clock of a variant's run, and the PostgreSQL pool with its business
//! table.

use diesel::sql_types::{BigInt, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::{Inbox, InboxError, Processed};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// The first message's start, the last one's end, and how many are done;
/// `finished` is notified at the last.
#[derive(Default)]
pub struct Clock {
    first: Mutex<Option<Instant>>,
    done: AtomicU64,
    last: Mutex<Option<Instant>>,
    pub finished: tokio::sync::Notify,
}

impl Clock {
    pub fn start(&self) {
        self.first.lock().unwrap().get_or_insert_with(Instant::now);
    }

    /// Counts a message done; whether it was the last of `n`.
    pub fn done(&self, n: u64) -> bool {
        self.done_many(1, n)
    }

    /// Counts `k` messages done; whether the last of `n` was among them.
    pub fn done_many(&self, k: u64, n: u64) -> bool {
        let before = self.done.fetch_add(k, Ordering::SeqCst);
        if before < n && before + k >= n {
            *self.last.lock().unwrap() = Some(Instant::now());
            self.finished.notify_one();
        }
        before + k >= n
    }

    /// The messages after the first over the time from the first one's
    /// start to the last one's end.
    pub fn rate(&self, n: u64) -> Result<f64, String> {
        let first = self.first.lock().unwrap().ok_or("no message")?;
        let last = self.last.lock().unwrap().ok_or("not every message")?;
        Ok(n.saturating_sub(1) as f64 / (last - first).as_secs_f64().max(1e-9))
    }
}

/// A production pool of 8 on `url` (`Fast` recycling: the default,
/// `Verified`, sends a `SELECT 1` on every checkout, a round trip per
/// handler call), the inbox migrated, and `table (id, amount)` made anew.
pub async fn pool(url: String, table: &str) -> Result<Pool<AsyncPgConnection>, String> {
    let mut config = ManagerConfig::default();
    config.recycling_method = RecyclingMethod::Fast;
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(url, config);
    let pool = Pool::builder(manager)
        .max_size(8)
        .build()
        .map_err(|e| e.to_string())?;
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    diesel_inbox::migrate_async(&mut *conn)
        .await
        .map_err(|e| e.to_string())?;
    conn.batch_execute(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id TEXT NOT NULL, amount BIGINT NOT NULL)"
    ))
    .await
    .map_err(|e| e.to_string())?;
    drop(conn);
    Ok(pool)
}

/// The runners' handler: the body as an amount, the inbox row of
/// `consumer` and the business row in `table` in one transaction
/// (`Inbox::run_async`), timed on `clock` (its `finished` notified at the
/// `n`th).
pub async fn apply(
    pool: &Pool<AsyncPgConnection>,
    clock: &Clock,
    n: u64,
    (consumer, table): (&str, &str),
    id: &str,
    body: &[u8],
) -> Result<Processed<()>, InboxError> {
    clock.start();
    let amount: i64 = std::str::from_utf8(body)
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or_default();
    let Ok(mut conn) = pool.get().await else {
        return Err(InboxError::InvalidArgument("no database connection"));
    };
    let insert = format!("INSERT INTO {table} (id, amount) VALUES ($1, $2)");
    let done = Inbox::consumer(consumer)
        .run_async(&mut *conn, id, async |conn: &mut AsyncPgConnection| {
            diesel::sql_query(&insert)
                .bind::<Text, _>(id)
                .bind::<BigInt, _>(amount)
                .execute(conn)
                .await
                .map(drop)
        })
        .await
        .map_err(|e: diesel::result::Error| InboxError::Database(e))?;
    clock.done(n);
    Ok(done)
}
