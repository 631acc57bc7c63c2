//! The transactional outbox on every backend (SQLite always; PostgreSQL
//! and MySQL/MariaDB when their URLs are set) with the real brokers
//! (`INBOX_TEST_AMQP_URL`, `INBOX_TEST_NATS_URL`; a test without its broker
//! says so and returns): enqueue in the handler's transaction, the relay's
//! publishes with confirms and ids, order per key, dead messages and their
//! replay, several relays on one database, the in-process wake-up.
#![cfg(all(feature = "sqlite", feature = "lapin", feature = "nats"))]
#![deny(warnings, clippy::all)]

mod common;
mod support;

use common::backend::TestBackend;
use diesel::connection::{AnsiTransactionManager, LoadConnection};
use diesel::prelude::*;
use diesel_async::pooled_connection::PoolableConnection;
use diesel_inbox::outbox::{self, AllDead, Outgoing, Relay, RelayPool};
use diesel_inbox::{AsyncInboxConnection, Inbox, InboxBackend, InboxError, Processed};
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn runtime() -> &'static tokio::runtime::Runtime {
    common::modes::runtime()
}

fn env(var: &str) -> Option<String> {
    common::server_var(var)
}

/// A message as a consumer received it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Received {
    id: String,
    body: Vec<u8>,
    headers: Vec<(String, String)>,
}

struct Rabbit {
    url: String,
    channel: lapin::Channel,
    _connection: lapin::Connection,
}

impl Rabbit {
    async fn connect() -> Option<Rabbit> {
        let url = env("INBOX_TEST_AMQP_URL")?;
        let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
        let channel = connection.create_channel().await.expect("a channel");
        Some(Rabbit {
            url,
            channel,
            _connection: connection,
        })
    }

    /// A connection and a queue of the test's own, declared (the routing
    /// key on the default exchange is its name); `None` when RabbitMQ is
    /// not configured.
    async fn with_queue(test: &str) -> Option<(Rabbit, String)> {
        let rabbit = Rabbit::connect().await?;
        let queue = common::unique_identifier(test);
        rabbit.queue(&queue).await;
        Some((rabbit, queue))
    }

    /// A queue of this test, on the default exchange (the routing key is
    /// its name).
    async fn queue(&self, name: &str) {
        self.channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare queue");
    }

    async fn delete(&self, name: &str) {
        let _ = self
            .channel
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await;
    }

