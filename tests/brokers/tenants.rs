//! The outbox chain over a database per tenant, with kills: 100 tenant
//! databases on PostgreSQL, and 20 on MariaDB, each with its outbox
//! (service A's side) and a `tenant_stock` table with an inbox (service B's
//! side). One relay process
//! over every tenant (`Relay::tenants`) publishes to a RabbitMQ queue, and
//! one consumer process (`Consumer::run_tenants`) applies each message in
//! the database of the tenant its `x-tenant` names. Each reads the tenants
//! from a file the scenario rewrites. Both are SIGKILLed at random points
//! and restarted; one tenant's database is blackholed mid-run on the
//! relay's side (its URL in the relay's list goes through a proxy); five
//! tenants are added and one removed while they run. Every
//! message is applied once, in its own tenant's database, in order per
//! key; the removed tenant's later message stays in its outbox.

use crate::chain::Lcg;
use crate::proxy::{Mode, Proxy};
use crate::scenarios::{ensure, Broker};
use crate::support::on;
pub(crate) use crate::support::Server;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::AsyncPgConnection;
use diesel_inbox::outbox::{self, Outgoing, Relay};
use diesel_inbox::tenants::{TenantPool, Tenants};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Tenants added mid-run (beside those listed from the start:
/// [`Server::tenants`]).
const LATE: usize = 5;
/// Each tenant's messages, over two keys, in three waves: the relay
/// publishes a tenant's due messages together, so that the consumer
/// applies a few of a tenant's in a row.
const MESSAGES: u64 = 6;
const WAVES: u64 = 3;
const KEYS: u64 = 2;
/// SIGKILLs of the relay and of the consumer, each.
const KILLS: u32 = 3;

/// What this scenario needs of each server.
impl Server {
    /// Its name in the processes' `INBOX_TENANTS_SERVER`.
    fn name(self) -> &'static str {
        match self {
            Server::Postgres => "postgres",
            #[cfg(feature = "mysql")]
            Server::Mariadb => "mariadb",
        }
    }

    fn named(name: &str) -> Option<Server> {
        match name {
            "postgres" => Some(Server::Postgres),
            #[cfg(feature = "mysql")]
            "mariadb" => Some(Server::Mariadb),
            _ => None,
        }
    }

    /// Where the server listens (the stalled tenant's proxy forwards there).
    fn address(self) -> &'static str {
        match self {
            Server::Postgres => "127.0.0.1:5432",
            #[cfg(feature = "mysql")]
            Server::Mariadb => "127.0.0.1:3306",
        }
    }

    /// Tenants listed from the start.
    fn tenants(self) -> usize {
        match self {
            Server::Postgres => 100,
            #[cfg(feature = "mysql")]
            Server::Mariadb => 20,
        }
    }

    fn stock_ddl(self) -> &'static str {
        match self {
            Server::Postgres => "CREATE TABLE tenant_stock (id BIGSERIAL PRIMARY KEY, \
                message_id TEXT NOT NULL, tenant TEXT NOT NULL, origin TEXT NOT NULL, \
                msg_key TEXT NOT NULL, seq BIGINT NOT NULL)",
            #[cfg(feature = "mysql")]
            Server::Mariadb => "CREATE TABLE tenant_stock (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                message_id VARCHAR(255) NOT NULL, tenant VARCHAR(64) NOT NULL, origin VARCHAR(64) NOT NULL, \
                msg_key VARCHAR(64) NOT NULL, seq BIGINT NOT NULL)",
        }
    }
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"))
}

async fn sigterm() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    term.recv().await;
}

/// The tenant set of `INBOX_TENANTS_FILE` (`NAME URL` lines), read again
/// when the set refreshes, its pools holding `max_connections` in all.
fn tenants<T: TenantPool>(max_connections: u32) -> Tenants<T> {
    let file = var("INBOX_TENANTS_FILE");
    Tenants::from_fn(move || {
        let read = std::fs::read_to_string(&file);
        async move {
            let text = read?;
            Ok(text
                .lines()
                .filter_map(|l| l.split_once(' '))
                .map(|(name, url)| (name.to_owned(), url.to_owned()))
                .collect::<Vec<_>>())
        }
    })
    .max_connections(max_connections)
    .pool_size(1)
    .checkout_timeout(Duration::from_secs(2))
}

