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

use diesel::prelude::*;
use std::fmt::Write as _;
use std::sync::{Arc, Barrier};
use std::time::Instant;

diesel::table! {
    bench_orders (id) {
        id -> Text,
        amount -> BigInt,
    }
}

const ORDERS_DDL: &str =
    "CREATE TABLE IF NOT EXISTS bench_orders (id VARCHAR(255) NOT NULL PRIMARY KEY, amount BIGINT NOT NULL)";

pub struct Order {
    pub id: String,
    pub amount: i64,
}

const VARIANTS: [&str; 12] = [
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
];

/// The variant whose applied keys a redelivery variant delivers again.
fn redelivers(variant: &str) -> Option<&'static str> {
    match variant {
        "duplicate" => Some("idempotent"),
        "fingerprinted_duplicate" => Some("fingerprinted"),
        _ => None,
    }
}

#[derive(Clone)]
struct Args {
    backends: Vec<String>,
    threads: Vec<usize>,
    /// Concurrent tasks of the async variants.
    tasks: Vec<usize>,
    /// `sync`, `async` or `all`: which handlers to measure.
    mode: String,
    messages: usize,
    /// The shortest sample, in seconds (sync variants).
    min_secs: f64,
    rounds: usize,
    batch: usize,
    scale: bool,
    /// `--variants`: the sync variants to run (all when empty).
    variants: Vec<String>,
    /// `--memory`: peak RSS of the examples at 1× and 10× their messages.
    memory: bool,
    /// `--purge`: handler latency while a purge runs, instead of the rest.
    purge: bool,
    /// Old rows the purge benchmark fills the inbox with.
    purge_rows: usize,
    /// Rows per purge batch.
    purge_batch: usize,
    /// Pause after each purge batch, in milliseconds.
    purge_pause_ms: usize,
    scale_rows: Vec<i64>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        backends: vec!["all".into()],
        threads: vec![1, 4],
        tasks: vec![4, 16],
        mode: "all".into(),
        messages: 2_000,
        min_secs: 2.0,
        rounds: 9,
        batch: 100,
        scale: false,
        variants: Vec::new(),
        memory: false,
        purge: false,
        purge_rows: 1_000_000,
        purge_batch: 10_000,
        purge_pause_ms: 0,
        scale_rows: vec![0, 1_000_000, 10_000_000],
    };
    let mut it = std::env::args().skip(1);
    let list = |v: Option<String>, name: &str| -> Result<Vec<String>, String> {
        v.map(|v| v.split(',').map(str::to_string).collect())
            .ok_or(format!("{name} needs a value"))
    };
    let num = |v: Option<String>, name: &str| -> Result<usize, String> {
        v.and_then(|v| v.parse().ok())
            .ok_or(format!("{name} needs a number"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--backend" => args.backends = list(it.next(), "--backend")?,
            "--threads" => {
                args.threads = list(it.next(), "--threads")?
                    .iter()
                    .map(|t| t.parse().map_err(|_| format!("bad thread count {t}")))
                    .collect::<Result<_, _>>()?
            }
            "--tasks" => {
                args.tasks = list(it.next(), "--tasks")?
                    .iter()
                    .map(|t| t.parse().map_err(|_| format!("bad task count {t}")))
                    .collect::<Result<_, _>>()?
            }
            "--mode" => {
                args.mode = it.next().ok_or("--mode needs sync, async or all")?;
                if !["sync", "async", "all"].contains(&args.mode.as_str()) {
                    return Err(format!("--mode {}: sync, async or all", args.mode));
                }
            }
            "--messages" => args.messages = num(it.next(), "--messages")?,
            "--rounds" => args.rounds = num(it.next(), "--rounds")?,
            "--batch" => args.batch = num(it.next(), "--batch")?,
            "--scale" => args.scale = true,
            "--memory" => args.memory = true,
            "--variants" => {
                args.variants = list(it.next(), "--variants")?;
                if let Some(bad) = args.variants.iter().find(|v| !VARIANTS.contains(&v.as_str())) {
                    return Err(format!("--variants: no variant {bad} ({})", VARIANTS.join(", ")));
                }
                let has = |v: &str| args.variants.iter().any(|w| w == v);
                for v in &args.variants {
                    if let Some(first) = redelivers(v).filter(|first| !has(first)) {
                        return Err(format!("--variants: {v} redelivers {first}'s keys; list both"));
                    }
                }
            }
            "--purge" => args.purge = true,
            "--purge-rows" => args.purge_rows = num(it.next(), "--purge-rows")?,
            "--purge-batch" => args.purge_batch = num(it.next(), "--purge-batch")?,
            "--purge-pause-ms" => args.purge_pause_ms = num(it.next(), "--purge-pause-ms")?,
            "--scale-rows" => {
                args.scale_rows = list(it.next(), "--scale-rows")?
                    .iter()
                    .map(|t| t.parse().map_err(|_| format!("bad row count {t}")))
                    .collect::<Result<_, _>>()?
            }
            "--min-secs" => {
                args.min_secs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--min-secs needs a number of seconds")?
            }
            "--smoke" => {
                args.min_secs = 0.0;
                args.threads = vec![1, 2];
                args.tasks = vec![4];
                args.messages = 40;
                args.rounds = 1;
                args.batch = 10;
                args.scale_rows = vec![0, 1_000];
                args.purge_rows = 2_000;
            }
            // `cargo bench` passes --bench to harness = false targets.
            "--bench" => {}
            "--help" | "-h" => {
                return Err(
                    "usage: cargo bench --bench throughput -- [--backend sqlite|postgres|mysql|all] \
                     [--threads 1,4] [--tasks 4,16] [--mode sync|async|all] [--messages N] [--min-secs S] [--rounds R] [--batch B] [--variants a,b] [--smoke] [--scale [--scale-rows 0,1000000]] [--memory] [--purge [--purge-rows 1000000] [--purge-batch 10000] [--purge-pause-ms 0]]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other}; see --help")),
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
    Ok(args)
}

/// One (backend, mode, threads or tasks) cell: the samples of each variant
/// in messages/s.
struct Cell {
    backend: &'static str,
    /// The backend's name in print (MariaDB, not mysql).
    label: &'static str,
    /// `sync` (threads, a connection each) or `async` (tasks over a pool).
    mode: &'static str,
    threads: usize,
    samples: Vec<(&'static str, Vec<f64>)>,
}

/// The `q` quantile of `samples` (linear interpolation between the sorted
/// samples; 0 when there are none): `q = 0.5` is the median.
fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = (v.len() - 1) as f64 * q;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Writes `contents` to `file` under `target/inbox-bench`; that directory.
fn write_output(file: &str, contents: &str) -> Result<std::path::PathBuf, String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/inbox-bench");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(file), contents).map_err(|e| e.to_string())?;
    Ok(dir)
}

impl Cell {
    fn samples_of(&self, variant: &str) -> &[f64] {
        self.samples
            .iter()
            .find(|(name, _)| *name == variant)
            .map_or(&[], |(_, s)| s.as_slice())
    }

    fn median(&self, variant: &str) -> f64 {
        quantile(self.samples_of(variant), 0.5)
    }

    /// The interquartile range of a variant's samples (q3 - q1).
    fn iqr(&self, variant: &str) -> f64 {
        let samples = self.samples_of(variant);
        quantile(samples, 0.75) - quantile(samples, 0.25)
    }

    fn ratio(&self, a: &str, b: &str) -> f64 {
        self.median(a) / self.median(b)
    }

    fn variants(&self) -> Vec<&'static str> {
        self.samples.iter().map(|(v, _)| *v).collect()
    }

    /// The ratios reported for this cell (those whose variants it has).
    fn ratios(&self) -> Vec<(&'static str, &'static str)> {
        let all: &[(&'static str, &'static str)] = if self.mode == "async" {
            &ASYNC_RATIOS
        } else {
            &RATIOS
        };
        let has = |v: &str| self.samples.iter().any(|(name, _)| *name == v);
        all.iter()
            .copied()
            .filter(|(a, b)| has(a) && has(b))
            .collect()
    }
}

const RATIOS: [(&str, &str); 11] = [
    ("idempotent", "bare"),
    ("idempotent", "raw_sql"),
    ("idempotent", "naive"),
    ("duplicate", "idempotent"),
    ("batch", "idempotent"),
    ("batch_loop", "idempotent"),
    ("batch", "bare_batch"),
    ("fingerprinted", "idempotent"),
    ("fingerprinted_duplicate", "duplicate"),
    ("stored", "idempotent"),
    ("attempts", "idempotent"),
];

const ASYNC_RATIOS: [(&str, &str); 5] = [
    ("async_idempotent", "async_bare"),
    ("async_idempotent", "async_raw_sql"),
    ("async_duplicate", "async_idempotent"),
    ("async_pipelined", "async_raw_sql"),
    ("async_one_hop", "async_raw_sql"),
];

/// Runs `work(thread, connection)` on `threads` threads, each with its own
/// connection opened before the clock starts; returns the seconds taken.
fn timed<C: Send + 'static>(
    threads: usize,
    open: impl Fn() -> C,
    work: impl Fn(usize, &mut C) -> Result<(), String> + Send + Sync + 'static,
) -> Result<f64, String> {
    let start = Arc::new(Barrier::new(threads));
    let work = Arc::new(work);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let mut conn = open();
            let (start, work) = (start.clone(), work.clone());
            std::thread::spawn(move || {
                start.wait();
                let began = Instant::now();
                work(t, &mut conn).map(|()| (began, Instant::now()))
            })
        })
        .collect();
    // From the first thread's start to the last one's end: the main
    // thread's own clock could start after short work had finished.
    let mut spans = Vec::with_capacity(threads);
    for h in handles {
        spans.push(
            h.join()
                .map_err(|_| "a benchmark thread panicked".to_string())??,
        );
    }
    let first = spans.iter().map(|s| s.0).min().ok_or("no threads")?;
    let last = spans.iter().map(|s| s.1).max().ok_or("no threads")?;
    Ok(last.duration_since(first).as_secs_f64().max(1e-9))
}

