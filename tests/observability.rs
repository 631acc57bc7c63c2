//! What a handled message emits: the `diesel_inbox.handle` span with its
//! fields (captured by a test subscriber), and with the `metrics` feature
//! the counters and the histogram (captured by `metrics-util`'s debugging
//! recorder). Sync and async handlers on SQLite: the engine that emits them
//! is the same for every backend.
#![cfg(feature = "sqlite")]

use diesel::prelude::*;
use diesel_inbox::{idempotent, InboxError, Processed, RetryableError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// A closed span: its name and fields; or an event: the span it was in.
#[derive(Debug, Clone)]
enum Seen {
    Span {
        name: String,
        fields: BTreeMap<String, String>,
    },
    Event {
        message: String,
        in_span: Option<String>,
    },
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Seen>>>);

struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_string(),
            format!("{value:?}").trim_matches('"').to_string(),
        );
    }
}

impl<S> Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        attrs.record(&mut fields);
        ctx.span(id)
            .expect("the new span")
            .extensions_mut()
            .insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a span");
        let mut extensions = span.extensions_mut();
        values.record(extensions.get_mut::<Fields>().expect("its fields"));
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        event.record(&mut fields);
        self.0.lock().expect("capture").push(Seen::Event {
            message: fields.0.remove("message").unwrap_or_default(),
            in_span: ctx.event_span(event).map(|s| s.name().to_string()),
        });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).expect("a span");
        let fields = span
            .extensions()
            .get::<Fields>()
            .map(|f| f.0.clone())
            .unwrap_or_default();
        self.0.lock().expect("capture").push(Seen::Span {
            name: span.name().to_string(),
            fields,
        });
    }
}

impl Capture {
    /// The fields of the closed `diesel_inbox.handle` spans, in order.
    fn handles(&self) -> Vec<BTreeMap<String, String>> {
        self.0
            .lock()
            .expect("capture")
            .iter()
            .filter_map(|seen| match seen {
                Seen::Span { name, fields } if name == "diesel_inbox.handle" => {
                    Some(fields.clone())
                }
                _ => None,
            })
            .collect()
    }

    fn event_span(&self, message: &str) -> Option<String> {
        self.0
            .lock()
            .expect("capture")
            .iter()
            .find_map(|seen| match seen {
                Seen::Event {
                    message: m,
                    in_span,
                } if m == message => in_span.clone(),
                _ => None,
            })
    }
}

#[derive(Debug)]
#[allow(dead_code)] // read through Debug
enum AppError {
    Db(diesel::result::Error),
    Inbox(InboxError),
    Busy,
    Rejected,
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}

impl From<InboxError> for AppError {
    fn from(e: InboxError) -> Self {
        AppError::Inbox(e)
    }
}

impl RetryableError for AppError {
    fn is_retryable(&self) -> bool {
        matches!(self, AppError::Busy)
    }
}

/// Applies; fails with `Rejected` for "bad"; fails retryably on its first
/// attempt for keys starting with "flaky".
#[idempotent(key = "key", consumer = "observed", shared)]
fn observed(conn: &mut SqliteConnection, key: &str, attempts: &Mutex<u32>) -> Result<(), AppError> {
    let _ = conn;
    tracing::info!("inside the body");
    let mut n = attempts.lock().expect("attempts");
    *n += 1;
    match key {
        "bad" => Err(AppError::Rejected),
        k if k.starts_with("flaky") && *n == 1 => Err(AppError::Busy),
        _ => Ok(()),
    }
}

fn connection() -> SqliteConnection {
    let mut conn = SqliteConnection::establish(":memory:").expect("sqlite");
    diesel_inbox::migrate(&mut conn).expect("migrate");
    conn
}

fn deliver_all(conn: &mut SqliteConnection) -> Vec<String> {
    ["k1", "k1", "bad", "flaky-1"]
        .iter()
        .map(|key| {
            let attempts = Mutex::new(0);
            match observed(conn, key, &attempts) {
                Ok(Processed::Applied(())) => "applied",
                Ok(Processed::Duplicate) => "duplicate",
                Err(_) => "error",
            }
            .to_string()
        })
        .collect()
}