/// The relay process: every tenant's outbox to the queue, until SIGTERM.
async fn relay<T>() -> Result<(), String>
where
    T: TenantPool,
    T::Guard: 'static,
{
    let tenants = tenants::<T>(10);
    tenants.refresh().await.map_err(|e| e.to_string())?;
    let publisher = outbox::lapin::Publisher::connect(var("INBOX_BROKER_URL"), "");
    let report = Relay::tenants(tenants, publisher)
        .batch_size(20)
        .poll_interval(Duration::from_millis(50))
        .lease(Duration::from_secs(4))
        .refresh_interval(Duration::from_millis(500))
        .run(sigterm())
        .await
        .map_err(|e| e.to_string())?;
    eprintln!(
        "tenants relay published={} errors={}",
        report.published, report.errors
    );
    Ok(())
}

/// The consumer process of a server's connection type (`$conn`, with the
/// insert in its placeholders): each message in its tenant's database,
/// one at a time (per-key order), until SIGTERM.
macro_rules! consumer {
    ($name:ident, $conn:ty, $insert:literal) => {
        async fn $name() -> Result<(), String> {
            use diesel_inbox::brokers::{Message, Policy};
            use diesel_inbox::tenants::TENANT_HEADER;
            use diesel_inbox::{Inbox, InboxError};
            // Messages come round the tenants: fewer pools than tenants
            // open a connection for most messages.
            let tenants = tenants::<Pool<$conn>>(40);
            let handler = async |conn: &mut $conn, m: &Message<'_>| {
                let tenant = m
                    .header(TENANT_HEADER)
                    .and_then(|t| std::str::from_utf8(t).ok())
                    .unwrap_or_default()
                    .to_owned();
                let body = String::from_utf8_lossy(m.body()).into_owned();
                let mut parts = body.split(':');
                // The tenant that enqueued it, as its payload says: the
                // check compares it with the header's and the database's.
                let (origin, key, seq) = (parts.next(), parts.next(), parts.next());
                let (origin, key, seq) = (
                    origin.unwrap_or_default().to_owned(),
                    key.unwrap_or_default().to_owned(),
                    seq.and_then(|s| s.parse::<i64>().ok()).unwrap_or(-1),
                );
                let id = m.id().to_owned();
                Inbox::consumer("stock")
                    .run_async(conn, m.id(), async move |conn: &mut $conn| {
                        let insert = diesel::sql_query($insert)
                            .bind::<diesel::sql_types::Text, _>(&id)
                            .bind::<diesel::sql_types::Text, _>(&tenant)
                            .bind::<diesel::sql_types::Text, _>(&origin)
                            .bind::<diesel::sql_types::Text, _>(&key)
                            .bind::<diesel::sql_types::BigInt, _>(seq);
                        diesel_async::RunQueryDsl::execute(insert, conn).await?;
                        Ok::<_, InboxError>(())
                    })
                    .await
            };
            let policy = Policy::new(|_: &InboxError| false)
                .unlimited_deliveries()
                .retry_delay(Duration::from_millis(50))
                .max_retry_delay(Duration::from_millis(500));
            diesel_inbox::lapin::Consumer::connect(
                var("INBOX_BROKER_URL"),
                var("INBOX_CHAIN_QUEUE"),
                policy,
            )
            .in_flight(1)
            .run_tenants(&tenants, handler, sigterm())
            .await
            .map(drop)
            .map_err(|e| e.to_string())
        }
    };
}

consumer!(
    consume_postgres,
    AsyncPgConnection,
    "INSERT INTO tenant_stock (message_id, tenant, origin, msg_key, seq) VALUES ($1, $2, $3, $4, $5)"
);
#[cfg(feature = "mysql")]
consumer!(
    consume_mariadb,
    diesel_async::AsyncMysqlConnection,
    "INSERT INTO tenant_stock (message_id, tenant, origin, msg_key, seq) VALUES (?, ?, ?, ?, ?)"
);

