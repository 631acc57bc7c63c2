//! The console's views: the overview (and its live tables), the dead
//! messages and the lookup. Each reads through the runtime's operations,
//! within [`QUERY_TIME_LIMIT`], and draws with [`html`](super::html).

use super::html::{self, action, esc, page, url, View};
use super::time::{parse_age, rfc3339};
use super::{Console, Context};
use crate::outbox::{DeadFilter, DeadMessage, RelayPool};
use crate::{Attempts, InboxError, Overview, RowCount};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::fmt::Write;
use std::sync::Arc;
use std::time::SystemTime;

/// Runs `$body` (a future of `Result<_, InboxError>`) on a connection
/// from the console's pool, the whole within [`QUERY_TIME_LIMIT`]: the
/// result, or why the database did not answer.
macro_rules! with_db {
    ($console:expr, |$conn:ident| $body:expr) => {
        async {
            let run = async {
                let mut guard = $console
                    .pool
                    .connection()
                    .await
                    .map_err(|e| format!("no connection: {e}"))?;
                let $conn = &mut *guard;
                $body.await.map_err(|e: $crate::InboxError| e.to_string())
            };
            match tokio::time::timeout($crate::console::QUERY_TIME_LIMIT, run).await {
                Ok(result) => result,
                Err(_) => Err(format!(
                    "it did not answer within {} seconds",
                    $crate::console::QUERY_TIME_LIMIT.as_secs()
                )),
            }
        }
    };
}
pub(super) use with_db;

/// An action's result, shown once on the page it returns to.
#[derive(Deserialize, Default)]
pub(super) struct Notice {
    notice: Option<String>,
}

/// The overview: the live tables, refreshed by the page's script.
pub(super) async fn overview<P: RelayPool>(
    State(console): State<Arc<Console<P>>>,
    context: Context,
    Query(notice): Query<Notice>,
) -> Response {
    let read = with_db!(console, |conn| crate::overview_async(
        conn,
        context.max_attempts
    ))
    .await;
    match read {
        Ok(overview) => page(
            StatusCode::OK,
            &context,
            View::Overview,
            notice.notice.as_deref(),
            &format!(
                "<p id=\"state\">live: refreshed every 5 seconds</p>\
                 <div id=\"live\" data-src=\"{}/live\">{}</div>",
                esc(&context.base),
                tables(&overview, &context, &lags(&overview, &context).await)
            ),
        ),
        Err(why) => html::unavailable(&context, View::Overview, &why),
    }
}

/// The overview's tables alone, for the live update.
pub(super) async fn live<P: RelayPool>(
    State(console): State<Arc<Console<P>>>,
    context: Context,
) -> Response {
    let read = with_db!(console, |conn| crate::overview_async(
        conn,
        context.max_attempts
    ))
    .await;
    match read {
        Ok(overview) => (
            [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
            tables(&overview, &context, &lags(&overview, &context).await),
        )
            .into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the database is unavailable: {why}"),
        )
            .into_response(),
    }
}

pub(super) fn rows(count: RowCount) -> String {
    match count {
        RowCount::Exact(n) => n.to_string(),
        RowCount::AtLeast(n) => format!(
            "<span title=\"the console counts up to {n}; `diesel-inbox stats` counts all\">more than {n}</span>"
        ),
    }
}

/// Each stream position's lag, where the console knows the brokers.
async fn lags(overview: &Overview, context: &Context) -> Option<Result<Vec<Option<i64>>, String>> {
    #[cfg(feature = "kafka")]
    if let Some(asker) = &context.kafka {
        if !overview.positions.is_empty() {
            let positions: Vec<_> = overview
                .positions
                .iter()
                .map(|p| (p.topic.clone(), p.partition, p.next_offset))
                .collect();
            return Some(asker.lags(&positions).await);
        }
    }
    let _ = (overview, context);
    None
}

