//! The WAL outbox (PostgreSQL with `wal_level = logical`, at
//! `INBOX_TEST_POSTGRES_URL`; `.ci/run` sets it): enqueues write to the
//! WAL (`outbox::set_wal`, on for this whole binary), a relay built with
//! `Relay::wal` reads them from the slot and publishes them through a
//! publisher of the test's own that records each call.
#![cfg(all(feature = "postgres", feature = "relay"))]

mod support;
use support::relay::{Calls, Database};

use diesel::{Connection, PgConnection};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use diesel_inbox::outbox::{self, OutboxMessage, Outgoing, Publish, PublishError, Relay};
use diesel_inbox::InboxError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A database with the inbox's tables and (with `slot`) the WAL outbox's
/// slot; enqueues of this process write to the WAL.
async fn prepared(test: &str, slot: bool) -> (Database, AsyncPgConnection) {
    outbox::set_wal(true);
    let db = Database::create(&format!("wal_{test}"));
    let conn = db.migrated().await;
    if slot {
        let mut sync = PgConnection::establish(&db.url).expect("connect");
        outbox::wal::create(&mut sync).expect("the WAL outbox's slot");
    }
    (db, conn)
}

fn pool(db: &Database) -> Pool<AsyncPgConnection> {
    Pool::builder(AsyncDieselConnectionManager::new(db.url.clone()))
        .max_size(3)
        .build()
        .expect("a pool")
}

/// Enqueues `(key, payload)`s in one transaction, committed or rolled
/// back.
async fn enqueue(
    conn: &mut AsyncPgConnection,
    messages: &[(Option<&str>, &str)],
    commit: bool,
) -> Result<(), InboxError> {
    let messages: Vec<(Option<String>, String)> = messages
        .iter()
        .map(|(k, p)| (k.map(str::to_owned), (*p).to_owned()))
        .collect();
    let done = conn
        .transaction(async |conn| -> Result<(), InboxError> {
            for (key, payload) in messages {
                let mut message = Outgoing::new("orders", payload);
                if let Some(key) = key {
                    message = message.ordering_key(&key);
                }
                outbox::enqueue_async(conn, message).await?;
            }
            if commit {
                Ok(())
            } else {
                Err(InboxError::InvalidArgument("rolled back on purpose"))
            }
        })
        .await;
    match done {
        Err(InboxError::InvalidArgument("rolled back on purpose")) => Ok(()),
        other => other,
    }
}

/// Rows in the outbox table.
async fn table_rows(conn: &mut AsyncPgConnection) -> Vec<(String, i32, bool)> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Binary)]
        payload: Vec<u8>,
        #[diesel(sql_type = diesel::sql_types::Integer)]
        attempts: i32,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        dead: bool,
    }
    let query = diesel::sql_query(
        "SELECT payload, attempts, dead_at IS NOT NULL AS dead FROM outbox_messages ORDER BY seq",
    );
    let rows: Vec<Row> = diesel_async::RunQueryDsl::load(query, conn)
        .await
        .expect("the outbox table");
    rows.into_iter()
        .map(|r| {
            (
                String::from_utf8(r.payload).expect("utf-8"),
                r.attempts,
                r.dead,
            )
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Committed messages are published from the WAL in commit order, in
/// waves (a key's messages in order); a rolled-back transaction's are
/// not; the outbox table is never written; the slot moves past what was
/// published, so the next pass publishes nothing again.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn committed_messages_are_published_from_the_wal_in_order_and_a_rollback_publishes_nothing() {
    runtime().block_on(async {
        let (db, mut conn) = prepared("order", true).await;
        enqueue(&mut conn, &[(Some("a"), "a1"), (None, "n1")], true)
            .await
            .expect("enqueue");
        enqueue(&mut conn, &[(Some("a"), "x1"), (None, "x2")], false)
            .await
            .expect("a rollback");
        enqueue(
            &mut conn,
            &[(Some("a"), "a2"), (Some("b"), "b1"), (Some("a"), "a3")],
            true,
        )
        .await
        .expect("enqueue");
        let publisher = Calls::default();
        let relay = Relay::new(pool(&db), publisher.clone()).wal(db.url.clone());
        let report = relay.run_once().await.expect("a pass");
        assert_eq!(
            (report.published, report.failed, report.released),
            (5, 0, 0),
            "{report:?}"
        );
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls, vec![vec!["a1", "n1", "b1"], vec!["a2"], vec!["a3"]]);
        assert!(table_rows(&mut conn).await.is_empty());

        let report = relay.run_once().await.expect("a pass");
        assert_eq!(report.published, 0, "published again: {report:?}");
        assert!(publisher.calls.lock().expect("lock").is_empty());
    });
}

