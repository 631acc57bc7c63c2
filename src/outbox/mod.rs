//! The transactional outbox: messages written in the same transaction as
//! the change they announce, published after the commit by a `Relay` at
//! least once, with a stable id, in order per ordering key.
//!
//! Enqueue in any transaction ([`enqueue`], `enqueue_async`); inside an
//! `#[idempotent]` body that is the claim's transaction, so a redelivered
//! message enqueues nothing twice and a failed body enqueues nothing. The
//! relay (feature `relay`, which `lapin` and `nats` bring with their
//! publishers; alone, for a publisher of your own: `Publish`) publishes
//! with broker confirms and deletes each row once its message is
//! confirmed. The guide's outbox chapter (`diesel_inbox::guide::outbox`) has the semantics: ordering,
//! failures, retention, several relays, Galera.
//!
//! ```
//! use diesel::prelude::*;
//! use diesel_inbox::outbox::{self, Outgoing};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! diesel_inbox::migrate(&mut conn)?;
//! let id = conn.transaction(|conn| {
//!     // ... the change itself ...
//!     outbox::enqueue(conn, Outgoing::new("stock.reserve", "{\"order\":7}").ordering_key("customer-42"))
//! })?;
//! outbox::wake(); // a relay in this process publishes at once
//! assert_eq!(outbox::status(&mut conn)?.pending, 1);
//! # let _ = id;
//! # Ok(())
//! # }
//! ```

#[doc(inline)]
pub use inbox_runtime::outbox::{
    dead, dead_groups, dead_matching, discard, enqueue, purge, retry, set_notify, set_wal, status,
    wake, AllDead, DeadFilter, DeadMessage, DestinationStatus, FailureGroup, OutboxMessage,
    OutboxStatus, Outgoing, RetryTarget, WalSlotStatus,
};
#[cfg(feature = "async")]
#[doc(inline)]
pub use inbox_runtime::outbox::{
    dead_async, dead_groups_async, dead_matching_async, discard_async, enqueue_async, purge_async,
    retry_async, status_async,
};

#[cfg(feature = "relay")]
pub(crate) mod pool;
#[cfg(feature = "relay")]
mod publish;
#[cfg(feature = "relay")]
mod relay;
#[cfg(feature = "relay")]
pub use pool::RelayPool;
#[cfg(feature = "relay")]
pub use publish::{ErrorSource, Publish, PublishError};
#[cfg(feature = "relay")]
pub use relay::{Relay, RelayError, RelayReport, TenantRelay};

pub mod wal;

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "lapin")]
pub mod lapin;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "sqs")]
pub mod sqs;
