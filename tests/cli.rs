//! The ops CLI, run as the real binary against each backend: every
//! subcommand, the refusals and the one-line errors with their exit codes.
#![cfg(feature = "cli")]

mod common;
mod support;

use assert_cmd::Command;
use common::backend::TestBackend;
use diesel::connection::SimpleConnection;
use diesel::Connection;
use diesel_inbox::{ErrorClass, Processed};
use std::time::Duration;
use support::{cli, run_cli as run};

fn claim<C: diesel_inbox::InboxConnection>(conn: &mut C, consumer: &str, key: &str) {
    let out: diesel::QueryResult<Processed<()>> = diesel_inbox::Inbox::consumer(consumer)
        .retries(0)
        .classify(ErrorClass::of)
        .run(conn, key, |_| Ok(()));
    assert!(out.expect("claim").is_applied());
}

/// The whole CLI on one backend, on a database of its own.
fn cli_contract<B: TestBackend>() {
    let Some(db) = B::fresh("cli") else {
        return;
    };
    let url = &db.url;

    // No table yet: every command but migrate says so.
    let (code, _, err) = run(cli(url).arg("stats"));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.starts_with("error: there is no inbox_messages table"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");

    let (code, out, err) = run(cli(url).arg("migrate"));
    assert_eq!(
        (code, out.trim()),
        (0, "inbox table ready (schema version 5)"),
        "{err}"
    );
    // Idempotent.
    assert_eq!(run(cli(url).arg("migrate")).0, 0);

    let mut conn = B::open(url);
    for n in 0..30 {
        claim(&mut conn, "billing", &format!("order-{n:02}"));
    }
    for n in 0..5 {
        claim(&mut conn, "mailer", &format!("mail-{n}"));
    }
    let two_days_ago = diesel_inbox::__testing::cutoff_sql::<<B::Conn as Connection>::Backend>(
        Duration::from_secs(2 * 86_400),
    );
    conn.batch_execute(&format!(
        "UPDATE inbox_messages SET received_at = {two_days_ago} \
         WHERE consumer = 'billing' AND message_id < 'order-20'"
    ))
    .expect("backdate");

    // stats: a table, and JSON for scripts.
    let (code, out, _) = run(cli(url).arg("stats"));
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("consumer"), "{out}");
    assert!(
        lines[1].starts_with("billing") && lines[1].contains(" 30 "),
        "{out}"
    );
    assert!(
        lines[2].starts_with("mailer") && lines[2].contains(" 5 "),
        "{out}"
    );
    let (code, out, _) = run(cli(url).args(["stats", "--json"]));
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json[0]["consumer"], "billing");
    assert_eq!(json[0]["rows"], 30);
    assert_eq!(json[1]["consumer"], "mailer");
    assert_eq!(json[1]["rows"], 5);
    let oldest = json[0]["oldest"].as_str().expect("a time");
    assert!(oldest.ends_with('Z') && oldest.len() == 27, "{oldest}");
    assert!(oldest < json[0]["newest"].as_str().expect("a time"));

    // status: 0 with the row, 1 without.
    let (code, out, _) = run(cli(url).args(["status", "billing", "order-25"]));
    assert_eq!(code, 0);
    assert!(
        out.starts_with("applied: consumer billing key order-25 received_at 20"),
        "{out}"
    );
    let (code, out, _) = run(cli(url).args(["status", "billing", "order-99"]));
    assert_eq!(code, 1);
    assert!(out.starts_with("not applied"), "{out}");
    // A key whose deliveries failed (`max_attempts`): status shows the count.
    for _ in 0..2 {
        let failed: diesel::QueryResult<Processed<()>> = diesel_inbox::Inbox::consumer("importer")
            .retries(0)
            .classify(ErrorClass::of)
            .max_attempts(5)
            .run(&mut conn, "file-7", |_| {
                Err(diesel::result::Error::NotFound)
            });
        assert!(failed.is_err());
    }
    let (code, out, _) = run(cli(url).args(["status", "importer", "file-7"]));
    assert_eq!(code, 1);
    assert!(
        out.contains("not applied")
            && out.contains("2 failed attempts (max_attempts)")
            && out.contains("last error: NotFound"),
        "{out}"
    );
    // status CONSUMER (no key): the Kafka runner's stream positions.
    let (code, out, _) = run(cli(url).args(["status", "shipping"]));
    assert_eq!(
        (code, out.trim()),
        (0, "no stream positions for consumer shipping")
    );
    conn.batch_execute(
        "INSERT INTO inbox_positions (consumer, topic, partition_id, next_offset, updated_at) \
         VALUES ('shipping', 'orders', 2, 42, 1764720000000000), \
                ('shipping', 'orders', 0, 7, 1764720000000000), \
                ('billing', 'invoices', 0, 3, 1764720000000000)",
    )
    .expect("positions");
    let (code, out, _) = run(cli(url).args(["status", "shipping"]));
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "a header and a line per partition: {out}");
    assert!(
        lines[1].starts_with("orders") && lines[1].contains(" 0 ") && lines[1].contains(" 7 "),
        "{out}"
    );
    assert!(
        lines[2].contains(" 2 ")
            && lines[2].contains(" 42 ")
            && lines[2].ends_with("2025-12-03T00:00:00.000000Z"),
        "{out}"
    );
    let (code, out, _) = run(cli(url).args(["status", "shipping", "--json"]));
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).expect("status --json");
    assert_eq!(json["consumer"], "shipping");
    assert_eq!(
        json["positions"].as_array().map(Vec::len),
        Some(2),
        "{json}"
    );
    assert_eq!(json["positions"][1]["topic"], "orders");
    assert_eq!(json["positions"][1]["partition"], 2);
    assert_eq!(json["positions"][1]["next_offset"], 42);
    // status --json: the same answers for scripts, with the same exit codes.
    let (code, out, _) = run(cli(url).args(["status", "billing", "order-25", "--json"]));
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).expect("status --json");
    assert_eq!(json["applied"], true);
    assert_eq!(json["key"], "order-25");
    assert!(json["received_at"].as_str().expect("a time").ends_with('Z'));
    assert!(json["attempts"].is_null());
    let (code, out, _) = run(cli(url).args(["status", "importer", "file-7", "--json"]));
    assert_eq!(code, 1);
    let json: serde_json::Value = serde_json::from_str(&out).expect("status --json");
    assert_eq!(json["applied"], false);
    assert!(json["received_at"].is_null());
    assert_eq!(json["attempts"]["failures"], 2);
    assert_eq!(json["attempts"]["last_error"], "NotFound");
    // attempts: the failing keys, all or the exhausted ones.
    let (code, out, _) = run(cli(url).args(["attempts", "--consumer", "importer", "--json"]));
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).expect("attempts --json");
    assert_eq!(json.as_array().map(Vec::len), Some(1), "{out}");
    assert_eq!(json[0]["key"], "file-7");
    assert_eq!(json[0]["failures"], 2);
    assert_eq!(json[0]["last_error"], "NotFound");
    let (code, out, _) = run(cli(url).args(["attempts"]));
    assert_eq!(code, 0);
    assert!(
        out.starts_with("consumer") && out.contains("file-7") && out.contains("NotFound"),
        "{out}"
    );
    let exhausted = |max: &str| {
        let (code, out, _) =
            run(cli(url).args(["attempts", "--exhausted", "--max-attempts", max, "--json"]));
        assert_eq!(code, 0);
        serde_json::from_str::<serde_json::Value>(&out).expect("json")
    };
    assert_eq!(exhausted("2")[0]["key"], "file-7");
    assert_eq!(exhausted("3").as_array().map(Vec::len), Some(0));
    let (code, _, err) = run(cli(url).args(["attempts", "--exhausted"]));
    assert_eq!(code, 2);
    assert!(err.contains("--max-attempts"), "{err}");

    // purge: refused under an hour, a dry run, then in batches.
    let (code, _, err) = run(cli(url).args(["purge", "--older-than", "30m"]));
    assert_eq!(code, 2);
    assert!(
        err.contains("refusing --older-than 30m") && err.contains("--force"),
        "{err}"
    );
    let (code, out, _) = run(cli(url).args(["purge", "--older-than", "1d", "--dry-run"]));
    assert_eq!(code, 0);
    assert!(out.contains("dry run: 20 rows older than 1d"), "{out}");
    assert!(run(cli(url).args(["status", "billing", "order-00"])).0 == 0);
    let (code, out, err) = run(cli(url).args([
        "purge",
        "--older-than",
        "1d",
        "--batch",
        "7",
        "--pause",
        "1ms",
        "--consumer",
        "billing",
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("purged 20 rows older than 1d (consumer billing) in 3 batches"),
        "{out}"
    );
    // Not a terminal: a log line per batch on stderr.
    assert_eq!(
        err.lines().filter(|l| l.starts_with("purge: ")).count(),
        3,
        "{err}"
    );
    assert_eq!(run(cli(url).args(["status", "billing", "order-00"])).0, 1);
    assert_eq!(run(cli(url).args(["status", "billing", "order-20"])).0, 0);
    let (code, out, _) = run(cli(url).args(["purge", "--older-than", "30m", "--force"]));
    assert_eq!(code, 0);
    assert!(out.contains("purged 0 rows"), "{out}");

    // forget: a deliberate replay.
    let (code, out, _) = run(cli(url).args(["forget", "mailer", "mail-3"]));
    assert_eq!(code, 0);
    assert!(out.starts_with("forgotten"), "{out}");
    assert_eq!(run(cli(url).args(["forget", "mailer", "mail-3"])).0, 1);
    claim(&mut conn, "mailer", "mail-3");

    // DATABASE_URL instead of the flag.
    let mut by_env = Command::cargo_bin("diesel-inbox").expect("the binary");
    let (code, out, _) = run(by_env
        .env("DATABASE_URL", url)
        .args(["status", "mailer", "mail-3"]));
    assert_eq!(code, 0, "{out}");

    // Bad input: one line, exit 2.
    let (code, _, err) = run(cli(url).args(["status", "billing", ""]));
    assert_eq!(code, 2);
    assert!(err.starts_with("error: invalid inbox key"), "{err}");
}

#[cfg(feature = "sqlite")]
#[test]
fn cli_on_sqlite() {
    cli_contract::<common::backends::sqlite::Sqlite>();
}

#[cfg(feature = "postgres")]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn cli_on_postgres() {
    cli_contract::<common::backends::postgres::Postgres>();
}

