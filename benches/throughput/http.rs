//! `--http`: the HTTP front door on PostgreSQL, over TCP.
//!
//! An axum application in this process (a multi-thread runtime, a
//! deadpool pool of `--http-conns` connections) with three endpoints that
//! write the same row:
//! - `plain`: `POST /plain`, the insert in a diesel-async transaction;
//! - `idempotent`: `POST /idempotent`, the insert through
//!   `Idempotent::run_async` with a fingerprint, a new key per request;
//! - `inbox`: `POST /inbox`, the insert through `Inbox::run_async` with
//!   the key (no stored response, no fingerprint, no wait bound): what
//!   the claim alone costs, against what the front door adds;
//! - `replay`: `POST /idempotent` with keys applied before the round
//!   (untimed), so every request is answered from the stored response;
//! - `hand`: `POST /hand`, a hand-written endpoint with the same
//!   guarantees (diesel DSL, its statements cached): the stored response
//!   read first (a replay or `422` at once), else in a transaction the
//!   wait bound (`SET LOCAL lock_timeout`), the claim (`ON CONFLICT DO
//!   NOTHING`; a duplicate reads the row and replays), the insert, the
//!   response's `UPDATE`, `COMMIT`.
//!
//! The pool recycles connections the way a production pool should
//! (`RecyclingMethod::Fast`: no `SELECT 1` per checkout).
//!
//! `--http-conns` client tasks share one reqwest client (keep-alive: one
//! connection each) and send requests back to back for `--min-secs`; the
//! variants run interleaved, their order rotating each round; each
//! reports its median requests/s over `--rounds`. Then `--http-storms`
//! pairs of storms, each 100 requests with one key sent at once (each on
//! a connection of its own): first with a new key (one applies, the
//! others wait on its claim and replay), then with the same key,
//! committed (every request a replay, answered by the replay's read);
//! each kind's replay latencies gathered over all storms (p50, p99, max).

use crate::args::Args;
use crate::output::write_output;
use crate::run_id;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use diesel::sql_types::{BigInt, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::http::{IdempotencyKey, Idempotent};
use diesel_inbox::InboxError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const VARIANTS: [&str; 5] = ["plain", "inbox", "idempotent", "replay", "hand"];
const INSERT: &str = "INSERT INTO bench_http (id, amount) VALUES ($1, $2)";

struct App {
    pool: Pool<AsyncPgConnection>,
}

#[derive(serde::Deserialize, serde::Serialize)]
struct Order {
    id: String,
    amount: i64,
}

/// The bench's error: every failure is a 500 (none is expected).
#[derive(Debug)]
struct Failed(String);

impl From<InboxError> for Failed {
    fn from(e: InboxError) -> Self {
        Failed(e.to_string())
    }
}

impl From<diesel::result::Error> for Failed {
    fn from(e: diesel::result::Error) -> Self {
        Failed(e.to_string())
    }
}

impl IntoResponse for Failed {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.0).into_response()
    }
}

async fn insert(conn: &mut AsyncPgConnection, order: &Order) -> Result<(), Failed> {
    diesel::sql_query(INSERT)
        .bind::<Text, _>(&order.id)
        .bind::<BigInt, _>(order.amount)
        .execute(conn)
        .await?;
    Ok(())
}

async fn plain(State(app): State<Arc<App>>, Json(order): Json<Order>) -> Result<Response, Failed> {
    let mut conn = app.pool.get().await.map_err(|e| Failed(e.to_string()))?;
    let order = &order;
    conn.transaction(async |c| insert(c, order).await).await?;
    Ok((StatusCode::CREATED, Json(order)).into_response())
}

async fn inbox(
    State(app): State<Arc<App>>,
    key: IdempotencyKey,
    Json(order): Json<Order>,
) -> Result<Response, Failed> {
    let mut conn = app.pool.get().await.map_err(|e| Failed(e.to_string()))?;
    let order = &order;
    let outcome = diesel_inbox::Inbox::consumer("http:bench-inbox")
        .run_async(
            &mut *conn,
            key.as_str(),
            async |conn: &mut AsyncPgConnection| insert(conn, order).await,
        )
        .await?;
    match outcome {
        diesel_inbox::Processed::Applied(()) => {
            Ok((StatusCode::CREATED, Json(order)).into_response())
        }
        diesel_inbox::Processed::Duplicate => Err(Failed("every key is new".into())),
    }
}