fn check_spans(capture: &Capture) {
    let spans = capture.handles();
    let summary: Vec<(&str, &str, &str, &str)> = spans
        .iter()
        .map(|f| {
            (
                f["consumer"].as_str(),
                f["key"].as_str(),
                f["outcome"].as_str(),
                f["attempts"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("observed", "k1", "applied", "1"),
            ("observed", "k1", "duplicate", "1"),
            ("observed", "bad", "error", "1"),
            ("observed", "flaky-1", "applied", "2"),
        ]
    );
    for fields in &spans {
        let ms: f64 = fields["duration_ms"].parse().expect("a duration in ms");
        assert!((0.0..60_000.0).contains(&ms), "{ms}");
    }
    // The body's own events are inside the handler's span.
    assert_eq!(
        capture.event_span("inside the body").as_deref(),
        Some("diesel_inbox.handle")
    );
}

#[test]
fn a_span_per_handled_message_with_its_outcome_attempts_and_duration() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let outcomes = tracing::subscriber::with_default(subscriber, || deliver_all(&mut connection()));
    assert_eq!(outcomes, ["applied", "duplicate", "error", "applied"]);
    check_spans(&capture);
}

#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use diesel_async::AsyncConnection;

    type Conn = SyncConnectionWrapper<SqliteConnection>;

    #[idempotent(key = "key", consumer = "observed", shared)]
    async fn observed_async(
        conn: &mut Conn,
        key: &str,
        attempts: &Mutex<u32>,
    ) -> Result<(), AppError> {
        let _ = conn;
        tracing::info!("inside the body");
        let n = {
            let mut n = attempts.lock().expect("attempts");
            *n += 1;
            *n
        };
        match key {
            "bad" => Err(AppError::Rejected),
            k if k.starts_with("flaky") && n == 1 => Err(AppError::Busy),
            _ => Ok(()),
        }
    }

    #[test]
    fn async_handlers_emit_the_same_span() {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry().with(capture.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let outcomes = tracing::subscriber::with_default(subscriber, || {
            runtime.block_on(async {
                let mut conn = Conn::establish(":memory:").await.expect("sqlite");
                diesel_inbox::migrate_async(&mut conn)
                    .await
                    .expect("migrate");
                let mut outcomes = Vec::new();
                for key in ["k1", "k1", "bad", "flaky-1"] {
                    let attempts = Mutex::new(0);
                    outcomes.push(match observed_async(&mut conn, key, &attempts).await {
                        Ok(Processed::Applied(())) => "applied",
                        Ok(Processed::Duplicate) => "duplicate",
                        Err(_) => "error",
                    });
                }
                outcomes
            })
        });
        assert_eq!(outcomes, ["applied", "duplicate", "error", "applied"]);
        check_spans(&capture);
    }
}

#[cfg(feature = "metrics")]
#[test]
fn metrics_count_outcomes_retries_durations_and_purged_rows() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use metrics_util::MetricKind;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let mut conn = connection();
        deliver_all(&mut conn);
        // Two of the rows, backdated, then purged.
        diesel::connection::SimpleConnection::batch_execute(
            &mut conn,
            "UPDATE inbox_messages SET received_at = datetime('now', '-2 days')",
        )
        .expect("backdate");
        let report = diesel_inbox::Purge::new(std::time::Duration::from_secs(86_400))
            .consumer("observed")
            .run(&mut conn)
            .expect("purge");
        assert_eq!(report.rows, 2);
    });

    let mut seen: BTreeMap<String, f64> = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{} {}", key.name(), labels.join(","));
        let value = match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => n as f64,
            (MetricKind::Histogram, DebugValue::Histogram(samples)) => {
                assert!(samples.iter().all(|s| s.into_inner() >= 0.0));
                samples.len() as f64
            }
            other => panic!("unexpected metric {name}: {other:?}"),
        };
        seen.insert(name, value);
    }
    let group = "messaging.consumer.group.name=observed";
    let expected = [
        (
            format!("messaging.client.consumed.messages {group},diesel_inbox.outcome=applied"),
            2.0,
        ),
        (
            format!("messaging.client.consumed.messages {group},diesel_inbox.outcome=duplicate"),
            1.0,
        ),
        (
            format!("messaging.client.consumed.messages {group},diesel_inbox.outcome=error"),
            1.0,
        ),
        (
            format!("messaging.process.duration {group},diesel_inbox.outcome=applied"),
            2.0,
        ),
        (
            format!("messaging.process.duration {group},diesel_inbox.outcome=duplicate"),
            1.0,
        ),
        (
            format!("messaging.process.duration {group},diesel_inbox.outcome=error"),
            1.0,
        ),
        (format!("diesel_inbox.retries {group}"), 1.0),
        (format!("diesel_inbox.purged.rows {group}"), 2.0),
    ];
    for (name, value) in expected {
        assert_eq!(seen.get(&name), Some(&value), "{name} in {seen:#?}");
    }
    assert_eq!(seen.len(), 8, "{seen:#?}");
}

