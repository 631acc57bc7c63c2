//! A RabbitMQ consumer that acks after commit.
//!
//! `cargo run --example rabbitmq_consumer --features lapin` publishes 1,000
//! orders to a queue of its own on the local RabbitMQ (`AMQP_URL`, default
//! amqp://guest:guest@127.0.0.1:5672/%2f), every fifth twice, each with its
//! AMQP `message_id`. It then consumes them with an `#[idempotent]` async
//! handler on SQLite (a temporary file), or on PostgreSQL with
//! `DATABASE_URL=postgres://…` and `--features lapin,postgres`. Each
//! delivery is acked only after its transaction has committed
//! (`diesel_inbox::lapin::handle`, the step for a loop of your own; the
//! runner, `diesel_inbox::lapin::Consumer`, is `examples/order_service.rs`).
//! At the end every balance must equal exactly one application of each
//! order.

#[path = "support/orders.rs"]
mod support;

use diesel_inbox::brokers::Policy;
use diesel_inbox::Processed;
use futures_lite::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::time::Duration;
use support::AppError;

/// Consumes until the queue has been quiet for a second; the handler runs
/// in `$module`'s database. Returns (applied, duplicates).
macro_rules! consume {
    ($module:ident, $conn:expr, $channel:expr, $queue:expr) => {{
        // A classic queue counts no deliveries (only `redelivered`): the
        // default delivery limit stays a safety net that it cannot reach
        // exactly; the production example uses a quorum queue.
        let policy = Policy::new(|e: &AppError| matches!(e, AppError::BadPayload));
        let mut deliveries = $channel
            .basic_consume(
                $queue.into(),
                "example".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let (mut applied, mut duplicates) = (0u64, 0u64);
        while let Ok(Some(delivery)) =
            tokio::time::timeout(Duration::from_secs(1), deliveries.next()).await
        {
            let handled = diesel_inbox::lapin::handle(delivery?, &policy, async |id, body| {
                support::$module::credit(&mut $conn, id, body).await
            })
            .await?;
            match handled.outcome {
                Ok(Processed::Applied(())) => applied += 1,
                Ok(Processed::Duplicate) => duplicates += 1,
                Err(e) => eprintln!("{}: {e:?} ({:?})", handled.message_id, handled.settlement),
            }
        }
        (applied, duplicates)
    }};
}

async fn publish(
    channel: &Channel,
    queue: &str,
    orders: &[(String, String)],
) -> Result<(), Box<dyn std::error::Error>> {
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    for (id, body) in orders {
        let properties = BasicProperties::default()
            .with_message_id(id.as_str().into())
            .with_delivery_mode(2);
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                properties,
            )
            .await?
            .await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let amqp = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let run = support::run_id();
    let queue = format!("diesel-inbox-example-{run}");
    let connection = Connection::connect(&amqp, ConnectionProperties::default())
        .await
        .map_err(|e| format!("RabbitMQ at {amqp}: {e}"))?;
    let channel = connection.create_channel().await?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    channel.basic_qos(20, BasicQosOptions::default()).await?;
    let (orders, expected) = support::orders(&run);
    publish(&channel, &queue, &orders).await?;

    let database = std::env::var("DATABASE_URL").unwrap_or_default();
    let result = if database.starts_with("postgres://") || database.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            let mut conn = support::postgres::prepare(&database, "SELECT 1").await?;
            let (applied, duplicates) = consume!(postgres, conn, channel, queue.as_str());
            let balances = support::postgres::balances(&mut conn).await?;
            support::check("PostgreSQL", applied, duplicates, &balances, &expected)
        }
        #[cfg(not(feature = "postgres"))]
        Err("DATABASE_URL is a PostgreSQL URL: run with --features lapin,postgres".into())
    } else {
        let path = std::env::temp_dir().join(format!("diesel-inbox-rabbitmq-{run}.db"));
        let path = path.to_str().ok_or("temp dir is not UTF-8")?.to_string();
        let result = async {
            let mut conn = support::sqlite::prepare(&path, "PRAGMA busy_timeout = 10000").await?;
            let (applied, duplicates) = consume!(sqlite, conn, channel, queue.as_str());
            let balances = support::sqlite::balances(&mut conn).await?;
            support::check("SQLite", applied, duplicates, &balances, &expected)
        }
        .await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{path}{suffix}"));
        }
        result
    };
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    result
}
