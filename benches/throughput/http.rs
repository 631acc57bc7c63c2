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
//!   (untimed), so every request is answered from the stored response.
//!
//! `--http-conns` client tasks share one reqwest client (keep-alive: one
//! connection each) and send requests back to back for `--min-secs`; the
//! variants run interleaved, their order rotating each round; each
//! reports its median requests/s over `--rounds`. Then `--http-storms`
//! storms: 100 requests with one new key sent at once (each on a
//! connection of its own), the replays' latencies gathered over all storms
//! (p50, p99, max).

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
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::http::{IdempotencyKey, Idempotent};
use diesel_inbox::InboxError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const VARIANTS: [&str; 4] = ["plain", "inbox", "idempotent", "replay"];
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
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(url);
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
    let inbox_rate = median("inbox");
    println!(
        "http postgres, {} connections, {} rounds: plain {plain_rate:.0}/s, inbox {inbox_rate:.0}/s ({:.2}), idempotent {idem_rate:.0}/s (ratio {:.2}), replay {replay_rate:.0}/s ({:.2}x idempotent)",
        args.http_conns,
        args.rounds,
        inbox_rate / plain_rate,
        idem_rate / plain_rate,
        replay_rate / idem_rate
    );

    // Storms: 100 concurrent requests with one new key.
    let mut replays = Vec::new();
    let mut applied_once = true;
    for storm in 0..args.http_storms {
        let key = format!("{run}-storm{storm}");
        let handles: Vec<_> = (0..100)
            .map(|_| {
                // A connection each: the storm arrives at once.
                let client = reqwest::Client::new();
                let (base, key) = (base.clone(), key.clone());
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
        let mut fresh = 0;
        for handle in handles {
            let (latency, replayed) = handle.await.map_err(|e| e.to_string())??;
            match replayed {
                true => replays.push(latency),
                false => fresh += 1,
            }
        }
        applied_once &= fresh == 1;
    }
    if !applied_once {
        return Err("a storm applied its key more than once".into());
    }
    replays.sort();
    let at = |q: f64| replays[((replays.len() as f64 * q) as usize).min(replays.len() - 1)];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (p50, p99, max) = (
        ms(at(0.50)),
        ms(at(0.99)),
        ms(*replays.last().expect("replays")),
    );
    println!(
        "http postgres storms: {} x 100 concurrent requests with one key: {} replays, p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms",
        args.http_storms,
        replays.len()
    );
    let json = format!(
        "{{\"backend\":\"postgres\",\"connections\":{},\"rounds\":{},\"min_secs\":{},\"plain\":{plain_rate:.1},\"inbox\":{inbox_rate:.1},\"idempotent\":{idem_rate:.1},\"replay\":{replay_rate:.1},\"ratio\":{:.3},\"replay_ratio\":{:.3},\"storms\":{},\"storm_replays\":{},\"storm_p50_ms\":{p50:.2},\"storm_p99_ms\":{p99:.2},\"storm_max_ms\":{max:.2}}}\n",
        args.http_conns,
        args.rounds,
        args.min_secs,
        idem_rate / plain_rate,
        replay_rate / idem_rate,
        args.http_storms,
        replays.len()
    );
    let dir = write_output("http.json", &json)?;
    println!("wrote {}", dir.join("http.json").display());
    Ok(())
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
