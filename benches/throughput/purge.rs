use super::*;
use diesel_inbox::{InboxConnection, Processed};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const SLICES: usize = 10;
const THREADS: usize = 4;

/// What a backend supplies: a database of its own, the fill statement,
/// and its handler.
struct Server<C> {
    label: &'static str,
    /// (url of a fresh database, statement that drops it)
    fresh: fn(&str) -> Result<(String, String), String>,
    open: fn(&str) -> C,
    /// INSERT of `rows` old rows of slice `slice`, `days` old.
    fill: fn(slice: usize, rows: usize, days: u64) -> String,
    analyze: &'static str,
    handle: fn(&mut C, &Order) -> QueryResult<Processed<()>>,
}

pub fn run(targets: &[Target], args: &Args) -> Result<(), String> {
    let mut results = Vec::new();
    for target in targets {
        let result: Option<Result<String, String>> = match target.name {
            #[cfg(feature = "postgres")]
            "postgres" => Some(measure(&target.url, args, postgres_server())),
            #[cfg(feature = "mysql")]
            "mysql" => Some(measure(&target.url, args, mysql_server())),
            _ => None,
        };
        match result {
            Some(result) => results.push(result?),
            None => println!(
                "SKIPPED: --purge on {}: measured on PostgreSQL and MySQL/MariaDB",
                target.label
            ),
        }
    }
    let dir = write_output("purge.json", &format!("[{}]\n", results.join(",\n")))?;
    println!("wrote {}/purge.json", dir.display());
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn measure<C>(admin_url: &str, args: &Args, server: Server<C>) -> Result<String, String>
where
    C: InboxConnection + diesel::connection::LoadConnection + Send + 'static,
{
    let (url, drop_sql) = (server.fresh)(admin_url)?;
    let result = (|| {
        let mut conn = (server.open)(&url);
        diesel_inbox::migrate(&mut conn).map_err(|e| e.to_string())?;
        conn.batch_execute(ORDERS_DDL).map_err(|e| e.to_string())?;
        let per_slice = (args.purge_rows / SLICES).max(1);
        let began = Instant::now();
        for slice in 0..SLICES {
            conn.batch_execute(&(server.fill)(slice, per_slice, 40 - slice as u64))
                .map_err(|e| format!("fill: {e}"))?;
        }
        conn.batch_execute(server.analyze)
            .map_err(|e| e.to_string())?;
        println!(
            "{}: filled {} old inbox rows in {:.1}s",
            server.label,
            per_slice * SLICES,
            began.elapsed().as_secs_f64()
        );
        let (mut without, mut with) = (Vec::new(), Vec::new());
        let (mut purged, mut purge_secs) = (0u64, 0f64);
        let mut window = Duration::from_secs(2);
        for slice in 0..SLICES {
            // Without a purge, as long as the last purge took.
            let stop = AtomicBool::new(false);
            let latencies = std::thread::scope(|scope| {
                let handlers = spawn_handlers(scope, &server, &url, &stop, &format!("a{slice}"));
                std::thread::sleep(window);
                stop.store(true, Ordering::SeqCst);
                collect(handlers)
            })?;
            without.extend(latencies);
            // With a purge of the oldest remaining slice.
            let stop = AtomicBool::new(false);
            let (latencies, report) = std::thread::scope(|scope| {
                let handlers = spawn_handlers(scope, &server, &url, &stop, &format!("b{slice}"));
                let mut purger = (server.open)(&url);
                let older_than = Duration::from_secs((40 - slice as u64) * 86_400 - 43_200);
                let report = diesel_inbox::Purge::new(older_than)
                    .batch_size(args.purge_batch)
                    .pause(Duration::from_millis(args.purge_pause_ms as u64))
                    .run(&mut purger);
                stop.store(true, Ordering::SeqCst);
                (collect(handlers), report)
            });
            let report = report.map_err(|e| format!("purge: {e}"))?;
            with.extend(latencies?);
            if report.rows != per_slice as u64 {
                return Err(format!(
                    "the purge of slice {slice} deleted {} rows, not {per_slice}",
                    report.rows
                ));
            }
            purged += report.rows;
            purge_secs += report.elapsed.as_secs_f64();
            window = report.elapsed.max(Duration::from_millis(200));
        }
        without.sort_by(f64::total_cmp);
        with.sort_by(f64::total_cmp);
        let (p50a, p99a) = (percentile(&without, 0.5), percentile(&without, 0.99));
        let (p50b, p99b) = (percentile(&with, 0.5), percentile(&with, 0.99));
        let rate = purged as f64 / purge_secs.max(1e-9);
        println!(
            "{}: handler latency without purge p50 {:.2} ms p99 {:.2} ms ({} messages); during purge p50 {:.2} ms p99 {:.2} ms ({} messages); p99 ratio {:.2}; purge {} rows in {:.1}s = {:.0} rows/s",
            server.label, p50a, p99a, without.len(), p50b, p99b, with.len(), p99b / p99a, purged, purge_secs, rate
        );
        Ok(format!(
            "  {{\"backend\": \"{}\", \"old_rows\": {}, \"threads\": {THREADS}, \"batch\": {}, \"pause_ms\": {}, \"rounds\": {SLICES}, \
             \"without_purge\": {{\"messages\": {}, \"p50_ms\": {p50a:.3}, \"p99_ms\": {p99a:.3}}}, \
             \"during_purge\": {{\"messages\": {}, \"p50_ms\": {p50b:.3}, \"p99_ms\": {p99b:.3}}}, \
             \"p99_ratio\": {:.3}, \"purge_rows_per_sec\": {rate:.0}}}",
            server.label,
            purged,
            args.purge_batch,
            args.purge_pause_ms,
            without.len(),
            with.len(),
            p99b / p99a
        ))
    })();
    let mut admin = (server.open)(admin_url);
    let _ = admin.batch_execute(&drop_sql);
    result
}

type Handlers<'s> = Vec<std::thread::ScopedJoinHandle<'s, Result<Vec<f64>, String>>>;

/// THREADS handler threads delivering new messages until `stop`; each
/// returns its latencies in ms.
fn spawn_handlers<'s, 'e, C>(
    scope: &'s std::thread::Scope<'s, 'e>,
    server: &'e Server<C>,
    url: &'e str,
    stop: &'e AtomicBool,
    window: &str,
) -> Handlers<'s>
where
    C: InboxConnection + Send + 'static,
{
    let prefix = format!("{}{window}", run_id());
    (0..THREADS)
        .map(|t| {
            let prefix = prefix.clone();
            scope.spawn(move || {
                let mut conn = (server.open)(url);
                let mut latencies = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let order = Order {
                        id: format!("{prefix}-{t}-{n}"),
                        amount: 1,
                    };
                    let began = Instant::now();
                    match (server.handle)(&mut conn, &order) {
                        Ok(Processed::Applied(())) => {}
                        other => return Err(format!("{}: {other:?}", order.id)),
                    }
                    latencies.push(began.elapsed().as_secs_f64() * 1000.0);
                    n += 1;
                }
                Ok(latencies)
            })
        })
        .collect()
}