/// The slot's confirmed position, as bytes of WAL.
async fn confirmed(conn: &mut AsyncPgConnection) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        at: i64,
    }
    let query = diesel::sql_query(
        "SELECT (confirmed_flush_lsn - '0/0')::bigint AS at FROM pg_replication_slots \
         WHERE database = current_database()",
    );
    let row: Row = diesel_async::RunQueryDsl::get_result(query, conn)
        .await
        .expect("the slot");
    row.at
}

/// The business's own writes (no message of ours) do not pin the WAL:
/// a relay's pass confirms the slot past them. A URL the replication
/// connection cannot use is the pass's error, naming it.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn a_pass_moves_the_slot_past_writes_without_messages_and_a_bad_url_is_an_error() {
    runtime().block_on(async {
        let (db, mut conn) = prepared("idle", true).await;
        diesel_async::SimpleAsyncConnection::batch_execute(
            &mut conn,
            "CREATE TABLE business (n int); INSERT INTO business SELECT generate_series(1, 1000)",
        )
        .await
        .expect("business writes");
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            at: i64,
        }
        let flushed: Row = diesel_async::RunQueryDsl::get_result(
            diesel::sql_query("SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint AS at"),
            &mut conn,
        )
        .await
        .expect("the WAL's end");
        assert!(confirmed(&mut conn).await < flushed.at);
        // `outbox::status` shows the slot, behind by the business's writes.
        let wal = outbox::status_async(&mut conn)
            .await
            .expect("status")
            .wal
            .expect("the slot in the status");
        assert!(wal.slot.starts_with("diesel_inbox_outbox_"), "{wal:?}");
        assert!(!wal.active && !wal.lost, "{wal:?}");
        assert!(wal.unconfirmed_bytes > 0 && wal.retained_bytes >= wal.unconfirmed_bytes, "{wal:?}");

        let publisher = Calls::default();
        let relay = Relay::new(pool(&db), publisher.clone()).wal(db.url.clone());
        assert_eq!(relay.run_once().await.expect("a pass").published, 0);
        let streamed = outbox::status_async(&mut conn).await.expect("status").wal;
        assert!(streamed.as_ref().is_some_and(|w| w.active), "{streamed:?}");
        // The server takes the confirmation as it reads it.
        let began = Instant::now();
        while confirmed(&mut conn).await < flushed.at {
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "the slot stayed before the business's writes"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(publisher.calls.lock().expect("lock").is_empty());

        // (The first relay's session lock goes with its connection.)
        drop(relay);
        let bad = Relay::new(pool(&db), publisher.clone()).wal("mysql://nowhere/x");
        let began = Instant::now();
        let failed = loop {
            let failed = bad.run_once().await;
            if failed.is_err() || began.elapsed() > Duration::from_secs(10) {
                break failed;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            matches!(&failed, Err(outbox::RelayError::Replication(e)) if e.to_string().contains("not a postgres:// URL")),
            "{failed:?}"
        );
    });
}