fn tables(
    overview: &Overview,
    context: &Context,
    lags: &Option<Result<Vec<Option<i64>>, String>>,
) -> String {
    let base = esc(&context.base);
    let mut out = format!(
        "<p class=\"muted\">as of {} (the database's clock)</p>",
        rfc3339(overview.at)
    );
    let duplicates = crate::recent_duplicates();
    // A process with no handler of its own (the CLI's console) has
    // nothing to count: it says so rather than show zeros.
    let counts_here = !duplicates.is_empty() || !crate::consumers().is_empty();
    for (title, http) in [("Consumers", false), ("HTTP endpoints", true)] {
        let shown: Vec<_> = overview
            .consumers
            .iter()
            .filter(|c| c.consumer.starts_with("http:") == http)
            .collect();
        if http && shown.is_empty() {
            continue;
        }
        let _ = write!(
            out,
            "<h2>{title}</h2><table id=\"{}\"><tr><th>{}</th><th class=\"n\">rows kept</th>\
             <th class=\"n\">applied, last minute</th><th>per minute, last {} minutes</th>\
             <th class=\"n\" title=\"counted by the process serving this page\">duplicates here, last {} min</th>\
             <th class=\"n\">attempts in progress</th><th class=\"n\">past max_attempts</th></tr>",
            if http { "endpoints" } else { "consumers" },
            if http { "endpoint" } else { "consumer" },
            crate::RATE_MINUTES,
            crate::RATE_MINUTES,
        );
        if shown.is_empty() {
            out.push_str("<tr><td colspan=\"7\" class=\"muted\">no inbox rows yet</td></tr>");
        }
        for c in shown {
            let last = c.per_minute.len().saturating_sub(2);
            let duplicated = match duplicates.iter().find(|(consumer, _)| consumer == &c.consumer) {
                Some((_, minutes)) => minutes.iter().sum::<u64>().to_string(),
                None if counts_here => "0".to_owned(),
                None => "<span title=\"no handler runs in this process: a duplicate is counted where it runs\">-</span>".to_owned(),
            };
            let _ = write!(
                out,
                "<tr data-consumer=\"{name}\"><td><a href=\"{base}/lookup?consumer={q}\">{name}</a></td>\
                 <td class=\"n rows\">{}</td><td class=\"n rate\">{}</td><td>{}</td>\
                 <td class=\"n duplicates\">{duplicated}</td><td class=\"n failing\"><a href=\"{base}/dead?consumer={q}\">{}</a></td>\
                 <td class=\"n exhausted\">{}</td></tr>",
                rows(c.rows),
                html::rate(
                    c.per_minute.get(last).copied().unwrap_or(0),
                    c.at_least.get(last).copied().unwrap_or(false)
                ),
                html::chart(&c.per_minute, &c.at_least),
                c.failing,
                c.exhausted.map_or_else(
                    || "<span title=\"set max_attempts to count them\">-</span>".to_owned(),
                    |n| n.to_string()
                ),
                name = esc(&c.consumer),
                q = esc(&url(&c.consumer)),
            );
        }
        out.push_str("</table>");
    }
    out.push_str(
        "<p class=\"muted\">A duplicate leaves no row, so the database cannot count them: the \
         process serving this page counts its own (a console mounted beside the consumers \
         shows theirs; the CLI's shows none), and the metric \
         <code>messaging.client.consumed.messages</code> (outcome <code>duplicate</code>) \
         counts every process's.</p>",
    );
    let o = &overview.outbox;
    let age = |a: Option<std::time::Duration>| a.map_or("-".to_owned(), html::age);
    out.push_str("<h2>Outbox</h2>");
    let all = match overview.outbox_rows {
        RowCount::Exact(_) => "all".to_owned(),
        RowCount::AtLeast(n) => {
            let _ = write!(
                out,
                "<p class=\"warn\" id=\"outbox-capped\">The outbox holds more than {n} messages: \
                 these counts are of its oldest {n} (the console reads no more; \
                 <code>diesel-inbox outbox status</code> counts them all).</p>"
            );
            format!("the oldest {n}")
        }
    };
    let _ = write!(
        out,
        "<table id=\"outbox\"><tr><th>destination</th><th class=\"n\">pending</th>\
         <th class=\"n\">scheduled</th><th class=\"n\">dead</th><th class=\"n\">oldest pending</th>\
         <th class=\"n\">next scheduled in</th></tr>"
    );
    for d in &o.destinations {
        let _ = write!(
            out,
            "<tr data-destination=\"{name}\"><td>{name}</td><td class=\"n pending\">{}</td>\
             <td class=\"n scheduled\">{}</td>\
             <td class=\"n dead\"><a href=\"{base}/dead?destination={}\">{}</a></td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            d.pending,
            d.scheduled,
            esc(&url(&d.destination)),
            d.dead,
            age(d.oldest_pending_age),
            age(d.next_scheduled_in),
            name = esc(&d.destination),
        );
    }
    let _ = write!(
        out,
        "<tr class=\"total\"><th>{all}</th><th class=\"n pending\">{}</th><th class=\"n scheduled\">{}</th>\
         <th class=\"n dead\">{}</th><th class=\"n\">{}</th><th class=\"n\">{}</th></tr></table>",
        o.pending,
        o.scheduled,
        o.dead,
        age(o.oldest_pending_age),
        age(o.next_scheduled_in)
    );
    if let Some(w) = &o.wal {
        let _ = write!(
            out,
            "<p{}>WAL outbox slot {}: {}, keeps {} bytes of WAL, {} bytes past its confirmed position{}</p>",
            if w.lost { " class=\"error\"" } else { "" },
            esc(&w.slot),
            if w.active { "streamed by a relay" } else { "no relay streams it" },
            w.retained_bytes,
            w.unconfirmed_bytes,
            if w.lost { "; LOST: its messages are gone" } else { "" }
        );
    }
    let lag_column = matches!(lags, Some(Ok(_)));
    let _ = write!(
        out,
        "<h2>Stream positions</h2><table id=\"positions\"><tr><th>consumer</th><th>topic</th>\
         <th class=\"n\">partition</th><th class=\"n\">next offset</th>{}<th>updated</th></tr>",
        if lag_column {
            "<th class=\"n\">lag</th>"
        } else {
            ""
        }
    );
    if overview.positions.is_empty() {
        out.push_str("<tr><td colspan=\"6\" class=\"muted\">no stream positions</td></tr>");
    }
    for (i, p) in overview.positions.iter().enumerate() {
        let lag = match lags {
            Some(Ok(lags)) => format!(
                "<td class=\"n lag\">{}</td>",
                lags.get(i)
                    .copied()
                    .flatten()
                    .map_or("-".to_owned(), |lag| lag.to_string())
            ),
            _ => String::new(),
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n offset\">{}</td>{lag}<td>{}</td></tr>",
            esc(&p.consumer),
            esc(&p.topic),
            p.partition,
            p.next_offset,
            rfc3339(p.updated_at)
        );
    }
    out.push_str("</table>");
    match lags {
        Some(Err(why)) => {
            let _ = write!(
                out,
                "<p class=\"warn\" id=\"lag-unavailable\">The Kafka lag is unavailable: {}</p>",
                esc(why)
            );
        }
        Some(Ok(_)) => out.push_str(
            "<p class=\"muted\">The lag: each partition's high watermark, asked of the brokers at most 5 seconds ago (once per refresh for every open page), less the position: low by what was produced since.</p>",
        ),
        None => out.push_str(
            "<p class=\"muted\">A partition's lag needs the broker's high watermark: give the \
             console the brokers (<code>kafka_lag</code>, the CLI's <code>--kafka</code>), or \
             read the Kafka runner's gauge <code>diesel_inbox.kafka.lag</code>.</p>",
        ),
    }
    out
}