/// One event: its target, level, message and fields.
#[derive(Debug, Clone)]
struct Logged {
    target: String,
    level: tracing::Level,
    message: String,
    fields: BTreeMap<String, String>,
}

/// Every event, and the target of every span.
#[derive(Clone, Default)]
struct Log {
    events: Arc<Mutex<Vec<Logged>>>,
    span_targets: Arc<Mutex<Vec<(String, String)>>>,
}

impl<S: tracing::Subscriber> Layer<S> for Log {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let meta = attrs.metadata();
        self.span_targets
            .lock()
            .expect("log")
            .push((meta.name().to_string(), meta.target().to_string()));
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        event.record(&mut fields);
        self.events.lock().expect("log").push(Logged {
            target: event.metadata().target().to_string(),
            level: *event.metadata().level(),
            message: fields.0.remove("message").unwrap_or_default(),
            fields: fields.0,
        });
    }
}

/// Fails with `Rejected` for "bad"; fails retryably every time for
/// "busy"; counts failures (`max_attempts = 1`) and checks a fingerprint.
#[idempotent(
    key = "key",
    consumer = "logged",
    fingerprint = "amount.to_be_bytes()",
    max_attempts = 1,
    retries = 1
)]
fn logged(conn: &mut SqliteConnection, key: &str, amount: i64) -> Result<(), AppError> {
    let _ = (conn, amount);
    match key {
        "bad" => Err(AppError::Rejected),
        "busy" => Err(AppError::Busy),
        _ => Ok(()),
    }
}

/// The library logs under the target `diesel_inbox` only: DEBUG for an
/// applied and a duplicate delivery, WARN with the error's text for a
/// body's failure, a retried-out transient failure, `KeyReused` and
/// `AttemptsExhausted`; the span of a failed call records the error.
#[test]
fn events_use_the_target_diesel_inbox_with_their_levels() {
    let log = Log::default();
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry()
        .with(log.clone())
        .with(capture.clone());
    tracing::subscriber::with_default(subscriber, || {
        let mut conn = connection();
        assert!(matches!(
            logged(&mut conn, "k1", 1),
            Ok(Processed::Applied(()))
        ));
        assert!(matches!(
            logged(&mut conn, "k1", 1),
            Ok(Processed::Duplicate)
        ));
        assert!(logged(&mut conn, "k1", 2).is_err(), "the key reused");
        assert!(logged(&mut conn, "bad", 1).is_err(), "the body fails");
        assert!(logged(&mut conn, "bad", 1).is_err(), "attempts exhausted");
        assert!(logged(&mut conn, "busy", 1).is_err(), "retries exhausted");
    });

    let events = log.events.lock().expect("log").clone();
    let ours: Vec<&Logged> = events
        .iter()
        .filter(|e| e.message.starts_with("diesel-inbox"))
        .collect();
    for event in &ours {
        assert_eq!(event.target, "diesel_inbox", "{event:?}");
    }
    for (name, target) in log.span_targets.lock().expect("log").iter() {
        assert_eq!(target, "diesel_inbox", "span {name}");
    }
    let ends: Vec<(tracing::Level, &str, &str, &str)> = ours
        .iter()
        .filter(|e| e.level != tracing::Level::DEBUG || !e.message.contains("transient"))
        .map(|e| {
            (
                e.level,
                e.message.as_str(),
                e.fields["key"].as_str(),
                e.fields.get("error").map_or("", String::as_str),
            )
        })
        .collect();
    let expected: [(tracing::Level, &str, &str, &str); 6] = [
        (tracing::Level::DEBUG, "diesel-inbox: applied", "k1", ""),
        (tracing::Level::DEBUG, "diesel-inbox: duplicate", "k1", ""),
        (
            tracing::Level::WARN,
            "diesel-inbox: the call failed",
            "k1",
            "KeyReused",
        ),
        (
            tracing::Level::WARN,
            "diesel-inbox: the call failed",
            "bad",
            "Rejected",
        ),
        (
            tracing::Level::WARN,
            "diesel-inbox: the call failed",
            "bad",
            "AttemptsExhausted",
        ),
        (
            tracing::Level::WARN,
            "diesel-inbox: the call failed",
            "busy",
            "Busy",
        ),
    ];
    assert_eq!(ends.len(), expected.len(), "{ends:#?}");
    for (got, want) in ends.iter().zip(expected) {
        assert_eq!((got.0, got.1, got.2), (want.0, want.1, want.2), "{got:?}");
        assert!(got.3.contains(want.3), "{got:?} lacks {:?}", want.3);
    }
    // The busy call was retried once (DEBUG), then gave up.
    assert!(
        ours.iter()
            .any(|e| e.level == tracing::Level::DEBUG
                && e.message.contains("transient error, retrying")),
        "{ours:#?}"
    );
    // The span of each failed call carries the error; of the others, none.
    let spans = capture.handles();
    let errors: Vec<(&str, bool)> = spans
        .iter()
        .filter(|f| f["consumer"] == "logged")
        .map(|f| (f["outcome"].as_str(), f.contains_key("error")))
        .collect();
    assert_eq!(
        errors,
        [
            ("applied", false),
            ("duplicate", false),
            ("error", true),
            ("error", true),
            ("error", true),
            ("error", true),
        ]
    );
}

