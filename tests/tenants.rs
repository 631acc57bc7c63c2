//! Many databases: one relay over a database per tenant
//! (`diesel_inbox::tenants`, `Relay::tenants`). PostgreSQL at
//! `INBOX_TEST_POSTGRES_URL` (set when the tests are built), a superuser
//! role: each test makes its tenants' databases and drops them.
//!
//! The publisher is one of the user's own that records what it is given,
//! with the tenant header: the checks are per tenant, per message (exactly
//! once, in order per key, from its own database), on the database's rows
//! (each tenant's outbox empty at the end) and on the server's own count of
//! the connections to the tenants' databases.
#![cfg(all(feature = "postgres", feature = "relay"))]

mod support;
use support::proxy::{Mode, Proxy};
use support::{on, Server};

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection, RunQueryDsl};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::AsyncPgConnection;
use diesel_inbox::outbox::{self, OutboxMessage, Outgoing, Publish, PublishError, Relay};
use diesel_inbox::tenants::{TenantPool, Tenants, TENANT_HEADER};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type PgPool = Pool<AsyncPgConnection>;

/// Databases made for one test, dropped at its end.
struct Databases {
    server: Server,
    admin: String,
    base: String,
    prefix: String,
    names: Mutex<Vec<String>>,
}

impl Databases {
    fn new(test: &str) -> Databases {
        Databases::on(Server::Postgres, test)
    }

    fn on(server: Server, test: &str) -> Databases {
        let var = server.var();
        let admin = std::env::var(var).unwrap_or_else(|_| panic!("{var}"));
        let (base, _) = admin.rsplit_once('/').expect("a URL with a database");
        Databases {
            server,
            base: base.to_owned(),
            admin,
            prefix: format!("tn_{test}_{}", std::process::id()),
            names: Mutex::new(Vec::new()),
        }
    }

    /// A fresh, migrated database for `tenant`; its URL.
    fn create(&self, tenant: &str) -> String {
        let name = format!("{}_{tenant}", self.prefix);
        let drop = self.server.drop_statement(&name);
        on!(self.server, &self.admin, |admin| {
            admin
                .batch_execute(&drop)
                .expect("drop a database left behind");
            admin
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .expect("a fresh database");
        });
        self.names.lock().expect("names").push(name.clone());
        let url = format!("{}/{name}", self.base);
        on!(self.server, &url, |conn| diesel_inbox::migrate(&mut conn)
            .expect("migrate"));
        url
    }

    /// Connections to this test's databases now, as the server counts them.
    fn connections(&self) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let sql = match self.server {
            Server::Postgres => format!(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname LIKE '{}\\_%'",
                self.prefix
            ),
            #[cfg(feature = "mysql")]
            Server::Mariadb => format!(
                "SELECT CAST(count(*) AS SIGNED) AS n FROM information_schema.PROCESSLIST WHERE DB LIKE '{}\\_%'",
                self.prefix
            ),
        };
        on!(self.server, &self.admin, |admin| {
            diesel::sql_query(&sql)
                .get_result::<Count>(&mut admin)
                .expect("the server's connections")
                .n
        })
    }

    /// Enqueues `n` messages into `url`'s outbox in one transaction, spread
    /// over `keys` ordering keys: payload `tenant:key:seq`, and a tenant
    /// header that claims another tenant (the relay must replace it).
    fn enqueue(&self, url: &str, tenant: &str, n: usize, keys: usize) {
        on!(self.server, url, |conn| {
            conn.transaction(|conn| {
                for seq in 0..n {
                    let key = format!("k{}", seq % keys);
                    let message = Outgoing::new("orders", format!("{tenant}:{key}:{seq}"))
                        .ordering_key(key.as_str())
                        .header(TENANT_HEADER, "someone-else");
                    outbox::enqueue(conn, message)?;
                }
                Ok::<_, diesel_inbox::InboxError>(())
            })
            .expect("enqueue")
        })
    }

    /// Messages left in `url`'s outbox.
    fn pending(&self, url: &str) -> u64 {
        on!(self.server, url, |conn| outbox::status(&mut conn)
            .expect("status")
            .pending)
    }
}

impl Drop for Databases {
    fn drop(&mut self) {
        let names = self.names.lock().map(|n| n.clone()).unwrap_or_default();
        let statements: Vec<String> = names
            .iter()
            .map(|n| self.server.drop_statement(n))
            .collect();
        on!(self.server, &self.admin, |conn| {
            for statement in statements {
                let _ = conn.batch_execute(&statement);
            }
        });
    }
}

/// What the publisher was given: (tenant header, payload), in order.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(String, String)>>>);

impl Publish for Recorder {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut got = self.0.lock().expect("recorder");
        messages
            .iter()
            .map(|m| {
                let tenants: Vec<&str> = m
                    .headers
                    .iter()
                    .filter(|(k, _)| k == TENANT_HEADER)
                    .map(|(_, v)| v.as_str())
                    .collect();
                assert_eq!(tenants.len(), 1, "one tenant header: {:?}", m.headers);
                got.push((
                    tenants[0].to_owned(),
                    String::from_utf8(m.payload.clone()).expect("utf-8"),
                ));
                Ok(())
            })
            .collect()
    }
}

impl Recorder {
    fn got(&self) -> Vec<(String, String)> {
        self.0.lock().expect("recorder").clone()
    }

    /// Waits until `done` holds of what it got, or `limit` passes.
    async fn wait(&self, limit: Duration, done: impl Fn(&[(String, String)]) -> bool) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if done(&self.got()) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        done(&self.got())
    }
}

/// Every message exactly once, from its own tenant, in order per key.
fn check(got: &[(String, String)], expected: &BTreeMap<String, usize>) {
    let mut seen = BTreeSet::new();
    let mut last: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (tenant, payload) in got {
        let mut parts = payload.split(':');
        let (owner, key, seq) = (
            parts.next().expect("tenant"),
            parts.next().expect("key"),
            parts.next().expect("seq").parse::<usize>().expect("seq"),
        );
        assert_eq!(
            tenant, owner,
            "a message of {owner} published as {tenant}'s"
        );
        assert!(seen.insert(payload.clone()), "published twice: {payload}");
        if let Some(before) = last.insert((owner.to_owned(), key.to_owned()), seq) {
            assert!(seq > before, "{payload} after seq {before} of its key");
        }
    }
    for (tenant, n) in expected {
        let published = got.iter().filter(|(t, _)| t == tenant).count();
        assert_eq!(
            published, *n,
            "tenant {tenant}: published {published} of {n}"
        );
    }
}