fn collect(handlers: Handlers<'_>) -> Result<Vec<f64>, String> {
    let mut all = Vec::new();
    for h in handlers {
        all.extend(
            h.join()
                .map_err(|_| "a handler thread panicked".to_string())??,
        );
    }
    Ok(all)
}

#[cfg(feature = "postgres")]
fn postgres_server() -> Server<diesel::PgConnection> {
    Server {
        label: "PostgreSQL",
        fresh: |url| postgres_specific::fresh(url, &format!("inbox_bench_purge_{}", run_id())),
        open: postgres_specific::open,
        fill: |slice, rows, days| {
            format!(
                "INSERT INTO inbox_messages (consumer, message_id, received_at) \
                 SELECT 'bench-old', 's{slice}-' || g, (now() AT TIME ZONE 'UTC') - interval '{days} days' \
                 FROM generate_series(1, {rows}) g"
            )
        },
        analyze: "VACUUM ANALYZE inbox_messages",
        handle: postgres::idempotent,
    }
}

#[cfg(feature = "mysql")]
fn mysql_server() -> Server<diesel::MysqlConnection> {
    Server {
        label: "MariaDB",
        fresh: |url| mysql_specific::fresh(url, &format!("inbox_bench_purge_{}", run_id())),
        open: mysql_specific::open,
        fill: |slice, rows, days| {
            // Numbers 0..rows from cross joins of a ten-row table.
            let digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                          UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                          UNION ALL SELECT 8 UNION ALL SELECT 9)";
            let places = (rows.max(2) as f64).log10().ceil() as u32;
            let tables: Vec<String> = (0..places).map(|p| format!("{digits} t{p}")).collect();
            let number: Vec<String> = (0..places)
                .map(|p| format!("t{p}.d * {}", 10u64.pow(p)))
                .collect();
            format!(
                "INSERT INTO inbox_messages (consumer, message_id, received_at) \
                 SELECT 'bench-old', CONCAT('s{slice}-', n), CURRENT_TIMESTAMP(6) - INTERVAL {days} DAY \
                 FROM (SELECT {} AS n FROM {}) numbers WHERE n < {rows}",
                number.join(" + "),
                tables.join(", ")
            )
        },
        analyze: "ANALYZE TABLE inbox_messages",
        handle: mysql::idempotent,
    }
}