/// Whether the sync variants' keys are random UUIDv4 text (`--scale`)
/// rather than `{prefix}-{variant}-{thread}-{n}`.
static UUID_KEYS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("b{}x{nanos:x}", std::process::id())
}

macro_rules! bench_backend {
    ($module:ident, $Conn:ty, $label:literal, $specific:ident) => {
        pub mod $module {
            use super::$specific::{claim_by_hand, open, tx, VERSION_SQL};
            use super::*;
            use diesel::connection::SimpleConnection;
            use diesel_inbox::{idempotent, inbox_messages, Processed, Stored};

            pub type Conn = $Conn;
            pub const LABEL: &str = $label;

            fn insert_order(conn: &mut Conn, order: &Order) -> QueryResult<usize> {
                diesel::insert_into(bench_orders::table)
                    .values((
                        bench_orders::id.eq(&order.id),
                        bench_orders::amount.eq(order.amount),
                    ))
                    .execute(conn)
            }

            /// `bare`: the business write in a plain transaction.
            pub fn bare(conn: &mut Conn, order: &Order) -> QueryResult<()> {
                tx(conn, |c| insert_order(c, order).map(drop))
            }

            /// `idempotent`: the same write in an `#[idempotent]` handler.
            #[idempotent(key = "order.id", consumer = "bench", shared)]
            pub fn idempotent(conn: &mut Conn, order: &Order) -> QueryResult<()> {
                insert_order(conn, order).map(drop)
            }

            /// `fingerprinted`: `idempotent` with a fingerprint of the
            /// message's content (its amount); `fingerprinted_duplicate`
            /// redelivers its keys (the duplicate's row is read and checked).
            #[idempotent(
                key = "order.id",
                consumer = "bench-fingerprinted",
                shared,
                fingerprint = "order.amount.to_be_bytes()"
            )]
            pub fn fingerprinted(conn: &mut Conn, order: &Order) -> QueryResult<()> {
                insert_order(conn, order).map(drop)
            }

            /// `stored`: `idempotent` whose small value (an `i64`) is
            /// stored with the inbox row (`store_result`).
            #[idempotent(key = "order.id", consumer = "bench-stored", shared, store_result)]
            pub fn stored(conn: &mut Conn, order: &Order) -> QueryResult<i64> {
                insert_order(conn, order)?;
                Ok(order.amount)
            }

            /// `attempts`: `idempotent` with `max_attempts` (the claim reads
            /// the key's failure count; none fail here).
            #[idempotent(
                key = "order.id",
                consumer = "bench-attempts",
                shared,
                max_attempts = 5
            )]
            pub fn attempts(conn: &mut Conn, order: &Order) -> QueryResult<()> {
                insert_order(conn, order).map(drop)
            }

            /// `raw_sql`: the same inbox logic written by hand: one
            /// conflict-ignoring insert, then the write if it inserted.
            pub fn raw_sql(conn: &mut Conn, order: &Order) -> QueryResult<()> {
                tx(conn, |c| {
                    if claim_by_hand(c, "bench-raw", &order.id)? == 1 {
                        insert_order(c, order)?;
                    }
                    Ok(())
                })
            }

            /// `naive`: SELECT the id, then INSERT it, in one transaction.
            fn naive(conn: &mut Conn, order: &Order) -> QueryResult<()> {
                tx(conn, |c| {
                    let seen: i64 = inbox_messages::table
                        .filter(inbox_messages::consumer.eq("bench-naive"))
                        .filter(inbox_messages::message_id.eq(&order.id))
                        .count()
                        .get_result(c)?;
                    if seen == 0 {
                        diesel::insert_into(inbox_messages::table)
                            .values((
                                inbox_messages::consumer.eq("bench-naive"),
                                inbox_messages::message_id.eq(&order.id),
                            ))
                            .execute(c)?;
                        insert_order(c, order)?;
                    }
                    Ok(())
                })
            }

            /// `batch`: one transaction and one claim per batch.
            #[idempotent(
                batch = "orders",
                key = "|o| o.id.as_str()",
                consumer = "bench-batch",
                shared
            )]
            fn batch(conn: &mut Conn, orders: &[Order]) -> QueryResult<usize> {
                insert_orders(conn, orders.iter().copied())
            }

            /// One multi-row insert of `orders` (`batch` and `bare_batch`).
            fn insert_orders<'o>(
                conn: &mut Conn,
                orders: impl Iterator<Item = &'o Order>,
            ) -> QueryResult<usize> {
                let rows: Vec<_> = orders
                    .map(|o| {
                        (
                            bench_orders::id.eq(&o.id),
                            bench_orders::amount.eq(o.amount),
                        )
                    })
                    .collect();
                diesel::insert_into(bench_orders::table)
                    .values(&rows)
                    .execute(conn)
            }

            /// `batch_loop`: one transaction and one claim per batch, and
            /// the same business work as `idempotent`: one insert per message.
            #[idempotent(
                batch = "orders",
                key = "|o| o.id.as_str()",
                consumer = "bench-batch-loop",
                shared
            )]
            fn batch_loop(conn: &mut Conn, orders: &[Order]) -> QueryResult<usize> {
                for o in &orders {
                    insert_order(conn, o)?;
                }
                Ok(orders.len())
            }

            /// `bare_batch`: `batch`'s multi-row insert in a plain
            /// transaction, without an inbox.
            fn bare_batch(conn: &mut Conn, orders: &[Order]) -> QueryResult<usize> {
                tx(conn, |c| insert_orders(c, orders.iter()))
            }

            /// The server's version, for the results.
            pub fn version(url: &str) -> String {
                diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(VERSION_SQL))
                    .get_result(&mut open(url))
                    .unwrap_or_else(|e| format!("unknown ({e})"))
            }

            pub fn setup(url: &str) -> Result<(), String> {
                let mut conn = open(url);
                diesel_inbox::migrate(&mut conn).map_err(|e| e.to_string())?;
                conn.batch_execute(ORDERS_DDL).map_err(|e| e.to_string())
            }

            fn orders(prefix: &str, variant: &str, thread: usize, count: usize) -> Vec<Order> {
                (0..count)
                    .map(|n| Order {
                        id: if UUID_KEYS.load(std::sync::atomic::Ordering::Relaxed) {
                            uuid::Uuid::new_v4().to_string()
                        } else {
                            format!("{prefix}-{variant}-{thread}-{n}")
                        },
                        amount: n as i64,
                    })
                    .collect()
            }

            /// Messages per second of one variant; `prefix` names the round
            /// (`duplicate` redelivers that round's `idempotent` orders).
            pub fn measure(
                url: &str,
                variant: &'static str,
                threads: usize,
                messages: usize,
                batch_size: usize,
                prefix: &str,
            ) -> Result<f64, String> {
                let per_thread = messages / threads;
                let (url2, prefix) = (url.to_string(), prefix.to_string());
                let secs = timed(
                    threads,
                    || open(&url2),
                    move |t, conn| {
                        let key_variant = redelivers(variant).unwrap_or(variant);
                        let orders = orders(&prefix, key_variant, t, per_thread);
                        let err = |e: diesel::result::Error| format!("{variant}: {e}");
                        match variant {
                            "bare" => orders.iter().try_for_each(|o| bare(conn, o)).map_err(err),
                            "idempotent" => orders.iter().try_for_each(|o| {
                                match idempotent(conn, o).map_err(err)? {
                                    Processed::Applied(()) => Ok(()),
                                    Processed::Duplicate => {
                                        Err(format!("{} was a duplicate", o.id))
                                    }
                                }
                            }),
                            "duplicate" => orders.iter().try_for_each(|o| {
                                match idempotent(conn, o).map_err(err)? {
                                    Processed::Duplicate => Ok(()),
                                    Processed::Applied(()) => {
                                        Err(format!("{} was not a duplicate", o.id))
                                    }
                                }
                            }),
                            "fingerprinted" | "attempts" => orders.iter().try_for_each(|o| {
                                let out = if variant == "attempts" {
                                    attempts(conn, o)
                                } else {
                                    fingerprinted(conn, o)
                                };
                                match out.map_err(err)? {
                                    Processed::Applied(()) => Ok(()),
                                    Processed::Duplicate => {
                                        Err(format!("{} was a duplicate", o.id))
                                    }
                                }
                            }),
                            "fingerprinted_duplicate" => orders.iter().try_for_each(|o| {
                                match fingerprinted(conn, o).map_err(err)? {
                                    Processed::Duplicate => Ok(()),
                                    Processed::Applied(()) => {
                                        Err(format!("{} was not a duplicate", o.id))
                                    }
                                }
                            }),
                            "stored" => orders.iter().try_for_each(|o| {
                                match stored(conn, o).map_err(err)? {
                                    Stored::Applied(amount) if amount == o.amount => Ok(()),
                                    other => Err(format!("{}: {other:?}", o.id)),
                                }
                            }),
                            "raw_sql" => orders
                                .iter()
                                .try_for_each(|o| raw_sql(conn, o))
                                .map_err(err),
                            "naive" => orders.iter().try_for_each(|o| naive(conn, o)).map_err(err),
                            "bare_batch" => orders
                                .chunks(batch_size)
                                .try_for_each(|chunk| bare_batch(conn, chunk).map(drop))
                                .map_err(err),
                            "batch" | "batch_loop" => {
                                orders.chunks(batch_size).try_for_each(|chunk| {
                                    let out = if variant == "batch" {
                                        batch(conn, chunk)
                                    } else {
                                        batch_loop(conn, chunk)
                                    }
                                    .map_err(err)?;
                                    if out.applied.len() == chunk.len() {
                                        Ok(())
                                    } else {
                                        Err(format!(
                                            "batch applied {} of {}",
                                            out.applied.len(),
                                            chunk.len()
                                        ))
                                    }
                                })
                            }
                            other => Err(format!("unknown variant {other}")),
                        }
                    },
                )?;
                Ok((per_thread * threads) as f64 / secs)
            }
        }
    };
}

