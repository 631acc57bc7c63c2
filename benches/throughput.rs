//! Messages per second: the inbox against the same business write without
//! it, against the same inbox logic hand-written, and against the usual
//! "SELECT, then INSERT" approach.
//!
//! ```text
//! cargo bench --bench throughput --all-features -- [--backend sqlite|postgres|mysql|all]
//!     [--threads 1,4] [--messages 2000] [--rounds 5] [--batch 100] [--smoke]
//!     [--scale [--scale-rows 0,1000000,10000000]]
//! ```
//!
//! Variants run interleaved (A B C … A B C …) and each reports its median over
//! the rounds. Server URLs come from `INBOX_TEST_POSTGRES_URL` and
//! `INBOX_TEST_MYSQL_URL`; SQLite uses a temporary file (WAL,
//! `synchronous = NORMAL`). Results go to `target/inbox-bench/results.json`
//! and `target/inbox-bench/throughput.svg`. `--smoke` runs tiny counts so CI
//! keeps the program working; real figures come from a full run.
//! `--scale` (PostgreSQL) measures `idempotent` with the inbox already holding
//! many rows (bulk-loaded with generate_series into a schema of its own).

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

const VARIANTS: [&str; 6] = [
    "bare",
    "idempotent",
    "raw_sql",
    "naive",
    "duplicate",
    "batch",
];

#[derive(Clone)]
struct Args {
    backends: Vec<String>,
    threads: Vec<usize>,
    messages: usize,
    rounds: usize,
    batch: usize,
    scale: bool,
    scale_rows: Vec<i64>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        backends: vec!["all".into()],
        threads: vec![1, 4],
        messages: 2_000,
        rounds: 5,
        batch: 100,
        scale: false,
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
            "--messages" => args.messages = num(it.next(), "--messages")?,
            "--rounds" => args.rounds = num(it.next(), "--rounds")?,
            "--batch" => args.batch = num(it.next(), "--batch")?,
            "--scale" => args.scale = true,
            "--scale-rows" => {
                args.scale_rows = list(it.next(), "--scale-rows")?
                    .iter()
                    .map(|t| t.parse().map_err(|_| format!("bad row count {t}")))
                    .collect::<Result<_, _>>()?
            }
            "--smoke" => {
                args.threads = vec![1, 2];
                args.messages = 40;
                args.rounds = 1;
                args.batch = 10;
                args.scale_rows = vec![0, 1_000];
            }
            // `cargo bench` passes --bench to harness = false targets.
            "--bench" => {}
            "--help" | "-h" => {
                return Err(
                    "usage: cargo bench --bench throughput -- [--backend sqlite|postgres|mysql|all] \
                     [--threads 1,4] [--messages N] [--rounds R] [--batch B] [--smoke] [--scale [--scale-rows 0,1000000]]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other}; see --help")),
        }
    }
    if args.threads.contains(&0) || args.messages == 0 || args.rounds == 0 || args.batch == 0 {
        return Err("threads, messages, rounds and batch must be positive".into());
    }
    Ok(args)
}

/// One (backend, threads) cell: the samples of each variant in messages/s.
struct Cell {
    backend: &'static str,
    threads: usize,
    samples: Vec<(&'static str, Vec<f64>)>,
}

impl Cell {
    fn median(&self, variant: &str) -> f64 {
        let mut v = self
            .samples
            .iter()
            .find(|(name, _)| *name == variant)
            .map(|(_, s)| s.clone())
            .unwrap_or_default();
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        if v.len() % 2 == 0 {
            (v[mid - 1] + v[mid]) / 2.0
        } else {
            v[mid]
        }
    }

