//! A production-shaped consumer: RabbitMQ → PostgreSQL, a deadpool pool of
//! 8, the library's consumer runner with 8 deliveries in flight, a health
//! probe, shutdown on SIGTERM, a quorum queue with a dead-letter queue.
//!
//! `DATABASE_URL=postgres://user:pass@host/db cargo run --example order_service --features postgres,lapin`
//! (RabbitMQ at `AMQP_URL`, default amqp://guest:guest@127.0.0.1:5672/%2f).
//! The demo (`support/order_service_demo.rs`) publishes 20 orders, every
//! fourth twice and one unparsable; this consumes until SIGTERM or until
//! the queue is quiet for two seconds, then checks each good order was
//! applied once and the bad one dead-lettered.

#[path = "support/order_service_demo.rs"]
mod demo;

use diesel::prelude::*;
use diesel_async::pooled_connection::deadpool::{Pool, PoolError};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use diesel_inbox::brokers::{HasInboxError, Policy};
use diesel_inbox::{idempotent, InboxError, Processed};
use lapin::{Connection, ConnectionProperties};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

diesel::table! { service_orders (id) { id -> Text, total_cents -> BigInt } }

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
    #[error(transparent)]
    Inbox(#[from] InboxError),
    #[error("no database connection: {0}")]
    Pool(#[from] PoolError),
    #[error("bad payload: {0:?}")]
    BadPayload(String),
}

impl AppError {
    /// Redelivering it gives the same answer: dead-letter it at once (the
    /// inbox's own refusals, such as AttemptsExhausted, always are).
    fn is_permanent(&self) -> bool {
        matches!(self, AppError::BadPayload(_))
    }
}

/// Where the inbox's refusals travel: the runner dead-letters them.
impl HasInboxError for AppError {
    fn inbox_error(&self) -> Option<&InboxError> {
        match self {
            AppError::Inbox(e) => Some(e),
            _ => None,
        }
    }
}

/// The handler: the order row and the inbox row, in one transaction.
#[idempotent(key = "id", max_attempts = 5)]
async fn place_order(conn: &mut AsyncPgConnection, id: &str, body: &[u8]) -> Result<(), AppError> {
    let text = String::from_utf8_lossy(body);
    let total_cents: i64 = text
        .trim()
        .parse()
        .map_err(|_| AppError::BadPayload(text.to_string()))?;
    diesel::insert_into(service_orders::table)
        .values((
            service_orders::id.eq(id),
            service_orders::total_cents.eq(total_cents),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL=postgres://…")?;
    let amqp = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let pool: Pool<AsyncPgConnection> = Pool::builder(AsyncDieselConnectionManager::new(database))
        .max_size(8)
        .build()?;
    {
        let mut conn = pool.get().await?;
        diesel_inbox::migrate_async(&mut *conn).await?;
        diesel::sql_query(
            "CREATE TABLE IF NOT EXISTS service_orders (id TEXT PRIMARY KEY, total_cents BIGINT NOT NULL)",
        )
        .execute(&mut conn)
        .await?;
    }
    let channel = Connection::connect(&amqp, ConnectionProperties::default())
        .await?
        .create_channel()
        .await?;
    let run = std::process::id();
    let queue = format!("orders-{run}");
    demo::declare(&channel, &queue).await?;
    demo::publish(&channel, &queue, run).await?;

    // The poison limit is the handler's max_attempts; the policy's delivery
    // limit (20) is only a safety net.
    let policy = Policy::new(AppError::is_permanent);
    let probe = pool.clone();
    let (applied, duplicates) = (AtomicU64::new(0), AtomicU64::new(0));
    let last = Mutex::new(Instant::now());
    // `connect`: the runner owns its broker connection and makes it again
    // whenever it drops.
    let report = diesel_inbox::lapin::Consumer::connect(amqp.as_str(), queue.as_str(), policy)
        // No more deliveries in flight (and prefetched) than the pool has
        // connections.
        .in_flight(8)
        // While the database does not answer, take no new deliveries.
        .health_probe(move || {
            let pool = probe.clone();
            async move {
                let Ok(mut conn) = pool.get().await else {
                    return false;
                };
                diesel::sql_query("SELECT 1")
                    .execute(&mut conn)
                    .await
                    .is_ok()
            }
        })
        .run(
            async |id: &str, body: &[u8]| -> Result<Processed<()>, AppError> {
                let outcome = place_order(&mut *pool.get().await?, id, body).await;
                let count = match outcome {
                    Ok(Processed::Applied(())) => &applied,
                    _ => &duplicates,
                };
                if outcome.is_ok() {
                    count.fetch_add(1, Ordering::Relaxed);
                }
                *last.lock().unwrap() = Instant::now();
                outcome
            },
            // SIGTERM, or (for the demo) a queue quiet for two seconds.
            async {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("a SIGTERM handler");
                while last.lock().unwrap().elapsed() < Duration::from_secs(2) {
                    tokio::select! {
                        _ = term.recv() => return,
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            },
        )
        .await?;
    println!("{report:?}");
    let (applied, duplicates) = (applied.into_inner(), duplicates.into_inner());
    demo::delete(&channel, &queue).await?;
    let rows: i64 = service_orders::table
        .filter(service_orders::id.like(format!("order-{run}-%")))
        .count()
        .get_result(&mut pool.get().await?)
        .await?;
    demo::check(applied, duplicates, report.dead_lettered, rows)
}