/// This scenario's processes: `Some(exit code)` when this process is one.
pub fn role() -> Option<i32> {
    let role = std::env::var("INBOX_BROKER_ROLE").ok()?;
    if !role.starts_with("tenants-") {
        return None;
    }
    let server = std::env::var("INBOX_TENANTS_SERVER").unwrap_or_default();
    let work: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>>>> =
        match (role.as_str(), Server::named(&server)) {
            ("tenants-relay", Some(Server::Postgres)) => {
                Box::pin(relay::<Pool<AsyncPgConnection>>())
            }
            ("tenants-b", Some(Server::Postgres)) => Box::pin(consume_postgres()),
            #[cfg(feature = "mysql")]
            ("tenants-relay", Some(Server::Mariadb)) => {
                Box::pin(relay::<Pool<diesel_async::AsyncMysqlConnection>>())
            }
            #[cfg(feature = "mysql")]
            ("tenants-b", Some(Server::Mariadb)) => Box::pin(consume_mariadb()),
            _ => {
                eprintln!("{role}: unknown role or INBOX_TENANTS_SERVER {server:?}");
                return Some(2);
            }
        };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    Some(match runtime.block_on(work) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{role} failed: {e}");
            3
        }
    })
}

/// A process of the scenario, SIGKILLed and started again.
struct Process {
    role: &'static str,
    child: Option<Child>,
    kills: u32,
}

impl Process {
    fn start(&mut self, env: &[(&str, String)], log: &str) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| e.to_string())?;
        let child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .env("INBOX_BROKER_ROLE", self.role)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.role))?;
        self.child = Some(child);
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            self.kills += 1;
        }
    }

    /// SIGTERM, and its exit within 40 s.
    fn stop(&mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return match status.success() {
                    true => Ok(()),
                    false => Err(format!("{} exited with {status}", self.role)),
                };
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(format!("{} did not stop on SIGTERM", self.role));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A process that died by itself is an error.
    fn alive(&mut self) -> Result<(), String> {
        if let Some(status) = self
            .child
            .as_mut()
            .map(|c| c.try_wait())
            .transpose()
            .map_err(|e| e.to_string())?
            .flatten()
        {
            return Err(format!("{} exited by itself: {status}", self.role));
        }
        Ok(())
    }
}

/// A scenario that ends early (an error, a panic) leaves no process
/// behind.
impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A tenant's database: its name, the URL the relay uses (through the
/// proxy for the stalled one) and the direct one.
struct Tenant {
    name: String,
    relay_url: String,
    url: String,
}

/// The scenario's tenant databases, dropped at the end: on PostgreSQL
/// copies of one migrated template (a copy costs less than a migration),
/// on MariaDB each made and migrated.
struct Copies {
    server: Server,
    admin: String,
    base: String,
    template: Option<String>,
    names: Vec<String>,
}

impl Copies {
    fn new(server: Server, run: &str) -> Result<Copies, String> {
        let admin = var(server.var());
        let (base, _) = admin.rsplit_once('/').ok_or("a URL with a database")?;
        let mut copies = Copies {
            server,
            base: base.to_owned(),
            admin,
            template: None,
            names: Vec::new(),
        };
        let template = match server {
            Server::Postgres => true,
            #[cfg(feature = "mysql")]
            Server::Mariadb => false,
        };
        if template {
            let template = format!("tc_{run}_template").replace('-', "_");
            copies.create(&template)?;
            copies.template = Some(template);
        }
        Ok(copies)
    }

    /// A database named `name` with the inbox's and the outbox's tables
    /// and `tenant_stock`: its URL.
    fn create(&mut self, name: &str) -> Result<String, String> {
        let server = self.server;
        let create = match &self.template {
            Some(template) => format!("CREATE DATABASE {name} TEMPLATE {template}"),
            None => format!("CREATE DATABASE {name}"),
        };
        let drop = server.drop_statement(name);
        // Two statements: PostgreSQL runs a batch as one transaction,
        // which neither may run in.
        on!(try server, &self.admin, |admin| {
            for statement in [&drop, &create] {
                admin
                    .batch_execute(statement)
                    .map_err(|e| format!("database {name}: {e}"))?;
            }
        });
        self.names.push(name.to_owned());
        let url = format!("{}/{name}", self.base);
        if self.template.is_none() {
            on!(try server, &url, |conn| {
                diesel_inbox::migrate(&mut conn).map_err(|e| format!("migrate {name}: {e}"))?;
                conn.batch_execute(server.stock_ddl())
                    .map_err(|e| format!("tenant_stock in {name}: {e}"))?;
            });
        }
        Ok(url)
    }
}

