//! The transactional outbox: messages written in the same transaction as
//! the change they announce (and, in an `#[idempotent]` body, as the inbox
//! claim), published after the commit by a relay, at least once and with a
//! stable id.
//!
//! - [`enqueue`] / `enqueue_async` write an [`Outgoing`] message in the
//!   caller's transaction and return its id; outside a transaction they
//!   are refused ([`InboxError::NotInTransaction`](crate::InboxError::NotInTransaction)).
//! - The relay (`diesel_inbox::outbox::Relay`: feature `relay`, which
//!   `lapin`, `nats` and `kafka` turn on with their publishers)
//!   publishes committed rows and deletes each once the broker confirmed
//!   it. A message that fails [`Relay::max_publish_attempts`] times becomes dead:
//!   kept, listed by [`dead`], replayed by [`retry`], deleted by [`purge`].
//! - [`status`] counts pending and dead messages per destination.
//!
//! ```
//! use diesel::prelude::*;
//! use diesel_inbox::outbox::{self, Outgoing};
//! use diesel_inbox::{idempotent, Processed};
//!
//! #[idempotent(key = "order_id")]
//! fn place(conn: &mut SqliteConnection, order_id: i64) -> QueryResult<String> {
//!     // ... the order's own rows ...
//!     let id = outbox::enqueue(
//!         conn,
//!         Outgoing::new("stock.reserve", format!("{{\"order\":{order_id}}}"))
//!             .ordering_key(&order_id)
//!             .header("content-type", "application/json"),
//!     )?;
//!     Ok(id)
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! diesel_inbox::migrate(&mut conn)?;
//! let Processed::Applied(id) = place(&mut conn, 7)? else { panic!() };
//! assert_eq!(id.len(), 36); // a UUIDv7
//! assert_eq!(place(&mut conn, 7)?, Processed::Duplicate); // nothing enqueued twice
//! assert_eq!(outbox::status(&mut conn)?.pending, 1);
//!
//! // Outside a transaction, an outbox row would be a plain publish.
//! let refused = outbox::enqueue(&mut conn, Outgoing::new("stock.reserve", "{}"));
//! assert!(matches!(refused, Err(diesel_inbox::InboxError::NotInTransaction { .. })));
//! # Ok(())
//! # }
//! ```
//!
//! [`Relay::max_publish_attempts`]: https://docs.rs/diesel-inbox/latest/diesel_inbox/outbox/struct.Relay.html#method.max_publish_attempts
//!
//! The files: `message.rs` (what a transaction enqueues), `operations.rs`
//! (status, dead messages, retry, purge), `relay.rs` (a relay's claim and
//! settlement), `notify.rs` (wake-ups across processes), `statements.rs`
//! (running the backend's outbox statements), `headers.rs` and `id.rs`
//! (how a row stores headers and ids).

mod dead;
mod failures;
mod groups;
mod headers;
mod id;
mod message;
mod notify;
mod operations;
mod relay;
mod statements;
pub mod wal;

#[cfg(feature = "async")]
pub use crate::backend::outbox::Floor;
pub use dead::{
    dead, dead_matching, discard, retry, AllDead, DeadFilter, DeadMessage, RetryTarget,
};
#[cfg(feature = "async")]
pub use dead::{dead_async, dead_matching_async, discard_async, retry_async};
#[cfg(feature = "async")]
pub use groups::dead_groups_async;
pub use groups::{dead_groups, FailureGroup};
#[cfg(feature = "async")]
pub use message::enqueue_async;
pub use message::{enqueue, wake, Outgoing};
#[cfg(feature = "async")]
pub use notify::{
    asleep_async, awake_async, listen_async, notified_async, notifies, settled_async,
};
pub use notify::{set_notify, Listening};
pub(crate) use operations::{counted_status, wal_slot_of};
pub use operations::{purge, status, DestinationStatus, OutboxStatus, WalSlotStatus};
#[cfg(feature = "async")]
pub use operations::{purge_async, status_async};
#[cfg(feature = "async")]
pub use relay::{check_server_async, step_async, Claim, PublishOutcome, Settled, Stepped};
pub use relay::{wake_generation, woken, OutboxMessage};
pub(crate) use statements::unexpected as unexpected_answer;
pub use wal::{set_wal, wal_start_replication};
#[cfg(feature = "async")]
pub use wal::{
    wal_decode_async, wal_flushed_async, wal_lock_async, wal_settle_async, wal_slot_async,
    WalDecoded, WalRead,
};
