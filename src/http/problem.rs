//! The answers the front door gives itself, as RFC 9457 problem details
//! (`application/problem+json`).

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

/// A problem-details response: `status`, a `title` that names the
/// problem, a `detail` for this request.
pub(crate) fn problem(status: StatusCode, title: &str, detail: &str) -> Response<Bytes> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// `400`: the key is missing or invalid.
pub(crate) fn bad_key(detail: &str) -> Response<Bytes> {
    problem(
        StatusCode::BAD_REQUEST,
        "Invalid or missing Idempotency-Key",
        detail,
    )
}

/// `409`: a request with the same key is still in flight; `retry_after`
/// in whole seconds.
pub(crate) fn in_flight(retry_after: u64) -> Response<Bytes> {
    let mut response = problem(
        StatusCode::CONFLICT,
        "A request with this Idempotency-Key is still being processed",
        "retry after the first request has finished; it then gets that request's response",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

/// `422`: the key was used before with another request.
pub(crate) fn key_reused() -> Response<Bytes> {
    problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Idempotency-Key reused with a different request",
        "this key was used before with a request whose content differs; use a new key for a new request",
    )
}

/// `500`: the handler panicked (rolled back; the key is free again).
pub(crate) fn panicked() -> Response<Bytes> {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "The request failed",
        "the handler failed and nothing was kept; retrying with the same Idempotency-Key runs it again",
    )
}
