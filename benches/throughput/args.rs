//! The command line: `cargo bench --bench throughput -- --help`.

use clap::Parser;

/// What `--smoke` sets unless given: tiny counts, so that CI keeps each
/// mode working; real figures come from a full run.
#[derive(Parser)]
#[command(
    name = "throughput",
    about = "Messages per second of the inbox against plain diesel, hand-written SQL and SELECT-then-INSERT"
)]
struct Cli {
    /// sqlite, postgres, mysql or all (comma-separated).
    #[arg(long = "backend", value_delimiter = ',', default_value = "all",
          value_parser = ["sqlite", "postgres", "mysql", "all"])]
    backends: Vec<String>,
    /// Threads of the sync variants, a connection each [default: 1,4; smoke 1,2].
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Concurrent tasks of the async variants, over a pool [default: 4,16; smoke 4].
    #[arg(long, value_delimiter = ',')]
    tasks: Option<Vec<usize>>,
    /// Which handlers to measure.
    #[arg(long, default_value = "all", value_parser = ["sync", "async", "all"])]
    mode: String,
    /// Messages of the calibration run, and of each async sample [default: 2000; smoke 40].
    #[arg(long)]
    messages: Option<usize>,
    /// The shortest sync sample, in seconds [default: 2; smoke 0].
    #[arg(long)]
    min_secs: Option<f64>,
    /// Interleaved rounds; each variant's median is over them [default: 9; smoke 1].
    #[arg(long)]
    rounds: Option<usize>,
    /// Messages per batch of the batch variants [default: 100; smoke 10].
    #[arg(long)]
    batch: Option<usize>,
    /// The sync variants to run (all when not given).
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Tiny counts: checks that each mode works, not how fast.
    #[arg(long)]
    smoke: bool,
    /// `idempotent` with the inbox already holding --scale-rows rows (PostgreSQL, MySQL/MariaDB).
    #[arg(long)]
    scale: bool,
    /// The inbox sizes of --scale [default: 0,1000000,10000000; smoke 0,1000].
    #[arg(long, value_delimiter = ',')]
    scale_rows: Option<Vec<i64>>,
    /// Peak RSS of the quickstart and async_consumer examples at 1× and 10× their messages.
    #[arg(long)]
    memory: bool,
    /// Handler latency while a purge deletes old rows, against windows without one.
    #[arg(long)]
    purge: bool,
    /// Old rows the purge benchmark fills the inbox with [default: 1000000; smoke 2000].
    #[arg(long)]
    purge_rows: Option<usize>,
    /// Rows per purge batch.
    #[arg(long, default_value_t = 10_000)]
    purge_batch: usize,
    /// Pause after each purge batch, in milliseconds.
    #[arg(long, default_value_t = 0)]
    purge_pause_ms: usize,
    /// The purge's duty cycle: a pause of this many times each batch's
    /// duration (the library's default, `Purge::sleep_coef`'s docs).
    #[arg(long, default_value_t = 6.0)]
    purge_sleep_coef: f64,
    /// The outbox relay: msgs/s against a hand-written relay and the
    /// broker alone, and commit-to-delivery latency at a steady rate
    /// (needs INBOX_TEST_AMQP_URL).
    #[arg(long)]
    outbox: bool,
    /// Messages per relay sample [default: 5000; smoke 100].
    #[arg(long)]
    outbox_messages: Option<usize>,
    /// The latency run's rate, messages/s [default: 1000; smoke 100].
    #[arg(long)]
    outbox_rate: Option<usize>,
    /// The relay's batch size, and the broker-alone variant's publish
    /// window [default: 100].
    #[arg(long, default_value_t = 100)]
    outbox_batch: usize,
    /// With `--outbox`: the same rounds of the relay against the broker
    /// alone over these brokers too (`nats`, `kafka`; comma-separated).
    #[arg(long, value_delimiter = ',')]
    outbox_over: Vec<String>,
    /// With `--outbox-over`: relays sharing the outbox [default: 1].
    #[arg(long, default_value_t = 1)]
    outbox_relays: usize,
    /// PostgreSQL: the WAL outbox's relay (`Relay::wal`, enqueues with
    /// `outbox::set_wal`) in the same rounds (needs `wal_level = logical`).
    #[arg(long)]
    outbox_wal: bool,
    /// PostgreSQL: also the relay's rate before, during and after a
    /// transaction held open this many seconds (and so the vacuum
    /// horizon), while at least 50,000 messages flow [default: 0, not run].
    #[arg(long, default_value_t = 0)]
    outbox_horizon: u64,
    /// The ordering keys the `--outbox-horizon` run's messages are spread
    /// over [default: 0, a key of its own for each message].
    #[arg(long, default_value_t = 0)]
    outbox_keys: usize,
    /// The latency run's length, seconds [default: 10; smoke 1].
    #[arg(long)]
    outbox_secs: Option<u64>,
    /// PostgreSQL: one relay over a database per tenant against one relay
    /// over one database (`--outbox-messages` in all), and a trickle's
    /// latency beside a backlog (needs INBOX_TEST_POSTGRES_URL).
    #[arg(long)]
    tenants: bool,
    /// With `--tenants`: the tenant databases [default: 100; smoke 4].
    #[arg(long)]
    tenants_count: Option<usize>,
    /// With `--tenants`: the backlog beside the trickle [default: 100000;
    /// smoke 2000].
    #[arg(long)]
    tenants_backlog: Option<usize>,
    /// With `--tenants`: the tenants configured for the connections run
    /// [default: 1000; smoke 20].
    #[arg(long)]
    tenants_configured: Option<usize>,
    /// With `--tenants`: of them, the tenants enqueueing [default: 50;
    /// smoke 5].
    #[arg(long)]
    tenants_active: Option<usize>,
    /// The HTTP front door (PostgreSQL): requests/s of an idempotent axum
    /// endpoint against the same endpoint without the inbox, replays, and
    /// the latency of a storm of concurrent retries of one key.
    #[arg(long)]
    http: bool,
    /// Concurrent keep-alive connections of the HTTP load [default: 16; smoke 4].
    #[arg(long)]
    http_conns: Option<usize>,
    /// Storms of 100 concurrent requests with a new key, each followed by
    /// one of 100 retries of that key committed [default: 20; smoke 1].
    #[arg(long)]
    http_storms: Option<usize>,
    /// Kafka (PostgreSQL, INBOX_TEST_KAFKA_BROKERS): messages/s of the
    /// runner against a hand-written consumer doing the same inbox and
    /// offset writes, and against an at-least-once consumer with no
    /// database.
    #[arg(long)]
    kafka: bool,
    /// Messages per variant and round of `--kafka` [default: 3000; smoke 30].
    #[arg(long)]
    kafka_messages: Option<usize>,
    /// The variants `--kafka` runs, comma-separated (default: all of
    /// runner, runner8, hand, batch, handbatch, floor); the ratios of the
    /// missing ones print as NaN.
    #[arg(long, value_delimiter = ',')]
    kafka_variants: Vec<String>,
    /// SQS (PostgreSQL, INBOX_TEST_SQS_URL: moto's server, which is not
    /// SQS): messages/s of the runner against a hand-written aws-sdk-sqs
    /// loop (receive 10, one transaction per message, delete batched), and
    /// moto's own ceiling (receive and delete, no database).
    #[arg(long)]
    sqs: bool,
    /// Messages per variant and round of `--sqs` [default: 300; smoke 20].
    #[arg(long)]
    sqs_messages: Option<usize>,
    /// The operations console (PostgreSQL, feature `console`): the
    /// overview's latency over a large inbox and outbox.
    #[arg(long)]
    console: bool,
    /// Inbox rows of `--console` (the outbox gets a tenth) [default:
    /// 10000000; smoke 10000].
    #[arg(long)]
    console_rows: Option<u64>,
    /// Timed loads of the overview [default: 20; smoke 3].
    #[arg(long)]
    console_loads: Option<usize>,
    /// Inbox rows of `--console` received in the last 30 minutes, besides
    /// `--console-rows` [default: 1800000 (1,000 a second); smoke 1000].
    #[arg(long)]
    console_recent: Option<u64>,
    /// Rows a second a writer inserts while `--console` loads the page
    /// [default: 1000; smoke 10].
    #[arg(long)]
    console_writes: Option<u64>,
    /// RabbitMQ and NATS (PostgreSQL, INBOX_TEST_AMQP_URL and/or
    /// INBOX_TEST_NATS_URL): messages/s of `run_batch` against `run` with
    /// `in_flight(8)`.
    #[arg(long)]
    brokers: bool,
    /// Messages per variant and round of `--brokers` [default: 5000; smoke 50].
    #[arg(long)]
    broker_messages: Option<usize>,
    /// Passed by `cargo bench` to harness = false targets.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The arguments, defaults and `--smoke` resolved.