/// The relay's replication connection logs in as a role that must give
/// its password, exchanged as SCRAM-SHA-256 and as MD5 (`.ci/run` has the
/// server ask these two roles for a password over TCP: its `pg_hba.conf`
/// lines for `diesel_inbox_scram` and `diesel_inbox_md5`), with only the
/// `REPLICATION` attribute; a wrong password is the pass's error, in the
/// server's words.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn the_replication_connection_logs_in_with_scram_and_md5() {
    runtime().block_on(async {
        let (db, mut conn) = prepared("auth", true).await;
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            method: String,
        }
        let (base, _) = db.url.split_once('@').expect("a URL with a user");
        let (scheme, _) = base.split_once("://").expect("a URL");
        let at = db.url.split_once('@').expect("a URL with a user").1;
        for (role, method) in [
            ("diesel_inbox_scram", "scram-sha-256"),
            ("diesel_inbox_md5", "md5"),
        ] {
            // The server's rule for this role over TCP.
            let rules: Vec<Row> = diesel_async::RunQueryDsl::load(
                diesel::sql_query(format!(
                    "SELECT auth_method AS method FROM pg_hba_file_rules \
                     WHERE '{role}' = ANY(user_name) AND type = 'host' ORDER BY line_number"
                )),
                &mut conn,
            )
            .await
            .expect("pg_hba_file_rules");
            assert_eq!(
                rules.first().map(|r| r.method.as_str()),
                Some(method),
                "the server does not ask {role} for a password ({method}): .ci/run adds that line \
                 to pg_hba.conf"
            );
            diesel_async::SimpleAsyncConnection::batch_execute(
                &mut conn,
                &format!(
                    "SET password_encryption = '{method}'; DROP ROLE IF EXISTS {role}; \
                     CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'pass word%1'"
                ),
            )
            .await
            .expect("the role");
            enqueue(&mut conn, &[(None, role)], true)
                .await
                .expect("enqueue");
            let url = format!("{scheme}://{role}:pass%20word%251@{at}");
            let publisher = Calls::default();
            let relay = Relay::new(pool(&db), publisher.clone()).wal(url);
            // The last role's relay, just dropped, holds the slot's lock
            // until the server has ended its session: a pass meanwhile
            // leaves the slot to it and reads nothing.
            let began = Instant::now();
            let report = loop {
                let report = relay.run_once().await.expect("a pass");
                if report.published > 0 || began.elapsed() > Duration::from_secs(10) {
                    break report;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert_eq!(report.published, 1, "{role}: {report:?}");
            assert_eq!(
                *publisher.calls.lock().expect("lock"),
                vec![vec![role.to_owned()]]
            );
            drop(relay);

            let wrong = format!("{scheme}://{role}:wrong@{at}");
            let relay = Relay::new(pool(&db), publisher.clone()).wal(wrong);
            let began = Instant::now();
            let failed = loop {
                // (The last relay's session lock goes with its connection.)
                let failed = relay.run_once().await;
                if failed.is_err() || began.elapsed() > Duration::from_secs(10) {
                    break failed;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert!(
                matches!(&failed, Err(outbox::RelayError::Replication(e)) if e.to_string().contains("password authentication failed")),
                "{role}: {failed:?}"
            );
        }
    });
}

/// The replication connection through the server's Unix socket (its
/// directory as the URL's host, `%`-escaped): a relay on it publishes.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn the_replication_connection_goes_through_a_unix_socket() {
    runtime().block_on(async {
        let (db, mut conn) = prepared("socket", true).await;
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            dirs: String,
        }
        let row: Row = diesel_async::RunQueryDsl::get_result(
            diesel::sql_query("SELECT current_setting('unix_socket_directories') AS dirs"),
            &mut conn,
        )
        .await
        .expect("the socket's directories");
        let Some(dir) = row
            .dirs
            .split(',')
            .map(str::trim)
            .find(|d| d.starts_with('/'))
        else {
            println!("SKIPPED: the server listens on no Unix socket");
            return;
        };
        enqueue(&mut conn, &[(None, "by the socket")], true)
            .await
            .expect("enqueue");
        // The URL's user and password, the socket's directory as its host.
        let (base, _) = db.url.split_once('@').expect("a URL with a user");
        let url = format!("{base}@{}/{}", dir.replace('/', "%2F"), db.name);
        let publisher = Calls::default();
        let relay = Relay::new(pool(&db), publisher.clone()).wal(url.clone());
        let report = relay.run_once().await.expect("a pass");
        assert_eq!(report.published, 1, "{url}: {report:?}");
        assert_eq!(
            *publisher.calls.lock().expect("lock"),
            vec![vec!["by the socket".to_owned()]]
        );
    });
}