/// The dead messages page's filter (a GET form, so that a filtered view
/// is a link).
#[derive(Deserialize, Default, Clone)]
pub(super) struct DeadQuery {
    #[serde(default)]
    pub(super) destination: String,
    #[serde(default)]
    pub(super) error: String,
    /// Dead within this long (`1h`, `7d`).
    #[serde(default)]
    pub(super) since: String,
    /// Dead longer ago than this.
    #[serde(default)]
    pub(super) until: String,
    #[serde(default)]
    pub(super) consumer: String,
    pub(super) notice: Option<String>,
}

impl DeadQuery {
    /// The outbox's filter, or why a field is wrong.
    pub(super) fn filter(&self) -> Result<DeadFilter, String> {
        // The schema's rules, before any statement: a name fits its
        // 255-byte column; no text holds NUL (PostgreSQL refuses it).
        for (field, value) in [
            ("destination", &self.destination),
            ("consumer", &self.consumer),
        ] {
            if !value.is_empty() {
                checked_text(field, value)?;
            }
        }
        if self.error.len() > MAX_ERROR_FILTER || self.error.contains('\0') {
            return Err(format!(
                "error contains: at most {MAX_ERROR_FILTER} bytes, without NUL"
            ));
        }
        let mut filter = DeadFilter::new();
        let now = SystemTime::now();
        if !self.destination.is_empty() {
            filter = filter.destination(&self.destination);
        }
        if !self.error.is_empty() {
            filter = filter.error_contains(&self.error);
        }
        if !self.since.is_empty() {
            let age = parse_age(self.since.trim()).map_err(|e| format!("dead within: {e}"))?;
            filter = filter.dead_since(now.checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH));
        }
        if !self.until.is_empty() {
            let age = parse_age(self.until.trim()).map_err(|e| format!("dead before: {e}"))?;
            filter = filter.dead_before(now.checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH));
        }
        Ok(filter)
    }

    /// The filter's fields, for the bulk actions and the way back.
    pub(super) fn fields(&self) -> [(&'static str, &str); 5] {
        [
            ("destination", &self.destination),
            ("error", &self.error),
            ("since", &self.since),
            ("until", &self.until),
            ("consumer", &self.consumer),
        ]
    }
}

