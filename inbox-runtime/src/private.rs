//! Not a stable API: what `#[idempotent]` expands to calls these. Items
//! here change without notice between patch releases.

pub use crate::fingerprint::dispatch::{fingerprint, FingerprintProbe, ViaBytes, ViaSerialize};
pub use crate::handler::{RegisteredHandler, Registration};
pub use crate::inbox::Inbox;
pub use crate::retry::{Probe, ViaRetryableError, ViaStatements};
use crate::InboxKey;
pub use inventory;

/// What the broker glue of `diesel-inbox` reports through the runtime's
/// telemetry.
pub use crate::telemetry::{consumer_settled, kafka_lag};

/// The one backoff (the consumer runners' redeliveries, the outbox relay).
pub use crate::backoff::backoff;
/// Trace context (feature `otel`): the relay's and the runners' spans.
#[cfg(feature = "otel")]
pub mod otel {
    pub use crate::otel::{
        capture, consume, extract, failed, fields, producer_span, set_capture, Messaging,
    };
}
/// Stream positions kept in the handler's transaction (the Kafka runner).
#[cfg(feature = "async")]
pub use crate::fence::at_position;
pub use crate::fence::{Position, Verdict};
#[cfg(feature = "async")]
pub use crate::telemetry::settled_by_caller;

/// The key of a body that can run only once, taken before the body moves
/// the value it came from.
pub fn owned_key<K: InboxKey + ?Sized>(key: &K) -> ::std::string::String {
    key.inbox_key().into_owned()
}

/// The error type of a handler's `Result` return type, however it is
/// spelled (`QueryResult<T>`, an alias of the user's): the attribute names
/// the classifier's parameter with it.
pub trait ResultParts {
    /// The error type.
    type Error;
}

impl<T, E> ResultParts for ::core::result::Result<T, E> {
    type Error = E;
}

/// Whether rerunning the transaction that raised `error` on backend `B`
/// may succeed (the relay's classification of a failed pass).
pub fn is_transient<B: crate::InboxBackend>(error: &diesel::result::Error) -> bool {
    <B as crate::backend::Internals>::is_transient(error)
}

/// The statements that record `version` with the inbox table on backend
/// `B` (the schema tests write an older version's record).
pub fn record_version<B: crate::InboxBackend>(version: u32) -> ::std::string::String {
    <B as crate::backend::Internals>::record_version(version)
}

/// The time `older_than` before now on backend `B`'s clock, comparable
/// with `received_at` (the retention tests age rows with it).
pub fn cutoff_sql<B: crate::InboxBackend>(
    older_than: ::std::time::Duration,
) -> ::std::string::String {
    <B as crate::backend::Internals>::cutoff_sql(older_than)
}

/// Backend `B`'s relay settings, for the benchmark's hand-written relay:
/// what its short transactions run first, the clock in microseconds, and
/// what ends its claim (`FOR UPDATE SKIP LOCKED` where rows can be locked).
pub fn relay_sql<B: crate::InboxBackend>() -> (Option<&'static str>, &'static str, &'static str) {
    (B::RELAY_SETUP, B::NOW_MICROS, B::SKIP_LOCKED)
}

/// The HTTP front door's telemetry.
pub use crate::telemetry::HttpTelemetry;

/// How a stored value is written and read back, for a type of the
/// caller's own (the HTTP front door's stored responses).
pub use crate::options::Codec;

/// Runs a future to its end or to a panic, returned (the HTTP front
/// door's `500`).
#[cfg(feature = "async")]
pub use crate::asynchronous::caught;

/// How a panic's payload reads: "the body panicked: ...".
pub use crate::options::describe_panic;
