//! Not a stable API: hooks for diesel-inbox's own tests and benchmark
//! (schema records, clocks, the relay's SQL, the fence and the trace
//! capture). Items here change without notice between patch releases.

/// The fence of the Kafka runner, for the zombie tests.
#[cfg(feature = "async")]
pub use crate::fence::{at_position, at_positions};
pub use crate::fence::{Position, Verdict};

/// The enqueue's trace capture and its switch (feature `otel`), for the
/// benchmark's cost of the capture.
#[cfg(feature = "otel")]
pub mod otel {
    pub use crate::otel::{capture, set_capture};
}

/// The statements that record `version` with the inbox table on backend
/// `B` (the schema tests write an older version's record).
pub fn record_version<B: crate::InboxBackend>(version: u32) -> ::std::string::String {
    <B as crate::backend::Internals>::record_version(version)
}

/// PostgreSQL: the plain claim's SQL (its parameters: consumer, key,
/// guard) and the commit sent after a stored result, for the tests of
/// what an operator sees when a guard refuses.
#[cfg(feature = "postgres")]
pub fn postgres_guarded_sql() -> (::std::string::String, ::std::string::String) {
    crate::backend::postgres_guarded_sql()
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