/// The longest "error contains" filter (bytes).
const MAX_ERROR_FILTER: usize = 1024;

/// `value` of the request's `field` (a consumer, a key, a destination, a
/// message id): at most 255 bytes (its column), not empty, without NUL.
pub(super) fn checked_text(field: &str, value: &str) -> Result<(), String> {
    crate::validate_key(value).map_err(|e| {
        let rule = match e {
            crate::InvalidKey::Empty => "needed".to_owned(),
            crate::InvalidKey::TooLong { len } => {
                format!("{len} bytes, over the 255 its column holds")
            }
            crate::InvalidKey::ContainsNul => "contains NUL, which no column holds".to_owned(),
            other => other.to_string(),
        };
        format!("{field}: {rule}")
    })
}

/// How many of each list a page shows.
const DEAD_SHOWN: usize = 100;
/// How many of the newest dead messages the failure groups read.
const GROUPS_READ: usize = 10_000;
const GROUPS_SHOWN: usize = 50;
const FAILING_SHOWN: usize = 200;

pub(super) async fn dead<P: RelayPool>(
    State(console): State<Arc<Console<P>>>,
    context: Context,
    Query(query): Query<DeadQuery>,
) -> Response {
    let base = &context.base;
    let mut body = filter_form(base, &query);
    let filter = match query.filter() {
        Ok(filter) => filter,
        Err(why) => {
            let _ = write!(body, "<p class=\"error\">{}</p>", esc(&why));
            return page(StatusCode::BAD_REQUEST, &context, View::Dead, None, &body);
        }
    };
    let consumer = (!query.consumer.is_empty()).then_some(query.consumer.as_str());
    let read = with_db!(console, |conn| async {
        let groups = crate::outbox::dead_groups_async(&mut *conn, &filter, GROUPS_READ).await?;
        let dead = crate::outbox::dead_matching_async(&mut *conn, &filter, DEAD_SHOWN).await?;
        let failing = crate::attempts_list_async(&mut *conn, consumer, 1, FAILING_SHOWN).await?;
        Ok::<_, InboxError>((groups, dead, failing))
    })
    .await;
    let (groups, dead, failing) = match read {
        Ok(lists) => lists,
        Err(why) => return html::unavailable(&context, View::Dead, &why),
    };
    body.push_str(&failure_groups(&console.csrf, &context, &query, &groups));
    body.push_str(&outbox_dead(&console.csrf, &context, &query, &dead));
    body.push_str(&inbox_failing(&console.csrf, &context, &query, &failing));
    page(
        StatusCode::OK,
        &context,
        View::Dead,
        query.notice.as_deref(),
        &body,
    )
}

