//! Kafka consumers on [rdkafka](https://docs.rs/rdkafka) (feature `kafka`):
//! the consumer runner whose positions live in the handler's own
//! transaction. Guide: [`guide::kafka`](crate::guide::kafka).
//!
//! - **Positions in the database.** The first `#[idempotent]` (or
//!   [`Inbox`](crate::Inbox)) async call of the handler writes the
//!   position of its message's partition, `offset + 1`, to
//!   `inbox_positions` in its own transaction, behind a guard that never
//!   moves it backwards: a consumer that lost its partition and still runs
//!   a handler (a zombie) is refused, rolls back, and gets `Duplicate`.
//! - **Kafka's committed offsets follow the database**: a partition's
//!   offset is committed only after the transactions of that message and of
//!   every earlier message of the partition have committed, `offset + 1` of
//!   what completed (offsets are not contiguous). They are kept in step for
//!   lag tools; the runner trusts the database's positions, and moves to
//!   them where the two disagree.
//! - **Order.** Within a partition, messages are applied one after the
//!   other, in offset order; [`in_flight`](crate::brokers::Consumer::in_flight)
//!   partitions run at once.
//! - **The message id** is the producer's id header (`message-id`,
//!   [`id_header`](crate::brokers::Consumer::id_header)) when present, else
//!   `topic/partition/offset`. Set the header: a producer's retry without
//!   `enable.idempotence` writes the same message again at a new offset,
//!   which only the header makes a duplicate.
//!
//! ```no_run
//! # async fn start() -> Result<(), Box<dyn std::error::Error>> {
//! use diesel_async::pooled_connection::deadpool::Pool;
//! use diesel_async::AsyncPgConnection;
//! use diesel_inbox::brokers::Policy;
//! use diesel_inbox::{idempotent, InboxError};
//! use rdkafka::consumer::{Consumer as _, StreamConsumer};
//! use rdkafka::ClientConfig;
//!
//! #[idempotent(key = "id")]
//! async fn ship(conn: &mut AsyncPgConnection, id: &str, body: &[u8]) -> Result<(), InboxError> {
//!     let _ = (conn, body); // the business writes
//!     Ok(())
//! }
//!
//! # let pool: Pool<AsyncPgConnection> = todo!();
//! let consumer: StreamConsumer = ClientConfig::new()
//!     .set("bootstrap.servers", "127.0.0.1:9092")
//!     .set("group.id", "shipping")
//!     .set("enable.auto.commit", "false")
//!     .set("enable.auto.offset.store", "false")
//!     .create()?;
//! consumer.subscribe(&["orders"])?;
//! let report = diesel_inbox::kafka::Consumer::new(consumer, Policy::new(|_: &InboxError| false))
//!     .in_flight(8)
//!     .run(
//!         async |id: &str, body: &[u8]| {
//!             let Ok(mut conn) = pool.get().await else {
//!                 return Err(InboxError::InvalidArgument("no database connection"));
//!             };
//!             ship(&mut conn, id, body).await
//!         },
//!         async {
//!             let _ = tokio::signal::ctrl_c().await;
//!         },
//!     )
//!     .await?;
//! println!("{report:?}");
//! # Ok(())
//! # }
//! ```

use crate::brokers::Policy;
use rdkafka::consumer::{ConsumerContext, DefaultConsumerContext, StreamConsumer};

mod delivery;
#[allow(unsafe_code)]
mod ffi;
mod partitions;
mod state;

pub use delivery::{message_id, Deliveries, Delivery};
pub use partitions::Partitions;

/// The header that carries a message's id, unless
/// [`id_header`](crate::brokers::Consumer::id_header) names another (the
/// outbox's Kafka publisher writes it).
pub const ID_HEADER: &str = "message-id";

/// A Kafka consumer runner over one rdkafka [`StreamConsumer`]: the loop of
/// [`brokers::Consumer`](crate::brokers::Consumer), with each partition's
/// messages in offset order and the positions kept in the handler's
/// transaction (module docs).
pub type Consumer<E, C = DefaultConsumerContext> = crate::brokers::Consumer<Partitions<C>, E>;

impl<E, C: ConsumerContext + 'static> crate::brokers::Consumer<Partitions<C>, E> {
    /// A runner for `consumer` (configured and subscribed by you), settling
    /// as `policy` says.
    ///
    /// [`run`](crate::brokers::Consumer::run) refuses
    /// ([`BrokerError::Config`](crate::brokers::BrokerError::Config)) a consumer that has `enable.auto.commit`
    /// or `enable.auto.offset.store` on: librdkafka would then commit the
    /// offsets of messages it handed out before their transactions
    /// committed. Set both to `"false"`.
    pub fn new(consumer: StreamConsumer<C>, policy: Policy<E>) -> Self {
        crate::brokers::Consumer::with(Partitions::new(consumer, ID_HEADER), policy)
    }

    /// The header that carries the message id (default [`ID_HEADER`],
    /// `message-id`).
    pub fn id_header(mut self, name: impl Into<String>) -> Self {
        self.source.set_id_header(name.into());
        self
    }
}