    /// The messages in `queue`, in order, once `want` have arrived (or
    /// what arrived within `within`).
    async fn take(&self, queue: &str, want: usize, within: Duration) -> Vec<Received> {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        while got.len() < want && Instant::now() < deadline {
            let options = BasicGetOptions { no_ack: true };
            match self.channel.basic_get(queue.into(), options).await {
                Ok(Some(message)) => {
                    let headers = message
                        .delivery
                        .properties
                        .headers()
                        .as_ref()
                        .map(|table| {
                            table
                                .inner()
                                .iter()
                                .map(|(k, v)| {
                                    let text = match v {
                                        AMQPValue::LongString(s) => s.to_string(),
                                        other => format!("{other:?}"),
                                    };
                                    (k.to_string(), text)
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    got.push(Received {
                        id: message
                            .delivery
                            .properties
                            .message_id()
                            .as_ref()
                            .map(|id| id.to_string())
                            .unwrap_or_default(),
                        body: message.delivery.data.clone(),
                        headers,
                    });
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(e) => panic!("basic.get: {e}"),
            }
        }
        got
    }

    fn publisher(&self) -> outbox::lapin::Publisher {
        outbox::lapin::Publisher::connect(self.url.clone(), "")
    }
}

/// What each backend needs here: its connections and a relay's pool.
trait Backend: TestBackend<AsyncConn: PoolableConnection, Pool: RelayPool + Clone>
where
    Self::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <Self::Conn as Connection>::Backend: InboxBackend,
{
}

impl<T> Backend for T
where
    T: TestBackend<AsyncConn: PoolableConnection, Pool: RelayPool + Clone>,
    T::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <T::Conn as Connection>::Backend: InboxBackend,
{
}

/// A migrated database of this test, or `None` (the backend is not
/// configured).
fn database<B: Backend>(test: &str) -> Option<common::TestDb>
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    let db = B::fresh(test)?;
    diesel_inbox::migrate(&mut B::open(&db)).expect("migrate");
    Some(db)
}

/// Enqueues `message` in an inbox call of `consumer` for `key` (the
/// claim's transaction): its id, or `None` for a duplicate.
async fn enqueue_in_handler<C: AsyncInboxConnection>(
    conn: &mut C,
    consumer: &str,
    key: &str,
    message: Outgoing,
) -> Option<String> {
    let processed = Inbox::consumer(consumer)
        .retries(0)
        .run_async(conn, key, async |conn: &mut C| {
            outbox::enqueue_async(conn, message.clone()).await
        })
        .await
        .expect("handler");
    match processed {
        Processed::Applied(id) => Some(id),
        Processed::Duplicate => None,
    }
}

fn pending<B: Backend>(db: &str) -> u64
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    outbox::status(&mut B::open(db)).expect("status").pending
}

/// Outside a transaction, enqueue is refused (sync and async); a body
/// that enqueued and then failed leaves neither an outbox row nor an
/// inbox row.
fn enqueue_needs_the_transaction<B: Backend>()
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    let Some(db) = database::<B>("outbox_refused") else {
        return;
    };
    let mut conn = B::open(&db);
    let refused = outbox::enqueue(&mut conn, Outgoing::new("stock", "x"));
    assert!(
        matches!(refused, Err(InboxError::NotInTransaction { .. })),
        "{refused:?}"
    );
    let failed: Result<Processed<()>, diesel::result::Error> = Inbox::consumer("orders")
        .retries(0)
        .run(&mut conn, "m-1", |conn| {
            outbox::enqueue(conn, Outgoing::new("stock", "x").ordering_key("k"))?;
            Err(diesel::result::Error::RollbackTransaction)
        });
    assert!(failed.is_err());
    let invalid = conn.transaction(|conn| {
        outbox::enqueue(conn, Outgoing::new("", "x")).map_err(diesel::result::Error::from)
    });
    assert!(invalid.is_err(), "{invalid:?}");
    let bad_header = conn.transaction(|conn| {
        outbox::enqueue(conn, Outgoing::new("stock", "x").header("a:b", "v"))
            .map_err(diesel::result::Error::from)
    });
    assert!(bad_header.is_err(), "{bad_header:?}");
    assert_eq!(pending::<B>(&db), 0);
    assert_eq!(
        diesel_inbox::status(&mut conn, "orders", "m-1").expect("inbox row"),
        None
    );
    let pool = B::pool(&db);
    runtime().block_on(async {
        let mut conn = B::pooled(&pool).await;
        let refused = outbox::enqueue_async(&mut conn, Outgoing::new("stock", "x")).await;
        assert!(
            matches!(refused, Err(InboxError::NotInTransaction { .. })),
            "{refused:?}"
        );
    });
}

/// Committed messages are published once each, with their ids, headers
/// and payloads, a key's messages in enqueue order; a redelivery of the
/// inbound message enqueues nothing; published rows are gone.
fn publishes_committed_messages_with_their_ids<B: Backend>()
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    let Some(db) = database::<B>("outbox_publish") else {
        return;
    };
    let pool = B::pool(&db);
    runtime().block_on(async {
        let Some((rabbit, queue)) = Rabbit::with_queue("outbox_publish").await else {
            return;
        };
        let mut conn = B::pooled(&pool).await;
        let mut ids = Vec::new();
        for (key, body) in [("a-1", "first"), ("a-2", "second"), ("b-1", "other")] {
            let message = Outgoing::new(queue.as_str(), body)
                .ordering_key(&key[..1])
                .header("content-type", "text/plain");
            ids.push(enqueue_in_handler(&mut *conn, "orders", key, message.clone()).await);
            // The broker's redelivery: a duplicate, nothing enqueued.
            assert_eq!(
                enqueue_in_handler(&mut *conn, "orders", key, message).await,
                None
            );
        }
        let ids: Vec<String> = ids.into_iter().map(|id| id.expect("applied")).collect();
        drop(conn);
        let relay = Relay::new(pool.clone(), rabbit.publisher()).batch_size(10);
        let report = relay.run_once().await.expect("relay");
        assert_eq!((report.published, report.failed, report.dead), (3, 0, 0));
        let got = rabbit.take(&queue, 3, Duration::from_secs(10)).await;
        assert_eq!(got.len(), 3, "{got:?}");
        let by_id: HashMap<&str, &Received> = got.iter().map(|r| (r.id.as_str(), r)).collect();
        assert_eq!(by_id.len(), 3, "each id once: {got:?}");
        assert_eq!(by_id[ids[0].as_str()].body, b"first");
        assert_eq!(by_id[ids[2].as_str()].body, b"other");
        assert!(by_id[ids[1].as_str()]
            .headers
            .contains(&("content-type".into(), "text/plain".into())));
        let first = got.iter().position(|r| r.id == ids[0]).expect("first");
        let second = got.iter().position(|r| r.id == ids[1]).expect("second");
        assert!(first < second, "key a out of order: {got:?}");
        assert_eq!(pending::<B>(&db), 0);
        assert_eq!(relay.run_once().await.expect("relay").published, 0);
        rabbit.delete(&queue).await;
    });
}

/// An unroutable message is retried, holds back the later messages of its
/// key, becomes dead after `max_attempts`, is listed, and `retry` replays
/// it once it is routable.
fn unroutable_messages_become_dead_and_are_replayed<B: Backend>()
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    let Some(db) = database::<B>("outbox_dead") else {
        return;
    };
    let pool = B::pool(&db);
    runtime().block_on(async {
        let Some((rabbit, queue)) = Rabbit::with_queue("outbox_dead").await else {
            return;
        };
        let nowhere = format!("{queue}-nowhere");
        let mut conn = B::pooled(&pool).await;
        let lost = enqueue_in_handler(
            &mut *conn,
            "o",
            "m-1",
            Outgoing::new(nowhere.as_str(), "1").ordering_key("k"),
        )
        .await
        .expect("applied");
        let later = enqueue_in_handler(
            &mut *conn,
            "o",
            "m-2",
            Outgoing::new(queue.as_str(), "2").ordering_key("k"),
        )
        .await
        .expect("applied");
        drop(conn);
        let relay = Relay::new(pool.clone(), rabbit.publisher()).max_publish_attempts(2);
        let first = relay.run_once().await.expect("relay");
        assert_eq!((first.published, first.failed, first.dead), (0, 1, 0));
        // Held back behind the failed one.
        assert!(rabbit
            .take(&queue, 1, Duration::from_millis(300))
            .await
            .is_empty());
        // The first retry waits at most 1 s (`Relay`'s docs).
        tokio::time::sleep(Duration::from_millis(1_000 + 100)).await;
        let second = relay.run_once().await.expect("relay");
        assert_eq!((second.dead, second.published), (1, 1), "{second:?}");
        let got = rabbit.take(&queue, 1, Duration::from_secs(10)).await;
        assert_eq!(
            got.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            [later.as_str()]
        );
        let mut conn = B::pooled(&pool).await;
        let dead = outbox::dead_async(&mut conn, 10).await.expect("dead");
        assert_eq!(dead.len(), 1);
        assert_eq!((dead[0].id.as_str(), dead[0].attempts), (lost.as_str(), 2));
        assert!(
            dead[0].last_error.contains("unroutable"),
            "{}",
            dead[0].last_error
        );
        let status = outbox::status_async(&mut conn).await.expect("status");
        assert_eq!((status.pending, status.dead), (0, 1));
        // Routable now: replayed by id.
        rabbit.queue(&nowhere).await;
        assert_eq!(
            outbox::retry_async(&mut conn, lost.as_str())
                .await
                .expect("retry"),
            1
        );
        assert_eq!(
            outbox::retry_async(&mut conn, AllDead)
                .await
                .expect("retry"),
            0
        );
        drop(conn);
        assert_eq!(relay.run_once().await.expect("relay").published, 1);
        let replayed = rabbit.take(&nowhere, 1, Duration::from_secs(10)).await;
        assert_eq!(replayed.len(), 1);
        assert_eq!(replayed[0].id, lost);
        assert_eq!(
            pending::<B>(&db) + outbox::status(&mut B::open(&db)).expect("status").dead,
            0
        );
        rabbit.delete(&queue).await;
        rabbit.delete(&nowhere).await;
    });
}

