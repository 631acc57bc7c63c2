//! Not a stable API: what diesel-inbox's own modules (the broker runners,
//! the Kafka runner, the outbox relay, the HTTP front door) use of the
//! runtime. Items here change without notice between patch releases.

/// The one backoff (the consumer runners' redeliveries, the outbox relay).
pub use crate::backoff::backoff;
/// Stream positions kept in the handler's transaction (the Kafka runner).
#[cfg(feature = "async")]
pub use crate::fence::{at_position, at_positions};
pub use crate::fence::{Position, Verdict};
/// How a panic's payload reads: "the body panicked: ...".
pub use crate::options::describe_panic;
/// How a stored value is written and read back, for a type of the
/// caller's own (the HTTP front door's stored responses).
pub use crate::options::Codec;
/// The HTTP front door's telemetry.
pub use crate::telemetry::HttpTelemetry;
#[cfg(feature = "async")]
pub use crate::telemetry::{for_tenant, outbox_status_gone, settled_by_caller};
/// The `tracing` target of every event and span of the library.
pub const TRACING_TARGET: &str = crate::target::TARGET;
/// What the broker glue reports through the runtime's telemetry.
pub use crate::telemetry::{console_action, consumer_settled, kafka_lag};

/// Runs a future to its end or to a panic, returned (the HTTP front
/// door's `500`).
#[cfg(feature = "async")]
pub use crate::asynchronous::caught;

/// Trace context (feature `otel`): the relay's and the runners' spans.
#[cfg(feature = "otel")]
pub mod otel {
    pub use crate::otel::{
        consume, consume_batch, extract, failed, fields, producer_span, Messaging,
    };
}

/// Whether rerunning the transaction that raised `error` on backend `B`
/// may succeed (the relay's classification of a failed pass).
pub fn is_transient<B: crate::InboxBackend>(error: &diesel::result::Error) -> bool {
    <B as crate::backend::Internals>::is_transient(error)
}
