//! `--console`: the operations console's overview on PostgreSQL over a
//! large inbox and outbox, over TCP.
//!
//! A fresh database gets `--console-rows` inbox rows (five consumers,
//! claimed over the last ten days), `--console-recent` more over the last
//! 30 minutes (1,800,000 by default: 1,000 a second), 2,000 failing keys,
//! and an outbox of a tenth of `--console-rows` (ten destinations; one in
//! twenty scheduled, one in twenty dead), written by SQL and analyzed;
//! then `diesel_inbox::console::router` serves it in this process while a
//! writer inserts `--console-writes` rows a second (a batch every 100 ms,
//! as handlers would), and `--console-loads` sequential loads of the
//! overview page (`GET /`) and of its live tables (`GET /live`, what the
//! page's script fetches every 5 s) are timed, interleaved (reqwest,
//! keep-alive): p50, p95 and the slowest of each. The target:
//! `/live` at p95 ≤ 100 ms. It writes `console.json`.

use crate::args::Args;
use crate::output::write_output;
use diesel::connection::SimpleConnection;
use diesel::Connection;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::AsyncPgConnection;
use std::time::{Duration, Instant};

pub fn run(args: &Args) -> Result<(), String> {
    let admin = std::env::var("INBOX_TEST_POSTGRES_URL")
        .map_err(|_| "--console needs INBOX_TEST_POSTGRES_URL".to_owned())?;
    let name = format!("bench_console_{}", std::process::id());
    let (server, _) = admin.rsplit_once('/').ok_or("a URL with a database")?;
    let url = format!("{server}/{name}");
    let mut conn = diesel::PgConnection::establish(&admin).map_err(|e| e.to_string())?;
    conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .map_err(|e| e.to_string())?;
    conn.batch_execute(&format!("CREATE DATABASE {name}"))
        .map_err(|e| e.to_string())?;
    let result = measure(&url, args);
    let _ = conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    result
}

fn fill(url: &str, rows: u64, recent: u64) -> Result<(), String> {
    let mut conn = diesel::PgConnection::establish(url).map_err(|e| e.to_string())?;
    diesel_inbox::migrate(&mut conn).map_err(|e| e.to_string())?;
    let outbox = rows / 10;
    // One row every 10 days / rows, the newest now; the recent ones one
    // every 30 minutes / recent.
    let step_us = 10 * 86_400 * 1_000_000 / rows.max(1);
    let recent_step_us = 30 * 60 * 1_000_000 / recent.max(1);
    conn.batch_execute(&format!(
        "INSERT INTO inbox_messages (consumer, message_id, received_at) \
         SELECT 'consumer-' || (g % 5), 'key-' || g, \
                (now() AT TIME ZONE 'UTC') - (g * interval '{step_us} microseconds') \
         FROM generate_series(1, {rows}) g; \
         INSERT INTO inbox_messages (consumer, message_id, received_at) \
         SELECT 'consumer-' || (g % 5), 'recent-' || g, \
                (now() AT TIME ZONE 'UTC') - (g * interval '{recent_step_us} microseconds') \
         FROM generate_series(1, {recent}) g; \
         INSERT INTO inbox_attempts (consumer, message_id, failures, last_error) \
         SELECT 'consumer-' || (g % 5), 'bad-' || g, 1 + g % 5, 'error ' || g \
         FROM generate_series(1, 2000) g; \
         INSERT INTO outbox_messages (id, destination, payload, created_at, available_at, \
                                      attempts, last_error, dead_at) \
         SELECT 'id-' || g, 'dest-' || (g % 10), convert_to('payload ' || g, 'UTF8'), \
                (extract(epoch from now()) * 1000000)::bigint - g * 1000, \
                CASE WHEN g % 20 = 1 THEN (extract(epoch from now()) * 1000000)::bigint + 3600000000 \
                     ELSE (extract(epoch from now()) * 1000000)::bigint - g * 1000 END, \
                CASE WHEN g % 20 = 2 THEN 10 ELSE 0 END, \
                CASE WHEN g % 20 = 2 THEN 'refused' END, \
                CASE WHEN g % 20 = 2 THEN (extract(epoch from now()) * 1000000)::bigint END \
         FROM generate_series(1, {outbox}) g"
    ))
    .map_err(|e| e.to_string())?;
    // One statement each: VACUUM refuses a transaction (a multi-statement
    // string is one).
    for table in ["inbox_messages", "inbox_attempts", "outbox_messages"] {
        conn.batch_execute(&format!("VACUUM ANALYZE {table}"))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Inserts `per_second` inbox rows a second, a batch every 100 ms, until
/// `stop`; how many it inserted.
fn write_while(
    url: &str,
    per_second: u64,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<u64, String> {
    let mut conn = diesel::PgConnection::establish(url).map_err(|e| e.to_string())?;
    let batch = (per_second / 10).max(1);
    let (mut written, mut tick) = (0u64, Instant::now());
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        conn.batch_execute(&format!(
            "INSERT INTO inbox_messages (consumer, message_id) \
             SELECT 'consumer-' || (g % 5), 'live-{written}-' || g FROM generate_series(1, {batch}) g"
        ))
        .map_err(|e| e.to_string())?;
        written += batch;
        tick += Duration::from_millis(100);
        std::thread::sleep(tick.saturating_duration_since(Instant::now()));
    }
    Ok(written)
}

fn measure(url: &str, args: &Args) -> Result<(), String> {
    let (rows, recent) = (args.console_rows, args.console_recent);
    let started = Instant::now();
    fill(url, rows, recent)?;
    println!(
        "console: {rows} inbox rows and {recent} in the last 30 minutes, {} outbox rows written and analyzed in {:.0} s",
        rows / 10,
        started.elapsed().as_secs_f64()
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    let per_second = args.console_writes;
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let began = Instant::now();
            write_while(url, per_second, &stop).map(|n| (n, began.elapsed()))
        });
        let timed = load(url, args);
        let before = previous_rates(url, 5);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (written, took) = writer
            .join()
            .map_err(|_| "the writer panicked".to_owned())??;
        println!(
            "console: the writer inserted {written} rows in {:.1} s ({:.0} a second) during the loads",
            took.as_secs_f64(),
            written as f64 / took.as_secs_f64()
        );
        let before = before?;
        println!(
            "console: the previous version's rate read (every row of the last 30 minutes, grouped by consumer and minute), 5 runs meanwhile: median {:.1} ms, slowest {:.1} ms",
            before[2].as_secs_f64() * 1000.0,
            before[4].as_secs_f64() * 1000.0
        );
        report(args, timed?)
    })
}