/// A message larger than the server's `max_payload` (NATS: 1 MiB by
/// default) is dead after `max_attempts`; the others are published with
/// `Nats-Msg-Id` = the outbox id; `purge` deletes the dead one.
fn nats_publishes_with_ids_and_refuses_oversized<B: Backend>()
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    let Some(db) = database::<B>("outbox_nats") else {
        return;
    };
    let pool = B::pool(&db);
    runtime().block_on(async {
        let Some(url) = env("INBOX_TEST_NATS_URL") else {
            return;
        };
        let client = async_nats::connect(&url).await.expect("connect to NATS");
        let js = async_nats::jetstream::new(client);
        let name = common::unique_identifier("outbox_nats").replace('-', "_");
        let subject = format!("outbox.{name}");
        let stream = js
            .create_stream(async_nats::jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                ..Default::default()
            })
            .await
            .expect("create stream");
        let mut conn = B::pooled(&pool).await;
        let small = enqueue_in_handler(
            &mut *conn,
            "o",
            "m-1",
            Outgoing::new(subject.as_str(), "small").header("x-kind", "test"),
        )
        .await
        .expect("applied");
        let huge = enqueue_in_handler(
            &mut *conn,
            "o",
            "m-2",
            Outgoing::new(subject.as_str(), vec![7u8; 2 * 1024 * 1024]),
        )
        .await
        .expect("applied");
        drop(conn);
        let relay = Relay::new(pool.clone(), outbox::nats::Publisher::new(js.clone()))
            .max_publish_attempts(1);
        let report = relay.run_once().await.expect("relay");
        assert_eq!((report.published, report.dead), (1, 1), "{report:?}");
        let mut stream = stream;
        assert_eq!(stream.info().await.expect("info").state.messages, 1);
        let message = stream.get_raw_message(1).await.expect("message 1");
        assert_eq!(message.payload.as_ref(), b"small");
        let headers = message.headers;
        assert_eq!(
            headers.get("Nats-Msg-Id").map(|v| v.as_str()),
            Some(small.as_str())
        );
        assert_eq!(headers.get("x-kind").map(|v| v.as_str()), Some("test"));
        let mut conn = B::pooled(&pool).await;
        let dead = outbox::dead_async(&mut conn, 10).await.expect("dead");
        assert_eq!(
            dead.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
            [huge.as_str()]
        );
        assert!(
            dead[0].last_error.contains("payload"),
            "{}",
            dead[0].last_error
        );
        let purged = outbox::purge_async(&mut conn, Duration::ZERO, 100)
            .await
            .expect("purge");
        assert_eq!(purged.rows, 1);
        assert!(outbox::dead_async(&mut conn, 10)
            .await
            .expect("dead")
            .is_empty());
        let _ = js.delete_stream(&name).await;
    });
}

/// Four relays on one database while messages are enqueued: every message
/// is published exactly once (no row by two relays at once), and each
/// key's messages arrive in enqueue order.
fn four_relays_share_the_outbox_in_order<B: Backend>()
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    const KEYS: usize = 8;
    const PER_KEY: usize = 25;
    let Some(db) = database::<B>("outbox_four") else {
        return;
    };
    let pool = B::pool(&db);
    runtime().block_on(async {
        let Some((rabbit, queue)) = Rabbit::with_queue("outbox_four").await else {
            return;
        };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let relays: Vec<_> = (0..4)
            .map(|_| {
                let relay = Relay::new(pool.clone(), rabbit.publisher())
                    .batch_size(16)
                    .poll_interval(Duration::from_millis(20));
                let mut stopped = stopped.clone();
                tokio::spawn(async move {
                    relay
                        .run(async move {
                            let _ = stopped.wait_for(|s| *s).await;
                        })
                        .await
                        .expect("relay")
                })
            })
            .collect();
        let mut conn = B::pooled(&pool).await;
        for n in 0..PER_KEY {
            for key in 0..KEYS {
                let body = format!("{key}:{n}");
                let message =
                    Outgoing::new(queue.as_str(), body.clone()).ordering_key(&format!("k{key}"));
                enqueue_in_handler(&mut *conn, "o", &body, message)
                    .await
                    .expect("applied");
            }
        }
        drop(conn);
        let got = rabbit
            .take(&queue, KEYS * PER_KEY, Duration::from_secs(60))
            .await;
        stop.send(true).expect("stop");
        let mut published = 0;
        for relay in relays {
            published += relay.await.expect("relay task").published;
        }
        assert_eq!(got.len(), KEYS * PER_KEY);
        assert_eq!(published, (KEYS * PER_KEY) as u64);
        let ids: std::collections::HashSet<&str> = got.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids.len(), KEYS * PER_KEY, "an id published twice");
        let mut next = [0usize; KEYS];
        for received in &got {
            let body = String::from_utf8(received.body.clone()).expect("utf-8");
            let (key, n) = body.split_once(':').expect("key:n");
            let (key, n): (usize, usize) = (key.parse().expect("key"), n.parse().expect("n"));
            assert_eq!(n, next[key], "key {key} out of order");
            next[key] += 1;
        }
        assert_eq!(pending::<B>(&db), 0);
        rabbit.delete(&queue).await;
    });
}

/// A relay waiting on a long poll interval publishes a message as soon as
/// the `#[idempotent]`-style call that enqueued it commits.
fn a_relay_in_the_same_process_wakes_at_the_commit<B: Backend>()
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    let Some(db) = database::<B>("outbox_wake") else {
        return;
    };
    let pool = B::pool(&db);
    runtime().block_on(async {
        let Some((rabbit, queue)) = Rabbit::with_queue("outbox_wake").await else {
            return;
        };
        let relay =
            Relay::new(pool.clone(), rabbit.publisher()).poll_interval(Duration::from_secs(60));
        let (stop, running) = crate::support::relay::spawn(relay);
        // The relay's first pass found nothing; it now waits.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut conn = B::pooled(&pool).await;
        let started = Instant::now();
        let id = enqueue_in_handler(&mut *conn, "o", "m-1", Outgoing::new(queue.as_str(), "now"))
            .await
            .expect("applied");
        let got = rabbit.take(&queue, 1, Duration::from_secs(10)).await;
        let waited = started.elapsed();
        stop.send(true).expect("stop");
        assert_eq!(
            running.await.expect("relay task").expect("relay").published,
            1
        );
        assert_eq!(
            got.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            [id.as_str()]
        );
        assert!(
            waited < Duration::from_secs(5),
            "published after {waited:?}, not at the commit"
        );
        rabbit.delete(&queue).await;
    });
}