fn spawn_relay(
    relay: diesel_inbox::outbox::TenantRelay<PgPool, Recorder>,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Result<outbox::RelayReport, outbox::RelayError>>,
) {
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(async move {
        relay
            .run(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
    });
    (stop, running)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// `count` tenant databases on `server`, `each` messages in each over 3
/// keys, one relay whose pools may hold 10 connections in all: each
/// message is published once, as its own tenant's, in order per key; every
/// outbox is empty at the end; the server never saw more than 10
/// connections to those databases, and none once the pools were idle.
fn relay_over_many<T>(server: Server, count: usize, each: usize)
where
    T: TenantPool,
    T::Guard: 'static,
{
    let dbs = Databases::on(server, &format!("many{count}"));
    let urls: Vec<(String, String)> = (0..count)
        .map(|i| {
            let tenant = format!("t{i:03}");
            let url = dbs.create(&tenant);
            dbs.enqueue(&url, &tenant, each, 3);
            (tenant, url)
        })
        .collect();
    let expected: BTreeMap<String, usize> = urls.iter().map(|(t, _)| (t.clone(), each)).collect();
    let tenants: Tenants<T> = Tenants::list(urls.clone())
        .max_connections(10)
        .pool_size(1)
        .idle_timeout(Duration::from_millis(200));
    let recorder = Recorder::default();
    runtime().block_on(async {
        let relay = Relay::tenants(tenants.clone(), recorder.clone())
            .batch_size(10)
            .poll_interval(Duration::from_millis(100));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let watch = async {
            let started = Instant::now();
            let (mut most, mut reserved) = (0, 0);
            while recorder.got().len() < count * each
                && started.elapsed() < Duration::from_secs(120)
            {
                reserved = reserved.max(tenants.reserved_connections());
                most = most.max(dbs.connections());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            stop.send(true).expect("stop");
            (most, reserved)
        };
        let (report, (most, reserved)) = tokio::join!(
            relay.run(async move {
                let _ = stopped.wait_for(|s| *s).await;
            }),
            watch
        );
        let report = report.expect("the relay");
        check(&recorder.got(), &expected);
        assert_eq!(report.published, (count * each) as u64, "{report:?}");
        // The set's own count is exact. The server's lags it: a pool closed
        // to make room for another has its connections closed by the driver
        // at once, and the server lists each until its thread reads the
        // close (on a loaded 2-core machine, MariaDB listed up to 7 more
        // for some 50 ms).
        assert!(
            reserved <= 10,
            "the open pools reserved {reserved} connections"
        );
        assert!(
            most <= 20,
            "the server saw {most} connections to the tenants' databases"
        );
        eprintln!("the server listed at most {most} connections to the tenants' databases");
        assert!(
            most >= 2,
            "the relay worked on several tenants at once (saw {most})"
        );
        for (tenant, url) in &urls {
            assert_eq!(dbs.pending(url), 0, "tenant {tenant}'s outbox");
        }
        // Idle for its timeout, each pool is closed, and its connections
        // with it.
        assert!(tenants.open_pools() > 0);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(tenants.close_idle() > 0);
        assert_eq!(tenants.open_pools(), 0, "idle pools are closed");
        let closed = Instant::now();
        while dbs.connections() > 0 && closed.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(dbs.connections(), 0, "connections left open");
    });
}

#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn one_relay_publishes_a_hundred_postgres_tenants_within_its_connection_limit() {
    relay_over_many::<PgPool>(Server::Postgres, 100, 30);
}

#[cfg(feature = "mysql")]
#[test]
#[cfg_attr(
    not(inbox_test_mysql),
    ignore = "INBOX_TEST_MYSQL_URL was not set when the tests were built: set it to a MySQL or MariaDB database that exists (e.g. mysql://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn one_relay_publishes_twenty_mariadb_tenants_within_its_connection_limit() {
    relay_over_many::<Pool<diesel_async::AsyncMysqlConnection>>(Server::Mariadb, 20, 30);
}

/// A tenant whose database stops answering (blackholed through a proxy)
/// is backed off on its own: the others' messages are published meanwhile,
/// and its own once it answers again. A tenant added while the relay runs
/// is relayed; one removed is not any more (its message stays in its
/// outbox).
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_stalled_tenant_waits_alone_and_tenants_come_and_go_while_the_relay_runs() {
    let dbs = Databases::new("stall");
    let proxy = Proxy::start("127.0.0.1:5432".parse().expect("address")).expect("a proxy");
    let list: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    for tenant in ["a", "b", "c", "gone"] {
        let url = dbs.create(tenant);
        list.lock().expect("list").push((tenant.to_owned(), url));
    }
    let stalled_url = dbs.create("stalled");
    list.lock().expect("list").push((
        "stalled".to_owned(),
        proxy.route(&stalled_url).expect("route"),
    ));
    let late_url = dbs.create("late");
    let url_of = |tenant: &str| {
        list.lock()
            .expect("list")
            .iter()
            .find(|(t, _)| t == tenant)
            .map(|(_, u)| u.clone())
            .expect("a tenant")
    };
    let reading = list.clone();
    let tenants: Tenants<PgPool> = Tenants::from_fn(move || {
        let listed = reading.lock().expect("list").clone();
        async move { Ok(listed) }
    })
    .max_connections(8)
    .pool_size(1)
    .checkout_timeout(Duration::from_secs(1));
    let recorder = Recorder::default();
    runtime().block_on(async {
        let relay = Relay::tenants(tenants.clone(), recorder.clone())
            .poll_interval(Duration::from_millis(100))
            .refresh_interval(Duration::from_millis(200))
            .lease(Duration::from_secs(4));
        let (stop, running) = spawn_relay(relay);
        // The stalled tenant's database stops answering; all enqueue.
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.set(Mode::Blackhole);
        dbs.enqueue(&stalled_url, "stalled", 5, 1);
        for tenant in ["a", "b", "c"] {
            dbs.enqueue(&url_of(tenant), tenant, 20, 2);
        }
        let others = recorder
            .wait(Duration::from_secs(20), |got| {
                got.iter().filter(|(t, _)| t != "stalled").count() == 60
            })
            .await;
        assert!(
            others,
            "the others were published while one tenant stalled: {:?}",
            recorder.got().len()
        );
        assert!(recorder.got().iter().all(|(t, _)| t != "stalled"));

        // It answers again: its messages follow (after its backoff).
        proxy.set(Mode::Forward);
        let caught_up = recorder
            .wait(Duration::from_secs(60), |got| {
                got.iter().filter(|(t, _)| t == "stalled").count() == 5
            })
            .await;
        assert!(
            caught_up,
            "the stalled tenant caught up once its database answered"
        );

        // Tenants come and go.
        dbs.enqueue(&late_url, "late", 7, 1);
        list.lock()
            .expect("list")
            .push(("late".to_owned(), late_url.clone()));
        let gone_url = url_of("gone");
        list.lock().expect("list").retain(|(t, _)| t != "gone");
        let added = recorder
            .wait(Duration::from_secs(20), |got| {
                got.iter().filter(|(t, _)| t == "late").count() == 7
            })
            .await;
        assert!(added, "a tenant added at run time is relayed");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!tenants.contains("gone"), "the refresh removed it");
        dbs.enqueue(&gone_url, "gone", 1, 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.send(true).expect("stop");
        let report = running.await.expect("the relay task").expect("the relay");
        let expected: BTreeMap<String, usize> = [
            ("a", 20),
            ("b", 20),
            ("c", 20),
            ("stalled", 5),
            ("late", 7),
            ("gone", 0),
        ]
        .into_iter()
        .map(|(t, n)| (t.to_owned(), n))
        .collect();
        check(&recorder.got(), &expected);
        assert!(
            report.errors >= 1,
            "the stalled tenant's turns failed: {report:?}"
        );
        assert_eq!(
            dbs.pending(&gone_url),
            1,
            "a removed tenant's outbox is left alone"
        );
        for tenant in ["a", "b", "c", "stalled", "late"] {
            let url = if tenant == "stalled" {
                stalled_url.clone()
            } else if tenant == "late" {
                late_url.clone()
            } else {
                url_of(tenant)
            };
            assert_eq!(dbs.pending(&url), 0, "tenant {tenant}'s outbox");
        }
    });
}

/// A tenant with a backlog takes turns with the others: one with ten
/// messages, enqueued behind 5,000 of another's, is published within the
/// first turns, not after the backlog.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_backlog_does_not_starve_a_small_tenant() {
    let dbs = Databases::new("fair");
    let big = dbs.create("big");
    let small = dbs.create("small");
    dbs.enqueue(&big, "big", 5_000, 50);
    dbs.enqueue(&small, "small", 10, 1);
    let tenants: Tenants<PgPool> =
        Tenants::list([("big", big.clone()), ("small", small.clone())]).pool_size(1);
    let recorder = Recorder::default();
    runtime().block_on(async {
        // One turn at a time, so that the order is the scheduler's alone.
        let relay = Relay::tenants(tenants, recorder.clone())
            .batch_size(50)
            .concurrency(1);
        let (stop, running) = spawn_relay(relay);
        let small_done = recorder
            .wait(Duration::from_secs(60), |got| {
                got.iter().filter(|(t, _)| t == "small").count() == 10
            })
            .await;
        assert!(small_done, "the small tenant was published");
        let big_by_then = recorder.got().iter().filter(|(t, _)| t == "big").count();
        assert!(
            big_by_then <= 500,
            "the small tenant waited for {big_by_then} of the big one's messages"
        );
        recorder
            .wait(Duration::from_secs(120), |got| got.len() == 5_010)
            .await;
        stop.send(true).expect("stop");
        running.await.expect("the relay task").expect("the relay");
        let expected: BTreeMap<String, usize> =
            [("big".to_owned(), 5_000), ("small".to_owned(), 10)]
                .into_iter()
                .collect();
        check(&recorder.got(), &expected);
        assert_eq!(dbs.pending(&big), 0);
    });
}

