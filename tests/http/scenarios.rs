//! The client side: starts server processes, sends requests over TCP,
//! and checks what a user cares about: statuses, bodies, the replay
//! header, the business rows, the inbox rows.

mod db;

use crate::proxy::{Mode, Proxy};
use crate::server;
use diesel_inbox::http::{consumer_name, message_id, IdempotencyKey};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

type Check = Result<(), String>;

/// A named scenario of one backend, given its key.
/// The scenario that needs a database server (PostgreSQL, MySQL) to
/// refuse connections: skipped, and said so, on SQLite.
const NEEDS_A_SERVER: &str = "the database refusing connections";

type Scenario = (
    &'static str,
    fn(&Backend, &tokio::runtime::Runtime, &str) -> Check,
);

pub fn main() {
    if let Ok(role) = std::env::var("INBOX_HTTP_ROLE") {
        assert_eq!(role, "server");
        // One line per panic (a scenario's body panics on purpose).
        std::panic::set_hook(Box::new(|info| eprintln!("server: {info}")));
        let url = std::env::var("INBOX_HTTP_DB").expect("INBOX_HTTP_DB");
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let served = runtime.block_on(async {
            match std::env::var("INBOX_HTTP_BACKEND").as_deref() {
                Ok("sqlite") => server::serve::<server::Sqlite>(url).await,
                #[cfg(feature = "postgres")]
                Ok("postgres") => server::serve::<server::Postgres>(url).await,
                #[cfg(feature = "mysql")]
                Ok("mysql") => server::serve::<server::Mysql>(url).await,
                other => Err(format!("no such backend: {other:?}")),
            }
        });
        if let Err(e) = served {
            eprintln!("server: {e}");
            std::process::exit(2);
        }
        return;
    }
    let run = crate::support::run_stamp();
    let sqlite_dir = std::env::temp_dir().join(format!("diesel-inbox-http-{run}"));
    std::fs::create_dir_all(&sqlite_dir).expect("temp dir");
    let mut backends = vec![Backend {
        name: "sqlite",
        kind: "sqlite",
        url: sqlite_dir.join("http.db").to_string_lossy().into_owned(),
        port: None,
    }];
    for (name, kind, var, port, enabled) in [
        (
            "postgres",
            "postgres",
            "INBOX_TEST_POSTGRES_URL",
            5432,
            cfg!(feature = "postgres"),
        ),
        (
            "mysql",
            "mysql",
            "INBOX_TEST_MYSQL_URL",
            3306,
            cfg!(feature = "mysql"),
        ),
    ] {
        match std::env::var(var) {
            Ok(url) if !url.is_empty() && enabled => backends.push(Backend {
                name,
                kind,
                url,
                port: Some(port),
            }),
            _ => println!("SKIPPED: {name}: set {var} (and build with the `{name}` feature)"),
        }
    }
    let threads: Vec<_> = backends
        .into_iter()
        .map(|backend| {
            let run = run.clone();
            std::thread::spawn(move || backend.scenarios(&run))
        })
        .collect();
    crate::support::side_by_side("http", threads, || {
        let _ = std::fs::remove_dir_all(&sqlite_dir);
    });
}

struct Backend {
    name: &'static str,
    /// The server's backend: `sqlite`, `postgres` or `mysql`.
    kind: &'static str,
    url: String,
    /// The server's default port (for the proxy), `None` for SQLite.
    port: Option<u16>,
}

/// A server process; killed when dropped.
struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response as the client saw it.
/// Rolls back a transaction [`Backend::hold`] keeps open.
type Rollback = Box<dyn FnOnce() -> Result<(), String> + Send>;