#[derive(Clone)]
pub struct Args {
    pub backends: Vec<String>,
    pub threads: Vec<usize>,
    /// Concurrent tasks of the async variants.
    pub tasks: Vec<usize>,
    /// `sync`, `async` or `all`: which handlers to measure.
    pub mode: String,
    pub messages: usize,
    /// The shortest sample, in seconds (sync variants).
    pub min_secs: f64,
    pub rounds: usize,
    pub batch: usize,
    pub scale: bool,
    /// `--variants`: the sync variants to run (all when empty).
    pub variants: Vec<String>,
    /// `--memory`: peak RSS of the examples at 1× and 10× their messages.
    pub memory: bool,
    /// `--purge`: handler latency while a purge runs, instead of the rest.
    pub purge: bool,
    /// Old rows the purge benchmark fills the inbox with.
    pub purge_rows: usize,
    /// Rows per purge batch.
    pub purge_batch: usize,
    /// Pause after each purge batch, in milliseconds.
    pub purge_pause_ms: usize,
    /// The purge's duty cycle ([`diesel_inbox::Purge::sleep_coef`]).
    pub purge_sleep_coef: f64,
    pub scale_rows: Vec<i64>,
    /// `--tenants` and its counts.
    pub tenants: bool,
    pub tenants_count: usize,
    pub tenants_backlog: usize,
    pub tenants_configured: usize,
    pub tenants_active: usize,
    /// `--outbox-messages` for `--tenants` [default: 20000; smoke 200].
    pub tenants_messages: usize,
    /// Whether `--smoke` was given.
    pub smoke: bool,
    /// `--outbox` and its counts.
    pub outbox: bool,
    pub outbox_messages: usize,
    pub outbox_rate: usize,
    pub outbox_batch: usize,
    pub outbox_over: Vec<String>,
    pub outbox_relays: usize,
    pub outbox_wal: bool,
    pub outbox_horizon: u64,
    pub outbox_keys: usize,
    pub outbox_secs: u64,
    /// `--http` and its counts.
    pub http: bool,
    pub http_conns: usize,
    pub http_storms: usize,
    /// `--kafka` and its count.
    pub kafka: bool,
    pub kafka_messages: usize,
    pub kafka_variants: Vec<String>,
    /// `--sqs` and its count.
    pub sqs: bool,
    pub sqs_messages: usize,
    /// `--console` and its counts.
    pub console: bool,
    pub console_rows: u64,
    pub console_loads: usize,
    pub console_recent: u64,
    pub console_writes: u64,
    /// `--brokers` and its count.
    pub brokers: bool,
    pub broker_messages: usize,
}