#[cfg(feature = "mysql")]
#[test]
#[cfg_attr(
    not(inbox_test_mysql),
    ignore = "INBOX_TEST_MYSQL_URL was not set when the tests were built"
)]
fn cli_on_mysql() {
    cli_contract::<common::backends::mysql::Mysql>();
}

#[test]
fn bad_urls_and_unreachable_servers_are_one_line_errors() {
    let cases = [
        (
            "redis://127.0.0.1/0",
            "unsupported database URL scheme `redis://`",
        ),
        (
            "postgres://someone:secret@127.0.0.1:1/nowhere",
            if cfg!(feature = "postgres") {
                "cannot connect to postgres://someone:***@127.0.0.1:1/nowhere"
            } else {
                "built without PostgreSQL"
            },
        ),
        (
            "mysql://someone:secret@127.0.0.1:1/nowhere",
            if cfg!(feature = "mysql") {
                "cannot connect to mysql://someone:***@127.0.0.1:1/nowhere"
            } else {
                "built without MySQL/MariaDB"
            },
        ),
        (
            "/nonexistent-dir/inbox.db",
            "no SQLite database at /nonexistent-dir/inbox.db",
        ),
    ];
    for (url, expected) in cases {
        let (code, out, err) = run(cli(url).arg("stats"));
        assert_eq!(code, 2, "{url}: {out} {err}");
        assert!(
            err.starts_with("error: ") && err.contains(expected),
            "{url}: {err}"
        );
        assert!(!err.contains("secret"), "the password leaked: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{url}: {err}");
    }
    let mut none = Command::cargo_bin("diesel-inbox").expect("the binary");
    let (code, _, err) = run(none.env_remove("DATABASE_URL").arg("stats"));
    assert_eq!(code, 2);
    assert!(
        err.contains("pass --database-url or set DATABASE_URL"),
        "{err}"
    );
}