/// The statement the overview's rates were before they were bounded (the
/// rows of the last 30 minutes, every one read), timed `runs` times,
/// sorted: the comparison.
fn previous_rates(url: &str, runs: usize) -> Result<Vec<Duration>, String> {
    let mut conn = diesel::PgConnection::establish(url).map_err(|e| e.to_string())?;
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            conn.batch_execute(
                "SELECT consumer, COUNT(*), CAST(FLOOR(EXTRACT(EPOCH FROM received_at) / 60) AS BIGINT) \
                 FROM inbox_messages WHERE received_at >= (now() AT TIME ZONE 'UTC') - interval '30 minutes' \
                 GROUP BY 1, 3",
            )
            .map(|()| started.elapsed())
            .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    times.sort();
    Ok(times)
}

/// The timed loads of `/` and `/live`, interleaved.
fn load(url: &str, args: &Args) -> Result<(Vec<Duration>, Vec<Duration>), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let pool: Pool<AsyncPgConnection> =
            Pool::builder(AsyncDieselConnectionManager::<AsyncPgConnection>::new(url))
                .max_size(2)
                .build()
                .map_err(|e| e.to_string())?;
        let app = diesel_inbox::console::router(pool);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let address = listener.local_addr().map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
            )
            .await;
        });
        let client = reqwest::Client::new();
        let (page, live) = (
            format!("http://{address}/"),
            format!("http://{address}/live"),
        );
        // One untimed load: the pool's first connection.
        client.get(&page).send().await.map_err(|e| e.to_string())?;
        let mut times = (
            Vec::with_capacity(args.console_loads),
            Vec::with_capacity(args.console_loads),
        );
        for _ in 0..args.console_loads {
            for (url, into) in [(&page, &mut times.0), (&live, &mut times.1)] {
                let started = Instant::now();
                let response = client.get(url).send().await.map_err(|e| e.to_string())?;
                let status = response.status();
                let body = response.text().await.map_err(|e| e.to_string())?;
                into.push(started.elapsed());
                if !status.is_success() || !body.contains("consumer-1") {
                    return Err(format!("{url} answered {status}"));
                }
            }
        }
        Ok::<_, String>(times)
    })
}

/// p50, p95 and the slowest of each, printed and written.
fn report(args: &Args, (overview, live): (Vec<Duration>, Vec<Duration>)) -> Result<(), String> {
    let (rows, recent) = (args.console_rows, args.console_recent);
    let stats = |times: &[Duration]| {
        let mut sorted = times.to_vec();
        sorted.sort();
        let at =
            |q: f64| sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1];
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        (ms(at(0.5)), ms(at(0.95)), ms(at(1.0)))
    };
    let (p50, p95, max) = stats(&overview);
    let (live_p50, live_p95, live_max) = stats(&live);
    println!(
        "console over {rows} inbox rows ({recent} in the last 30 minutes, {} a second written meanwhile) and {} outbox rows, {} loads each: \
         GET / p50 {p50:.1} ms, p95 {p95:.1} ms, slowest {max:.1} ms; GET /live p50 {live_p50:.1} ms, p95 {live_p95:.1} ms, slowest {live_max:.1} ms (target: /live p95 <= 100 ms)",
        args.console_writes,
        rows / 10,
        overview.len()
    );
    let json = serde_json::json!({
        "inbox_rows": rows,
        "recent_rows": recent,
        "writes_per_second": args.console_writes,
        "outbox_rows": rows / 10,
        "loads": overview.len(),
        "p50_ms": p50,
        "p95_ms": p95,
        "max_ms": max,
        "live_p50_ms": live_p50,
        "live_p95_ms": live_p95,
        "live_max_ms": live_max,
    });
    let dir = write_output("console.json", &json.to_string())?;
    println!("wrote {}", dir.join("console.json").display());
    Ok(())
}
