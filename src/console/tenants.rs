//! The console over every tenant of a [`Tenants`] set ([`tenants`]): the
//! tenants' overview, a page of them at a time, with a tenant column and a
//! tenant filter; and each tenant's own console (the single database's
//! pages and actions) under `tenants/{name}/`.

use super::html::{self, esc, page, url, View};
use super::pages::{checked_text, rows};
use super::{Console, Context};
use crate::tenants::{Tenant, TenantPool, Tenants};
use crate::{Overview, RowCount};
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{Request, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use futures_util::stream::{self, StreamExt};
use serde::Deserialize;
use std::fmt::Write;
use std::sync::Arc;
use tower_service::Service;
use tracing::Instrument;

/// How many tenants the tenants' overview reads and shows at once: a
/// page's cost is bounded by it, not by the size of the set.
pub const TENANTS_PER_PAGE: usize = 25;

/// What the tenants' pages share: the set, and each tenant's console's
/// CSRF token (its own: a token read on one tenant's page acts on no
/// other tenant).
struct TenantsConsole<T: TenantPool> {
    tenants: Tenants<T>,
    tokens: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl<T: TenantPool> TenantsConsole<T> {
    /// Tenant `name`'s CSRF token, made on first use.
    fn token(&self, name: &str) -> String {
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        // Only the set's tenants get one: the map stays within the set.
        tokens.retain(|tenant, _| self.tenants.contains(tenant));
        tokens
            .entry(name.to_owned())
            .or_insert_with(super::token)
            .clone()
    }
}

/// How long the tenants' overview waits in all for the tenants it reads:
/// a tenant not read by then shows as such (a page of hung tenants, more
/// than are read at once, does not hold the page longer).
const PAGE_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The operations console over every tenant of `tenants`, to mount as
/// [`router`](super::router)'s (settings: [`ConsoleExt`](super::ConsoleExt),
/// for every tenant's pages):
///
/// - **Tenants** (`/`): a page of [`TENANTS_PER_PAGE`] tenants in name
///   order, those whose name contains the filter (`?tenant=acme`,
///   case-insensitive), each read within
///   [`QUERY_TIME_LIMIT`](super::QUERY_TIME_LIMIT) and the page within
///   10 s in all, at most as many at once as the set's pools fit its
///   connection limit: per tenant its
///   inbox rows, failing keys and outbox counts; then every consumer and
///   every outbox destination of the page with a tenant column. A tenant
///   whose database is down or hung shows why, and the others show.
/// - **A tenant's console** (`/tenants/{name}/`): the single database's
///   overview, dead messages and lookup, with their actions, on the
///   tenant's pool, with a CSRF token of its own; its events (the log of
///   each action) are in a span that names the tenant, and
///   [`authorize`](super::ConsoleExt::authorize) sees the tenant's
///   request, whose full path is in axum's `OriginalUri`. A name not in
///   the set (read again from its source, [`Tenants::from_fn`], before it
///   is called unknown) is `404`.
///
/// A set read from a source is read again when a page names a tenant it
/// does not have; call [`Tenants::refresh`] from time to time for the
/// overview to show tenants added since.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel_async::pooled_connection::deadpool::Pool;
/// use diesel_async::AsyncPgConnection;
/// use diesel_inbox::console::{self, ConsoleExt};
/// use diesel_inbox::tenants::Tenants;
/// use std::net::SocketAddr;
///
/// let tenants: Tenants<Pool<AsyncPgConnection>> =
///     Tenants::list([("acme", "postgres://app@db1/acme"), ("globex", "postgres://app@db2/globex")]);
/// let app = axum::Router::new().nest("/ops", console::tenants(tenants).max_attempts(5));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
/// # Ok(())
/// # }
/// ```
pub fn tenants<T: TenantPool>(tenants: Tenants<T>) -> Router
where
    T::Guard: 'static,
{
    let console = Arc::new(TenantsConsole {
        tenants,
        tokens: Default::default(),
    });
    Router::new()
        .route("/", get(overview::<T>))
        .route("/overview", get(overview::<T>))
        .route("/live", get(live::<T>))
        .route("/tenants/{tenant}", any(tenant::<T>))
        .route("/tenants/{tenant}/", any(tenant::<T>))
        .route("/tenants/{tenant}/{*rest}", any(tenant::<T>))
        .route("/console.css", get(html::stylesheet))
        .route("/console.js", get(html::script))
        .with_state(console)
        .layer(axum::middleware::from_fn(super::host::check))
        .layer(axum::middleware::map_response(super::secure))
}

/// The tenants' overview's query: the name filter and the page (from 1).
#[derive(Deserialize, Default)]
struct TenantsQuery {
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    page: String,
}

impl TenantsQuery {
    /// The page number (from 1), or why the query is wrong.
    fn page(&self) -> Result<usize, String> {
        if !self.tenant.is_empty() {
            checked_text("tenant", &self.tenant)?;
        }
        match self.page.trim() {
            "" => Ok(1),
            page => match page.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(format!("page: {page:?} is not a page number (1, 2, ...)")),
            },
        }
    }

    /// The query string of this filter on `page`.
    fn link(&self, base: &str, path: &str, page: usize) -> String {
        format!("{base}{path}?tenant={}&page={page}", url(&self.tenant))
    }
}

/// One tenant's overview, or why its database did not answer.
type Read = (String, Result<Overview, String>);

/// The tenants of the page that the query selects, read; and how many
/// tenants match.
async fn read_page<T: TenantPool>(
    console: &TenantsConsole<T>,
    context: &Context,
    query: &TenantsQuery,
    page: usize,
) -> (Vec<Read>, usize) {
    let filter = query.tenant.to_lowercase();
    let matching: Vec<String> = console
        .tenants
        .names()
        .into_iter()
        .filter(|name| filter.is_empty() || name.to_lowercase().contains(&filter))
        .collect();
    let total = matching.len();
    let shown: Vec<String> = matching
        .into_iter()
        .skip((page - 1).saturating_mul(TENANTS_PER_PAGE))
        .take(TENANTS_PER_PAGE)
        .collect();
    let at_once = console.tenants.fair_share_beside(0).min(TENANTS_PER_PAGE);
    let max_attempts = context.max_attempts;
    let deadline = tokio::time::Instant::now() + PAGE_TIME_LIMIT;
    let reads = stream::iter(shown)
        .map(|name| async move {
            let read = match console.tenants.tenant(&name) {
                Some(tenant) => {
                    match tokio::time::timeout_at(deadline, read_tenant(tenant, max_attempts)).await
                    {
                        Ok(read) => read,
                        Err(_) => Err(format!(
                            "not read within the page's time limit ({} seconds)",
                            PAGE_TIME_LIMIT.as_secs()
                        )),
                    }
                }
                None => Err("removed from the tenant set".to_owned()),
            };
            (name, read)
        })
        .buffered(at_once)
        .collect()
        .await;
    (reads, total)
}

/// A tenant's overview, within [`QUERY_TIME_LIMIT`](super::QUERY_TIME_LIMIT).
async fn read_tenant<T: TenantPool>(
    tenant: Tenant<T>,
    max_attempts: Option<u32>,
) -> Result<Overview, String>
where
    T::Guard: 'static,
{
    let one = Console {
        pool: tenant,
        csrf: String::new(),
    };
    super::pages::with_db!(one, |conn| crate::overview_async(conn, max_attempts)).await
}

async fn overview<T: TenantPool>(
    State(console): State<Arc<TenantsConsole<T>>>,
    context: Context,
    Query(query): Query<TenantsQuery>,
) -> Response
where
    T::Guard: 'static,
{
    let base = esc(&context.base);
    let mut body = format!(
        "<form class=\"filter\" method=\"get\" action=\"{base}/overview\">\
         <label>tenant <input name=\"tenant\" value=\"{}\" placeholder=\"acme\"></label>\
         <button type=\"submit\">Filter</button></form>",
        esc(&query.tenant)
    );
    let page_number = match query.page() {
        Ok(n) => n,
        Err(why) => {
            let _ = write!(
                body,
                "<p class=\"error\" id=\"bad-input\">{}</p>",
                esc(&why)
            );
            return page(
                StatusCode::BAD_REQUEST,
                &context,
                View::Tenants,
                None,
                &body,
            );
        }
    };
    let (reads, total) = read_page(&console, &context, &query, page_number).await;
    let _ = write!(
        body,
        "<p id=\"state\">live: refreshed every 5 seconds</p><div id=\"live\" data-src=\"{}\">{}</div>",
        esc(&query.link(&context.base, "/live", page_number)),
        tables(&context, &query, page_number, &reads, total)
    );
    page(StatusCode::OK, &context, View::Tenants, None, &body)
}

/// The tenants' tables alone, for the live update.
async fn live<T: TenantPool>(
    State(console): State<Arc<TenantsConsole<T>>>,
    context: Context,
    Query(query): Query<TenantsQuery>,
) -> Response
where
    T::Guard: 'static,
{
    let page_number = match query.page() {
        Ok(n) => n,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let (reads, total) = read_page(&console, &context, &query, page_number).await;
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        tables(&context, &query, page_number, &reads, total),
    )
        .into_response()
}

/// Rows counted in several databases: exact only if each count is.
fn sum(counts: impl Iterator<Item = RowCount>) -> RowCount {
    counts.fold(RowCount::Exact(0), |total, count| match (total, count) {
        (RowCount::Exact(a), RowCount::Exact(b)) => RowCount::Exact(a + b),
        (RowCount::Exact(a) | RowCount::AtLeast(a), RowCount::Exact(b) | RowCount::AtLeast(b)) => {
            RowCount::AtLeast(a + b)
        }
    })
}

fn tables(
    context: &Context,
    query: &TenantsQuery,
    page_number: usize,
    reads: &[Read],
    total: usize,
) -> String {
    let base = esc(&context.base);
    let pages = total.div_ceil(TENANTS_PER_PAGE).max(1);
    let mut out = format!(
        "<p class=\"muted\" id=\"tenants-shown\">{total} tenant{} match; page {page_number} of {pages}",
        if total == 1 { "" } else { "s" }
    );
    if page_number > 1 {
        let _ = write!(
            out,
            " · <a id=\"previous\" href=\"{}\">previous</a>",
            esc(&query.link(&context.base, "/overview", page_number - 1))
        );
    }
    if page_number < pages {
        let _ = write!(
            out,
            " · <a id=\"next\" href=\"{}\">next</a>",
            esc(&query.link(&context.base, "/overview", page_number + 1))
        );
    }
    out.push_str("</p>");
    let age = |a: Option<std::time::Duration>| a.map_or("-".to_owned(), html::age);
    let exhausted = |n: Option<u64>| {
        n.map_or_else(
            || "<span title=\"set max_attempts to count them\">-</span>".to_owned(),
            |n| n.to_string(),
        )
    };
    out.push_str(
        "<h2>Tenants</h2><table id=\"tenants\"><tr><th>tenant</th><th class=\"n\">consumers</th>\
         <th class=\"n\">rows kept</th><th class=\"n\">applied, last minute</th>\
         <th class=\"n\">attempts in progress</th><th class=\"n\">past max_attempts</th>\
         <th class=\"n\">outbox pending</th><th class=\"n\">scheduled</th><th class=\"n\">dead</th>\
         <th class=\"n\">oldest pending</th></tr>",
    );
    if reads.is_empty() {
        out.push_str("<tr><td colspan=\"10\" class=\"muted\">no tenant matches</td></tr>");
    }
    for (name, read) in reads {
        let link = format!(
            "<a href=\"{base}/tenants/{}/\">{}</a>",
            esc(&url(name)),
            esc(name)
        );
        match read {
            Ok(o) => {
                let last = |c: &crate::ConsumerActivity| {
                    c.per_minute
                        .get(c.per_minute.len().saturating_sub(2))
                        .copied()
                        .unwrap_or(0)
                };
                let _ = write!(
                    out,
                    "<tr data-tenant=\"{}\"><td>{link}</td><td class=\"n\">{}</td><td class=\"n rows\">{}</td>\
                     <td class=\"n rate\">{}</td><td class=\"n failing\">{}</td><td class=\"n exhausted\">{}</td>\
                     <td class=\"n pending\">{}</td><td class=\"n scheduled\">{}</td><td class=\"n dead\">{}</td>\
                     <td class=\"n\">{}</td></tr>",
                    esc(name),
                    o.consumers.len(),
                    rows(sum(o.consumers.iter().map(|c| c.rows))),
                    o.consumers.iter().map(last).sum::<u64>(),
                    o.consumers.iter().map(|c| c.failing).sum::<u64>(),
                    exhausted(o.consumers.iter().map(|c| c.exhausted).sum()),
                    o.outbox.pending,
                    o.outbox.scheduled,
                    o.outbox.dead,
                    age(o.outbox.oldest_pending_age),
                );
            }
            Err(why) => {
                let _ = write!(
                    out,
                    "<tr data-tenant=\"{}\" class=\"unavailable\"><td>{link}</td>\
                     <td colspan=\"9\" class=\"error\">unavailable: {}</td></tr>",
                    esc(name),
                    esc(why)
                );
            }
        }
    }
    out.push_str("</table><h2>Consumers</h2><table id=\"consumers\"><tr><th>tenant</th><th>consumer</th>\
         <th class=\"n\">rows kept</th><th class=\"n\">attempts in progress</th><th class=\"n\">past max_attempts</th></tr>");
    for (name, read) in reads {
        let Ok(o) = read else { continue };
        let tenant_base = format!("{base}/tenants/{}", esc(&url(name)));
        for c in &o.consumers {
            let _ = write!(
                out,
                "<tr data-tenant=\"{t}\" data-consumer=\"{n}\"><td>{t}</td>\
                 <td><a href=\"{tenant_base}/lookup?consumer={q}\">{n}</a></td><td class=\"n rows\">{}</td>\
                 <td class=\"n failing\"><a href=\"{tenant_base}/dead?consumer={q}\">{}</a></td>\
                 <td class=\"n exhausted\">{}</td></tr>",
                rows(c.rows),
                c.failing,
                exhausted(c.exhausted),
                t = esc(name),
                n = esc(&c.consumer),
                q = esc(&url(&c.consumer)),
            );
        }
    }
    out.push_str(
        "</table><h2>Outbox</h2><table id=\"outbox\"><tr><th>tenant</th><th>destination</th>\
         <th class=\"n\">pending</th><th class=\"n\">scheduled</th><th class=\"n\">dead</th>\
         <th class=\"n\">oldest pending</th></tr>",
    );
    for (name, read) in reads {
        let Ok(o) = read else { continue };
        let tenant_base = format!("{base}/tenants/{}", esc(&url(name)));
        for d in &o.outbox.destinations {
            let _ = write!(
                out,
                "<tr data-tenant=\"{t}\" data-destination=\"{n}\"><td>{t}</td><td>{n}</td>\
                 <td class=\"n pending\">{}</td><td class=\"n scheduled\">{}</td>\
                 <td class=\"n dead\"><a href=\"{tenant_base}/dead?destination={}\">{}</a></td>\
                 <td class=\"n\">{}</td></tr>",
                d.pending,
                d.scheduled,
                esc(&url(&d.destination)),
                d.dead,
                age(d.oldest_pending_age),
                t = esc(name),
                n = esc(&d.destination),
            );
        }
    }
    out.push_str("</table>");
    out
}

/// A tenant's console: the request, its path made the tenant's own, to
/// the single database's console on the tenant's pool.
async fn tenant<T: TenantPool>(
    State(console): State<Arc<TenantsConsole<T>>>,
    context: Context,
    mut request: Request<Body>,
) -> Response
where
    T::Guard: 'static,
{
    let path = request.uri().path();
    let after = path.strip_prefix("/tenants/").unwrap_or_default();
    let (segment, rest) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let Some(name) = percent_decoded(segment) else {
        return missing(
            &context,
            StatusCode::BAD_REQUEST,
            "the tenant's name in the path is not UTF-8 text",
        );
    };
    // A tenant added to the set's source since it was read is found.
    if !console.tenants.contains(&name) && console.tenants.reads_a_source() {
        let _ = tokio::time::timeout(super::QUERY_TIME_LIMIT, console.tenants.refresh()).await;
    }
    let Some(tenant) = console.tenants.tenant(&name) else {
        return missing(
            &context,
            StatusCode::NOT_FOUND,
            &format!("no tenant named {name:?} in the tenant set"),
        );
    };
    let inner = match request.uri().query() {
        Some(query) => format!("{rest}?{query}"),
        None => rest.to_owned(),
    };
    match inner.parse::<Uri>() {
        Ok(uri) => *request.uri_mut() = uri,
        Err(_) => return missing(&context, StatusCode::BAD_REQUEST, "the request's path"),
    }
    // The tenant's pages name it and link back to this overview.
    request.extensions_mut().insert(super::InTenant {
        name: name.clone(),
        tenants_base: context.base.clone(),
    });
    let mut router = super::routes(tenant, console.token(&name));
    let ready = std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut router, cx));
    if let Err(never) = ready.await {
        match never {}
    }
    // The tenant's pages' events (the log of each action) name it.
    let span = tracing::info_span!(target: crate::TRACING_TARGET, "diesel_inbox.console.tenant", tenant = %name);
    match router.call(request).instrument(span).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The page of a tenant the path does not name.