/// A RabbitMQ connection and a channel on it, with `queue` declared.
#[cfg(all(feature = "lapin", feature = "async"))]
fn rabbit_queue(amqp: &str, queue: &str) -> (lapin::Connection, lapin::Channel) {
    common::modes::runtime().block_on(common::rabbit_queue(amqp, queue))
}

/// `outbox status|dead|retry|purge|relay` as the real binary: a relay run
/// once on RabbitMQ publishes one message and makes an unroutable one dead;
/// the dead one is listed, replayed, made dead again and purged.
#[cfg(all(feature = "lapin", feature = "async"))]
fn outbox_cli<B: TestBackend>() {
    use diesel_inbox::outbox::{self, Outgoing};
    let Some(amqp) = std::env::var("INBOX_TEST_AMQP_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!("SKIPPED: INBOX_TEST_AMQP_URL is not set");
        return;
    };
    let Some(db) = B::fresh("cli_outbox") else {
        return;
    };
    let url = &db.url;
    assert_eq!(run(cli(url).arg("migrate")).0, 0);
    let queue = common::unique_identifier("cli_outbox");
    let nowhere = format!("{queue}-nowhere");
    let runtime = common::modes::runtime();
    let channel = rabbit_queue(&amqp, &queue);
    let mut conn = B::open(url);
    let dead_id = conn
        .transaction(|conn| {
            outbox::enqueue(conn, Outgoing::new(nowhere.as_str(), "x").id("to-nowhere"))?;
            let _ = outbox::enqueue(conn, Outgoing::new(queue.as_str(), "hello"))?;
            Ok::<_, diesel::result::Error>("to-nowhere")
        })
        .expect("enqueue");
    let (code, out, _) = run(cli(url).args(["outbox", "status", "--json"]));
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        (json["pending"].as_u64(), json["dead"].as_u64()),
        (Some(2), Some(0)),
        "{out}"
    );

    let relay_once = || {
        run(cli(url).args([
            "outbox",
            "relay",
            "--amqp",
            &amqp,
            "--exchange",
            "",
            "--max-publish-attempts",
            "1",
            "--lease",
            "5s",
            "--once",
        ]))
    };
    let (code, out, err) = relay_once();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("published 1, failed 0, dead 1"), "{out}");
    // It speaks on stderr: its start and the dead message, as an operator
    // reads them (the library's events, target `diesel_inbox`).
    assert!(
        err.contains("INFO") && err.contains("outbox relay: started") && err.contains("lease"),
        "{err}"
    );
    assert!(
        err.contains("WARN") && err.contains("outbox message is dead"),
        "{err}"
    );
    // A lease under the library's minimum is refused, not raised.
    let (code, _, err) = run(cli(url).args([
        "outbox",
        "relay",
        "--amqp",
        &amqp,
        "--exchange",
        "",
        "--lease",
        "500ms",
        "--once",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a lease is at least 1s"), "{err}");
    let got = runtime.block_on(async {
        channel
            .1
            .basic_get(
                queue.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .expect("basic.get")
    });
    assert_eq!(got.map(|m| m.delivery.data), Some(b"hello".to_vec()));

    let (code, out, _) = run(cli(url).args(["outbox", "dead", "--json"]));
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json[0]["id"], dead_id, "{out}");
    assert!(
        json[0]["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("unroutable"),
        "{out}"
    );
    let (code, out, _) = run(cli(url).args(["outbox", "retry", dead_id]));
    assert_eq!((code, out.trim()), (0, "1 dead message(s) pending again"));
    let (code, _, _) = run(cli(url).args(["outbox", "retry", "--all-dead"]));
    assert_eq!(code, 1, "nothing left to retry");
    let (code, out, _) = run(cli(url).args(["outbox", "status"]));
    assert_eq!(code, 0);
    assert!(out.starts_with("pending 1, scheduled 0, dead 0"), "{out}");
    assert_eq!(relay_once().0, 0);
    let (code, _, err) = run(cli(url).args(["outbox", "purge", "--older-than", "1s"]));
    assert_eq!(code, 2);
    assert!(err.contains("--force"), "{err}");
    let (code, out, err) = run(cli(url).args(["outbox", "purge", "--older-than", "0s", "--force"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("purged 1 dead message(s)"), "{out}");
    let (code, out, _) = run(cli(url).args(["outbox", "dead"]));
    assert_eq!((code, out.trim()), (0, "no dead messages"));
    // A delayed message is scheduled, apart from the pending ones, and a
    // relay's pass leaves it.
    conn.transaction(|conn| {
        outbox::enqueue(
            conn,
            Outgoing::new(queue.as_str(), "later").deliver_after(Duration::from_secs(3600)),
        )
        .map_err(diesel::result::Error::from)
    })
    .expect("enqueue");
    let (code, out, _) = run(cli(url).args(["outbox", "status"]));
    assert_eq!(code, 0);
    assert!(out.starts_with("pending 0, scheduled 1, dead 0"), "{out}");
    assert!(out.contains("next scheduled in"), "{out}");
    let (code, out, _) = run(cli(url).args(["outbox", "status", "--json"]));
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        (json["pending"].as_u64(), json["scheduled"].as_u64()),
        (Some(0), Some(1)),
        "{out}"
    );
    let next = json["next_scheduled_in_secs"].as_f64().expect("a number");
    assert!(next > 3500.0 && next <= 3600.0, "{out}");
    assert_eq!(
        json["destinations"][0]["scheduled"].as_u64(),
        Some(1),
        "{out}"
    );
    let (code, out, err) = relay_once();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("published 0,"), "{out}");
    let (code, _, err) = run(cli(url).args(["outbox", "relay", "--once"]));
    assert_eq!(code, 2, "{err}");
    runtime.block_on(async {
        let _ = channel
            .1
            .queue_delete(
                queue.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
    });
}

#[test]
#[cfg(all(feature = "lapin", feature = "async"))]
fn outbox_cli_on_sqlite() {
    outbox_cli::<common::backends::sqlite::Sqlite>();
}

#[test]
#[cfg(all(feature = "lapin", feature = "async"))]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn outbox_cli_on_postgres() {
    outbox_cli::<common::backends::postgres::Postgres>();
}

#[test]
#[cfg(all(feature = "lapin", feature = "async"))]
#[cfg_attr(
    not(inbox_test_mysql),
    ignore = "INBOX_TEST_MYSQL_URL was not set when the tests were built"
)]
fn outbox_cli_on_mysql() {
    outbox_cli::<common::backends::mysql::Mysql>();
}

/// A server that may lose committed transactions is said, as a WARN with
/// the fix, by `migrate` (with `RUST_LOG`) and by the relay at start (its
/// log is on by default), each once: here PostgreSQL with
/// `synchronous_commit = off` for the connections of the URL (its
/// `options`, which libpq and tokio-postgres both pass to the server).
/// Without `RUST_LOG`, `migrate` says nothing.
#[test]
#[cfg(all(feature = "lapin", feature = "async", feature = "postgres"))]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn a_server_that_may_lose_commits_is_said_at_start() {
    use common::backends::postgres::Postgres;
    use std::io::Read;
    use std::time::Instant;
    let Some(amqp) = std::env::var("INBOX_TEST_AMQP_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!("SKIPPED: INBOX_TEST_AMQP_URL is not set");
        return;
    };
    let Some(db) = Postgres::fresh("cli_durability") else {
        return;
    };
    let separator = if db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}options=-c%20synchronous_commit%3Doff", db.url);
    let (code, _, quiet) = run(cli(&url).arg("migrate"));
    assert_eq!(code, 0, "{quiet}");
    assert!(!quiet.contains("WARN"), "{quiet}");
    let (code, _, err) = run(cli(&url)
        .env("RUST_LOG", "diesel_inbox=warn")
        .arg("migrate"));
    assert_eq!(code, 0, "{err}");
    let said = |log: &str| {
        log.lines()
            .filter(|l| l.contains("WARN") && l.contains("synchronous_commit is off"))
            .count()
    };
    assert_eq!(said(&err), 1, "{err}");
    assert!(err.contains("synchronous_commit = on"), "{err}");

    let mut relay = std::process::Command::new(assert_cmd::cargo::cargo_bin("diesel-inbox"))
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .args(["--database-url", &url, "outbox", "relay", "--amqp", &amqp])
        .args(["--exchange", "", "--poll-interval", "60s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the relay");
    // Its stderr, read beside it until the warning (or 20 s).
    let mut stderr = relay.stderr.take().expect("stderr");
    let (lines, read) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut log = String::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut chunk) {
            if n == 0 {
                break;
            }
            log.push_str(&String::from_utf8_lossy(&chunk[..n]));
            let _ = lines.send(log.clone());
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut log = String::new();
    while said(&log) == 0 && Instant::now() < deadline {
        if let Ok(more) = read.recv_timeout(Duration::from_millis(200)) {
            log = more;
        }
    }
    let _ = relay.kill();
    let _ = relay.wait();
    assert_eq!(said(&log), 1, "{log}");
}

