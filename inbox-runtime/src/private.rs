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
pub use crate::telemetry::consumer_settled;

/// The one backoff (the consumer runners' redeliveries, the outbox relay).
pub use crate::backoff::backoff;
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
