//! The framework-free core of the front door: a request's key claimed as
//! an inbox row, the handler's `http::Response` stored in it, replays,
//! and the answers of its own (409, 422, 500), over the inbox's one
//! engine ([`Inbox`] with a stored result and a wait bound).

use super::key::IdempotencyKey;
use super::problem;
use super::stored::{capture, Replay, StoredResponse};
use bytes::Bytes;
use http::{HeaderName, Response};
use inbox_runtime::__facade::{caught, describe_panic, Codec, HttpTelemetry};
use inbox_runtime::{AsyncBody, AsyncInboxConnection, Fingerprint, Inbox, InboxError, Stored};
use std::time::Duration;
use tracing::Instrument;

/// How long a request waits for an in-flight request with the same key
/// by default (see [`Idempotent::wait`]).
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(5);

/// The largest response body stored by default (1 MiB; see
/// [`Idempotent::max_stored_body`]).
pub(crate) const DEFAULT_MAX_STORED_BODY: usize = 1024 * 1024;

/// How long stored responses are meant to be kept: 24 hours, as Stripe
/// keeps keys. The inbox's purge removes them (`diesel-inbox purge
/// --consumer http:<endpoint> --older-than 24h`, or
/// [`purge`](crate::purge) with this).
pub const RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// The consumer (inbox scope) of an endpoint's keys: `http:` and the
/// endpoint, what the CLI's `status`, `forget` and `purge` take.
///
/// ```
/// assert_eq!(diesel_inbox::http::consumer_name("payments"), "http:payments");
/// ```
pub fn consumer_name(endpoint: &str) -> String {
    format!("http:{endpoint}")
}

/// The inbox key of `key` sent by `scope`: the scope's length, the scope
/// and the key, `{len}:{scope}:{key}` (so that no two scopes share a key),
/// or, when that is over 255 bytes, `sha256:` and the hex digest of it.
/// What the CLI's `forget` takes.
///
/// ```
/// use diesel_inbox::http::{message_id, IdempotencyKey};
///
/// let key = IdempotencyKey::parse("k-1")?;
/// assert_eq!(message_id("user-7", &key), "6:user-7:k-1");
/// assert!(message_id(&"u".repeat(300), &key).starts_with("sha256:"));
/// # Ok::<(), diesel_inbox::http::InvalidIdempotencyKey>(())
/// ```
pub fn message_id(scope: &str, key: &IdempotencyKey) -> String {
    let id = format!("{}:{scope}:{}", scope.len(), key.as_str());
    if id.len() <= inbox_runtime::MAX_KEY_BYTES {
        return id;
    }
    let digest = Fingerprint::of_bytes(id.as_bytes());
    let mut hex = String::from("sha256:");
    for byte in &digest.as_bytes()[1..] {
        hex.push_str(&format!("{byte:02x}"));
    }
    hex
}

/// One request through the front door: its endpoint, the caller's scope
/// and its key, with the options of the builder; [`run_async`]
/// (`Idempotent::run_async`) runs the handler's body.
///
/// [`run_async`]: Idempotent::run_async
#[derive(Debug)]
pub struct Idempotent<'k> {
    endpoint: String,
    consumer: String,
    scope: String,
    key: &'k IdempotencyKey,
    fingerprint: Option<Result<Fingerprint, String>>,
    wait: Duration,
    max_stored_body: usize,
    store_headers: Vec<HeaderName>,
}

impl<'k> Idempotent<'k> {
    /// A request to `endpoint` (a name of yours: `"payments"`; its keys
    /// are the inbox consumer [`consumer_name(endpoint)`](consumer_name))
    /// by `scope` (the tenant, user or account the key belongs to: the
    /// same key from two scopes is two keys, so one caller can never
    /// replay another's response) with `key`. An empty endpoint or scope
    /// is refused when the request runs ([`InboxError::InvalidArgument`]).
    pub fn new<S: std::fmt::Display + ?Sized>(
        endpoint: &str,
        scope: &S,
        key: &'k IdempotencyKey,
    ) -> Self {
        Idempotent {
            endpoint: endpoint.to_owned(),
            consumer: consumer_name(endpoint),
            scope: scope.to_string(),
            key,
            fingerprint: None,
            wait: DEFAULT_WAIT,
            max_stored_body: DEFAULT_MAX_STORED_BODY,
            store_headers: Vec::new(),
        }
    }