#[cfg(feature = "sqlite")]
bench_backend!(sqlite, diesel::SqliteConnection, "SQLite", sqlite_specific);
#[cfg(feature = "postgres")]
bench_backend!(
    postgres,
    diesel::PgConnection,
    "PostgreSQL",
    postgres_specific
);
#[cfg(feature = "mysql")]
bench_backend!(mysql, diesel::MysqlConnection, "MariaDB", mysql_specific);

// What differs per backend: opening, the transaction the hand-written
// variants use, and the hand-written conflict-ignoring insert.
#[cfg(feature = "sqlite")]
mod sqlite_specific {
    pub const VERSION_SQL: &str = "'SQLite ' || sqlite_version()";
    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use diesel_inbox::inbox_messages as inbox;
    pub fn open(url: &str) -> SqliteConnection {
        let mut conn = SqliteConnection::establish(url).expect("open sqlite");
        conn.batch_execute(
            "PRAGMA busy_timeout = 30000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;",
        )
        .expect("pragmas");
        conn
    }
    /// Writers must take the lock at BEGIN, as the inbox does.
    pub fn tx<T>(
        conn: &mut SqliteConnection,
        f: impl FnOnce(&mut SqliteConnection) -> QueryResult<T>,
    ) -> QueryResult<T> {
        conn.immediate_transaction(f)
    }
    pub fn claim_by_hand(
        conn: &mut SqliteConnection,
        consumer: &str,
        key: &str,
    ) -> QueryResult<usize> {
        diesel::insert_into(inbox::table)
            .values((inbox::consumer.eq(consumer), inbox::message_id.eq(key)))
            .on_conflict((inbox::consumer, inbox::message_id))
            .do_nothing()
            .execute(conn)
    }
}