/// The chain A -> relay -> RabbitMQ -> B, per tenant: each tenant's outbox
/// in A is published by one relay over all of them, and a runner over B's
/// tenants (`run_tenants`) applies each message in the B database of the
/// tenant its `x-tenant` names, in an `#[idempotent]`-style claim there.
/// A tenant added to B's list after B's set was read is found (the runner
/// reads the list again before it calls a tenant unknown). A tenant B does
/// not have, and a message that names none, are dead-lettered and applied
/// nowhere; no row lands in another tenant's database.
#[cfg(feature = "lapin")]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_runner_over_tenants_applies_each_message_in_its_own_tenants_database() {
    use diesel_inbox::brokers::{Message, Policy};
    use diesel_inbox::{Inbox, InboxError};
    let Some(amqp) = std::env::var("INBOX_TEST_AMQP_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!("SKIPPED: INBOX_TEST_AMQP_URL is not set");
        return;
    };
    const EACH: usize = 20;
    let dbs = Databases::new("chain");
    let names = ["acme", "globex", "initech"];
    let a: Vec<(String, String)> = names
        .iter()
        .map(|n| (n.to_string(), dbs.create(&format!("a_{n}"))))
        .collect();
    // B has no initech: its messages must be dead-lettered.
    let b: Vec<(String, String)> = names[..2]
        .iter()
        .map(|n| {
            let url = dbs.create(&format!("b_{n}"));
            PgConnection::establish(&url)
                .expect("B")
                .batch_execute("CREATE TABLE orders (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, payload TEXT NOT NULL)")
                .expect("orders");
            (n.to_string(), url)
        })
        .collect();
    let queue = format!("{}_queue", dbs.prefix);
    for (tenant, url) in &a {
        on!(Server::Postgres, url.as_str(), |conn| {
            conn.transaction(|conn| {
                for seq in 0..EACH {
                    outbox::enqueue(
                        conn,
                        Outgoing::new(queue.as_str(), format!("{tenant}:{seq}"))
                            .ordering_key(tenant.as_str()),
                    )?;
                }
                Ok::<_, InboxError>(())
            })
            .expect("enqueue")
        });
    }
    // B's set is read from a list that has only acme when it is first
    // read; globex is added after: the runner reads the list again when
    // a message names a tenant it does not know.
    let b_list = Arc::new(Mutex::new(vec![b[0].clone()]));
    let reading = b_list.clone();
    let b_tenants: Tenants<PgPool> = Tenants::from_fn(move || {
        let listed = reading.lock().expect("list").clone();
        async move { Ok(listed) }
    })
    .pool_size(2);
    runtime().block_on(async {
        b_tenants.refresh().await.expect("B's tenants");
        assert!(!b_tenants.contains("globex"));
        b_list.lock().expect("list").push(b[1].clone());
        let (_connection, channel) = support::rabbit_queue(&amqp, &queue).await;
        let relay = Relay::tenants(
            Tenants::<PgPool>::list(a.clone()),
            outbox::lapin::Publisher::connect(amqp.clone(), ""),
        );
        let report = relay.run_once().await.expect("the relay");
        assert_eq!(report.published, (3 * EACH) as u64, "{report:?}");
        // A message that names no tenant.
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                lapin::options::BasicPublishOptions::default(),
                b"nobody:0",
                lapin::BasicProperties::default().with_message_id("no-tenant".into()),
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
        let handler = async |conn: &mut AsyncPgConnection, m: &Message<'_>| {
            let tenant = String::from_utf8(m.header(TENANT_HEADER).expect("routed by it").to_vec())
                .expect("utf-8");
            let payload = String::from_utf8(m.body().to_vec()).expect("utf-8");
            let id = m.id().to_owned();
            Inbox::consumer("orders")
                .run_async(conn, m.id(), async move |conn: &mut AsyncPgConnection| {
                    let insert = diesel::sql_query(
                        "INSERT INTO orders (id, tenant, payload) VALUES ($1, $2, $3)",
                    )
                    .bind::<diesel::sql_types::Text, _>(&id)
                    .bind::<diesel::sql_types::Text, _>(&tenant)
                    .bind::<diesel::sql_types::Text, _>(&payload);
                    diesel_async::RunQueryDsl::execute(insert, conn).await?;
                    Ok::<_, InboxError>(())
                })
                .await
        };
        let ran = tokio::time::timeout(
            Duration::from_secs(60),
            diesel_inbox::lapin::Consumer::connect(
                amqp.clone(),
                queue.clone(),
                Policy::new(|_: &InboxError| false),
            )
            .exit_when_idle(Duration::from_millis(500))
            .run_tenants(&b_tenants, handler, std::future::pending()),
        )
        .await
        .expect("the runner drained the queue")
        .expect("the runner");
        assert_eq!(ran.acked, (2 * EACH) as u64, "{ran:?}");
        assert_eq!(
            ran.dead_lettered,
            (EACH + 1) as u64,
            "initech's and the one without a tenant: {ran:?}"
        );
        let _ = channel
            .queue_delete(
                queue.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
    });
    #[derive(diesel::QueryableByName)]
    struct Order {
        #[diesel(sql_type = diesel::sql_types::Text)]
        tenant: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        payload: String,
    }
    for (tenant, url) in &b {
        let mut conn = PgConnection::establish(url).expect("B");
        let orders: Vec<Order> = diesel::sql_query("SELECT tenant, payload FROM orders")
            .load(&mut conn)
            .expect("orders");
        assert_eq!(orders.len(), EACH, "tenant {tenant}");
        for order in &orders {
            assert_eq!(
                &order.tenant, tenant,
                "a row of {} in {tenant}'s database",
                order.tenant
            );
            assert!(
                order.payload.starts_with(&format!("{tenant}:")),
                "{}",
                order.payload
            );
        }
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let claimed =
            diesel::sql_query("SELECT count(*) AS n FROM inbox_messages WHERE consumer = 'orders'")
                .get_result::<Count>(&mut conn)
                .expect("inbox rows")
                .n;
        assert_eq!(claimed, EACH as i64, "tenant {tenant}'s inbox rows");
    }
    for (tenant, url) in &a {
        assert_eq!(dbs.pending(url), 0, "tenant {tenant}'s outbox in A");
    }
}

