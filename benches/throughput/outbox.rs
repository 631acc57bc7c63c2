//! `--outbox`: the relay's msgs/s against a hand-written relay and the
//! broker alone, interleaved, and commit-to-delivery latency at a steady
//! rate with the relay in the same process.
//!
//! Each round fills the outbox with `--outbox-messages` messages (untimed;
//! one ordering key per message, so batches are full) and times, in a
//! rotating order:
//! - `relay`: `Relay::run_once` (batches of `--outbox-batch`, 100 by
//!   default) to RabbitMQ;
//! - `hand_relay`: a transaction per batch with the relay's own claim SQL
//!   (`FOR UPDATE SKIP LOCKED` where there is one), the batch published
//!   with lapin (mandatory, confirms), the rows deleted, commit;
//! - `broker`: the same messages published with confirms, no database.
//!
//! Then `--outbox-secs` of `#[idempotent]`-style calls at `--outbox-rate`
//! per second, each enqueueing one message, with a relay running
//! (`poll_interval` 1 s: the wake-up at the commit is what is measured)
//! and a consumer on the queue: the time from each call's return (its
//! commit) to the message's delivery, p50 and p99. Delivery comes after
//! the confirm, so this bounds commit-to-confirm from above.
//!
//! On PostgreSQL, with the CLI built (feature `cli`), the same latency with
//! the relay in another process (the CLI's `outbox relay`, 1 s poll),
//! before (`outbox::set_notify(false)`: it polls) and after (notified at
//! each commit); and the enqueue's cost of its NOTIFY: 4 threads of calls
//! enqueueing one message each, notify against quiet, interleaved rounds,
//! with no relay running and with the CLI's relay in another process (an
//! enqueue notifies only while a relay sleeps).
//!
//! With the feature `otel` (and no OpenTelemetry layer installed), every
//! backend: the same calls with the enqueue's capture of the trace context
//! on and off, interleaved rounds.

use crate::args::Args;
use crate::bench::{Bench, Target};
use crate::outbox_fill::{fill, median};
use crate::output::write_output;
use crate::run_id;
use diesel::connection::SimpleConnection;
use diesel_inbox::outbox::{self, Outgoing, Relay};
use diesel_inbox::Inbox;
use futures_lite::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const VARIANTS: [&str; 3] = ["relay", "hand_relay", "broker"];
/// With `--outbox-wal` (PostgreSQL): the WAL outbox's relay too.
const WAL_VARIANT: &str = "relay_wal";