fn filter_form(base: &str, query: &DeadQuery) -> String {
    let input = |name: &str, label: &str, value: &str, hint: &str| {
        format!(
            "<label>{label} <input name=\"{name}\" value=\"{}\" placeholder=\"{hint}\"></label>",
            esc(value)
        )
    };
    format!(
        "<form class=\"filter\" method=\"get\" action=\"{}/dead\">{}{}{}{}{}\
         <button type=\"submit\">Filter</button></form>",
        esc(base),
        input("destination", "destination", &query.destination, "orders"),
        input("consumer", "consumer", &query.consumer, "billing"),
        input("error", "error contains", &query.error, "timeout"),
        input("since", "dead within", &query.since, "1h"),
        input("until", "dead longer ago than", &query.until, "10m"),
    )
}

/// The dead messages grouped by destination and failure, each with its
/// retry and discard.
fn failure_groups(
    csrf: &str,
    context: &Context,
    query: &DeadQuery,
    groups: &[crate::outbox::FailureGroup],
) -> String {
    let read: u64 = groups.iter().map(|g| g.count).sum();
    let mut out = format!(
        "<h2>Outbox: failure groups</h2><p class=\"muted\" id=\"groups-count\">{} group{} of {read} \
         dead message{}{}: the same destination and last error, its ids and numbers masked \
         (<code>#</code>), the largest first.</p><table id=\"groups\"><tr><th>destination</th>\
         <th>failure</th><th class=\"n\">messages</th><th>first dead</th><th>last dead</th>\
         <th>example</th><th></th></tr>",
        groups.len(),
        if groups.len() == 1 { "" } else { "s" },
        if read == 1 { "" } else { "s" },
        if read == GROUPS_READ as u64 {
            format!(" (the newest {GROUPS_READ}; narrow the filter to group others)")
        } else {
            String::new()
        }
    );
    if groups.is_empty() {
        out.push_str("<tr><td colspan=\"7\" class=\"muted\">none</td></tr>");
    }
    for g in groups.iter().take(GROUPS_SHOWN) {
        let _ = write!(
            out,
            "<tr class=\"group\"><td>{}</td><td class=\"failure\"><code>{}</code></td>\
             <td class=\"n count\">{}</td><td>{}</td><td>{}</td>\
             <td><code>{}</code>: <span class=\"last-error\">{}</span></td><td>",
            esc(&g.destination),
            esc(&g.failure),
            g.count,
            rfc3339(g.first_dead_at),
            rfc3339(g.last_dead_at),
            esc(&g.example_id),
            esc(&g.example_error.chars().take(200).collect::<String>()),
        );
        if !context.read_only {
            let mut fields = vec![
                ("group_destination", g.destination.as_str()),
                ("failure", g.failure.as_str()),
            ];
            fields.extend_from_slice(&query.fields());
            out.push_str(&action(
                &context.base,
                csrf,
                "retry-group",
                "Retry group",
                &fields,
            ));
            out.push_str(&action(
                &context.base,
                csrf,
                "discard-group",
                "Discard group",
                &fields,
            ));
        }
        out.push_str("</td></tr>");
    }
    out.push_str("</table>");
    if groups.len() > GROUPS_SHOWN {
        let _ = write!(
            out,
            "<p class=\"muted\">{} smaller groups not shown.</p>",
            groups.len() - GROUPS_SHOWN
        );
    }
    out
}

