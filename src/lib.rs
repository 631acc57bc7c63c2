//! # diesel-inbox
//!
//! The Inbox pattern for [Diesel]: message consumers that are safe against
//! duplicate delivery. Annotate a handler with [`#[idempotent]`](idempotent);
//! it records the message's key in the `inbox_messages` table **in the same
//! database transaction** as its business writes, behind a primary key on
//! `(consumer, message_id)`. A redelivered message finds its key and is
//! skipped ([`Processed::Duplicate`]); a handler that fails or panics rolls
//! back both its writes and the inbox row, so the next delivery runs it again.
//!
//! This is durable deduplication of the *database side* of a handler, not
//! exactly-once delivery: an email sent or an HTTP call made from the body can
//! still happen twice unless it has its own idempotency. Acknowledge the
//! message to the broker after the handler returns, for both variants.
//!
//! ```
//! use diesel::prelude::*;
//! use diesel_inbox::{idempotent, InboxError, Processed};
//!
//! diesel::table! { orders (id) { id -> Text, total -> BigInt } }
//!
//! struct OrderPlaced { id: String, total: i64 }
//!
//! #[derive(Debug)]
//! enum AppError { Db(diesel::result::Error), Inbox(InboxError) }
//! impl From<diesel::result::Error> for AppError {
//!     fn from(e: diesel::result::Error) -> Self { AppError::Db(e) }
//! }
//! impl From<InboxError> for AppError {
//!     fn from(e: InboxError) -> Self { AppError::Inbox(e) }
//! }
//!
//! #[idempotent(key = "msg.id")]
//! fn on_order_placed(conn: &mut SqliteConnection, msg: &OrderPlaced) -> Result<i64, AppError> {
//!     diesel::insert_into(orders::table)
//!         .values((orders::id.eq(&msg.id), orders::total.eq(msg.total)))
//!         .execute(conn)?;
//!     Ok(msg.total)
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! diesel::sql_query("CREATE TABLE orders (id TEXT PRIMARY KEY, total BIGINT NOT NULL)")
//!     .execute(&mut conn)?;
//! diesel_inbox::migrate(&mut conn)?; // creates inbox_messages; safe at every start
//!
//! let msg = OrderPlaced { id: "order-1".into(), total: 42 };
//! // The return type became Result<Processed<i64>, AppError>.
//! assert!(matches!(on_order_placed(&mut conn, &msg), Ok(Processed::Applied(42))));
//! assert!(matches!(on_order_placed(&mut conn, &msg), Ok(Processed::Duplicate)));
//! # Ok(())
//! # }
//! ```
//!
//! Call [`migrate`] at start-up: it creates the table, and refuses an
//! existing one that would make deduplication silently wrong (a primary key
//! other than `(consumer, message_id)`, a case-insensitive collation, keys
//! narrower than 255 bytes, triggers, foreign keys, ...) or a schema newer
//! than this release knows.
//!
//! Without the attribute, [`Inbox`] makes the same calls (one builder,
//! options as data). The reference is the [`guide`]: the attribute, the
//! options, async handlers, brokers, operations, the schema, clusters and
//! the guarantees, each page with examples that run as tests.
//!
//! ## Features
//! - `sqlite-bundled` (the default): SQLite compiled from source; nothing
//!   to install. Implies `sqlite`.
//! - `sqlite`: SQLite through the system's libsqlite3.
//! - `postgres`: PostgreSQL through libpq.
//! - `mysql`: MySQL 8 and MariaDB through libmysqlclient.
//! - `uuid`: [`InboxKey`] for `uuid::Uuid`.
//! - `async`: `async fn` handlers on diesel-async 0.9.
//! - `serde`: `fingerprint` of any `Serialize` value, and `store_result`.
//! - `metrics`: counters and a histogram through the `metrics` facade.
//! - `cli`: the `diesel-inbox` ops binary.
//! - `lapin`: RabbitMQ consumers (`diesel_inbox::lapin`, implies `async`).
//! - `nats`: NATS JetStream consumers (`diesel_inbox::nats`, implies `async`).
//! - `kafka`: Kafka consumers and the outbox's Kafka publisher
//!   (`diesel_inbox::kafka`, librdkafka built from source).
//! - `relay`: the outbox relay without a broker client, for a publisher of
//!   your own.
//! - `bb8`: the relay also on a bb8 pool (`diesel_async`'s), besides
//!   deadpool.
//! - `axum`: the HTTP front door (`diesel_inbox::http`).
//! - `console`: the operations console in a browser
//!   (`diesel_inbox::console`), and `diesel-inbox console` with `cli`.
//! - `otel`: trace context through the outbox and the brokers
//!   (OpenTelemetry, through `tracing-opentelemetry`; guide: outbox).
//!
//! [Diesel]: https://diesel.rs
// docs.rs (nightly) marks the items of each backend feature with it.
#![cfg_attr(docsrs, feature(doc_cfg))]
// The only `unsafe` code is `kafka::ffi` (two reads of librdkafka's state).
#![deny(unsafe_code)]

