//! The latency a batch adds between its database commit and its
//! settlement at the broker, per message: from the moment the batch
//! handler returned (its transaction committed) to the runner's
//! `diesel-inbox: batch acked` debug event, sent once the batch's acks
//! (RabbitMQ, NATS) or its offset commit (Kafka) were handed to the
//! broker's client. Batches run one at a time, so the k-th return goes
//! with the k-th ack. Only that event is enabled: the rest of the
//! library's tracing stays off, as in the other variants.

use std::sync::{Mutex, Once};
use std::time::Instant;
use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

static COMMITTED: Mutex<Vec<(Instant, usize)>> = Mutex::new(Vec::new());
static ACKED: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

/// Installs the listener (once per process) and forgets what was recorded.
pub fn start() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(Acks);
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
    });
    COMMITTED.lock().unwrap().clear();
    ACKED.lock().unwrap().clear();
}

/// A batch handler's return: its transaction committed `messages`.
pub fn committed(messages: usize) {
    COMMITTED.lock().unwrap().push((Instant::now(), messages));
}

/// The median and the 99th percentile, in milliseconds, of the messages'
/// commit-to-settlement times since [`start`].
pub fn percentiles() -> Result<(f64, f64), String> {
    let committed = COMMITTED.lock().unwrap();
    let acked = ACKED.lock().unwrap();
    if committed.is_empty() || acked.len() < committed.len() {
        return Err(format!(
            "{} batches committed, {} acked",
            committed.len(),
            acked.len()
        ));
    }
    let mut each: Vec<f64> = Vec::new();
    for ((at, messages), acked) in committed.iter().zip(acked.iter()) {
        let ms = acked.saturating_duration_since(*at).as_secs_f64() * 1e3;
        each.extend(std::iter::repeat_n(ms, *messages));
    }
    each.sort_by(f64::total_cmp);
    let at = |q: f64| each[((each.len() - 1) as f64 * q).round() as usize];
    Ok((at(0.5), at(0.99)))
}

/// The layer that records the runner's batch acks.
struct Acks;

fn is_batch_ack(metadata: &Metadata<'_>) -> bool {
    metadata.is_event()
        && metadata.target() == "diesel_inbox"
        && metadata.file().is_some_and(|f| f.ends_with("batch.rs"))
}

impl<S: Subscriber> Layer<S> for Acks {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        match is_batch_ack(metadata) {
            true => Interest::always(),
            false => Interest::never(),
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        is_batch_ack(metadata)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let now = Instant::now();
        let mut message = Message(false);
        event.record(&mut message);
        if message.0 {
            ACKED.lock().unwrap().push(now);
        }
    }
}

/// Whether an event's message is the batch ack's.
struct Message(bool);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}") == "diesel-inbox: batch acked";
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = value == "diesel-inbox: batch acked";
        }
    }
}

/// The medians over rounds of [`percentiles`]' two figures.
pub fn median_of(rounds: &[(f64, f64)]) -> (f64, f64) {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    (
        median(rounds.iter().map(|r| r.0).collect()),
        median(rounds.iter().map(|r| r.1).collect()),
    )
}
