//! A NATS JetStream consumer that acks after commit.
//!
//! `cargo run --example nats_consumer --features nats` creates a stream of
//! its own on the local NATS server (`NATS_URL`, default
//! nats://127.0.0.1:4222), publishes 1,000 orders with `Nats-Msg-Id`, every
//! fifth again after the stream's duplicate window (a producer retry that
//! JetStream no longer catches), and consumes them with an `#[idempotent]`
//! async handler on SQLite (a temporary file), or on PostgreSQL with
//! `DATABASE_URL=postgres://…` and `--features nats,postgres`. Each message
//! is acked only after its transaction has committed, by the library's
//! consumer runner (`diesel_inbox::nats::Consumer`, 8 in flight, shutdown
//! on SIGTERM). At the end every balance must equal
//! exactly one application of each order.

#[path = "support/orders.rs"]
mod support;

use async_nats::jetstream::{self, consumer::pull, stream};
use diesel_inbox::brokers::Policy;
use diesel_inbox::Processed;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::AppError;

/// Consumes with the library's runner (`diesel_inbox::nats::Consumer`, 8
/// messages in flight) until SIGTERM or until the stream has been quiet for
/// a second; the handler runs in `$module`'s database, on one connection
/// here (a pool in a service). Returns (applied, duplicates).
macro_rules! consume {
    ($module:ident, $conn:expr, $consumer:expr) => {{
        let policy = Policy::new(|e: &AppError| matches!(e, AppError::BadPayload))
            .retry_delay(Duration::from_millis(200));
        let conn = tokio::sync::Mutex::new($conn);
        let (applied, duplicates) = (AtomicU64::new(0), AtomicU64::new(0));
        let last = Mutex::new(Instant::now());
        let report = diesel_inbox::nats::Consumer::new($consumer, policy)
            .in_flight(8)
            .run(
                async |id: &str, body: &[u8]| {
                    let outcome = support::$module::credit(&mut *conn.lock().await, id, body).await;
                    match &outcome {
                        Ok(Processed::Applied(())) => applied.fetch_add(1, Ordering::Relaxed),
                        Ok(Processed::Duplicate) => duplicates.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            eprintln!("{id}: {e:?}");
                            0
                        }
                    };
                    *last.lock().unwrap() = Instant::now();
                    outcome
                },
                async {
                    let mut term =
                        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                            .expect("a SIGTERM handler");
                    while last.lock().unwrap().elapsed() < Duration::from_secs(1) {
                        tokio::select! {
                            _ = term.recv() => return,
                            () = tokio::time::sleep(Duration::from_millis(100)) => {}
                        }
                    }
                },
            )
            .await?;
        println!("{report:?}");
        (
            conn.into_inner(),
            applied.into_inner(),
            duplicates.into_inner(),
        )
    }};
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let client = async_nats::connect(&url)
        .await
        .map_err(|e| format!("NATS at {url}: {e}"))?;
    let js = jetstream::new(client);
    let run = support::run_id();
    let name = format!("DIESEL_INBOX_EXAMPLE_{run}");
    let subject = format!("example.orders.{run}");
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            duplicate_window: Duration::from_millis(200),
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("example".into()),
            ..Default::default()
        })
        .await?;

    let (orders, expected) = support::orders(&run);
    let mut first = std::collections::HashSet::new();
    let mut waited = false;
    for (id, body) in &orders {
        if !first.insert(id.clone()) && !waited {
            // The retries go out after the duplicate window.
            tokio::time::sleep(Duration::from_millis(300)).await;
            waited = true;
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id.as_str());
        js.publish_with_headers(subject.clone(), headers, body.clone().into())
            .await?
            .await?;
    }

    let database = std::env::var("DATABASE_URL").unwrap_or_default();
    let result = if database.starts_with("postgres://") || database.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            let conn = support::postgres::prepare(&database, "SELECT 1").await?;
            let (mut conn, applied, duplicates) = consume!(postgres, conn, consumer);
            let balances = support::postgres::balances(&mut conn).await?;
            support::check("PostgreSQL", applied, duplicates, &balances, &expected)
        }
        #[cfg(not(feature = "postgres"))]
        Err("DATABASE_URL is a PostgreSQL URL: run with --features nats,postgres".into())
    } else {
        let path = std::env::temp_dir().join(format!("diesel-inbox-nats-{run}.db"));
        let path = path.to_str().ok_or("temp dir is not UTF-8")?.to_string();
        let result = async {
            let conn = support::sqlite::prepare(&path, "PRAGMA busy_timeout = 10000").await?;
            let (mut conn, applied, duplicates) = consume!(sqlite, conn, consumer);
            let balances = support::sqlite::balances(&mut conn).await?;
            support::check("SQLite", applied, duplicates, &balances, &expected)
        }
        .await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{path}{suffix}"));
        }
        result
    };
    js.delete_stream(&name).await?;
    result
}