/// A tenant whose database stops answering mid-delivery: the handler has
/// its connection, then the proxy in front of that database drops what it
/// is sent, so the connection never answers again. The handler is dropped
/// at `tenant_timeout` and its connection closed, not given back (the
/// server sees its session end at once); the other tenant's messages are
/// applied meanwhile; the delivery is redelivered and applied exactly once
/// on a new connection when the database answers again. Without the
/// timeout it would wait on the dead connection for good.
#[cfg(feature = "lapin")]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_tenant_that_hangs_mid_delivery_is_dropped_at_its_timeout_and_applied_once_back() {
    use diesel_inbox::brokers::{Message, Policy};
    use diesel_inbox::{Inbox, InboxError};
    use lapin::types::{AMQPValue, FieldTable};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(amqp) = std::env::var("INBOX_TEST_AMQP_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!("SKIPPED: INBOX_TEST_AMQP_URL is not set");
        return;
    };
    const OK: usize = 10;
    const TIMEOUT: Duration = Duration::from_secs(2);
    let dbs = Databases::new("hang");
    let proxy = Proxy::start("127.0.0.1:5432".parse().expect("address")).expect("a proxy");
    let direct: Vec<(&str, String)> = ["hung", "ok"]
        .into_iter()
        .map(|tenant| {
            let url = dbs.create(tenant);
            PgConnection::establish(&url)
                .expect("B")
                .batch_execute("CREATE TABLE orders (id TEXT PRIMARY KEY, tenant TEXT NOT NULL)")
                .expect("orders");
            (tenant, url)
        })
        .collect();
    let tenants: Tenants<PgPool> = Tenants::list([
        ("hung", proxy.route(&direct[0].1).expect("route")),
        ("ok", direct[1].1.clone()),
    ])
    .pool_size(1)
    .checkout_timeout(Duration::from_secs(1));
    let count = |url: &str, sql: &str| -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let mut conn = PgConnection::establish(url).expect("B");
        diesel::sql_query(sql)
            .get_result::<Count>(&mut conn)
            .expect("count")
            .n
    };
    let orders = |url: &str| count(url, "SELECT count(*) AS n FROM orders");
    // The hung tenant's sessions, as its server sees them.
    let hung_sessions = || {
        count(
            &dbs.admin,
            &format!(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = '{}_hung'",
                dbs.prefix
            ),
        )
    };
    let queue = format!("{}_queue", dbs.prefix);
    let hung_entries = AtomicUsize::new(0);
    let first_hung: Mutex<Option<Instant>> = Mutex::new(None);
    runtime().block_on(async {
        let (_connection, channel) = support::rabbit_queue(&amqp, &queue).await;
        let publish = |tenant: &'static str, id: String| {
            let channel = channel.clone();
            let queue = queue.clone();
            async move {
                let mut headers = FieldTable::default();
                headers.insert(TENANT_HEADER.into(), AMQPValue::LongString(tenant.into()));
                channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        lapin::options::BasicPublishOptions::default(),
                        b"",
                        lapin::BasicProperties::default()
                            .with_message_id(id.into())
                            .with_headers(headers),
                    )
                    .await
                    .expect("publish")
                    .await
                    .expect("confirm");
            }
        };
        publish("hung", "hung-0".into()).await;
        let handler = async |conn: &mut AsyncPgConnection, m: &Message<'_>| {
            let tenant = String::from_utf8(m.header(TENANT_HEADER).expect("routed by it").to_vec())
                .expect("utf-8");
            if tenant == "hung" && hung_entries.fetch_add(1, Ordering::SeqCst) == 0 {
                // It has its connection: now its database stops answering.
                diesel_async::RunQueryDsl::execute(diesel::sql_query("SELECT 1"), &mut *conn)
                    .await
                    .expect("it answered before");
                proxy.set(Mode::Blackhole);
                *first_hung.lock().expect("not poisoned") = Some(Instant::now());
            }
            let id = m.id().to_owned();
            Inbox::consumer("orders")
                .run_async(conn, m.id(), async move |conn: &mut AsyncPgConnection| {
                    let insert =
                        diesel::sql_query("INSERT INTO orders (id, tenant) VALUES ($1, $2)")
                            .bind::<diesel::sql_types::Text, _>(&id)
                            .bind::<diesel::sql_types::Text, _>(&tenant);
                    diesel_async::RunQueryDsl::execute(insert, conn).await?;
                    Ok::<_, InboxError>(())
                })
                .await
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // The retry waits 10 to 20 s: the dropped connection's session
        // must end before it, not when a later checkout finds it broken.
        let consumer = diesel_inbox::lapin::Consumer::connect(
            amqp.clone(),
            queue.clone(),
            Policy::new(|_: &InboxError| false).retry_delay(Duration::from_secs(20)),
        )
        .in_flight(2)
        .tenant_timeout(TIMEOUT);
        let runner = consumer.run_tenants(&tenants, handler, async {
            let _ = stopped.await;
        });
        let check = async {
            // The hung delivery has started; the other tenant's messages
            // are published behind it.
            let deadline = Instant::now() + Duration::from_secs(30);
            while first_hung.lock().expect("not poisoned").is_none() {
                assert!(
                    Instant::now() < deadline,
                    "the hung tenant's delivery never started"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for seq in 0..OK {
                publish("ok", format!("ok-{seq}")).await;
            }
            let deadline = Instant::now() + Duration::from_secs(40);
            while orders(&direct[1].1) < OK as i64 {
                assert!(
                    Instant::now() < deadline,
                    "the ok tenant's messages: {} of {OK} applied",
                    orders(&direct[1].1)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // Past the timeout, and before the retry, the dropped
            // handler's connection was closed, not kept in the pool: its
            // server session ended (the proxy closes a connection its
            // client closed).
            let hung_at = first_hung.lock().expect("not poisoned").expect("started");
            tokio::time::sleep_until((hung_at + TIMEOUT).into()).await;
            let deadline = hung_at + TIMEOUT + Duration::from_secs(8);
            while hung_sessions() > 0 {
                assert!(
                    Instant::now() < deadline,
                    "the timed-out delivery's connection still has a session on its server"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(orders(&direct[0].1), 0);
            // Its database answers again: its message is applied, on a
            // new connection.
            proxy.set(Mode::Forward);
            let deadline = Instant::now() + Duration::from_secs(60);
            while orders(&direct[0].1) < 1 {
                assert!(
                    Instant::now() < deadline,
                    "the hung tenant's message was not applied once its database answered"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // A redelivery after this one would be a duplicate, not applied.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let _ = stop.send(());
        };
        let (ran, ()) = tokio::join!(runner, check);
        let ran = ran.expect("the runner");
        assert!(
            ran.retried >= 1,
            "the hung delivery was given back: {ran:?}"
        );
        assert_eq!(ran.dead_lettered, 0, "{ran:?}");
        let _ = channel
            .queue_delete(
                queue.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
    });
    assert!(
        hung_entries.into_inner() >= 2,
        "the hung message was handled again"
    );
    for (tenant, url) in &direct {
        let want = if *tenant == "hung" { 1 } else { OK as i64 };
        assert_eq!(orders(url), want, "tenant {tenant}'s orders");
        assert_eq!(
            count(url, "SELECT count(*) AS n FROM inbox_messages"),
            want,
            "tenant {tenant}'s inbox rows"
        );
    }
}

/// A checkout dropped while it waits (a handler's deadline, a turn's bound)
/// leaves its tenant's pool idle: with room for one pool, a stalled
/// tenant's abandoned checkout does not keep the others out; and the
/// limit's settings stay fixed once a pool was opened.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_dropped_checkout_leaves_the_pool_to_be_closed() {
    let dbs = Databases::new("dropped");
    let proxy = Proxy::start("127.0.0.1:5432".parse().expect("address")).expect("a proxy");
    let stalled = proxy.route(&dbs.create("stalled")).expect("route");
    let ok = dbs.create("ok");
    proxy.set(Mode::Blackhole);
    let tenants: Tenants<PgPool> = Tenants::list([("stalled", stalled), ("ok", ok)])
        .max_connections(1)
        .pool_size(1)
        .checkout_timeout(Duration::from_secs(5));
    runtime().block_on(async {
        for _ in 0..3 {
            let dropped =
                tokio::time::timeout(Duration::from_millis(200), tenants.connection("stalled"))
                    .await;
            assert!(dropped.is_err(), "the stalled tenant's checkout waits");
            let mut conn = tenants
                .connection("ok")
                .await
                .expect("the other tenant's connection, in the stalled one's place");
            diesel_inbox::outbox::status_async(&mut *conn)
                .await
                .expect("its database");
        }
        assert_eq!(tenants.reserved_connections(), 1);
        // Too late to change the limit: kept as it was.
        let tenants = tenants.clone().max_connections(5);
        assert_eq!(tenants.reserved_connections(), 1);
        assert!(matches!(
            tokio::time::timeout(Duration::from_secs(10), async {
                let _held = tenants.connection("ok").await.expect("ok");
                tenants.clone().checkout_timeout(Duration::from_millis(300));
                tenants.connection("stalled").await
            })
            .await,
            Ok(Err(diesel_inbox::tenants::TenantError::Exhausted { .. }))
        ));
    });
}

/// A schema per tenant in one PostgreSQL database: each tenant's URL
/// selects its schema (`options=-csearch_path=...`), `migrate` makes the
/// tables there, and one relay over them publishes each schema's outbox as
/// its tenant's, leaving the other schema's rows alone.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_schema_per_tenant_is_relayed_as_its_own_tenant() {
    let dbs = Databases::new("schemas");
    let shared = dbs.create("shared");
    let mut admin = PgConnection::establish(&shared).expect("the shared database");
    let urls: Vec<(String, String)> = ["acme", "globex"]
        .iter()
        .map(|tenant| {
            admin
                .batch_execute(&format!("CREATE SCHEMA {tenant}"))
                .expect("a schema");
            let url = format!("{shared}?options=-csearch_path%3D{tenant}");
            diesel_inbox::migrate(&mut PgConnection::establish(&url).expect("the tenant's schema"))
                .expect("migrate in the schema");
            (tenant.to_string(), url)
        })
        .collect();
    dbs.enqueue(&urls[0].1, "acme", 12, 2);
    dbs.enqueue(&urls[1].1, "globex", 5, 1);
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut rows = |schema: &str| {
        diesel::sql_query(format!(
            "SELECT count(*) AS n FROM {schema}.outbox_messages"
        ))
        .get_result::<Count>(&mut admin)
        .expect("the schema's outbox")
        .n
    };
    assert_eq!(
        (rows("acme"), rows("globex")),
        (12, 5),
        "each schema's own outbox"
    );
    let recorder = Recorder::default();
    runtime().block_on(async {
        let report = Relay::tenants(Tenants::<PgPool>::list(urls.clone()), recorder.clone())
            .run_once()
            .await
            .expect("the relay");
        assert_eq!(report.published, 17, "{report:?}");
    });
    let expected: BTreeMap<String, usize> = [("acme".to_owned(), 12), ("globex".to_owned(), 5)]
        .into_iter()
        .collect();
    check(&recorder.got(), &expected);
    assert_eq!((rows("acme"), rows("globex")), (0, 0));
}

/// Wake-ups per tenant database (PostgreSQL's NOTIFY): a relay that polls
/// every 300 s and listens on 2 of 3 tenant databases publishes an enqueue
/// of another connection into either listened database within 2 s, while
/// the third's enqueue, committed first, waits for its poll (a
/// notification wakes its own tenant only). The listeners' connections
/// count in the set's limit of 6 (3 pools of 2 and 2 listeners would be
/// 8: the server never sees more than 6), and are given back when the
/// relay stops.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn listened_tenants_are_woken_by_their_own_databases_notifications() {
    let dbs = Databases::new("listen");
    let urls: BTreeMap<String, String> = ["a", "b", "c"]
        .iter()
        .map(|tenant| (tenant.to_string(), dbs.create(tenant)))
        .collect();
    // The relay sleeps in a database while its listener there holds the
    // advisory lock that makes enqueues notify.
    let asleep = |tenant: &str| {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        on!(Server::Postgres, &urls[tenant], |conn| {
            // pg_advisory_lock_shared(1684627297, the outbox's oid).
            diesel::sql_query(
                "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND mode = 'ShareLock' AND classid = 1684627297 AND objsubid = 2 \
                 AND objid = CAST(CAST('outbox_messages' AS regclass) AS oid) \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .get_result::<Count>(&mut conn)
            .expect("the locks")
            .n > 0
        })
    };
    let recorder = Recorder::default();
    let tenants = Tenants::<PgPool>::list(urls.clone())
        .max_connections(6)
        .pool_size(2);
    let relay = Relay::tenants(tenants.clone(), recorder.clone())
        .poll_interval(Duration::from_secs(300))
        .listeners(2);
    let rt = runtime();
    let (stop, running) = rt.block_on(async { spawn_relay(relay) });
    // Which two are listened: the first two whose turn ended.
    let started = Instant::now();
    let listened: Vec<&str> = loop {
        let listened: Vec<&str> = ["a", "b", "c"].into_iter().filter(|t| asleep(t)).collect();
        if listened.len() == 2 {
            break listened;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "two tenants' relays asleep and listening, got {listened:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let polled = ["a", "b", "c"]
        .into_iter()
        .find(|t| !listened.contains(t))
        .expect("a third");
    let mut most = dbs.connections();
    let published = |tenant: &str| recorder.got().iter().filter(|(t, _)| t == tenant).count();
    dbs.enqueue(&urls[polled], polled, 2, 1);
    for tenant in &listened {
        // Asleep, so that only its notification wakes it.
        let mut watcher = PgConnection::establish(&urls[*tenant]).expect("the tenant's database");
        support::relay::wait_until_asleep(&mut watcher, Duration::from_secs(60));
        dbs.enqueue(&urls[*tenant], tenant, 3, 1);
        let at = Instant::now();
        while published(tenant) < 3 && at.elapsed() < Duration::from_secs(2) {
            most = most.max(dbs.connections());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            published(tenant),
            3,
            "tenant {tenant}, listened, published within 2 s of its commit"
        );
    }
    assert_eq!(
        published(polled),
        0,
        "tenant {polled}, not listened, waits for its poll"
    );
    most = most.max(dbs.connections());
    assert!(
        most <= 6,
        "{most} connections to the tenants' databases, over the limit of 6"
    );
    rt.block_on(async {
        stop.send(true).expect("stop");
        running.await.expect("joined").expect("the relay");
    });
    // The listeners' connections closed; the pools' are theirs to keep.
    assert_eq!(
        tenants.reserved_connections(),
        tenants.open_pools() as u32 * 2,
        "no connection kept outside the pools once the relay stopped"
    );
    let expected: BTreeMap<String, usize> = listened.iter().map(|t| (t.to_string(), 3)).collect();
    check(&recorder.got(), &expected);
}

/// Behind a proxy in transaction mode (PgBouncer) no notification reaches
/// a listener: that tenant polls (said at WARN), and its place goes to the
/// next tenant whose turn ends. Here the relay may listen on one database;
/// the proxied tenant takes the place first, then a tenant reached
/// directly is added: it is listened to (its relay's lock held in its
/// database, which it could not be if the proxied tenant kept the place),
/// and both tenants' messages are published, the proxied one's at its
/// polls.
#[test]
#[cfg_attr(
    not(all(inbox_test_postgres, inbox_test_pgbouncer)),
    ignore = "INBOX_TEST_POSTGRES_URL and INBOX_TEST_PGBOUNCER_URL were not set when the tests were built (bash scripts/pgbouncer.sh start; url)"
)]
fn a_tenant_behind_a_transaction_mode_proxy_polls_and_leaves_its_place_to_another() {
    let dbs = Databases::new("deaf");
    let bouncer = std::env::var("INBOX_TEST_PGBOUNCER_URL").expect("INBOX_TEST_PGBOUNCER_URL");
    let (bouncer_base, _) = bouncer.rsplit_once('/').expect("a URL with a database");
    let proxied_direct = dbs.create("proxied");
    let (_, proxied_db) = proxied_direct.rsplit_once('/').expect("a database");
    let proxied = format!("{bouncer_base}/{proxied_db}");
    let direct = dbs.create("direct");
    let recorder = Recorder::default();
    let tenants = Tenants::<PgPool>::list([("proxied", proxied.clone())])
        .max_connections(6)
        .pool_size(2);
    let relay = Relay::tenants(tenants.clone(), recorder.clone())
        .poll_interval(Duration::from_secs(3))
        .refresh_interval(Duration::from_millis(100))
        .listeners(1);
    let rt = runtime();
    let (stop, running) = rt.block_on(async { spawn_relay(relay) });
    // The proxied tenant's first turn, then its listener's probe (2 s).
    std::thread::sleep(Duration::from_secs(4));
    tenants.insert("direct", direct.clone());
    let mut watcher = PgConnection::establish(&direct).expect("the direct database");
    support::relay::wait_until_asleep(&mut watcher, Duration::from_secs(30));
    let published = |tenant: &str| recorder.got().iter().filter(|(t, _)| t == tenant).count();
    dbs.enqueue(&direct, "direct", 3, 1);
    dbs.enqueue(&proxied, "proxied", 2, 1);
    let at = Instant::now();
    while published("direct") < 3 && at.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(published("direct"), 3, "the direct tenant's messages");
    while published("proxied") < 2 && at.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(published("proxied"), 2, "the proxied tenant's, at its poll");
    rt.block_on(async {
        stop.send(true).expect("stop");
        running.await.expect("joined").expect("the relay");
    });
    let expected: BTreeMap<String, usize> = [("direct".to_owned(), 3), ("proxied".to_owned(), 2)]
        .into_iter()
        .collect();
    check(&recorder.got(), &expected);
}

/// The chain per tenant under crashes: the relay over A's tenants and the
/// runner over B's are aborted mid-run (their futures dropped, as a crash
/// leaves them: claimed rows held until their lease ends, deliveries
/// unacked) and started again, and a tenant is added to both sides while
/// they run. Every message is applied exactly once, in its own tenant's B
/// database.
#[cfg(feature = "lapin")]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn the_chain_over_tenants_survives_aborted_relays_and_runners() {
    use diesel_inbox::brokers::{Message, Policy};
    use diesel_inbox::{Inbox, InboxError};
    let Some(amqp) = std::env::var("INBOX_TEST_AMQP_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!("SKIPPED: INBOX_TEST_AMQP_URL is not set");
        return;
    };
    let dbs = Databases::new("crash");
    let queue = format!("{}_queue", dbs.prefix);
    let side = |prefix: &str, names: &[&str]| -> Vec<(String, String)> {
        names
            .iter()
            .map(|n| {
                let url = dbs.create(&format!("{prefix}_{n}"));
                PgConnection::establish(&url)
                    .expect("a tenant")
                    .batch_execute(
                        "CREATE TABLE applied (payload TEXT NOT NULL, tenant TEXT NOT NULL)",
                    )
                    .expect("applied");
                (n.to_string(), url)
            })
            .collect()
    };
    let a = side("a", &["acme", "globex", "initech"]);
    let b = side("b", &["acme", "globex", "initech"]);
    let fill = |url: &str, tenant: &str, n: usize| {
        on!(Server::Postgres, url, |conn| {
            conn.transaction(|conn| {
                for seq in 0..n {
                    let key = format!("k{}", seq % 4);
                    outbox::enqueue(
                        conn,
                        Outgoing::new(queue.as_str(), format!("{tenant}:{key}:{seq}"))
                            .ordering_key(key.as_str()),
                    )?;
                }
                Ok::<_, InboxError>(())
            })
            .expect("enqueue")
        })
    };
    fill(&a[0].1, "acme", 300);
    fill(&a[1].1, "globex", 300);
    fill(&a[2].1, "initech", 100);
    // initech joins both sides later.
    let a_set: Tenants<PgPool> = Tenants::list(a[..2].to_vec()).pool_size(1);
    let b_set: Tenants<PgPool> = Tenants::list(b[..2].to_vec()).pool_size(2);
    let applied = |url: &str| -> Vec<(String, String)> {
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            payload: String,
            #[diesel(sql_type = diesel::sql_types::Text)]
            tenant: String,
        }
        diesel::sql_query("SELECT payload, tenant FROM applied")
            .load::<Row>(&mut PgConnection::establish(url).expect("B"))
            .expect("applied")
            .into_iter()
            .map(|r| (r.tenant, r.payload))
            .collect()
    };
    let total = || b.iter().map(|(_, url)| applied(url).len()).sum::<usize>();
    runtime().block_on(async {
        let (_connection, _channel) = support::rabbit_queue(&amqp, &queue).await;
        let relay = |set: Tenants<PgPool>| {
            let amqp = amqp.clone();
            tokio::spawn(async move {
                Relay::tenants(set, outbox::lapin::Publisher::connect(amqp, ""))
                    .batch_size(10)
                    .lease(Duration::from_secs(2))
                    .poll_interval(Duration::from_millis(50))
                    .refresh_interval(Duration::from_millis(100))
                    .run(std::future::pending())
                    .await
            })
        };
        // The runner is dropped in place (its future is not `Send`, so it
        // runs on this task, beside the driver).
        let runner = |set: Tenants<PgPool>| {
            let (amqp, queue) = (amqp.clone(), queue.clone());
            async move {
                let handler = async |conn: &mut AsyncPgConnection, m: &Message<'_>| {
                    let tenant =
                        String::from_utf8(m.header(TENANT_HEADER).expect("a tenant").to_vec())
                            .expect("utf-8");
                    let payload = String::from_utf8(m.body().to_vec()).expect("utf-8");
                    Inbox::consumer("apply")
                        .run_async(conn, m.id(), async move |conn: &mut AsyncPgConnection| {
                            let insert = diesel::sql_query(
                                "INSERT INTO applied (payload, tenant) VALUES ($1, $2)",
                            )
                            .bind::<diesel::sql_types::Text, _>(&payload)
                            .bind::<diesel::sql_types::Text, _>(&tenant);
                            diesel_async::RunQueryDsl::execute(insert, conn).await?;
                            Ok::<_, InboxError>(())
                        })
                        .await
                };
                diesel_inbox::lapin::Consumer::connect(
                    amqp,
                    queue,
                    Policy::new(|_: &InboxError| false),
                )
                .in_flight(4)
                .run_tenants(&set, handler, std::future::pending())
                .await
            }
        };
        let (crash, done) = (tokio::sync::Notify::new(), tokio::sync::Notify::new());
        let runners = async {
            tokio::select! {
                ran = runner(b_set.clone()) => panic!("the runner stopped: {ran:?}"),
                () = crash.notified() => {}
            }
            // A tenant joins both sides while they run.
            b_set.insert("initech", b[2].1.clone());
            a_set.insert("initech", a[2].1.clone());
            tokio::select! {
                ran = runner(b_set.clone()) => panic!("the runner stopped: {ran:?}"),
                () = done.notified() => {}
            }
        };
        let driver = async {
            let relay_1 = relay(a_set.clone());
            let started = Instant::now();
            while total() < 100 && started.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Crashes, one after the other.
            relay_1.abort();
            let relay_2 = relay(a_set.clone());
            tokio::time::sleep(Duration::from_millis(300)).await;
            crash.notify_one();
            let started = Instant::now();
            while total() < 700 && started.elapsed() < Duration::from_secs(90) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            relay_2.abort();
            done.notify_one();
        };
        tokio::join!(runners, driver);
    });
    for (tenant, url) in &b {
        let rows = applied(url);
        let expected = if tenant == "initech" { 100 } else { 300 };
        let distinct: BTreeSet<&String> = rows.iter().map(|(_, p)| p).collect();
        assert_eq!(
            distinct.len(),
            expected,
            "tenant {tenant}: each message applied"
        );
        assert_eq!(rows.len(), expected, "tenant {tenant}: none applied twice");
        for (owner, payload) in &rows {
            assert_eq!(owner, tenant, "{payload} in {tenant}'s database");
            assert!(
                payload.starts_with(&format!("{tenant}:")),
                "{payload} in {tenant}'s database"
            );
        }
    }
}

/// Serves `app` on a loopback port of its own (in the background); its
/// address.
#[cfg(feature = "console")]
async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
    });
    addr
}

