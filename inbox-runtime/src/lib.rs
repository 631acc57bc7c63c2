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
//!
//! # Design: one engine, two drivers
//!
//! Sync and async handlers share one engine: a state machine that does no
//! I/O (the private `engine` module). It says which step comes next (open a
//! transaction or savepoint, claim, run the body, commit, roll back, sleep
//! before a retry) and what each step's result means: which errors are
//! retried, what the caller gets, when a body's `Ok` must not count as
//! applied. [`run`] and its batch and `_once` variants drive it with a
//! diesel connection; with the `async` feature, `run_async` and its variants
//! drive the same engine with a diesel-async connection, `.await`ing each
//! step. What differs between databases (the claim's SQL, transient error
//! classes, the commit guard, `migrate`'s locks) lives once in each
//! backend's module and serves both drivers.
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
mod fingerprint;
mod key;
mod observe;
mod ops;
mod options;
mod processed;
mod registry;
mod retry;
mod schema;
mod telemetry;
mod transaction;

#[cfg(feature = "async")]
pub use asynchronous::{
    migrate_async, run_async, run_batch_async, run_batch_with_async, run_once_async,
    run_once_with_async, run_with_async, AsyncBatchBody, AsyncBody, AsyncInboxConnection,
};
pub use backend::{ddl, migrate, schema_version, InboxBackend, SCHEMA_VERSION};
pub use error::{InboxError, TableProblem};
pub use fingerprint::Fingerprint;
pub use inbox_macros::idempotent;
pub use key::{validate_key, InboxKey, InvalidKey, MAX_KEY_BYTES};
pub use observe::ErrorObserver;
pub use ops::{
    attempts, forget, purge, stats, status, Attempts, ConsumerStats, InboxEntry, Purge,
    PurgeReport, MAX_PURGE_BATCH,
};
#[cfg(feature = "async")]
pub use ops::{attempts_async, forget_async, purge_async, stats_async, status_async};
pub use options::{BatchOptions, Options, Outcome, StoredResult};
pub use processed::{Batch, Processed, Stored};
pub use registry::{consumers, ConsumerName, RegisteredHandler};
pub use retry::{ErrorClass, RetryableError};
pub use schema::inbox_messages;
pub use transaction::{
    run, run_batch, run_batch_with, run_once, run_once_with, run_with, InboxConnection,
};

/// Not a stable API: what `#[idempotent]` expands to calls these. Items here
/// change without notice between patch releases.
#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "async")]
    pub use crate::asynchronous::{
        run_async, run_batch_async, run_batch_with_async, run_once_async, run_once_with_async,
        run_with_async,
    };
    pub use crate::fingerprint::dispatch::{fingerprint, FingerprintProbe, ViaBytes, ViaSerialize};
    pub use crate::options::{batch_options, BatchOptions, Options};
    pub use crate::registry::{RegisteredHandler, Registration};
    pub use crate::retry::{Probe, ViaRetryableError, ViaStatements};
    pub use crate::transaction::{
        run, run_batch, run_batch_with, run_once, run_once_with, run_with,
    };
    use crate::InboxKey;
    pub use inventory;
    #[cfg(not(feature = "async"))]
    pub use without_async::{
        run_async, run_batch_async, run_batch_with_async, run_once_async, run_once_with_async,
        run_with_async,
    };

    /// Stand-ins for the async runtime when the `async` feature is off: an
    /// `async fn` handler then fails to compile with one error that says so.
    #[cfg(not(feature = "async"))]
    mod without_async {
        use crate::{Batch, Processed};

        #[diagnostic::on_unimplemented(
            message = "`async fn` handlers need the `async` feature of diesel-inbox",
            label = "this handler is an `async fn`",
            note = "enable it: diesel-inbox = {{ version = \"0.1\", features = [\"async\", \"postgres\"] }} (with your backend), or make the handler a sync `fn` on a sync diesel connection"
        )]
        pub trait AsyncFeatureEnabled {}

        pub async fn run_async<C, N: ?Sized, K: ?Sized, T, E, F, R>(
            _: &mut C,
            _: &N,
            _: &K,
            _: u32,
            _: F,
            _: R,
        ) -> Result<Processed<T>, E>
        where
            C: AsyncFeatureEnabled,
            F: AsyncFnOnce(&mut C) -> Result<T, E>,
        {
            unreachable!("never implemented")
        }

        pub async fn run_once_async<C, N: ?Sized, K: ?Sized, T, E, F>(
            _: &mut C,
            _: &N,
            _: &K,
            _: F,
        ) -> Result<Processed<T>, E>
        where
            C: AsyncFeatureEnabled,
            F: AsyncFnOnce(&mut C) -> Result<T, E>,
        {
            unreachable!("never implemented")
        }

        #[allow(clippy::too_many_arguments)]
        pub async fn run_with_async<C, N: ?Sized, K: ?Sized, T, E, F, R, O>(
            _: &mut C,
            _: &N,
            _: &K,
            _: &crate::Options,
            _: u32,
            _: F,
            _: R,
        ) -> Result<O, E>
        where
            C: AsyncFeatureEnabled,
            F: AsyncFnOnce(&mut C) -> Result<T, E>,
        {
            unreachable!("never implemented")
        }

        pub async fn run_once_with_async<C, N: ?Sized, K: ?Sized, T, E, F, O>(
            _: &mut C,
            _: &N,
            _: &K,
            _: &crate::Options,
            _: F,
        ) -> Result<O, E>
        where
            C: AsyncFeatureEnabled,
            F: AsyncFnOnce(&mut C) -> Result<T, E>,
        {
            unreachable!("never implemented")
        }

        #[allow(clippy::too_many_arguments)]
        pub async fn run_batch_with_async<C, N: ?Sized, M, T, E, F, R>(
            _: &mut C,
            _: &N,
            _: &[M],
            _: impl Fn(&M) -> String,
            _: &crate::BatchOptions<'_, M>,
            _: u32,
            _: F,
            _: R,
        ) -> Result<Batch<T>, E>
        where
            C: AsyncFeatureEnabled,
            F: AsyncFnOnce(&mut C, Vec<&M>) -> Result<T, E>,
        {
            unreachable!("never implemented")
        }

        pub async fn run_batch_async<C, N: ?Sized, M, T, E, F, R>(
            _: &mut C,
            _: &N,
            _: &[M],
            _: impl Fn(&M) -> String,
            _: u32,
            _: F,
            _: R,
        ) -> Result<Batch<T>, E>
        where
            C: AsyncFeatureEnabled,
            F: AsyncFnOnce(&mut C, Vec<&M>) -> Result<T, E>,
        {
            unreachable!("never implemented")
        }
    }

    /// The key of a body that can run only once, taken before the body moves
    /// the value it came from.
    pub fn owned_key<K: InboxKey + ?Sized>(key: &K) -> ::std::string::String {
        key.inbox_key().into_owned()
    }
}