/// Delayed messages (`deliver_after`, `deliver_at`) are scheduled, not
/// pending, until their time, by the database's clock; a relay stopped
/// while they wait publishes nothing early, and one started after that
/// publishes them when due; a delayed message holds back the later ones of
/// its ordering key, and one without a key holds back nothing; a time
/// already past publishes at once; out-of-range delays are refused.
fn delayed_messages_wait_for_their_time_across_a_relay_restart<B: Backend>()
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    let Some(db) = database::<B>("outbox_delayed") else {
        return;
    };
    let mut conn = B::open(&db);
    for refused in [
        Outgoing::new("stock", "x").deliver_after(Duration::MAX),
        Outgoing::new("stock", "x").deliver_at(std::time::UNIX_EPOCH - Duration::from_secs(1)),
    ] {
        let enqueued = conn
            .transaction::<_, diesel::result::Error, _>(|conn| {
                Ok(outbox::enqueue(conn, refused.clone()))
            })
            .expect("the transaction");
        assert!(
            matches!(enqueued, Err(InboxError::InvalidOutgoing(_))),
            "{refused:?}: {enqueued:?}"
        );
    }
    let pool = B::pool(&db);
    runtime().block_on(async {
        let Some((rabbit, queue)) = Rabbit::with_queue("outbox_delayed").await else {
            return;
        };
        const DELAY: Duration = Duration::from_secs(3);
        let started = Instant::now();
        let q = queue.as_str();
        let messages = [
            (
                "late",
                Outgoing::new(q, "late")
                    .ordering_key("k")
                    .deliver_after(DELAY),
            ),
            ("held", Outgoing::new(q, "held").ordering_key("k")),
            ("free", Outgoing::new(q, "free")),
            (
                "at",
                Outgoing::new(q, "at").deliver_at(std::time::SystemTime::now() + DELAY),
            ),
            (
                "past",
                Outgoing::new(q, "past").deliver_at(std::time::UNIX_EPOCH + DELAY),
            ),
        ];
        let mut pooled = B::pooled(&pool).await;
        for (key, message) in messages {
            enqueue_in_handler(&mut *pooled, "orders", key, message)
                .await
                .expect("applied");
        }
        drop(pooled);
        let status = outbox::status(&mut conn).expect("status");
        assert_eq!(
            (status.pending, status.scheduled, status.dead),
            (3, 2, 0),
            "{status:?}"
        );
        let next = status.next_scheduled_in.expect("next scheduled");
        assert!(next > Duration::from_secs(1) && next <= DELAY, "{status:?}");
        assert_eq!(status.destinations[0].scheduled, 2, "{status:?}");

        // A relay that runs for a second and stops: the due messages only,
        // and "held" waits for "late".
        let relay = || {
            Relay::new(pool.clone(), rabbit.publisher()).poll_interval(Duration::from_millis(100))
        };
        let first = relay();
        let report = first
            .run(tokio::time::sleep(Duration::from_secs(1)))
            .await
            .expect("first relay");
        assert_eq!(report.published, 2, "{report:?}");
        let got = rabbit.take(&queue, 3, Duration::from_millis(500)).await;
        let mut bodies: Vec<&[u8]> = got.iter().map(|r| r.body.as_slice()).collect();
        bodies.sort();
        assert_eq!(bodies, [&b"free"[..], b"past"], "{got:?}");
        assert!(
            started.elapsed() < DELAY,
            "the test itself was too slow to tell"
        );

        // The relay again (a restart): the rest, not before their time, and
        // "late" before "held".
        let (stop, running) = crate::support::relay::spawn(relay());
        let mut arrived = Vec::new();
        while arrived.len() < 3 && started.elapsed() < DELAY + Duration::from_secs(10) {
            for message in rabbit.take(&queue, 1, Duration::from_millis(200)).await {
                arrived.push((
                    String::from_utf8(message.body).expect("utf-8"),
                    started.elapsed(),
                ));
            }
        }
        stop.send(true).expect("stop");
        assert_eq!(
            running
                .await
                .expect("relay task")
                .expect("second relay")
                .published,
            3
        );
        let order: Vec<&str> = arrived.iter().map(|(body, _)| body.as_str()).collect();
        assert_eq!(order.len(), 3, "{arrived:?}");
        let position = |body: &str| order.iter().position(|b| *b == body).expect(body);
        assert!(position("late") < position("held"), "{arrived:?}");
        // By the database's clock, which is this machine's: the enqueuing
        // transactions began after `started` (and SQLite's clock has
        // milliseconds).
        for (body, at) in &arrived {
            assert!(
                *at + Duration::from_millis(5) >= DELAY,
                "{body} published {at:?} after the start, before its time"
            );
        }
        let status = outbox::status(&mut conn).expect("status");
        assert_eq!((status.pending, status.scheduled), (0, 0), "{status:?}");
        rabbit.delete(&queue).await;
    });
}

/// A key with a long backlog does not hold back the others: 1,200
/// messages of one key, then one of each of five other keys, through a
/// relay claiming 10 at a time (so the claim's look at the oldest live
/// rows holds only the first key's, and the claim looks beyond it): the
/// five others are in the first batch, and every key's messages arrive in
/// order.
fn a_long_key_does_not_hold_back_the_others<B: Backend>()
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    const LONG: usize = 1_200;
    const OTHERS: [&str; 5] = ["b", "c", "d", "e", "f"];
    let Some(db) = database::<B>("outbox_long_key") else {
        return;
    };
    let pool = B::pool(&db);
    runtime().block_on(async {
        let Some((rabbit, queue)) = Rabbit::with_queue("outbox_long_key").await else {
            return;
        };
        let mut conn = B::pooled(&pool).await;
        let destination = queue.as_str();
        diesel_async::AsyncConnection::transaction(&mut *conn, async |conn| {
            for n in 0..LONG {
                let message = Outgoing::new(destination, format!("a:{n}")).ordering_key("a");
                outbox::enqueue_async(&mut *conn, message).await?;
            }
            for key in OTHERS {
                let message = Outgoing::new(destination, format!("{key}:0")).ordering_key(key);
                outbox::enqueue_async(&mut *conn, message).await?;
            }
            Ok::<_, InboxError>(())
        })
        .await
        .expect("enqueue");
        drop(conn);
        let relay = Relay::new(pool.clone(), rabbit.publisher()).batch_size(10);
        let report = relay.run_once().await.expect("relay");
        assert_eq!(report.published, (LONG + OTHERS.len()) as u64);
        let got = rabbit
            .take(&queue, LONG + OTHERS.len(), Duration::from_secs(60))
            .await;
        assert_eq!(got.len(), LONG + OTHERS.len());
        let bodies: Vec<String> = got
            .iter()
            .map(|r| String::from_utf8(r.body.clone()).expect("utf-8"))
            .collect();
        for key in OTHERS {
            let at = bodies
                .iter()
                .position(|b| *b == format!("{key}:0"))
                .expect("published");
            assert!(at < 10, "key {key} arrived {at}th, behind key a's backlog");
        }
        let long: Vec<&String> = bodies.iter().filter(|b| b.starts_with("a:")).collect();
        let expected: Vec<String> = (0..LONG).map(|n| format!("a:{n}")).collect();
        assert!(
            long.iter().zip(&expected).all(|(got, want)| *got == want),
            "key a out of order"
        );
        assert_eq!(pending::<B>(&db), 0);
        rabbit.delete(&queue).await;
    });
}