/// The relay's NATS publisher reads each stream's configuration at its
/// first confirm from it and says once (WARN, with the fix) where the
/// stream may lose what it acknowledged: here memory storage and one
/// replica, through the CLI's relay (its log is on by default).
#[test]
#[cfg(all(feature = "nats", feature = "async"))]
fn a_jetstream_stream_in_memory_is_said_by_the_relay() {
    use common::backends::sqlite::Sqlite;
    use diesel_inbox::outbox::{self, Outgoing};
    let Some(nats) = std::env::var("INBOX_TEST_NATS_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!("SKIPPED: INBOX_TEST_NATS_URL is not set");
        return;
    };
    let Some(db) = Sqlite::fresh("cli_nats_memory") else {
        return;
    };
    let url = &db.url;
    assert_eq!(run(cli(url).arg("migrate")).0, 0);
    let name = common::unique_identifier("cli_nats_memory").replace('-', "_");
    let subject = format!("outbox.{name}");
    let js = common::modes::runtime().block_on(async {
        let client = async_nats::connect(&nats).await.expect("connect to NATS");
        let js = async_nats::jetstream::new(client);
        js.create_stream(async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: async_nats::jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .expect("create stream");
        js
    });
    let mut conn = Sqlite::open(url);
    for body in ["first", "second"] {
        conn.transaction(|conn| {
            outbox::enqueue(conn, Outgoing::new(subject.as_str(), body))
                .map_err(diesel::result::Error::from)
        })
        .expect("enqueue");
    }
    let (code, out, err) = run(cli(url).args(["outbox", "relay", "--nats", &nats, "--once"]));
    common::modes::runtime().block_on(async {
        let _ = js.delete_stream(&name).await;
    });
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("published 2"), "{out}");
    let said = |what: &str| {
        err.lines()
            .filter(|l| l.contains("WARN") && l.contains(&name) && l.contains(what))
            .count()
    };
    assert_eq!(said("keeps its messages in memory"), 1, "{err}");
    assert_eq!(said("one replica"), 1, "{err}");
    assert!(
        err.contains("storage: file") && err.contains("sync_interval: always"),
        "{err}"
    );
}