fn outbox_dead(csrf: &str, context: &Context, query: &DeadQuery, dead: &[DeadMessage]) -> String {
    let base = &context.base;
    let mut out = format!(
        "<h2>Outbox</h2><p class=\"muted\" id=\"dead-count\">{} dead message{} shown{}, oldest first</p>",
        dead.len(),
        if dead.len() == 1 { "" } else { "s" },
        if dead.len() == DEAD_SHOWN {
            format!(" (the first {DEAD_SHOWN}; narrow the filter to see others)")
        } else {
            String::new()
        }
    );
    if !context.read_only && !dead.is_empty() {
        let fields = query.fields();
        out.push_str("<p>Every dead message this filter selects: ");
        out.push_str(&action(base, csrf, "retry-matching", "Retry all", &fields));
        out.push_str(&action(
            base,
            csrf,
            "discard-matching",
            "Discard all",
            &fields,
        ));
        out.push_str("</p>");
    }
    for d in dead {
        let trace = d
            .headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("traceparent"))
            .and_then(|(_, value)| value.split('-').nth(1))
            .unwrap_or("-");
        let _ = write!(
            out,
            "<details class=\"dead\" data-id=\"{id}\"><summary><code>{id}</code> to <b>{}</b>, \
             {} attempts, dead since {}: <span class=\"last-error\">{}</span></summary>\
             <table><tr><th>ordering key</th><td>{}</td></tr><tr><th>enqueued</th><td>{}</td></tr>\
             <tr><th>trace id</th><td class=\"trace\">{}</td></tr><tr><th>last error</th><td>{}</td></tr>",
            esc(&d.destination),
            d.attempts,
            rfc3339(d.dead_at),
            esc(&d.last_error.chars().take(200).collect::<String>()),
            esc(d.ordering_key.as_deref().unwrap_or("-")),
            rfc3339(d.enqueued_at),
            esc(trace),
            esc(&d.last_error),
            id = esc(&d.id),
        );
        for (name, value) in &d.headers {
            let _ = write!(
                out,
                "<tr><th>header <code>{}</code></th><td>{}</td></tr>",
                esc(name),
                esc(value)
            );
        }
        out.push_str("</table>");
        out.push_str(&html::payload(&d.payload));
        if !context.read_only {
            let back = query.fields();
            let mut fields = vec![("id", d.id.as_str())];
            fields.extend_from_slice(&back);
            out.push_str(&action(base, csrf, "retry", "Retry", &fields));
            out.push_str(&action(base, csrf, "discard", "Discard", &fields));
        }
        out.push_str("</details>");
    }
    out
}

fn inbox_failing(csrf: &str, context: &Context, query: &DeadQuery, failing: &[Attempts]) -> String {
    let needle = query.error.to_lowercase();
    let shown: Vec<&Attempts> = failing
        .iter()
        .filter(|a| needle.is_empty() || a.last_error.to_lowercase().contains(&needle))
        .collect();
    let mut out = format!(
        "<h2>Inbox: failing keys</h2><p class=\"muted\">The keys whose deliveries are failing \
         (handlers with <code>max_attempts</code>){}, the latest failure first; of the {FAILING_SHOWN} \
         latest, those whose error matches. Forget one to let its next delivery run.</p>\
         <table id=\"failing\"><tr><th>consumer</th><th>key</th><th class=\"n\">failures</th>\
         <th>last failure</th><th>last error</th><th></th></tr>",
        context
            .max_attempts
            .map_or(String::new(), |n| format!("; at {n} failures a key is given up on"))
    );
    if shown.is_empty() {
        out.push_str("<tr><td colspan=\"6\" class=\"muted\">none</td></tr>");
    }
    for a in shown {
        let exhausted = context.max_attempts.is_some_and(|n| a.failures >= n);
        let _ = write!(
            out,
            "<tr data-key=\"{}\"><td>{}</td><td><code>{}</code></td><td class=\"n{}\">{}</td><td>{}</td><td>{}</td><td>",
            esc(&a.key),
            esc(&a.consumer),
            esc(&a.key),
            if exhausted { " warn" } else { "" },
            a.failures,
            rfc3339(a.updated_at),
            esc(&a.last_error),
        );
        if !context.read_only {
            out.push_str(&action(
                &context.base,
                csrf,
                "forget",
                "Forget",
                &[("consumer", &a.consumer), ("key", &a.key), ("back", "dead")],
            ));
        }
        out.push_str("</td></tr>");
    }
    out.push_str("</table>");
    out
}

/// The lookup's form: a consumer and a key, or an HTTP endpoint, the
/// caller's scope and the `Idempotency-Key`.
#[derive(Deserialize, Default)]
pub(super) struct LookupQuery {
    #[serde(default)]
    consumer: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    endpoint: String,
    #[serde(default)]
    scope: String,
    #[serde(default)]
    idempotency_key: String,
    notice: Option<String>,
}

