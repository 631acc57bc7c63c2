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
//! use diesel_inbox::{idempotent, Processed};
//!
//! #[idempotent(key = "order_id")]
//! fn ship(conn: &mut SqliteConnection, order_id: i64) -> QueryResult<i64> {
//!     Ok(order_id)
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! diesel_inbox::migrate(&mut conn)?;
//! assert_eq!(ship(&mut conn, 7)?, Processed::Applied(7));
//! assert_eq!(ship(&mut conn, 7)?, Processed::Duplicate);
//! # Ok(())
//! # }
//! ```
//!
//! # Design: one engine, two drivers
//!
//! Sync and async handlers share one engine: a state machine that does no
//! I/O (the private `engine` module). It says which step comes next (open a
//! transaction or savepoint, claim, run the body, commit, roll back, sleep
//! before a retry) and what each step's result means: which errors are
//! retried, what the caller gets, when a body's `Ok` must not count as
//! applied. [`Inbox`]'s sync terminals (`run`, `run_once`, `run_batch`)
//! drive it with a diesel connection; with the `async` feature, its
//! `_async` terminals drive the same engine with a diesel-async
//! connection, `.await`ing each step. What differs between databases (the claim's SQL, transient error
//! classes, the commit guard, `migrate`'s locks) lives once in each
//! backend's module and serves both drivers.
#![warn(missing_docs)]
#![forbid(unsafe_code)]
// docs.rs (nightly) marks the items of each backend feature with it.
#![cfg_attr(docsrs, feature(doc_cfg))]

// Lets expanded code name `::inbox_runtime` inside this crate's own tests.
extern crate self as inbox_runtime;

#[cfg(feature = "async")]
mod asynchronous;
mod backend;
mod backoff;
mod claim;
mod engine;
mod error;
mod fence;
mod fingerprint;
mod handler;
pub mod inbox;
mod key;
mod migrate;
mod observe;
mod ops;
mod options;
#[cfg(feature = "otel")]
mod otel;
pub mod outbox;
mod overview;
mod prerequisite;
mod processed;
mod recent;
mod registry;
mod retry;
mod rows;
mod schema;
mod target;
mod telemetry;
mod transaction;
mod wake;

#[cfg(feature = "async")]
pub use asynchronous::{AsyncBatchBody, AsyncBody};
#[cfg(feature = "async")]
pub use backend::asynchronous::{AsAsyncConnection, AsyncInboxConnection};
pub use backend::{ddl, InboxBackend, SCHEMA_VERSION};
pub use error::{InboxError, TableProblem};
pub use fingerprint::Fingerprint;
pub use handler::{consumers, RegisteredHandler};
pub use inbox::Inbox;
pub use inbox_macros::idempotent;
pub use key::{validate_key, InboxKey, InvalidKey, MAX_KEY_BYTES};
#[cfg(feature = "async")]
pub use migrate::migrate_async;
pub use migrate::{migrate, schema_version};
pub use observe::ErrorObserver;
pub use ops::{
    attempts, attempts_list, durability, forget, positions, purge, stats, status, Purge,
    PurgeReport, StreamPosition, MAX_PURGE_BATCH,
};
#[cfg(feature = "async")]
pub use ops::{
    attempts_async, attempts_list_async, durability_async, forget_async, positions_async,
    purge_async, stats_async, status_async,
};
pub use options::StoredResult;
#[cfg(feature = "async")]
pub use overview::overview_async;
pub use overview::{
    overview, ConsumerActivity, Overview, RowCount, COUNT_CAP, RATE_CAP, RATE_MINUTES,
};
pub use prerequisite::{Prerequisite, Verdict};
pub use processed::{Batch, Outcome, Processed, Stored};
pub use recent::recent_duplicates;
pub use registry::ConsumerName;
pub use retry::{ErrorClass, RetryableError};
pub use rows::{Attempts, ConsumerStats, InboxEntry};
pub use schema::{inbox_messages, outbox_messages};
pub use transaction::InboxConnection;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

#[doc(hidden)]
#[path = "facade.rs"]
pub mod __facade;

#[doc(hidden)]
#[path = "testing.rs"]
pub mod __testing;
