//! `--tenants` (PostgreSQL, `INBOX_TEST_POSTGRES_URL`): one relay over a
//! database per tenant against one relay over one database.
//!
//! - **Throughput:** `--tenants-count` tenant databases (100) and one more,
//!   filled each round (untimed) with the same total, `--outbox-messages`
//!   (here 20,000 by default; a key of its own for each message), spread evenly over the
//!   tenants; timed in a rotating order: `one_database` (`Relay::run_once`
//!   on the one), `tenants` (`Relay::tenants(..).run_once()` over all,
//!   the set limited to 16 connections, one per tenant's pool) and
//!   `tenants_turn1` (the same with turns of one batch, not 4). The
//!   publisher takes every message at once (no broker): what differs is
//!   the relay's database side, which is what is measured.
//! - **Fairness:** the publish latency of a tenant that enqueues a message
//!   every 20 ms (`small`), with the relay over tenants running, while
//!   another tenant drains a backlog of `--tenants-backlog` messages
//!   (100,000), against the same tenant with nothing else due:
//!   commit-to-publish, p50 and p99, in interleaved rounds. The relay polls
//!   every 100 ms (`alone`, `beside_backlog`: no listener), or listens on
//!   both databases as well (`*_listened`: PostgreSQL's NOTIFY; the set's
//!   limit 6 instead of 4, for the two listening connections).
//!
//! - **Connections:** `--tenants-configured` tenants (1,000; a schema each
//!   in one database, so that making them is quick), `--tenants-active` of
//!   them (50) enqueueing a message every 100 ms each for 20 s, one relay
//!   over all of them with a limit of 16 connections: the most connections
//!   the server saw the relay hold (`application_name`), against the limit.
//!
//! Writes `tenants.json`.

use crate::args::Args;
use crate::output::write_output;
use crate::run_id;
use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::AsyncPgConnection;
use diesel_inbox::outbox::{self, OutboxMessage, Outgoing, Publish, PublishError, Relay};
use diesel_inbox::tenants::Tenants;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type PgPool = Pool<AsyncPgConnection>;

/// The median of `samples` (sorted in place).
fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// A publisher that takes every message; it notes when it got the ones
/// `watch` names (payload prefix), for the latency run.
#[derive(Clone, Default)]
struct Taker {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    watch: Option<&'static str>,
}

impl Publish for Taker {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        if let Some(prefix) = self.watch {
            let now = Instant::now();
            let mut seen = self.seen.lock().expect("not poisoned");
            for m in messages {
                if m.payload.starts_with(prefix.as_bytes()) {
                    seen.insert(String::from_utf8_lossy(&m.payload).into_owned(), now);
                }
            }
        }
        messages.iter().map(|_| Ok(())).collect()
    }
}

/// The databases of the run, dropped at its end.
struct Databases {
    admin: String,
    base: String,
    names: Vec<String>,
}