impl LookupQuery {
    /// The inbox's consumer and key the form names, if it names one.
    fn target(&self) -> Result<Option<(String, String)>, String> {
        if !self.endpoint.is_empty() || !self.idempotency_key.is_empty() {
            let key = crate::http::IdempotencyKey::parse(&self.idempotency_key)
                .map_err(|e| e.to_string())?;
            return Ok(Some((
                crate::http::consumer_name(&self.endpoint),
                crate::http::message_id(&self.scope, &key),
            )));
        }
        // The overview links to a consumer's lookup without a key: the
        // form, with the consumer filled in.
        if self.key.is_empty() {
            return Ok(None);
        }
        // The schema's rules (255 bytes, no NUL), before any statement.
        checked_text("consumer", &self.consumer)?;
        checked_text("key", &self.key)?;
        Ok(Some((self.consumer.clone(), self.key.clone())))
    }
}

pub(super) async fn lookup<P: RelayPool>(
    State(console): State<Arc<Console<P>>>,
    context: Context,
    Query(query): Query<LookupQuery>,
) -> Response {
    let base = &context.base;
    let input = |name: &str, label: &str, value: &str| {
        format!(
            "<label>{label} <input name=\"{name}\" value=\"{}\"></label> ",
            esc(value)
        )
    };
    let mut body = format!(
        "<form class=\"filter\" method=\"get\" action=\"{b}/lookup\" id=\"by-consumer\">{}{}\
         <button type=\"submit\">Find</button></form>\
         <form class=\"filter\" method=\"get\" action=\"{b}/lookup\" id=\"by-http-key\">{}{}{}\
         <button type=\"submit\">Find</button></form>",
        input("consumer", "consumer", &query.consumer),
        input("key", "key", &query.key),
        input("endpoint", "HTTP endpoint", &query.endpoint),
        input("scope", "caller's scope", &query.scope),
        input("idempotency_key", "Idempotency-Key", &query.idempotency_key),
        b = esc(base),
    );
    let (consumer, key) = match query.target() {
        Ok(Some(target)) => target,
        Ok(None) => return page(StatusCode::OK, &context, View::Lookup, None, &body),
        Err(why) => {
            let _ = write!(body, "<p class=\"error\">{}</p>", esc(&why));
            return page(StatusCode::BAD_REQUEST, &context, View::Lookup, None, &body);
        }
    };
    let read = with_db!(console, |conn| async {
        let entry = crate::status_async(&mut *conn, &consumer, &key).await?;
        let attempts = crate::attempts_async(&mut *conn, &consumer, &key).await?;
        Ok::<_, InboxError>((entry, attempts))
    })
    .await;
    let (entry, attempts) = match read {
        Ok(found) => found,
        Err(why) => return html::unavailable(&context, View::Lookup, &why),
    };
    let _ = write!(
        body,
        "<h2>Consumer <code>{}</code>, key <code>{}</code></h2><p id=\"found\">{}</p>",
        esc(&consumer),
        esc(&key),
        match &entry {
            Some(entry) => format!(
                "applied: its inbox row was written at {}",
                rfc3339(entry.received_at)
            ),
            None => "not applied: no inbox row (never applied, purged or forgotten)".to_owned(),
        }
    );
    if let Some(a) = &attempts {
        let _ = write!(
            body,
            "<p id=\"attempts\">{} failed attempt{}, the last at {}: {}</p>",
            a.failures,
            if a.failures == 1 { "" } else { "s" },
            rfc3339(a.updated_at),
            esc(&a.last_error)
        );
    }
    if !context.read_only && (entry.is_some() || attempts.is_some()) {
        body.push_str(
            "<p>Forget it, so that its next delivery is applied again (its earlier effects stay): ",
        );
        body.push_str(&action(
            base,
            &console.csrf,
            "forget",
            "Forget",
            &[("consumer", &consumer), ("key", &key), ("back", "lookup")],
        ));
        body.push_str("</p>");
    }
    page(
        StatusCode::OK,
        &context,
        View::Lookup,
        query.notice.as_deref(),
        &body,
    )
}