/// A request over TCP to the console at `addr`: the status and the body.
#[cfg(feature = "console")]
async fn http_get(addr: std::net::SocketAddr, path: &str, host: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the console");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("the request");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("the answer");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    (status, body)
}

/// The console over 28 tenant databases, served over TCP: the tenants'
/// overview shows a page of 25 with each tenant's counts, and their
/// consumers and outbox destinations with a tenant column, each from its
/// own database; a tenant whose database hangs (blackholed) shows why,
/// within the time limit, and the others show; the filter and the second
/// page select; each tenant's own console answers under
/// `/tenants/NAME/`; an unknown tenant is `404`, a bad page `400`, and a
/// foreign `Host` `421`.
#[cfg(feature = "console")]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn the_console_shows_every_tenant_and_each_tenants_own_pages() {
    use diesel_inbox::console::{self, ConsoleExt};

    #[diesel_inbox::idempotent(key = "id", consumer = "billing")]
    fn record(conn: &mut PgConnection, id: &str) -> diesel::QueryResult<()> {
        let _ = (conn, id);
        Ok(())
    }

    let dbs = Databases::new("console");
    let proxy = Proxy::start("127.0.0.1:5432".parse().expect("address")).expect("a proxy");
    let mut list = Vec::new();
    let acme = dbs.create("acme");
    dbs.enqueue(&acme, "acme", 3, 1);
    list.push(("acme".to_owned(), acme));
    let globex = dbs.create("globex");
    {
        let mut conn = PgConnection::establish(&globex).expect("globex");
        for id in ["g1", "g2"] {
            assert!(record(&mut conn, id).expect("a claim").is_applied());
        }
    }
    list.push(("globex".to_owned(), globex));
    let hung = dbs.create("hung");
    list.push(("hung".to_owned(), proxy.route(&hung).expect("route")));
    for n in 0..25 {
        let name = format!("p{n:02}");
        let url = dbs.create(&name);
        list.push((name, url));
    }
    proxy.set(Mode::Blackhole);
    let tenants: Tenants<PgPool> = Tenants::list(list)
        .max_connections(60)
        .pool_size(1)
        .checkout_timeout(Duration::from_secs(1));
    runtime().block_on(async {
        let app = axum::Router::new().nest("/ops", console::tenants(tenants).max_attempts(3));
        let addr = serve(app).await;

        let started = Instant::now();
        let (status, page) = http_get(addr, "/ops", "localhost").await;
        let took = started.elapsed();
        assert_eq!(status, 200, "{page}");
        assert!(
            took < console::QUERY_TIME_LIMIT + Duration::from_secs(5),
            "a hung tenant holds the page at most the time limit: {took:?}"
        );
        assert!(page.contains("28 tenants match; page 1 of 2"), "{page}");
        let row = |page: &str, tenant: &str| -> String {
            let start = page
                .find(&format!("<tr data-tenant=\"{tenant}\""))
                .unwrap_or_else(|| panic!("a row of {tenant}: {page}"));
            page[start..]
                .split("</tr>")
                .next()
                .expect("a row")
                .to_owned()
        };
        let acme_row = row(&page, "acme");
        assert!(
            acme_row.contains("<td class=\"n pending\">3</td>"),
            "{acme_row}"
        );
        assert!(
            acme_row.contains("href=\"/ops/tenants/acme/\""),
            "{acme_row}"
        );
        let globex_row = row(&page, "globex");
        assert!(
            globex_row.contains("<td class=\"n rows\">2</td>"),
            "{globex_row}"
        );
        assert!(
            globex_row.contains("<td class=\"n pending\">0</td>"),
            "{globex_row}"
        );
        let hung_row = row(&page, "hung");
        assert!(
            hung_row.contains("class=\"unavailable\"")
                && hung_row.contains("unavailable: no connection")
                && hung_row.contains("gave no connection in 1s"),
            "{hung_row}"
        );
        assert!(page.contains("data-tenant=\"globex\" data-consumer=\"billing\""));
        assert!(!page.contains("data-tenant=\"acme\" data-consumer="));
        assert!(page.contains("data-tenant=\"acme\" data-destination=\"orders\""));
        assert!(!page.contains("data-tenant=\"globex\" data-destination="));
        assert!(page.contains("data-tenant=\"p21\""));
        assert!(!page.contains("data-tenant=\"p22\""), "25 to a page");

        let (status, second) = http_get(addr, "/ops/overview?page=2", "localhost").await;
        assert_eq!(status, 200);
        assert!(second.contains("page 2 of 2"), "{second}");
        for tenant in ["p22", "p23", "p24"] {
            assert!(
                second.contains(&format!("data-tenant=\"{tenant}\"")),
                "{second}"
            );
        }
        assert!(!second.contains("data-tenant=\"acme\""));

        let (status, filtered) = http_get(addr, "/ops/overview?tenant=GLO", "localhost").await;
        assert_eq!(status, 200);
        assert!(
            filtered.contains("1 tenant match; page 1 of 1"),
            "{filtered}"
        );
        assert!(filtered.contains("data-tenant=\"globex\""));
        assert!(!filtered.contains("data-tenant=\"acme\""));
        let (status, live) = http_get(addr, "/ops/live?tenant=acme&page=1", "localhost").await;
        assert_eq!(status, 200);
        assert!(
            live.contains("data-tenant=\"acme\" data-destination=\"orders\""),
            "{live}"
        );

        let (status, bad) = http_get(addr, "/ops/overview?page=0", "localhost").await;
        assert_eq!(status, 400, "{bad}");
        assert!(
            bad.contains("page: &quot;0&quot; is not a page number"),
            "{bad}"
        );

        // Each tenant's own console, on its own database.
        let (status, own) = http_get(addr, "/ops/tenants/globex/", "localhost").await;
        assert_eq!(status, 200, "{own}");
        assert!(own.contains("data-consumer=\"billing\""), "{own}");
        assert!(own.contains("href=\"/ops/tenants/globex/dead\""), "{own}");
        // It names its tenant, in the title and the header, and links back
        // to the tenants' overview.
        assert!(
            own.contains("<title>Overview · globex · diesel-inbox</title>"),
            "{own}"
        );
        assert!(
            own.contains("<a href=\"/ops/overview\">Tenants</a> › <strong>globex</strong>"),
            "{own}"
        );
        let (status, own) = http_get(
            addr,
            "/ops/tenants/acme/dead?destination=orders",
            "localhost",
        )
        .await;
        assert_eq!(status, 200, "{own}");
        let (status, own) = http_get(addr, "/ops/tenants/acme/overview", "localhost").await;
        assert_eq!(status, 200, "{own}");
        assert!(own.contains("data-destination=\"orders\""), "{own}");
        assert!(!own.contains("data-consumer=\"billing\""), "{own}");
        let (status, none) = http_get(addr, "/ops/tenants/nobody/", "localhost").await;
        assert_eq!(status, 404, "{none}");
        assert!(
            none.contains("no tenant named &quot;nobody&quot;"),
            "{none}"
        );
        let (status, _) = http_get(addr, "/ops", "evil.example").await;
        assert_eq!(status, 421, "a foreign Host is refused");
        let (status, _) = http_get(addr, "/ops/tenants/acme/", "evil.example").await;
        assert_eq!(status, 421, "on a tenant's pages too");
    });
}