/// Without a slot, an enqueue to the WAL is refused (nothing would read
/// it) and the caller's transaction rolls back; a delayed message is
/// refused too (the WAL has no delays).
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn an_enqueue_without_a_slot_or_with_a_delay_is_refused() {
    runtime().block_on(async {
        let (db, mut conn) = prepared("noslot", false).await;
        let status = outbox::status_async(&mut conn).await.expect("status");
        assert_eq!(status.wal, None);
        let refused = enqueue(&mut conn, &[(None, "lost?")], true).await;
        assert!(
            matches!(&refused, Err(InboxError::NoWalOutbox(why)) if why.contains("wal::create")),
            "{refused:?}"
        );
        let mut sync = PgConnection::establish(&db.url).expect("connect");
        outbox::wal::create(&mut sync).expect("the slot");
        let delayed = conn
            .transaction(async |conn| {
                outbox::enqueue_async(
                    conn,
                    Outgoing::new("orders", "later").deliver_after(Duration::from_secs(1)),
                )
                .await
            })
            .await;
        assert!(
            matches!(&delayed, Err(InboxError::InvalidOutgoing(_))),
            "{delayed:?}"
        );
        // Nothing of either reached the WAL or the table.
        let publisher = Calls::default();
        let relay = Relay::new(pool(&db), publisher.clone()).wal(db.url.clone());
        assert_eq!(relay.run_once().await.expect("a pass").published, 0);
        assert!(table_rows(&mut conn).await.is_empty());
    });
}

/// A message the broker refuses is kept aside in the outbox table
/// (counted), with its key's later messages of the read behind it; a
/// message of that key enqueued later goes there too, behind them, while
/// the table holds the key; once the broker takes the refused one, the
/// three are published in their order, and the table is empty.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn a_refused_message_is_kept_aside_and_its_key_keeps_its_order() {
    runtime().block_on(async {
        let (db, mut conn) = prepared("aside", true).await;
        enqueue(
            &mut conn,
            &[
                (Some("a"), "a1"),
                (Some("a"), "a2"),
                (Some("a"), "a3"),
                (Some("b"), "b1"),
            ],
            true,
        )
        .await
        .expect("enqueue");
        let publisher = Calls::default();
        *publisher.refuse.lock().expect("lock") = Some("a2".into());
        let relay = Relay::new(pool(&db), publisher.clone()).wal(db.url.clone());
        let report = relay.run_once().await.expect("a pass");
        assert_eq!((report.published, report.failed), (2, 1), "{report:?}");
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls, vec![vec!["a1", "b1"], vec!["a2"]]);
        assert_eq!(
            table_rows(&mut conn).await,
            vec![("a2".to_owned(), 1, false), ("a3".to_owned(), 0, false)]
        );

        enqueue(&mut conn, &[(Some("a"), "a4"), (Some("c"), "c1")], true)
            .await
            .expect("enqueue");
        let report = relay.run_once().await.expect("a pass");
        assert_eq!(report.published, 1, "{report:?}");
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls, vec![vec!["c1"]]);
        assert_eq!(table_rows(&mut conn).await.len(), 3);

        // Due again after its backoff (1 s).
        *publisher.refuse.lock().expect("lock") = None;
        let began = Instant::now();
        let mut published = 0;
        while published < 3 {
            assert!(began.elapsed() < Duration::from_secs(10), "not retried");
            tokio::time::sleep(Duration::from_millis(200)).await;
            published += relay.run_once().await.expect("a pass").published;
        }
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls.concat(), vec!["a2", "a3", "a4"]);
        assert!(table_rows(&mut conn).await.is_empty());
    });
}