/// A transaction that enqueued a key's next message and has not committed
/// does not stop the relay (MySQL/MariaDB: a locking read would wait for
/// it): the key's committed messages are published at once, the open
/// one after its commit.
fn an_open_enqueue_does_not_stall_the_relay<B: Backend>()
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    let Some(db) = database::<B>("outbox_open_enqueue") else {
        return;
    };
    let pool = B::pool(&db);
    runtime().block_on(async {
        let Some((rabbit, queue)) = Rabbit::with_queue("outbox_open_enqueue").await else {
            return;
        };
        let mut conn = B::open(&db);
        conn.transaction(|conn| {
            for n in 0..2 {
                outbox::enqueue(
                    conn,
                    Outgoing::new(queue.as_str(), format!("k:{n}")).ordering_key("k"),
                )?;
            }
            Ok::<_, InboxError>(())
        })
        .expect("enqueue");
        let (enqueued, open) = std::sync::mpsc::channel();
        let (commit, committed) = std::sync::mpsc::channel::<()>();
        let holder = {
            let (db, queue) = (db.to_string(), queue.clone());
            std::thread::spawn(move || {
                let mut conn = B::open(&db);
                conn.transaction(|conn| {
                    outbox::enqueue(conn, Outgoing::new(queue.as_str(), "k:2").ordering_key("k"))?;
                    enqueued.send(()).expect("signal");
                    committed.recv().expect("commit");
                    Ok::<_, InboxError>(())
                })
                .expect("the open enqueue");
            })
        };
        open.recv().expect("enqueued");
        let relay = Relay::new(pool.clone(), rabbit.publisher()).batch_size(10);
        let report = tokio::time::timeout(Duration::from_secs(10), relay.run_once())
            .await
            .expect("the relay waited for the open transaction")
            .expect("relay");
        assert_eq!(report.published, 2);
        commit.send(()).expect("commit");
        holder.join().expect("the holder");
        assert_eq!(relay.run_once().await.expect("relay").published, 1);
        let got = rabbit.take(&queue, 3, Duration::from_secs(10)).await;
        let bodies: Vec<&[u8]> = got.iter().map(|r| r.body.as_slice()).collect();
        assert_eq!(bodies, vec![&b"k:0"[..], b"k:1", b"k:2"]);
        rabbit.delete(&queue).await;
    });
}

/// A broker that refuses every message with the error its payload names.
struct RefusesAsTold;

impl outbox::Publish for RefusesAsTold {
    async fn publish<'a>(
        &'a self,
        messages: &'a [outbox::OutboxMessage],
    ) -> Vec<Result<(), outbox::PublishError>> {
        messages
            .iter()
            .map(|m| {
                Err(outbox::PublishError::refused(
                    String::from_utf8_lossy(&m.payload).into_owned(),
                ))
            })
            .collect()
    }
}

/// Dead messages of two destinations and three failures (ids and numbers
/// differ within a failure, one has `%` and `_` in it): the groups count
/// them, with examples; a group's retry makes exactly its members pending,
/// a group's discard deletes exactly its members, nothing else moves.
fn failure_groups_are_counted_and_acted_on_whole<B: Backend>()
where
    B::Conn: LoadConnection<TransactionManager = AnsiTransactionManager>,
    <B::Conn as Connection>::Backend: InboxBackend,
{
    let Some(db) = database::<B>("outbox_groups") else {
        return;
    };
    let pool = B::pool(&db);
    let mut conn = B::open(&db);
    let mut sent: Vec<(&str, String)> = Vec::new();
    for n in 0..5 {
        sent.push(("orders", format!("timeout after {n}s on 10.0.0.{n}:9092")));
    }
    for n in 0..3 {
        sent.push(("orders", format!("refused: 100% of quota_{n} used")));
    }
    for n in 0..2 {
        sent.push(("mail", format!("timeout after {}s on 10.0.0.1:9092", n + 7)));
    }
    // Not a member of "timeout after # on #", though its pattern admits it.
    sent.push(("orders", "timeout after many tries on host".to_owned()));
    conn.transaction(|conn| {
        for (destination, error) in &sent {
            outbox::enqueue(conn, Outgoing::new(*destination, error.as_str()))?;
        }
        Ok::<_, InboxError>(())
    })
    .expect("enqueue");
    runtime().block_on(async {
        let relay = Relay::new(pool.clone(), RefusesAsTold).max_publish_attempts(1);
        assert_eq!(relay.run_once().await.expect("relay").dead, 11);
        let mut conn = B::pooled(&pool).await;
        let groups = outbox::dead_groups_async(&mut conn, &outbox::DeadFilter::new(), 1000)
            .await
            .expect("groups");
        let summary: Vec<(&str, &str, u64)> = groups
            .iter()
            .map(|g| (g.destination.as_str(), g.failure.as_str(), g.count))
            .collect();
        assert_eq!(
            summary,
            [
                ("orders", "timeout after # on #", 5),
                ("orders", "refused: #% of # used", 3),
                ("mail", "timeout after # on #", 2),
                ("orders", "timeout after many tries on host", 1),
            ]
        );
        assert!(groups[0].example_error.starts_with("timeout after "));
        assert!(groups[0].first_dead_at <= groups[0].last_dead_at);
        // The same through the sync API and a filter.
        let mut sync = B::open(&db);
        let mail = outbox::dead_groups(
            &mut sync,
            &outbox::DeadFilter::new().destination("mail"),
            10,
        )
        .expect("groups");
        assert_eq!(mail.len(), 1);
        assert_eq!(mail[0].count, 2);

        // A group read through a filter acts within it: one of the five.
        let narrowed = outbox::dead_groups(
            &mut sync,
            &outbox::DeadFilter::new()
                .destination("orders")
                .error_contains("10.0.0.1:"),
            10,
        )
        .expect("groups");
        assert_eq!(narrowed.len(), 1);
        assert_eq!(
            (narrowed[0].failure.as_str(), narrowed[0].count),
            ("timeout after # on #", 1)
        );
        assert_eq!(outbox::retry(&mut sync, &narrowed[0]).expect("retry"), 1);
        let retried = outbox::retry_async(&mut conn, &groups[0])
            .await
            .expect("retry");
        assert_eq!(retried, 4);
        let discarded = outbox::discard(&mut sync, &groups[1]).expect("discard");
        assert_eq!(discarded, 3);
        let status = outbox::status_async(&mut conn).await.expect("status");
        assert_eq!((status.pending, status.dead), (5, 3));
        let left = outbox::dead_groups_async(&mut conn, &outbox::DeadFilter::new(), 1000)
            .await
            .expect("groups");
        let left: Vec<(&str, &str, u64)> = left
            .iter()
            .map(|g| (g.destination.as_str(), g.failure.as_str(), g.count))
            .collect();
        assert_eq!(
            left,
            [
                ("mail", "timeout after # on #", 2),
                ("orders", "timeout after many tries on host", 1),
            ]
        );
        // A group that no longer has members: nothing.
        assert_eq!(
            outbox::discard_async(&mut conn, &groups[1])
                .await
                .expect("discard"),
            0
        );
    });
}