#[cfg(feature = "postgres")]
mod postgres_specific {
    pub const VERSION_SQL: &str = "version()";
    use diesel::prelude::*;
    use diesel_inbox::inbox_messages as inbox;
    pub fn open(url: &str) -> PgConnection {
        PgConnection::establish(url).unwrap_or_else(|e| panic!("PostgreSQL unreachable: {e}"))
    }
    /// A schema of its own named `name`: (its URL, the statement that drops it).
    pub fn fresh(url: &str, name: &str) -> Result<(String, String), String> {
        use diesel::connection::SimpleConnection;
        open(url)
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .map_err(|e| e.to_string())?;
        let separator = if url.contains('?') { '&' } else { '?' };
        Ok((
            format!("{url}{separator}options=-c%20search_path%3D{name}"),
            format!("DROP SCHEMA {name} CASCADE"),
        ))
    }
    pub fn tx<T>(
        conn: &mut PgConnection,
        f: impl FnOnce(&mut PgConnection) -> QueryResult<T>,
    ) -> QueryResult<T> {
        conn.transaction(f)
    }
    pub fn claim_by_hand(conn: &mut PgConnection, consumer: &str, key: &str) -> QueryResult<usize> {
        diesel::insert_into(inbox::table)
            .values((inbox::consumer.eq(consumer), inbox::message_id.eq(key)))
            .on_conflict((inbox::consumer, inbox::message_id))
            .do_nothing()
            .execute(conn)
    }
}

#[cfg(feature = "mysql")]
mod mysql_specific {
    pub const VERSION_SQL: &str = "version()";
    use diesel::prelude::*;
    use diesel_inbox::inbox_messages as inbox;
    pub fn open(url: &str) -> MysqlConnection {
        MysqlConnection::establish(url).unwrap_or_else(|e| panic!("MySQL/MariaDB unreachable: {e}"))
    }
    /// A database of its own named `name`: (its URL, the statement that drops it).
    pub fn fresh(url: &str, name: &str) -> Result<(String, String), String> {
        use diesel::connection::SimpleConnection;
        open(url)
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .map_err(|e| e.to_string())?;
        let base = url.split('?').next().unwrap_or(url);
        let server = &base[..base.rfind('/').ok_or("a database path in the URL")?];
        Ok((format!("{server}/{name}"), format!("DROP DATABASE {name}")))
    }
    pub fn tx<T>(
        conn: &mut MysqlConnection,
        f: impl FnOnce(&mut MysqlConnection) -> QueryResult<T>,
    ) -> QueryResult<T> {
        conn.transaction(f)
    }
    pub fn claim_by_hand(
        conn: &mut MysqlConnection,
        consumer: &str,
        key: &str,
    ) -> QueryResult<usize> {
        diesel::insert_or_ignore_into(inbox::table)
            .values((inbox::consumer.eq(consumer), inbox::message_id.eq(key)))
            .execute(conn)
    }
}

// ---- async handlers ---------------------------------------------------------
//
// The same business write through `async fn` handlers on diesel-async
// connections from a deadpool pool, with `--tasks` tasks on a multi-thread
// tokio runtime. Variants: `async_bare`, `async_idempotent`, `async_raw_sql`
// (the hand-written inbox: diesel-async's `transaction`, the claim, the
// write; on SQLite `BEGIN IMMEDIATE` instead, as the sync variants and the
// inbox take the write lock up front), `async_duplicate`; on SQLite
// `async_one_hop`: the sync `raw_sql`
// in one `spawn_blocking` (sync code, the ceiling of the wrapper); on
// PostgreSQL `async_pipelined`: `raw_sql` with BEGIN and the claim sent
// together (pipelined on one connection), outside diesel's transaction
// manager: an experiment, not something the library does.

#[cfg(feature = "async")]
const ASYNC_VARIANTS: [&str; 6] = [
    "async_bare",
    "async_idempotent",
    "async_raw_sql",
    "async_duplicate",
    "async_pipelined",
    "async_one_hop",
];

#[cfg(feature = "async")]
fn async_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// Runs `work(task, connection)` as one task per connection (taken from
/// a pool before the clock starts); returns the seconds taken.
#[cfg(feature = "async")]
fn timed_async<T, F>(conns: Vec<T>, work: impl Fn(usize, T) -> F) -> Result<f64, String>
where
    F: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    async_runtime().block_on(async {
        let began = Instant::now();
        let handles: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(t, conn)| tokio::spawn(work(t, conn)))
            .collect();
        for h in handles {
            h.await
                .map_err(|_| "a benchmark task panicked".to_string())??;
        }
        Ok(began.elapsed().as_secs_f64())
    })
}