/// A tenant's pages name it escaped: a name with quotes, markup and a
/// slash (reached as `%2F`) is text in the title and the header, and the
/// link back is the overview's, mounted at the root.
#[cfg(feature = "console")]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn a_tenants_pages_name_it_escaped() {
    use diesel_inbox::console;
    let dbs = Databases::new("crumb");
    let url = dbs.create("odd");
    let tenants: Tenants<PgPool> = Tenants::list([("a\"<b>&c/d", url)]);
    runtime().block_on(async {
        let app = console::tenants(tenants);
        let addr = serve(app).await;
        let (status, page) = http_get(addr, "/tenants/a%22%3Cb%3E%26c%2Fd/", "localhost").await;
        assert_eq!(status, 200, "{page}");
        assert!(
            page.contains("<title>Overview · a&quot;&lt;b&gt;&amp;c/d · diesel-inbox</title>"),
            "{page}"
        );
        assert!(
            page.contains("<a href=\"/\">Tenants</a> › <strong>a&quot;&lt;b&gt;&amp;c/d</strong>"),
            "{page}"
        );
        assert!(!page.contains("a\"<b>"), "the name is never markup: {page}");
    });
}

/// The relay's metrics over tenants carry each message's tenant: the
/// sent counter and the confirm latency per tenant, as many as each
/// tenant's database held.
#[cfg(feature = "metrics")]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn the_relays_metrics_carry_the_tenant() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let dbs = Databases::new("metrics");
    let acme = dbs.create("acme");
    let globex = dbs.create("globex");
    dbs.enqueue(&acme, "acme", 3, 1);
    dbs.enqueue(&globex, "globex", 2, 1);
    let tenants: Tenants<PgPool> = Tenants::list([("acme", acme), ("globex", globex)]);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let published = Recorder::default();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(async {
                let report = Relay::tenants(tenants, published.clone())
                    .run_once()
                    .await
                    .expect("one pass over every tenant");
                assert_eq!(report.published, 5, "{report:?}");
            })
    });
    let mut sent = BTreeMap::new();
    let mut latencies = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let tenant = key
            .key()
            .labels()
            .find(|l| l.key() == "diesel_inbox.tenant")
            .map(|l| l.value().to_owned());
        match (key.key().name(), value) {
            ("messaging.client.sent.messages", DebugValue::Counter(n)) => {
                sent.insert(tenant.expect("a tenant label"), n);
            }
            ("diesel_inbox.outbox.confirm_latency", DebugValue::Histogram(values)) => {
                latencies.insert(tenant.expect("a tenant label"), values.len());
            }
            _ => {}
        }
    }
    let expected: BTreeMap<String, u64> = [("acme".to_owned(), 3), ("globex".to_owned(), 2)].into();
    assert_eq!(sent, expected, "messages sent, by tenant");
    let expected: BTreeMap<String, usize> =
        [("acme".to_owned(), 3), ("globex".to_owned(), 2)].into();
    assert_eq!(latencies, expected, "confirm latencies, by tenant");
    check(&published.got(), &expected);
}