/// A call refused before its first step (a wrong table, without
/// `migrate`) is reported as any failed call: the WARN with the error,
/// and the span's outcome and error.
#[test]
fn a_refused_table_is_logged_as_a_failed_call() {
    let log = Log::default();
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry()
        .with(log.clone())
        .with(capture.clone());
    tracing::subscriber::with_default(subscriber, || {
        let mut conn = SqliteConnection::establish(":memory:").expect("sqlite");
        diesel::connection::SimpleConnection::batch_execute(
            &mut conn,
            "CREATE TABLE inbox_messages (consumer TEXT NOT NULL, message_id TEXT NOT NULL, \
             received_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        )
        .expect("a table without a primary key");
        let attempts = Mutex::new(0);
        let refused = observed(&mut conn, "k1", &attempts);
        assert!(
            matches!(
                refused,
                Err(AppError::Inbox(InboxError::IncompatibleTable(_)))
            ),
            "{refused:?}"
        );
        assert_eq!(
            *attempts.lock().expect("attempts"),
            0,
            "the body did not run"
        );
    });
    let events = log.events.lock().expect("log").clone();
    let warned: Vec<&Logged> = events
        .iter()
        .filter(|e| e.level == tracing::Level::WARN)
        .collect();
    assert_eq!(warned.len(), 1, "{events:#?}");
    assert_eq!(
        (warned[0].target.as_str(), warned[0].message.as_str()),
        ("diesel_inbox", "diesel-inbox: the call failed")
    );
    assert!(
        warned[0].fields["error"].contains("IncompatibleTable"),
        "{warned:?}"
    );
    let spans = capture.handles();
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0]["outcome"], "error");
    assert!(spans[0]["error"].contains("IncompatibleTable"));
}

