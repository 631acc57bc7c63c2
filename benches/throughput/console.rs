//! `--console`: the operations console's overview on PostgreSQL over a
//! large inbox and outbox, over TCP.
//!
//! A fresh database gets `--console-rows` inbox rows (five consumers,
//! claimed over the last ten days: about 21,000 in the last 30 minutes at
//! the default size), 2,000 failing keys, and an outbox of a tenth as many
//! rows (ten destinations; one in twenty scheduled, one in twenty dead),
//! written by SQL and analyzed; then `diesel_inbox::console::router`
//! serves it in this process and `--console-loads` sequential loads of
//! the overview page (`GET /`, reqwest, keep-alive) are timed: p50, p95
//! and the slowest. The target: p95 ≤ 200 ms over 10 million
//! inbox rows and 1 million outbox rows. It writes `console.json`.

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

fn fill(url: &str, rows: u64) -> Result<(), String> {
    let mut conn = diesel::PgConnection::establish(url).map_err(|e| e.to_string())?;
    diesel_inbox::migrate(&mut conn).map_err(|e| e.to_string())?;
    let outbox = rows / 10;
    // One row every 10 days / rows, the newest now.
    let step_us = 10 * 86_400 * 1_000_000 / rows.max(1);
    conn.batch_execute(&format!(
        "INSERT INTO inbox_messages (consumer, message_id, received_at) \
         SELECT 'consumer-' || (g % 5), 'key-' || g, \
                (now() AT TIME ZONE 'UTC') - (g * interval '{step_us} microseconds') \
         FROM generate_series(1, {rows}) g; \
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

fn measure(url: &str, args: &Args) -> Result<(), String> {
    let rows = args.console_rows;
    let started = Instant::now();
    fill(url, rows)?;
    println!(
        "console: {rows} inbox rows, {} outbox rows written and analyzed in {:.0} s",
        rows / 10,
        started.elapsed().as_secs_f64()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let times = runtime.block_on(async {
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
        let page = format!("http://{address}/");
        // One untimed load: the pool's first connection.
        client.get(&page).send().await.map_err(|e| e.to_string())?;
        let mut times = Vec::with_capacity(args.console_loads);
        for _ in 0..args.console_loads {
            let started = Instant::now();
            let response = client.get(&page).send().await.map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response.text().await.map_err(|e| e.to_string())?;
            times.push(started.elapsed());
            if !status.is_success() || !body.contains("consumer-1") {
                return Err(format!("the overview answered {status}"));
            }
        }
        Ok::<_, String>(times)
    })?;
    let mut sorted = times.clone();
    sorted.sort();
    let at =
        |q: f64| sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (p50, p95, max) = (ms(at(0.5)), ms(at(0.95)), ms(at(1.0)));
    println!(
        "console overview over {rows} inbox rows and {} outbox rows, {} loads: p50 {p50:.1} ms, p95 {p95:.1} ms, slowest {max:.1} ms (target: p95 <= 200 ms)",
        rows / 10,
        sorted.len()
    );
    let json = serde_json::json!({
        "inbox_rows": rows,
        "outbox_rows": rows / 10,
        "loads": sorted.len(),
        "p50_ms": p50,
        "p95_ms": p95,
        "max_ms": max,
    });
    let dir = write_output("console.json", &json.to_string())?;
    println!("wrote {}", dir.join("console.json").display());
    Ok(())
}
