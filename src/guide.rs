//! The reference, page by page. Each page's examples are doctests: `cargo
//! test` runs them (the ones that need a server are compiled only).
//!
//! - [`attribute`]: what a handler call does; consumer names, batches,
//!   retries, tracing.
//! - [`options`]: fingerprints, stored results, attempt limits.
//! - [`manual_api`]: the same calls without the attribute ([`Inbox`](crate::Inbox)).
//! - [`async_handlers`]: `async fn` handlers on diesel-async, pools, cancellation.
//! - [`brokers`]: RabbitMQ and NATS consumers that ack after the commit.
//! - [`http`]: the HTTP front door: `Idempotency-Key` on axum handlers
//!   (feature `axum`).
//! - [`kafka`]: Kafka consumers whose positions live in the handler's
//!   transaction, and the outbox's Kafka publisher (feature `kafka`).
//! - [`sqs`]: Amazon SQS consumers with a visibility heartbeat, the
//!   outbox's SQS publisher, and Lambda (feature `sqs`).
//! - [`console`]: the operations console in a browser: the inbox, the
//!   outbox, positions and dead messages, with retry, discard and forget
//!   (feature `console`).
//! - [`outbox`]: the transactional outbox: enqueue in the handler's
//!   transaction, the relay, order per key, dead messages, retention.
//! - [`tenants`]: a database per tenant: one tenant set under one
//!   connection limit, one relay over every tenant (feature `relay`).
//! - [`operations`]: retention, inspection, replays, the CLI, observability.
//! - [`schema`]: the tables, `migrate`, upgrades, your own migration tool.
//! - [`cluster`]: MariaDB Galera.
//! - [`proxies`]: PgBouncer and other connection proxies.
//! - [`guarantees`]: what is promised, and the fault suite that shows it.

#[doc = include_str!("../docs/guide/attribute.md")]
pub mod attribute {}

#[doc = include_str!("../docs/guide/options.md")]
pub mod options {}

#[doc = include_str!("../docs/guide/manual_api.md")]
pub mod manual_api {}

#[doc = include_str!("../docs/guide/async_handlers.md")]
pub mod async_handlers {}

#[doc = include_str!("../docs/guide/brokers.md")]
pub mod brokers {}

// Its examples need the feature: without it the page is a pointer, so
// that a plain `cargo test` reports no example it did not run.
#[cfg_attr(feature = "axum", doc = include_str!("../docs/guide/http.md"))]
#[cfg_attr(
    not(feature = "axum"),
    doc = "The HTTP front door (`Idempotency-Key` on axum handlers): this page is built with the `axum` feature, as docs.rs builds it."
)]
pub mod http {}

// Its examples need the feature: without it the page is a pointer.
#[cfg_attr(feature = "kafka", doc = include_str!("../docs/guide/kafka.md"))]
#[cfg_attr(
    not(feature = "kafka"),
    doc = "Kafka consumers whose positions live in the handler's transaction, and the outbox's Kafka publisher: this page is built with the `kafka` feature, as docs.rs builds it."
)]
pub mod kafka {}

// Its examples need the feature: without it the page is a pointer.
#[cfg_attr(feature = "sqs", doc = include_str!("../docs/guide/sqs.md"))]
#[cfg_attr(
    not(feature = "sqs"),
    doc = "Amazon SQS: the consumer runner with a visibility heartbeat, the relay's SQS publisher and the Lambda adapter: this page is built with the `sqs` feature, as docs.rs builds it."
)]
pub mod sqs {}

// Its examples need the feature: without it the page is a pointer. The
// screenshot is the browser test's, embedded by build.rs.
#[cfg_attr(feature = "console", doc = include_str!("../docs/guide/console.md"))]
#[cfg_attr(
    feature = "console",
    doc = include_str!(concat!(env!("OUT_DIR"), "/console-overview.md"))
)]
#[cfg_attr(feature = "console", doc = include_str!("../docs/guide/console_pages.md"))]
#[cfg_attr(
    not(feature = "console"),
    doc = "The operations console: the inbox, the outbox, stream positions and dead messages in a browser, with safe actions: this page is built with the `console` feature, as docs.rs builds it."
)]
pub mod console {}

#[doc = include_str!("../docs/guide/outbox.md")]
pub mod outbox {}

#[cfg_attr(feature = "relay", doc = include_str!("../docs/guide/tenants.md"))]
#[cfg_attr(
    not(feature = "relay"),
    doc = "Many databases: a database per tenant, one tenant set under one connection limit, and one relay over every tenant: this page is built with the `relay` feature, as docs.rs builds it."
)]
pub mod tenants {}

#[doc = include_str!("../docs/guide/operations.md")]
pub mod operations {}

#[doc = include_str!("../docs/guide/schema.md")]
pub mod schema {}

#[doc = include_str!("../docs/guide/cluster.md")]
pub mod cluster {}

#[doc = include_str!("../docs/guide/proxies.md")]
pub mod proxies {}

#[doc = include_str!("../docs/guide/guarantees.md")]
pub mod guarantees {}
