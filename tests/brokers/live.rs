//! What a runner reports as each settlement happens, seen from inside the
//! consumer process: the `metrics` counter `diesel_inbox.consumer.settled`
//! and the `tracing` events of the broker glue, counted and printed as a
//! `live ...` line that the scenarios compare with the final `RunReport`.

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The events counted: DEBUG `acked`, WARN `delivery failed`, WARN
/// `the call failed` (which a runner must not emit: the glue's line is the
/// one), and the WARNs of a durability prerequisite and of a classic
/// queue.
#[derive(Default)]
struct Events {
    acked: AtomicU64,
    failed_deliveries: AtomicU64,
    failed_calls_warned: AtomicU64,
    durability_warned: AtomicU64,
    classic_queue_warned: AtomicU64,
}

struct Counting(Arc<Events>);

impl<S: tracing::Subscriber> Layer<S> for Counting {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let level = *event.metadata().level();
        // `INBOX_BROKER_LOG=1`: the runner's INFO and WARN lines on stderr,
        // with the time, for a scenario being debugged.
        if level <= tracing::Level::INFO && std::env::var_os("INBOX_BROKER_LOG").is_some() {
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() % 100_000);
            eprintln!("{ms:>5} {level} {}", message.0);
        }
        let counter = match (level, message.0.as_str()) {
            (tracing::Level::DEBUG, "diesel-inbox: acked") => &self.0.acked,
            (tracing::Level::WARN, m) if m.starts_with("diesel-inbox: delivery failed") => {
                &self.0.failed_deliveries
            }
            (tracing::Level::WARN, "diesel-inbox: the call failed") => &self.0.failed_calls_warned,
            (tracing::Level::WARN, m)
                if m.starts_with("diesel-inbox: the database server may lose committed") =>
            {
                &self.0.durability_warned
            }
            (tracing::Level::WARN, m)
                if m.starts_with("diesel-inbox: a redelivery without x-delivery-count") =>
            {
                &self.0.classic_queue_warned
            }
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The process's live counters.
pub struct Live {
    events: Arc<Events>,
    metrics: Snapshotter,
}

/// Installs the recorder and the subscriber (once per process; `None` if
/// something else was installed first).
pub fn install() -> Option<Live> {
    let recorder = DebuggingRecorder::new();
    let metrics = recorder.snapshotter();
    metrics::set_global_recorder(recorder).ok()?;
    let events = Arc::new(Events::default());
    let subscriber = tracing_subscriber::registry().with(Counting(events.clone()).with_filter(
        tracing_subscriber::filter::filter_fn(|m| m.target() == "diesel_inbox"),
    ));
    tracing::subscriber::set_global_default(subscriber).ok()?;
    Some(Live { events, metrics })
}

impl Live {
    /// `live ack=.. retry=.. dead_letter=.. unsettled=.. acked_events=..
    /// failed_delivery_events=.. failed_call_warnings=..
    /// durability_warnings=.. classic_queue_warnings=..`.
    pub fn line(&self) -> String {
        let mut settled = std::collections::BTreeMap::new();
        for (key, _, _, value) in self.metrics.snapshot().into_vec() {
            if key.key().name() != "diesel_inbox.consumer.settled" {
                continue;
            }
            let Some(label) = key
                .key()
                .labels()
                .find(|l| l.key() == "diesel_inbox.settlement")
            else {
                continue;
            };
            if let DebugValue::Counter(n) = value {
                *settled.entry(label.value().to_owned()).or_insert(0) += n;
            }
        }
        let get = |k: &str| settled.get(k).copied().unwrap_or(0);
        format!(
            "live ack={} retry={} dead_letter={} unsettled={} acked_events={} failed_delivery_events={} failed_call_warnings={} durability_warnings={} classic_queue_warnings={}",
            get("ack"),
            get("retry"),
            get("dead_letter"),
            get("unsettled"),
            self.events.acked.load(Ordering::Relaxed),
            self.events.failed_deliveries.load(Ordering::Relaxed),
            self.events.failed_calls_warned.load(Ordering::Relaxed),
            self.events.durability_warned.load(Ordering::Relaxed),
            self.events.classic_queue_warned.load(Ordering::Relaxed),
        )
    }
}
