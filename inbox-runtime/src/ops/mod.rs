//! Operating the inbox: retention ([`purge`]), inspection ([`status`],
//! [`stats`]) and deliberate replays ([`forget`]), for sync connections and,
//! with the `async` feature, their async twins.
//!
//! The statements are written once (`backend::statements` and
//! `backend::execute`) and run by each backend on its sync and its async connection; the purge loop's
//! decisions (when a batch was the last, which errors to retry, the report)
//! live once in [`PurgeLoop`], driven by a sync and an async loop of a few
//! lines.
//!
//! The files: [`purge`](mod@purge) (retention), [`entries`] (single keys and
//! consumers), [`positions`](mod@positions) (the Kafka runner's stream
//! positions), [`transaction`] (the short transactions they share with the
//! outbox's operations).

mod durability;
mod entries;
mod positions;
mod purge;
mod transaction;

pub use durability::durability;
#[cfg(feature = "async")]
pub use durability::durability_async;
pub use entries::{attempts, attempts_list, forget, stats, status};
#[cfg(feature = "async")]
pub use entries::{attempts_async, attempts_list_async, forget_async, stats_async, status_async};
#[cfg(feature = "async")]
pub use positions::positions_async;
pub(crate) use positions::positions_of;
pub use positions::{positions, StreamPosition};
#[cfg(feature = "async")]
pub use purge::purge_async;
pub use purge::{purge, Purge, PurgeReport, MAX_PURGE_BATCH};
pub(crate) use purge::{PurgeLoop, PurgeStep};
pub(crate) use transaction::{ops_error, short_transaction};
