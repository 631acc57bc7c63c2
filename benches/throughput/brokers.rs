//! `--brokers`: the RabbitMQ and NATS runners on PostgreSQL
//! (`INBOX_TEST_POSTGRES_URL`, and `INBOX_TEST_AMQP_URL` and/or
//! `INBOX_TEST_NATS_URL`): messages/s of `run` with `in_flight(8)` against
//! `run_batch` with `batch(250, 5 ms)`.
//!
//! Each variant consumes `--broker-messages` messages published
//! beforehand to a queue (a durable classic queue) or stream (file
//! storage, a durable pull consumer) of its own; its rate is the messages
//! after the first over the time from the first handler call to the last
//! one's end. The variants run interleaved, their order alternating each
//! round; each reports its median over `--rounds`:
//! - `run8`: an `Inbox::run_async` handler inserting the business row, 8
//!   deliveries at once (8 pooled connections);
//! - `batch`: an `Inbox::run_batch_async` handler inserting the claimed
//!   messages' rows in one statement, one batch at a time.

use crate::args::Args;
use crate::consume::Clock;
use crate::output::write_output;
use crate::run_id;
use diesel::sql_types::{Array, BigInt, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use diesel_inbox::brokers::{Message, Policy};
use diesel_inbox::{Batch, Inbox, InboxError, Processed};
use std::time::Duration;

const VARIANTS: [&str; 2] = ["run8", "batch"];
const CONSUMER: &str = "bench-brokers";
const BATCH: usize = 250;

pub fn run(args: &Args) -> Result<(), String> {
    let url = std::env::var("INBOX_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or("--brokers: INBOX_TEST_POSTGRES_URL is not set")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(measure(args, url))
}

async fn measure(args: &Args, url: String) -> Result<(), String> {
    let pool = crate::consume::pool(url, "bench_brokers").await?;
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut lines = Vec::new();
    let mut json = Vec::new();
    for (broker, url) in [
        ("rabbitmq", var("INBOX_TEST_AMQP_URL")),
        ("nats", var("INBOX_TEST_NATS_URL")),
    ] {
        let Some(url) = url else {
            println!("brokers {broker}: SKIPPED (its URL variable is not set)");
            continue;
        };
        let n = args.broker_messages as u64;
        let run = run_id();
        let mut samples: Vec<(&str, Vec<f64>)> =
            VARIANTS.iter().map(|v| (*v, Vec::new())).collect();
        // `batch`'s commit-to-settlement median and p99 (ms), per round.
        let mut settled: Vec<(f64, f64)> = Vec::new();
        for round in 0..args.rounds {
            for i in 0..VARIANTS.len() {
                let variant = VARIANTS[(i + round) % VARIANTS.len()];
                let queue = format!("bench-{run}-{variant}-{round}");
                let clock = Clock::default();
                crate::settle::start();
                match broker {
                    "rabbitmq" => rabbit(&url, &queue, &pool, &clock, n, variant).await?,
                    _ => nats(&url, &queue, &pool, &clock, n, variant).await?,
                }
                if variant == "batch" {
                    settled.push(crate::settle::percentiles()?);
                }
                let rate = clock.rate(n)?;
                samples
                    .iter_mut()
                    .find(|(v, _)| *v == variant)
                    .expect("a variant")
                    .1
                    .push(rate);
            }
        }
        let median = |v: &str| {
            let mut s = samples
                .iter()
                .find(|(n, _)| *n == v)
                .expect("a variant")
                .1
                .clone();
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        };
        let (single, batch) = (median("run8"), median("batch"));
        let (settle_p50, settle_p99) = crate::settle::median_of(&settled);
        lines.push(format!(
            "{broker} postgres, {n} messages x {} rounds: run in_flight 8 {single:.0}/s, run_batch (batches of {BATCH}) {batch:.0}/s: {:.1}x; a message's database commit to its ack, median {settle_p50:.2} ms, p99 {settle_p99:.2} ms",
            args.rounds,
            batch / single
        ));
        json.push(format!(
            "{{\"broker\":\"{broker}\",\"messages\":{n},\"rounds\":{},\"run8\":{single:.1},\"batch\":{batch:.1},\"batch_over_run8\":{:.3},\"batch_settle_p50_ms\":{settle_p50:.3},\"batch_settle_p99_ms\":{settle_p99:.3}}}",
            args.rounds,
            batch / single
        ));
    }
    for line in &lines {
        println!("{line}");
    }
    let dir = write_output("brokers.json", &format!("[{}]\n", json.join(",")))?;
    println!("wrote {}", dir.join("brokers.json").display());
    Ok(())
}

/// The business row of one message.
async fn insert(conn: &mut AsyncPgConnection, id: &str, amount: i64) -> diesel::QueryResult<()> {
    insert_many(conn, vec![id], vec![amount]).await
}

/// The business rows of a batch, in one statement.
async fn insert_many(
    conn: &mut AsyncPgConnection,
    ids: Vec<&str>,
    amounts: Vec<i64>,
) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "INSERT INTO bench_brokers (id, amount) SELECT * FROM unnest($1::text[], $2::bigint[])",
    )
    .bind::<Array<Text>, _>(ids)
    .bind::<Array<BigInt>, _>(amounts)
    .execute(conn)
    .await
    .map(drop)
}