#[cfg(feature = "async")]
macro_rules! async_bench_backend {
    ($module:ident, $AsyncConn:ty, $specific:ident) => {
        pub mod $module {
            use super::$specific::{
                bare_async, one_hop_async, pipelined_async, pool, raw_sql_async,
            };
            use super::*;
            use diesel_inbox::{idempotent, Processed};

            pub type AsyncConn = $AsyncConn;

            pub async fn insert_order_async(
                conn: &mut AsyncConn,
                order: &Order,
            ) -> QueryResult<usize> {
                let insert = diesel::insert_into(bench_orders::table).values((
                    bench_orders::id.eq(&order.id),
                    bench_orders::amount.eq(order.amount),
                ));
                diesel_async::RunQueryDsl::execute(insert, conn).await
            }

            /// `async_idempotent`: the write in an `#[idempotent]` `async fn`.
            #[idempotent(key = "order.id", consumer = "bench-async", shared)]
            pub async fn idempotent(conn: &mut AsyncConn, order: &Order) -> QueryResult<()> {
                insert_order_async(conn, order).await.map(drop)
            }

            /// Messages per second of one async variant with `tasks` tasks.
            pub fn measure(
                url: &str,
                variant: &'static str,
                tasks: usize,
                messages: usize,
                prefix: &str,
            ) -> Result<f64, String> {
                let per_task = messages / tasks;
                let pool = pool(url, tasks);
                let conns = async_runtime().block_on(async {
                    let mut conns = Vec::with_capacity(tasks);
                    for _ in 0..tasks {
                        conns.push(pool.get().await.map_err(|e| format!("pool: {e}"))?);
                    }
                    Ok::<_, String>(conns)
                })?;
                let prefix = prefix.to_string();
                let secs = timed_async(conns, |t, mut conn| {
                    let key_variant = if variant == "async_duplicate" {
                        "async_idempotent"
                    } else {
                        variant
                    };
                    let orders: Vec<Order> = (0..per_task)
                        .map(|n| Order {
                            id: format!("{prefix}-{key_variant}-{t}-{n}"),
                            amount: n as i64,
                        })
                        .collect();
                    async move {
                        let conn: &mut AsyncConn = &mut conn;
                        let err = |e: diesel::result::Error| format!("{variant}: {e}");
                        for o in &orders {
                            match variant {
                                "async_bare" => bare_async(conn, o).await.map_err(err)?,
                                "async_raw_sql" => raw_sql_async(conn, o).await.map_err(err)?,
                                "async_pipelined" => pipelined_async(conn, o).await.map_err(err)?,
                                "async_one_hop" => one_hop_async(conn, o).await.map_err(err)?,
                                "async_idempotent" => {
                                    match idempotent(conn, o).await.map_err(err)? {
                                        Processed::Applied(()) => {}
                                        Processed::Duplicate => {
                                            return Err(format!("{} was a duplicate", o.id))
                                        }
                                    }
                                }
                                "async_duplicate" => {
                                    match idempotent(conn, o).await.map_err(err)? {
                                        Processed::Duplicate => {}
                                        Processed::Applied(()) => {
                                            return Err(format!("{} was not a duplicate", o.id))
                                        }
                                    }
                                }
                                other => return Err(format!("unknown variant {other}")),
                            }
                        }
                        Ok(())
                    }
                })?;
                Ok((per_task * tasks) as f64 / secs)
            }

            /// Whether `variant` runs on this backend.
            pub fn has(variant: &str) -> bool {
                $specific::EXTRA == Some(variant)
                    || !["async_pipelined", "async_one_hop"].contains(&variant)
            }
        }
    };
}

#[cfg(all(feature = "async", feature = "sqlite"))]
async_bench_backend!(
    sqlite_async,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    sqlite_async_specific
);
#[cfg(all(feature = "async", feature = "postgres"))]
async_bench_backend!(
    postgres_async,
    diesel_async::AsyncPgConnection,
    postgres_async_specific
);
#[cfg(all(feature = "async", feature = "mysql"))]
async_bench_backend!(
    mysql_async,
    diesel_async::AsyncMysqlConnection,
    mysql_async_specific
);

/// A deadpool pool of `$size` connections of `$Conn`, each set up with
/// `$setup` (SQL run once per connection), if any.
#[cfg(feature = "async")]
macro_rules! deadpool {
    ($Conn:ty, $url:expr, $size:expr, $setup:expr) => {{
        use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
        use diesel_async::{AsyncConnection, SimpleAsyncConnection};
        let mut config = ManagerConfig::<$Conn>::default();
        let setup: Option<&'static str> = $setup;
        if let Some(sql) = setup {
            config.custom_setup = Box::new(move |url| {
                let url = url.to_string();
                Box::pin(async move {
                    let mut conn = <$Conn>::establish(&url).await?;
                    conn.batch_execute(sql)
                        .await
                        .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                    Ok(conn)
                })
            });
        }
        let manager = AsyncDieselConnectionManager::new_with_config($url, config);
        diesel_async::pooled_connection::deadpool::Pool::builder(manager)
            .max_size($size)
            .build()
            .expect("a pool")
    }};
}

/// `claim(key)`: the hand-written async variants' claim, a conflict-ignoring
/// insert with the target named (PostgreSQL, SQLite).
#[cfg(all(feature = "async", any(feature = "postgres", feature = "sqlite")))]
macro_rules! conflict_ignoring_claim {
    ($Backend:ty) => {
        fn claim(
            key: &str,
        ) -> impl diesel::query_builder::QueryFragment<$Backend>
               + diesel::query_builder::QueryId
               + Send
               + '_ {
            diesel::insert_into(inbox::table)
                .values((
                    inbox::consumer.eq("bench-async-raw"),
                    inbox::message_id.eq(key),
                ))
                .on_conflict((inbox::consumer, inbox::message_id))
                .do_nothing()
        }
    };
}