impl Databases {
    fn create(&mut self, name: &str) -> Result<String, String> {
        let mut admin = PgConnection::establish(&self.admin).map_err(|e| e.to_string())?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .map_err(|e| e.to_string())?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .map_err(|e| e.to_string())?;
        self.names.push(name.to_owned());
        let url = format!("{}/{name}", self.base);
        diesel_inbox::migrate(&mut PgConnection::establish(&url).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        Ok(url)
    }
}

impl Drop for Databases {
    fn drop(&mut self) {
        if let Ok(mut admin) = PgConnection::establish(&self.admin) {
            for name in &self.names {
                let _ =
                    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
    }
}

/// Empties `url`'s outbox and fills it with `n` messages (a key each),
/// payloads `prefix:i`.
fn fill(url: &str, n: usize, prefix: &str) -> Result<(), String> {
    let mut conn = PgConnection::establish(url).map_err(|e| e.to_string())?;
    // One statement each: a multi-statement string runs as one
    // transaction, which VACUUM refuses.
    conn.batch_execute("DELETE FROM outbox_messages")
        .map_err(|e| e.to_string())?;
    conn.batch_execute("VACUUM outbox_messages")
        .map_err(|e| e.to_string())?;
    conn.transaction(|conn| {
        for i in 0..n {
            outbox::enqueue(
                conn,
                Outgoing::new("bench", format!("{prefix}:{i}")).ordering_key(&format!("k{i}")),
            )?;
        }
        Ok::<_, diesel_inbox::InboxError>(())
    })
    .map_err(|e| e.to_string())?;
    conn.batch_execute("ANALYZE outbox_messages")
        .map_err(|e| e.to_string())
}

pub fn run(args: &Args) -> Result<(), String> {
    let admin = std::env::var("INBOX_TEST_POSTGRES_URL")
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or("--tenants: INBOX_TEST_POSTGRES_URL is not set")?;
    let (base, _) = admin.rsplit_once('/').ok_or("a URL with a database")?;
    let mut dbs = Databases {
        admin: admin.clone(),
        base: base.to_owned(),
        names: Vec::new(),
    };
    let prefix = format!("tn_{}", run_id());
    let count = args.tenants_count;
    let total = args.tenants_messages.max(count);
    let each = total / count;
    let total = each * count;
    let one = dbs.create(&format!("{prefix}_one"))?;
    let mut list = Vec::new();
    for i in 0..count {
        list.push((
            format!("t{i:03}"),
            dbs.create(&format!("{prefix}_t{i:03}"))?,
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let one_pool: PgPool = Pool::builder(AsyncDieselConnectionManager::new(one.clone()))
        .max_size(2)
        .build()
        .map_err(|e| e.to_string())?;
    let single = Relay::new(one_pool, Taker::default());
    let tenants: Tenants<PgPool> = Tenants::list(list.clone()).max_connections(16).pool_size(1);
    let over = Relay::tenants(tenants.clone(), Taker::default());
    // The same, each tenant's turn one batch instead of the default's 4.
    let over_turn1 = Relay::tenants(tenants, Taker::default()).turn(1);
    let variants = ["one_database", "tenants", "tenants_turn1"];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..args.rounds {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            let published = match variants[i] {
                "one_database" => {
                    fill(&one, total, "one")?;
                    let began = Instant::now();
                    let report = runtime
                        .block_on(single.run_once())
                        .map_err(|e| e.to_string())?;
                    samples[i].push(report.published as f64 / began.elapsed().as_secs_f64());
                    report.published
                }
                variant => {
                    for (tenant, url) in &list {
                        fill(url, each, tenant)?;
                    }
                    let relay = match variant {
                        "tenants" => &over,
                        _ => &over_turn1,
                    };
                    let began = Instant::now();
                    let report = runtime
                        .block_on(relay.run_once())
                        .map_err(|e| e.to_string())?;
                    samples[i].push(report.published as f64 / began.elapsed().as_secs_f64());
                    report.published
                }
            };
            if published != total as u64 {
                return Err(format!("{} published {published} of {total}", variants[i]));
            }
        }
    }
    let rates: Vec<f64> = samples.iter_mut().map(|s| median(s)).collect();
    let ratio = rates[1] / rates[0];
    let ratio_turn1 = rates[2] / rates[0];
    println!(
        "tenants: one relay over {count} tenant databases: {:.0} msgs/s (turns of one batch: {:.0}); over one database: {:.0} msgs/s; ratio {ratio:.2} (turns of one batch: {ratio_turn1:.2}) ({total} messages, median of {} rounds)",
        rates[1], rates[2], rates[0], args.rounds
    );

    // Fairness: a trickle beside a backlog, against the trickle alone.
    let backlog = args.tenants_backlog;
    let big = list[0].1.clone();
    let small = list[1].1.clone();
    let pair: Tenants<PgPool> = Tenants::list([("big", big.clone()), ("small", small.clone())])
        .max_connections(4)
        .pool_size(1);
    let taker = Taker {
        seen: Arc::default(),
        watch: Some("small"),
    };
    let polled = Relay::tenants(pair, taker.clone())
        .poll_interval(Duration::from_millis(100))
        .listeners(0);
    // The same, listening on both databases (PostgreSQL's NOTIFY), within
    // a limit two connections higher.
    let pair_listened: Tenants<PgPool> =
        Tenants::list([("big", big.clone()), ("small", small.clone())])
            .max_connections(6)
            .pool_size(1);
    let listened = Relay::tenants(pair_listened, taker.clone())
        .poll_interval(Duration::from_millis(100))
        .listeners(2);
    let trickle = if args.smoke { 20 } else { 100 };
    let mut latency: Vec<(&str, Vec<f64>)> = vec![
        ("alone", Vec::new()),
        ("beside_backlog", Vec::new()),
        ("alone_listened", Vec::new()),
        ("beside_backlog_listened", Vec::new()),
    ];
    let rounds = args.rounds.clamp(1, 3);
    for round in 0..rounds {
        for k in 0..latency.len() {
            let i = (k + round) % latency.len();
            let relay = if i >= 2 { &listened } else { &polled };
            fill(&small, 0, "small")?;
            fill(&big, if i % 2 == 1 { backlog } else { 0 }, "big")?;
            taker.seen.lock().expect("not poisoned").clear();
            let mut conn = PgConnection::establish(&small).map_err(|e| e.to_string())?;
            let committed = runtime.block_on(async {
                let (stop, mut stopped) = tokio::sync::watch::channel(false);
                let run = relay.run(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                });
                let feed = async {
                    let mut committed = HashMap::new();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    for n in 0..trickle {
                        let payload = format!("small:{round}:{n}");
                        conn.transaction(|conn| {
                            outbox::enqueue(conn, Outgoing::new("bench", payload.as_str()))
                        })
                        .map_err(|e| e.to_string())?;
                        // The relay learns of it as a relay in another
                        // process would, without this process's wake-up.
                        committed.insert(payload, Instant::now());
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let waited = Instant::now();
                    while taker.seen.lock().expect("not poisoned").len() < trickle
                        && waited.elapsed() < Duration::from_secs(120)
                    {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    let _ = stop.send(true);
                    Ok::<_, String>(committed)
                };
                let (ran, committed) = tokio::join!(run, feed);
                ran.map_err(|e| e.to_string())?;
                committed
            })?;
            let seen = taker.seen.lock().expect("not poisoned").clone();
            if seen.len() < trickle {
                return Err(format!(
                    "{}: {} of {trickle} published",
                    latency[i].0,
                    seen.len()
                ));
            }
            for (payload, at) in &committed {
                if let Some(published) = seen.get(payload) {
                    latency[i]
                        .1
                        .push(published.saturating_duration_since(*at).as_secs_f64() * 1000.0);
                }
            }
        }
    }
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    };
    let mut figures = Vec::new();
    for (name, v) in &mut latency {
        let (p50, p99) = (pct(v, 0.5), pct(v, 0.99));
        println!("tenants: a trickle's commit-to-publish {name}: p50 {p50:.1} ms, p99 {p99:.1} ms");
        figures.push(format!(
            "\"{name}\": {{\"p50_ms\": {p50:.2}, \"p99_ms\": {p99:.2}}}"
        ));
    }
    let connections = connections_at_scale(&mut dbs, &prefix, args, &runtime)?;
    let json = format!(
        "{{\"tenants\": {count}, \"messages\": {total}, \"rounds\": {}, \"one_database_msgs_per_s\": {:.1}, \"tenants_msgs_per_s\": {:.1}, \"ratio\": {ratio:.3}, \"tenants_turn1_msgs_per_s\": {:.1}, \"ratio_turn1\": {ratio_turn1:.3}, \"backlog\": {backlog}, {}, \"connections\": {connections}}}\n",
        args.rounds,
        rates[0],
        rates[1],
        rates[2],
        figures.join(", ")
    );
    let dir = write_output("tenants.json", &json)?;
    println!("wrote {}/tenants.json", dir.display());
    Ok(())
}

/// The most connections the server saw the relay hold over
/// `--tenants-configured` tenants (a schema each) with
/// `--tenants-active` of them enqueueing, against its limit; as JSON.
fn connections_at_scale(
    dbs: &mut Databases,
    prefix: &str,
    args: &Args,
    runtime: &tokio::runtime::Runtime,
) -> Result<String, String> {
    const LIMIT: u32 = 16;
    let (configured, active) = (
        args.tenants_configured,
        args.tenants_active.min(args.tenants_configured),
    );
    let shared = dbs.create(&format!("{prefix}_schemas"))?;
    let mut admin = PgConnection::establish(&shared).map_err(|e| e.to_string())?;
    let made = Instant::now();
    let mut list = Vec::with_capacity(configured);
    for i in 0..configured {
        let schema = format!("s{i:04}");
        admin
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .map_err(|e| e.to_string())?;
        let url =
            format!("{shared}?options=-csearch_path%3D{schema}&application_name=tenant_relay");
        diesel_inbox::migrate(&mut PgConnection::establish(&url).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        list.push((schema, url));
    }
    println!(
        "tenants: {configured} tenant schemas made in {:.1} s",
        made.elapsed().as_secs_f64()
    );
    let tenants: Tenants<PgPool> = Tenants::list(list.clone())
        .max_connections(LIMIT)
        .pool_size(1)
        .idle_timeout(Duration::from_secs(2));
    let relay = Relay::tenants(tenants.clone(), Taker::default());
    let secs = if args.smoke { 3 } else { 20 };
    let (most, reserved, enqueued, published) = runtime.block_on(async {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let run = relay.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        });
        let watch = async {
            let mut feeders: Vec<PgConnection> = Vec::new();
            for (_, url) in list.iter().take(active) {
                // The feeders' connections are not the relay's.
                let url = url.replace("application_name=tenant_relay", "application_name=feeder");
                feeders.push(PgConnection::establish(&url).map_err(|e| e.to_string())?);
            }
            let began = Instant::now();
            let (mut most, mut reserved, mut enqueued) = (0i64, 0u32, 0u64);
            while began.elapsed() < Duration::from_secs(secs) {
                for conn in &mut feeders {
                    conn.transaction(|conn| {
                        outbox::enqueue(conn, Outgoing::new("bench", "x"))
                    })
                    .map_err(|e| e.to_string())?;
                    enqueued += 1;
                }
                #[derive(diesel::QueryableByName)]
                struct Count {
                    #[diesel(sql_type = diesel::sql_types::BigInt)]
                    n: i64,
                }
                let n = diesel::RunQueryDsl::get_result::<Count>(
                    diesel::sql_query("SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'tenant_relay'"),
                    &mut admin,
                )
                .map_err(|e| e.to_string())?
                .n;
                most = most.max(n);
                reserved = reserved.max(tenants.reserved_connections());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // What is left is published before the relay stops.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = stop.send(true);
            Ok::<_, String>((most, reserved, enqueued))
        };
        let (ran, watched) = tokio::join!(run, watch);
        let report = ran.map_err(|e| e.to_string())?;
        let (most, reserved, enqueued) = watched?;
        Ok::<_, String>((most, reserved, enqueued, report.published))
    })?;
    println!(
        "tenants: {configured} configured, {active} active: the relay held at most {most} server connections (the set reserved at most {reserved}; limit {LIMIT}); published {published} of {enqueued}"
    );
    Ok(format!(
        "{{\"configured\": {configured}, \"active\": {active}, \"limit\": {LIMIT}, \"server_most\": {most}, \"reserved_most\": {reserved}, \"enqueued\": {enqueued}, \"published\": {published}}}"
    ))
}
