//! `--sqs`: the SQS runner on PostgreSQL, against the SQS server at
//! `INBOX_TEST_SQS_URL` (moto's, `scripts/sqs.sh start`: not SQS, and slow
//! on long queues, so its figures say nothing of AWS's).
//!
//! Each variant consumes `--sqs-messages` messages sent beforehand to a
//! queue of its own (the id in the `message-id` attribute); its rate is the
//! messages after the first over the time from the first message's start
//! to the last one's end. The variants run interleaved, their order
//! rotating each round; each reports its median over `--rounds`:
//! - `runner`: `diesel_inbox::sqs::Consumer` with `in_flight(1)` (it then
//!   receives one message at a time), an `Inbox::run_async` handler
//!   inserting the business row;
//! - `runner8`: the same with `in_flight(8)` (the default);
//! - `runner10`: the same with `in_flight(10)`: a whole receive's worth
//!   prefetched, as the hand-written loop receives;
//! - `hand`: a hand-written aws-sdk-sqs loop: receive up to 10, then for
//!   each message one transaction (the inbox row `ON CONFLICT DO NOTHING`,
//!   the business row), then one `DeleteMessageBatch` for the ten;
//! - `floor`: moto's ceiling: receive 10, delete them, no database.

use crate::args::Args;
use crate::consume::Clock;
use crate::output::write_output;
use crate::run_id;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, SendMessageBatchRequestEntry,
};
use diesel::sql_types::{BigInt, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use diesel_inbox::brokers::Policy;
use diesel_inbox::InboxError;
use std::time::Duration;

const VARIANTS: [&str; 5] = ["runner", "runner8", "runner10", "hand", "floor"];
const CONSUMER: &str = "bench-sqs";
const INSERT: &str = "INSERT INTO bench_sqs (id, amount) VALUES ($1, $2)";
const CLAIM: &str =
    "INSERT INTO inbox_messages (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING";

pub fn run(args: &Args) -> Result<(), String> {
    let url = std::env::var("INBOX_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or("--sqs: INBOX_TEST_POSTGRES_URL is not set")?;
    let endpoint = std::env::var("INBOX_TEST_SQS_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or("--sqs: INBOX_TEST_SQS_URL is not set (scripts/sqs.sh start)")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(measure(args, url, endpoint))
}

fn client(endpoint: &str) -> aws_sdk_sqs::Client {
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("bench", "bench", None, None, "bench"))
        .endpoint_url(endpoint)
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

async fn measure(args: &Args, url: String, endpoint: String) -> Result<(), String> {
    let pool = crate::consume::pool(url, "bench_sqs").await?;
    let client = client(&endpoint);
    let run = run_id();
    let n = args.sqs_messages as u64;
    let mut samples: Vec<(&str, Vec<f64>)> = VARIANTS.iter().map(|v| (*v, Vec::new())).collect();
    for round in 0..args.rounds {
        for i in 0..VARIANTS.len() {
            let variant = VARIANTS[(i + round) % VARIANTS.len()];
            let queue = format!("bench-{run}-{variant}-{round}");
            let queue_url = fill(&client, &queue, n).await?;
            let clock = Clock::default();
            match variant {
                "runner" => runner(&client, &queue_url, &pool, &clock, n, 1).await?,
                "runner8" => runner(&client, &queue_url, &pool, &clock, n, 8).await?,
                "runner10" => runner(&client, &queue_url, &pool, &clock, n, 10).await?,
                "hand" => hand(&client, &queue_url, &pool, &clock, n).await?,
                _ => floor(&client, &queue_url, &clock, n).await?,
            }
            let _ = client.delete_queue().queue_url(&queue_url).send().await;
            samples
                .iter_mut()
                .find(|(v, _)| *v == variant)
                .expect("a variant")
                .1
                .push(clock.rate(n)?);
        }
    }
    let median = |v: &str| {
        let mut s = samples
            .iter()
            .find(|(n, _)| *n == v)
            .map(|(_, s)| s.clone())
            .unwrap_or_default();
        s.sort_by(f64::total_cmp);
        s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (runner, runner8, runner10, hand, floor) = (
        median("runner"),
        median("runner8"),
        median("runner10"),
        median("hand"),
        median("floor"),
    );
    println!(
        "sqs (moto, not SQS) postgres, {n} messages x {} rounds: runner in_flight 8 {runner8:.0}/s, hand-written (receive 10, a transaction each, delete batched) {hand:.0}/s (runner8/hand {:.2}), runner in_flight 10 {runner10:.0}/s (runner10/hand {:.2}), runner in_flight 1 {runner:.0}/s (runner/hand {:.2}), moto's ceiling (receive, delete, no database) {floor:.0}/s (runner8/ceiling {:.2})",
        args.rounds,
        runner8 / hand,
        runner10 / hand,
        runner / hand,
        runner8 / floor
    );
    let json = format!(
        "{{\"backend\":\"postgres\",\"server\":\"moto\",\"messages\":{n},\"rounds\":{},\"runner\":{runner:.1},\"runner8\":{runner8:.1},\"runner10\":{runner10:.1},\"hand\":{hand:.1},\"floor\":{floor:.1},\"runner8_over_hand\":{:.3},\"runner10_over_hand\":{:.3},\"runner_over_hand\":{:.3},\"runner8_over_floor\":{:.3}}}\n",
        args.rounds,
        runner8 / hand,
        runner10 / hand,
        runner / hand,
        runner8 / floor
    );
    let dir = write_output("sqs.json", &json)?;
    println!("wrote {}", dir.join("sqs.json").display());
    Ok(())
}

/// Creates `queue` and sends it `n` messages (ids in `message-id`): its URL.
async fn fill(client: &aws_sdk_sqs::Client, queue: &str, n: u64) -> Result<String, String> {
    let url = client
        .create_queue()
        .queue_name(queue)
        .send()
        .await
        .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?
        .queue_url()
        .unwrap_or_default()
        .to_owned();
    let ids: Vec<u64> = (0..n).collect();
    for chunk in ids.chunks(10) {
        let entries = chunk
            .iter()
            .map(|i| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(i.to_string())
                    .message_attributes(
                        "message-id",
                        MessageAttributeValue::builder()
                            .data_type("String")
                            .string_value(format!("{queue}-{i}"))
                            .build()
                            .map_err(|e| e.to_string())?,
                    )
                    .build()
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, String>>()?;
        client
            .send_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
    }
    Ok(url)
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
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
    pool: &Pool<AsyncPgConnection>,
    clock: &Clock,
    n: u64,
    in_flight: usize,
) -> Result<(), String> {
    let report = diesel_inbox::sqs::Consumer::new(
        client.clone(),
        queue_url,
        Policy::new(|_: &InboxError| false),
    )
    .id_attribute("message-id")
    .wait_time(Duration::from_secs(1))
    .in_flight(in_flight)
    .shutdown_deadline(Duration::from_secs(10))
    .run(
        async |id: &str, body: &[u8]| {
            crate::consume::apply(pool, clock, n, (CONSUMER, "bench_sqs"), id, body).await
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

/// Receives up to ten messages: (id attribute, body, receipt) of each.
async fn receive(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
) -> Result<Vec<(String, String, String)>, String> {
    let answer = client
        .receive_message()
        .queue_url(queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .message_attribute_names("message-id")
        .send()
        .await
        .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
    Ok(answer
        .messages()
        .iter()
        .map(|m| {
            let id = m
                .message_attributes()
                .and_then(|a| a.get("message-id"))
                .and_then(|v| v.string_value())
                .unwrap_or_default()
                .to_owned();
            (
                id,
                m.body().unwrap_or_default().to_owned(),
                m.receipt_handle().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

async fn delete(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
    receipts: &[String],
) -> Result<(), String> {
    let entries = receipts
        .iter()
        .enumerate()
        .map(|(i, r)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(r)
                .build()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    client
        .delete_message_batch()
        .queue_url(queue_url)
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
    Ok(())
}

async fn hand(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
    pool: &Pool<AsyncPgConnection>,
    clock: &Clock,
    n: u64,
) -> Result<(), String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let mut handled = 0;
    while handled < n {
        let messages = receive(client, queue_url).await?;
        let mut receipts = Vec::with_capacity(messages.len());
        for (id, body, receipt) in messages {
            clock.start();
            let amount: i64 = body.parse().unwrap_or_default();
            conn.transaction(async |conn| {
                let claimed = diesel::sql_query(CLAIM)
                    .bind::<Text, _>(CONSUMER)
                    .bind::<Text, _>(&id)
                    .execute(conn)
                    .await?;
                if claimed == 1 {
                    insert(conn, &id, amount).await?;
                }
                Ok(())
            })
            .await
            .map_err(|e: diesel::result::Error| e.to_string())?;
            receipts.push(receipt);
        }
        if !receipts.is_empty() {
            delete(client, queue_url, &receipts).await?;
            handled += receipts.len() as u64;
            clock.done_many(receipts.len() as u64, n);
        }
    }
    Ok(())
}

async fn floor(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
    clock: &Clock,
    n: u64,
) -> Result<(), String> {
    let mut handled = 0;
    while handled < n {
        let messages = receive(client, queue_url).await?;
        if messages.is_empty() {
            continue;
        }
        clock.start();
        let receipts: Vec<String> = messages.into_iter().map(|(_, _, r)| r).collect();
        delete(client, queue_url, &receipts).await?;
        handled += receipts.len() as u64;
        clock.done_many(receipts.len() as u64, n);
    }
    Ok(())
}
