//! The axum part: the key as an extractor, a rejection as a response, and
//! `run_async` over any `IntoResponse`; the rest is the framework-free
//! core (`run.rs`).

use super::key::{IdempotencyKey, InvalidIdempotencyKey};
use super::problem;
use super::run::{Answer, Idempotent};
use axum_core::body::Body;
use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, Response};
use http::request::Parts;
use inbox_runtime::{AsAsyncConnection, AsyncBody, AsyncInboxConnection, InboxError};

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = InvalidIdempotencyKey;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        IdempotencyKey::from_headers(&parts.headers)?.ok_or(InvalidIdempotencyKey::Missing)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = InvalidIdempotencyKey;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Self::Rejection> {
        IdempotencyKey::from_headers(&parts.headers)
    }
}

/// `400 Bad Request`, `application/problem+json`.
impl IntoResponse for InvalidIdempotencyKey {
    fn into_response(self) -> Response {
        problem::bad_key(&self.to_string()).map(Body::from)
    }
}

impl Idempotent<'_> {
    /// Runs `body`, `async |conn| -> Result<impl IntoResponse, E>`, in one
    /// transaction with the key's claim, on `conn`: an async connection
    /// (`&mut conn`) or one from a pool (`&mut pooled`), and answers:
    ///
    /// - the first time: the body's response, stored (status,
    ///   `Content-Type`, `Location`, `ETag`, `Content-Encoding`, the
    ///   headers named in [`store_headers`](Self::store_headers), the body
    ///   bytes) in the same transaction;
    /// - a retry after the first committed: the stored response, with
    ///   `Idempotent-Replayed: true`;
    /// - a retry while the first is in flight: it waits up to
    ///   [`wait`](Self::wait), then replays, or runs if the first rolled
    ///   back, or answers `409 Conflict` with `Retry-After`;
    /// - the same key with another [`fingerprint`](Self::fingerprint):
    ///   `422 Unprocessable Content`, nothing run;
    /// - the body's `Err`: rolled back (the key is free again) and
    ///   returned;
    /// - a panic of the body: rolled back, `500`.
    ///
    /// 400, 409, 422 and 500 are `Ok` responses
    /// (`application/problem+json`); `Err` is the body's error or the
    /// inbox's ([`InboxError`], through `E: From<InboxError>`: a database
    /// that cannot be reached, say). A transient failure of the body's
    /// statements (a deadlock, a serialization failure) reruns the
    /// transaction, so the body is `Clone` (an `async` closure that
    /// borrows what it uses is).
    pub async fn run_async<P, Via, C, R, E, F>(self, conn: &mut P, body: F) -> Result<Response, E>
    where
        P: AsAsyncConnection<C, Via>,
        C: AsyncInboxConnection,
        for<'c> F: AsyncBody<&'c mut C, Result<R, E>, Fut: Send> + Clone + Send,
        R: IntoResponse,
        E: From<InboxError> + Send,
    {
        let body = async move |conn: &mut C| -> Result<Response, E> {
            body(conn).await.map(IntoResponse::into_response)
        };
        Ok(match self.run_http(conn.connection(), body).await? {
            Answer::Live(response) => response.map(Body::new),
            Answer::Own(_, response) => response.map(Body::from),
        })
    }
}