/// Makes a Diesel handler idempotent: its message key is claimed in the inbox
/// table in the same transaction as its body.
///
/// This is where the attribute's arguments are documented; the guide's
/// [attribute page](crate::guide::attribute) says what a call does, and
/// [the options page](crate::guide::options) covers `fingerprint`,
/// `store_result` and `max_attempts` in depth.
///
/// ```text
/// #[idempotent(key = "<expr>", consumer = "<name>", shared, conn = "<param>", retries = N,
///              batch = "<param>", fingerprint = "<expr>", store_result, max_attempts = N, crate = "<path>")]
/// ```
///
/// - `key` (required): a Rust expression over the parameters whose type
///   implements [`InboxKey`] (`str`, `String`, integers, `uuid::Uuid`, and
///   references to them), e.g. `"msg.id"`, `"msg.header.id.as_str()"`, or a
///   name bound by a destructuring parameter.
/// - `consumer`: the scope of deduplication; default, the function's name
///   (not its module path, which would change when the function moves and
///   make redeliveries after that deploy apply again). The same key under
///   two consumers is applied once by each.
/// - `shared`: this handler deliberately shares its consumer with other
///   handlers. Without it, two handlers of the program with the same
///   consumer name (two `handle` functions in two modules, one method in two
///   trait impls) fail on their first call with
///   [`InboxError::ConsumerConflict`], naming both; every one of them must
///   say `shared`. [`consumers()`] lists them all.
/// - `conn`: the connection parameter; default, the only `&mut` parameter.
///   It is the diesel connection itself; for a pooled connection declare
///   the connection type and pass `&mut pooled`.
/// - `retries`: how often a transient failure (serialization failure,
///   deadlock, lock timeout, SQLite busy) reruns the whole transaction;
///   default 3. A transient failure of a body statement is retried whatever
///   the handler's error type (the runtime observes the statement, see
///   [`ErrorObserver`]); an error type that implements [`RetryableError`]
///   decides for itself, and its `retries_exhausted` shapes the error
///   returned when they run out. With `retries = 0` the body may move its
///   parameters.
/// - `batch`: the parameter holding a batch of messages (`&[M]` or
///   `&Vec<M>`); `key` is then a closure over one message (`"|m| m.id"`).
///   All keys are claimed with one multi-row insert in one transaction, the
///   body receives only the first deliveries (as `Vec<&M>`, under the same
///   name), and the handler returns [`Batch<T>`] instead of `Processed<T>`.
/// - `fingerprint`: the message's content (bytes, or any `Serialize` value
///   with feature `serde`; a closure over one message with `batch`). Its
///   [`Fingerprint`] is stored with the inbox row; a redelivery of the key
///   with other content fails with [`InboxError::KeyReused`] without
///   running the body.
/// - `store_result` (feature `serde`): the body's value is stored with the
///   inbox row, and the handler returns [`Stored<T>`]: a duplicate carries
///   the first delivery's value.
/// - `max_attempts = N`: each failed delivery of a key is counted after
///   its rollback; from the N-th on, deliveries fail with
///   [`InboxError::AttemptsExhausted`] without running the body. A success
///   clears the count ([`attempts`] reads it, [`forget`] resets it).
/// - `crate`: the path of `diesel-inbox` if you renamed the dependency
///   (found from Cargo.toml otherwise, also when you depend on
///   `inbox-runtime` directly).
///
/// The function must return `Result<T, E>` or an alias such as
/// `QueryResult<T>`; the macro turns `T` into [`Processed<T>`]. `E` must
/// implement `From<diesel::result::Error>` and `From<`[`InboxError`]`>`.
///
/// # What it expands to
///
/// ```text
/// #[idempotent(key = "msg.id")]
/// fn on_order_placed(conn: &mut PgConnection, msg: &OrderPlaced) -> Result<i64, AppError> { BODY }
///
/// // becomes
/// fn on_order_placed(conn: &mut PgConnection, msg: &OrderPlaced)
///     -> Result<diesel_inbox::Processed<i64>, AppError>
/// {
///     // Registered before main: consumer name, `module::on_order_placed`, file, line.
///     static HANDLER: RegisteredHandler = RegisteredHandler::new("on_order_placed", ..);
///     diesel_inbox::Inbox::consumer(&&HANDLER)
///         .retries(3)
///         .classify(|error| /* ErrorClass::of(error) if AppError: RetryableError, else ErrorClass::by_statements() */)
///         .run(conn, &(msg.id), |conn| -> Result<i64, AppError> { BODY })
/// }
/// ```
///
/// The options become the builder's ([`Inbox`]: `.fingerprint(..)`,
/// `.store_result()`, `.max_attempts(n)`; `retries = 0` calls
/// [`run_once`](Inbox::run_once), a batch
/// [`run_batch`](Inbox::run_batch), an `async fn` the `_async` terminals).
/// [`Inbox::run`] checks the consumer against the other handlers, validates the
/// key (not empty, at most 255 bytes, no NUL: else
/// [`InboxError::InvalidKey`] and nothing runs), opens a transaction (a
/// savepoint inside the caller's; `BEGIN IMMEDIATE` on SQLite), inserts the
/// inbox row ignoring a conflict, and returns [`Processed::Duplicate`] if the
/// row existed. Otherwise it runs the body: `Ok` commits, `Err` rolls back
/// and is returned, a panic rolls back and keeps unwinding.
///
/// # Methods, generics, custom names
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{idempotent, Processed};
///
/// struct Audit { prefix: String }
///
/// impl Audit {
///     #[idempotent(key = "event_id", consumer = "audit-log", conn = "db", retries = 0)]
///     fn record(&self, db: &mut SqliteConnection, event_id: u64, note: String) -> QueryResult<String> {
///         Ok(format!("{}{note}", self.prefix)) // moves `note`: allowed with retries = 0
///     }
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut db = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut db)?;
/// let audit = Audit { prefix: "audit: ".into() };
/// assert_eq!(audit.record(&mut db, 7, "hello".into())?, Processed::Applied("audit: hello".into()));
/// assert_eq!(audit.record(&mut db, 7, "hello".into())?, Processed::Duplicate);
/// # Ok(())
/// # }
/// ```
///
/// # Fingerprints, stored results, attempt limits
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{idempotent, InboxError, Stored};
///
/// struct Payment { id: String, amount: i64 }
///
/// #[idempotent(key = "msg.id", fingerprint = "msg.amount.to_be_bytes()", store_result, max_attempts = 3)]
/// fn charge(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<i64> {
///     Ok(msg.amount * 100) // e.g. the amount charged, in cents
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// let pay = Payment { id: "p-1".into(), amount: 5 };
/// assert_eq!(charge(&mut conn, &pay)?, Stored::Applied(500));
/// // The redelivery returns the stored value; the body does not run.
/// assert_eq!(charge(&mut conn, &pay)?, Stored::Duplicate(Some(500)));
/// // The same key with other content is a producer bug, not a duplicate.
/// let reused = charge(&mut conn, &Payment { id: "p-1".into(), amount: 6 });
/// let Err(diesel::result::Error::QueryBuilderError(e)) = reused else { panic!() };
/// assert!(matches!(e.downcast_ref::<InboxError>(), Some(InboxError::KeyReused { .. })));
/// # Ok(())
/// # }
/// ```
///
/// # Batches
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{idempotent, Batch};
///
/// diesel::table! { shipments (order_id) { order_id -> BigInt } }
///
/// struct OrderPaid { order_id: i64 }
///
/// #[idempotent(batch = "events", key = "|e| e.order_id")]
/// fn ship(conn: &mut SqliteConnection, events: &[OrderPaid]) -> QueryResult<usize> {
///     // `events` holds only the events seen for the first time.
///     let rows: Vec<_> = events.iter().map(|e| shipments::order_id.eq(e.order_id)).collect();
///     diesel::insert_into(shipments::table).values(&rows).execute(conn)
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel::sql_query("CREATE TABLE shipments (order_id BIGINT PRIMARY KEY)").execute(&mut conn)?;
/// diesel_inbox::migrate(&mut conn)?;
/// let first: Batch<usize> = ship(&mut conn, &[OrderPaid { order_id: 1 }, OrderPaid { order_id: 2 }])?;
/// assert_eq!((first.value, first.applied, first.duplicates), (Some(2), vec![0, 1], 0));
/// let again = ship(&mut conn, &[OrderPaid { order_id: 2 }, OrderPaid { order_id: 3 }])?;
/// assert_eq!((again.value, again.applied, again.duplicates), (Some(1), vec![1], 1));
/// # Ok(())
/// # }
/// ```
#[doc(inline)]
pub use inbox_runtime::idempotent;

