//! The variants: the same business write with the inbox (`idempotent`,
//! `batch`, ...), without it (`bare`), with the inbox logic written by
//! hand (`raw_sql`) and the usual SELECT-then-INSERT (`naive`), each
//! generic over the [`Bench`] backend; and the measurement of one sample.

use crate::args::redelivers;
use crate::bench::Bench;
use crate::{Order, ORDERS_DDL};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_inbox::{idempotent, Processed, Stored};
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// The ratios reported for a sync cell (those whose variants it has).
pub const RATIOS: [(&str, &str); 13] = [
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
    ("connect_idempotent", "connect_raw_sql"),
    ("outbox", "outbox_by_hand"),
];

/// The ratios reported for an async cell.
pub const ASYNC_RATIOS: [(&str, &str); 5] = [
    ("async_idempotent", "async_bare"),
    ("async_idempotent", "async_raw_sql"),
    ("async_duplicate", "async_idempotent"),
    ("async_pipelined", "async_raw_sql"),
    ("async_one_hop", "async_raw_sql"),
];

/// `bare`: the business write in a plain transaction.
fn bare<B: Bench>(conn: &mut B::Conn, order: &Order) -> QueryResult<()> {
    B::tx(conn, |c| B::insert_order(c, order).map(drop))
}

/// `idempotent`: the same write in an `#[idempotent]` handler.
#[idempotent(key = "order.id", consumer = "bench", shared)]
pub fn idempotent<B: Bench>(conn: &mut B::Conn, order: &Order) -> QueryResult<()> {
    B::insert_order(conn, order).map(drop)
}

/// `fingerprinted`: `idempotent` with a fingerprint of the message's
/// content (its amount); `fingerprinted_duplicate` redelivers its keys
/// (the duplicate's row is read and checked).
#[idempotent(
    key = "order.id",
    consumer = "bench-fingerprinted",
    shared,
    fingerprint = "order.amount.to_be_bytes()"
)]
fn fingerprinted<B: Bench>(conn: &mut B::Conn, order: &Order) -> QueryResult<()> {
    B::insert_order(conn, order).map(drop)
}

/// `stored`: `idempotent` whose small value (an `i64`) is stored with the
/// inbox row (`store_result`).
#[idempotent(key = "order.id", consumer = "bench-stored", shared, store_result)]
fn stored<B: Bench>(conn: &mut B::Conn, order: &Order) -> QueryResult<i64> {
    B::insert_order(conn, order)?;
    Ok(order.amount)
}

/// `attempts`: `idempotent` with `max_attempts` (the claim reads the key's
/// failure count; none fail here).
#[idempotent(
    key = "order.id",
    consumer = "bench-attempts",
    shared,
    max_attempts = 5
)]
fn attempts<B: Bench>(conn: &mut B::Conn, order: &Order) -> QueryResult<()> {
    B::insert_order(conn, order).map(drop)
}

/// `outbox`: `idempotent`'s write and one outgoing message through
/// `outbox::enqueue` (a UUIDv7 id, the order as the ordering key).
#[idempotent(key = "order.id", consumer = "bench-outbox", shared)]
fn outbox<B: Bench>(conn: &mut B::Conn, order: &Order) -> QueryResult<()> {
    use diesel_inbox::outbox::{enqueue, Outgoing};
    B::insert_order(conn, order)?;
    let message = Outgoing::new("bench.stock", order.id.as_bytes()).ordering_key(&order.id);
    enqueue(conn, message)?;
    Ok(())
}

/// `outbox_by_hand`: the same, with the outbox row written by hand (a
/// UUIDv4 id, diesel's insert).
#[idempotent(key = "order.id", consumer = "bench-outbox-hand", shared)]
fn outbox_by_hand<B: Bench>(conn: &mut B::Conn, order: &Order) -> QueryResult<()> {
    B::insert_order(conn, order)?;
    let id = uuid::Uuid::new_v4().to_string();
    B::enqueue_by_hand(conn, &id, &order.id, order.id.as_bytes())?;
    Ok(())
}

/// `raw_sql`: the same inbox logic written by hand: one conflict-ignoring
/// insert, then the write if it inserted.
pub fn raw_sql<B: Bench>(conn: &mut B::Conn, order: &Order) -> QueryResult<()> {
    B::tx(conn, |c| {
        if B::claim_by_hand(c, "bench-raw", &order.id)? == 1 {
            B::insert_order(c, order)?;
        }
        Ok(())
    })
}

/// `naive`: SELECT the id, then INSERT it, in one transaction.
fn naive<B: Bench>(conn: &mut B::Conn, order: &Order) -> QueryResult<()> {
    B::tx(conn, |c| {
        if B::seen(c, "bench-naive", &order.id)? == 0 {
            B::record(c, "bench-naive", &order.id)?;
            B::insert_order(c, order)?;
        }
        Ok(())
    })
}

