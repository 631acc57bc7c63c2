//! The operations console (feature `console`): the inbox, the outbox, the
//! stream positions and the dead messages in a browser, with safe actions.
//!
//! [`router`] is an [`axum::Router`] to mount in your own axum app, behind
//! your own authentication layer; the settings come from
//! [`ConsoleExt`]. Its pages are HTML drawn on the server (no JavaScript
//! build, no third-party assets; one small script of its own refreshes the
//! overview every five seconds) and run the same statements as the CLI:
//!
//! - **Overview** (`/`): per consumer (and HTTP endpoint) its rows, the
//!   rows applied per minute with a chart of the last
//!   [`RATE_MINUTES`](crate::RATE_MINUTES), the duplicates this process
//!   saw ([`recent_duplicates`](crate::recent_duplicates)), its failing
//!   keys and those past `max_attempts`; per outbox destination the pending, scheduled and dead
//!   messages and the oldest pending one's age; the Kafka stream positions.
//! - **Dead messages** (`/dead`): the outbox's, filtered by destination,
//!   error text and time, each with its payload, headers, trace id,
//!   attempts and last error, to **retry** or **discard**, one or every
//!   one the filter selects; and the inbox's failing keys, by consumer.
//! - **Lookup** (`/lookup`): an inbox row or an HTTP idempotency key by
//!   consumer and key, to **forget** (the CLI's `forget`).
//!
//! Every read and action has a time limit ([`QUERY_TIME_LIMIT`]): a
//! database that is down or hung gives a page that says so, never a
//! request that hangs.
//!
//! **Names.** Without [`authorize`](ConsoleExt::authorize) the console
//! answers only requests for `localhost`, a loopback address or a name
//! you allow ([`allow_hosts`](ConsoleExt::allow_hosts)); any other `Host`
//! gets `421` and nothing runs (a web page cannot reach it through a name
//! of its own that resolves to loopback: DNS rebinding).
//!
//! **Actions** are POSTs that carry the page's CSRF token. They are
//! refused on a [`read_only`](ConsoleExt::read_only) console (which shows
//! none), refused when [`authorize`](ConsoleExt::authorize) says no, and,
//! without `authorize`, refused unless the request comes from a loopback
//! address (which needs the peer's address: serve with
//! `into_make_service_with_connect_info::<SocketAddr>()`). Behind a
//! reverse proxy every request comes from the proxy: set `authorize`. An
//! action whose `Origin` is not its `Host`'s own, or that the browser
//! marks `Sec-Fetch-Site: cross-site`, is refused (`403`).
//! Each action is logged (target `diesel_inbox`, INFO) with who did it
//! ([`Operator`], else the Basic user, else the peer's address) and what,
//! and counted (`diesel_inbox.console.actions`, feature `metrics`).
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use diesel::SqliteConnection;
//! use diesel_async::pooled_connection::deadpool::Pool;
//! use diesel_async::pooled_connection::AsyncDieselConnectionManager;
//! use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
//! use diesel_inbox::console::{self, ConsoleExt, Operator};
//! use std::net::SocketAddr;
//!
//! type Conn = SyncConnectionWrapper<SqliteConnection>;
//! let dir = std::env::temp_dir().join(format!("console-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let url = dir.join("inbox.db").display().to_string();
//! let pool = Pool::builder(AsyncDieselConnectionManager::<Conn>::new(&url)).build()?;
//! diesel_inbox::migrate_async(&mut pool.get().await?).await?;
//!
//! let app = axum::Router::new().nest(
//!     "/ops",
//!     console::router(pool)
//!         .max_attempts(5)
//!         // Your authentication layer decides; the console logs who.
//!         .authorize(|parts| parts.extensions.get::<Operator>().is_some()),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let serve =
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>());
//! # drop(serve);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! The CLI serves it too: `diesel-inbox console --listen 127.0.0.1:8080`.
//! Over a database per tenant, [`tenants`] is the console of a
//! [`Tenants`](crate::tenants::Tenants) set: the tenants' overview with a
//! tenant column and filter, and each tenant's own pages.
//! The guide page [`guide::console`](crate::guide::console) is the
//! reference.

mod actions;
mod basic;
mod host;
mod html;
#[cfg(feature = "kafka")]
mod lag;
mod pages;
mod tenants;
mod time;

pub use tenants::{tenants, TENANTS_PER_PAGE};