pub use inbox_runtime::{
    attempts, attempts_list, consumers, ddl, durability, forget, inbox, inbox_messages, migrate,
    outbox_messages, overview, positions, purge, recent_duplicates, schema_version, stats, status,
    validate_key, Attempts, Batch, ConsumerActivity, ConsumerName, ConsumerStats, ErrorClass,
    ErrorObserver, Fingerprint, Inbox, InboxBackend, InboxConnection, InboxEntry, InboxError,
    InboxKey, InvalidKey, Outcome, Overview, Prerequisite, Processed, Purge, PurgeReport,
    RegisteredHandler, RetryableError, RowCount, Stored, StoredResult, StreamPosition,
    TableProblem, Verdict, COUNT_CAP, MAX_KEY_BYTES, MAX_PURGE_BATCH, RATE_CAP, RATE_MINUTES,
    SCHEMA_VERSION,
};

// Lets expanded code name `::diesel_inbox` inside this crate's own tests.
extern crate self as diesel_inbox;

#[cfg(feature = "async")]
pub use inbox_runtime::{
    attempts_async, attempts_list_async, durability_async, forget_async, migrate_async,
    overview_async, positions_async, purge_async, stats_async, status_async, AsAsyncConnection,
    AsyncBatchBody, AsyncBody, AsyncInboxConnection,
};

#[doc(hidden)]
pub use inbox_runtime::{__private, __testing};

/// The `tracing` target of the library's events and spans, the runtime's
/// (used by the brokers, the relay and the HTTP front door).
#[cfg_attr(
    not(any(
        feature = "relay",
        feature = "lapin",
        feature = "nats",
        feature = "axum"
    )),
    allow(unused_imports)
)]
pub(crate) use inbox_runtime::__facade::TRACING_TARGET;

pub mod guide;
pub mod outbox;
#[cfg(feature = "relay")]
pub mod tenants;

#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "sqs"
))]
pub mod brokers;
#[cfg(feature = "console")]
#[cfg_attr(docsrs, doc(cfg(feature = "console")))]
pub mod console;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod http;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;
#[cfg(feature = "lapin")]
pub mod lapin;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub mod sqs;