/// The HTTP front door's requests: a `diesel_inbox.http` span with the
/// endpoint and the outcome, and with `metrics` a counter and a histogram
/// per endpoint and outcome: applied, replayed, mismatch (422), conflict
/// (409: in flight past the wait).
#[cfg(all(feature = "axum", feature = "metrics"))]
#[test]
fn http_requests_report_their_endpoint_and_outcome() {
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use diesel_async::AsyncConnection;
    use diesel_inbox::http::{IdempotencyKey, Idempotent};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use std::time::Duration;
    type Conn = SyncConnectionWrapper<SqliteConnection>;

    let dir = std::env::temp_dir().join(format!("inbox-http-telemetry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let url = dir.join("t.db").to_string_lossy().into_owned();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let mut conn = Conn::establish(&url).await.expect("connect");
                let mut other = Conn::establish(&url).await.expect("connect");
                diesel_inbox::migrate_async(&mut conn)
                    .await
                    .expect("migrate");
                let key = IdempotencyKey::parse("k-1").expect("key");
                let body = async |_: &mut Conn| Ok::<_, InboxError>("paid");
                for (amount, status) in [(1, 200), (1, 200), (2, 422)] {
                    let response = Idempotent::new("payments", "u1", &key)
                        .fingerprint(&amount)
                        .run_async(&mut conn, body)
                        .await
                        .expect("answered");
                    assert_eq!(response.status(), status);
                }
                // In flight: the first holds SQLite's write lock until
                // the second has been answered 409.
                let busy = IdempotencyKey::parse("k-2").expect("key");
                let gate = tokio::sync::Notify::new();
                let slow = Idempotent::new("payments", "u1", &busy).run_async(
                    &mut conn,
                    async |_: &mut Conn| {
                        gate.notified().await;
                        Ok::<_, InboxError>("slow")
                    },
                );
                let early = async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let answer = Idempotent::new("payments", "u1", &busy)
                        .wait(Duration::from_millis(100))
                        .run_async(&mut other, body)
                        .await;
                    gate.notify_one();
                    answer
                };
                let (slow, early) = tokio::join!(slow, early);
                assert_eq!(slow.expect("slow").status(), 200);
                assert_eq!(early.expect("early").status(), 409);
            });
        });
    });
    let _ = std::fs::remove_dir_all(&dir);

    let mut counted: BTreeMap<String, u64> = BTreeMap::new();
    let mut timed: BTreeMap<String, usize> = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_, key) = key.into_parts();
        if !key.name().starts_with("diesel_inbox.http.") {
            continue;
        }
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{} {}", key.name(), labels.join(","));
        match value {
            DebugValue::Counter(n) => {
                counted.insert(name, n);
            }
            DebugValue::Histogram(samples) => {
                timed.insert(name, samples.len());
            }
            other => panic!("unexpected {name}: {other:?}"),
        }
    }
    let route = "http.route=payments";
    let expected: BTreeMap<String, u64> = [
        ("applied", 2),
        ("replayed", 1),
        ("mismatch", 1),
        ("conflict", 1),
    ]
    .into_iter()
    .map(|(outcome, n)| {
        (
            format!("diesel_inbox.http.requests {route},diesel_inbox.outcome={outcome}"),
            n,
        )
    })
    .collect();
    assert_eq!(counted, expected);
    assert_eq!(timed.len(), 4, "a duration per outcome: {timed:?}");

    let outcomes: Vec<String> = capture
        .0
        .lock()
        .expect("capture")
        .iter()
        .filter_map(|seen| match seen {
            Seen::Span { name, fields } if name == "diesel_inbox.http" => {
                assert_eq!(fields.get("endpoint").map(String::as_str), Some("payments"));
                fields.get("outcome").cloned()
            }
            _ => None,
        })
        .collect();
    let mut sorted = outcomes.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["applied", "applied", "conflict", "mismatch", "replayed"]
    );
}