use crate::outbox::RelayPool;
use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, Request};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;
use std::time::Duration;

/// How long a page or an action waits for the database (a connection from
/// the pool, then its statements) before it answers `503` with a page
/// that says so.
pub const QUERY_TIME_LIMIT: Duration = Duration::from_secs(5);

/// Who is acting, as your authentication layer knows them: insert it into
/// the request's extensions and the console's log of each action names
/// them.
///
/// ```
/// use diesel_inbox::console::Operator;
///
/// let mut request = axum::http::Request::new(());
/// request.extensions_mut().insert(Operator("alice@example.com".into()));
/// assert_eq!(request.extensions().get::<Operator>().unwrap().0, "alice@example.com");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator(pub String);

/// The console's settings on the [`Router`] that [`router`] returns.
///
/// Each adds a layer; a later call overrides an earlier one.
pub trait ConsoleExt: Sized {
    /// Shows no action and refuses every one (`403`).
    fn read_only(self, read_only: bool) -> Self;

    /// Decides, from the request's parts (its headers, the
    /// [`Operator`] your authentication layer inserted), whether an action
    /// may run. Without it, only requests from a loopback address may act.
    fn authorize<F>(self, authorize: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static;

    /// Names besides loopback that a console without
    /// [`authorize`](Self::authorize) answers to (`ops.internal`, an
    /// address it listens on that is not loopback): compared with the
    /// request's `Host`, without its port, case-insensitively. Without
    /// `authorize` the console answers only `localhost` (and names under
    /// it), loopback addresses and these; any other `Host` gets
    /// `421 Misdirected Request` and nothing runs, so that a web page
    /// cannot reach a console on loopback through a name of its own that
    /// resolves there (DNS rebinding). With `authorize`, your
    /// authentication decides and the `Host` is not checked.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel::SqliteConnection;
    /// use diesel_async::pooled_connection::deadpool::Pool;
    /// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    /// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    /// use diesel_inbox::console::{self, ConsoleExt};
    ///
    /// type Conn = SyncConnectionWrapper<SqliteConnection>;
    /// let pool = Pool::builder(AsyncDieselConnectionManager::<Conn>::new(":memory:")).build()?;
    /// let app = console::router(pool).allow_hosts(["ops.internal", "10.0.0.5"]);
    /// # drop(app);
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "sqlite"))]
    /// # fn main() {}
    /// ```
    fn allow_hosts<I, H>(self, hosts: I) -> Self
    where
        I: IntoIterator<Item = H>,
        H: Into<String>;

    /// The handlers' `max_attempts` (which the table does not record): the
    /// overview counts the keys with at least this many failures as given
    /// up on, and the dead messages page lists them.
    fn max_attempts(self, max_attempts: u32) -> Self;

    /// Shows each stream position's lag: the partition's high watermark,
    /// asked of the Kafka `brokers` (`host:port,...`) at each load, less
    /// the position (feature `kafka`).
    #[cfg(feature = "kafka")]
    fn kafka_lag(self, brokers: impl Into<String>) -> Self;
}

/// A setting, carried in the request's extensions by its layer.
#[derive(Clone)]
struct ReadOnly(bool);

#[derive(Clone)]
struct Authorize(Arc<dyn Fn(&Parts) -> bool + Send + Sync>);

#[derive(Clone, Copy)]
struct MaxAttempts(u32);

/// The tenant whose console a request reaches through the tenants'
/// console (set by its route): the pages name it and link back.
#[derive(Clone)]
struct InTenant {
    /// The tenant's name.
    name: String,
    /// The path the tenants' console is mounted at (`""` at the root).
    tenants_base: String,
}

/// The names besides loopback a console without `authorize` answers to
/// (lowercase, without a port or a trailing dot).
#[derive(Clone)]
struct AllowedHosts(Vec<String>);

/// The console's Kafka lag asker (one per `kafka_lag` call, shared by its
/// requests).
#[cfg(feature = "kafka")]
#[derive(Clone)]
struct KafkaBrokers(Arc<lag::Lags>);

/// Adds a layer that sets `value` unless a layer outside it (a later
/// call) did.
fn setting<T: Clone + Send + Sync + 'static>(router: Router, value: T) -> Router {
    router.layer(axum::middleware::map_request(
        move |mut request: Request<axum::body::Body>| {
            let value = value.clone();
            async move {
                if request.extensions().get::<T>().is_none() {
                    request.extensions_mut().insert(value);
                }
                request
            }
        },
    ))
}