/// The hand-written async variants: diesel-async's transaction, and the
/// claim given as a statement.
#[cfg(feature = "async")]
macro_rules! async_variants {
    ($AsyncConn:ty, $claim:expr) => {
        pub async fn bare_async(conn: &mut $AsyncConn, order: &Order) -> QueryResult<()> {
            conn.transaction(async |c| {
                insert(c, order).await?;
                Ok(())
            })
            .await
        }

        pub async fn raw_sql_async(conn: &mut $AsyncConn, order: &Order) -> QueryResult<()> {
            conn.transaction(async |c| {
                let claim = $claim(&order.id);
                if diesel_async::RunQueryDsl::execute(claim, c).await? == 1 {
                    insert(c, order).await?;
                }
                Ok(())
            })
            .await
        }

        async fn insert(conn: &mut $AsyncConn, order: &Order) -> QueryResult<usize> {
            let insert = diesel::insert_into(bench_orders::table).values((
                bench_orders::id.eq(&order.id),
                bench_orders::amount.eq(order.amount),
            ));
            diesel_async::RunQueryDsl::execute(insert, conn).await
        }
    };
}

#[cfg(all(feature = "async", feature = "sqlite"))]
mod sqlite_async_specific {
    use super::*;
    use diesel_inbox::inbox_messages as inbox;
    type Conn =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    pub const EXTRA: Option<&str> = Some("async_one_hop");

    pub fn pool(url: &str, size: usize) -> diesel_async::pooled_connection::deadpool::Pool<Conn> {
        deadpool!(
            Conn,
            url,
            size,
            Some("PRAGMA busy_timeout = 30000; PRAGMA synchronous = NORMAL;")
        )
    }

    conflict_ignoring_claim!(diesel::sqlite::Sqlite);

    /// `BEGIN IMMEDIATE` (the write lock up front, as the sync variants
    /// and the inbox take it), in a hop to the blocking thread.
    async fn begin_immediate(conn: &mut Conn) -> QueryResult<()> {
        conn.spawn_blocking(|c| {
            use diesel::connection::SimpleConnection;
            c.batch_execute("BEGIN IMMEDIATE")
        })
        .await
    }

    /// `COMMIT` after `Ok`, `ROLLBACK` after `Err`.
    async fn end<T>(conn: &mut Conn, result: QueryResult<T>) -> QueryResult<T> {
        use diesel_async::SimpleAsyncConnection;
        match result {
            Ok(value) => conn.batch_execute("COMMIT").await.map(|()| value),
            Err(e) => {
                let _ = conn.batch_execute("ROLLBACK").await;
                Err(e)
            }
        }
    }

    async fn insert(conn: &mut Conn, order: &Order) -> QueryResult<usize> {
        let insert = diesel::insert_into(bench_orders::table).values((
            bench_orders::id.eq(&order.id),
            bench_orders::amount.eq(order.amount),
        ));
        diesel_async::RunQueryDsl::execute(insert, conn).await
    }

    /// The write between `BEGIN IMMEDIATE` and `COMMIT`, each statement
    /// awaited as an `async fn` body's would be.
    pub async fn bare_async(conn: &mut Conn, order: &Order) -> QueryResult<()> {
        begin_immediate(conn).await?;
        let written = insert(conn, order).await.map(drop);
        end(conn, written).await
    }

    /// The hand-written inbox the same way: `BEGIN IMMEDIATE`, the claim,
    /// the write if it inserted, `COMMIT`.
    pub async fn raw_sql_async(conn: &mut Conn, order: &Order) -> QueryResult<()> {
        begin_immediate(conn).await?;
        let written = async {
            if diesel_async::RunQueryDsl::execute(claim(&order.id), &mut *conn).await? == 1 {
                insert(conn, order).await?;
            }
            Ok(())
        }
        .await;
        end(conn, written).await
    }

    /// The sync `raw_sql` (`BEGIN IMMEDIATE`, claim, write, `COMMIT`) in one
    /// `spawn_blocking`.
    pub async fn one_hop_async(conn: &mut Conn, order: &Order) -> QueryResult<()> {
        let order = Order {
            id: order.id.clone(),
            amount: order.amount,
        };
        conn.spawn_blocking(move |c| super::sqlite::raw_sql(c, &order))
            .await
    }

    pub async fn pipelined_async(_: &mut Conn, _: &Order) -> QueryResult<()> {
        unreachable!("measured on PostgreSQL only")
    }
}

#[cfg(all(feature = "async", feature = "postgres"))]
mod postgres_async_specific {
    use super::*;
    use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
    use diesel_inbox::inbox_messages as inbox;
    pub const EXTRA: Option<&str> = Some("async_pipelined");

    pub fn pool(
        url: &str,
        size: usize,
    ) -> diesel_async::pooled_connection::deadpool::Pool<AsyncPgConnection> {
        deadpool!(AsyncPgConnection, url, size, None)
    }

    conflict_ignoring_claim!(diesel::pg::Pg);

    async_variants!(AsyncPgConnection, claim);

    pub async fn one_hop_async(_: &mut AsyncPgConnection, _: &Order) -> QueryResult<()> {
        unreachable!("measured on SQLite only")
    }

    /// BEGIN and the claim go out together (two requests, one round trip),
    /// then the write and COMMIT; ROLLBACK on any error. Outside diesel's
    /// transaction manager.
    pub async fn pipelined_async(conn: &mut AsyncPgConnection, order: &Order) -> QueryResult<()> {
        let shared: &AsyncPgConnection = conn;
        let (mut a, mut b) = (shared, shared);
        let begin = SimpleAsyncConnection::batch_execute(&mut a, "BEGIN");
        let claimed = diesel_async::RunQueryDsl::execute(claim(&order.id), &mut b);
        let body = async {
            let (_, claimed) = tokio::try_join!(begin, claimed)?;
            if claimed == 1 {
                let mut c = shared;
                let insert = diesel::insert_into(bench_orders::table).values((
                    bench_orders::id.eq(&order.id),
                    bench_orders::amount.eq(order.amount),
                ));
                diesel_async::RunQueryDsl::execute(insert, &mut c).await?;
            }
            Ok::<_, diesel::result::Error>(())
        };
        match body.await {
            Ok(()) => conn.batch_execute("COMMIT").await,
            Err(e) => {
                let _ = conn.batch_execute("ROLLBACK").await;
                Err(e)
            }
        }
    }
}

#[cfg(all(feature = "async", feature = "mysql"))]
mod mysql_async_specific {
    use super::*;
    use diesel_async::{AsyncConnection, AsyncMysqlConnection};
    use diesel_inbox::inbox_messages as inbox;
    pub const EXTRA: Option<&str> = None;

    pub fn pool(
        url: &str,
        size: usize,
    ) -> diesel_async::pooled_connection::deadpool::Pool<AsyncMysqlConnection> {
        deadpool!(AsyncMysqlConnection, url, size, None)
    }

