//! The outbox relay with a publisher of the user's own, built with only a
//! backend and the `relay` feature (no broker client): `cargo test
//! --no-default-features --features postgres,relay --test relay_publisher`
//! (CI runs it so, and checks that neither lapin nor async-nats is in that
//! build). The publisher is a webhook-like endpoint in memory: down at
//! first (`Unavailable`: given back, not counted), then up, refusing one
//! message (`Refused`: counted, retried later) and taking the rest.
//! PostgreSQL at `INBOX_TEST_POSTGRES_URL` (set when the tests are built).
#![cfg(all(feature = "postgres", feature = "relay"))]

mod support;
use support::proxy;
use support::relay::{Calls, Database};

use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use diesel_inbox::outbox::{self, OutboxMessage, Outgoing, Publish, PublishError, Relay};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An endpoint of the user's own: while `down`, every message is
/// unavailable; up, it refuses destination `refused` and records the rest.
#[derive(Default)]
struct State {
    down: AtomicBool,
    received: Mutex<Vec<(String, String, Vec<u8>)>>,
}

/// The publisher: a handle on the endpoint (the test keeps another).
#[derive(Clone, Default)]
struct Endpoint(Arc<State>);

impl Publish for Endpoint {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let down = self.0.down.load(Ordering::SeqCst);
        let mut received = self.0.received.lock().expect("not poisoned");
        messages
            .iter()
            .map(|m| match (down, m.destination.as_str()) {
                (true, _) => Err(PublishError::unavailable("endpoint down")),
                (false, "refused") => Err(PublishError::refused("422 from the endpoint")),
                (false, _) => {
                    received.push((m.id.clone(), m.destination.clone(), m.payload.clone()));
                    Ok(())
                }
            })
            .collect()
    }
}

#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_publisher_of_the_users_own_publishes_through_the_relay() {
    {
        let db = Database::create("publisher");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let mut conn = db.migrated().await;
            let ids = conn
                .transaction(
                    async |conn| -> Result<Vec<String>, diesel_inbox::InboxError> {
                        let mut ids = Vec::new();
                        for (destination, payload) in
                            [("orders", "1"), ("refused", "2"), ("orders", "3")]
                        {
                            let message =
                                Outgoing::new(destination, payload).ordering_key(destination);
                            ids.push(outbox::enqueue_async(conn, message).await?);
                        }
                        Ok(ids)
                    },
                )
                .await
                .expect("enqueue");
            let pool: Pool<AsyncPgConnection> =
                Pool::builder(AsyncDieselConnectionManager::new(db.url.clone()))
                    .max_size(2)
                    .build()
                    .expect("a pool");
            let endpoint = Endpoint::default();
            let relay = Relay::new(pool, endpoint.clone()).max_publish_attempts(3);

            // Down: everything given back, nothing counted.
            endpoint.0.down.store(true, Ordering::SeqCst);
            let report = relay.run_once().await.expect("a pass");
            assert_eq!((report.published, report.failed, report.dead), (0, 0, 0));
            assert!(report.released >= 1, "{report:?}");
            assert_eq!(
                outbox::status_async(&mut conn)
                    .await
                    .expect("status")
                    .pending,
                3
            );

            // Up: two taken (the key `orders` in order), one refused.
            endpoint.0.down.store(false, Ordering::SeqCst);
            let mut published = 0;
            for _ in 0..5 {
                let report = relay.run_once().await.expect("a pass");
                published += report.published;
                if published == 2 {
                    break;
                }
            }
            assert_eq!(published, 2);
            let received = endpoint.0.received.lock().expect("lock").clone();
            assert_eq!(
                received,
                vec![
                    (ids[0].clone(), "orders".to_string(), b"1".to_vec()),
                    (ids[2].clone(), "orders".to_string(), b"3".to_vec()),
                ]
            );
            // The refused one stays, counted once, for a later retry.
            let status = outbox::status_async(&mut conn).await.expect("status");
            assert_eq!((status.pending, status.dead), (1, 0));
        });
    }
}

