//! Real brokers end to end: RabbitMQ (lapin) and NATS JetStream
//! (async-nats) consumers whose `#[idempotent]` async handler writes to a
//! SQLite file shared by the consumer processes, and who ack only after
//! the handler's transaction committed. Five scenarios per broker:
//!
//! 1. 1,000 messages, 20% published twice: exact state.
//! 2. The consumer process is SIGKILLed between commit and ack for a slice
//!    of messages and restarted: the redeliveries are `Duplicate`.
//! 3. A poison message is dead-lettered (RabbitMQ) or terminated (NATS)
//!    after the delivery limit while the messages behind it flow.
//! 4. Three consumer processes with prefetch > 1: exact state.
//! 5. The broker drops the connection mid-stream (`rabbitmqctl
//!    close_all_connections`, a restart of nats-server): the consumer
//!    reconnects, exact state.
//!
//! The consumers are this binary run again (`INBOX_BROKER_ROLE=consumer`).
//! RabbitMQ's scenarios and NATS's run side by side, one thread per broker;
//! within a broker, those that stop it run first, alone, then the rest in
//! two lanes.
//! Servers: `INBOX_TEST_AMQP_URL` (e.g. amqp://guest:guest@127.0.0.1:5672/%2f)
//! and `INBOX_TEST_NATS_URL` (e.g. nats://127.0.0.1:4222); unset, a broker's
//! scenarios are reported as skipped. `cargo test --test brokers -- nats`
//! runs the scenarios whose name contains `nats`.

#[path = "../support/mod.rs"]
mod support;

#[cfg(all(
    feature = "sqlite",
    any(feature = "lapin", feature = "nats", feature = "sqs")
))]
mod chain;
#[cfg(all(feature = "sqlite", any(feature = "lapin", feature = "nats")))]
mod cluster;
#[cfg(all(
    feature = "sqlite",
    any(feature = "lapin", feature = "nats", feature = "sqs")
))]
mod consumer;
#[cfg(all(feature = "sqlite", feature = "lapin", feature = "postgres"))]
mod failover;
#[cfg(all(
    feature = "sqlite",
    any(feature = "lapin", feature = "nats", feature = "sqs")
))]
mod live;
#[cfg(all(feature = "sqlite", feature = "nats"))]
mod nats;
#[cfg(all(
    feature = "sqlite",
    feature = "postgres",
    any(feature = "lapin", feature = "nats", feature = "sqs")
))]
use support::proxy;
#[cfg(all(feature = "sqlite", feature = "lapin"))]
mod rabbit;
#[cfg(all(
    feature = "sqlite",
    any(feature = "lapin", feature = "nats", feature = "sqs")
))]
mod scenarios;
#[cfg(all(feature = "sqlite", feature = "sqs"))]
mod sqs;
#[cfg(all(feature = "sqlite", feature = "lapin", feature = "postgres"))]
mod tenants;

#[cfg(all(
    feature = "sqlite",
    any(feature = "lapin", feature = "nats", feature = "sqs")
))]
fn main() {
    scenarios::main();
}

#[cfg(not(all(
    feature = "sqlite",
    any(feature = "lapin", feature = "nats", feature = "sqs")
)))]
fn main() {
    println!("SKIPPED: broker scenarios need the `lapin`, `nats` or `sqs` feature and `sqlite`: cargo test --all-features --test brokers");
}