async fn idempotent(
    State(app): State<Arc<App>>,
    key: IdempotencyKey,
    Json(order): Json<Order>,
) -> Result<Response, Failed> {
    let mut conn = app.pool.get().await.map_err(|e| Failed(e.to_string()))?;
    Idempotent::new("bench", "bench-user", &key)
        .fingerprint(&order)
        .run_async(&mut *conn, async |conn: &mut AsyncPgConnection| {
            insert(conn, &order).await?;
            Ok::<_, Failed>((StatusCode::CREATED, Json(&order)).into_response())
        })
        .await
}

/// The hand-written endpoint's answer from a stored row: its response,
/// or `422` for other content.
fn hand_stored(stored: Vec<u8>, fingerprint: Option<Vec<u8>>, expected: &[u8]) -> Response {
    match fingerprint.as_deref() {
        Some(f) if f != expected => StatusCode::UNPROCESSABLE_ENTITY.into_response(),
        _ => (
            StatusCode::CREATED,
            [
                ("idempotent-replayed", "true"),
                ("content-type", "application/json"),
            ],
            stored,
        )
            .into_response(),
    }
}

/// A stored row as the hand-written endpoint reads it: fingerprint, response.
type StoredRow = (Option<Vec<u8>>, Option<Vec<u8>>);

async fn hand(
    State(app): State<Arc<App>>,
    key: IdempotencyKey,
    Json(order): Json<Order>,
) -> Result<Response, Failed> {
    use diesel::{ExpressionMethods, OptionalExtension, QueryDsl};
    use diesel_inbox::inbox_messages::dsl as inbox;
    const CONSUMER: &str = "http:bench-hand";
    let mut conn = app.pool.get().await.map_err(|e| Failed(e.to_string()))?;
    let id = diesel_inbox::http::message_id("bench-user", &key);
    let fingerprint = diesel_inbox::Fingerprint::of_serialize(&order)
        .map_err(|e| Failed(e.to_string()))?
        .as_bytes()
        .to_vec();
    let row = |id: String| {
        inbox::inbox_messages
            .filter(inbox::consumer.eq(CONSUMER))
            .filter(inbox::message_id.eq(id))
            .select((inbox::fingerprint, inbox::stored_result))
    };
    let stored: Option<StoredRow> = row(id.clone())
        .filter(inbox::stored_result.is_not_null())
        .first(&mut *conn)
        .await
        .optional()?;
    if let Some((f, Some(stored))) = stored {
        return Ok(hand_stored(stored, f, &fingerprint));
    }
    let (order, fingerprint) = (&order, &fingerprint);
    conn.transaction(async |c| {
        c.batch_execute("SET LOCAL lock_timeout = '5s'").await?;
        let claimed = diesel::insert_into(inbox::inbox_messages)
            .values((
                inbox::consumer.eq(CONSUMER),
                inbox::message_id.eq(&id),
                inbox::fingerprint.eq(fingerprint),
            ))
            .on_conflict_do_nothing()
            .execute(c)
            .await?;
        if claimed == 0 {
            let (f, stored): StoredRow = row(id.clone()).first(c).await?;
            let stored = stored.ok_or_else(|| Failed("a row without a response".into()))?;
            return Ok(hand_stored(stored, f, fingerprint));
        }
        insert(c, order).await?;
        let body = serde_json::to_vec(order).map_err(|e| Failed(e.to_string()))?;
        diesel::update(inbox::inbox_messages)
            .filter(inbox::consumer.eq(CONSUMER))
            .filter(inbox::message_id.eq(&id))
            .set(inbox::stored_result.eq(&body))
            .execute(c)
            .await?;
        Ok::<_, Failed>(
            (
                StatusCode::CREATED,
                [("content-type", "application/json")],
                body,
            )
                .into_response(),
        )
    })
    .await
}