/// One claim takes several messages of a key and publishes them in waves:
/// each key's first message (and those without a key) together, then each
/// key's next once the first was confirmed. A refused message keeps its
/// key's later ones of the batch back (given back, not counted as
/// `released`, which would tell `run` the broker is unavailable), and they
/// follow it, in order, once it is published.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_batch_publishes_a_keys_messages_in_waves_and_a_refusal_holds_back_the_rest() {
    let db = Database::create("waves");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut conn = db.migrated().await;
        conn.transaction(async |conn| -> Result<(), diesel_inbox::InboxError> {
            for (key, payload) in [
                (Some("a"), "a1"),
                (Some("b"), "b1"),
                (Some("a"), "a2"),
                (None, "n1"),
                (Some("a"), "a3"),
                (Some("b"), "b2"),
                (Some("a"), "a4"),
            ] {
                let mut message = Outgoing::new("orders", payload);
                if let Some(key) = key {
                    message = message.ordering_key(key);
                }
                outbox::enqueue_async(conn, message).await?;
            }
            Ok(())
        })
        .await
        .expect("enqueue");
        let pool: Pool<AsyncPgConnection> =
            Pool::builder(AsyncDieselConnectionManager::new(db.url.clone()))
                .max_size(2)
                .build()
                .expect("a pool");
        let publisher = Calls::default();
        *publisher.refuse.lock().expect("lock") = Some("a2".into());
        let relay = Relay::new(pool, publisher.clone());
        let report = relay.run_once().await.expect("a pass");
        assert_eq!(counts(&report), (4, 1, 0, 0), "{report:?}");
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls, vec![vec!["a1", "b1", "n1"], vec!["a2", "b2"]]);
        let status = outbox::status_async(&mut conn).await.expect("status");
        assert_eq!((status.pending, status.dead), (3, 0));

        // The refused one is due again after its backoff (1 s): it and its
        // key's later messages, one wave each.
        *publisher.refuse.lock().expect("lock") = None;
        let began = Instant::now();
        let mut published = 0;
        while published < 3 {
            assert!(began.elapsed() < Duration::from_secs(10), "not retried");
            tokio::time::sleep(Duration::from_millis(200)).await;
            published += relay.run_once().await.expect("a pass").published;
        }
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls, vec![vec!["a2"], vec!["a3"], vec!["a4"]]);
        let status = outbox::status_async(&mut conn).await.expect("status");
        assert_eq!((status.pending, status.dead), (0, 0));
    });
}

/// A refused message keeps its key's next one of the batch back while the
/// broker takes the rest: no sign of an outage. A relay over tenants with
/// turns of one batch of three takes its next turn after it (an outage's
/// release would end the tenant's turns in `run_once`, and back `run` off
/// as if the broker were unavailable): the other key's two messages left
/// are published in the same `run_once`.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_refusal_holding_its_keys_next_message_back_is_no_outage() {
    let db = Database::create("held_back");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut conn = db.migrated().await;
        conn.transaction(async |conn| -> Result<(), diesel_inbox::InboxError> {
            for (key, payload) in [
                ("a", "a1"),
                ("a", "a2"),
                ("b", "b1"),
                ("b", "b2"),
                ("b", "b3"),
            ] {
                let message = Outgoing::new("orders", payload).ordering_key(key);
                outbox::enqueue_async(conn, message).await?;
            }
            Ok(())
        })
        .await
        .expect("enqueue");
        let publisher = Calls::default();
        *publisher.refuse.lock().expect("lock") = Some("a1".into());
        let tenants: diesel_inbox::tenants::Tenants<Pool<AsyncPgConnection>> =
            diesel_inbox::tenants::Tenants::list([("acme", db.url.clone())]);
        // The first batch: a1 and b1, then a2 (held back behind a1).
        let relay = Relay::tenants(tenants, publisher.clone())
            .batch_size(3)
            .turn(1);
        let report = relay.run_once().await.expect("a pass");
        assert_eq!(counts(&report), (3, 1, 0, 0), "{report:?}");
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls, vec![vec!["a1", "b1"], vec!["b2"], vec!["b3"]]);
        let status = outbox::status_async(&mut conn).await.expect("status");
        assert_eq!((status.pending, status.dead), (2, 0));
    });
}