    /// The request's content, as its fingerprint (canonical JSON, SHA-256):
    /// a key sent again with other content is answered `422`, and the
    /// body does not run. A value that does not serialize fails the
    /// request ([`InboxError::FingerprintFailed`]).
    pub fn fingerprint<T: serde::Serialize + ?Sized>(mut self, content: &T) -> Self {
        self.fingerprint = Some(Fingerprint::of_serialize(content).map_err(|e| e.to_string()));
        self
    }

    /// The request's content as bytes (the raw body), as its fingerprint.
    pub fn fingerprint_bytes(mut self, content: &[u8]) -> Self {
        self.fingerprint = Some(Ok(Fingerprint::of_bytes(content)));
        self
    }

    /// How long a request waits for an in-flight one with the same key
    /// (default 5 s): it waits on the first's uncommitted
    /// claim, then replays the first's response if it committed, runs the
    /// body if it rolled back, or answers `409 Conflict` with
    /// `Retry-After: 1` when the wait runs out. PostgreSQL rounds to
    /// milliseconds, MySQL/MariaDB up to whole seconds; on SQLite it is
    /// the wait for the database's write lock, which any writer holds.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The largest response body stored (default 1 MiB). A larger body is sent whole to
    /// the first request, but only the status and headers are stored: a
    /// retry gets them with an empty body, and the handler never runs
    /// again.
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.max_stored_body = bytes;
        self
    }

    /// Headers stored and replayed beyond the defaults (`Content-Type`,
    /// `Location`, `ETag`, `Content-Encoding`).
    pub fn store_headers(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.store_headers.extend(headers);
        self
    }

    /// The core of `run_async`: the handler's `http::Response<B>`, stored
    /// and returned, or the stored one replayed, or an answer of the front
    /// door's own; a panic of the body (rolled back) is a `500`.
    pub(crate) async fn run_http<C, B, E, F>(self, conn: &mut C, body: F) -> Result<Answer<B>, E>
    where
        C: AsyncInboxConnection,
        for<'c> F: AsyncBody<&'c mut C, Result<Response<B>, E>, Fut: Send> + Clone + Send,
        B: http_body::Body<Data = Bytes> + Unpin + Send,
        B::Error: std::fmt::Display,
        E: From<InboxError> + Send,
    {
        let telemetry = HttpTelemetry::start(&self.endpoint);
        let span = telemetry.span().clone();
        let claim_and_run = async move {
            if self.endpoint.is_empty() {
                return Err(
                    InboxError::InvalidArgument("Idempotent::new: the endpoint is empty").into(),
                );
            }
            if self.scope.is_empty() {
                return Err(InboxError::InvalidArgument(
                    "Idempotent::new: the scope is empty (the tenant, user or account the key belongs to)",
                )
                .into());
            }
            let id = message_id(&self.scope, self.key);
            let (max, headers) = (self.max_stored_body, self.store_headers.as_slice());
            let run = async move |conn: &mut C| -> Result<Captured<B>, Failed<E>> {
                let response = body(conn).await.map_err(Failed::Handler)?;
                let (stored, live) = capture(response, max, headers)
                    .await
                    .map_err(Failed::Body)?;
                Ok(Captured {
                    stored,
                    live: Some(live),
                })
            };
            let outcome = Inbox::consumer(&self.consumer)
                .wait(self.wait)
                .store_result()
                .fingerprint(self.fingerprint.clone())
                .run_async(conn, &id, run)
                .await;
            Ok(match outcome {
                Ok(Stored::Applied(Captured { live: Some(live), .. })) => Answer::Live(live),
                Ok(Stored::Applied(Captured { live: None, .. })) => {
                    unreachable!("the body's own value keeps its response")
                }
                Ok(Stored::Duplicate(Some(captured))) => {
                    Answer::Own("replayed", captured.stored.replay())
                }
                Ok(Stored::Duplicate(None)) => {
                    return Err(InboxError::StoredResultUnreadable {
                        consumer: self.consumer.into(),
                        key: id.into(),
                        reason: "the key's inbox row has no stored response (was it written by something other than the HTTP front door?)".into(),
                    }
                    .into())
                }
                Err(Failed::Handler(e)) => return Err(e),
                Err(Failed::Body(reason)) => {
                    return Err(InboxError::ResultNotStored {
                        consumer: self.consumer.into(),
                        key: id.into(),
                        reason: reason.into(),
                    }
                    .into())
                }
                Err(Failed::Inbox(InboxError::KeyReused { .. })) => {
                    Answer::Own("mismatch", problem::key_reused())
                }
                Err(Failed::Inbox(InboxError::InFlight { .. })) => {
                    Answer::Own("conflict", problem::in_flight(1))
                }
                Err(Failed::Inbox(e)) => return Err(e.into()),
            })
        };
        let caught = caught(claim_and_run.instrument(span)).await;
        let (outcome, answer) = match caught {
            Ok(Ok(answer)) => (answer.outcome(), Ok(answer)),
            Ok(Err(e)) => ("error", Err(e)),
            // The engine rolled the claim back before the panic went on.
            Err(panic) => {
                let panic = describe_panic(&*panic);
                tracing::error!(target: crate::TRACING_TARGET, parent: telemetry.span(), panic, "diesel-inbox: the request's handler panicked; rolled back, answered 500");
                ("error", Ok(Answer::Own("error", problem::panicked())))
            }
        };
        telemetry.finished(outcome);
        answer
    }
}