impl Drop for Copies {
    /// Drops the databases from 8 connections at once: PostgreSQL makes
    /// each `DROP DATABASE` wait for a checkpoint, and one checkpoint
    /// serves the drops waiting together (one at a time, 106 took a
    /// minute on a loaded machine).
    fn drop(&mut self) {
        let statements: Vec<String> = self
            .names
            .iter()
            .map(|n| self.server.drop_statement(n))
            .collect();
        let (server, admin) = (self.server, self.admin.as_str());
        std::thread::scope(|s| {
            let drops: Vec<_> = statements
                .chunks(statements.len().div_ceil(8).max(1))
                .map(|share| {
                    s.spawn(move || {
                        on!(server, admin, |conn| {
                            for statement in share {
                                let _ = conn.batch_execute(statement);
                            }
                        })
                    })
                })
                .collect();
            // Joined here: a connection that failed (its panic) leaves the
            // rest to drop, and does not panic again in a drop.
            for drop in drops {
                let _ = drop.join();
            }
        });
    }
}

/// One applied row of a tenant's `tenant_stock`.
#[derive(QueryableByName)]
struct Stock {
    #[diesel(sql_type = diesel::sql_types::Text)]
    message_id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    tenant: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    origin: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    msg_key: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    seq: i64,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn count(server: Server, url: &str, sql: &str) -> Result<i64, String> {
    on!(try server, url, |conn| diesel::sql_query(sql)
        .get_result::<Count>(&mut conn)
        .map(|c| c.n)
        .map_err(|e| e.to_string()))
}

/// Enqueues `tenant`'s messages `seqs` (key `k{seq % KEYS}`) in one
/// transaction.
fn enqueue(
    server: Server,
    tenant: &Tenant,
    queue: &str,
    seqs: std::ops::Range<u64>,
) -> Result<(), String> {
    on!(try server, &tenant.url, |conn| conn
    .transaction(|conn| {
        for seq in seqs {
            let key = format!("k{}", seq % KEYS);
            outbox::enqueue(
                conn,
                Outgoing::new(queue, format!("{}:{key}:{seq}", tenant.name))
                    .ordering_key(key.as_str()),
            )?;
        }
        Ok(())
    })
    .map_err(|e: diesel_inbox::InboxError| format!(
        "enqueue in {}: {e}",
        tenant.name
    )))
}

/// The relay's list (`relay`) or the consumer's of `tenants`.
fn write_list(file: &str, tenants: &[&Tenant], relay: bool) -> Result<(), String> {
    let text: String = tenants
        .iter()
        .map(|t| {
            let url = if relay { &t.relay_url } else { &t.url };
            format!("{} {url}\n", t.name)
        })
        .collect();
    let partial = format!("{file}.partial");
    std::fs::write(&partial, text).map_err(|e| e.to_string())?;
    // Whole or not at all: a process never reads half a list.
    std::fs::rename(&partial, file).map_err(|e| e.to_string())
}

/// The scenario (RabbitMQ, the tenants' databases on `server`).
pub fn chain_with_kills(url: &str, server: Server) -> Result<String, String> {
    type Rabbit = crate::rabbit::Rabbit;
    if std::env::var(server.var()).map_or(true, |u| u.is_empty()) {
        return Ok(format!(
            "{}{} is not set",
            crate::scenarios::SKIPPED,
            server.var()
        ));
    }
    let tenants = server.tenants();
    let run = crate::scenarios::run_id();
    let queue = format!("inbox-test-{run}-tenants");
    Rabbit::setup_ordered(url, &queue)?;
    let proxy = Proxy::start(server.address().parse().map_err(|e| format!("{e}"))?)?;
    let made = Instant::now();
    let mut copies = Copies::new(server, &run)?;
    let mut all = Vec::new();
    for i in 0..tenants + LATE + 1 {
        let name = match i {
            i if i < tenants => format!("t{i:03}"),
            i if i < tenants + LATE => format!("late{}", i - tenants),
            _ => "gone".to_owned(),
        };
        let url = copies.create(&format!("tc_{run}_{name}").replace('-', "_"))?;
        // The first tenant is the one whose database stalls mid-run.
        let relay_url = match i {
            0 => proxy.route(&url)?,
            _ => url.clone(),
        };
        all.push(Tenant {
            name,
            relay_url,
            url,
        });
    }
    let made = made.elapsed();
    let listed: Vec<&Tenant> = all.iter().filter(|t| !t.name.starts_with("late")).collect();
    let dir = std::env::temp_dir();
    let file = dir
        .join(format!("diesel-inbox-{run}-tenants"))
        .to_string_lossy()
        .into_owned();
    let file_b = format!("{file}-b");
    let log = format!("{file}.log");
    write_list(&file, &listed, true)?;
    write_list(&file_b, &listed, false)?;
    let env_of = |role: &str| {
        [
            ("INBOX_BROKER_URL", url.to_owned()),
            ("INBOX_TENANTS_SERVER", server.name().to_owned()),
            ("INBOX_CHAIN_QUEUE", queue.clone()),
            (
                "INBOX_TENANTS_FILE",
                if role == "tenants-relay" {
                    file.clone()
                } else {
                    file_b.clone()
                },
            ),
        ]
    };
    let mut processes = [
        Process {
            role: "tenants-relay",
            child: None,
            kills: 0,
        },
        Process {
            role: "tenants-b",
            child: None,
            kills: 0,
        },
    ];
    // The late tenants' messages wait in their outboxes until they are
    // listed.
    for tenant in all.iter().filter(|t| t.name.starts_with("late")) {
        enqueue(server, tenant, &queue, 0..MESSAGES)?;
    }
    for p in processes.iter_mut() {
        p.start(&env_of(p.role), &log)?;
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut random = Lcg(seed);
    let deadline = Instant::now() + Duration::from_secs(300);
    let regular: Vec<&Tenant> = all.iter().filter(|t| t.name.starts_with('t')).collect();
    let gone = all.iter().find(|t| t.name == "gone").ok_or("gone")?;
    let expected_total = (tenants + LATE) as u64 * MESSAGES;
    let applied = |tenants: &[Tenant]| -> u64 {
        tenants
            .iter()
            .filter(|t| t.name != "gone")
            .map(|t| {
                count(server, &t.url, "SELECT count(*) AS n FROM tenant_stock").unwrap_or(0) as u64
            })
            .sum()
    };
    let flowing = Instant::now();
    let (mut before_stall, mut during_stall) = (0, 0);
    let result = (|| -> Result<(), String> {
        for wave in 0..WAVES {
            let per_wave = MESSAGES / WAVES;
            for tenant in &regular {
                enqueue(
                    server,
                    tenant,
                    &queue,
                    wave * per_wave..(wave + 1) * per_wave,
                )?;
            }
            match wave {
                // The first tenant's database stops answering for 6 s;
                // the others' messages are applied meanwhile.
                0 => {
                    proxy.set(Mode::Blackhole);
                    before_stall = applied(&all);
                }
                1 => {
                    std::thread::sleep(Duration::from_secs(6));
                    let during = applied(&all);
                    proxy.set(Mode::Forward);
                    ensure!(
                        during > before_stall,
                        "nothing applied while one tenant's database stalled ({during})"
                    );
                    during_stall = during - before_stall;
                }
                // Tenants come and go.
                2 => {
                    let now: Vec<&Tenant> = all.iter().filter(|t| t.name != "gone").collect();
                    // The consumer's list first: a message the relay
                    // publishes for a new tenant finds it there.
                    write_list(&file_b, &now, false)?;
                    write_list(&file, &now, true)?;
                }
                _ => {}
            }
            std::thread::sleep(Duration::from_millis(300 + random.next(900)));
            for p in processes.iter_mut() {
                p.alive()?;
            }
            // A kill each wave while kills are left, of either process.
            let victims: Vec<usize> = (0..2).filter(|&i| processes[i].kills < KILLS).collect();
            if !victims.is_empty() {
                let victim = &mut processes[victims[random.next(victims.len() as u64) as usize]];
                victim.kill();
                victim.start(&env_of(victim.role), &log)?;
            }
        }
        // The kills left, while the messages flow.
        while processes.iter().any(|p| p.kills < KILLS) {
            ensure!(
                Instant::now() < deadline,
                "the kills did not finish in time"
            );
            std::thread::sleep(Duration::from_millis(500 + random.next(1000)));
            let victims: Vec<usize> = (0..2).filter(|&i| processes[i].kills < KILLS).collect();
            let victim = &mut processes[victims[random.next(victims.len() as u64) as usize]];
            victim.kill();
            victim.start(&env_of(victim.role), &log)?;
        }
        // The removed tenant's message, well after every process read the
        // list without it.
        std::thread::sleep(Duration::from_secs(2));
        enqueue(server, gone, &queue, 0..1)?;
        loop {
            for p in processes.iter_mut() {
                p.alive()?;
            }
            let done = applied(&all);
            if done >= expected_total {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{done} of {expected_total} messages applied in 300 s (log: {log})"
            );
            std::thread::sleep(Duration::from_secs(2));
        }
    })();
    let mut stopped = Ok(());
    for p in processes.iter_mut() {
        let s = p.stop();
        stopped = stopped.and(s);
    }
    let flowed = flowing.elapsed();
    crate::rabbit::Rabbit::teardown(url, &queue);
    result?;
    stopped.map_err(|e| format!("{e} (log: {log})"))?;
    let summary = check(server, &all, gone)?;
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&file_b);
    Ok(format!(
        "{summary}; {} tenant databases made in {:.1}s, all applied {:.1}s after the first wave; SIGKILLs: relay {}, consumer {} (seed {seed}); tenant t000's database blackholed 6 s on the relay's side, {during_stall} messages of the others applied meanwhile",
        all.len(),
        made.as_secs_f64(),
        flowed.as_secs_f64(),
        processes[0].kills,
        processes[1].kills,
    ))
}

/// Every message applied once, in its own tenant's database, in order per
/// key; each inbox row one message; every outbox empty but the removed
/// tenant's, whose later message is still there and applied nowhere.
fn check(server: Server, all: &[Tenant], gone: &Tenant) -> Result<String, String> {
    let mut total = 0;
    for tenant in all.iter().filter(|t| t.name != "gone") {
        let (rows, pending) = on!(try server, &tenant.url, |conn| {
            let rows: Vec<Stock> = diesel::sql_query(
                "SELECT message_id, tenant, origin, msg_key, seq FROM tenant_stock ORDER BY id",
            )
            .load(&mut conn)
            .map_err(|e| e.to_string())?;
            let pending = outbox::status(&mut conn)
                .map_err(|e| e.to_string())?
                .pending;
            (rows, pending)
        });
        let mut ids = BTreeSet::new();
        let mut last: BTreeMap<&str, i64> = BTreeMap::new();
        for row in &rows {
            ensure!(
                row.tenant == tenant.name && row.origin == tenant.name,
                "a message of {} (its header: {}) applied in {}'s database",
                row.origin,
                row.tenant,
                tenant.name
            );
            ensure!(
                ids.insert(row.message_id.as_str()),
                "{}: message {} applied twice",
                tenant.name,
                row.message_id
            );
            if let Some(before) = last.insert(row.msg_key.as_str(), row.seq) {
                ensure!(
                    row.seq > before,
                    "{}: key {} applied {} after {before}",
                    tenant.name,
                    row.msg_key,
                    row.seq
                );
            }
        }
        let seqs: BTreeSet<i64> = rows.iter().map(|r| r.seq).collect();
        ensure!(
            rows.len() as u64 == MESSAGES && seqs == (0..MESSAGES as i64).collect(),
            "{}: applied {:?}, expected each of 0..{MESSAGES} once",
            tenant.name,
            rows.iter().map(|r| r.seq).collect::<Vec<_>>()
        );
        let claims = count(
            server,
            &tenant.url,
            "SELECT count(*) AS n FROM inbox_messages WHERE consumer = 'stock'",
        )?;
        ensure!(
            claims == MESSAGES as i64,
            "{}: {claims} inbox rows for {MESSAGES} messages",
            tenant.name
        );
        ensure!(
            pending == 0,
            "{}: {pending} messages left in its outbox",
            tenant.name
        );
        total += rows.len();
    }
    let pending = on!(try server, &gone.url, |conn| outbox::status(&mut conn)
        .map_err(|e| e.to_string())?
        .pending);
    ensure!(
        pending == 1,
        "the removed tenant's message was relayed: {pending} left in its outbox"
    );
    let applied = count(server, &gone.url, "SELECT count(*) AS n FROM tenant_stock")?;
    ensure!(applied == 0, "the removed tenant's message was applied");
    Ok(format!(
        "{total} messages over {} tenants applied once each, in their own databases, in order per key; the removed tenant's message left in its outbox",
        all.len() - 1
    ))
}