/// Each gauge's last value, by name and tenant label (`None`: a gauge
/// without one): a recorder of the test's own (metrics-util's debugging
/// snapshot resets a gauge it reads, so a gauge set to 0 and one not set
/// again read the same).
#[cfg(feature = "metrics")]
#[derive(Clone, Default)]
struct Gauges(Arc<Mutex<BTreeMap<GaugeKey, f64>>>);

/// A gauge's name and tenant label.
#[cfg(feature = "metrics")]
type GaugeKey = (String, Option<String>);

#[cfg(feature = "metrics")]
impl Gauges {
    fn last(&self, name: &str, tenant: Option<&str>) -> Option<f64> {
        let key = (name.to_owned(), tenant.map(str::to_owned));
        self.0.lock().expect("not poisoned").get(&key).copied()
    }

    fn tenants(&self) -> BTreeSet<Option<String>> {
        let gauges = self.0.lock().expect("not poisoned");
        gauges.keys().map(|(_, tenant)| tenant.clone()).collect()
    }
}

/// One gauge of [`Gauges`].
#[cfg(feature = "metrics")]
struct Gauge(Gauges, GaugeKey);

#[cfg(feature = "metrics")]
impl metrics::GaugeFn for Gauge {
    fn increment(&self, value: f64) {
        *self
            .0
             .0
            .lock()
            .expect("not poisoned")
            .entry(self.1.clone())
            .or_default() += value;
    }