macro_rules! outbox_tests {
    ($backend:ty) => {
        #[test]
        fn enqueue_needs_the_transaction() {
            super::enqueue_needs_the_transaction::<$backend>();
        }

        #[test]
        fn publishes_committed_messages_with_their_ids() {
            super::publishes_committed_messages_with_their_ids::<$backend>();
        }

        #[test]
        fn unroutable_messages_become_dead_and_are_replayed() {
            super::unroutable_messages_become_dead_and_are_replayed::<$backend>();
        }

        #[test]
        fn failure_groups_are_counted_and_acted_on_whole() {
            super::failure_groups_are_counted_and_acted_on_whole::<$backend>();
        }

        #[test]
        fn nats_publishes_with_ids_and_refuses_oversized() {
            super::nats_publishes_with_ids_and_refuses_oversized::<$backend>();
        }

        #[test]
        fn four_relays_share_the_outbox_in_order() {
            super::four_relays_share_the_outbox_in_order::<$backend>();
        }

        #[test]
        fn a_long_key_does_not_hold_back_the_others() {
            super::a_long_key_does_not_hold_back_the_others::<$backend>();
        }

        #[test]
        fn a_relay_in_the_same_process_wakes_at_the_commit() {
            super::a_relay_in_the_same_process_wakes_at_the_commit::<$backend>();
        }

        #[test]
        fn delayed_messages_wait_for_their_time_across_a_relay_restart() {
            super::delayed_messages_wait_for_their_time_across_a_relay_restart::<$backend>();
        }
    };
}

