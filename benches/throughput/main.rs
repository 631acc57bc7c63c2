//! Messages per second: the inbox against the same business write without
//! it, against the same inbox logic hand-written, and against the usual
//! "SELECT, then INSERT" approach.
//!
//! ```text
//! cargo bench --bench throughput --all-features -- [--backend sqlite|postgres|mysql|all]
//!     [--threads 1,4] [--tasks 4,16] [--mode all] [--messages 2000] [--min-secs 2]
//!     [--rounds 9] [--batch 100] [--variants idempotent,batch,...] [--smoke]
//!     [--scale [--scale-rows 0,1000000,10000000]]
//!     [--purge [--purge-rows 1000000] [--purge-batch 10000] [--purge-pause-ms 0]]
//!     [--memory]
//!     [--outbox [--outbox-messages 5000] [--outbox-rate 1000] [--outbox-secs 10]]
//!     [--http [--http-conns 16] [--http-storms 20]]
//!     [--kafka [--kafka-messages 3000]] [--sqs [--sqs-messages 300]]
//!     [--brokers [--broker-messages 5000]]
//!     [--console [--console-rows 10000000] [--console-loads 20]]
//! ```
//!
//! Variants run interleaved, and the sync variants' order rotates each
//! round (A B C, B C A, C A B, …); each reports its median and interquartile
//! range over the rounds. A sync sample runs at least `--min-secs` (an
//! untimed calibration run of `--messages` sets each variant's count). Server URLs come from `INBOX_TEST_POSTGRES_URL` and
//! `INBOX_TEST_MYSQL_URL`; SQLite uses a temporary file (WAL,
//! `synchronous = NORMAL`). Results go to `target/inbox-bench/results.json`
//! and `target/inbox-bench/throughput.svg`. `--smoke` runs tiny counts so CI
//! keeps the program working; real figures come from a full run.
//! `--scale` (PostgreSQL, MySQL/MariaDB; instead of the variants) measures
//! `idempotent` with the inbox already holding each of `--scale-rows` rows
//! of random UUIDv4 keys, one schema or database per size, the sizes
//! interleaved; it writes `scale.json` and `scale.svg`.
//! `--memory` runs `examples/quickstart.rs` and `examples/async_consumer.rs`
//! in this process at their own message counts and at ten times them, and
//! reports the peak RSS (`VmHWM`, reset before each run) against the RSS
//! before it; it writes `memory.json`.
//! `--purge` (PostgreSQL, MySQL/MariaDB) measures handler latency while
//! `purge` deletes `--purge-rows` old rows, against windows without a purge,
//! interleaved, and the purge's rows/s.
//! `--outbox` (needs `INBOX_TEST_AMQP_URL`) measures the outbox relay on
//! each backend: msgs/s of `Relay::run_once` against a hand-written relay
//! (the same claim SQL, lapin with confirms, the same batch size) and
//! against publishing the same messages with confirms and no database,
//! interleaved; then commit-to-delivery latency at a steady rate with a
//! relay in the same process; it writes `outbox.json`.
//! `--http` (PostgreSQL, feature `axum`) serves an axum application in
//! this process and loads it over `--http-conns` keep-alive connections
//! (reqwest): requests/s of `POST /idempotent` (`Idempotent::run_async`,
//! a new key per request) against `POST /plain` (the same insert in a
//! diesel-async transaction, no inbox) and against replays of applied
//! keys, interleaved; then `--http-storms` storms of 100 concurrent
//! requests with one new key and as many of 100 retries of it committed:
//! each kind's replay latency p50/p99; it writes
//! `http.json`.
//! `--sqs` (PostgreSQL and `INBOX_TEST_SQS_URL`, feature `sqs`): messages/s
//! of `diesel_inbox::sqs::Consumer` against a hand-written aws-sdk-sqs loop
//! doing the same inbox and business rows, and moto's own ceiling; it
//! writes `sqs.json`.
//!
//! `--kafka` (PostgreSQL and `INBOX_TEST_KAFKA_BROKERS`, feature `kafka`):
//! messages/s of `diesel_inbox::kafka::Consumer` against a hand-written
//! rdkafka consumer doing the same inbox row, business row and position
//! write in one transaction, and against an at-least-once consumer with no
//! database, interleaved; and `run_batch` against a hand-written batched
//! rdkafka consumer; it writes `kafka.json`.
//! `--brokers` (PostgreSQL, `INBOX_TEST_AMQP_URL` and/or
//! `INBOX_TEST_NATS_URL`): messages/s of the RabbitMQ and NATS runners'
//! `run_batch` against their `run` with `in_flight(8)`, interleaved; it
//! writes `brokers.json`.
//!
//! `--console` (PostgreSQL, feature `console`): the operations console's
//! overview over `--console-rows` inbox rows and a tenth as many outbox
//! rows: `--console-loads` loads over TCP, p50/p95; it writes
//! `console.json`.
//!
//! The program's modules: [`args`] (the command line), [`backends`] (each
//! database behind the `Bench` trait), [`variants`] (the handlers and one
//! sample), [`output`] (print, JSON, SVG), and the modes [`scale`],
//! [`purge`] and [`memory`].

