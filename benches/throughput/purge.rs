//! `--purge`: handler latency with and without a purge running,
//! interleaved.
//!
//! The inbox of a database of its own is filled with `--purge-rows` old
//! rows in 10 slices, slice `i` claimed `40 - i` days ago. Each round runs
//! 4 handler threads (the `idempotent` variant, new keys) for a window
//! without a purge, then for a window in which one `purge` (batches of
//! `--purge-batch`, default 10,000) deletes the oldest remaining slice.
//! Every message's latency is recorded; the report compares p50 and p99 of
//! the two kinds of window.

use crate::args::Args;
use crate::bench::{Bench, Server, Target};
use crate::output::write_output;
use crate::{run_id, Order, ORDERS_DDL};
use diesel::connection::SimpleConnection;
use diesel_inbox::Processed;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SLICES: usize = 10;
const THREADS: usize = 4;

pub fn run(targets: &[Target], args: &Args) -> Result<(), String> {
    let mut results = Vec::new();
    for target in targets {
        match target.server {
            Some((_, measure)) => results.push(measure(&target.url, args)?),
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

pub fn measure<B: Server>(admin_url: &str, args: &Args) -> Result<String, String> {
    let name = format!("inbox_bench_purge_{}", run_id());
    let (url, drop_sql) = B::fresh(admin_url, &name)?;
    let result = (|| {
        let mut conn = B::open(&url);
        diesel_inbox::migrate(&mut conn).map_err(|e| e.to_string())?;
        conn.batch_execute(ORDERS_DDL).map_err(|e| e.to_string())?;
        let per_slice = (args.purge_rows / SLICES).max(1);
        let began = Instant::now();
        for slice in 0..SLICES {
            conn.batch_execute(&B::purge_fill(slice, per_slice, 40 - slice as u64))
                .map_err(|e| format!("fill: {e}"))?;
        }
        conn.batch_execute(B::ANALYZE).map_err(|e| e.to_string())?;
        println!(
            "{}: filled {} old inbox rows in {:.1}s",
            B::LABEL,
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
                let handlers = spawn_handlers::<B>(scope, &url, &stop, &format!("a{slice}"));
                std::thread::sleep(window);
                stop.store(true, Ordering::SeqCst);
                collect(handlers)
            })?;
            without.extend(latencies);
            // With a purge of the oldest remaining slice.
            let stop = AtomicBool::new(false);
            let (latencies, report) = std::thread::scope(|scope| {
                let handlers = spawn_handlers::<B>(scope, &url, &stop, &format!("b{slice}"));
                let mut purger = B::open(&url);
                let older_than = Duration::from_secs((40 - slice as u64) * 86_400 - 43_200);
                let report = diesel_inbox::Purge::new(older_than)
                    .batch_size(args.purge_batch)
                    .pause(Duration::from_millis(args.purge_pause_ms as u64))
                    .sleep_coef(args.purge_sleep_coef)
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
            B::LABEL, p50a, p99a, without.len(), p50b, p99b, with.len(), p99b / p99a, purged, purge_secs, rate
        );
        Ok(format!(
            "  {{\"backend\": \"{}\", \"old_rows\": {}, \"threads\": {THREADS}, \"batch\": {}, \"pause_ms\": {}, \"sleep_coef\": {}, \"rounds\": {SLICES}, \
             \"without_purge\": {{\"messages\": {}, \"p50_ms\": {p50a:.3}, \"p99_ms\": {p99a:.3}}}, \
             \"during_purge\": {{\"messages\": {}, \"p50_ms\": {p50b:.3}, \"p99_ms\": {p99b:.3}}}, \
             \"p99_ratio\": {:.3}, \"purge_rows_per_sec\": {rate:.0}}}",
            B::LABEL,
            purged,
            args.purge_batch,
            args.purge_pause_ms,
            args.purge_sleep_coef,
            without.len(),
            with.len(),
            p99b / p99a
        ))
    })();
    let mut admin = B::open(admin_url);
    let _ = admin.batch_execute(&drop_sql);
    result
}

type Handlers<'s> = Vec<std::thread::ScopedJoinHandle<'s, Result<Vec<f64>, String>>>;

/// THREADS handler threads delivering new messages until `stop`; each
/// returns its latencies in ms.
fn spawn_handlers<'s, 'e, B: Bench>(
    scope: &'s std::thread::Scope<'s, 'e>,
    url: &'e str,
    stop: &'e AtomicBool,
    window: &str,
) -> Handlers<'s> {
    let prefix = format!("{}{window}", run_id());
    (0..THREADS)
        .map(|t| {
            let prefix = prefix.clone();
            scope.spawn(move || {
                let mut conn = B::open(url);
                let mut latencies = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let order = Order {
                        id: format!("{prefix}-{t}-{n}"),
                        amount: 1,
                    };
                    let began = Instant::now();
                    match crate::variants::idempotent::<B>(&mut conn, &order) {
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
