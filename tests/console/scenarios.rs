//! The console's scenarios: PostgreSQL in full (the overview against the
//! CLI, hostile payloads, retry checked at RabbitMQ, discard, lookup and
//! forget, the live update, refusals, read-only, a database that refuses
//! or hangs); SQLite and MariaDB render their real rows.

use crate::browser::{click, count, open, screenshot, serve, text, Driver};
use crate::data::{self, Names, Refusing, MAX_ATTEMPTS, SCRIPT};
use crate::support;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::PoolableConnection;
use diesel_inbox::console::{self, ConsoleExt};
use diesel_inbox::outbox::{self, DeadFilter};
use diesel_inbox::AsyncInboxConnection;
use fantoccini::Client;
use std::time::{Duration, Instant};

type Check = Result<(), String>;

/// The checks' results: each printed as it ends; the failures counted.
#[derive(Default)]
struct Results {
    failed: usize,
}

impl Results {
    fn record(&mut self, backend: &str, name: &str, result: Check) {
        match result {
            Ok(()) => println!("console/{backend}: {name} ... ok"),
            Err(why) => {
                self.failed += 1;
                println!("console/{backend}: {name} ... FAILED: {why}");
            }
        }
    }
}

pub fn main() {
    let driver = match Driver::start() {
        None => return,
        Some(Err(why)) => {
            println!("console: FAILED: {why}");
            std::process::exit(1);
        }
        Some(Ok(driver)) => driver,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let failed = runtime.block_on(async {
        let mut results = Results::default();
        let client = match driver.session().await {
            Ok(client) => client,
            Err(why) => {
                results.record("browser", "a Chromium session", Err(why));
                return results.failed;
            }
        };
        sqlite(&driver, &client, &mut results).await;
        #[cfg(all(feature = "postgres", feature = "lapin"))]
        postgres(&client, &mut results).await;
        #[cfg(not(all(feature = "postgres", feature = "lapin")))]
        println!("SKIPPED: console/postgres needs the features postgres and lapin");
        #[cfg(feature = "mysql")]
        mysql(&client, &mut results).await;
        let _ = client.close().await;
        results.failed
    });
    if failed > 0 {
        println!("{failed} console check(s) FAILED");
        std::process::exit(1);
    }
    println!("console: all checks passed");
}

/// A number a page shows in `css`.
async fn number(client: &Client, css: &str) -> Result<u64, String> {
    let shown = text(client, css).await?;
    shown
        .parse()
        .map_err(|_| format!("{css} shows {shown:?}, not a number"))
}

/// The CLI's JSON answer to `args`.
fn cli_json(url: &str, args: &[&str]) -> Result<serde_json::Value, String> {
    let (code, out, err) = support::run_cli(support::cli(url).args(args));
    if code != 0 && code != 1 {
        return Err(format!("diesel-inbox {args:?}: exit {code}: {err}"));
    }
    serde_json::from_str(&out).map_err(|e| format!("diesel-inbox {args:?}: {e}: {out}"))
}

/// The overview's numbers against the CLI's `stats --json`, `attempts
/// --json`, `outbox status --json` and `status <consumer> --json`.
async fn overview_matches_cli(
    client: &Client,
    base: &str,
    url: &str,
    names: &Names,
    kafka: Option<&str>,
) -> Check {
    open(client, &format!("{base}/")).await?;
    let stats = cli_json(url, &["stats", "--json"])?;
    let http = diesel_inbox::http::consumer_name(&names.endpoint);
    for consumer in [&names.billing, &http] {
        let rows = stats
            .as_array()
            .and_then(|all| all.iter().find(|s| s["consumer"] == consumer.as_str()))
            .and_then(|s| s["rows"].as_u64())
            .ok_or(format!("the CLI's stats have no {consumer}"))?;
        let shown = number(client, &format!("tr[data-consumer='{consumer}'] td.rows")).await?;
        if shown != rows {
            return Err(format!(
                "{consumer}: the page shows {shown} rows, the CLI {rows}"
            ));
        }
    }
    let per_minute = number(
        client,
        &format!("tr[data-consumer='{}'] td.rate", names.billing),
    )
    .await?;
    let chart = count(
        client,
        &format!("tr[data-consumer='{}'] svg.chart rect", names.billing),
    )
    .await?;
    if chart != diesel_inbox::RATE_MINUTES || per_minute > 5 {
        return Err(format!("the rate: {per_minute} last minute, {chart} bars"));
    }
    let failing = cli_json(url, &["attempts", "--consumer", &names.import, "--json"])?;
    let exhausted = cli_json(
        url,
        &[
            "attempts",
            "--consumer",
            &names.import,
            "--exhausted",
            "--max-attempts",
            &MAX_ATTEMPTS.to_string(),
            "--json",
        ],
    )?;
    let row = format!("tr[data-consumer='{}']", names.import);
    let (page_failing, page_exhausted) = (
        number(client, &format!("{row} td.failing")).await?,
        number(client, &format!("{row} td.exhausted")).await?,
    );
    let cli = (
        failing.as_array().map_or(0, Vec::len) as u64,
        exhausted.as_array().map_or(0, Vec::len) as u64,
    );
    if (page_failing, page_exhausted) != cli || cli != (2, 1) {
        return Err(format!(
            "{}: the page shows {page_failing} failing, {page_exhausted} past max_attempts; the CLI {cli:?}",
            names.import
        ));
    }
    let status = cli_json(url, &["outbox", "status", "--json"])?;
    for destination in [&names.dead, &names.later, &names.pending] {
        let cli = status["destinations"]
            .as_array()
            .and_then(|all| {
                all.iter()
                    .find(|d| d["destination"] == destination.as_str())
            })
            .ok_or(format!("the CLI's outbox status has no {destination}"))?;
        let row = format!("tr[data-destination='{destination}']");
        for column in ["pending", "scheduled", "dead"] {
            let shown = number(client, &format!("{row} td.{column}")).await?;
            if Some(shown) != cli[column].as_u64() {
                return Err(format!(
                    "{destination}: {column} {shown} on the page, {} in the CLI",
                    cli[column]
                ));
            }
        }
    }
    for column in ["pending", "scheduled", "dead"] {
        let shown = number(client, &format!("#outbox tr.total th.{column}")).await?;
        if Some(shown) != status[column].as_u64() {
            return Err(format!(
                "all: {column} {shown} on the page, {} in the CLI",
                status[column]
            ));
        }
    }
    if let Some(consumer) = kafka {
        let positions = cli_json(url, &["status", consumer, "--json"])?;
        let offset = positions["positions"][0]["next_offset"]
            .as_i64()
            .ok_or(format!(
                "the CLI shows no position of {consumer}: {positions}"
            ))?;
        let shown = text(client, "#positions td.offset").await?;
        if shown != offset.to_string() {
            return Err(format!(
                "the position: {shown} on the page, {offset} in the CLI"
            ));
        }
        let lag = text(client, "#positions td.lag").await?;
        if lag != "1" {
            return Err(format!("the lag: {lag} on the page, not 1"));
        }
    }
    screenshot(client, "overview").await
}

/// A dead message's payload of `<script>` is shown, not run; its
/// headers, trace id and error are text.
async fn hostile_data_is_text(client: &Client, base: &str, names: &Names) -> Check {
    open(client, &format!("{base}/dead?destination={}", names.dead)).await?;
    let message = format!("details[data-id='{}']", names.script_id);
    click(client, &format!("{message} summary")).await?;
    let payload = text(client, &format!("{message} pre.payload")).await?;
    if payload != SCRIPT {
        return Err(format!("the payload shows {payload:?}"));
    }
    let ran = client
        .execute("return typeof window.__pwned", vec![])
        .await
        .map_err(|e| e.to_string())?;
    if ran != "undefined" {
        return Err(format!("the payload ran: window.__pwned is {ran}"));
    }
    let page = client.source().await.map_err(|e| e.to_string())?;
    for shown in [
        "&lt;b&gt;acme&lt;/b&gt;",
        "&lt;i&gt;upstream&lt;/i&gt;",
        "4bf92f3577b34da6a3ce929d0e0e4736",
    ] {
        if !page.contains(shown) {
            return Err(format!("the page does not show {shown}"));
        }
    }
    let binary = format!("details[data-id='{}']", names.binary_id);
    click(client, &format!("{binary} summary")).await?;
    let kind = text(client, &format!("{binary} p.muted")).await?;
    if !kind.starts_with("binary, 5 bytes") {
        return Err(format!("the binary payload: {kind:?}"));
    }
    screenshot(client, "dead").await
}

/// Waits for the page's notice; its text.
async fn notice(client: &Client) -> Result<String, String> {
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(fantoccini::Locator::Css("#notice"))
        .await
        .map_err(|e| format!("no notice: {e}"))?
        .text()
        .await
        .map_err(|e| e.to_string())
}

/// The console's forms POSTed outside the page: no token, a wrong token,
/// a peer that is not loopback, a read-only console; none changes a row.
async fn refusals<C>(
    pool: &Pool<C>,
    names: &Names,
    main: &str,
    read_only: &str,
    open_to_all: Option<&str>,
) -> Check
where
    C: AsyncInboxConnection + PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    let http = reqwest::Client::new();
    let post = |url: String, form: Vec<(&'static str, String)>| {
        let http = http.clone();
        async move {
            let response = http
                .post(url)
                .form(&form)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            Ok::<_, String>((status, response.text().await.unwrap_or_default()))
        }
    };
    let id = names.script_id.clone();
    let cases = [
        (
            "no token",
            format!("{main}/actions/retry"),
            vec![("id", id.clone())],
        ),
        (
            "a wrong token",
            format!("{main}/actions/retry"),
            vec![("id", id.clone()), ("csrf", "0".repeat(32))],
        ),
        (
            "a read-only console",
            format!("{read_only}/actions/retry"),
            vec![("id", id.clone()), ("csrf", "0".repeat(32))],
        ),
    ];
    for (case, url, form) in cases {
        let (status, body) = post(url, form).await?;
        if status != 403 || !body.contains("Refused") {
            return Err(format!("{case}: {status} {body}"));
        }
    }
    // With the page's own token: a request for another name (DNS
    // rebinding: the name resolves to loopback), one from another origin,
    // one the browser marks cross-site.
    let token = csrf_token(&http, &format!("{main}/dead?destination={}", names.dead)).await?;
    let authority = main.trim_start_matches("http://").to_owned();
    let port = authority
        .rsplit_once(':')
        .map_or("80", |(_, p)| p)
        .to_owned();
    let headed = [
        (
            "another name",
            "host",
            format!("rebind.test:{port}"),
            421,
            "Refused",
        ),
        (
            "another origin",
            "origin",
            "http://rebind.test".to_owned(),
            403,
            "another origin",
        ),
        (
            "an opaque origin",
            "origin",
            "null".to_owned(),
            403,
            "another origin",
        ),
        (
            "a cross-site fetch",
            "sec-fetch-site",
            "cross-site".to_owned(),
            403,
            "another site",
        ),
    ];
    for (case, name, value, expected, says) in headed {
        let response = http
            .post(format!("{main}/actions/retry"))
            .header(name, value)
            .form(&[("id", id.clone()), ("csrf", token.clone())])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        if status != expected || !body.contains(says) {
            return Err(format!("{case}: {status} {body}"));
        }
    }
    if let Some(open_to_all) = open_to_all {
        // The right token (the page shows it to any GET), from a peer that
        // is not loopback, on a console without authorize.
        let token = csrf_token(
            &http,
            &format!("{open_to_all}/dead?destination={}", names.dead),
        )
        .await?;
        let (status, body) = post(
            format!("{open_to_all}/actions/retry"),
            vec![("id", id.clone()), ("csrf", token)],
        )
        .await?;
        if status != 403 || !body.contains("not loopback") {
            return Err(format!("a non-loopback peer: {status} {body}"));
        }
    }
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let dead =
        outbox::dead_matching_async(&mut *conn, &DeadFilter::new().destination(&names.dead), 10)
            .await
            .map_err(|e| e.to_string())?;
    if !dead.iter().any(|d| d.id == id) {
        return Err("a refused action retried the message".into());
    }
    Ok(())
}