#[derive(Debug)]
struct Got {
    status: u16,
    replayed: bool,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Backend {
    /// Runs every scenario; the number that failed.
    fn scenarios(&self, run: &str) -> usize {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let mut scenarios: Vec<Scenario> = vec![
            (
                "100 concurrent requests with one key run the body once",
                |b, rt, k| rt.block_on(b.concurrent(k)),
            ),
            (
                "a reused key, another scope, a missing, invalid or optional key",
                |b, rt, k| rt.block_on(b.keys(k)),
            ),
            ("a body's error rolls back and frees the key", |b, rt, k| {
                rt.block_on(b.failed(k))
            }),
            ("a body's panic is a 500 and frees the key", |b, rt, k| {
                rt.block_on(b.panicked(k))
            }),
            ("a request in flight past the wait is a 409", |b, rt, k| {
                rt.block_on(b.in_flight(k))
            }),
            (
                "a stored response not yet committed is never replayed",
                |b, rt, k| rt.block_on(b.uncommitted(k)),
            ),
            (
                "binary bodies, Location, and a body over the cap",
                |b, rt, k| rt.block_on(b.blobs(k)),
            ),
            (
                "killed inside the body: the retry applies once",
                |b, rt, k| rt.block_on(b.killed_before_commit(k)),
            ),
            ("killed after the commit: the retry replays", |b, rt, k| {
                rt.block_on(b.killed_after_commit(k))
            }),
            (
                concat!(
                    "the database refusing connections",
                    ": 503, then applied once"
                ),
                |b, rt, k| rt.block_on(b.database_down(k)),
            ),
        ];
        #[cfg(feature = "cli")]
        scenarios.push((
            "the CLI's status, forget and purge on an endpoint's keys",
            |b, rt, k| rt.block_on(b.cli_scenario(k)),
        ));
        let mut failed = 0;
        for (i, (name, scenario)) in scenarios.iter().enumerate() {
            let key = format!("{run}-{i}");
            if name.starts_with(NEEDS_A_SERVER) && self.port.is_none() {
                println!(
                    "http {}: {name}: SKIPPED: SQLite is a file in the server's process, with no server to refuse connections",
                    self.name
                );
                continue;
            }
            match scenario(self, &runtime, &key) {
                Ok(()) => println!("http {}: {name}: ok", self.name),
                Err(e) => {
                    failed += 1;
                    println!("http {}: {name}: FAILED: {e}", self.name);
                }
            }
        }
        failed
    }

    /// A server process on `url`.
    fn start(&self, url: &str) -> Result<Server, String> {
        let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .env("INBOX_HTTP_ROLE", "server")
            .env("INBOX_HTTP_BACKEND", self.kind)
            .env("INBOX_HTTP_DB", url)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn the server: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("the server did not start: {line:?}"))?;
        Ok(Server {
            base: format!("http://127.0.0.1:{port}"),
            child,
        })
    }

    async fn concurrent(&self, key: &str) -> Check {
        let server = self.start(&self.url)?;
        let client = reqwest::Client::new();
        let handles: Vec<_> = (0..100)
            .map(|_| tokio::spawn(pay(&client, &server, "u1", Some(key), 100, "sleep_ms=300")))
            .collect();
        let mut answers = Vec::new();
        for handle in handles {
            answers.push(handle.await.map_err(|e| e.to_string())??);
        }
        let first = &answers[0];
        for got in &answers {
            expect(
                got.status == 201,
                format!("every request gets 201, one got {got:?}"),
            )?;
            expect(got.body == first.body, "every request gets the same body")?;
            expect(
                got.headers.get("location") == first.headers.get("location"),
                "every request gets the same Location",
            )?;
        }
        let replayed = answers.iter().filter(|got| got.replayed).count();
        expect(replayed == 99, format!("99 replays, got {replayed}"))?;
        let rows = self.rows("u1", key)?;
        expect(rows == 1, format!("the body ran once: {rows} rows"))
    }