/// What a request got: the handler's own response (the first request),
/// or one the front door made (a replay, 409, 422, 500) with its
/// outcome's name.
pub(crate) enum Answer<B> {
    Live(Response<Replay<B>>),
    Own(&'static str, Response<Bytes>),
}

impl<B> Answer<B> {
    fn outcome(&self) -> &'static str {
        match self {
            Answer::Live(_) => "applied",
            Answer::Own(outcome, _) => outcome,
        }
    }
}

/// The body's value as the inbox stores it: the stored response, and
/// the first request's own response (`None` once read back).
pub(crate) struct Captured<B> {
    stored: StoredResponse,
    live: Option<Response<Replay<B>>>,
}

impl<B> inbox_runtime::StoredResult for Captured<B> {
    const CODEC: Codec<Self> = Codec::new(
        |captured| captured.stored.encode(),
        |bytes| StoredResponse::decode(bytes).map(|stored| Captured { stored, live: None }),
    );
}

/// How a request's inbox call failed: the handler's own error, its
/// response body's, or the inbox's (a reused key, a request in flight).
enum Failed<E> {
    Handler(E),
    Body(String),
    Inbox(InboxError),
}

impl<E> From<InboxError> for Failed<E> {
    fn from(e: InboxError) -> Self {
        Failed::Inbox(e)
    }
}

impl<E> From<diesel::result::Error> for Failed<E> {
    fn from(e: diesel::result::Error) -> Self {
        Failed::Inbox(InboxError::Database(e))
    }
}

// `E` need not be `Debug` (a handler's error type often is not): the
// inbox's telemetry names the handler's error without it.
impl<E> std::fmt::Debug for Failed<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Handler(_) => f.write_str("the handler returned its error"),
            Failed::Body(reason) => write!(f, "the response body could not be read: {reason}"),
            Failed::Inbox(e) => write!(f, "{e}"),
        }
    }
}