// Without a server backend, `--scale` and `--purge` (generic over
// `backends::Server`) have no target to run on: their code is unused.
#![cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]

mod args;
mod backends;
mod bench;
#[cfg(all(
    feature = "async",
    feature = "postgres",
    any(feature = "lapin", feature = "nats")
))]
mod brokers;
#[cfg(all(feature = "console", feature = "postgres"))]
mod console;
#[cfg(all(
    feature = "postgres",
    any(
        feature = "kafka",
        feature = "sqs",
        all(feature = "async", any(feature = "lapin", feature = "nats"))
    )
))]
mod consume;
#[cfg(all(feature = "async", feature = "lapin"))]
mod horizon;
#[cfg(all(feature = "axum", feature = "postgres"))]
mod http;
#[cfg(all(feature = "kafka", feature = "postgres"))]
mod kafka;
mod memory;
#[cfg(all(feature = "async", feature = "lapin"))]
mod outbox;
#[cfg(all(feature = "async", feature = "lapin"))]
mod outbox_fill;
#[cfg(all(feature = "async", feature = "lapin"))]
mod outbox_over;
mod output;
mod purge;
mod scale;
#[cfg(all(
    feature = "postgres",
    any(
        feature = "kafka",
        all(feature = "async", any(feature = "lapin", feature = "nats"))
    )
))]
mod settle;
#[cfg(all(feature = "sqs", feature = "postgres"))]
mod sqs;
mod targets;
#[cfg(all(feature = "relay", feature = "postgres"))]
mod tenants;
mod variants;

use args::redelivers;
use args::Args;
use args::VARIANTS;
use bench::{Cell, Target};
use output::{draw_svg, print_cell, provenance, to_json, write_output};
#[cfg(feature = "async")]
use variants::ASYNC_VARIANTS;

diesel::table! {
    bench_orders (id) {
        id -> Text,
        amount -> BigInt,
    }
}

const ORDERS_DDL: &str =
    "CREATE TABLE IF NOT EXISTS bench_orders (id VARCHAR(255) NOT NULL PRIMARY KEY, amount BIGINT NOT NULL)";

#[derive(Clone)]
pub struct Order {
    pub id: String,
    pub amount: i64,
}

/// A name unique to this process and moment, for keys and databases.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("b{}x{nanos:x}", std::process::id())
}