    async fn keys(&self, key: &str) -> Check {
        let server = self.start(&self.url)?;
        let client = reqwest::Client::new();
        let first = pay(&client, &server, "u1", Some(key), 1, "").await?;
        expect(
            first.status == 201 && !first.replayed,
            format!("applied: {first:?}"),
        )?;
        let seen: serde_json::Value =
            serde_json::from_slice(&first.body).map_err(|e| e.to_string())?;
        let own = self.lock_wait()?;
        expect(
            seen["lock_wait"] == own.as_str(),
            format!("the body runs under the connection's own lock wait {own}, not the front door's: {seen}"),
        )?;
        let other = pay(&client, &server, "u1", Some(key), 2, "").await?;
        expect(
            other.status == 422,
            format!("another request with the key: 422, got {other:?}"),
        )?;
        expect(problem(&other), "422 is problem+json")?;
        expect(self.rows("u1", key)? == 1, "the 422 ran nothing")?;
        let scoped = pay(&client, &server, "u2", Some(key), 2, "").await?;
        expect(
            scoped.status == 201 && !scoped.replayed,
            format!("another scope applies: {scoped:?}"),
        )?;
        expect(self.rows("u2", key)? == 1, "another scope's row")?;
        let missing = pay(&client, &server, "u1", None, 1, "").await?;
        expect(
            missing.status == 400 && problem(&missing),
            format!("no key: 400 problem+json, got {missing:?}"),
        )?;
        let response = client
            .post(format!("{}/payments", server.base))
            .header("x-user", "u1")
            .header("idempotency-key", "two words")
            .header("content-type", "application/json")
            .body(r#"{"amount": 1}"#)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let invalid = got(response).await?;
        expect(
            invalid.status == 400 && problem(&invalid),
            format!("an invalid key: 400, got {invalid:?}"),
        )?;
        self.optional_key(&client, &server, key).await
    }

    /// `Option<IdempotencyKey>`: without the header the body runs each
    /// time; an invalid one is still a 400; a valid one deduplicates.
    async fn optional_key(&self, client: &reqwest::Client, server: &Server, key: &str) -> Check {
        let user = format!("notes-{key}");
        let send = |key: Option<&str>| {
            let mut request = client
                .post(format!("{}/notes", server.base))
                .header("x-user", &user);
            if let Some(key) = key {
                request = request.header("idempotency-key", key);
            }
            async move { got(request.send().await.map_err(|e| e.to_string())?).await }
        };
        for _ in 0..2 {
            let plain = send(None).await?;
            expect(
                plain.status == 201 && !plain.replayed,
                format!("no key: the body runs: {plain:?}"),
            )?;
        }
        expect(self.rows(&user, "no key")? == 2, "no key: no deduplication")?;
        let invalid = send(Some("a b")).await?;
        expect(
            invalid.status == 400 && problem(&invalid),
            format!("an optional key that is invalid: 400, got {invalid:?}"),
        )?;
        let note = format!("{key}-note");
        let first = send(Some(&note)).await?;
        let again = send(Some(&note)).await?;
        expect(
            first.status == 201 && !first.replayed && again.replayed && again.body == first.body,
            "an optional key given: deduplicated",
        )?;
        expect(self.rows(&user, &note)? == 1, "applied once")
    }

    async fn failed(&self, key: &str) -> Check {
        let server = self.start(&self.url)?;
        let client = reqwest::Client::new();
        let refused = pay(&client, &server, "u1", Some(key), 5, "fail=true").await?;
        expect(
            refused.status == 400,
            format!("the body's error is the application's answer: {refused:?}"),
        )?;
        self.nothing_kept_then_applied(&client, &server, key).await
    }

    /// After a request that failed: no business row, no stored response;
    /// the retry runs the body and applies once.
    async fn nothing_kept_then_applied(
        &self,
        client: &reqwest::Client,
        server: &Server,
        key: &str,
    ) -> Check {
        expect(self.rows("u1", key)? == 0, "the body's write rolled back")?;
        expect(self.stored("payments", "u1", key)? == 0, "the key is free")?;
        let retry = pay(client, server, "u1", Some(key), 5, "").await?;
        expect(
            retry.status == 201 && !retry.replayed,
            format!("the retry runs: {retry:?}"),
        )?;
        expect(self.rows("u1", key)? == 1, "applied once")
    }

    async fn panicked(&self, key: &str) -> Check {
        let server = self.start(&self.url)?;
        let client = reqwest::Client::new();
        let panicked = pay(&client, &server, "u1", Some(key), 5, "panic=true").await?;
        expect(
            panicked.status == 500 && problem(&panicked),
            format!("a panic: 500 problem+json, got {panicked:?}"),
        )?;
        self.nothing_kept_then_applied(&client, &server, key).await
    }

    async fn in_flight(&self, key: &str) -> Check {
        let server = self.start(&self.url)?;
        let client = reqwest::Client::new();
        let slow = tokio::spawn(pay(&client, &server, "u1", Some(key), 7, "sleep_ms=3000"));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let early = pay(&client, &server, "u1", Some(key), 7, "wait_ms=200").await?;
        expect(
            early.status == 409 && problem(&early),
            format!("in flight past the wait: 409, got {early:?}"),
        )?;
        expect(
            early.headers.contains_key("retry-after"),
            "409 carries Retry-After",
        )?;
        let first = slow.await.map_err(|e| e.to_string())??;
        expect(
            first.status == 201 && !first.replayed,
            format!("the first applies: {first:?}"),
        )?;
        let late = pay(&client, &server, "u1", Some(key), 7, "").await?;
        expect(
            late.status == 201 && late.replayed && late.body == first.body,
            format!("then replays: {late:?}"),
        )?;
        expect(self.rows("u1", key)? == 1, "applied once")
    }

    /// Another transaction holds the key's row, with a stored response
    /// (one committed for another key, copied), uncommitted: the replay's
    /// read before the transaction must not see it, so the request waits
    /// on the row and answers 409; once that transaction rolls back, the
    /// request applies.
    async fn uncommitted(&self, key: &str) -> Check {
        let server = self.start(&self.url)?;
        let client = reqwest::Client::new();
        let other = format!("{key}-committed");
        let first = pay(&client, &server, "u1", Some(&other), 7, "").await?;
        expect(
            first.status == 201,
            format!("the other key applies: {first:?}"),
        )?;
        let parse = |k: &str| IdempotencyKey::parse(k).map_err(|e| e.to_string());
        let (from, to) = (
            message_id("u1", &parse(&other)?),
            message_id("u1", &parse(key)?),
        );
        let rollback = self.hold(
            "INSERT INTO inbox_messages (consumer, message_id, fingerprint, result) \
             SELECT consumer, ?, fingerprint, result FROM inbox_messages \
             WHERE consumer = 'http:payments' AND message_id = ?",
            &to,
            &from,
        )?;
        let during = pay(&client, &server, "u1", Some(key), 7, "wait_ms=300").await;
        rollback()?;
        let during = during?;
        expect(
            during.status == 409 && !during.replayed,
            format!("an uncommitted stored response: 409, not a replay, got {during:?}"),
        )?;
        let after = pay(&client, &server, "u1", Some(key), 7, "").await?;
        expect(
            after.status == 201 && !after.replayed,
            format!("rolled back: the request applies, got {after:?}"),
        )?;
        expect(self.rows("u1", key)? == 1, "applied once")
    }

    async fn blobs(&self, key: &str) -> Check {
        let server = self.start(&self.url)?;
        let client = reqwest::Client::new();
        let small = format!("{key}-small");
        let first = blob(&client, &server, &small, 600).await?;
        let expected: Vec<u8> = (0..600).map(|i| (i * 7 % 256) as u8).collect();
        expect(
            first.status == 200 && first.body == expected && !first.replayed,
            "the binary body",
        )?;
        let again = blob(&client, &server, &small, 600).await?;
        expect(
            again.replayed && again.body == expected,
            "the binary body replayed byte for byte",
        )?;
        for name in ["content-type", "etag", "x-blob-id"] {
            expect(
                again.headers.get(name) == first.headers.get(name),
                format!("{name} replayed"),
            )?;
        }
        expect(
            !again.headers.contains_key("x-not-stored"),
            "a header not named is not stored",
        )?;
        let big = format!("{key}-big");
        let first = blob(&client, &server, &big, 5000).await?;
        expect(
            first.body.len() == 5000 && !first.replayed,
            "the first gets the whole body over the cap",
        )?;
        let again = blob(&client, &server, &big, 5000).await?;
        expect(
            again.status == 200 && again.replayed && again.body.is_empty(),
            format!("over the cap: status and headers replayed, no body: {again:?}"),
        )?;
        expect(
            again.headers.get("x-blob-id") == first.headers.get("x-blob-id"),
            "headers kept",
        )?;
        expect(self.rows("blob-user", &big)? == 1, "the body ran once")?;
        // Location (the payments endpoint) replayed.
        let paid = pay(&client, &server, "u1", Some(key), 3, "").await?;
        let replay = pay(&client, &server, "u1", Some(key), 3, "").await?;
        expect(
            replay.replayed
                && paid.headers.get("location").is_some()
                && replay.headers.get("location") == paid.headers.get("location"),
            "Location replayed",
        )
    }

    async fn killed_before_commit(&self, key: &str) -> Check {
        let doomed = self.start(&self.url)?;
        let client = reqwest::Client::new();
        let request = tokio::spawn(pay(&client, &doomed, "u1", Some(key), 9, "sleep_ms=5000"));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        drop(doomed); // SIGKILL, inside the body
        let lost = request.await.map_err(|e| e.to_string())?;
        expect(
            lost.is_err(),
            format!("the killed request got no answer: {lost:?}"),
        )?;
        let server = self.start(&self.url)?;
        let retry = pay(&reqwest::Client::new(), &server, "u1", Some(key), 9, "").await?;
        expect(
            retry.status == 201 && !retry.replayed,
            format!("the retry applies: {retry:?}"),
        )?;
        expect(self.rows("u1", key)? == 1, "applied once")
    }

    async fn killed_after_commit(&self, key: &str) -> Check {
        let doomed = self.start(&self.url)?;
        let lost = pay(
            &reqwest::Client::new(),
            &doomed,
            "u1",
            Some(key),
            11,
            "exit_after_commit=true",
        )
        .await;
        expect(
            lost.is_err(),
            format!("the killed request got no answer: {lost:?}"),
        )?;
        drop(doomed);
        let server = self.start(&self.url)?;
        let retry = pay(&reqwest::Client::new(), &server, "u1", Some(key), 11, "").await?;
        expect(
            retry.status == 201 && retry.replayed,
            format!("the retry replays: {retry:?}"),
        )?;
        expect(self.rows("u1", key)? == 1, "applied once")
    }

    async fn database_down(&self, key: &str) -> Check {
        let port = self
            .port
            .ok_or("no database server to refuse connections (the runner skips this on SQLite)")?;
        let proxy = Proxy::start(([127, 0, 0, 1], port).into())?;
        let routed = proxy.route(&self.url)?;
        let server = self.start(&routed)?;
        let client = reqwest::Client::new();
        proxy.set(Mode::Refuse);
        let down = pay(&client, &server, "u1", Some(key), 13, "").await?;
        expect(
            down.status == 503,
            format!("the database refusing connections: 503, got {down:?}"),
        )?;
        expect(
            self.rows("u1", key)? == 0 && self.stored("payments", "u1", key)? == 0,
            "nothing stored",
        )?;
        proxy.set(Mode::Forward);
        let retry = pay(&client, &server, "u1", Some(key), 13, "").await?;
        expect(
            retry.status == 201 && !retry.replayed,
            format!("the retry applies: {retry:?}"),
        )?;
        expect(self.rows("u1", key)? == 1, "applied once")
    }
}

#[cfg(feature = "cli")]
impl Backend {
    /// `diesel-inbox ARGS` on this backend's database.
    fn cli(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(env!("CARGO_BIN_EXE_diesel-inbox"))
            .arg("--database-url")
            .arg(&self.url)
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            false => Err(format!(
                "diesel-inbox {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }

    async fn cli_scenario(&self, key: &str) -> Check {
        let server = self.start(&self.url)?;
        let client = reqwest::Client::new();
        let consumer = consumer_name("payments");
        let id = message_id(
            "u1",
            &IdempotencyKey::parse(key).map_err(|e| e.to_string())?,
        );
        pay(&client, &server, "u1", Some(key), 17, "").await?;
        let status = self.cli(&["status", &consumer, &id, "--json"])?;
        expect(
            status.contains("\"applied\":true"),
            format!("status shows the key applied: {status}"),
        )?;
        self.cli(&["forget", &consumer, &id])?;
        let again = pay(&client, &server, "u1", Some(key), 17, "").await?;
        expect(
            again.status == 201 && !again.replayed,
            format!("forgotten: the retry runs again: {again:?}"),
        )?;
        expect(self.rows("u1", key)? == 2, "two rows after the forget")?;
        tokio::time::sleep(Duration::from_millis(2100)).await;
        self.cli(&[
            "purge",
            "--older-than",
            "1s",
            "--force",
            "--consumer",
            &consumer,
        ])?;
        expect(self.stored("payments", "u1", key)? == 0, "purged")?;
        let after = pay(&client, &server, "u1", Some(key), 17, "").await?;
        expect(
            after.status == 201 && !after.replayed,
            "purged: the retry runs again",
        )
    }
}

fn expect(ok: bool, what: impl Into<String>) -> Check {
    match ok {
        true => Ok(()),
        false => Err(what.into()),
    }
}

fn problem(got: &Got) -> bool {
    got.headers
        .get("content-type")
        .is_some_and(|v| v == "application/problem+json")
}

async fn got(response: reqwest::Response) -> Result<Got, String> {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let replayed = headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body = response.bytes().await.map_err(|e| e.to_string())?.to_vec();
    Ok(Got {
        status,
        replayed,
        headers,
        body,
    })
}

fn pay(
    client: &reqwest::Client,
    server: &Server,
    user: &str,
    key: Option<&str>,
    amount: i64,
    knobs: &str,
) -> impl std::future::Future<Output = Result<Got, String>> + Send + 'static {
    let mut request = client
        .post(format!("{}/payments?{knobs}", server.base))
        .header("x-user", user)
        .header("content-type", "application/json")
        .body(serde_json::json!({ "amount": amount }).to_string());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    async move { got(request.send().await.map_err(|e| e.to_string())?).await }
}

async fn blob(
    client: &reqwest::Client,
    server: &Server,
    key: &str,
    size: usize,
) -> Result<Got, String> {
    let response = client
        .post(format!("{}/blobs?size={size}", server.base))
        .header("x-user", "blob-user")
        .header("idempotency-key", key)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    got(response).await
}
