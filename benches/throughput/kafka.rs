//! `--kafka`: the Kafka runner on PostgreSQL, against the broker in
//! `INBOX_TEST_KAFKA_BROKERS` (`scripts/kafka.sh start`).
//!
//! Each variant consumes `--kafka-messages` messages (12 keys, 6
//! partitions, produced beforehand to a topic of its own) in a consumer
//! group of its own; its rate is the messages after the first over the
//! time from the first message's start to the last one's end (the group
//! join is not timed). The variants run interleaved, their order rotating
//! each round; each reports its median over `--rounds`:
//! - `runner`: `diesel_inbox::kafka::Consumer` with `in_flight(1)`, an
//!   `Inbox::run_async` handler inserting the business row: the inbox row,
//!   the row and the position in one transaction, then Kafka's offset;
//! - `runner8`: the same with `in_flight(8)` (partitions at once, the
//!   default);
//! - `hand`: a hand-written rdkafka loop doing the same by hand, one
//!   message at a time: in one transaction the inbox row (`ON CONFLICT DO
//!   NOTHING`), the business row and the guarded position upsert, then an
//!   asynchronous offset commit;
//! - `batch`: `diesel_inbox::kafka::Consumer::run_batch` with
//!   `batch(500, 5 ms)`, an `Inbox::run_batch_async` handler inserting the
//!   claimed messages' business rows in one statement: per batch, one
//!   transaction (the batch claim, the rows, each partition's position),
//!   then one offset commit;
//! - `handbatch`: a hand-written batched rdkafka consumer: up to 500
//!   messages (what arrived within 5 ms), one transaction per batch (a
//!   multi-row inbox insert `ON CONFLICT DO NOTHING RETURNING`, a
//!   multi-row business insert of the claimed ids, one guarded `unnest`
//!   upsert of the partitions' positions), commit, then the offsets;
//! - `floor`: an at-least-once consumer with no database: receive, commit
//!   the offset asynchronously.

use crate::args::Args;
use crate::consume::Clock;
use crate::output::write_output;
use crate::run_id;
use diesel::sql_types::{Array, BigInt, Integer, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use diesel_inbox::brokers::{Message, Policy};
use diesel_inbox::{Batch, Inbox, InboxError};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};
use std::time::Duration;

const VARIANTS: [&str; 6] = ["runner", "runner8", "hand", "batch", "handbatch", "floor"];
/// The batches of `batch` and `handbatch`.
const BATCH: usize = 500;
const LINGER: Duration = Duration::from_millis(5);
const CONSUMER: &str = "bench-kafka";
const INSERT: &str = "INSERT INTO bench_kafka (id, amount) VALUES ($1, $2)";