/// The console's actions, over TCP, on a bb8 pool: with `metrics`, a
/// counter per action and outcome (`diesel_inbox.console.actions`) and the
/// rows each changed (`diesel_inbox.console.rows`): a retry done, one
/// refused for its token, a discard done.
#[cfg(all(feature = "console", feature = "metrics", feature = "bb8"))]
#[test]
fn console_actions_are_counted_on_a_bb8_pool() {
    use diesel_async::pooled_connection::{bb8, AsyncDieselConnectionManager};
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use diesel_inbox::console;
    use diesel_inbox::outbox::{self, OutboxMessage, Outgoing, Publish, PublishError, Relay};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    type Conn = SyncConnectionWrapper<SqliteConnection>;

    struct Refuses;
    impl Publish for Refuses {
        async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
            messages
                .iter()
                .map(|_| Err(PublishError::refused("no route")))
                .collect()
        }
    }

    let dir = std::env::temp_dir().join(format!("inbox-console-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let url = dir.join("c.db").to_string_lossy().into_owned();
    let mut sync = SqliteConnection::establish(&url).expect("connect");
    diesel_inbox::migrate(&mut sync).expect("migrate");
    let ids: Vec<String> = sync
        .transaction(|conn| {
            ["a", "b"]
                .iter()
                .map(|body| outbox::enqueue(conn, Outgoing::new("orders", *body)))
                .collect::<Result<Vec<_>, _>>()
        })
        .expect("enqueue");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let pool: bb8::Pool<Conn> = bb8::Pool::builder()
                .max_size(2)
                .build(AsyncDieselConnectionManager::new(url.clone()))
                .await
                .expect("a bb8 pool");
            let report = Relay::new(pool.clone(), Refuses)
                .max_publish_attempts(1)
                .run_once()
                .await
                .expect("a pass");
            assert_eq!(report.dead, 2);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let base = format!("http://{}", listener.local_addr().expect("address"));
            let app = console::router(pool);
            tokio::spawn(async move {
                let _ = axum::serve(
                    listener,
                    app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
                )
                .await;
            });
            let http = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("a client");
            let page = http
                .get(format!("{base}/dead"))
                .send()
                .await
                .expect("the dead page")
                .text()
                .await
                .expect("its body");
            let token = page
                .split("name=\"csrf\" value=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .expect("the page's CSRF token")
                .to_owned();
            let act = |action: &str, id: &str, token: &str| {
                http.post(format!("{base}/actions/{action}"))
                    .form(&[("id", id), ("csrf", token)])
                    .send()
            };
            assert_eq!(
                act("retry", &ids[0], &token).await.expect("retry").status(),
                303
            );
            assert_eq!(
                act("retry", &ids[1], "forged")
                    .await
                    .expect("forged")
                    .status(),
                403
            );
            assert_eq!(
                act("discard", &ids[1], &token)
                    .await
                    .expect("discard")
                    .status(),
                303
            );
        });
    });
    let status = outbox::status(&mut sync).expect("status");
    assert_eq!((status.pending, status.dead), (1, 0));
    let _ = std::fs::remove_dir_all(&dir);

    let mut counted: BTreeMap<String, u64> = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_, key) = key.into_parts();
        if !key.name().starts_with("diesel_inbox.console.") {
            continue;
        }
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        if let DebugValue::Counter(n) = value {
            counted.insert(format!("{} {}", key.name(), labels.join(",")), n);
        }
    }
    let expected: BTreeMap<String, u64> = [
        (
            "diesel_inbox.console.actions diesel_inbox.action=retry,diesel_inbox.outcome=done",
            1,
        ),
        (
            "diesel_inbox.console.actions diesel_inbox.action=retry,diesel_inbox.outcome=refused",
            1,
        ),
        (
            "diesel_inbox.console.actions diesel_inbox.action=discard,diesel_inbox.outcome=done",
            1,
        ),
        ("diesel_inbox.console.rows diesel_inbox.action=retry", 1),
        ("diesel_inbox.console.rows diesel_inbox.action=discard", 1),
    ]
    .into_iter()
    .map(|(name, n)| (name.to_owned(), n))
    .collect();
    assert_eq!(counted, expected);
}

/// A relay whose broker is unavailable says why, in a WARN with the
/// publisher's error, and gives the message back (released, not failed).
#[cfg(feature = "bb8")]
#[test]
fn a_relay_warns_why_the_broker_is_unavailable() {
    use diesel_async::pooled_connection::{bb8, AsyncDieselConnectionManager};
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use diesel_inbox::outbox::{self, OutboxMessage, Outgoing, Publish, PublishError, Relay};
    type Conn = SyncConnectionWrapper<SqliteConnection>;

    struct Down;
    impl Publish for Down {
        async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
            messages
                .iter()
                .map(|_| Err(PublishError::unavailable("node-7 refused the connection")))
                .collect()
        }
    }

    let dir = std::env::temp_dir().join(format!("inbox-relay-warn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let url = dir.join("r.db").to_string_lossy().into_owned();
    let mut sync = SqliteConnection::establish(&url).expect("connect");
    diesel_inbox::migrate(&mut sync).expect("migrate");
    sync.transaction(|conn| outbox::enqueue(conn, Outgoing::new("orders", "a")))
        .expect("enqueue");
    let log = Log::default();
    let subscriber = tracing_subscriber::registry().with(log.clone());
    let report = tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let pool: bb8::Pool<Conn> = bb8::Pool::builder()
                .max_size(2)
                .build(AsyncDieselConnectionManager::new(url.clone()))
                .await
                .expect("a bb8 pool");
            Relay::new(pool, Down).run_once().await.expect("a pass")
        })
    });
    assert_eq!(
        (report.published, report.failed, report.released),
        (0, 0, 1)
    );
    let events = log.events.lock().expect("log").clone();
    let warned: Vec<&Logged> = events
        .iter()
        .filter(|e| e.level == tracing::Level::WARN)
        .collect();
    assert_eq!(warned.len(), 1, "{events:#?}");
    assert_eq!(warned[0].target, "diesel_inbox");
    assert!(
        warned[0].fields["error"].contains("node-7 refused the connection"),
        "{warned:?}"
    );
    let status = outbox::status(&mut sync).expect("status");
    assert_eq!((status.pending, status.dead), (1, 0), "given back, pending");
    let _ = std::fs::remove_dir_all(&dir);
}