/// The relay reads the next batch from the stream while the broker
/// confirms the current one: a key whose message the broker refused in
/// one batch keeps its order in the next, which was read (and the table
/// asked for its live keys) before the refusal was kept aside.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn a_refusal_holds_its_key_back_in_the_batch_read_meanwhile() {
    runtime().block_on(async {
        let (db, mut conn) = prepared("pipelined", true).await;
        enqueue(&mut conn, &[(Some("a"), "a1"), (Some("a"), "a2")], true)
            .await
            .expect("enqueue");
        enqueue(&mut conn, &[(Some("a"), "a3"), (Some("b"), "b1")], true)
            .await
            .expect("enqueue");
        let publisher = Calls::default();
        *publisher.refuse.lock().expect("lock") = Some("a2".into());
        let relay = Relay::new(pool(&db), publisher.clone())
            .wal(db.url.clone())
            .batch_size(2);
        let report = relay.run_once().await.expect("a pass");
        assert_eq!((report.published, report.failed), (2, 1), "{report:?}");
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls, vec![vec!["a1"], vec!["a2"], vec!["b1"]]);
        assert_eq!(
            table_rows(&mut conn).await,
            vec![("a2".to_owned(), 1, false), ("a3".to_owned(), 0, false)]
        );
    });
}

/// The sync enqueue (`outbox::enqueue` on a `PgConnection`) writes to the
/// WAL too; the relay publishes it, and a message enqueued in a
/// transaction that rolled back is not published.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn a_sync_enqueue_writes_to_the_wal() {
    runtime().block_on(async {
        let (db, mut conn) = prepared("sync", true).await;
        let mut sync = PgConnection::establish(&db.url).expect("connect");
        sync.transaction(|conn| outbox::enqueue(conn, Outgoing::new("orders", "s1")))
            .expect("enqueue");
        let rolled_back: Result<String, InboxError> = sync.transaction(|conn| {
            outbox::enqueue(conn, Outgoing::new("orders", "s2"))?;
            Err(InboxError::InvalidArgument("rolled back on purpose"))
        });
        assert!(rolled_back.is_err());
        let publisher = Calls::default();
        let relay = Relay::new(pool(&db), publisher.clone()).wal(db.url.clone());
        assert_eq!(relay.run_once().await.expect("a pass").published, 1);
        assert_eq!(
            std::mem::take(&mut *publisher.calls.lock().expect("lock")),
            vec![vec!["s1"]]
        );
        assert!(table_rows(&mut conn).await.is_empty());
    });
}

/// A publisher that takes every message and, once `hang` is set, never
/// answers (a relay that dies between the broker's confirm and its
/// settlement).
#[derive(Clone, Default)]
struct Hangs {
    hang: Arc<AtomicBool>,
    ids: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Publish for Hangs {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        self.ids
            .lock()
            .expect("lock")
            .extend(messages.iter().map(|m| m.id.clone()));
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        messages.iter().map(|_| Ok(())).collect()
    }
}