pub fn run(args: &Args) -> Result<(), String> {
    let url = std::env::var("INBOX_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or("--kafka: INBOX_TEST_POSTGRES_URL is not set")?;
    let brokers = std::env::var("INBOX_TEST_KAFKA_BROKERS")
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or("--kafka: INBOX_TEST_KAFKA_BROKERS is not set (scripts/kafka.sh start)")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(measure(args, url, brokers))
}

async fn measure(args: &Args, url: String, brokers: String) -> Result<(), String> {
    let pool = crate::consume::pool(url, "bench_kafka").await?;
    let run = run_id();
    let n = args.kafka_messages as u64;
    let variants: Vec<&str> = match args.kafka_variants.is_empty() {
        true => VARIANTS.to_vec(),
        false => {
            let unknown: Vec<&String> = args
                .kafka_variants
                .iter()
                .filter(|v| !VARIANTS.contains(&v.as_str()))
                .collect();
            if !unknown.is_empty() {
                return Err(format!(
                    "--kafka-variants: unknown {unknown:?} (known: {VARIANTS:?})"
                ));
            }
            VARIANTS
                .iter()
                .copied()
                .filter(|v| args.kafka_variants.iter().any(|w| w == v))
                .collect()
        }
    };
    let mut samples: Vec<(&str, Vec<f64>)> = variants.iter().map(|v| (*v, Vec::new())).collect();
    // `batch`'s commit-to-settlement median and p99 (ms), per round.
    let mut settled: Vec<(f64, f64)> = Vec::new();
    for round in 0..args.rounds {
        for i in 0..variants.len() {
            let variant = variants[(i + round) % variants.len()];
            let topic = format!("bench-{run}-{variant}-{round}");
            produce(&brokers, &topic, n).await?;
            let consumer: StreamConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", &topic)
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                .set("auto.offset.reset", "earliest")
                // The brokers here hold a new group's join for a while
                // with the default session timeout (45 s).
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "1000")
                .create()
                .map_err(|e| e.to_string())?;
            consumer.subscribe(&[&topic]).map_err(|e| e.to_string())?;
            let clock = Clock::default();
            match variant {
                "runner" | "runner8" => {
                    let in_flight = if variant == "runner" { 1 } else { 8 };
                    runner(consumer, &pool, &clock, n, in_flight).await?
                }
                "hand" => hand(consumer, &pool, &clock, n).await?,
                "batch" => {
                    crate::settle::start();
                    batch(consumer, &pool, &clock, n).await?;
                    settled.push(crate::settle::percentiles()?);
                }
                "handbatch" => hand_batch(consumer, &pool, &clock, n).await?,
                _ => floor(consumer, &clock, n).await?,
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
        let Some((_, s)) = samples.iter().find(|(n, _)| *n == v) else {
            return f64::NAN;
        };
        let mut s = s.clone();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    let (runner_rate, runner8_rate, hand_rate, floor_rate) = (
        median("runner"),
        median("runner8"),
        median("hand"),
        median("floor"),
    );
    let (batch_rate, hand_batch_rate) = (median("batch"), median("handbatch"));
    // Each round's batch / handbatch (the two ran one after the other in
    // it), and their median: the rates drift over a run (the tables grow),
    // a round's pair much less.
    let paired = {
        let of = |v: &str| {
            samples
                .iter()
                .find(|(n, _)| *n == v)
                .map(|(_, s)| s.clone())
        };
        let mut ratios: Vec<f64> = match (of("batch"), of("handbatch")) {
            (Some(a), Some(b)) => a.iter().zip(&b).map(|(a, b)| a / b).collect(),
            _ => Vec::new(),
        };
        ratios.sort_by(f64::total_cmp);
        ratios.get(ratios.len() / 2).copied().map(|m| (m, ratios))
    };
    if let Some((median, ratios)) = &paired {
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "kafka postgres batches of {BATCH}: run_batch/hand-batched per round, sorted: {} (median {median:.2})",
            each.join(" ")
        );
    }
    let (settle_p50, settle_p99) = crate::settle::median_of(&settled);
    println!(
        "kafka postgres, {n} messages x {} rounds: runner {runner_rate:.0}/s, hand-written {hand_rate:.0}/s (runner/hand {:.2}), runner in_flight 8 {runner8_rate:.0}/s ({:.2}x hand), no database {floor_rate:.0}/s (runner/floor {:.2}, runner8/floor {:.2})",
        args.rounds,
        runner_rate / hand_rate,
        runner8_rate / hand_rate,
        runner_rate / floor_rate,
        runner8_rate / floor_rate
    );
    println!(
        "kafka postgres batches of {BATCH}: run_batch {batch_rate:.0}/s, hand-written batched {hand_batch_rate:.0}/s (run_batch/hand-batched {:.2}; run_batch/runner8 {:.1}x; run_batch/floor {:.2})",
        batch_rate / hand_batch_rate,
        batch_rate / runner8_rate,
        batch_rate / floor_rate
    );
    println!(
        "kafka postgres batches of {BATCH}: a message's database commit to its offset commit, median {settle_p50:.2} ms, p99 {settle_p99:.2} ms (medians over the rounds)"
    );
    let json = format!(
        "{{\"backend\":\"postgres\",\"messages\":{n},\"rounds\":{},\"runner\":{runner_rate:.1},\"runner8\":{runner8_rate:.1},\"hand\":{hand_rate:.1},\"batch\":{batch_rate:.1},\"handbatch\":{hand_batch_rate:.1},\"floor\":{floor_rate:.1},\"runner_over_hand\":{:.3},\"runner8_over_hand\":{:.3},\"runner_over_floor\":{:.3},\"batch_over_handbatch\":{:.3},\"batch_over_runner8\":{:.3},\"batch_settle_p50_ms\":{settle_p50:.3},\"batch_settle_p99_ms\":{settle_p99:.3}}}\n",
        args.rounds,
        runner_rate / hand_rate,
        runner8_rate / hand_rate,
        runner_rate / floor_rate,
        batch_rate / hand_batch_rate,
        batch_rate / runner8_rate
    );
    let dir = write_output("kafka.json", &json)?;
    println!("wrote {}", dir.join("kafka.json").display());
    Ok(())
}

/// Creates `topic` (6 partitions) and produces `n` messages over 12 keys,
/// each with its id header.
async fn produce(brokers: &str, topic: &str, n: u64) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| e.to_string())?;
    for created in admin
        .create_topics(
            &[NewTopic::new(topic, 6, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| e.to_string())?
    {
        created.map_err(|(t, e)| format!("creating {t}: {e}"))?;
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .map_err(|e| e.to_string())?;
    let mut pending = Vec::new();
    for i in 0..n {
        let id = format!("{topic}-{i}");
        let key = format!("k{}", i % 12);
        let body = i.to_string();
        let record =
            FutureRecord::to(topic)
                .key(&key)
                .payload(&body)
                .headers(OwnedHeaders::new().insert(Header {
                    key: "message-id",
                    value: Some(id.as_str()),
                }));
        pending.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| e.to_string())?,
        );
    }
    for delivery in pending {
        delivery
            .await
            .map_err(|_| "the producer was dropped".to_string())?
            .map_err(|(e, _)| e.to_string())?;
    }
    Ok(())
}

async fn insert(conn: &mut AsyncPgConnection, id: &str, amount: i64) -> diesel::QueryResult<()> {
    diesel::sql_query(INSERT)
        .bind::<Text, _>(id)
        .bind::<BigInt, _>(amount)
        .execute(conn)
        .await
        .map(drop)
}

async fn runner(
    consumer: StreamConsumer,
    pool: &Pool<AsyncPgConnection>,
    clock: &Clock,
    n: u64,
    in_flight: usize,
) -> Result<(), String> {
    let report = diesel_inbox::kafka::Consumer::new(consumer, Policy::new(|_: &InboxError| false))
        .in_flight(in_flight)
        .shutdown_deadline(Duration::from_secs(10))
        .run(
            async |id: &str, body: &[u8]| {
                crate::consume::apply(pool, clock, n, (CONSUMER, "bench_kafka"), id, body).await
            },
            clock.finished.notified(),
        )
        .await
        .map_err(|e| e.to_string())?;
    if report.acked < n {
        return Err(format!("the runner acked {} of {n}", report.acked));
    }
    Ok(())
}

/// The position write a careful hand-written consumer makes: moved only
/// forward.
const POSITION: &str =
    "INSERT INTO inbox_positions (consumer, topic, partition_id, next_offset, updated_at) \
     VALUES ($1, $2, $3, $4, (extract(epoch from now()) * 1000000)::bigint) \
     ON CONFLICT (consumer, topic, partition_id) DO UPDATE SET next_offset = EXCLUDED.next_offset, \
     updated_at = EXCLUDED.updated_at WHERE inbox_positions.next_offset <= $5";
const CLAIM: &str =
    "INSERT INTO inbox_messages (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING";

async fn hand(
    consumer: StreamConsumer,
    pool: &Pool<AsyncPgConnection>,
    clock: &Clock,
    n: u64,
) -> Result<(), String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let mut handled = 0;
    while handled < n {
        let message = consumer.recv().await.map_err(|e| e.to_string())?;
        clock.start();
        let id = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "message-id"))
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned)
            .unwrap_or_else(|| {
                format!(
                    "{}/{}/{}",
                    message.topic(),
                    message.partition(),
                    message.offset()
                )
            });
        let amount: i64 = message
            .payload()
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|b| b.parse().ok())
            .unwrap_or_default();
        let (topic, partition, offset) = (message.topic(), message.partition(), message.offset());
        conn.transaction(async |conn| {
            let claimed = diesel::sql_query(CLAIM)
                .bind::<Text, _>(CONSUMER)
                .bind::<Text, _>(&id)
                .execute(conn)
                .await?;
            if claimed == 1 {
                insert(conn, &id, amount).await?;
            }
            diesel::sql_query(POSITION)
                .bind::<Text, _>(CONSUMER)
                .bind::<Text, _>(topic)
                .bind::<Integer, _>(partition)
                .bind::<BigInt, _>(offset + 1)
                .bind::<BigInt, _>(offset)
                .execute(conn)
                .await
                .map(drop)
        })
        .await
        .map_err(|e: diesel::result::Error| e.to_string())?;
        consumer
            .commit_message(&message, CommitMode::Async)
            .map_err(|e| e.to_string())?;
        handled += 1;
        clock.done(n);
    }
    Ok(())
}