fn missing(context: &Context, status: StatusCode, why: &str) -> Response {
    page(
        status,
        context,
        View::Tenants,
        None,
        &format!("<p class=\"error\" id=\"no-tenant\">{}</p>", esc(why)),
    )
}

/// A path segment's `%XX` escapes decoded; `None` if it is not UTF-8.
fn percent_decoded(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_segment_is_decoded() {
        assert_eq!(percent_decoded("acme").as_deref(), Some("acme"));
        assert_eq!(percent_decoded("a%20b%2Fc").as_deref(), Some("a b/c"));
        assert_eq!(percent_decoded("%zz%4").as_deref(), Some("%zz%4"));
        assert_eq!(percent_decoded("%FF"), None);
    }

    #[test]
    fn counts_across_databases_stay_exact_only_when_each_is() {
        let exact = [RowCount::Exact(2), RowCount::Exact(3)];
        assert!(matches!(sum(exact.into_iter()), RowCount::Exact(5)));
        let capped = [RowCount::Exact(2), RowCount::AtLeast(10)];
        assert!(matches!(sum(capped.into_iter()), RowCount::AtLeast(12)));
    }

    #[test]
    fn a_bad_page_number_is_refused() {
        let query = |page: &str| TenantsQuery {
            tenant: String::new(),
            page: page.to_owned(),
        };
        assert_eq!(query("").page(), Ok(1));
        assert_eq!(query("3").page(), Ok(3));
        assert!(query("0").page().unwrap_err().contains("not a page number"));
        assert!(query("x").page().unwrap_err().contains("not a page number"));
    }
}