/// A relay stopped after the broker took a read and before it moved the
/// slot: the next relay publishes the same messages again, with the same
/// ids (at least once), and then the slot is past them. Another relay
/// waits for the first's lock meanwhile, publishing nothing twice at once.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn a_relay_stopped_before_it_moved_the_slot_is_followed_by_one_that_publishes_again() {
    runtime().block_on(async {
        let (db, mut conn) = prepared("again", true).await;
        enqueue(&mut conn, &[(Some("a"), "a1"), (None, "n1")], true)
            .await
            .expect("enqueue");
        let first = Hangs::default();
        first.hang.store(true, Ordering::SeqCst);
        let relay = Relay::new(pool(&db), first.clone()).wal(db.url.clone());
        let stopped = tokio::time::timeout(Duration::from_secs(2), relay.run_once()).await;
        assert!(stopped.is_err(), "the first relay's publish hangs");
        let taken = first.ids.lock().expect("lock").clone();
        assert_eq!(taken.len(), 2);

        // The first relay still holds the slot's lock: a second one leaves
        // the WAL to it.
        let second = Hangs::default();
        let other = Relay::new(pool(&db), second.clone()).wal(db.url.clone());
        assert_eq!(other.run_once().await.expect("a pass").published, 0);
        assert!(second.ids.lock().expect("lock").is_empty());

        drop(relay);
        let began = Instant::now();
        let mut published = 0;
        while published < 2 {
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "never published again"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            let third = Relay::new(pool(&db), second.clone()).wal(db.url.clone());
            published += third.run_once().await.expect("a pass").published;
        }
        let mut again = second.ids.lock().expect("lock").clone();
        let mut taken = taken;
        again.sort();
        taken.sort();
        assert_eq!(again, taken, "the same messages, with the same ids");
        let last = Relay::new(pool(&db), second.clone()).wal(db.url.clone());
        assert_eq!(last.run_once().await.expect("a pass").published, 0);
    });
}

/// The CLI, as an operator runs it: `outbox wal create` makes the slot,
/// `outbox relay --wal --once` publishes what was enqueued to the WAL to
/// RabbitMQ, `outbox wal remove` drops the slot, after which an enqueue to
/// the WAL is refused.
#[cfg(all(feature = "cli", feature = "lapin"))]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn the_cli_creates_the_slot_and_its_relay_publishes_the_wal() {
    let Some(amqp) = support::server_var("INBOX_TEST_AMQP_URL") else {
        return;
    };
    let cli = |db: &Database, args: &[&str]| support::run_cli(support::cli(&db.url).args(args));
    runtime().block_on(async {
        let (db, mut conn) = prepared("cli", false).await;
        let (code, out, err) = cli(&db, &["outbox", "wal", "create"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("slot is ready"), "{out}");
        let queue = format!("wal_cli_{}", std::process::id());
        let (_connection, channel) = support::rabbit_queue(&amqp, &queue).await;
        conn.transaction(async |conn| {
            outbox::enqueue_async(conn, Outgoing::new(queue.as_str(), "from the WAL")).await
        })
        .await
        .expect("enqueue to the WAL");
        let (code, out, err) = cli(
            &db,
            &[
                "outbox",
                "relay",
                "--amqp",
                &amqp,
                "--exchange",
                "",
                "--wal",
                "--once",
            ],
        );
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("published 1, failed 0, dead 0"), "{out}");
        let got = channel
            .basic_get(
                queue.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .expect("basic.get")
            .expect("the message is in the queue");
        assert_eq!(got.delivery.data, b"from the WAL");
        let _ = channel
            .queue_delete(queue.as_str().into(), Default::default())
            .await;

        // The operator's view of the slot: no relay streams it now (the
        // server lets it go a moment after the relay's exit).
        let began = Instant::now();
        loop {
            let (code, out, err) = cli(&db, &["outbox", "status"]);
            assert_eq!(code, 0, "{err}");
            assert!(
                out.contains("WAL outbox slot diesel_inbox_outbox_"),
                "{out}"
            );
            if out.contains("no relay streams it") {
                break;
            }
            assert!(began.elapsed() < Duration::from_secs(10), "{out}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (code, out, err) = cli(&db, &["outbox", "status", "--json"]);
        assert_eq!(code, 0, "{err}");
        let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(json["wal"]["active"], false, "{out}");
        assert_eq!(json["wal"]["lost"], false, "{out}");

        let (code, _, err) = cli(&db, &["outbox", "wal", "remove"]);
        assert_eq!(code, 0, "{err}");
        let (_, out, _) = cli(&db, &["outbox", "status", "--json"]);
        let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert!(json["wal"].is_null(), "{out}");
        let refused = enqueue(&mut conn, &[(None, "after")], true).await;
        assert!(
            matches!(refused, Err(InboxError::NoWalOutbox(_))),
            "{refused:?}"
        );
    });
}
