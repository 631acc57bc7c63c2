//! Not a stable API: exactly the names that `#[idempotent]`'s expansion
//! calls, and nothing else. Items here change without notice between
//! patch releases. (What diesel-inbox's own modules use of the runtime is
//! `__facade`; the hooks of its tests and benchmark are `__testing`.)

pub use crate::fingerprint::dispatch::{fingerprint, FingerprintProbe, ViaBytes, ViaSerialize};
pub use crate::handler::{RegisteredHandler, Registration};
pub use crate::inbox::Inbox;
pub use crate::retry::{Probe, ViaRetryableError, ViaStatements};
use crate::InboxKey;
pub use inventory;

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