async fn floor(consumer: StreamConsumer, clock: &Clock, n: u64) -> Result<(), String> {
    let mut handled = 0;
    while handled < n {
        let message = consumer.recv().await.map_err(|e| e.to_string())?;
        clock.start();
        consumer
            .commit_message(&message, CommitMode::Async)
            .map_err(|e| e.to_string())?;
        handled += 1;
        clock.done(n);
    }
    Ok(())
}

/// The business rows of a batch, in one statement.
const INSERT_MANY: &str =
    "INSERT INTO bench_kafka (id, amount) SELECT * FROM unnest($1::text[], $2::bigint[])";

async fn insert_many(
    conn: &mut AsyncPgConnection,
    ids: Vec<&str>,
    amounts: Vec<i64>,
) -> diesel::QueryResult<()> {
    diesel::sql_query(INSERT_MANY)
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

async fn batch(
    consumer: StreamConsumer,
    pool: &Pool<AsyncPgConnection>,
    clock: &Clock,
    n: u64,
) -> Result<(), String> {
    let finished = tokio::sync::Notify::new();
    let report = diesel_inbox::kafka::Consumer::new(consumer, Policy::new(|_: &InboxError| false))
        .batch(BATCH, LINGER)
        .shutdown_deadline(Duration::from_secs(10))
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
                if clock.done_many(messages.len() as u64, n) {
                    finished.notify_one();
                }
                Ok(done)
            },
            finished.notified(),
        )
        .await
        .map_err(|e| e.to_string())?;
    if report.acked < n {
        return Err(format!("run_batch acked {} of {n}", report.acked));
    }
    Ok(())
}