    fn ratio(&self, a: &str, b: &str) -> f64 {
        self.median(a) / self.median(b)
    }
}

const RATIOS: [(&str, &str); 5] = [
    ("idempotent", "bare"),
    ("idempotent", "raw_sql"),
    ("idempotent", "naive"),
    ("duplicate", "idempotent"),
    ("batch", "idempotent"),
];

/// Runs `work(thread, connection)` on `threads` threads, each with its own
/// connection opened before the clock starts; returns the seconds taken.
fn timed<C: Send + 'static>(
    threads: usize,
    open: impl Fn() -> C,
    work: impl Fn(usize, &mut C) -> Result<(), String> + Send + Sync + 'static,
) -> Result<f64, String> {
    let start = Arc::new(Barrier::new(threads + 1));
    let work = Arc::new(work);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let mut conn = open();
            let (start, work) = (start.clone(), work.clone());
            std::thread::spawn(move || {
                start.wait();
                work(t, &mut conn)
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for h in handles {
        h.join()
            .map_err(|_| "a benchmark thread panicked".to_string())??;
    }
    Ok(began.elapsed().as_secs_f64())
}

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
            use super::$specific::{claim_by_hand, open, tx};
            use super::*;
            use diesel::connection::SimpleConnection;
            use diesel_inbox::{idempotent, inbox_messages, Processed};

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
            fn bare(conn: &mut Conn, order: &Order) -> QueryResult<()> {
                tx(conn, |c| insert_order(c, order).map(drop))
            }

            /// `idempotent`: the same write in an `#[idempotent]` handler.
            #[idempotent(key = "order.id", consumer = "bench", shared)]
            pub fn idempotent(conn: &mut Conn, order: &Order) -> QueryResult<()> {
                insert_order(conn, order).map(drop)
            }

            /// `raw_sql`: the same inbox logic written by hand: one
            /// conflict-ignoring insert, then the write if it inserted.
            fn raw_sql(conn: &mut Conn, order: &Order) -> QueryResult<()> {
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
                let rows: Vec<_> = orders
                    .iter()
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

            pub fn setup(url: &str) -> Result<(), String> {
                let mut conn = open(url);
                diesel_inbox::migrate(&mut conn).map_err(|e| e.to_string())?;
                conn.batch_execute(ORDERS_DDL).map_err(|e| e.to_string())
            }

            fn orders(prefix: &str, variant: &str, thread: usize, count: usize) -> Vec<Order> {
                (0..count)
                    .map(|n| Order {
                        id: format!("{prefix}-{variant}-{thread}-{n}"),
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
                        let key_variant = if variant == "duplicate" {
                            "idempotent"
                        } else {
                            variant
                        };
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
                            "raw_sql" => orders
                                .iter()
                                .try_for_each(|o| raw_sql(conn, o))
                                .map_err(err),
                            "naive" => orders.iter().try_for_each(|o| naive(conn, o)).map_err(err),
                            "batch" => orders.chunks(batch_size).try_for_each(|chunk| {
                                let out = batch(conn, chunk).map_err(err)?;
                                if out.applied.len() == chunk.len() {
                                    Ok(())
                                } else {
                                    Err(format!(
                                        "batch applied {} of {}",
                                        out.applied.len(),
                                        chunk.len()
                                    ))
                                }
                            }),
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
    use diesel::prelude::*;
    use diesel_inbox::inbox_messages as inbox;
    pub fn open(url: &str) -> PgConnection {
        PgConnection::establish(url).unwrap_or_else(|e| panic!("PostgreSQL unreachable: {e}"))
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
    use diesel::prelude::*;
    use diesel_inbox::inbox_messages as inbox;
    pub fn open(url: &str) -> MysqlConnection {
        MysqlConnection::establish(url).unwrap_or_else(|e| panic!("MySQL/MariaDB unreachable: {e}"))
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

type Measure = fn(&str, &'static str, usize, usize, usize, &str) -> Result<f64, String>;

struct Target {
    name: &'static str,
    label: &'static str,
    url: String,
    setup: fn(&str) -> Result<(), String>,
    measure: Measure,
}

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
            measure: sqlite::measure,
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
                measure: postgres::measure,
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
                measure: mysql::measure,
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
    let mut cells = Vec::new();
    for target in &targets {
        (target.setup)(&target.url)?;
        for &threads in &args.threads {
            let mut cell = Cell {
                backend: target.name,
                threads,
                samples: VARIANTS.iter().map(|v| (*v, Vec::new())).collect(),
            };
            for round in 0..args.rounds {
                let prefix = format!("{}r{round}t{threads}", run_id());
                for (i, variant) in VARIANTS.iter().enumerate() {
                    let mps = (target.measure)(
                        &target.url,
                        variant,
                        threads,
                        args.messages,
                        args.batch,
                        &prefix,
                    )?;
                    cell.samples[i].1.push(mps);
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
    let postgres = targets.iter().find(|t| t.name == "postgres");
    let scale = match (args.scale, postgres) {
        #[cfg(feature = "postgres")]
        (true, Some(target)) => scale::measure(&target.url, args)?,
        (true, _) => {
            println!("SKIPPED: --scale needs PostgreSQL");
            Vec::new()
        }
        (false, _) => Vec::new(),
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/inbox-bench");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("results.json"), to_json(&cells, &scale, args))
        .map_err(|e| e.to_string())?;
    draw_svg(&dir.join("throughput.svg"), &cells).map_err(|e| format!("svg: {e}"))?;
    println!("wrote {}/results.json and throughput.svg", dir.display());
    Ok(())
}

fn print_cell(label: &str, cell: &Cell, args: &Args) {
    println!(
        "\n{label}, {} thread(s), {} messages per sample, {} round(s), batch {}",
        cell.threads, args.messages, args.rounds, args.batch
    );
    println!(
        "  {:<12}{:>14}{:>14}{:>14}",
        "variant", "median msg/s", "min", "max"
    );
    for (variant, samples) in &cell.samples {
        let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
        let max = samples.iter().copied().fold(0.0, f64::max);
        println!(
            "  {variant:<12}{:>14.0}{min:>14.0}{max:>14.0}",
            cell.median(variant)
        );
    }
    for (a, b) in RATIOS {
        println!("  {:<24}{:>8.2}", format!("{a}/{b}"), cell.ratio(a, b));
    }
}

fn to_json(cells: &[Cell], scale: &[(i64, f64, i64)], args: &Args) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{{\n  \"messages\": {},\n  \"rounds\": {},\n  \"batch\": {},\n  \"results\": [",
        args.messages, args.rounds, args.batch
    );
    for (i, cell) in cells.iter().enumerate() {
        let _ = write!(
            out,
            "{}\n    {{\"backend\": \"{}\", \"threads\": {}, \"median_msgs_per_sec\": {{",
            if i > 0 { "," } else { "" },
            cell.backend,
            cell.threads
        );
        let medians: Vec<String> = VARIANTS
            .iter()
            .map(|v| format!("\"{v}\": {:.1}", cell.median(v)))
            .collect();
        let ratios: Vec<String> = RATIOS
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
            "{}}}, \"ratios\": {{{}}}, \"samples\": {{{}}}}}",
            medians.join(", "),
            ratios.join(", "),
            samples.join(", ")
        );
    }
    out.push_str("\n  ],\n  \"scale\": [");
    for (i, (rows, mps, index_bytes)) in scale.iter().enumerate() {
        let _ = write!(
            out,
            "{}\n    {{\"inbox_rows\": {rows}, \"idempotent_msgs_per_sec\": {mps:.1}, \"primary_key_bytes\": {index_bytes}}}",
            if i > 0 { "," } else { "" }
        );
    }
    out.push_str("\n  ]\n}\n");
    out
}

fn draw_svg(path: &std::path::Path, cells: &[Cell]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 420 * cells.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((cells.len().max(1), 1));
    for (cell, area) in cells.iter().zip(panels.iter()) {
        let top = VARIANTS.iter().map(|v| cell.median(v)).fold(1.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{} · {} thread(s) · messages per second (median)",
                    cell.backend, cell.threads
                ),
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..VARIANTS.len() as f64, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(VARIANTS.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let i = (*x - 0.5).round();
                if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < VARIANTS.len() {
                    VARIANTS[i as usize].to_string()
                } else {
                    String::new()
                }
            })
            .y_desc("msg/s")
            .draw()?;
        chart.draw_series(VARIANTS.iter().enumerate().map(|(i, v)| {
            let color = if *v == "idempotent" || *v == "batch" || *v == "duplicate" {
                BLUE.mix(0.75)
            } else {
                BLACK.mix(0.35)
            };
            Rectangle::new(
                [(i as f64 + 0.15, 0.0), (i as f64 + 0.85, cell.median(v))],
                color.filled(),
            )
        }))?;
        chart.draw_series(VARIANTS.iter().enumerate().map(|(i, v)| {
            Text::new(
                format!("{:.0}", cell.median(v)),
                (i as f64 + 0.3, cell.median(v) + top * 0.02),
                ("sans-serif", 14),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(feature = "postgres")]
mod scale {
    use super::*;
    use diesel::connection::SimpleConnection;

    /// `idempotent` messages/s with the inbox holding each of `--scale-rows`
    /// rows, in a schema of its own (dropped at the end).
    pub fn measure(url: &str, args: &Args) -> Result<Vec<(i64, f64, i64)>, String> {
        let schema = format!("inbox_bench_scale_{}", run_id());
        let mut admin = postgres_specific::open(url);
        admin
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .map_err(|e| e.to_string())?;
        let separator = if url.contains('?') { '&' } else { '?' };
        let scoped = format!("{url}{separator}options=-c%20search_path%3D{schema}");
        let result = (|| {
            postgres::setup(&scoped)?;
            let mut conn = postgres_specific::open(&scoped);
            let threads = *args.threads.last().unwrap_or(&1);
            let mut loaded = 0_i64;
            let mut out = Vec::new();
            for &rows in &args.scale_rows {
                if rows > loaded {
                    let began = Instant::now();
                    conn.batch_execute(&format!(
                        "INSERT INTO inbox_messages (consumer, message_id) \
                         SELECT 'bench-fill', 'fill-' || g FROM generate_series({}, {rows}) g",
                        loaded + 1
                    ))
                    .map_err(|e| e.to_string())?;
                    // VACUUM refuses to run inside a multi-statement batch.
                    conn.batch_execute("VACUUM ANALYZE inbox_messages")
                        .map_err(|e| e.to_string())?;
                    println!(
                        "loaded {} inbox rows in {:.1}s",
                        rows - loaded,
                        began.elapsed().as_secs_f64()
                    );
                    loaded = rows;
                }
                let mut samples = Vec::new();
                for round in 0..args.rounds {
                    let prefix = format!("{}s{rows}r{round}", run_id());
                    samples.push(postgres::measure(
                        &scoped,
                        "idempotent",
                        threads,
                        args.messages,
                        args.batch,
                        &prefix,
                    )?);
                }
                samples.sort_by(f64::total_cmp);
                let median = samples[samples.len() / 2];
                let index: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                    "pg_relation_size('inbox_messages_pkey')",
                ))
                .get_result(&mut conn)
                .map_err(|e| e.to_string())?;
                println!(
                    "scale: {rows:>10} inbox rows: idempotent {median:>8.0} msg/s ({threads} threads), primary key {:.1} MiB",
                    index as f64 / 1048576.0
                );
                out.push((rows, median, index));
            }
            if let (Some(first), Some(last)) = (out.first(), out.last()) {
                println!(
                    "scale ratio {}/{} rows: {:.2}",
                    last.0,
                    first.0,
                    last.1 / first.1
                );
            }
            Ok(out)
        })();
        let _ = admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
        result
    }
}