/// A relay in another process (the CLI's `outbox relay`, polling only
/// every 60 s) publishes each message within moments of the commit that
/// enqueued it, on PostgreSQL: the enqueue notified at its commit and the
/// relay `LISTEN`s. With `outbox::set_notify(false)` in the enqueuing
/// process, the same message waits for the poll.
#[test]
#[cfg(all(feature = "lapin", feature = "async", feature = "postgres"))]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn an_outbox_relay_in_another_process_wakes_at_the_commit_on_postgres() {
    use common::backends::postgres::Postgres;
    use diesel_inbox::outbox::{self, Outgoing};
    use std::time::Instant;
    let Some(amqp) = std::env::var("INBOX_TEST_AMQP_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!("SKIPPED: INBOX_TEST_AMQP_URL is not set");
        return;
    };
    // A database of its own (notifications are per database: another
    // test's enqueue in a schema of the shared one would wake this relay).
    let Some(server) = Postgres::prepare("cli_listen") else {
        return;
    };
    fn discard(url: &str) {
        let (server, name) = url.rsplit_once('/').expect("a URL with a database");
        let _ = Postgres::open(&format!("{server}/postgres"))
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    }
    let name = common::unique_identifier("cli_listen");
    Postgres::open(&server.url)
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create database");
    let (base, _) = server.url.rsplit_once('/').expect("a URL with a database");
    let db = common::TestDb::owned(format!("{base}/{name}"), discard);
    let url = &db.url;
    assert_eq!(run(cli(url).arg("migrate")).0, 0);
    let queue = name.clone();
    let runtime = common::modes::runtime();
    let (_rabbit, channel) = rabbit_queue(&amqp, &queue);
    // The body of the next message in the queue, waiting up to `within`.
    let take = |within: Duration| {
        runtime.block_on(async {
            let deadline = Instant::now() + within;
            while Instant::now() < deadline {
                let got = channel
                    .basic_get(
                        queue.as_str().into(),
                        lapin::options::BasicGetOptions { no_ack: true },
                    )
                    .await
                    .expect("basic.get");
                if let Some(message) = got {
                    return Some(message.delivery.data);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        })
    };
    let relay = std::process::Command::new(assert_cmd::cargo::cargo_bin("diesel-inbox"))
        .env_remove("DATABASE_URL")
        .args(["--database-url", url, "outbox", "relay", "--amqp", &amqp])
        .args(["--exchange", "", "--poll-interval", "60s"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the relay");
    // Killed when the test ends, also by a failed assertion: a relay left
    // running would poll a dropped database for ever.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut relay = Killed(relay);
    let mut conn = Postgres::open(url);
    let mut enqueue = |body: &str| {
        conn.transaction(|conn| {
            outbox::enqueue(conn, Outgoing::new(queue.as_str(), body))
                .map_err(diesel::result::Error::from)
        })
        .expect("enqueue");
    };
    // Its first pass, or its wake-up once it listens, publishes the first.
    enqueue("first");
    assert_eq!(
        take(Duration::from_secs(10)).as_deref(),
        Some(&b"first"[..])
    );
    let mut waits = Vec::new();
    for n in 0..5 {
        std::thread::sleep(Duration::from_millis(200));
        let body = format!("woken-{n}");
        let committed = Instant::now();
        enqueue(&body);
        let got = take(Duration::from_secs(10));
        waits.push(committed.elapsed());
        assert_eq!(got.as_deref(), Some(body.as_bytes()), "after {waits:?}");
    }
    assert!(
        waits.iter().all(|w| *w < Duration::from_secs(2)),
        "published {waits:?} after the commits, not at them (the poll is 60 s)"
    );
    // Once the relay sleeps again (a relay still awake after a publish
    // finds any row), which a loaded machine may take a while to reach.
    // (A relay still awake, or still passing while transactions it may
    // not have heard of run, would find the next row without a wake-up,
    // and the check below would prove nothing.)
    support::relay::wait_until_asleep(&mut Postgres::open(url), Duration::from_secs(60));
    outbox::set_notify(false);
    enqueue("quiet");
    outbox::set_notify(true);
    assert_eq!(
        take(Duration::from_secs(3)),
        None,
        "a commit that did not notify woke the relay"
    );
    std::process::Command::new("kill")
        .args(["-TERM", &relay.0.id().to_string()])
        .status()
        .expect("kill");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = relay.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(&mut relay.0.stdout.take().expect("stdout"), &mut out)
        .expect("stdout");
    assert!(status.success(), "{status:?} {out}");
    assert!(out.contains("published 6,"), "{out}");
    runtime.block_on(async {
        let _ = channel
            .queue_delete(
                queue.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
    });
}

/// `outbox relay --kafka BROKERS` as the real binary: each message goes to
/// the topic its destination names, its ordering key as the record's key,
/// its id in the `message-id` header (what `diesel_inbox::kafka`'s runner
/// deduplicates on), its headers copied; the rows are deleted.
#[test]
#[cfg(all(feature = "kafka", feature = "sqlite"))]
fn the_outbox_relay_publishes_to_kafka() {
    use common::backends::sqlite::Sqlite;
    use diesel_inbox::outbox::{self, Outgoing};
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::message::{Headers as _, Message as _};
    use rdkafka::ClientConfig;
    let Some(brokers) = support::server_var("INBOX_TEST_KAFKA_BROKERS") else {
        return;
    };
    let Some(db) = Sqlite::fresh("cli_kafka") else {
        return;
    };
    let url = &db.url;
    assert_eq!(run(cli(url).arg("migrate")).0, 0);
    let topic = support::unique_identifier("cli_kafka");
    common::modes::runtime().block_on(async {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("an admin client");
        let created = admin
            .create_topics(
                &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("create the topic");
        for result in created {
            result.expect("the topic");
        }
    });
    let mut conn = Sqlite::open(url);
    let ids = conn
        .transaction(|conn| {
            let first = outbox::enqueue(
                conn,
                Outgoing::new(topic.as_str(), "first")
                    .ordering_key("order-7")
                    .header("content-type", "text/plain"),
            )?;
            let second = outbox::enqueue(conn, Outgoing::new(topic.as_str(), "second"))?;
            Ok::<_, diesel::result::Error>(vec![first, second])
        })
        .expect("enqueue");

    let (code, out, err) = run(cli(url).args(["outbox", "relay", "--kafka", &brokers, "--once"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("published 2, failed 0, dead 0"), "{out}");
    let (code, out, _) = run(cli(url).args(["outbox", "status", "--json"]));
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json["pending"].as_u64(), Some(0), "{out}");

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", topic.as_str())
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("a Kafka consumer");
    let mut partitions = rdkafka::TopicPartitionList::new();
    partitions
        .add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
        .expect("the partition");
    consumer.assign(&partitions).expect("assign");
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while got.len() < 2 && std::time::Instant::now() < deadline {
        let Some(record) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let record = record.expect("a record");
        let headers: Vec<(String, String)> = record
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| {
                        let value = String::from_utf8_lossy(h.value.unwrap_or_default());
                        (h.key.to_owned(), value.into_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        got.push((
            record.payload().map(<[u8]>::to_vec),
            record.key().map(<[u8]>::to_vec),
            headers,
        ));
    }
    assert_eq!(got.len(), 2, "the relay's records did not arrive");
    let header = |i: usize, name: &str| {
        got[i]
            .2
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(got[0].0.as_deref(), Some(&b"first"[..]));
    assert_eq!(got[0].1.as_deref(), Some(&b"order-7"[..]));
    assert_eq!(header(0, "message-id").as_deref(), Some(ids[0].as_str()));
    assert_eq!(header(0, "content-type").as_deref(), Some("text/plain"));
    assert_eq!(got[1].0.as_deref(), Some(&b"second"[..]));
    assert_eq!(got[1].1, None);
    assert_eq!(header(1, "message-id").as_deref(), Some(ids[1].as_str()));
}

/// `doctor` lists what the guarantee stands on, as the server reports it:
/// on PostgreSQL `fsync`, `full_page_writes`, `synchronous_commit` and
/// replication (this test server has no standby), each ok, exit 0; with
/// `synchronous_commit = off` for the URL's sessions, a WARN line with the
/// fix and exit 1; `--json` for scripts. On MariaDB the log flush is read
/// and replication is unknown; on SQLite `synchronous` is unknown (a
/// setting of each connection).
#[test]
#[cfg(feature = "postgres")]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn doctor_lists_the_durability_prerequisites() {
    use common::backends::postgres::Postgres;
    let Some(db) = Postgres::fresh("cli_doctor") else {
        return;
    };
    let (code, out, err) = run(cli(&db.url).arg("doctor"));
    assert_eq!(code, 0, "{out}{err}");
    for line in [
        "ok       fsync = on: ",
        "ok       full_page_writes = on: ",
        "ok       synchronous_commit = on: ",
        "ok       replication = no standby: no standby streams from this server",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(line)),
            "{line:?} in {out}"
        );
    }
    let separator = if db.url.contains('?') { '&' } else { '?' };
    let off = format!("{}{separator}options=-c%20synchronous_commit%3Doff", db.url);
    let (code, out, err) = run(cli(&off).arg("doctor"));
    assert_eq!(code, 1, "{out}{err}");
    let warned: Vec<&str> = out.lines().filter(|l| l.starts_with("WARN")).collect();
    assert_eq!(warned.len(), 1, "{out}");
    assert!(
        warned[0].starts_with("WARN     synchronous_commit = off: synchronous_commit is off: a commit is acknowledged")
            && warned[0].contains("; fix: synchronous_commit = on"),
        "{out}"
    );
    let (code, json, err) = run(cli(&off).args(["doctor", "--json"]));
    assert_eq!(code, 1, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let commit = listed
        .as_array()
        .expect("a list")
        .iter()
        .find(|p| p["name"] == "synchronous_commit")
        .expect("synchronous_commit listed");
    assert_eq!(commit["verdict"], "warn", "{json}");
    assert_eq!(commit["value"], "off", "{json}");
    assert!(
        commit["fix"].as_str().is_some_and(|f| f.contains("= on")),
        "{json}"
    );
}

#[test]
#[cfg(feature = "mysql")]
#[cfg_attr(
    not(inbox_test_mysql),
    ignore = "INBOX_TEST_MYSQL_URL was not set when the tests were built"
)]
fn doctor_on_mysql_reads_the_log_flush_and_not_replication() {
    let Some(db) = common::backends::mysql::Mysql::fresh("cli_doctor") else {
        return;
    };
    let (code, out, err) = run(cli(&db.url).arg("doctor"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("ok       innodb_flush_log_at_trx_commit = 1: ")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("unknown  replication = not readable: ")
                && l.contains("AFTER_SYNC")),
        "{out}"
    );
}

#[test]
#[cfg(feature = "sqlite")]
fn doctor_on_sqlite_says_synchronous_is_per_connection() {
    let Some(db) = common::backends::sqlite::Sqlite::fresh("cli_doctor") else {
        return;
    };
    assert_eq!(run(cli(&db.url).arg("migrate")).0, 0);
    let (code, out, err) = run(cli(&db.url).arg("doctor"));
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().count(), 1, "one prerequisite, unknown: {out}");
    assert!(
        out.starts_with("unknown  synchronous = set per connection: ")
            && out.contains("PRAGMA synchronous = FULL"),
        "{out}"
    );
}

/// `doctor --nats URL --stream NAME` reads each stream's storage and
/// replicas too (`diesel_inbox::nats::stream_durability`): memory storage
/// and a single replica are WARNs with the fix, scoped by stream; a
/// stream that does not exist is an error naming it.
#[test]
#[cfg(all(feature = "nats", feature = "sqlite"))]
fn doctor_reads_the_jetstream_streams_named() {
    use common::backends::sqlite::Sqlite;
    let Some(nats) = std::env::var("INBOX_TEST_NATS_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!("SKIPPED: INBOX_TEST_NATS_URL is not set");
        return;
    };
    let Some(db) = Sqlite::fresh("cli_doctor_nats") else {
        return;
    };
    assert_eq!(run(cli(&db.url).arg("migrate")).0, 0);
    let name = common::unique_identifier("cli_doctor_nats").replace('-', "_");
    let js = common::modes::runtime().block_on(async {
        let client = async_nats::connect(&nats).await.expect("connect to NATS");
        let js = async_nats::jetstream::new(client);
        js.create_stream(async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("doctor.{name}")],
            storage: async_nats::jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .expect("create stream");
        js
    });
    let (code, out, err) = run(cli(&db.url).args(["doctor", "--nats", &nats, "--stream", &name]));
    let (missing, _, gone) =
        run(cli(&db.url).args(["doctor", "--nats", &nats, "--stream", "no_such_stream_here"]));
    common::modes::runtime().block_on(async {
        let _ = js.delete_stream(&name).await;
    });
    assert_eq!(code, 1, "{out}{err}");
    let scope = format!("nats stream {name}: ");
    assert!(
        out.lines().any(
            |l| l.starts_with(&format!("{scope}WARN     storage = memory: "))
                && l.contains("fix: a stream with storage: file")
        ),
        "{out}"
    );
    assert!(
        out.lines().any(
            |l| l.starts_with(&format!("{scope}WARN     num_replicas = 1: "))
                && l.contains("num_replicas: 3")
        ),
        "{out}"
    );
    assert!(
        out.starts_with("unknown  synchronous = "),
        "the database first: {out}"
    );
    assert_eq!(missing, 2, "{gone}");
    assert!(gone.contains("no_such_stream_here"), "{gone}");
}

/// `--tenants FILE`: each command runs on every tenant's database (SQLite
/// files here), its output under `tenant NAME:`, `purge` one line per
/// tenant; a tenant that fails is said and the others go on (exit 2); a
/// malformed list is refused. `console --tenants` serves one console over
/// every tenant (over TCP, until SIGTERM). With RabbitMQ, `outbox relay
/// --tenants --once` publishes every tenant's messages, each with its
/// `x-tenant`.
#[test]
fn the_tenants_option_runs_each_command_on_every_tenant() {
    let dir = std::env::temp_dir().join(format!("cli-tenants-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory");
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let url = |name: &str| format!("sqlite://{}", path(name));
    let list = path("tenants.txt");
    std::fs::write(
        &list,
        format!(
            "# name url\nacme {}\nglobex {}\n",
            url("acme.db"),
            url("globex.db")
        ),
    )
    .expect("the list");
    let tenants = |args: &[&str]| {
        let mut cmd = Command::cargo_bin("diesel-inbox").expect("the diesel-inbox binary");
        cmd.env_remove("DATABASE_URL")
            .env_remove("RUST_LOG")
            .args(["--tenants", &list])
            .args(args);
        run(&mut cmd)
    };
    let (code, out, err) = tenants(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("tenant acme:\ninbox table ready")
            && out.contains("tenant globex:\ninbox table ready"),
        "{out}"
    );
    for (name, n) in [("acme", 2), ("globex", 1)] {
        let mut conn =
            diesel::SqliteConnection::establish(&path(&format!("{name}.db"))).expect("open");
        conn.transaction(|conn| {
            for i in 0..n {
                diesel_inbox::outbox::enqueue(
                    conn,
                    diesel_inbox::outbox::Outgoing::new("orders", format!("{name}-{i}")),
                )?;
            }
            Ok::<_, diesel_inbox::InboxError>(())
        })
        .expect("enqueue");
    }
    let (code, out, err) = tenants(&["outbox", "status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("tenant acme:\npending 2,") && out.contains("tenant globex:\npending 1,"),
        "{out}"
    );
    let (code, out, err) = tenants(&["purge", "--older-than", "30d"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "one line per tenant: {out}");
    assert!(
        lines[0].starts_with("tenant acme: purged 0 rows older than 30d"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("tenant globex: purged 0 rows"),
        "{out}"
    );

    // Another tenant whose database does not exist: said, the others done.
    std::fs::write(
        &list,
        format!("acme {}\nmissing {}\n", url("acme.db"), url("missing.db")),
    )
    .expect("the list");
    let (code, out, err) = tenants(&["stats"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("tenant acme:") && out.contains("tenant missing:"),
        "{out}"
    );
    assert!(
        err.contains("error: tenant missing: no SQLite database at"),
        "{err}"
    );
    assert!(err.contains("1 of 2 tenants failed"), "{err}");
    // A malformed list, a name listed twice, commands that take one database.
    std::fs::write(&list, format!("acme {}\nglobex\n", url("acme.db"))).expect("the list");
    let (code, _, err) = tenants(&["stats"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("line 2: expected `NAME URL`, found `globex`"),
        "{err}"
    );
    std::fs::write(&list, format!("acme {0}\nacme {0}\n", url("acme.db"))).expect("the list");
    let (code, _, err) = tenants(&["stats"]);
    assert_eq!(code, 2);
    assert!(err.contains("tenant acme is listed twice"), "{err}");
    // `.` and `..`: no console page could name them.
    for dots in [".", ".."] {
        std::fs::write(&list, format!("{dots} {}\n", url("acme.db"))).expect("the list");
        let (code, _, err) = tenants(&["stats"]);
        assert_eq!(code, 2);
        assert!(
            err.contains(&format!(
                "the tenant name \"{dots}\" cannot be a path segment"
            )),
            "{err}"
        );
    }
    // A bare path is refused (it would be taken for a SQLite file, and
    // created), as is one database named twice.
    std::fs::write(&list, format!("acme {}\n", path("acme.db"))).expect("the list");
    let (code, _, err) = tenants(&["stats"]);
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "tenant acme's database URL must start with postgres://, mysql:// or sqlite://"
        ),
        "{err}"
    );
    std::fs::write(&list, format!("acme {0}\nglobex {0}\n", url("acme.db"))).expect("the list");
    let (code, _, err) = tenants(&["stats"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("tenants acme and globex have the same database"),
        "{err}"
    );
    std::fs::write(
        &list,
        format!("acme {}\nglobex {}\n", url("acme.db"), url("globex.db")),
    )
    .expect("the list");
    for refused in [
        &["forget", "c", "k"][..],
        &["outbox", "wal", "remove"][..],
        &["doctor"][..],
    ] {
        let (code, _, err) = tenants(refused);
        assert_eq!(code, 2, "{refused:?}");
        assert!(
            err.contains("take one --database-url"),
            "{refused:?}: {err}"
        );
    }
    let (code, _, err) = tenants(&["stats", "--json"]);
    assert_eq!(code, 2);
    assert!(err.contains("--json takes one --database-url"), "{err}");
    // A control database's directory table lists them as well.
    let control = path("control.db");
    diesel::SqliteConnection::establish(&control)
        .expect("the control database")
        .batch_execute(&format!(
            "CREATE TABLE inbox_tenants (name TEXT PRIMARY KEY, database_url TEXT NOT NULL);
             INSERT INTO inbox_tenants VALUES ('globex', '{}'), ('acme', '{}');",
            url("globex.db"),
            url("acme.db")
        ))
        .expect("the directory");
    let mut cmd = Command::cargo_bin("diesel-inbox").expect("the diesel-inbox binary");
    cmd.env_remove("DATABASE_URL").env_remove("RUST_LOG").args([
        "--tenants",
        &format!("sqlite://{control}"),
        "outbox",
        "status",
    ]);
    let (code, out, err) = run(&mut cmd);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("tenant acme:\npending 2,") && out.contains("tenant globex:\npending 1,"),
        "{out}"
    );

    // One console over every tenant, served over TCP until SIGTERM.
    #[cfg(feature = "console")]
    {
        use std::io::{BufRead, Read, Write};
        let mut console = std::process::Command::new(env!("CARGO_BIN_EXE_diesel-inbox"))
            .env_remove("DATABASE_URL")
            .env_remove("RUST_LOG")
            .args(["--tenants", &list, "console", "--listen", "127.0.0.1:0"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the console");
        let mut lines = std::io::BufReader::new(console.stderr.take().expect("its stderr")).lines();
        let address = loop {
            let line = lines
                .next()
                .expect("the console says where it listens")
                .expect("a line");
            if let Some(rest) = line.strip_prefix("diesel-inbox console: http://") {
                break rest.trim_end_matches('/').to_owned();
            }
        };
        let get = |path: &str| -> String {
            let mut stream = std::net::TcpStream::connect(&address).expect("the console");
            write!(
                stream,
                "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            )
            .expect("the request");
            let mut answer = String::new();
            stream.read_to_string(&mut answer).expect("the answer");
            answer
        };
        let overview = get("/");
        assert!(overview.starts_with("HTTP/1.1 200"), "{overview}");
        for (tenant, pending) in [("acme", 2), ("globex", 1)] {
            let row = overview
                .split(&format!("<tr data-tenant=\"{tenant}\""))
                .nth(1)
                .unwrap_or_else(|| panic!("a row of {tenant}: {overview}"));
            let row = row.split("</tr>").next().expect("a row");
            assert!(
                row.contains(&format!("<td class=\"n pending\">{pending}</td>")),
                "{tenant}: {row}"
            );
        }
        let own = get("/tenants/globex/overview");
        assert!(own.starts_with("HTTP/1.1 200"), "{own}");
        assert!(own.contains("data-destination=\"orders\""), "{own}");
        assert!(get("/tenants/nobody/").starts_with("HTTP/1.1 404"));
        let _ = std::process::Command::new("kill")
            .arg(console.id().to_string())
            .status();
        let status = console.wait().expect("the console's exit");
        assert!(status.success(), "the console stops on SIGTERM: {status}");
    }

    #[cfg(all(feature = "lapin", feature = "async"))]
    if let Some(amqp) = std::env::var("INBOX_TEST_AMQP_URL")
        .ok()
        .filter(|v| !v.is_empty())
    {
        use diesel::RunQueryDsl;
        let queue = common::unique_identifier("cli_tenants");
        // The messages go to the queue of the default exchange.
        for name in ["acme", "globex"] {
            let mut conn =
                diesel::SqliteConnection::establish(&path(&format!("{name}.db"))).expect("open");
            diesel::sql_query("UPDATE outbox_messages SET destination = ?")
                .bind::<diesel::sql_types::Text, _>(&queue)
                .execute(&mut conn)
                .expect("route");
        }
        let channel = rabbit_queue(&amqp, &queue);
        let (code, out, err) = tenants(&[
            "outbox",
            "relay",
            "--amqp",
            &amqp,
            "--exchange",
            "",
            "--once",
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("published 3, failed 0"), "{out}");
        assert!(err.contains("outbox relay over tenants: started"), "{err}");
        let runtime = common::modes::runtime();
        let mut got = Vec::new();
        runtime.block_on(async {
            while let Some(m) = channel
                .1
                .basic_get(
                    queue.as_str().into(),
                    lapin::options::BasicGetOptions { no_ack: true },
                )
                .await
                .expect("basic.get")
            {
                let tenant = m
                    .delivery
                    .properties
                    .headers()
                    .as_ref()
                    .and_then(|h| h.inner().get("x-tenant").cloned())
                    .map(|v| match v {
                        lapin::types::AMQPValue::LongString(s) => s.to_string(),
                        other => format!("{other:?}"),
                    });
                got.push((
                    tenant,
                    String::from_utf8_lossy(&m.delivery.data).into_owned(),
                ));
            }
            let _ = channel
                .1
                .queue_delete(
                    queue.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await;
        });
        got.sort();
        assert_eq!(
            got,
            vec![
                (Some("acme".into()), "acme-0".into()),
                (Some("acme".into()), "acme-1".into()),
                (Some("globex".into()), "globex-0".into()),
            ]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