    fn claim(
        key: &str,
    ) -> impl diesel::query_builder::QueryFragment<diesel::mysql::Mysql>
           + diesel::query_builder::QueryId
           + Send
           + '_ {
        diesel::insert_or_ignore_into(inbox::table).values((
            inbox::consumer.eq("bench-async-raw"),
            inbox::message_id.eq(key),
        ))
    }

    async_variants!(AsyncMysqlConnection, claim);

    pub async fn pipelined_async(_: &mut AsyncMysqlConnection, _: &Order) -> QueryResult<()> {
        unreachable!("measured on PostgreSQL only")
    }

    pub async fn one_hop_async(_: &mut AsyncMysqlConnection, _: &Order) -> QueryResult<()> {
        unreachable!("measured on SQLite only")
    }
}

type Measure = fn(&str, &'static str, usize, usize, usize, &str) -> Result<f64, String>;

struct Target {
    name: &'static str,
    label: &'static str,
    url: String,
    setup: fn(&str) -> Result<(), String>,
    measure: Measure,
    /// The server's version string.
    version: fn(&str) -> String,
    /// The async measurement and which async variants run here.
    #[cfg(feature = "async")]
    measure_async: (MeasureAsync, fn(&str) -> bool),
}

#[cfg(feature = "async")]
type MeasureAsync = fn(&str, &'static str, usize, usize, &str) -> Result<f64, String>;

fn targets(args: &Args) -> Vec<Target> {
    let wanted = |name: &str| args.backends.iter().any(|b| b == "all" || b == name);
    let mut all = Vec::new();
    #[cfg(feature = "sqlite")]
    if wanted("sqlite") {
        let path = std::env::temp_dir().join(format!("diesel-inbox-bench-{}.db", run_id()));
        all.push(Target {
            name: "sqlite",
            label: sqlite::LABEL,
            url: path.to_string_lossy().into_owned(),
            setup: sqlite::setup,
            version: sqlite::version,
            measure: sqlite::measure,
            #[cfg(feature = "async")]
            measure_async: (sqlite_async::measure, sqlite_async::has),
        });
    }
    #[cfg(feature = "postgres")]
    if wanted("postgres") {
        match std::env::var("INBOX_TEST_POSTGRES_URL") {
            Ok(url) if !url.is_empty() => all.push(Target {
                name: "postgres",
                label: postgres::LABEL,
                url,
                setup: postgres::setup,
                version: postgres::version,
                measure: postgres::measure,
                #[cfg(feature = "async")]
                measure_async: (postgres_async::measure, postgres_async::has),
            }),
            _ => println!("SKIPPED: postgres: INBOX_TEST_POSTGRES_URL is not set (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test; the database must exist)"),
        }
    }
    #[cfg(feature = "mysql")]
    if wanted("mysql") {
        match std::env::var("INBOX_TEST_MYSQL_URL") {
            Ok(url) if !url.is_empty() => all.push(Target {
                name: "mysql",
                label: mysql::LABEL,
                url,
                setup: mysql::setup,
                version: mysql::version,
                measure: mysql::measure,
                #[cfg(feature = "async")]
                measure_async: (mysql_async::measure, mysql_async::has),
            }),
            _ => println!("SKIPPED: mysql: INBOX_TEST_MYSQL_URL is not set (e.g. mysql://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test; the database must exist)"),
        }
    }
    let _ = wanted;
    all
}

fn main() {
    let args = match parse_args() {
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
    let targets = targets(args);
    if targets.is_empty() {
        return Err("no backend to measure (features and URLs)".into());
    }
    if args.purge {
        return purge_under_load::run(&targets, args);
    }
    if args.scale {
        return scale::run(&targets, args);
    }
    if args.memory {
        return memory::run(&targets, args);
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
        let wanted = (rate * args.min_secs * 1.1).ceil() as usize;
        // Whole batches on every thread.
        counts.push(wanted.max(args.messages).div_ceil(unit) * unit);
    }
    Ok(counts)
}

fn print_cell(label: &str, cell: &Cell, args: &Args) {
    let who = if cell.mode == "async" {
        "async task(s) over a pool"
    } else {
        "thread(s)"
    };
    let size = if cell.mode != "async" && args.min_secs > 0.0 {
        format!("samples of at least {} s", args.min_secs)
    } else {
        format!("{} messages per sample", args.messages)
    };
    println!(
        "\n{label}, {} {who}, {size}, {} round(s), batch {}",
        cell.threads, args.rounds, args.batch
    );
    println!(
        "  {:<24}{:>14}{:>14}{:>14}{:>14}",
        "variant", "median msg/s", "iqr", "min", "max"
    );
    for (variant, samples) in &cell.samples {
        let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
        let max = samples.iter().copied().fold(0.0, f64::max);
        println!(
            "  {variant:<24}{:>14.0}{:>14.0}{min:>14.0}{max:>14.0}",
            cell.median(variant),
            cell.iqr(variant)
        );
    }
    for (a, b) in cell.ratios() {
        println!("  {:<36}{:>8.2}", format!("{a}/{b}"), cell.ratio(a, b));
    }
}

/// Where and when the figures were measured.
fn provenance(targets: &[Target]) -> String {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let servers: Vec<String> = targets
        .iter()
        .map(|t| {
            format!(
                "\"{}\": \"{}\"",
                t.name,
                (t.version)(&t.url).replace('"', "'")
            )
        })
        .collect();
    format!(
        "  \"commit\": \"{commit}\",\n  \"date\": \"{date}\",\n  \"cores\": {cores},\n  \"servers\": {{{}}},\n",
        servers.join(", ")
    )
}

fn to_json(cells: &[Cell], args: &Args, provenance: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{{\n{provenance}  \"messages\": {},\n  \"min_secs\": {},\n  \"rounds\": {},\n  \"batch\": {},\n  \"results\": [",
        args.messages, args.min_secs, args.rounds, args.batch
    );
    for (i, cell) in cells.iter().enumerate() {
        let _ = write!(
            out,
            "{}\n    {{\"backend\": \"{}\", \"mode\": \"{}\", \"{}\": {}, \"median_msgs_per_sec\": {{",
            if i > 0 { "," } else { "" },
            cell.backend,
            cell.mode,
            if cell.mode == "async" { "tasks" } else { "threads" },
            cell.threads
        );
        let medians: Vec<String> = cell
            .variants()
            .iter()
            .map(|v| format!("\"{v}\": {:.1}", cell.median(v)))
            .collect();
        let iqrs: Vec<String> = cell
            .variants()
            .iter()
            .map(|v| format!("\"{v}\": {:.1}", cell.iqr(v)))
            .collect();
        let ratios: Vec<String> = cell
            .ratios()
            .iter()
            .map(|(a, b)| format!("\"{a}/{b}\": {:.3}", cell.ratio(a, b)))
            .collect();
        let samples: Vec<String> = cell
            .samples
            .iter()
            .map(|(v, s)| {
                let s: Vec<String> = s.iter().map(|x| format!("{x:.1}")).collect();
                format!("\"{v}\": [{}]", s.join(", "))
            })
            .collect();
        let _ = write!(
            out,
            "{}}}, \"iqr_msgs_per_sec\": {{{}}}, \"ratios\": {{{}}}, \"samples\": {{{}}}}}",
            medians.join(", "),
            iqrs.join(", "),
            ratios.join(", "),
            samples.join(", ")
        );
    }
    out.push_str("\n  ]\n}\n");
    out
}

/// Each cell's variants as ratios to its hand-written inbox (`raw_sql`, or
/// `async_raw_sql`), median with the interquartile range as a whisker, on a
/// log scale so that a 1.05 and a 20× are both readable; 1.0 is marked.
fn draw_svg(path: &std::path::Path, cells: &[Cell]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 380 * cells.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((cells.len().max(1), 1));
    for (cell, area) in cells.iter().zip(panels.iter()) {
        // Scale cells: each size against the first (the emptiest inbox).
        let base_name = match cell.mode {
            "async" => "async_raw_sql",
            "scale" => cell.samples.first().map_or("", |(v, _)| *v),
            _ => "raw_sql",
        };
        let base = cell.median(base_name).max(1e-9);
        let variants: Vec<&str> = cell
            .variants()
            .into_iter()
            .filter(|v| *v != base_name)
            .collect();
        // (median, q1, q3) of each variant over the baseline's median.
        let spread = |v: &str| {
            let (median, iqr) = (cell.median(v), cell.iqr(v));
            (
                median / base,
                (median - iqr / 2.0).max(1e-9) / base,
                (median + iqr / 2.0) / base,
            )
        };
        let (low, high) = variants
            .iter()
            .map(|v| spread(v))
            .fold((1.0f64, 1.0f64), |(lo, hi), (_, q1, q3)| {
                (lo.min(q1), hi.max(q3))
            });
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{} · {} {} · {}messages/s ÷ {base_name} (median, IQR)",
                    cell.label,
                    cell.threads,
                    if cell.mode == "async" {
                        "async task(s)"
                    } else {
                        "thread(s)"
                    },
                    if cell.mode == "scale" {
                        "idempotent, random UUID keys, "
                    } else {
                        ""
                    }
                ),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(
                0f64..variants.len() as f64,
                ((low * 0.8)..(high * 1.25)).log_scale(),
            )?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(variants.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let i = (*x - 0.5).round();
                if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < variants.len() {
                    variants[i as usize]
                        .trim_start_matches("async_")
                        .to_string()
                } else {
                    String::new()
                }
            })
            .y_desc("ratio (log)")
            .draw()?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 1.0), (variants.len() as f64, 1.0)],
            BLACK.stroke_width(1),
        )))?;
        let ours = [
            "idempotent",
            "batch",
            "batch_loop",
            "duplicate",
            "async_idempotent",
            "async_duplicate",
        ];
        chart.draw_series(variants.iter().enumerate().map(|(i, v)| {
            let color = if ours.contains(v) || cell.mode == "scale" {
                BLUE.mix(0.7)
            } else {
                BLACK.mix(0.3)
            };
            let (ratio, _, _) = spread(v);
            Rectangle::new(
                [(i as f64 + 0.2, 1.0), (i as f64 + 0.8, ratio)],
                color.filled(),
            )
        }))?;
        chart.draw_series(variants.iter().enumerate().map(|(i, v)| {
            let (_, q1, q3) = spread(v);
            PathElement::new(
                vec![(i as f64 + 0.5, q1), (i as f64 + 0.5, q3)],
                RED.stroke_width(2),
            )
        }))?;
        chart.draw_series(variants.iter().enumerate().map(|(i, v)| {
            let (ratio, _, q3) = spread(v);
            Text::new(
                format!("{ratio:.2}"),
                (i as f64 + 0.3, q3.max(ratio) * 1.06),
                ("sans-serif", 13),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}

// The examples themselves, run by `--memory` (their `main`s stay unused).
#[allow(dead_code)]
#[path = "../examples/quickstart.rs"]
mod quickstart;

#[cfg(feature = "async")]
#[allow(dead_code)]
#[path = "../examples/async_consumer.rs"]
mod async_consumer;

/// `--memory`: does the examples' peak memory stay flat with 10× the
/// messages? Each run starts by resetting the peak (`5` into
/// `/proc/self/clear_refs`), reads `VmRSS`, runs, and reads `VmHWM`.
#[path = "throughput/memory.rs"]
mod memory;

/// `--scale`: `idempotent` messages/s with the inbox already holding each of
/// `--scale-rows` rows, on PostgreSQL and MySQL/MariaDB.
///
/// Each size has a schema (PostgreSQL) or database (MySQL/MariaDB) of its
/// own, filled with random UUIDv4 text keys under the measured consumer
/// (`bench`), and the measured messages carry random UUIDv4 keys too: new
/// claims land all over the primary key's B-tree, as real message ids do.
/// Rounds alternate between the sizes (the order rotates each round); a
/// sample runs at least `--min-secs`. A size's ratio is the median of its
/// per-round ratios to the first size, with their interquartile range.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[path = "throughput/scale.rs"]
mod scale;

/// `--scale` without a server backend compiled in.
#[cfg(not(any(feature = "postgres", feature = "mysql")))]
#[path = "throughput/scale_skipped.rs"]
mod scale;

/// `--purge`: handler latency with and without a purge running, interleaved.
///
/// The inbox of a database of its own is filled with `--purge-rows` old
/// rows in 10 slices, slice `i` claimed `40 - i` days ago. Each round runs
/// 4 handler threads (the `idempotent` variant, new keys) for a window
/// without a purge, then for a window in which one `purge` (batches of
/// `--purge-batch`, default 10,000) deletes the oldest remaining slice. Every message's latency is
/// recorded; the report compares p50 and p99 of the two kinds of window.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[path = "throughput/purge.rs"]
mod purge_under_load;

/// `--purge` without a server backend compiled in.
#[cfg(not(any(feature = "postgres", feature = "mysql")))]
#[path = "throughput/purge_skipped.rs"]
mod purge_under_load;