impl ConsoleExt for Router {
    fn read_only(self, read_only: bool) -> Self {
        setting(self, ReadOnly(read_only))
    }

    fn authorize<F>(self, authorize: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        setting(self, Authorize(Arc::new(authorize)))
    }

    fn allow_hosts<I, H>(self, hosts: I) -> Self
    where
        I: IntoIterator<Item = H>,
        H: Into<String>,
    {
        let names = hosts
            .into_iter()
            .filter_map(|host| host::host_name(&host.into()))
            .collect();
        setting(self, AllowedHosts(names))
    }

    fn max_attempts(self, max_attempts: u32) -> Self {
        setting(self, MaxAttempts(max_attempts))
    }

    #[cfg(feature = "kafka")]
    fn kafka_lag(self, brokers: impl Into<String>) -> Self {
        setting(self, KafkaBrokers(lag::Lags::new(brokers.into())))
    }
}

/// What every handler shares: the pool and this console's CSRF token.
struct Console<P> {
    pool: P,
    csrf: String,
}

/// The operations console on `pool` (a diesel-async deadpool or bb8
/// pool, as the relay's: [`RelayPool`]), to mount where you like
/// (`Router::nest("/ops", ..)`: its links follow; the overview is then
/// `/ops`, or `/ops/` under `nest("/ops/", ..)`, as axum routes a nested
/// `/`, and `/ops/overview` under either). Settings: [`ConsoleExt`].
/// Example: [the module](self).
pub fn router<P>(pool: P) -> Router
where
    P: RelayPool + 'static,
{
    routes(pool, token())
}

/// The console's routes on `pool`, whose actions carry `csrf`.
fn routes<P>(pool: P, csrf: String) -> Router
where
    P: RelayPool + 'static,
{
    let console = Arc::new(Console { pool, csrf });
    Router::new()
        .route("/", get(pages::overview::<P>))
        .route("/overview", get(pages::overview::<P>))
        .route("/live", get(pages::live::<P>))
        .route("/dead", get(pages::dead::<P>))
        .route("/lookup", get(pages::lookup::<P>))
        .route("/actions/{action}", post(actions::act::<P>))
        .route("/console.css", get(html::stylesheet))
        .route("/console.js", get(html::script))
        .with_state(console)
        .layer(axum::middleware::from_fn(host::check))
        .layer(axum::middleware::map_response(secure))
}

/// Headers that keep the pages to themselves: no script, style or frame
/// from elsewhere (nor inline: the console's own are files), no framing.
async fn secure(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // No referrer to other sites; its own forms keep their `Origin`
    // (under `no-referrer` a browser sends `Origin: null`, which actions
    // refuse).
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A token no other site can guess: 128 bits from the operating system's
/// random source (`getrandom`).
fn token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .expect("the operating system's random source (the console's CSRF token)");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A request's view of the console: where it is mounted and its settings.
struct Context {
    /// The path the console is mounted at (`""` at the root).
    base: String,
    read_only: bool,
    max_attempts: Option<u32>,
    /// Where to ask for the positions' lag.
    #[cfg(feature = "kafka")]
    kafka: Option<Arc<lag::Lags>>,
    /// The tenant, on a tenant's pages of the tenants' console.
    tenant: Option<InTenant>,
}

impl<S: Send + Sync> FromRequestParts<S> for Context {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let inner = parts.uri.path();
        let original = parts
            .extensions
            .get::<OriginalUri>()
            .map_or(inner, |uri| uri.0.path());
        // Nested at `/ops`: `/ops/dead` is `/dead` inside, and `/ops`
        // itself is `/`.
        let base = match original.strip_suffix(inner) {
            Some(base) => base,
            None if inner == "/" => original,
            None => "",
        }
        .trim_end_matches('/')
        .to_owned();
        Ok(Context {
            base,
            read_only: parts.extensions.get::<ReadOnly>().is_some_and(|r| r.0),
            max_attempts: parts.extensions.get::<MaxAttempts>().map(|m| m.0),
            #[cfg(feature = "kafka")]
            kafka: parts.extensions.get::<KafkaBrokers>().map(|k| k.0.clone()),
            tenant: parts.extensions.get::<InTenant>().cloned(),
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_token_is_128_random_bits() {
        let (a, b) = (super::token(), super::token());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
