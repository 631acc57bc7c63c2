//! The HTTP front door: `Idempotency-Key` on axum handlers, deduplicated
//! in the handler's own transaction (feature `axum`).
//!
//! A client's retry of a request (a flaky network, a double submit, a
//! gateway's timeout) carries the same `Idempotency-Key` header. The key,
//! scoped by the caller and the endpoint, is claimed as an inbox row in
//! the transaction of the handler's own writes, and the handler's
//! response is stored in that row before the commit: a retry gets the
//! stored response, marked `Idempotent-Replayed: true`, and never runs the
//! handler again. A request that fails, panics or is killed rolls its
//! claim back with its writes: there is no lock to expire.
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{http::StatusCode, response::Response, Json};
//! use diesel::prelude::*;
//! use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
//! use diesel_async::AsyncConnection;
//! use diesel_inbox::http::{IdempotencyKey, Idempotent};
//! use diesel_inbox::InboxError;
//!
//! type Conn = SyncConnectionWrapper<SqliteConnection>;
//!
//! async fn create_payment(conn: &mut Conn, user: &str, key: &IdempotencyKey, cents: i64)
//!     -> Result<Response, InboxError>
//! {
//!     Idempotent::new("payments", user, key)
//!         .fingerprint(&cents)
//!         .run_async(conn, async |conn: &mut Conn| {
//!             // the business writes, in the same transaction as the key
//!             let _ = conn;
//!             Ok::<_, InboxError>((StatusCode::CREATED, Json(cents)))
//!         })
//!         .await
//! }
//!
//! let mut conn = Conn::establish(":memory:").await?;
//! diesel_inbox::migrate_async(&mut conn).await?;
//! let key = IdempotencyKey::parse("8e03978e-40d5-43e8-bc93-6894a57f9324")?;
//!
//! let first = create_payment(&mut conn, "user-1", &key, 500).await?;
//! assert_eq!(first.status(), StatusCode::CREATED);
//! assert!(first.headers().get("idempotent-replayed").is_none());
//!
//! let retry = create_payment(&mut conn, "user-1", &key, 500).await?;
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//!
//! let other_request = create_payment(&mut conn, "user-1", &key, 999).await?;
//! assert_eq!(other_request.status(), StatusCode::UNPROCESSABLE_ENTITY);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! The guide page [`guide::http`](crate::guide::http) is the reference:
//! what is stored, the scope, the wait, retention, what is not
//! guaranteed.

mod axum;
mod key;
mod problem;
mod run;
mod stored;

pub use key::{IdempotencyKey, InvalidIdempotencyKey, MAX_IDEMPOTENCY_KEY_BYTES};
pub use run::{consumer_name, message_id, Idempotent, RETENTION};

/// The request header that carries the key: `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// The response header of a replayed response: `Idempotent-Replayed:
/// true`.
pub const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");