mod sqlite {
    outbox_tests!(crate::common::backends::sqlite::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    outbox_tests!(crate::common::backends::postgres::Postgres);

    #[test]
    fn an_open_enqueue_does_not_stall_the_relay() {
        super::an_open_enqueue_does_not_stall_the_relay::<
            crate::common::backends::postgres::Postgres,
        >();
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    outbox_tests!(crate::common::backends::mysql::Mysql);

    #[test]
    fn an_open_enqueue_does_not_stall_the_relay() {
        super::an_open_enqueue_does_not_stall_the_relay::<crate::common::backends::mysql::Mysql>();
    }
}

/// Behind PgBouncer in transaction mode no notification reaches a
/// relay's `LISTEN` (the proxy keeps no session): the relay finds that out
/// at start, says so once (WARN), polls, and publishes what was enqueued.
#[cfg(feature = "postgres")]
#[test]
fn a_relay_behind_a_transaction_mode_proxy_polls_with_one_warning() {
    type B = common::backends::pgbouncer::PgBouncer;
    let Some(db) = database::<B>("outbox_proxy_listen") else {
        return;
    };
    let pool = B::pool(&db);
    let mut conn = B::open(&db);
    let listen_warning =
        |e: &common::LoggedEvent| e.level == tracing::Level::WARN && e.fields.contains("LISTEN");
    let (published, events) = common::events_watched(|watched| {
        runtime().block_on(async {
            let (rabbit, queue) = Rabbit::with_queue("outbox_proxy_listen").await?;
            let relay = Relay::new(pool.clone(), rabbit.publisher())
                .poll_interval(Duration::from_millis(300));
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let running = relay.run(async {
                let _ = stopped.await;
            });
            let test = async {
                // Past the relay's check of its LISTEN connection: its
                // opening (bounded by 10 s) and its probe's wait (2 s),
                // however slow the machine is.
                let checked = Instant::now();
                while !watched.events().iter().any(listen_warning)
                    && checked.elapsed() < Duration::from_secs(20)
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                conn.transaction(|conn| {
                    outbox::enqueue(conn, Outgoing::new(queue.as_str(), "polled"))
                        .map_err(diesel::result::Error::from)
                })
                .expect("enqueue");
                let got = rabbit.take(&queue, 1, Duration::from_secs(10)).await;
                let _ = stop.send(());
                got
            };
            let stopping = Instant::now();
            let (report, got) = tokio::join!(running, test);
            assert!(
                stopping.elapsed() < Duration::from_secs(40),
                "the relay hung"
            );
            rabbit.delete(&queue).await;
            assert_eq!(
                got.iter().map(|r| r.body.as_slice()).collect::<Vec<_>>(),
                [&b"polled"[..]]
            );
            Some(report.expect("relay").published)
        })
    });
    if published.is_none() {
        return;
    }
    assert_eq!(published, Some(1));
    let warnings: Vec<_> = events.iter().filter(|e| listen_warning(e)).collect();
    assert_eq!(warnings.len(), 1, "one WARN about LISTEN: {events:#?}");
    assert!(
        warnings[0].fields.contains("transaction mode"),
        "{warnings:?}"
    );
}

/// The real RabbitMQ publisher, whose first batch's confirms are lost
/// after the broker took the messages: what a relay killed between the
/// confirm and the row's delete leaves behind.
struct LosesFirstConfirms {
    inner: outbox::lapin::Publisher,
    lost: std::sync::atomic::AtomicBool,
}

impl outbox::Publish for LosesFirstConfirms {
    async fn publish<'a>(
        &'a self,
        messages: &'a [outbox::OutboxMessage],
    ) -> Vec<Result<(), outbox::PublishError>> {
        let published = self.inner.publish(messages).await;
        match self.lost.swap(true, std::sync::atomic::Ordering::SeqCst) {
            false => {
                vec![Err(outbox::PublishError::unavailable("the confirm was lost")); messages.len()]
            }
            true => published,
        }
    }
}

/// A message the broker took but whose confirm the relay never saw is
/// published again with the same id, and a diesel-inbox consumer
/// downstream applies it once: `Applied`, then `Duplicate`.
#[test]
fn a_lost_confirm_republishes_the_same_id_and_downstream_applies_it_once() {
    use common::backends::sqlite::Sqlite;
    let Some(db) = database::<Sqlite>("outbox_lost_confirm") else {
        return;
    };
    let pool = Sqlite::pool(&db);
    runtime().block_on(async {
        let Some((rabbit, queue)) = Rabbit::with_queue("outbox_lost_confirm").await else {
            return;
        };
        let mut conn = Sqlite::pooled(&pool).await;
        let id = enqueue_in_handler(
            &mut *conn,
            "o",
            "m-1",
            Outgoing::new(queue.as_str(), "once"),
        )
        .await
        .expect("applied");
        drop(conn);
        let publisher = LosesFirstConfirms {
            inner: rabbit.publisher(),
            lost: std::sync::atomic::AtomicBool::new(false),
        };
        let relay = Relay::new(pool.clone(), publisher);
        let first = relay.run_once().await.expect("relay");
        assert_eq!((first.published, first.released), (0, 1));
        let second = relay.run_once().await.expect("relay");
        assert_eq!(second.published, 1);
        let got = rabbit.take(&queue, 2, Duration::from_secs(10)).await;
        assert_eq!(got.len(), 2, "published twice: {got:?}");
        assert!(got.iter().all(|r| r.id == id), "{got:?}");
        // Downstream: an inbox keyed by the message id.
        let mut downstream = Sqlite::open(&db);
        let verdicts: Vec<Processed<()>> = got
            .iter()
            .map(|r| {
                Inbox::consumer("downstream")
                    .retries(0)
                    .run(&mut downstream, &r.id, |_| {
                        Ok::<_, diesel::result::Error>(())
                    })
                    .expect("downstream")
            })
            .collect();
        assert_eq!(verdicts, [Processed::Applied(()), Processed::Duplicate]);
        assert_eq!(pending::<Sqlite>(&db), 0);
        rabbit.delete(&queue).await;
    });
}

/// Relays on every node of a Galera cluster, one outbox written on the
/// first node. `SKIP LOCKED` is node-local there: two nodes' relays may
/// claim one row, and Galera's certification aborts one of the two
/// leases, or both publish it. What the contract allows, and what this
/// checks: every message delivered, a duplicate only with the same id, a
/// downstream inbox applying each once, and per key the first deliveries
/// in enqueue order.
#[cfg(feature = "mysql")]
#[test]
#[cfg_attr(
    not(inbox_test_galera),
    ignore = "INBOX_TEST_GALERA_URLS was not set when the tests were built"
)]
fn relays_on_every_galera_node_publish_each_message_and_downstream_applies_it_once() {
    use common::backends::galera::{fresh, nodes, on_node, open_node};
    use diesel_async::pooled_connection::{deadpool::Pool, AsyncDieselConnectionManager};
    const KEYS: usize = 6;
    const PER_KEY: usize = 20;
    let Some(db) = fresh("outbox_galera") else {
        return;
    };
    let count = nodes().expect("nodes").len();
    diesel_inbox::migrate(&mut open_node(&on_node(&db, 0))).expect("migrate");
    runtime().block_on(async {
        let Some((rabbit, queue)) = Rabbit::with_queue("outbox_galera").await else {
            return;
        };
        let mut writer = open_node(&on_node(&db, 0));
        let mut ids = HashMap::new();
        for n in 0..PER_KEY {
            for key in 0..KEYS {
                let body = format!("{key}:{n}");
                let id = writer
                    .transaction(|conn| {
                        outbox::enqueue(conn, Outgoing::new(queue.as_str(), body.clone()).ordering_key(&format!("k{key}")))
                            .map_err(diesel::result::Error::from)
                    })
                    .expect("enqueue");
                ids.insert(id, body);
            }
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let relays: Vec<_> = (0..count)
            .map(|node| {
                let manager = AsyncDieselConnectionManager::<diesel_async::AsyncMysqlConnection>::new(
                    on_node(&db, node),
                );
                let pool = Pool::builder(manager).max_size(2).build().expect("a pool");
                let relay = Relay::new(pool, rabbit.publisher())
                    .batch_size(8)
                    .poll_interval(Duration::from_millis(20));
                let mut stopped = stopped.clone();
                tokio::spawn(async move {
                    relay
                        .run(async move {
                            let _ = stopped.wait_for(|s| *s).await;
                        })
                        .await
                        .expect("relay")
                })
            })
            .collect();
        let mut got = rabbit.take(&queue, KEYS * PER_KEY, Duration::from_secs(60)).await;
        // Let duplicates arrive too.
        tokio::time::sleep(Duration::from_millis(500)).await;
        got.extend(rabbit.take(&queue, usize::MAX, Duration::from_millis(300)).await);
        stop.send(true).expect("stop");
        let mut reports = Vec::new();
        for relay in relays {
            reports.push(relay.await.expect("relay task"));
        }
        let mut downstream = open_node(&on_node(&db, 1 % count));
        let mut applied = 0;
        let mut next = [0usize; KEYS];
        for received in &got {
            let body = ids.get(&received.id).expect("an enqueued id");
            assert_eq!(received.body, body.as_bytes(), "the id's own message");
            let verdict: Processed<()> = Inbox::consumer("galera-downstream")
                .retries(3)
                .run(&mut downstream, &received.id, |_| Ok::<_, diesel::result::Error>(()))
                .expect("downstream");
            if verdict.is_applied() {
                applied += 1;
                let (key, n) = body.split_once(':').expect("key:n");
                let (key, n): (usize, usize) = (key.parse().expect("key"), n.parse().expect("n"));
                assert_eq!(n, next[key], "key {key}: first deliveries out of order");
                next[key] += 1;
            }
        }
        assert_eq!(applied, KEYS * PER_KEY, "every message applied once downstream");
        let status = outbox::status(&mut open_node(&on_node(&db, 0))).expect("status");
        assert_eq!((status.pending, status.dead), (0, 0));
        eprintln!(
            "Galera, {count} relays: {} deliveries of {} messages ({} duplicates); published per relay {:?}, errors {:?}",
            got.len(),
            KEYS * PER_KEY,
            got.len() - KEYS * PER_KEY,
            reports.iter().map(|r| r.published).collect::<Vec<_>>(),
            reports.iter().map(|r| r.errors).collect::<Vec<_>>()
        );
        rabbit.delete(&queue).await;
    });
}

/// With the `metrics` feature: the relay's counters (confirmed messages,
/// dead ones), the histogram of enqueue-to-confirm latency, and the
/// gauges `outbox::status` sets.
#[cfg(feature = "metrics")]
#[test]
fn the_relay_and_status_report_metrics() {
    use common::backends::sqlite::Sqlite;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use std::collections::BTreeMap;
    let Some(db) = database::<Sqlite>("outbox_metrics") else {
        return;
    };
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A runtime on this thread: the recorder is this thread's.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let ran = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let Some((rabbit, queue)) = Rabbit::with_queue("outbox_metrics").await else {
                return false;
            };
            let pool = Sqlite::pool(&db);
            let mut conn = Sqlite::pooled(&pool).await;
            for (key, destination) in [
                ("m-1", queue.clone()),
                ("m-2", queue.clone()),
                ("m-3", format!("{queue}-nowhere")),
            ] {
                enqueue_in_handler(&mut *conn, "o", key, Outgoing::new(destination, "x")).await;
            }
            let report = Relay::new(pool.clone(), rabbit.publisher())
                .max_publish_attempts(1)
                .run_once()
                .await
                .expect("relay");
            assert_eq!((report.published, report.dead), (2, 1));
            let status = outbox::status_async(&mut conn).await.expect("status");
            assert_eq!((status.pending, status.dead), (0, 1));
            rabbit.delete(&queue).await;
            true
        })
    });
    if !ran {
        return;
    }
    let mut seen: BTreeMap<String, f64> = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_, key) = key.into_parts();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{} {}", key.name(), labels.join(","));
        let value = match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(samples) => samples.len() as f64,
        };
        seen.insert(name, value);
    }
    for (name, value) in [
        ("messaging.client.sent.messages ", 2.0),
        ("diesel_inbox.outbox.failed diesel_inbox.outcome=dead", 1.0),
        ("diesel_inbox.outbox.confirm_latency ", 2.0),
        ("diesel_inbox.outbox.pending ", 0.0),
        ("diesel_inbox.outbox.scheduled ", 0.0),
        ("diesel_inbox.outbox.dead ", 1.0),
        ("diesel_inbox.outbox.oldest_pending_age ", 0.0),
    ] {
        assert_eq!(seen.get(name), Some(&value), "{name} in {seen:#?}");
    }
}