    fn decrement(&self, value: f64) {
        self.increment(-value);
    }

    fn set(&self, value: f64) {
        self.0
             .0
            .lock()
            .expect("not poisoned")
            .insert(self.1.clone(), value);
    }
}

#[cfg(feature = "metrics")]
impl metrics::Recorder for Gauges {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }

    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        let tenant = key
            .labels()
            .find(|l| l.key() == "diesel_inbox.tenant")
            .map(|l| l.value().to_owned());
        metrics::Gauge::from_arc(Arc::new(Gauge(
            self.clone(),
            (key.name().to_owned(), tenant),
        )))
    }

    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// The relay over tenants counts each tenant's outbox for the gauges,
/// labelled with the tenant: messages not yet due are each tenant's own
/// `diesel_inbox.outbox.scheduled`, and nothing is counted without a
/// tenant. A tenant removed from the set while the relay runs has its
/// gauges set to 0, not left at their last count.
#[cfg(feature = "metrics")]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test)"
)]
fn the_outbox_gauges_are_counted_per_tenant() {
    const SCHEDULED: &str = "diesel_inbox.outbox.scheduled";
    let dbs = Databases::new("gauges");
    let acme = dbs.create("acme");
    let globex = dbs.create("globex");
    for (url, n) in [(&acme, 3), (&globex, 1)] {
        let mut conn = PgConnection::establish(url).expect("the tenant's database");
        conn.transaction(|conn| {
            for i in 0..n {
                let later = Outgoing::new("orders", format!("later:{i}"))
                    .deliver_after(Duration::from_secs(3600));
                outbox::enqueue(conn, later)?;
            }
            Ok::<_, diesel_inbox::InboxError>(())
        })
        .expect("enqueue");
    }
    let tenants: Tenants<PgPool> = Tenants::list([("acme", acme), ("globex", globex)]);
    let gauges = Gauges::default();
    let published = Recorder::default();
    let counted = metrics::with_local_recorder(&gauges, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(async {
                let relay = Relay::tenants(tenants, published.clone())
                    .refresh_interval(Duration::from_millis(200));
                let began = Instant::now();
                let watched = async {
                    // Until both tenants were counted (at most 60 s).
                    while gauges.last(SCHEDULED, Some("acme")).is_none()
                        || gauges.last(SCHEDULED, Some("globex")).is_none()
                    {
                        assert!(began.elapsed() < Duration::from_secs(60), "not counted");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let counted = (
                        gauges.last(SCHEDULED, Some("acme")),
                        gauges.last(SCHEDULED, Some("globex")),
                    );
                    // Then globex leaves the set: its gauges read 0 once
                    // the relay reads the set again (every 200 ms here).
                    assert!(relay.tenant_set().remove("globex"));
                    while gauges.last(SCHEDULED, Some("globex")) != Some(0.0) {
                        assert!(
                            began.elapsed() < Duration::from_secs(60),
                            "globex's gauges not reset"
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    counted
                };
                let mut result = None;
                relay
                    .run(async { result = Some(watched.await) })
                    .await
                    .expect("the relay");
                result.expect("watched")
            })
    });
    assert_eq!(
        counted,
        (Some(3.0), Some(1.0)),
        "each tenant's scheduled messages"
    );
    assert_eq!(
        gauges.tenants(),
        BTreeSet::from([Some("acme".to_owned()), Some("globex".to_owned())]),
        "every outbox gauge names its tenant"
    );
    for gauge in ["pending", "scheduled", "dead", "oldest_pending_age"] {
        let name = format!("diesel_inbox.outbox.{gauge}");
        assert_eq!(
            gauges.last(&name, Some("globex")),
            Some(0.0),
            "{name} of the removed tenant"
        );
    }
    assert_eq!(
        gauges.last(SCHEDULED, Some("acme")),
        Some(3.0),
        "acme's, still counted"
    );
    assert!(published.got().is_empty(), "nothing was due");
}

/// `refresh` reads the source one call at a time: twenty calls at once
/// share at most two readings (the one running when they came, and one
/// after), and a slow reading of the old list is never applied after a
/// newer one.
#[test]
fn refreshes_at_once_share_a_reading_and_never_go_back() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let readings = Arc::new(AtomicUsize::new(0));
    let counting = readings.clone();
    let tenants: Tenants<PgPool> = Tenants::from_fn(move || {
        let n = counting.fetch_add(1, Ordering::SeqCst);
        async move {
            // The first reading is slow and sees the old list; the later
            // ones see a tenant added meanwhile.
            if n == 0 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(vec![("acme".to_owned(), "postgres://h/acme".to_owned())])
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(vec![
                    ("acme".to_owned(), "postgres://h/acme".to_owned()),
                    ("late".to_owned(), "postgres://h/late".to_owned()),
                ])
            }
        }
    });
    runtime().block_on(async {
        let first = tokio::spawn({
            let tenants = tenants.clone();
            async move { tenants.refresh().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let later: Vec<_> = (0..20)
            .map(|_| {
                let tenants = tenants.clone();
                tokio::spawn(async move { tenants.refresh().await })
            })
            .collect();
        first.await.expect("the task").expect("a reading");
        for call in later {
            call.await.expect("the task").expect("a reading");
        }
    });
    assert_eq!(
        readings.load(Ordering::SeqCst),
        2,
        "the slow reading, and one for the twenty calls that came during it"
    );
    assert_eq!(tenants.names(), ["acme", "late"], "the newer list stands");
}