fn main() {
    let args = match args::parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("benchmark failed: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let targets = targets::targets(args);
    if targets.is_empty() {
        return Err("no backend to measure (features and URLs)".into());
    }
    if args.purge {
        return purge::run(&targets, args);
    }
    if args.scale {
        return scale::run(&targets, args);
    }
    if args.memory {
        return memory::run(&targets, args);
    }
    if args.kafka {
        #[cfg(all(feature = "kafka", feature = "postgres"))]
        return kafka::run(args);
        #[cfg(not(all(feature = "kafka", feature = "postgres")))]
        return Err("--kafka needs the kafka and postgres features".into());
    }
    if args.sqs {
        #[cfg(all(feature = "sqs", feature = "postgres"))]
        return sqs::run(args);
        #[cfg(not(all(feature = "sqs", feature = "postgres")))]
        return Err("--sqs needs the sqs and postgres features".into());
    }
    if args.console {
        #[cfg(all(feature = "console", feature = "postgres"))]
        return console::run(args);
        #[cfg(not(all(feature = "console", feature = "postgres")))]
        return Err("--console needs the console and postgres features".into());
    }
    if args.brokers {
        #[cfg(all(
            feature = "async",
            feature = "postgres",
            any(feature = "lapin", feature = "nats")
        ))]
        return brokers::run(args);
        #[cfg(not(all(
            feature = "async",
            feature = "postgres",
            any(feature = "lapin", feature = "nats")
        )))]
        return Err("--brokers needs the postgres feature and lapin or nats".into());
    }
    if args.tenants {
        #[cfg(all(feature = "relay", feature = "postgres"))]
        return tenants::run(args);
        #[cfg(not(all(feature = "relay", feature = "postgres")))]
        return Err("--tenants needs the relay and postgres features".into());
    }
    if args.http {
        #[cfg(all(feature = "axum", feature = "postgres"))]
        return http::run(args);
        #[cfg(not(all(feature = "axum", feature = "postgres")))]
        return Err("--http needs the axum and postgres features".into());
    }
    #[cfg(all(feature = "async", feature = "lapin"))]
    if args.outbox {
        return outbox::run(&targets, args);
    }
    let mut cells = Vec::new();
    for target in &targets {
        (target.setup)(&target.url)?;
        let sync_threads: &[usize] = if args.mode == "async" {
            &[]
        } else {
            &args.threads
        };
        for &threads in sync_threads {
            let variants: Vec<&'static str> = VARIANTS
                .iter()
                .copied()
                .filter(|v| args.variants.is_empty() || args.variants.iter().any(|w| w == v))
                .collect();
            let mut cell = Cell {
                backend: target.name,
                label: target.label,
                mode: "sync",
                threads,
                samples: variants.iter().map(|v| (*v, Vec::new())).collect(),
            };
            let counts = calibrate(target, threads, &variants, args)?;
            // `duplicate` (and `fingerprinted_duplicate`) redeliver keys
            // applied once, untimed, here.
            let duplicates = format!("{}d{threads}", run_id());
            for (d, first) in variants
                .iter()
                .enumerate()
                .filter_map(|(d, v)| Some((d, redelivers(v)?)))
            {
                (target.measure)(
                    &target.url,
                    first,
                    threads,
                    counts[d],
                    args.batch,
                    &duplicates,
                )?;
            }
            for round in 0..args.rounds {
                let prefix = format!("{}r{round}t{threads}", run_id());
                // The order rotates: each variant runs first in some round.
                for k in 0..variants.len() {
                    let i = (k + round) % variants.len();
                    let variant = variants[i];
                    let keys = if redelivers(variant).is_some() {
                        &duplicates
                    } else {
                        &prefix
                    };
                    let mps = (target.measure)(
                        &target.url,
                        variant,
                        threads,
                        counts[i],
                        args.batch,
                        keys,
                    )?;
                    cell.samples[i].1.push(mps);
                }
            }
            print_cell(target.label, &cell, args);
            cells.push(cell);
        }
        #[cfg(feature = "async")]
        let async_tasks: &[usize] = if args.mode == "sync" {
            &[]
        } else {
            &args.tasks
        };
        #[cfg(feature = "async")]
        for &tasks in async_tasks {
            let (measure, has) = target.measure_async;
            let variants: Vec<&'static str> =
                ASYNC_VARIANTS.iter().copied().filter(|v| has(v)).collect();
            let mut cell = Cell {
                backend: target.name,
                label: target.label,
                mode: "async",
                threads: tasks,
                samples: variants.iter().map(|v| (*v, Vec::new())).collect(),
            };
            for round in 0..args.rounds {
                let prefix = format!("{}r{round}a{tasks}", run_id());
                // The order rotates as the sync variants' does; `duplicate`
                // redelivers this round's `idempotent` keys, so it runs
                // right after it.
                for k in 0..variants.len() {
                    let i = (k + round) % variants.len();
                    let variant = variants[i];
                    if variant == "async_duplicate" {
                        continue;
                    }
                    let mps = measure(&target.url, variant, tasks, args.messages, &prefix)?;
                    cell.samples[i].1.push(mps);
                    if variant == "async_idempotent" {
                        if let Some(d) = variants.iter().position(|v| *v == "async_duplicate") {
                            let mps = measure(
                                &target.url,
                                "async_duplicate",
                                tasks,
                                args.messages,
                                &prefix,
                            )?;
                            cell.samples[d].1.push(mps);
                        }
                    }
                }
            }
            print_cell(target.label, &cell, args);
            cells.push(cell);
        }
        if target.name == "sqlite" {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", target.url));
            }
        }
    }
    let dir = write_output(
        "results.json",
        &to_json(&cells, args, &provenance(&targets)),
    )?;
    draw_svg(&dir.join("throughput.svg"), &cells).map_err(|e| format!("svg: {e}"))?;
    println!("wrote {}/results.json and throughput.svg", dir.display());
    Ok(())
}

/// Messages per sample of each variant, so that a sample runs at least
/// `--min-secs`: one untimed run of `--messages` gives each variant's rate
/// (it also warms the statement caches).
fn calibrate(
    target: &Target,
    threads: usize,
    variants: &[&'static str],
    args: &Args,
) -> Result<Vec<usize>, String> {
    let prefix = format!("{}c{threads}", run_id());
    let unit = threads * args.batch;
    let mut counts = Vec::with_capacity(variants.len());
    for &variant in variants {
        // `duplicate` redelivers the keys `idempotent` applied just before.
        let rate = (target.measure)(
            &target.url,
            variant,
            threads,
            args.messages,
            args.batch,
            &prefix,
        )?;
        // Whole batches on every thread.
        counts.push(sample_size(rate, args, unit));
    }
    Ok(counts)
}

/// Messages per sample at `rate` messages/s so that a sample lasts at
/// least `--min-secs` (10% to spare), no fewer than `--messages`, rounded
/// up to a multiple of `unit`.
fn sample_size(rate: f64, args: &Args, unit: usize) -> usize {
    let wanted = (rate * args.min_secs * 1.1).ceil() as usize;
    wanted.max(args.messages).div_ceil(unit) * unit
}

// The examples themselves, run by `--memory` (their `main`s stay unused).
#[allow(dead_code)]
#[path = "../../examples/quickstart.rs"]
mod quickstart;

#[cfg(feature = "async")]
#[allow(dead_code)]
#[path = "../../examples/async_consumer.rs"]
mod async_consumer;