/// A transaction held open (and with it PostgreSQL's vacuum horizon: the
/// rows the relay deletes stay behind as dead tuples) for 20 s while
/// 16,800 messages of 20 ordering keys flow through a running relay to
/// RabbitMQ: the relay keeps at least half the producer's pace (at each
/// tenth of the messages, at most half of those enqueued so far are
/// pending: on a loaded machine the producer itself falls behind its
/// schedule), every message arrives once, in its key's order, and the
/// outbox is empty after the holder commits. The
/// relay's rate before, during and after a longer such transaction is the
/// benchmark's (`--outbox --outbox-horizon 60`); this prints the backlog it
/// saw. (It held 60 s with 50,000 messages until the CI's time was cut:
/// the same dead tuples, three times fewer, and the same pace.)
#[cfg(feature = "postgres")]
#[test]
fn a_long_transaction_holding_the_vacuum_horizon_does_not_stop_the_relay() {
    use diesel::connection::SimpleConnection;
    type B = common::backends::postgres::Postgres;
    const HOLD: Duration = Duration::from_secs(20);
    const KEYS: usize = 20;
    const CHUNKS: usize = 40;
    const PER_CHUNK: usize = 420;
    if support::skip_slow() {
        return;
    }
    let Some(db) = database::<B>("outbox_horizon") else {
        return;
    };
    let pool = B::pool(&db);
    let mut holder = B::open(&db);
    runtime().block_on(async {
        let Some((rabbit, queue)) = Rabbit::with_queue("outbox_horizon").await else {
            return;
        };
        // Its snapshot is taken by its first read, and holds the horizon
        // until it ends.
        holder
            .batch_execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox_messages",
            )
            .expect("hold a transaction");
        let opened = Instant::now();
        let relay = Relay::new(pool.clone(), rabbit.publisher())
            .batch_size(100)
            .poll_interval(Duration::from_millis(50));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = relay.run(async {
            let _ = stopped.await;
        });
        let produce = async {
            let mut conn = B::pooled(&pool).await;
            for chunk in 0..CHUNKS {
                let due = opened + HOLD.mul_f64(chunk as f64 / CHUNKS as f64);
                tokio::time::sleep_until(due.into()).await;
                let start = chunk * PER_CHUNK;
                let queue = queue.as_str();
                diesel_async::AsyncConnection::transaction(&mut *conn, async |conn| {
                    for n in start..start + PER_CHUNK {
                        let body = format!("{}:{}", n % KEYS, n / KEYS);
                        let message =
                            Outgoing::new(queue, body).ordering_key(&format!("k{}", n % KEYS));
                        outbox::enqueue_async(&mut *conn, message).await?;
                    }
                    Ok::<_, InboxError>(())
                })
                .await
                .expect("enqueue a chunk");
                if chunk % 10 == 9 {
                    let backlog = outbox::status_async(&mut *conn).await.expect("status");
                    let enqueued = (chunk + 1) * PER_CHUNK;
                    println!(
                        "{:.0} s, {enqueued} enqueued: {} pending",
                        opened.elapsed().as_secs_f64(),
                        backlog.pending
                    );
                    assert!(
                        backlog.pending as usize <= enqueued / 2,
                        "the relay fell behind with the horizon held: {} of {enqueued} pending",
                        backlog.pending
                    );
                }
            }
        };
        // The producer enqueues 840 messages a second, when the machine
        // lets it (the pace is checked above); the bound is for a relay
        // that stops.
        let consume = rabbit.take(&queue, KEYS * (CHUNKS * PER_CHUNK / KEYS), HOLD * 4);
        let (report, (), got) = tokio::join!(running, produce, async {
            let got = consume.await;
            let _ = stop.send(());
            got
        });
        let report = report.expect("relay");
        // Held for the whole hold, however soon the messages arrived.
        tokio::time::sleep_until((opened + HOLD).into()).await;
        let held = opened.elapsed();
        holder
            .batch_execute("COMMIT")
            .expect("the held transaction");
        println!(
            "the transaction held {:.0} s; the relay published {}",
            held.as_secs_f64(),
            report.published
        );
        assert!(held >= HOLD, "held only {held:?}");
        assert_eq!(got.len(), CHUNKS * PER_CHUNK);
        assert_eq!(report.published, (CHUNKS * PER_CHUNK) as u64);
        let ids: std::collections::HashSet<&str> = got.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids.len(), got.len(), "an id published twice");
        let mut next = [0usize; KEYS];
        for received in &got {
            let body = String::from_utf8(received.body.clone()).expect("utf-8");
            let (key, n) = body.split_once(':').expect("key:n");
            let (key, n): (usize, usize) = (key.parse().expect("key"), n.parse().expect("n"));
            assert_eq!(n, next[key], "key {key} out of order");
            next[key] += 1;
        }
        assert_eq!(pending::<B>(&db), 0);
        rabbit.delete(&queue).await;
    });
}