/// A pass's (published, failed, dead, released).
fn counts(report: &outbox::RelayReport) -> (u64, u64, u64, u64) {
    (
        report.published,
        report.failed,
        report.dead,
        report.released,
    )
}

/// Shutdown while the database stalls: the relay reaches PostgreSQL
/// through a TCP proxy that, after the first message is published,
/// accepts and forwards nothing. The relay's next pass waits on the
/// database; shutdown then ends `run` within its shutdown grace, 10 s (plus 2 s of
/// slack). Nothing is lost: what was not settled stays in the outbox.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn the_relay_stops_within_its_grace_while_the_database_stalls() {
    if support::skip_slow() {
        return;
    }
    let db = Database::create("stall");
    let proxy =
        proxy::Proxy::start("127.0.0.1:5432".parse().expect("an address")).expect("a proxy");
    let proxied = proxy.route(&db.url).expect("a local server");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut conn = db.migrated().await;
        let enqueue = async |conn: &mut AsyncPgConnection, payload: &str| {
            conn.transaction(async |conn| {
                outbox::enqueue_async(conn, Outgoing::new("orders", payload)).await
            })
            .await
            .expect("enqueue")
        };
        enqueue(&mut conn, "1").await;
        let pool: Pool<AsyncPgConnection> =
            Pool::builder(AsyncDieselConnectionManager::new(proxied))
                .max_size(2)
                .build()
                .expect("a pool");
        let endpoint = Endpoint::default();
        let relay = Relay::new(pool, endpoint.clone()).poll_interval(Duration::from_millis(200));
        let (stop, running) = support::relay::spawn(relay);
        let began = Instant::now();
        while endpoint.0.received.lock().expect("lock").is_empty() {
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "nothing published"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        proxy.set(proxy::Mode::Blackhole);
        enqueue(&mut conn, "2").await;
        // The relay's next passes now wait on a database that answers
        // nothing.
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.send(true).expect("stop");
        let stopping = Instant::now();
        // The relay's shutdown grace is 10 s (`Relay::run`'s docs).
        let bound = Duration::from_secs(10 + 2);
        let report = tokio::time::timeout(bound + Duration::from_secs(30), running)
            .await
            .expect("the relay did not stop within 30 s of its bound")
            .expect("the relay task")
            .expect("the relay");
        let took = stopping.elapsed();
        assert!(
            took <= bound,
            "stopped {took:?} after shutdown (bound {bound:?})"
        );
        // The first message reached the endpoint; its settlement (the
        // delete) may have been the pass that stalled: then its row is
        // published again after its lease (at least once). The second
        // was never published.
        let received = endpoint.0.received.lock().expect("lock").clone();
        assert_eq!(received.len(), 1, "{received:?}");
        assert_eq!(received[0].2, b"1".to_vec());
        assert!(report.published <= 1, "{report:?}");
        proxy.set(proxy::Mode::Forward);
        let pending = outbox::status_async(&mut conn)
            .await
            .expect("status")
            .pending;
        // The second is pending. The first is gone if the relay counted it
        // published; if not, either pending or gone: its delete may have
        // committed on the server while the answer was blackholed.
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Binary)]
            payload: Vec<u8>,
        }
        let rows: Vec<Row> = diesel_async::RunQueryDsl::load(
            diesel::sql_query("SELECT payload FROM outbox_messages ORDER BY seq"),
            &mut conn,
        )
        .await
        .expect("the outbox's rows");
        let left: Vec<Vec<u8>> = rows.into_iter().map(|row| row.payload).collect();
        assert_eq!(left.len() as u64, pending, "{left:?}");
        match (report.published, left.len()) {
            (0 | 1, 1) => assert_eq!(left, [b"2".to_vec()], "{report:?}"),
            (0, 2) => assert_eq!(left, [b"1".to_vec(), b"2".to_vec()], "{report:?}"),
            _ => panic!("{left:?} left in the outbox: {report:?}"),
        }
    });
}