/// `batch`: one transaction and one claim per batch, one multi-row insert.
#[idempotent(
    batch = "orders",
    key = "|o| o.id.as_str()",
    consumer = "bench-batch",
    shared
)]
fn batch<B: Bench>(conn: &mut B::Conn, orders: &[Order]) -> QueryResult<usize> {
    B::insert_orders(conn, orders.iter().copied())
}

/// `batch_loop`: one transaction and one claim per batch, and the same
/// business work as `idempotent`: one insert per message.
#[idempotent(
    batch = "orders",
    key = "|o| o.id.as_str()",
    consumer = "bench-batch-loop",
    shared
)]
fn batch_loop<B: Bench>(conn: &mut B::Conn, orders: &[Order]) -> QueryResult<usize> {
    for o in &orders {
        B::insert_order(conn, o)?;
    }
    Ok(orders.len())
}

/// `bare_batch`: `batch`'s multi-row insert in a plain transaction,
/// without an inbox.
fn bare_batch<B: Bench>(conn: &mut B::Conn, orders: &[Order]) -> QueryResult<usize> {
    B::tx(conn, |c| B::insert_orders(c, orders.iter()))
}

/// The inbox tables and `bench_orders`.
pub fn setup<B: Bench>(url: &str) -> Result<(), String> {
    let mut conn = B::open(url);
    diesel_inbox::migrate(&mut conn).map_err(|e| e.to_string())?;
    conn.batch_execute(ORDERS_DDL).map_err(|e| e.to_string())
}

/// Whether the sync variants' keys are random UUIDv4 text (`--scale`)
/// rather than `{prefix}-{variant}-{thread}-{n}`.
pub static UUID_KEYS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

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

/// Runs `work(thread, connection)` on `threads` threads, each with its own
/// connection opened before the clock starts; returns the seconds taken.
pub fn timed<C: Send + 'static>(
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

/// `Ok` when a single delivery ended as `expected` (`Applied` when the
/// key is new, `Duplicate` when it is redelivered).
fn expect_single(key: &str, out: Processed<()>, duplicate_expected: bool) -> Result<(), String> {
    match (out, duplicate_expected) {
        (Processed::Applied(()), false) | (Processed::Duplicate, true) => Ok(()),
        (Processed::Duplicate, false) => Err(format!("{key} was a duplicate")),
        (Processed::Applied(()), true) => Err(format!("{key} was not a duplicate")),
    }
}