pub fn run(args: &Args) -> Result<(), String> {
    let url = std::env::var("INBOX_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or("--http: INBOX_TEST_POSTGRES_URL is not set")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(measure(args, url))
}

async fn measure(args: &Args, url: String) -> Result<(), String> {
    let mut config = ManagerConfig::default();
    config.recycling_method = RecyclingMethod::Fast;
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(url, config);
    let pool = Pool::builder(manager)
        .max_size(args.http_conns)
        .build()
        .map_err(|e| e.to_string())?;
    {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        diesel_inbox::migrate_async(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
        conn.batch_execute(
            "DROP TABLE IF EXISTS bench_http; \
             CREATE TABLE bench_http (id TEXT PRIMARY KEY, amount BIGINT NOT NULL); \
             DELETE FROM inbox_messages WHERE consumer = 'http:bench'",
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    let app = Router::new()
        .route("/plain", post(plain))
        .route("/idempotent", post(idempotent))
        .route("/inbox", post(inbox))
        .route("/hand", post(hand))
        .with_state(Arc::new(App { pool }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let base = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    tokio::spawn(async move { axum::serve(listener, app).await });

    let run = run_id();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.http_conns)
        .build()
        .map_err(|e| e.to_string())?;
    let mut samples: Vec<(&str, Vec<f64>)> = VARIANTS.iter().map(|v| (*v, Vec::new())).collect();
    let mut next = 0u64;
    for round in 0..args.rounds {
        // Replays of keys applied before the round.
        let applied: Vec<String> = (0..args.http_conns * 4)
            .map(|i| format!("{run}-r{round}-{i}"))
            .collect();
        for key in &applied {
            send(&client, &base, "idempotent", Some(key), key).await?;
        }
        for i in 0..VARIANTS.len() {
            let variant = VARIANTS[(i + round) % VARIANTS.len()];
            let rate = load(&client, &base, variant, args, &run, &mut next, &applied).await?;
            samples
                .iter_mut()
                .find(|(v, _)| *v == variant)
                .expect("a variant")
                .1
                .push(rate);
        }
    }
    let median = |v: &str| {
        let mut s = samples
            .iter()
            .find(|(n, _)| *n == v)
            .expect("a variant")
            .1
            .clone();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    let (plain_rate, idem_rate, replay_rate) =
        (median("plain"), median("idempotent"), median("replay"));
    let (inbox_rate, hand_rate) = (median("inbox"), median("hand"));
    println!(
        "http postgres, {} connections, {} rounds: plain {plain_rate:.0}/s, inbox {inbox_rate:.0}/s ({:.2}), idempotent {idem_rate:.0}/s (ratio {:.2}), replay {replay_rate:.0}/s ({:.2}x idempotent), hand-written {hand_rate:.0}/s (idempotent / hand {:.2})",
        args.http_conns,
        args.rounds,
        inbox_rate / plain_rate,
        idem_rate / plain_rate,
        replay_rate / idem_rate,
        idem_rate / hand_rate
    );
    for (name, rounds) in &samples {
        let rounds: Vec<String> = rounds.iter().map(|r| format!("{r:.0}")).collect();
        println!("  {name}: {}", rounds.join(", "));
    }

    // Storms: 100 concurrent requests with one new key (one applies, the
    // others wait on its claim, then replay), then 100 more with the same
    // key, now committed (every one a replay: the storm).
    let (mut in_flight, mut committed) = (Vec::new(), Vec::new());
    for storm in 0..args.http_storms {
        let key = format!("{run}-storm{storm}");
        let (replays, fresh) = storm_of(&base, &key).await?;
        if fresh != 1 {
            return Err(format!("a storm applied its key {fresh} times"));
        }
        in_flight.extend(replays);
        let (replays, fresh) = storm_of(&base, &key).await?;
        if fresh != 0 {
            return Err(format!("a committed key was applied again {fresh} times"));
        }
        committed.extend(replays);
    }
    let (c50, c99, cmax) = quantiles(&mut committed);
    let (f50, f99, fmax) = quantiles(&mut in_flight);
    println!(
        "http postgres storms: {} x 100 concurrent retries of a committed key: {} replays, p50 {c50:.1} ms, p99 {c99:.1} ms, max {cmax:.1} ms",
        args.http_storms,
        committed.len()
    );
    println!(
        "http postgres storms: {} x 100 concurrent requests with a new key (one applies): {} replays, p50 {f50:.1} ms, p99 {f99:.1} ms, max {fmax:.1} ms",
        args.http_storms,
        in_flight.len()
    );
    let json = format!(
        "{{\"backend\":\"postgres\",\"connections\":{},\"rounds\":{},\"min_secs\":{},\"plain\":{plain_rate:.1},\"inbox\":{inbox_rate:.1},\"idempotent\":{idem_rate:.1},\"replay\":{replay_rate:.1},\"hand\":{hand_rate:.1},\"ratio\":{:.3},\"replay_ratio\":{:.3},\"storms\":{},\"storm_replays\":{},\"storm_p50_ms\":{c50:.2},\"storm_p99_ms\":{c99:.2},\"storm_max_ms\":{cmax:.2},\"in_flight_replays\":{},\"in_flight_p50_ms\":{f50:.2},\"in_flight_p99_ms\":{f99:.2},\"in_flight_max_ms\":{fmax:.2}}}\n",
        args.http_conns,
        args.rounds,
        args.min_secs,
        idem_rate / plain_rate,
        replay_rate / idem_rate,
        args.http_storms,
        committed.len(),
        in_flight.len()
    );
    let dir = write_output("http.json", &json)?;
    println!("wrote {}", dir.join("http.json").display());
    Ok(())
}

/// 100 requests with `key` sent at once, each on a connection of its own:
/// the replays' latencies, and how many were applied.
async fn storm_of(base: &str, key: &str) -> Result<(Vec<Duration>, usize), String> {
    let handles: Vec<_> = (0..100)
        .map(|_| {
            let client = reqwest::Client::new();
            let (base, key) = (base.to_owned(), key.to_owned());
            tokio::spawn(async move {
                let started = Instant::now();
                let headers = send(&client, &base, "idempotent", Some(&key), &key).await?;
                Ok::<_, String>((
                    started.elapsed(),
                    headers.contains_key("idempotent-replayed"),
                ))
            })
        })
        .collect();
    let (mut replays, mut fresh) = (Vec::new(), 0);
    for handle in handles {
        match handle.await.map_err(|e| e.to_string())?? {
            (latency, true) => replays.push(latency),
            (_, false) => fresh += 1,
        }
    }
    Ok((replays, fresh))
}

/// p50, p99 and max of `latencies`, in milliseconds (0 if none).
fn quantiles(latencies: &mut [Duration]) -> (f64, f64, f64) {
    if latencies.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (
        ms(at(0.50)),
        ms(at(0.99)),
        ms(latencies[latencies.len() - 1]),
    )
}

/// Requests/s of `variant` from `--http-conns` tasks for `--min-secs`
/// (at least one request each).
async fn load(
    client: &reqwest::Client,
    base: &str,
    variant: &str,
    args: &Args,
    run: &str,
    next: &mut u64,
    applied: &[String],
) -> Result<f64, String> {
    let counter = Arc::new(AtomicU64::new(*next));
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(args.min_secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.http_conns)
        .map(|task| {
            let (client, base, run) = (client.clone(), base.to_owned(), run.to_owned());
            let (counter, done, variant) = (counter.clone(), done.clone(), variant.to_owned());
            let applied = applied.to_vec();
            tokio::spawn(async move {
                let mut i = 0usize;
                loop {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let (path, key) = match variant.as_str() {
                        "plain" => ("plain", None),
                        "inbox" => ("inbox", Some(format!("{run}-i{n}"))),
                        "idempotent" => ("idempotent", Some(format!("{run}-{n}"))),
                        "hand" => ("hand", Some(format!("{run}-h{n}"))),
                        _ => (
                            "idempotent",
                            Some(applied[(task + i * 7) % applied.len()].clone()),
                        ),
                    };
                    let id = match &key {
                        Some(key) if variant == "replay" => key.clone(),
                        _ => format!("{run}-p{n}"),
                    };
                    send(&client, &base, path, key.as_deref(), &id).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                    if Instant::now() >= until {
                        return Ok::<_, String>(());
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    *next = AtomicU64::load(&counter, Ordering::Relaxed);
    Ok(AtomicU64::load(&done, Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// One request; its headers, or an error for an unexpected status.
async fn send(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    key: Option<&str>,
    id: &str,
) -> Result<HeaderMap, String> {
    let mut request = client
        .post(format!("{base}/{path}"))
        .header("content-type", "application/json")
        .body(format!("{{\"id\":\"{id}\",\"amount\":7}}"));
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await.map_err(|e| e.to_string())?;
    match status.as_u16() {
        201 => Ok(headers),
        other => Err(format!(
            "{path}: {other} {}",
            String::from_utf8_lossy(&body)
        )),
    }
}