/// A batch's claim: the ids inserted now are the ones to apply.
const CLAIM_MANY: &str = "INSERT INTO inbox_messages (consumer, message_id) \
     SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING RETURNING message_id";
/// Every partition's position of a batch, moved only forward.
const POSITIONS: &str =
    "INSERT INTO inbox_positions (consumer, topic, partition_id, next_offset, updated_at) \
     SELECT $1, $2, p, o, (extract(epoch from now()) * 1000000)::bigint \
     FROM unnest($3::int[], $4::bigint[]) AS t(p, o) \
     ON CONFLICT (consumer, topic, partition_id) DO UPDATE SET next_offset = EXCLUDED.next_offset, \
     updated_at = EXCLUDED.updated_at WHERE inbox_positions.next_offset <= EXCLUDED.next_offset";

#[derive(diesel::QueryableByName)]
struct Claimed {
    #[diesel(sql_type = Text)]
    message_id: String,
}

async fn hand_batch(
    consumer: StreamConsumer,
    pool: &Pool<AsyncPgConnection>,
    clock: &Clock,
    n: u64,
) -> Result<(), String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let mut handled = 0;
    while handled < n {
        let first = consumer.recv().await.map_err(|e| e.to_string())?;
        clock.start();
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(until, consumer.recv()).await {
                Ok(message) => batch.push(message.map_err(|e| e.to_string())?),
                Err(_) => break,
            }
        }
        let topic = batch[0].topic().to_owned();
        let mut ids = Vec::with_capacity(batch.len());
        let mut amounts = std::collections::HashMap::with_capacity(batch.len());
        let mut next: std::collections::BTreeMap<i32, i64> = Default::default();
        for message in &batch {
            let id = message
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "message-id"))
                .and_then(|h| h.value)
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(str::to_owned)
                .unwrap_or_else(|| {
                    format!(
                        "{}/{}/{}",
                        message.topic(),
                        message.partition(),
                        message.offset()
                    )
                });
            amounts.insert(id.clone(), amount(message.payload().unwrap_or_default()));
            ids.push(id);
            let at = next.entry(message.partition()).or_default();
            *at = (*at).max(message.offset() + 1);
        }
        let (partitions, offsets): (Vec<i32>, Vec<i64>) =
            next.iter().map(|(p, o)| (*p, *o)).unzip();
        conn.transaction(async |conn| {
            let claimed: Vec<Claimed> = diesel::sql_query(CLAIM_MANY)
                .bind::<Text, _>(CONSUMER)
                .bind::<Array<Text>, _>(&ids)
                .load(conn)
                .await?;
            let fresh: Vec<&str> = claimed.iter().map(|c| c.message_id.as_str()).collect();
            let sums = fresh.iter().map(|id| amounts[*id]).collect();
            insert_many(conn, fresh, sums).await?;
            diesel::sql_query(POSITIONS)
                .bind::<Text, _>(CONSUMER)
                .bind::<Text, _>(&topic)
                .bind::<Array<Integer>, _>(&partitions)
                .bind::<Array<BigInt>, _>(&offsets)
                .execute(conn)
                .await
                .map(drop)
        })
        .await
        .map_err(|e: diesel::result::Error| e.to_string())?;
        let mut list = TopicPartitionList::new();
        for (partition, offset) in &next {
            list.add_partition_offset(&topic, *partition, Offset::Offset(*offset))
                .map_err(|e| e.to_string())?;
        }
        consumer
            .commit(&list, CommitMode::Async)
            .map_err(|e| e.to_string())?;
        handled += batch.len() as u64;
        clock.done_many(batch.len() as u64, n);
    }
    Ok(())
}