/// The process's arguments; clap's error (exit 2) or help (exit 0) on a
/// bad or `--help` command line, an error string on bad values.
pub fn parse() -> Result<Args, String> {
    resolve(Cli::parse())
}

fn resolve(cli: Cli) -> Result<Args, String> {
    let smoke = cli.smoke;
    let pick = |given: Option<usize>, full: usize, tiny: usize| {
        given.unwrap_or(if smoke { tiny } else { full })
    };
    let args = Args {
        backends: cli.backends,
        threads: cli
            .threads
            .unwrap_or(if smoke { vec![1, 2] } else { vec![1, 4] }),
        tasks: cli
            .tasks
            .unwrap_or(if smoke { vec![4] } else { vec![4, 16] }),
        mode: cli.mode,
        messages: pick(cli.messages, 2_000, 40),
        min_secs: cli.min_secs.unwrap_or(if smoke { 0.0 } else { 2.0 }),
        rounds: pick(cli.rounds, 9, 1),
        batch: pick(cli.batch, 100, 10),
        scale: cli.scale,
        variants: cli.variants,
        memory: cli.memory,
        purge: cli.purge,
        purge_rows: pick(cli.purge_rows, 1_000_000, 2_000),
        purge_batch: cli.purge_batch,
        purge_pause_ms: cli.purge_pause_ms,
        purge_sleep_coef: cli.purge_sleep_coef,
        tenants: cli.tenants,
        tenants_count: pick(cli.tenants_count, 100, 4).max(2),
        tenants_backlog: pick(cli.tenants_backlog, 100_000, 2_000),
        tenants_configured: pick(cli.tenants_configured, 1_000, 20).max(1),
        tenants_active: pick(cli.tenants_active, 50, 5).max(1),
        tenants_messages: pick(cli.outbox_messages, 20_000, 200),
        smoke,
        outbox: cli.outbox,
        outbox_messages: pick(cli.outbox_messages, 5_000, 100),
        outbox_rate: pick(cli.outbox_rate, 1_000, 100),
        outbox_batch: cli.outbox_batch.clamp(1, 10_000),
        outbox_over: cli.outbox_over,
        outbox_relays: cli.outbox_relays,
        outbox_wal: cli.outbox_wal,
        outbox_horizon: cli.outbox_horizon,
        outbox_keys: cli.outbox_keys,
        outbox_secs: cli.outbox_secs.unwrap_or(if smoke { 1 } else { 10 }),
        http: cli.http,
        http_conns: pick(cli.http_conns, 16, 4),
        http_storms: pick(cli.http_storms, 20, 1),
        kafka: cli.kafka,
        kafka_messages: pick(cli.kafka_messages, 3_000, 30),
        kafka_variants: cli.kafka_variants,
        sqs: cli.sqs,
        sqs_messages: pick(cli.sqs_messages, 300, 20),
        console: cli.console,
        console_rows: cli
            .console_rows
            .unwrap_or(if smoke { 10_000 } else { 10_000_000 }),
        console_loads: pick(cli.console_loads, 20, 3),
        console_recent: cli
            .console_recent
            .unwrap_or(if smoke { 1_000 } else { 1_800_000 }),
        console_writes: cli.console_writes.unwrap_or(if smoke { 10 } else { 1_000 }),
        brokers: cli.brokers,
        broker_messages: pick(cli.broker_messages, 5_000, 50),
        scale_rows: cli.scale_rows.unwrap_or(if smoke {
            vec![0, 1_000]
        } else {
            vec![0, 1_000_000, 10_000_000]
        }),
    };
    if let Some(bad) = args
        .variants
        .iter()
        .find(|v| !VARIANTS.contains(&v.as_str()))
    {
        return Err(format!(
            "--variants: no variant {bad} ({})",
            VARIANTS.join(", ")
        ));
    }
    let has = |v: &str| args.variants.iter().any(|w| w == v);
    for v in &args.variants {
        if let Some(first) = redelivers(v).filter(|first| !has(first)) {
            return Err(format!(
                "--variants: {v} redelivers {first}'s keys; list both"
            ));
        }
    }
    if args.threads.contains(&0)
        || args.tasks.contains(&0)
        || args.messages == 0
        || args.rounds == 0
        || args.batch == 0
    {
        return Err("threads, messages, rounds and batch must be positive".into());
    }
    if args.min_secs.is_nan() || args.min_secs < 0.0 {
        return Err("--min-secs must be a number of seconds, 0 or more".into());
    }
    Ok(args)
}

pub const VARIANTS: [&str; 16] = [
    "bare",
    "idempotent",
    "raw_sql",
    "naive",
    "duplicate",
    "batch",
    "batch_loop",
    "bare_batch",
    "fingerprinted",
    "fingerprinted_duplicate",
    "stored",
    "attempts",
    "connect_idempotent",
    "connect_raw_sql",
    "outbox",
    "outbox_by_hand",
];

/// The variant whose applied keys a redelivery variant delivers again.
pub fn redelivers(variant: &str) -> Option<&'static str> {
    match variant {
        "duplicate" => Some("idempotent"),
        "fingerprinted_duplicate" => Some("fingerprinted"),
        _ => None,
    }
}