fn amount(body: &[u8]) -> i64 {
    std::str::from_utf8(body)
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or_default()
}

/// Runs `consumer` (either broker's runner) as `variant` until `n`
/// messages are done.
async fn consume<S: diesel_inbox::brokers::Source>(
    consumer: diesel_inbox::brokers::Consumer<S, InboxError>,
    pool: &Pool<AsyncPgConnection>,
    clock: &Clock,
    n: u64,
    variant: &str,
) -> Result<(), String> {
    let report = match variant {
        "batch" => {
            consumer
                .batch(BATCH, Duration::from_millis(5))
                .run_batch(
                    async |messages: &[Message<'_>]| -> Result<Batch<()>, InboxError> {
                        clock.start();
                        let Ok(mut conn) = pool.get().await else {
                            return Err(InboxError::InvalidArgument("no database connection"));
                        };
                        let done = Inbox::consumer(CONSUMER)
                            .run_batch_async(
                                &mut *conn,
                                messages,
                                |m| m.id().to_owned(),
                                async |conn: &mut AsyncPgConnection, fresh: Vec<&Message<'_>>| {
                                    let ids = fresh.iter().map(|m| m.id()).collect();
                                    let amounts = fresh.iter().map(|m| amount(m.body())).collect();
                                    insert_many(conn, ids, amounts).await
                                },
                            )
                            .await
                            .map_err(|e: diesel::result::Error| InboxError::Database(e))?;
                        crate::settle::committed(messages.len());
                        clock.done_many(messages.len() as u64, n);
                        Ok(done)
                    },
                    clock.finished.notified(),
                )
                .await
        }
        _ => {
            consumer
                .in_flight(8)
                .run(
                    async |id: &str, body: &[u8]| -> Result<Processed<()>, InboxError> {
                        clock.start();
                        let Ok(mut conn) = pool.get().await else {
                            return Err(InboxError::InvalidArgument("no database connection"));
                        };
                        let amount = amount(body);
                        let done = Inbox::consumer(CONSUMER)
                            .run_async(&mut *conn, id, async |conn: &mut AsyncPgConnection| {
                                insert(conn, id, amount).await
                            })
                            .await
                            .map_err(|e: diesel::result::Error| InboxError::Database(e))?;
                        clock.done(n);
                        Ok(done)
                    },
                    clock.finished.notified(),
                )
                .await
        }
    }
    .map_err(|e| e.to_string())?;
    if report.acked < n {
        return Err(format!("{variant} acked {} of {n}", report.acked));
    }
    Ok(())
}

fn policy() -> Policy<InboxError> {
    Policy::new(|_: &InboxError| false)
}

#[cfg(feature = "lapin")]
async fn rabbit(
    url: &str,
    queue: &str,
    pool: &Pool<AsyncPgConnection>,
    clock: &Clock,
    n: u64,
    variant: &str,
) -> Result<(), String> {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    use lapin::{BasicProperties, Connection, ConnectionProperties};
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| e.to_string())?;
    let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), durable, FieldTable::default())
        .await
        .map_err(|e| e.to_string())?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut confirms = Vec::new();
    for i in 0..n {
        let properties = BasicProperties::default()
            .with_message_id(format!("{queue}-{i}").as_str().into())
            .with_delivery_mode(2);
        confirms.push(
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    i.to_string().as_bytes(),
                    properties,
                )
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    for confirm in confirms {
        confirm.await.map_err(|e| e.to_string())?;
    }
    let consumer = diesel_inbox::lapin::Consumer::new(channel, queue, policy());
    consume(consumer, pool, clock, n, variant).await
}

#[cfg(not(feature = "lapin"))]
async fn rabbit(
    _: &str,
    _: &str,
    _: &Pool<AsyncPgConnection>,
    _: &Clock,
    _: u64,
    _: &str,
) -> Result<(), String> {
    Err("--brokers on RabbitMQ needs the `lapin` feature".into())
}

#[cfg(feature = "nats")]
async fn nats(
    url: &str,
    queue: &str,
    pool: &Pool<AsyncPgConnection>,
    clock: &Clock,
    n: u64,
    variant: &str,
) -> Result<(), String> {
    use async_nats::jetstream::{self, consumer::pull, stream};
    let client = async_nats::connect(url).await.map_err(|e| e.to_string())?;
    let js = jetstream::new(client);
    let name = queue.replace(['.', '-'], "_");
    let subject = format!("bench.{name}");
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("bench".into()),
            max_ack_pending: 2_000,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut acks = Vec::new();
    for i in 0..n {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("{queue}-{i}").as_str());
        acks.push(
            js.publish_with_headers(subject.clone(), headers, i.to_string().into())
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    for ack in acks {
        ack.await.map_err(|e| e.to_string())?;
    }
    let runner = diesel_inbox::nats::Consumer::new(consumer, policy());
    let done = consume(runner, pool, clock, n, variant).await;
    let _ = js.delete_stream(&name).await;
    done
}

#[cfg(not(feature = "nats"))]
async fn nats(
    _: &str,
    _: &str,
    _: &Pool<AsyncPgConnection>,
    _: &Clock,
    _: u64,
    _: &str,
) -> Result<(), String> {
    Err("--brokers on NATS needs the `nats` feature".into())
}
