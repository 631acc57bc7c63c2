//! A production-shaped consumer: RabbitMQ → PostgreSQL, a deadpool pool of
//! 8, one task per delivery, a quorum queue with a dead-letter queue.
//!
//! `DATABASE_URL=postgres://… cargo run --example order_service --features postgres,lapin`
//! (RabbitMQ at `AMQP_URL`, default amqp://guest:guest@127.0.0.1:5672/%2f).
//! The demo (`support/order_service_demo.rs`) publishes 20 orders, every
//! fourth twice and one unparsable; this consumes until the queue is quiet
//! for two seconds, then checks each good order was applied once and the
//! bad one dead-lettered.

#[path = "support/order_service_demo.rs"]
mod demo;

use diesel::prelude::*;
use diesel_async::pooled_connection::deadpool::{Pool, PoolError};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use diesel_inbox::brokers::{Policy, Settlement};
use diesel_inbox::{idempotent, InboxError, Processed};
use futures_lite::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use std::sync::Arc;
use std::time::Duration;

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
    /// Redelivering it gives the same answer: dead-letter it at once.
    fn is_permanent(&self) -> bool {
        matches!(
            self,
            AppError::BadPayload(_)
                | AppError::Inbox(
                    InboxError::KeyReused { .. } | InboxError::AttemptsExhausted { .. }
                )
        )
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

    // Prefetch no more deliveries than the pool has connections.
    channel.basic_qos(8, BasicQosOptions::default()).await?;
    // The poison limit is the handler's max_attempts (AttemptsExhausted is
    // permanent); the policy's delivery limit (20) is only a safety net.
    let policy = Arc::new(Policy::new(AppError::is_permanent));
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "order-service".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut tasks = tokio::task::JoinSet::new();
    while let Ok(Some(delivery)) =
        tokio::time::timeout(Duration::from_secs(2), deliveries.next()).await
    {
        let (delivery, pool, policy) = (delivery?, pool.clone(), policy.clone());
        // One task per delivery; the ack goes out after the commit.
        tasks.spawn(async move {
            diesel_inbox::lapin::handle(
                delivery,
                &policy,
                async |id, body| -> Result<Processed<()>, AppError> {
                    let mut conn = pool.get().await?;
                    place_order(&mut conn, id, body).await
                },
            )
            .await
        });
    }
    let (mut applied, mut duplicates, mut dead) = (0, 0, 0);
    while let Some(handled) = tasks.join_next().await {
        let handled = handled??;
        match (&handled.outcome, handled.settlement) {
            (Ok(outcome), _) if outcome.is_applied() => applied += 1,
            (Ok(_), _) => duplicates += 1,
            (Err(_), Settlement::DeadLetter) => dead += 1,
            (Err(e), settlement) => eprintln!("{}: {e} ({settlement:?})", handled.message_id),
        }
    }
    demo::delete(&channel, &queue).await?;
    let rows: i64 = service_orders::table
        .filter(service_orders::id.like(format!("order-{run}-%")))
        .count()
        .get_result(&mut pool.get().await?)
        .await?;
    demo::check(applied, duplicates, dead, rows)
}