/// Enqueues `payloads` in one committed transaction, each under `key`.
async fn enqueue_all(conn: &mut AsyncPgConnection, key: Option<&str>, payloads: &[String]) {
    conn.transaction(async |conn| -> Result<(), diesel_inbox::InboxError> {
        for payload in payloads {
            let mut message = Outgoing::new("orders", payload.as_str());
            if let Some(key) = key {
                message = message.ordering_key(key);
            }
            outbox::enqueue_async(conn, message).await?;
        }
        Ok(())
    })
    .await
    .expect("enqueue");
}

/// A relay on PostgreSQL looks from a floor its last claim left (the rows
/// it saw below it, the rows past it, and the rows of transactions its
/// snapshot did not see). A message whose transaction was open through
/// the relay's claims, with a `seq` below everything they published,
/// commits: it is published, and before the message of its key enqueued
/// after it.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_message_committed_late_below_the_floor_is_published_in_its_keys_order() {
    let db = Database::create("late");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut conn = db.migrated().await;
        // The late transaction takes the lowest `seq` and stays open.
        let (enqueued, is_enqueued) = tokio::sync::oneshot::channel();
        let (commit, to_commit) = tokio::sync::oneshot::channel::<()>();
        let url = db.url.clone();
        let late = tokio::spawn(async move {
            let mut late = AsyncPgConnection::establish(&url).await.expect("connect");
            late.transaction(async |conn| -> Result<(), diesel_inbox::InboxError> {
                let message = Outgoing::new("orders", "k1").ordering_key("k");
                outbox::enqueue_async(conn, message).await?;
                enqueued.send(()).expect("the test waits");
                to_commit.await.expect("the test says when");
                Ok(())
            })
            .await
            .expect("the late transaction");
        });
        is_enqueued.await.expect("k1 enqueued");
        // 300 messages after it: the relay's claims (10 each) leave floors
        // with pinned rows and a `seq` to start from.
        let others: Vec<String> = (0..300).map(|i| format!("n{i}")).collect();
        enqueue_all(&mut conn, None, &others).await;
        let pool: Pool<AsyncPgConnection> =
            Pool::builder(AsyncDieselConnectionManager::new(db.url.clone()))
                .max_size(2)
                .build()
                .expect("a pool");
        let publisher = Calls::default();
        let relay = Relay::new(pool, publisher.clone()).batch_size(10);
        let report = relay.run_once().await.expect("a pass");
        assert_eq!(report.published, 300, "{report:?}");
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls.concat(), others);

        commit.send(()).expect("the late transaction waits");
        late.await.expect("the late transaction committed");
        enqueue_all(&mut conn, Some("k"), &["k2".to_owned()]).await;
        let report = relay.run_once().await.expect("a pass");
        assert_eq!(report.published, 2, "{report:?}");
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls, vec![vec!["k1"], vec!["k2"]]);
        let status = outbox::status_async(&mut conn).await.expect("status");
        assert_eq!((status.pending, status.dead), (0, 0));
    });
}

/// A dead message made live again (`outbox::retry`) keeps its old `seq`,
/// below the relay's floor: the retry marks it with its transaction, and
/// the relay's next look finds it.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_dead_message_retried_below_the_floor_is_published() {
    let db = Database::create("retried");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut conn = db.migrated().await;
        enqueue_all(&mut conn, None, &["dead".to_owned()]).await;
        let others: Vec<String> = (0..300).map(|i| format!("n{i}")).collect();
        enqueue_all(&mut conn, None, &others).await;
        let pool: Pool<AsyncPgConnection> =
            Pool::builder(AsyncDieselConnectionManager::new(db.url.clone()))
                .max_size(2)
                .build()
                .expect("a pool");
        let publisher = Calls::default();
        *publisher.refuse.lock().expect("lock") = Some("dead".into());
        let relay = Relay::new(pool, publisher.clone())
            .batch_size(10)
            .max_publish_attempts(1);
        let report = relay.run_once().await.expect("a pass");
        assert_eq!((report.published, report.dead), (300, 1), "{report:?}");
        // The floor now stands past the dead row.
        let report = relay.run_once().await.expect("a pass");
        assert_eq!(report.published, 0, "{report:?}");
        publisher.calls.lock().expect("lock").clear();

        *publisher.refuse.lock().expect("lock") = None;
        let retried = outbox::retry_async(&mut conn, outbox::AllDead)
            .await
            .expect("retry");
        assert_eq!(retried, 1);
        let report = relay.run_once().await.expect("a pass");
        assert_eq!((report.published, report.dead), (1, 0), "{report:?}");
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls, vec![vec!["dead"]]);
    });
}