pub fn run(targets: &[Target], args: &Args) -> Result<(), String> {
    let Some(amqp) = std::env::var("INBOX_TEST_AMQP_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        println!("SKIPPED: --outbox: INBOX_TEST_AMQP_URL is not set");
        return Ok(());
    };
    let mut results = Vec::new();
    for target in targets {
        (target.setup)(&target.url)?;
        results.push((target.outbox)(&target.url, args, &amqp)?);
        if target.name == "sqlite" {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", target.url));
            }
        }
    }
    let dir = write_output("outbox.json", &format!("[{}]\n", results.join(",\n")))?;
    println!("wrote {}/outbox.json", dir.display());
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Writes `n` messages for `destination` to the WAL outbox, one
/// transaction each (as business transactions would: the slot's reads
/// take whole transactions), a key of its own for each.
fn fill_wal<B: Bench>(conn: &mut B::Conn, n: usize, destination: &str) -> Result<(), String> {
    for i in 0..n {
        B::tx(conn, |conn| {
            outbox::enqueue(
                conn,
                Outgoing::new(destination, vec![7u8; 64]).ordering_key(&format!("k{i}")),
            )?;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Publishes `bodies` (id, routing key, payload) with confirms; every one
/// must be confirmed and routed.
async fn publish(
    channel: &lapin::Channel,
    messages: &[(String, String, Vec<u8>)],
) -> Result<(), String> {
    let mut confirms = Vec::with_capacity(messages.len());
    for (id, destination, payload) in messages {
        let properties = BasicProperties::default()
            .with_message_id(id.as_str().into())
            .with_delivery_mode(2);
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        confirms.push(
            channel
                .basic_publish(
                    "".into(),
                    destination.as_str().into(),
                    options,
                    payload,
                    properties,
                )
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    for confirm in confirms {
        match confirm.await.map_err(|e| e.to_string())? {
            lapin::Confirmation::Ack(None) => {}
            other => return Err(format!("not confirmed: {other:?}")),
        }
    }
    Ok(())
}

pub fn measure<B: Bench>(url: &str, args: &Args, amqp: &str) -> Result<String, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let queue = format!("bench-outbox-{}", run_id());
    let n = args.outbox_messages;
    let batch = args.outbox_batch;
    let connection = runtime
        .block_on(lapin::Connection::connect(
            amqp,
            lapin::ConnectionProperties::default(),
        ))
        .map_err(|e| format!("RabbitMQ: {e}"))?;
    let channel = runtime.block_on(async {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(channel)
    })?;
    // Every message goes to the benchmark's queue.
    let mut conn = B::open(url);
    let route = format!("UPDATE outbox_messages SET destination = '{queue}'");
    let pool = B::relay_pool(url, 4);
    let relay =
        Relay::new(pool.clone(), outbox::lapin::Publisher::connect(amqp, "")).batch_size(batch);
    let wal = args.outbox_wal && B::LABEL == "PostgreSQL";
    let mut variants = VARIANTS.to_vec();
    let wal_relay = wal.then(|| {
        Relay::new(pool.clone(), outbox::lapin::Publisher::connect(amqp, ""))
            .batch_size(batch)
            .wal(url)
    });
    if wal {
        outbox::wal::create(&mut conn).map_err(|e| format!("the WAL outbox's slot: {e}"))?;
        variants.push(WAL_VARIANT);
    }
    let mut samples: Vec<(&str, Vec<f64>)> = variants.iter().map(|v| (*v, Vec::new())).collect();
    for round in 0..args.rounds {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            let variant = variants[i];
            if variant == WAL_VARIANT {
                // The table emptied (the broker variant leaves its fill) and
                // the slot confirmed past the other variants' table writes
                // by a pass of the WAL relay (untimed, publishing nothing),
                // then the messages written to the WAL.
                conn.batch_execute("DELETE FROM outbox_messages")
                    .map_err(|e| e.to_string())?;
                let relay = wal_relay.as_ref().ok_or("no WAL relay")?;
                let idle = runtime
                    .block_on(relay.run_once())
                    .map_err(|e| e.to_string())?;
                if idle.published != 0 {
                    return Err(format!("the WAL relay's idle pass published {idle:?}"));
                }
                outbox::set_wal(true);
                let filled = fill_wal::<B>(&mut conn, n, &queue);
                outbox::set_wal(false);
                filled?;
            } else {
                fill::<B>(url, n, 0, "ignored")?;
                conn.batch_execute(&route).map_err(|e| e.to_string())?;
            }
            let began = Instant::now();
            match variant {
                WAL_VARIANT => {
                    let relay = wal_relay.as_ref().ok_or("no WAL relay")?;
                    let report = runtime
                        .block_on(relay.run_once())
                        .map_err(|e| e.to_string())?;
                    if report.published != n as u64 {
                        return Err(format!(
                            "the WAL relay published {} of {n}",
                            report.published
                        ));
                    }
                }
                "relay" => {
                    let report = runtime
                        .block_on(relay.run_once())
                        .map_err(|e| e.to_string())?;
                    if report.published != n as u64 {
                        return Err(format!("relay published {} of {n}", report.published));
                    }
                }
                "hand_relay" => {
                    let mut published = 0;
                    loop {
                        let rows = B::tx(&mut conn, |conn| {
                            let rows = B::hand_claim(conn, batch)?;
                            let messages: Vec<(String, String, Vec<u8>)> = rows
                                .iter()
                                .map(|r| (r.id.clone(), r.destination.clone(), r.payload.clone()))
                                .collect();
                            runtime
                                .block_on(publish(&channel, &messages))
                                .map_err(|e| diesel::result::Error::QueryBuilderError(e.into()))?;
                            let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
                            B::hand_delete(conn, &seqs)?;
                            Ok(rows.len())
                        })
                        .map_err(|e| e.to_string())?;
                        published += rows;
                        if rows < batch {
                            break;
                        }
                    }
                    if published != n {
                        return Err(format!("the hand relay published {published} of {n}"));
                    }
                }
                _ => {
                    let messages: Vec<(String, String, Vec<u8>)> = (0..n)
                        .map(|i| (format!("m{round}-{i}"), queue.clone(), vec![7u8; 64]))
                        .collect();
                    runtime.block_on(async {
                        for chunk in messages.chunks(batch) {
                            publish(&channel, chunk).await?;
                        }
                        Ok::<_, String>(())
                    })?;
                }
            }
            samples[i].1.push(n as f64 / began.elapsed().as_secs_f64());
            runtime
                .block_on(channel.queue_purge(queue.as_str().into(), QueuePurgeOptions::default()))
                .map_err(|e| e.to_string())?;
        }
    }
    // The broker's own speed swings from round to round (2 to 3 times on
    // the 2-core machine): the ratio of each round's adjacent samples,
    // then their median, is steadier than the ratio of the medians.
    let paired = |a: usize, b: usize| {
        let mut ratios: Vec<f64> = samples[a]
            .1
            .iter()
            .zip(&samples[b].1)
            .map(|(x, y)| x / y)
            .collect();
        median(&mut ratios)
    };
    let (over_hand, over_broker) = (paired(0, 1), paired(0, 2));
    if wal {
        let wal_rate = median(&mut samples[3].1.clone());
        println!(
            "{}: WAL outbox relay {wal_rate:.0} msg/s; relay_wal/broker {:.2}, relay_wal/relay {:.2} (medians of the rounds' ratios; {} rounds of {n})",
            B::LABEL,
            paired(3, 2),
            paired(3, 0),
            args.rounds
        );
        // The relay's stream ends with it; the server lets the slot go
        // a moment later.
        drop(wal_relay);
        let began = Instant::now();
        while let Err(e) = outbox::wal::remove(&mut conn) {
            if began.elapsed() > std::time::Duration::from_secs(10) {
                return Err(e.to_string());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let medians: Vec<(&str, f64)> = samples.iter_mut().map(|(v, s)| (*v, median(s))).collect();
    let rate = |v: &str| {
        medians
            .iter()
            .find(|(w, _)| *w == v)
            .map_or(0.0, |(_, r)| *r)
    };
    println!(
        "{}: relay {:.0} msg/s, hand_relay {:.0}, broker {:.0}; relay/hand_relay {:.2}, relay/broker {:.2} (medians of the rounds' ratios; of the medians {:.2} and {:.2}; {} rounds of {n})",
        B::LABEL,
        rate("relay"),
        rate("hand_relay"),
        rate("broker"),
        over_hand,
        over_broker,
        rate("relay") / rate("hand_relay"),
        rate("relay") / rate("broker"),
        args.rounds
    );
    let (p50, p99, achieved) = latency::<B>(
        &runtime,
        url,
        args,
        amqp,
        &queue,
        &channel,
        RelayAt::ThisProcess,
    )?;
    println!(
        "{}: commit to delivery at {achieved:.0} msg/s: p50 {:.1} ms, p99 {:.1} ms",
        B::LABEL,
        p50 * 1000.0,
        p99 * 1000.0
    );
    let over = crate::outbox_over::measure::<B>(&runtime, url, args)?;
    let horizon = match (B::HOLD_SNAPSHOT, args.outbox_horizon) {
        (Some(_), secs) if secs > 0 => {
            crate::horizon::measure::<B>(&runtime, url, args, &relay, &queue, &channel)?
        }
        _ => "null".into(),
    };
    let across = across_processes::<B>(&runtime, url, args, amqp, &queue, &channel)?
        .unwrap_or_else(|| "null".into());
    let notify = notify_cost::<B>(url, args, amqp, &queue)?.unwrap_or_else(|| "null".into());
    let trace = trace_cost::<B>(url, args)?.unwrap_or_else(|| "null".into());
    runtime.block_on(async {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    });
    let per_variant: Vec<String> = samples
        .iter()
        .map(|(v, s)| format!("\"{v}\": {s:?}"))
        .collect();
    Ok(format!(
        "{{\"backend\": \"{}\", \"messages\": {n}, \"batch\": {batch}, \"samples\": {{{}}}, \
         \"relay_over_hand_relay\": {:.3}, \"relay_over_broker\": {:.3}, \
         \"ratio_of_medians\": {{\"relay_over_hand_relay\": {:.3}, \"relay_over_broker\": {:.3}}}, \
         \"latency\": {{\"rate\": {achieved:.1}, \"p50_ms\": {:.2}, \"p99_ms\": {:.2}}}, \
         \"latency_other_process\": {across}, \"notify_cost\": {notify}, \"trace_cost\": {trace}, \
         \"horizon\": {horizon}, \"over\": {over}}}",
        B::NAME,
        per_variant.join(", "),
        over_hand,
        over_broker,
        rate("relay") / rate("hand_relay"),
        rate("relay") / rate("broker"),
        p50 * 1000.0,
        p99 * 1000.0
    ))
}

/// Calls at a steady rate, each enqueueing one message, with a relay and
/// a consumer running: commit-to-delivery p50 and p99 (seconds) and the
/// rate reached.
fn latency<B: Bench>(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    args: &Args,
    amqp: &str,
    queue: &str,
    channel: &lapin::Channel,
    at: RelayAt,
) -> Result<(f64, f64, f64), String> {
    B::open(url)
        .batch_execute("DELETE FROM outbox_messages")
        .map_err(|e| e.to_string())?;
    let total = args.outbox_rate * args.outbox_secs as usize;
    let committed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let relay = Relay::new(
        B::relay_pool(url, 2),
        outbox::lapin::Publisher::connect(amqp, ""),
    );
    // The relay in another process: the CLI's `outbox relay` (default
    // poll, 1 s), given time to open and check its LISTEN connection.
    let other = match at {
        RelayAt::ThisProcess => None,
        RelayAt::OtherProcess { notify, cli } => {
            outbox::set_notify(notify);
            let child = std::process::Command::new(cli)
                .env_remove("DATABASE_URL")
                .args(["--database-url", url, "outbox", "relay", "--amqp", amqp])
                .args(["--exchange", "", "--poll-interval", "1s"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("the CLI relay: {e}"))?;
            std::thread::sleep(Duration::from_secs(3));
            Some(OtherRelay(child))
        }
    };
    let pool = Arc::new(B::pool(url, 8));
    let queue = queue.to_string();
    runtime.block_on(async {
        let mut deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                "bench-latency".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let in_process = other.is_none();
        let relaying = async {
            if !in_process {
                let _ = stopped.await;
                return Ok(Default::default());
            }
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .map_err(|e| e.to_string())
        };
        let consuming = {
            let committed = committed.clone();
            async move {
                let mut latencies = Vec::with_capacity(total);
                let deadline = Instant::now() + Duration::from_secs(args.outbox_secs + 30);
                while latencies.len() < total && Instant::now() < deadline {
                    let next =
                        tokio::time::timeout(Duration::from_secs(5), deliveries.next()).await;
                    let Ok(Some(Ok(delivery))) = next else {
                        continue;
                    };
                    let arrived = Instant::now();
                    let id = delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|i| i.to_string())
                        .unwrap_or_default();
                    // The commit is recorded right after the call returns;
                    // a delivery seen first waits for it.
                    for _ in 0..1000 {
                        if let Some(at) = committed.lock().unwrap().get(&id) {
                            latencies.push(arrived.saturating_duration_since(*at).as_secs_f64());
                            break;
                        }
                        tokio::time::sleep(Duration::from_micros(100)).await;
                    }
                }
                let _ = stop.send(());
                latencies
            }
        };
        let producing = async {
            let began = Instant::now();
            let mut tick =
                tokio::time::interval(Duration::from_secs_f64(1.0 / args.outbox_rate as f64));
            let mut calls = Vec::with_capacity(total);
            for i in 0..total {
                tick.tick().await;
                let (pool, committed, queue) = (pool.clone(), committed.clone(), queue.clone());
                calls.push(tokio::spawn({
                    async move {
                        let mut conn = B::pooled(&pool).await?;
                        let key = format!("lat-{}-{i}", run_id());
                        let id = Inbox::consumer("bench-outbox-latency")
                            .retries(3)
                            .run_async(&mut *conn, &key, async |conn: &mut B::AsyncConn| {
                                outbox::enqueue_async(conn, Outgoing::new(queue.as_str(), "x"))
                                    .await
                            })
                            .await
                            .map_err(|e| e.to_string())?;
                        if let diesel_inbox::Processed::Applied(id) = id {
                            committed.lock().unwrap().insert(id, Instant::now());
                        }
                        Ok::<_, String>(())
                    }
                }));
            }
            for call in calls {
                call.await.map_err(|e| e.to_string())??;
            }
            Ok::<_, String>(total as f64 / began.elapsed().as_secs_f64())
        };
        let (relayed, mut latencies, achieved) = tokio::join!(relaying, consuming, producing);
        outbox::set_notify(true);
        drop(other);
        relayed?;
        let achieved = achieved?;
        if latencies.len() < total {
            return Err(format!("{} of {total} messages delivered", latencies.len()));
        }
        latencies.sort_by(f64::total_cmp);
        Ok((
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            achieved,
        ))
    })
}

/// Where `latency` runs the relay.
#[derive(Clone, Copy)]
enum RelayAt {
    ThisProcess,
    /// The CLI binary at `cli`, with enqueues that notify or not.
    OtherProcess {
        notify: bool,
        cli: &'static str,
    },
}

/// The CLI relay's process, stopped (SIGTERM) when dropped.
struct OtherRelay(std::process::Child);

impl Drop for OtherRelay {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// The relay in another process, before (it polls: enqueues do not
/// notify) and after (it is notified at each commit): commit-to-delivery
/// p50 and p99 at `--outbox-rate`. PostgreSQL only (the others poll), and
/// only with the CLI built (feature `cli`).
fn across_processes<B: Bench>(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    args: &Args,
    amqp: &str,
    queue: &str,
    channel: &lapin::Channel,
) -> Result<Option<String>, String> {
    let Some(cli) = option_env!("CARGO_BIN_EXE_diesel-inbox") else {
        println!(
            "{}: the relay in another process: SKIPPED (the CLI is not built: --features cli)",
            B::LABEL
        );
        return Ok(None);
    };
    if B::NAME != "postgres" {
        return Ok(None);
    }
    let mut figures = Vec::new();
    for (name, notify) in [("polling", false), ("notified", true)] {
        let at = RelayAt::OtherProcess { notify, cli };
        let (p50, p99, achieved) = latency::<B>(runtime, url, args, amqp, queue, channel, at)?;
        println!(
            "{}: commit to delivery, the relay in another process, {name}, at {achieved:.0} msg/s: p50 {:.1} ms, p99 {:.1} ms",
            B::LABEL,
            p50 * 1000.0,
            p99 * 1000.0
        );
        figures.push(format!(
            "\"{name}\": {{\"rate\": {achieved:.1}, \"p50_ms\": {:.2}, \"p99_ms\": {:.2}}}",
            p50 * 1000.0,
            p99 * 1000.0
        ));
    }
    Ok(Some(format!("{{{}}}", figures.join(", "))))
}

/// The enqueue's cost of its NOTIFY (PostgreSQL): [`switch_cost`] of
/// `outbox::set_notify`, with no relay running, then (with the CLI built)
/// with the CLI's relay running in another process and publishing the
/// messages: an enqueue notifies only while a relay sleeps.
fn notify_cost<B: Bench>(
    url: &str,
    args: &Args,
    amqp: &str,
    queue: &str,
) -> Result<Option<String>, String> {
    if B::NAME != "postgres" {
        return Ok(None);
    }
    let alone = switch_cost::<B>(url, args, "NOTIFY", outbox::set_notify, "bench.switch")?;
    let Some(cli) = option_env!("CARGO_BIN_EXE_diesel-inbox") else {
        return Ok(Some(format!("{{\"no_relay\": {alone}}}")));
    };
    // The messages of the rounds without a relay go nowhere. The relay
    // polls every 10 ms: without notifications it starts each round's
    // work as soon (a 1 s poll would leave the two cores to the enqueues
    // for most of a round, and measure the relay's share of them).
    B::open(url)
        .batch_execute("DELETE FROM outbox_messages")
        .map_err(|e| e.to_string())?;
    let child = std::process::Command::new(cli)
        .env_remove("DATABASE_URL")
        .args(["--database-url", url, "outbox", "relay", "--amqp", amqp])
        .args(["--exchange", "", "--poll-interval", "10ms"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("the CLI relay: {e}"))?;
    let relay = OtherRelay(child);
    std::thread::sleep(Duration::from_secs(3));
    let beside = switch_cost::<B>(
        url,
        args,
        "NOTIFY, a relay in another process",
        outbox::set_notify,
        queue,
    );
    drop(relay);
    Ok(Some(format!(
        "{{\"no_relay\": {alone}, \"relay_in_another_process\": {}}}",
        beside?
    )))
}

/// The enqueue's cost of capturing the trace context (feature `otel`, no
/// OpenTelemetry layer installed: what an application without an
/// exporter pays): [`switch_cost`] of the capture, on and off.
/// Also the capture alone, timed over a million calls in this thread.
#[cfg(feature = "otel")]
fn trace_cost<B: Bench>(url: &str, args: &Args) -> Result<Option<String>, String> {
    use diesel_inbox::__testing::otel;
    const CALLS: u32 = 1_000_000;
    let began = Instant::now();
    for _ in 0..CALLS {
        let mut headers = Vec::new();
        otel::capture(std::hint::black_box(&mut headers));
        std::hint::black_box(headers);
    }
    let ns = began.elapsed().as_nanos() as f64 / f64::from(CALLS);
    println!(
        "{}: the trace context's capture alone (no OpenTelemetry layer): {ns:.1} ns per enqueue",
        B::LABEL
    );
    let switched = switch_cost::<B>(
        url,
        args,
        "the trace context's capture",
        otel::set_capture,
        "bench.switch",
    )?;
    Ok(Some(format!(
        "{{\"capture_ns\": {ns:.1}, \"enqueue\": {switched}}}"
    )))
}

#[cfg(not(feature = "otel"))]
fn trace_cost<B: Bench>(_: &str, _: &Args) -> Result<Option<String>, String> {
    Ok(None)
}

/// What one switch of the enqueue costs: 4 threads of
/// `#[idempotent]`-style calls, each enqueueing one message, with
/// `set(true)` and `set(false)` in interleaved rounds; calls/s of each and
/// the median of the rounds' ratios (on over off). Leaves it on.
fn switch_cost<B: Bench>(
    url: &str,
    args: &Args,
    what: &str,
    set: fn(bool),
    destination: &str,
) -> Result<String, String> {
    const THREADS: usize = 4;
    let calls = (args.outbox_messages / THREADS).max(10);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
    for round in 0..args.rounds {
        for k in 0..2 {
            let i = (k + round) % 2;
            set(i == 0);
            B::open(url)
                .batch_execute("DELETE FROM outbox_messages")
                .map_err(|e| e.to_string())?;
            let began = Instant::now();
            let threads: Vec<_> = (0..THREADS)
                .map(|t| {
                    let url = url.to_string();
                    let run = run_id();
                    let destination = destination.to_string();
                    std::thread::spawn(move || {
                        let mut conn = B::open(&url);
                        for c in 0..calls {
                            let key = format!("switch-{run}-{round}-{i}-{t}-{c}");
                            let _applied = Inbox::consumer("bench-outbox-switch")
                                .run(&mut conn, &key, |conn| {
                                    outbox::enqueue(conn, Outgoing::new(destination.as_str(), "x"))
                                        .map_err(diesel::result::Error::from)
                                })
                                .map_err(|e| e.to_string())?;
                        }
                        Ok::<_, String>(())
                    })
                })
                .collect();
            for thread in threads {
                thread
                    .join()
                    .map_err(|_| "a thread panicked".to_string())??;
            }
            samples[i].push((calls * THREADS) as f64 / began.elapsed().as_secs_f64());
        }
    }
    set(true);
    let mut ratios: Vec<f64> = samples[0]
        .iter()
        .zip(&samples[1])
        .map(|(a, b)| a / b)
        .collect();
    let ratio = median(&mut ratios);
    let (on, off) = (
        median(&mut samples[0].clone()),
        median(&mut samples[1].clone()),
    );
    println!(
        "{}: enqueue with {what} {on:.0} calls/s, without {off:.0} ({THREADS} threads); on/off {ratio:.3} (median of {} rounds' ratios)",
        B::LABEL,
        args.rounds
    );
    Ok(format!(
        "{{\"threads\": {THREADS}, \"on_calls_per_sec\": {on:.1}, \"off_calls_per_sec\": {off:.1}, \"on_over_off\": {ratio:.3}}}"
    ))
}