/// The CSRF token of the page at `url` (the console shows it to any GET).
async fn csrf_token(http: &reqwest::Client, url: &str) -> Result<String, String> {
    let page = http
        .get(url)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(str::to_owned)
        .ok_or(format!("{url} has no token"))
}

/// A request with bad input: its method, path, fields and the parameter
/// its refusal names.
type BadInput = (
    &'static str,
    &'static str,
    Vec<(&'static str, String)>,
    &'static str,
);

/// Bad input, over TCP: every parameter of every route, each with what
/// breaks its rule (NUL, over its column's 255 bytes, a time outside the
/// grammar, missing). Each gets `400` and a page that names the
/// parameter, and no dead message changes.
async fn bad_input_is_400<D>(base: &str, pool: &D, names: &Names) -> Check
where
    D: diesel_inbox::outbox::RelayPool,
{
    let http = reqwest::Client::new();
    let token = csrf_token(&http, &format!("{base}/dead")).await?;
    let long = "x".repeat(256);
    let nul = "a\0b".to_owned();
    let dead_before = dead_ids(pool, names).await?;
    // (method, path, form or query, the parameter the page names)
    let mut cases: Vec<BadInput> = Vec::new();
    for (field, named) in [("destination", "destination"), ("consumer", "consumer")] {
        for value in [&nul, &long] {
            cases.push(("GET", "/dead", vec![(field, value.clone())], named));
        }
    }
    cases.push((
        "GET",
        "/dead",
        vec![("error", nul.clone())],
        "error contains",
    ));
    cases.push((
        "GET",
        "/dead",
        vec![("error", "e".repeat(1025))],
        "error contains",
    ));
    for (field, named) in [("since", "dead within"), ("until", "dead before")] {
        for value in ["-1h", "soon", "1y", "5"] {
            cases.push(("GET", "/dead", vec![(field, value.to_owned())], named));
        }
    }
    for (field, named) in [("consumer", "consumer"), ("key", "key")] {
        for value in [&nul, &long] {
            let mut query = vec![("consumer", "c".to_owned()), ("key", "k".to_owned())];
            query.retain(|(f, _)| *f != field);
            query.push((field, value.clone()));
            cases.push(("GET", "/lookup", query, named));
        }
    }
    cases.push(("GET", "/lookup", vec![("key", "k".to_owned())], "consumer"));
    cases.push((
        "GET",
        "/lookup",
        vec![
            ("endpoint", "e".to_owned()),
            ("idempotency_key", nul.clone()),
        ],
        "Idempotency-Key",
    ));
    for action in ["/actions/retry", "/actions/discard"] {
        cases.push(("POST", action, vec![], "id"));
        cases.push(("POST", action, vec![("id", nul.clone())], "id"));
        cases.push(("POST", action, vec![("id", long.clone())], "id"));
    }
    for action in ["/actions/retry-matching", "/actions/discard-matching"] {
        for value in ["-1h", "soon", "1y"] {
            cases.push((
                "POST",
                action,
                vec![("since", value.to_owned())],
                "dead within",
            ));
            cases.push((
                "POST",
                action,
                vec![("until", value.to_owned())],
                "dead before",
            ));
        }
        cases.push((
            "POST",
            action,
            vec![("destination", nul.clone())],
            "destination",
        ));
        cases.push((
            "POST",
            action,
            vec![("error", nul.clone())],
            "error contains",
        ));
    }
    for action in ["/actions/retry-group", "/actions/discard-group"] {
        let group = |failure: Option<&str>| {
            let mut form = vec![("group_destination", "d".to_owned())];
            form.extend(failure.map(|f| ("failure", f.to_owned())));
            form
        };
        cases.push((
            "POST",
            action,
            vec![("failure", "f".to_owned())],
            "group_destination",
        ));
        cases.push((
            "POST",
            action,
            vec![
                ("group_destination", nul.clone()),
                ("failure", "f".to_owned()),
            ],
            "group_destination",
        ));
        cases.push(("POST", action, group(None), "failure"));
        cases.push(("POST", action, group(Some(&nul)), "failure"));
        cases.push(("POST", action, group(Some(&"f".repeat(241))), "failure"));
    }
    cases.push((
        "POST",
        "/actions/forget",
        vec![("consumer", "c".to_owned())],
        "key",
    ));
    cases.push((
        "POST",
        "/actions/forget",
        vec![("key", "k".to_owned())],
        "consumer",
    ));
    cases.push((
        "POST",
        "/actions/forget",
        vec![("consumer", long.clone()), ("key", "k".to_owned())],
        "consumer",
    ));
    for (method, path, mut fields, named) in cases {
        let request = match method {
            "GET" => http.get(format!("{base}{path}")).query(&fields),
            _ => {
                fields.push(("csrf", token.clone()));
                http.post(format!("{base}{path}")).form(&fields)
            }
        };
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        if status != 400 || !body.contains(named) {
            return Err(format!(
                "{method} {path} {:?}: {status}, naming {named:?}? {}",
                fields
                    .iter()
                    .map(|(f, v)| (*f, v.len()))
                    .collect::<Vec<_>>(),
                body.chars()
                    .filter(|c| *c != '\n')
                    .take(300)
                    .collect::<String>()
            ));
        }
    }
    if dead_ids(pool, names).await? != dead_before {
        return Err("a refused request changed the dead messages".into());
    }
    Ok(())
}

/// The ids of the dead messages of the test's destination.
async fn dead_ids<D: diesel_inbox::outbox::RelayPool>(
    pool: &D,
    names: &Names,
) -> Result<Vec<String>, String> {
    let mut conn = pool.connection().await.map_err(|e| e.to_string())?;
    let dead =
        outbox::dead_matching_async(&mut *conn, &DeadFilter::new().destination(&names.dead), 100)
            .await
            .map_err(|e| e.to_string())?;
    Ok(dead.into_iter().map(|d| d.id).collect())
}

/// DNS rebinding, in Chromium: a name that resolves to 127.0.0.1 (the
/// browser's host resolver rules) reaches the console's port, and gets
/// the `421` page and nothing else; the console allowed that name shows
/// its page there, so the refusal is the name's.
async fn rebinding_refused<D>(driver: &Driver, pool: D, names: &Names) -> Check
where
    D: diesel_inbox::outbox::RelayPool + Clone + 'static,
{
    let rules = "--host-resolver-rules=MAP rebind.test 127.0.0.1";
    let client = driver.session_with(&[rules]).await?;
    let checked = async {
        let strict = serve(console::router(pool.clone()), "127.0.0.1:0").await?;
        let dead = format!("/dead?destination={}", names.dead);
        open(
            &client,
            &format!("http://rebind.test:{}{dead}", strict.port()),
        )
        .await?;
        let refused = text(&client, "#misdirected").await?;
        if !refused.contains("rebind.test") || count(&client, "form").await? != 0 {
            return Err(format!("the rebound name was served: {refused:?}"));
        }
        screenshot(&client, "rebinding-refused").await?;
        let allowing = console::router(pool.clone()).allow_hosts(["Rebind.Test"]);
        let allowing = serve(allowing, "127.0.0.1:0").await?;
        open(
            &client,
            &format!("http://rebind.test:{}{dead}", allowing.port()),
        )
        .await?;
        let rows = count(&client, "details.dead").await?;
        if rows == 0 {
            return Err("the allowed name shows no dead message".into());
        }
        Ok(())
    }
    .await;
    let _ = client.close().await;
    checked
}

/// A read-only console shows no action.
async fn read_only_shows_none(client: &Client, read_only: &str, names: &Names) -> Check {
    for page in [
        format!("{read_only}/dead?destination={}", names.dead),
        format!("{read_only}/lookup?consumer={}&key=k-2", names.billing),
    ] {
        open(client, &page).await?;
        let forms = count(client, "form.action").await?;
        let listed = count(client, "details.dead").await? + count(client, "#found").await?;
        if forms != 0 || listed == 0 {
            return Err(format!("{page}: {forms} action forms, {listed} rows"));
        }
    }
    Ok(())
}

/// The overview follows the database without a reload.
async fn live_update<C>(client: &Client, base: &str, pool: &Pool<C>, names: &Names) -> Check
where
    C: AsyncInboxConnection + PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    open(client, &format!("{base}/")).await?;
    let cell = format!("tr[data-consumer='{}'] td.rows", names.billing);
    let before = number(client, &cell).await?;
    data::apply(pool, &names.billing, 100..101).await?;
    // A redelivery, in this process (the console's): no row, one duplicate.
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let again: Result<_, diesel_inbox::InboxError> = diesel_inbox::Inbox::consumer(&names.billing)
        .run_async(&mut *conn, "k-100", async |_conn: &mut C| Ok(()))
        .await;
    if again.map_err(|e| e.to_string())? != diesel_inbox::Processed::Duplicate {
        return Err("the redelivery was applied".into());
    }
    drop(conn);
    let duplicates = format!("tr[data-consumer='{}'] td.duplicates", names.billing);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = number(client, &cell).await?;
        if now == before + 1 && number(client, &duplicates).await? == 1 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{now} rows and {} duplicates 15 s after one more was applied and one redelivered",
                number(client, &duplicates).await?
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Discard in the browser removes the row.
async fn discard<C>(client: &Client, base: &str, pool: &Pool<C>, names: &Names) -> Check
where
    C: AsyncInboxConnection + PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    open(client, &format!("{base}/dead?destination={}", names.dead)).await?;
    let binary = format!("details[data-id='{}']", names.binary_id);
    click(client, &format!("{binary} summary")).await?;
    click(client, &format!("{binary} button[value='discard']")).await?;
    let said = notice(client).await?;
    if said != "1 dead message(s) discarded" {
        return Err(format!("the notice: {said:?}"));
    }
    if count(client, &binary).await? != 0 {
        return Err("the discarded message is still listed".into());
    }
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let dead =
        outbox::dead_matching_async(&mut *conn, &DeadFilter::new().destination(&names.dead), 10)
            .await
            .map_err(|e| e.to_string())?;
    if dead.iter().any(|d| d.id == names.binary_id) {
        return Err("the discarded message is still in the outbox".into());
    }
    Ok(())
}

