//! The WAL outbox's replication slot (PostgreSQL): [`create`] it once per
//! database before enqueues write to the WAL
//! ([`outbox::set_wal`](super::set_wal)), and a relay built with
//! `Relay::wal` (feature `relay`) publishes what they wrote.

#[doc(inline)]
pub use inbox_runtime::outbox::wal::{create, remove};
