//! Runtime of [diesel-inbox](https://docs.rs/diesel-inbox): the inbox table,
//! its migrations, the error types and the claim-then-run transaction that
//! `#[idempotent]` handlers call.
//!
//! Depend on `diesel-inbox`, which re-exports all of this; this crate is for
//! users who want the runtime without the facade. Every item works without
//! the attribute too:
//!
//! ```
//! use diesel::prelude::*;
//! use inbox_runtime::{idempotent, Processed};
//!
//! #[idempotent(key = "order_id")]
//! fn ship(conn: &mut SqliteConnection, order_id: i64) -> QueryResult<i64> {
//!     Ok(order_id)
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! inbox_runtime::migrate(&mut conn)?;
//! assert_eq!(ship(&mut conn, 7)?, Processed::Applied(7));
//! assert_eq!(ship(&mut conn, 7)?, Processed::Duplicate);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]
// docs.rs (nightly) marks the items of each backend feature with it.
#![cfg_attr(docsrs, feature(doc_cfg))]

// Lets expanded code name `::inbox_runtime` inside this crate's own tests.
extern crate self as inbox_runtime;

#[cfg(feature = "async")]
mod asynchronous;
mod backend;
mod claim;
mod engine;
mod error;
mod key;
mod observe;
mod processed;
mod registry;
mod retry;
mod schema;
mod transaction;

#[cfg(feature = "async")]
pub use asynchronous::{
    migrate_async, run_async, run_batch_async, run_once_async, AsyncBatchBody, AsyncBody,
    AsyncInboxConnection,
};
pub use backend::{ddl, migrate, schema_version, InboxBackend, SCHEMA_VERSION};
pub use error::{InboxError, TableProblem};
pub use inbox_macros::idempotent;
pub use key::{validate_key, InboxKey, InvalidKey, MAX_KEY_BYTES};
pub use observe::ErrorObserver;
pub use processed::{Batch, Processed};
pub use registry::{consumers, ConsumerName, RegisteredHandler};
pub use retry::{ErrorClass, RetryableError};
pub use schema::inbox_messages;
pub use transaction::{run, run_batch, run_once};

/// Not a stable API: what `#[idempotent]` expands to calls these. Items here
/// change without notice between patch releases.
#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "async")]
    pub use crate::asynchronous::{run_async, run_batch_async, run_once_async};
    pub use crate::registry::{RegisteredHandler, Registration};
    pub use crate::retry::{Probe, ViaRetryableError, ViaStatements};
    pub use crate::transaction::{run, run_batch, run_once};
    use crate::InboxKey;
    pub use inventory;

    /// The key of a body that can run only once, taken before the body moves
    /// the value it came from.
    pub fn owned_key<K: InboxKey + ?Sized>(key: &K) -> ::std::string::String {
        key.inbox_key().into_owned()
    }
}