/// Runs one sync variant over `orders` on `conn`; the `connect_` variants
/// open a connection of `url` per message instead (the worst case of the
/// first claim's shape check: one catalog query on each).
fn run_variant<B: Bench>(
    url: &str,
    conn: &mut B::Conn,
    variant: &str,
    orders: &[Order],
    batch_size: usize,
) -> Result<(), String> {
    let err = |e: diesel::result::Error| format!("{variant}: {e}");
    let single = |conn: &mut B::Conn,
                  handler: fn(&mut B::Conn, &Order) -> QueryResult<Processed<()>>,
                  duplicate: bool| {
        orders
            .iter()
            .try_for_each(|o| expect_single(&o.id, handler(conn, o).map_err(err)?, duplicate))
    };
    let plain = |conn: &mut B::Conn, handler: fn(&mut B::Conn, &Order) -> QueryResult<()>| {
        orders
            .iter()
            .try_for_each(|o| handler(conn, o))
            .map_err(err)
    };
    match variant {
        "connect_idempotent" => orders.iter().try_for_each(|o| {
            expect_single(
                &o.id,
                idempotent::<B>(&mut B::open(url), o).map_err(err)?,
                false,
            )
        }),
        "connect_raw_sql" => orders
            .iter()
            .try_for_each(|o| raw_sql::<B>(&mut B::open(url), o))
            .map_err(err),
        "bare" => plain(conn, bare::<B>),
        "raw_sql" => plain(conn, raw_sql::<B>),
        "naive" => plain(conn, naive::<B>),
        "idempotent" => single(conn, idempotent::<B>, false),
        "duplicate" => single(conn, idempotent::<B>, true),
        "fingerprinted" => single(conn, fingerprinted::<B>, false),
        "fingerprinted_duplicate" => single(conn, fingerprinted::<B>, true),
        "attempts" => single(conn, attempts::<B>, false),
        "outbox" => single(conn, outbox::<B>, false),
        "outbox_by_hand" => single(conn, outbox_by_hand::<B>, false),
        "stored" => orders
            .iter()
            .try_for_each(|o| match stored::<B>(conn, o).map_err(err)? {
                Stored::Applied(amount) if amount == o.amount => Ok(()),
                other => Err(format!("{}: {other:?}", o.id)),
            }),
        "bare_batch" => orders
            .chunks(batch_size)
            .try_for_each(|chunk| bare_batch::<B>(conn, chunk).map(drop))
            .map_err(err),
        "batch" | "batch_loop" => orders.chunks(batch_size).try_for_each(|chunk| {
            let out = if variant == "batch" {
                batch::<B>(conn, chunk)
            } else {
                batch_loop::<B>(conn, chunk)
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
        }),
        other => Err(format!("unknown variant {other}")),
    }
}

/// Messages per second of one variant; `prefix` names the round
/// (`duplicate` redelivers that round's `idempotent` orders).
pub fn measure<B: Bench>(
    url: &str,
    variant: &'static str,
    threads: usize,
    messages: usize,
    batch_size: usize,
    prefix: &str,
) -> Result<f64, String> {
    let per_thread = messages / threads;
    let (url, prefix) = (url.to_string(), prefix.to_string());
    let opened = url.clone();
    let secs = timed(
        threads,
        || B::open(&opened),
        move |t, conn| {
            let key_variant = redelivers(variant).unwrap_or(variant);
            let orders = orders(&prefix, key_variant, t, per_thread);
            run_variant::<B>(&url, conn, variant, &orders, batch_size)
        },
    )?;
    Ok((per_thread * threads) as f64 / secs)
}

// ---- async handlers ---------------------------------------------------------
//
// The same business write through `async fn` handlers on diesel-async
// connections from a deadpool pool, with `--tasks` tasks on a multi-thread
// tokio runtime. Variants: `async_bare`, `async_idempotent`, `async_raw_sql`
// (the hand-written inbox: diesel-async's `transaction`, the claim, the
// write; on SQLite `BEGIN IMMEDIATE` instead, as the sync variants and the
// inbox take the write lock up front), `async_duplicate`; on SQLite
// `async_one_hop`: the sync `raw_sql` in one `spawn_blocking` (sync code,
// the ceiling of the wrapper); on PostgreSQL `async_pipelined`: `raw_sql`
// with BEGIN and the claim sent together (pipelined on one connection),
// outside diesel's transaction manager: an experiment, not something the
// library does.

#[cfg(feature = "async")]
pub const ASYNC_VARIANTS: [&str; 6] = [
    "async_bare",
    "async_idempotent",
    "async_raw_sql",
    "async_duplicate",
    "async_pipelined",
    "async_one_hop",
];

#[cfg(feature = "async")]
pub fn async_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// Runs `work(task, connection)` as one task per connection (taken from a
/// pool before the clock starts); returns the seconds taken.
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

/// `async_idempotent`: the write in an `#[idempotent]` `async fn`.
#[cfg(feature = "async")]
#[idempotent(key = "order.id", consumer = "bench-async", shared)]
async fn idempotent_async<B: Bench>(conn: &mut B::AsyncConn, order: &Order) -> QueryResult<()> {
    B::insert_order_async(conn, order).await.map(drop)
}

/// Whether `variant` runs on the backend.
#[cfg(feature = "async")]
pub fn has_async<B: Bench>(variant: &str) -> bool {
    B::EXTRA == Some(variant) || !["async_pipelined", "async_one_hop"].contains(&variant)
}

/// Messages per second of one async variant with `tasks` tasks.
#[cfg(feature = "async")]
pub fn measure_async<B: Bench>(
    url: &str,
    variant: &'static str,
    tasks: usize,
    messages: usize,
    prefix: &str,
) -> Result<f64, String> {
    let per_task = messages / tasks;
    let pool = B::pool(url, tasks);
    let conns = async_runtime().block_on(async {
        let mut conns = Vec::with_capacity(tasks);
        for _ in 0..tasks {
            conns.push(B::pooled(&pool).await?);
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
            let conn: &mut B::AsyncConn = &mut conn;
            let err = |e: diesel::result::Error| format!("{variant}: {e}");
            for o in &orders {
                match variant {
                    "async_bare" => B::bare_async(conn, o).await.map_err(err)?,
                    "async_raw_sql" => B::raw_sql_async(conn, o).await.map_err(err)?,
                    v if B::EXTRA == Some(v) => B::extra_async(conn, o).await.map_err(err)?,
                    "async_idempotent" | "async_duplicate" => expect_single(
                        &o.id,
                        idempotent_async::<B>(conn, o).await.map_err(err)?,
                        variant == "async_duplicate",
                    )?,
                    other => return Err(format!("unknown variant {other}")),
                }
            }
            Ok(())
        }
    })?;
    Ok((per_task * tasks) as f64 / secs)
}
