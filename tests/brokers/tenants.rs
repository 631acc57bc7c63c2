//! The outbox chain over a database per tenant, with kills: 100 tenant
//! databases on PostgreSQL, each with its outbox (service A's side) and a
//! `tenant_stock` table with an inbox (service B's side). One relay process
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
use crate::scenarios::{ensure, Broker, PgDb};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::AsyncPgConnection;
use diesel_inbox::brokers::{Message, Policy};
use diesel_inbox::outbox::{self, Outgoing, Relay};
use diesel_inbox::tenants::{Tenants, TENANT_HEADER};
use diesel_inbox::{Inbox, InboxError};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Tenants listed from the start, and those added mid-run.
const TENANTS: usize = 100;
const LATE: usize = 5;
/// Each tenant's messages, over two keys, in three waves: the relay
/// publishes a tenant's due messages together, so that the consumer
/// applies a few of a tenant's in a row.
const MESSAGES: u64 = 6;
const WAVES: u64 = 3;
const KEYS: u64 = 2;
/// SIGKILLs of the relay and of the consumer, each.
const KILLS: u32 = 3;

const STOCK_DDL: &str = "CREATE TABLE tenant_stock (id BIGSERIAL PRIMARY KEY, \
    message_id TEXT NOT NULL, tenant TEXT NOT NULL, key TEXT NOT NULL, seq BIGINT NOT NULL)";

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
fn tenants(max_connections: u32) -> Tenants<Pool<AsyncPgConnection>> {
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
async fn relay() -> Result<(), String> {
    let tenants = tenants(10);
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

/// The consumer process: each message in its tenant's database, one at a
/// time (per-key order), until SIGTERM.
async fn consume() -> Result<(), String> {
    // Messages come round the tenants: fewer pools than tenants open a
    // connection for most messages.
    let tenants = tenants(40);
    let handler = async |conn: &mut AsyncPgConnection, m: &Message<'_>| {
        let tenant = m
            .header(TENANT_HEADER)
            .and_then(|t| std::str::from_utf8(t).ok())
            .unwrap_or_default()
            .to_owned();
        let body = String::from_utf8_lossy(m.body()).into_owned();
        let mut parts = body.split(':');
        let (_, key, seq) = (parts.next(), parts.next(), parts.next());
        let (key, seq) = (
            key.unwrap_or_default().to_owned(),
            seq.and_then(|s| s.parse::<i64>().ok()).unwrap_or(-1),
        );
        let id = m.id().to_owned();
        Inbox::consumer("stock")
            .run_async(conn, m.id(), async move |conn: &mut AsyncPgConnection| {
                let insert = diesel::sql_query(
                    "INSERT INTO tenant_stock (message_id, tenant, key, seq) VALUES ($1, $2, $3, $4)",
                )
                .bind::<diesel::sql_types::Text, _>(&id)
                .bind::<diesel::sql_types::Text, _>(&tenant)
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

/// This scenario's processes: `Some(exit code)` when this process is one.
pub fn role() -> Option<i32> {
    let role = std::env::var("INBOX_BROKER_ROLE").ok()?;
    let work: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>>>> =
        match role.as_str() {
            "tenants-relay" => Box::pin(relay()),
            "tenants-b" => Box::pin(consume()),
            _ => return None,
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

/// A tenant's database: its name, the URL the relay uses (through the
/// proxy for the stalled one) and the direct one.
struct Tenant {
    name: String,
    relay_url: String,
    url: String,
}

/// The scenario's tenant databases, copies of one migrated template (a
/// copy costs less than a migration), dropped at the end.
struct Copies {
    admin: PgConnection,
    base: String,
    names: Vec<String>,
}

impl Copies {
    fn new() -> Result<Copies, String> {
        let server = var("INBOX_TEST_POSTGRES_URL");
        let (base, _) = server.rsplit_once('/').ok_or("a URL with a database")?;
        Ok(Copies {
            admin: PgConnection::establish(&server).map_err(|e| e.to_string())?,
            base: base.to_owned(),
            names: Vec::new(),
        })
    }

    /// A copy of `template` named `name`: its URL.
    fn copy(&mut self, template: &str, name: &str) -> Result<String, String> {
        self.admin
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
            .map_err(|e| format!("a copy of the template: {e}"))?;
        self.names.push(name.to_owned());
        Ok(format!("{}/{name}", self.base))
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = self
                .admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
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
    key: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    seq: i64,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn count(url: &str, sql: &str) -> Result<i64, String> {
    let mut conn = PgConnection::establish(url).map_err(|e| e.to_string())?;
    diesel::sql_query(sql)
        .get_result::<Count>(&mut conn)
        .map(|c| c.n)
        .map_err(|e| e.to_string())
}

/// Enqueues `tenant`'s messages `seqs` (key `k{seq % KEYS}`) in one
/// transaction.
fn enqueue(tenant: &Tenant, queue: &str, seqs: std::ops::Range<u64>) -> Result<(), String> {
    let mut conn = PgConnection::establish(&tenant.url).map_err(|e| e.to_string())?;
    conn.transaction(|conn| {
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
    .map_err(|e: diesel_inbox::InboxError| format!("enqueue in {}: {e}", tenant.name))
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

/// The scenario (RabbitMQ, PostgreSQL).
pub fn chain_with_kills(url: &str) -> Result<String, String> {
    type Rabbit = crate::rabbit::Rabbit;
    if std::env::var("INBOX_TEST_POSTGRES_URL").map_or(true, |u| u.is_empty()) {
        return Ok(format!(
            "{}INBOX_TEST_POSTGRES_URL is not set",
            crate::scenarios::SKIPPED
        ));
    }
    let run = crate::scenarios::run_id();
    let queue = format!("inbox-test-{run}-tenants");
    Rabbit::setup_ordered(url, &queue)?;
    let proxy = Proxy::start("127.0.0.1:5432".parse().map_err(|e| format!("{e}"))?)?;
    let made = Instant::now();
    let template = PgDb::named(&format!("tc_{run}_template"))?.ok_or("no PostgreSQL")?;
    PgConnection::establish(&template.url)
        .map_err(|e| e.to_string())?
        .batch_execute(STOCK_DDL)
        .map_err(|e| e.to_string())?;
    let template_name = format!("tc_{run}_template").replace('-', "_");
    let mut copies = Copies::new()?;
    let mut all = Vec::new();
    for i in 0..TENANTS + LATE + 1 {
        let name = match i {
            i if i < TENANTS => format!("t{i:03}"),
            i if i < TENANTS + LATE => format!("late{}", i - TENANTS),
            _ => "gone".to_owned(),
        };
        let url = copies.copy(
            &template_name,
            &format!("tc_{run}_{name}").replace('-', "_"),
        )?;
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
        enqueue(tenant, &queue, 0..MESSAGES)?;
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
    let expected_total = (TENANTS + LATE) as u64 * MESSAGES;
    let applied = |tenants: &[Tenant]| -> u64 {
        tenants
            .iter()
            .filter(|t| t.name != "gone")
            .map(|t| count(&t.url, "SELECT count(*) AS n FROM tenant_stock").unwrap_or(0) as u64)
            .sum()
    };
    let flowing = Instant::now();
    let (mut before_stall, mut during_stall) = (0, 0);
    let result = (|| -> Result<(), String> {
        for wave in 0..WAVES {
            let per_wave = MESSAGES / WAVES;
            for tenant in &regular {
                enqueue(tenant, &queue, wave * per_wave..(wave + 1) * per_wave)?;
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
        enqueue(gone, &queue, 0..1)?;
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
    let summary = check(&all, gone)?;
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
fn check(all: &[Tenant], gone: &Tenant) -> Result<String, String> {
    let mut total = 0;
    for tenant in all.iter().filter(|t| t.name != "gone") {
        let mut conn = PgConnection::establish(&tenant.url).map_err(|e| e.to_string())?;
        let rows: Vec<Stock> =
            diesel::sql_query("SELECT message_id, tenant, key, seq FROM tenant_stock ORDER BY id")
                .load(&mut conn)
                .map_err(|e| e.to_string())?;
        let mut ids = BTreeSet::new();
        let mut last: BTreeMap<&str, i64> = BTreeMap::new();
        for row in &rows {
            ensure!(
                row.tenant == tenant.name,
                "a message of {} applied in {}'s database",
                row.tenant,
                tenant.name
            );
            ensure!(
                ids.insert(row.message_id.as_str()),
                "{}: message {} applied twice",
                tenant.name,
                row.message_id
            );
            if let Some(before) = last.insert(row.key.as_str(), row.seq) {
                ensure!(
                    row.seq > before,
                    "{}: key {} applied {} after {before}",
                    tenant.name,
                    row.key,
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
            &tenant.url,
            "SELECT count(*) AS n FROM inbox_messages WHERE consumer = 'stock'",
        )?;
        ensure!(
            claims == MESSAGES as i64,
            "{}: {claims} inbox rows for {MESSAGES} messages",
            tenant.name
        );
        let pending = outbox::status(&mut conn)
            .map_err(|e| e.to_string())?
            .pending;
        ensure!(
            pending == 0,
            "{}: {pending} messages left in its outbox",
            tenant.name
        );
        total += rows.len();
    }
    let mut conn = PgConnection::establish(&gone.url).map_err(|e| e.to_string())?;
    let pending = outbox::status(&mut conn)
        .map_err(|e| e.to_string())?
        .pending;
    ensure!(
        pending == 1,
        "the removed tenant's message was relayed: {pending} left in its outbox"
    );
    let applied = count(&gone.url, "SELECT count(*) AS n FROM tenant_stock")?;
    ensure!(applied == 0, "the removed tenant's message was applied");
    Ok(format!(
        "{total} messages over {} tenants applied once each, in their own databases, in order per key; the removed tenant's message left in its outbox",
        all.len() - 1
    ))
}