/// A delayed message at the bottom of the outbox, its key's later message
/// behind it, and 300 due ones: the relay's floor pins the two and
/// starts past them. Once due, the delayed message is published, then its
/// key's next, by the same relay.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_delayed_message_below_the_floor_is_published_when_due() {
    let db = Database::create("pinned");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut conn = db.migrated().await;
        // Its delay counts from its transaction, not from the first pass
        // (which may take a while on a loaded machine: CI saw the first
        // pass outlast a delay of 2 s and publish it too).
        let enqueued = Instant::now();
        conn.transaction(async |conn| -> Result<(), diesel_inbox::InboxError> {
            let later = Outgoing::new("orders", "d1")
                .ordering_key("d")
                .deliver_after(Duration::from_secs(8));
            outbox::enqueue_async(conn, later).await?;
            outbox::enqueue_async(conn, Outgoing::new("orders", "d2").ordering_key("d")).await?;
            Ok(())
        })
        .await
        .expect("enqueue");
        let others: Vec<String> = (0..300).map(|i| format!("n{i}")).collect();
        enqueue_all(&mut conn, None, &others).await;
        let pool: Pool<AsyncPgConnection> =
            Pool::builder(AsyncDieselConnectionManager::new(db.url.clone()))
                .max_size(2)
                .build()
                .expect("a pool");
        let publisher = Calls::default();
        let relay = Relay::new(pool, publisher.clone()).batch_size(10);
        let report = relay.run_once().await.expect("a pass");
        assert_eq!(report.published, 300, "{report:?}");
        publisher.calls.lock().expect("lock").clear();

        let mut published = 0;
        while published < 2 {
            assert!(
                enqueued.elapsed() < Duration::from_secs(20),
                "d1 not published"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            published += relay.run_once().await.expect("a pass").published;
        }
        assert!(
            enqueued.elapsed() >= Duration::from_millis(7500),
            "published {:?} after its enqueue, delayed by 8 s",
            enqueued.elapsed()
        );
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls, vec![vec!["d1"], vec!["d2"]]);
    });
}

/// A relay of this release on an outbox not yet migrated to schema 5 (no
/// `txid`): its reads start at the lowest `seq`, as before, and it
/// publishes everything.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_relay_on_an_outbox_of_schema_4_publishes_without_a_floor() {
    let db = Database::create("schema4");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut conn = db.migrated().await;
        diesel_async::SimpleAsyncConnection::batch_execute(
            &mut conn,
            "ALTER TABLE outbox_messages DROP COLUMN txid; \
             COMMENT ON TABLE inbox_messages IS 'diesel-inbox schema 4'",
        )
        .await
        .expect("back to schema 4");
        let first: Vec<String> = (0..150).map(|i| format!("a{i}")).collect();
        enqueue_all(&mut conn, None, &first).await;
        let pool: Pool<AsyncPgConnection> =
            Pool::builder(AsyncDieselConnectionManager::new(db.url.clone()))
                .max_size(2)
                .build()
                .expect("a pool");
        let publisher = Calls::default();
        let relay = Relay::new(pool, publisher.clone()).batch_size(10);
        let report = relay.run_once().await.expect("a pass");
        assert_eq!((report.published, report.errors), (150, 0), "{report:?}");
        let second: Vec<String> = (0..150).map(|i| format!("b{i}")).collect();
        enqueue_all(&mut conn, None, &second).await;
        let report = relay.run_once().await.expect("a pass");
        assert_eq!((report.published, report.errors), (150, 0), "{report:?}");
        let calls = std::mem::take(&mut *publisher.calls.lock().expect("lock"));
        assert_eq!(calls.concat(), [first, second].concat());
    });
}