/// Four dead messages in two failure groups: the CLI's `outbox dead
/// --groups` and the dead page count them alike; a group's retry in the
/// browser makes exactly its three pending, the other's discard deletes
/// its one.
async fn failure_groups<C>(
    client: &Client,
    base: &str,
    url: &str,
    pool: &Pool<C>,
    names: &Names,
) -> Check
where
    C: AsyncInboxConnection + PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
    Pool<C>: diesel_inbox::outbox::RelayPool + Clone,
{
    data::grouped_dead(pool, names).await?;
    let listed = cli_json(url, &["outbox", "dead", "--groups", "--json"])?;
    let of_ours: Vec<(String, u64)> = listed
        .as_array()
        .ok_or("outbox dead --groups --json: not an array")?
        .iter()
        .filter(|g| g["destination"] == names.grouped.as_str())
        .map(|g| {
            (
                g["failure"].as_str().unwrap_or("").to_owned(),
                g["count"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let expected = vec![
        ("timeout after # on #".to_owned(), 3),
        ("<i>quota</i> exceeded".to_owned(), 1),
    ];
    if of_ours != expected {
        return Err(format!("outbox dead --groups: {of_ours:?}"));
    }
    open(
        client,
        &format!("{base}/dead?destination={}", names.grouped),
    )
    .await?;
    if count(client, "#groups tr.group").await? != 2 {
        return Err("the dead page does not show 2 failure groups".into());
    }
    let first = text(client, "#groups tr.group td.failure").await?;
    if first != "timeout after # on #" || number(client, "#groups tr.group td.count").await? != 3 {
        return Err(format!("the first group: {first:?}"));
    }
    if count(client, "#groups i").await? != 0 {
        return Err("a group's error was drawn as HTML".into());
    }
    click(client, "#groups tr.group button[value='retry-group']").await?;
    let said = notice(client).await?;
    if said != "3 dead message(s) pending again" {
        return Err(format!("the group's retry said {said:?}"));
    }
    // A page without the last notice, so that the next is the discard's.
    open(
        client,
        &format!("{base}/dead?destination={}", names.grouped),
    )
    .await?;
    click(client, "#groups tr.group button[value='discard-group']").await?;
    let said = notice(client).await?;
    if said != "1 dead message(s) discarded" {
        return Err(format!("the group's discard said {said:?}"));
    }
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let dead = outbox::dead_matching_async(
        &mut *conn,
        &DeadFilter::new().destination(&names.grouped),
        10,
    )
    .await
    .map_err(|e| e.to_string())?;
    let status = outbox::status_async(&mut *conn)
        .await
        .map_err(|e| e.to_string())?;
    let pending = status
        .destinations
        .iter()
        .find(|d| d.destination == names.grouped)
        .map_or(0, |d| d.pending);
    if !dead.is_empty() || pending != 3 {
        return Err(format!(
            "after the group actions: {} dead, {pending} pending, not 0 and 3",
            dead.len()
        ));
    }
    Ok(())
}

/// The lookup finds an applied key and an HTTP key; forget removes the
/// row.
async fn lookup_and_forget<C>(client: &Client, base: &str, pool: &Pool<C>, names: &Names) -> Check
where
    C: AsyncInboxConnection + PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    open(
        client,
        &format!(
            "{base}/lookup?endpoint={}&scope=user-1&idempotency_key=order-77",
            names.endpoint
        ),
    )
    .await?;
    let found = text(client, "#found").await?;
    if !found.starts_with("applied") {
        return Err(format!("the HTTP key: {found:?}"));
    }
    open(
        client,
        &format!("{base}/lookup?consumer={}&key=k-3", names.billing),
    )
    .await?;
    let found = text(client, "#found").await?;
    if !found.starts_with("applied") {
        return Err(format!("the key: {found:?}"));
    }
    screenshot(client, "lookup").await?;
    click(client, "button[value='forget']").await?;
    let said = notice(client).await?;
    if !said.starts_with("forgotten") {
        return Err(format!("the notice: {said:?}"));
    }
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let entry = diesel_inbox::status_async(&mut *conn, &names.billing, "k-3")
        .await
        .map_err(|e| e.to_string())?;
    match entry {
        None => Ok(()),
        Some(_) => Err("the forgotten row is still there".into()),
    }
}

/// The SQLite and MariaDB check: the overview and the dead messages
/// render the backend's rows.
async fn renders<C>(client: &Client, base: &str, url: &str, names: &Names) -> Check
where
    C: AsyncInboxConnection + PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    open(client, &format!("{base}/")).await?;
    let rows = number(
        client,
        &format!("tr[data-consumer='{}'] td.rows", names.billing),
    )
    .await?;
    let stats = cli_json(url, &["stats", "--json"])?;
    let cli = stats
        .as_array()
        .and_then(|all| all.iter().find(|s| s["consumer"] == names.billing.as_str()))
        .and_then(|s| s["rows"].as_u64());
    let dead = number(
        client,
        &format!("tr[data-destination='{}'] td.dead", names.dead),
    )
    .await?;
    if Some(rows) != cli || rows != 5 || dead != 2 {
        return Err(format!("{rows} rows (the CLI: {cli:?}), {dead} dead"));
    }
    open(client, &format!("{base}/dead?destination={}", names.dead)).await?;
    let listed = count(client, "details.dead").await?;
    let failing = count(client, "#failing tr[data-key='k-bad']").await?;
    if listed != 2 || failing != 1 {
        return Err(format!(
            "the dead page lists {listed} messages, {failing} given-up keys"
        ));
    }
    Ok(())
}

/// Mounted with `nest("/ops", ..)`, the pages link within `/ops`.
async fn nested<D: diesel_inbox::outbox::RelayPool + Clone + 'static>(
    pool: Result<D, String>,
) -> Check {
    let pool = pool?;
    for mount in ["/ops", "/ops/"] {
        let prefix = mount.trim_end_matches('/');
        let app = axum::Router::new().nest(mount, console::router(pool.clone()));
        let base = format!("http://{}", serve(app, "127.0.0.1:0").await?);
        let http = reqwest::Client::new();
        let fetch = |path: String| {
            let http = http.clone();
            async move {
                let page = http.get(path).send().await.map_err(|e| e.to_string())?;
                let status = page.status().as_u16();
                Ok::<_, String>((status, page.text().await.unwrap_or_default()))
            }
        };
        // Every link, script, stylesheet and form of every page resolves
        // under the mount point: no 404 (a form's POST without its token
        // is refused, 403, not missing).
        let mut seen = std::collections::BTreeSet::new();
        let mut pages = vec![
            mount.to_owned(),
            format!("{prefix}/dead"),
            format!("{prefix}/lookup"),
        ];
        while let Some(path) = pages.pop() {
            if !seen.insert(path.clone()) {
                continue;
            }
            let (status, body) = fetch(format!("{base}{path}")).await?;
            if status != 200 {
                return Err(format!("nested at {mount:?}: {path}: {status}"));
            }
            for attribute in ["href=\"", "src=\""] {
                for target in body.split(attribute).skip(1) {
                    let target = target.split('"').next().unwrap_or("").replace("&amp;", "&");
                    if !target.starts_with(prefix) {
                        return Err(format!("nested at {mount:?}: {path} links to {target}"));
                    }
                    if target.ends_with(".css") || target.ends_with(".js") {
                        let (status, _) = fetch(format!("{base}{target}")).await?;
                        if status != 200 {
                            return Err(format!("nested at {mount:?}: {target}: {status}"));
                        }
                    } else if seen.len() < 40 {
                        pages.push(target);
                    }
                }
            }
            for action in body.split("action=\"").skip(1) {
                let action = action.split('"').next().unwrap_or("");
                let status = http
                    .post(format!("{base}{action}"))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?
                    .status()
                    .as_u16();
                if !action.starts_with(prefix) || status == 404 {
                    return Err(format!(
                        "nested at {mount:?}: {path}: form to {action}: {status}"
                    ));
                }
            }
        }
    }
    Ok(())
}

async fn sqlite(driver: &Driver, client: &Client, results: &mut Results) {
    type Conn =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    let dir = std::env::temp_dir().join(support::unique_identifier("console"));
    let _ = std::fs::create_dir_all(&dir);
    let url = dir.join("inbox.db").display().to_string();
    let names = Names::new("sqlite");
    let ready = async {
        let pool = support::pools::deadpool::<Conn>(url.clone(), 2)?;
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        diesel_inbox::migrate_async(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
        drop(conn);
        data::produce(&pool, &names, Refusing(names.dead.clone())).await?;
        let base = format!(
            "http://{}",
            serve(console::router(pool.clone()), "127.0.0.1:0").await?
        );
        Ok::<_, String>(base)
    }
    .await;
    match ready {
        Ok(base) => {
            let rendered = renders::<Conn>(client, &base, &url, &names).await;
            results.record("sqlite", "renders", rendered);
            let served = crate::cli::cli_console(&url, &names).await;
            results.record("sqlite", "diesel-inbox console", served);
            let pool = support::pools::deadpool::<Conn>(url.clone(), 2);
            results.record("sqlite", "nested at /ops", nested(pool).await);
            let rebinding = match support::pools::deadpool::<Conn>(url.clone(), 2) {
                Ok(pool) => rebinding_refused(driver, pool, &names).await,
                Err(why) => Err(why),
            };
            results.record("sqlite", "DNS rebinding refused", rebinding);
            let refused = match support::pools::deadpool::<Conn>(url.clone(), 2) {
                Ok(pool) => bad_input_is_400(&base, &pool, &names).await,
                Err(why) => Err(why),
            };
            results.record("sqlite", "bad input is a 400", refused);
            let groups = match support::pools::deadpool::<Conn>(url.clone(), 2) {
                Ok(pool) => failure_groups(client, &base, &url, &pool, &names).await,
                Err(why) => Err(why),
            };
            results.record("sqlite", "failure groups", groups);
        }
        Err(why) => results.record("sqlite", "set-up", Err(why)),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "mysql")]
async fn mysql(client: &Client, results: &mut Results) {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let Some(admin) = support::server_var("INBOX_TEST_MYSQL_URL") else {
        return;
    };
    let name = support::unique_identifier("console");
    let (server, _) = admin.rsplit_once('/').expect("a URL with a database");
    let url = format!("{server}/{name}");
    let names = Names::new("mysql");
    let ready = async {
        let mut conn = diesel::MysqlConnection::establish(&admin).map_err(|e| e.to_string())?;
        conn.batch_execute(&format!("CREATE DATABASE {name}"))
            .map_err(|e| e.to_string())?;
        let pool = support::pools::deadpool::<diesel_async::AsyncMysqlConnection>(url.clone(), 2)?;
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        diesel_inbox::migrate_async(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
        drop(conn);
        data::produce(&pool, &names, Refusing(names.dead.clone())).await?;
        let base = format!(
            "http://{}",
            serve(console::router(pool.clone()), "127.0.0.1:0").await?
        );
        Ok::<_, String>((base, pool))
    }
    .await;
    // MariaDB in the browser: the pages, bad input, and each action.
    match ready {
        Ok((base, pool)) => {
            let rendered =
                renders::<diesel_async::AsyncMysqlConnection>(client, &base, &url, &names).await;
            results.record("mysql", "renders", rendered);
            let refused = bad_input_is_400(&base, &pool, &names).await;
            results.record("mysql", "bad input is a 400", refused);
            let discarded = discard(client, &base, &pool, &names).await;
            results.record("mysql", "discard removes", discarded);
            let forgotten = lookup_and_forget(client, &base, &pool, &names).await;
            results.record("mysql", "lookup and forget", forgotten);
            let groups = failure_groups(client, &base, &url, &pool, &names).await;
            results.record("mysql", "failure groups", groups);
        }
        Err(why) => results.record("mysql", "set-up", Err(why)),
    }
    if let Ok(mut conn) = diesel::MysqlConnection::establish(&admin) {
        let _ = conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"));
    }
}

/// This machine's address on its default route, if it has one that is
/// not loopback (no packet is sent).
fn outward_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[cfg(all(feature = "postgres", feature = "lapin"))]
async fn postgres(client: &Client, results: &mut Results) {
    use diesel_async::AsyncPgConnection;
    let (Some(_), Some(amqp)) = (
        support::server_var("INBOX_TEST_POSTGRES_URL"),
        support::server_var("INBOX_TEST_AMQP_URL"),
    ) else {
        return;
    };
    let database = support::relay::Database::create("console");
    let url = database.url.clone();
    let names = Names::new("pg");
    let ship = format!("console-pg-ship-{}", support::run_stamp());
    let pool = match support::pools::deadpool::<AsyncPgConnection>(url.clone(), 4) {
        Ok(pool) => pool,
        Err(why) => return results.record("postgres", "set-up", Err(why)),
    };
    let produced = async {
        drop(database.migrated().await);
        data::produce(
            &pool,
            &names,
            diesel_inbox::outbox::lapin::Publisher::connect(amqp.clone(), ""),
        )
        .await
    }
    .await;
    if let Err(why) = produced {
        return results.record("postgres", "set-up", Err(why));
    }
    let kafka = kafka_position(&pool, &ship, results).await;
    let consoles = async {
        let mut main = console::router(pool.clone()).max_attempts(MAX_ATTEMPTS);
        #[cfg(feature = "kafka")]
        if let Some(brokers) = kafka.as_ref().and(std::env::var("INBOX_TEST_KAFKA_BROKERS").ok()) {
            main = main.kafka_lag(brokers);
        }
        let main = serve(main, "127.0.0.1:0").await?;
        let read_only = serve(console::router(pool.clone()).read_only(true), "127.0.0.1:0").await?;
        let open_to_all = match outward_address() {
            Some(ip) => {
                let open = console::router(pool.clone()).allow_hosts([ip.to_string()]);
                let bound = serve(open, "0.0.0.0:0").await?;
                Some(format!("http://{ip}:{}", bound.port()))
            }
            None => {
                println!("SKIPPED: console/postgres: a non-loopback peer (this machine has no address but loopback)");
                None
            }
        };
        Ok::<_, String>((format!("http://{main}"), format!("http://{read_only}"), open_to_all))
    }
    .await;
    let (main, read_only, open_to_all) = match consoles {
        Ok(consoles) => consoles,
        Err(why) => return results.record("postgres", "set-up", Err(why)),
    };
    let pg = "postgres";
    results.record(
        pg,
        "the overview equals the CLI",
        overview_matches_cli(client, &main, &url, &names, kafka.as_deref()).await,
    );
    results.record(
        pg,
        "hostile data is text",
        hostile_data_is_text(client, &main, &names).await,
    );
    results.record(
        pg,
        "refusals change nothing",
        refusals(&pool, &names, &main, &read_only, open_to_all.as_deref()).await,
    );
    results.record(
        pg,
        "bad input is a 400",
        bad_input_is_400(&main, &pool, &names).await,
    );
    results.record(
        pg,
        "read-only shows no action",
        read_only_shows_none(client, &read_only, &names).await,
    );
    results.record(
        pg,
        "retry publishes at RabbitMQ",
        retry_reaches_rabbitmq(client, &main, &pool, &names, &amqp).await,
    );
    results.record(
        pg,
        "discard removes",
        discard(client, &main, &pool, &names).await,
    );
    results.record(
        pg,
        "failure groups",
        failure_groups(client, &main, &url, &pool, &names).await,
    );
    results.record(
        pg,
        "the overview is live",
        live_update(client, &main, &pool, &names).await,
    );
    results.record(
        pg,
        "lookup and forget",
        lookup_and_forget(client, &main, &pool, &names).await,
    );
    results.record(
        pg,
        "a database that refuses or hangs",
        unavailable(&url).await,
    );
    #[cfg(feature = "kafka")]
    if kafka.is_some() {
        results.record(
            pg,
            "silent Kafka brokers: one lag client at a time",
            kafka_lag_asks_once(pool.clone()).await,
        );
    }
}

/// The Kafka position, where a broker is configured.
#[cfg(all(feature = "postgres", feature = "lapin"))]
async fn kafka_position(
    pool: &Pool<diesel_async::AsyncPgConnection>,
    consumer: &str,
    results: &mut Results,
) -> Option<String> {
    #[cfg(feature = "kafka")]
    if let Some(brokers) = support::server_var("INBOX_TEST_KAFKA_BROKERS") {
        let topic = format!("{consumer}-topic");
        let made = data::kafka_position(pool, &brokers, consumer, &topic).await;
        let ok = made.is_ok();
        results.record("postgres", "a Kafka position (set-up)", made);
        return ok.then(|| consumer.to_owned());
    }
    #[cfg(not(feature = "kafka"))]
    println!("SKIPPED: console/postgres: the Kafka position needs the feature kafka");
    let _ = (pool, consumer, results);
    None
}

/// Retry in the browser; the relay's next pass publishes the message to
/// the queue now bound to its routing key; it arrives at RabbitMQ.
#[cfg(all(feature = "postgres", feature = "lapin"))]
async fn retry_reaches_rabbitmq(
    client: &Client,
    base: &str,
    pool: &Pool<diesel_async::AsyncPgConnection>,
    names: &Names,
    amqp: &str,
) -> Check {
    use diesel_inbox::outbox::Relay;
    let (_connection, channel) = support::rabbit_queue(amqp, &names.dead).await;
    open(client, &format!("{base}/dead?destination={}", names.dead)).await?;
    let message = format!("details[data-id='{}']", names.script_id);
    click(client, &format!("{message} summary")).await?;
    click(client, &format!("{message} button[value='retry']")).await?;
    let said = notice(client).await?;
    if said != "1 dead message(s) pending again" {
        return Err(format!("the notice: {said:?}"));
    }
    let relay = Relay::new(
        pool.clone(),
        diesel_inbox::outbox::lapin::Publisher::connect(amqp.to_owned(), ""),
    );
    relay.run_once().await.map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = channel
            .basic_get(
                names.dead.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .map_err(|e| e.to_string())?;
        if let Some(message) = got {
            let body = String::from_utf8_lossy(&message.delivery.data).into_owned();
            return if body == SCRIPT {
                Ok(())
            } else {
                Err(format!("RabbitMQ got {body:?}"))
            };
        }
        if Instant::now() > deadline {
            return Err("the retried message did not reach RabbitMQ".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A console on a database that refuses connections, then on one that
/// accepts and never answers: a page that says so, within the time limit.
#[cfg(all(feature = "postgres", feature = "lapin"))]
async fn unavailable(url: &str) -> Check {
    use support::proxy::{Mode, Proxy};
    let upstream: std::net::SocketAddr = "127.0.0.1:5432".parse().map_err(|e| format!("{e}"))?;
    let proxy = Proxy::start(upstream)?;
    let proxied = proxy.route(url)?;
    let pool = support::pools::deadpool::<diesel_async::AsyncPgConnection>(proxied, 2)?;
    let base = format!(
        "http://{}",
        serve(console::router(pool), "127.0.0.1:0").await?
    );
    let http = reqwest::Client::new();
    for mode in [Mode::Forward, Mode::Refuse, Mode::Blackhole] {
        proxy.set(mode);
        let started = Instant::now();
        let response = http
            .get(format!("{base}/"))
            .timeout(console::QUERY_TIME_LIMIT + Duration::from_secs(5))
            .send()
            .await
            .map_err(|e| format!("{mode:?}: {e}"))?;
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        let took = started.elapsed();
        let expected = if mode == Mode::Forward { 200 } else { 503 };
        if status != expected || (expected == 503 && !body.contains("id=\"unavailable\"")) {
            return Err(format!("{mode:?}: {status} after {took:?}"));
        }
        if took > console::QUERY_TIME_LIMIT + Duration::from_secs(2) {
            return Err(format!("{mode:?}: answered after {took:?}"));
        }
    }
    proxy.set(Mode::Forward);
    Ok(())
}

/// Brokers that take connections and never answer, behind a console's
/// Kafka lag: many pages at once open one client at a time (not one
/// each), they answer 200 with the lag said unavailable, and the client
/// is closed after the console's time limit.
#[cfg(all(feature = "postgres", feature = "lapin", feature = "kafka"))]
async fn kafka_lag_asks_once(pool: Pool<diesel_async::AsyncPgConnection>) -> Check {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let silent = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let brokers = silent.local_addr().map_err(|e| e.to_string())?.to_string();
    let (accepted, open) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, o) = (accepted.clone(), open.clone());
    std::thread::spawn(move || {
        for stream in silent.incoming().flatten() {
            a.fetch_add(1, Ordering::SeqCst);
            o.fetch_add(1, Ordering::SeqCst);
            let o = o.clone();
            // Reads what the client sends, answers nothing, and counts the
            // connection closed at its end of file.
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buffer = [0u8; 1024];
                while matches!(std::io::Read::read(&mut stream, &mut buffer), Ok(n) if n > 0) {}
                o.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    let base = format!(
        "http://{}",
        serve(console::router(pool).kafka_lag(brokers), "127.0.0.1:0").await?
    );
    let http = reqwest::Client::new();
    let pages = (0..12).map(|_| {
        let request = http
            .get(format!("{base}/live"))
            .timeout(console::QUERY_TIME_LIMIT + Duration::from_secs(5))
            .send();
        async move {
            let response = request.await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            if status != 200 || !body.contains("id=\"lag-unavailable\"") {
                return Err(format!(
                    "a page: {status}, lag unavailable: {}",
                    body.contains("lag-unavailable")
                ));
            }
            Ok::<_, String>(())
        }
    });
    for page in futures_util::future::join_all(pages).await {
        page?;
    }
    let clients = accepted.load(Ordering::SeqCst);
    if clients == 0 || clients > 2 {
        return Err(format!(
            "12 pages at once made {clients} connections to the brokers, not 1"
        ));
    }
    let since = Instant::now();
    while open.load(Ordering::SeqCst) > 0 {
        if since.elapsed() > Duration::from_secs(10) {
            return Err("the lag's client still holds its connection 10 s after the pages".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
