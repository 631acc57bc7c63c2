//! The guarantee across a PostgreSQL failover: the library's runner
//! consumes RabbitMQ messages into a primary whose standby streams its WAL
//! (`scripts/pg-failover.sh`, ports 15432 and 15433), through a TCP proxy
//! that stands for a virtual IP. Mid-run the standby's replication stalls
//! (a proxy between the two stops forwarding, as a slow network or a
//! busy standby would), the primary is SIGKILLed a random moment later
//! with every process of it, the standby is promoted and the virtual IP
//! switched to it. Every message is then checked against the new
//! primary's business table.
//!
//! - Synchronous (`synchronous_standby_names`, `synchronous_commit = on`):
//!   a commit waits for the standby, so none acknowledged while it stalled
//!   is lost. Every message exactly once.
//! - Asynchronous: the commits acknowledged while replication stalled
//!   never reached the standby, and their messages were acked to the
//!   broker: lost. The scenario requires that it loses some (it shows the
//!   check can fail), reports how many, and that the library said so at
//!   start (a WARN with the fix).
//!
//! Needs `INBOX_TEST_PG_FAILOVER` (set by `.ci/run`), the server binaries
//! of Debian's PostgreSQL, and root or the `postgres` user.

use crate::proxy::{Mode, Proxy};
use crate::scenarios::{command, ensure, orders, start, Broker, SKIPPED};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const PRIMARY: &str = "127.0.0.1:15432";
const STANDBY: &str = "127.0.0.1:15433";

fn url(at: &str) -> String {
    format!("postgres://diesel_inbox:diesel_inbox@{at}/diesel_inbox_test")
}

fn script(args: &[&str]) -> Result<String, String> {
    crate::scenarios::script("pg-failover.sh", args)
}

/// The pair of servers (stopped and removed when dropped), the proxy the
/// standby replicates through, and the virtual IP clients connect to.
struct Failover {
    replication: Proxy,
    vip: Proxy,
}

impl Failover {
    /// A fresh pair in `mode` (`sync` or `async`), streaming.
    fn start(mode: &str) -> Result<Failover, String> {
        let primary: SocketAddr = PRIMARY.parse().expect("an address");
        let replication = Proxy::start(primary)?;
        let vip = Proxy::start(primary)?;
        if let Err(e) = script(&["start", mode, &replication.port.to_string()]) {
            let _ = script(&["stop"]);
            return Err(e);
        }
        Ok(Failover { replication, vip })
    }

    /// The test database through the virtual IP.
    fn vip_url(&self) -> String {
        url(&format!("127.0.0.1:{}", self.vip.port))
    }

    /// Replication stalls (a slow network, a busy standby), a random
    /// moment later the primary's machine dies (every process SIGKILLed),
    /// the standby is promoted and the virtual IP moves to it. Says what
    /// it did.
    fn fail_over(&self) -> Result<String, String> {
        self.replication.set(Mode::Blackhole);
        let stall = Duration::from_millis(300 + random_below(500));
        std::thread::sleep(stall);
        let on_primary = inbox_rows(PRIMARY)?;
        script(&["kill"])?;
        self.replication.set(Mode::Refuse);
        let killed = Instant::now();
        script(&["promote"])?;
        self.vip.switch(STANDBY.parse().expect("an address"));
        Ok(format!(
            "replication stalled {stall:?} before the primary's kill ({on_primary} inbox rows on it), standby promoted in {:.1} s",
            killed.elapsed().as_secs_f64()
        ))
    }
}

impl Drop for Failover {
    fn drop(&mut self) {
        let _ = script(&["stop"]);
    }
}

/// The business table's rows, distinct message ids and inbox rows on the
/// server at `at`.
fn totals(at: &str) -> Result<(i64, i64, i64), String> {
    use diesel::prelude::*;
    #[derive(QueryableByName)]
    struct Totals {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        rows: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        distinct_ids: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        inbox: i64,
    }
    let mut conn = PgConnection::establish(&url(at)).map_err(|e| e.to_string())?;
    let t: Totals = diesel::sql_query(
        "SELECT COUNT(*) AS rows, COUNT(DISTINCT message_id) AS distinct_ids, \
         (SELECT COUNT(*) FROM inbox_messages WHERE consumer = 'broker-orders-pg') AS inbox \
         FROM broker_effects",
    )
    .get_result(&mut conn)
    .map_err(|e| e.to_string())?;
    Ok((t.rows, t.distinct_ids, t.inbox))
}

/// The inbox rows on the server at `at`.
fn inbox_rows(at: &str) -> Result<i64, String> {
    use diesel::prelude::*;
    let mut conn = PgConnection::establish(&url(at)).map_err(|e| e.to_string())?;
    diesel::dsl::sql::<diesel::sql_types::BigInt>("SELECT COUNT(*) FROM inbox_messages")
        .get_result(&mut conn)
        .map_err(|e| e.to_string())
}

/// A pseudo-random number below `bound` (the clock's nanoseconds).
fn random_below(bound: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15) % bound.max(1)
}

pub(crate) fn synchronous_standby_loses_nothing<B: Broker>(url: &str) -> Result<String, String> {
    failover::<B>(url, "sync")
}

pub(crate) fn asynchronous_standby_loses_acked_messages<B: Broker>(
    url: &str,
) -> Result<String, String> {
    failover::<B>(url, "async")
}

fn skipped() -> Option<String> {
    std::env::var("INBOX_TEST_PG_FAILOVER")
        .map_or(true, |v| v.is_empty())
        .then(|| format!(
            "{SKIPPED}INBOX_TEST_PG_FAILOVER is not set (set it to 1 where scripts/pg-failover.sh may run PostgreSQL's binaries on ports 15432-15433)"
        ))
}

fn failover<B: Broker>(broker: &str, mode: &str) -> Result<String, String> {
    if let Some(skipped) = skipped() {
        return Ok(skipped);
    }
    let n: u64 = 1_600;
    let pair = Failover::start(mode)?;
    {
        use diesel::connection::SimpleConnection;
        use diesel::Connection;
        let mut conn = diesel::PgConnection::establish(&url(PRIMARY)).map_err(|e| e.to_string())?;
        diesel_inbox::migrate(&mut conn).map_err(|e| e.to_string())?;
        conn.batch_execute(crate::consumer::PG_EFFECTS_DDL)
            .map_err(|e| e.to_string())?;
    }
    // What `diesel-inbox doctor` reads: the replication as it is.
    let replication = {
        use diesel::Connection;
        let mut conn = diesel::PgConnection::establish(&url(PRIMARY)).map_err(|e| e.to_string())?;
        let listed = diesel_inbox::durability(&mut conn).map_err(|e| e.to_string())?;
        listed
            .into_iter()
            .find(|p| p.name == "replication")
            .ok_or("no replication prerequisite listed")?
    };
    let expected = match mode {
        "sync" => (diesel_inbox::Verdict::Ok, "synchronous"),
        _ => (diesel_inbox::Verdict::Warn, "asynchronous"),
    };
    ensure!(
        (replication.verdict, replication.value.as_str()) == expected,
        "{mode}: durability() read {replication}"
    );
    let run = start::<B>(broker)?;
    B::publish(broker, &run.queue, &orders(&run, n))?;
    let mut consumer = command::<B>(&run, 8, 0, true)?;
    consumer
        .env("INBOX_BROKER_PG", pair.vip_url())
        .env("INBOX_BROKER_IDLE_MS", "60000")
        .env("INBOX_BROKER_EXPECT_APPLIED", n.to_string());
    let child = consumer
        .spawn()
        .map_err(|e| format!("spawn consumer: {e}"))?;

    // A random moment between a quarter and half of the way.
    let at = n / 4 + random_below(n / 4);
    let began = Instant::now();
    while (totals(PRIMARY)?.1 as u64) < at {
        ensure!(
            began.elapsed() < Duration::from_secs(120),
            "the runner applied fewer than {at} orders in 120 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let failed_over = pair.fail_over()?;

    let (stdout, counts) = crate::scenarios::runner_output(child)?;
    let live = stdout
        .lines()
        .find(|l| l.starts_with("live "))
        .unwrap_or("")
        .to_owned();
    let warned = live
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("durability_warnings="))
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|v| v > 0);
    // A commit whose answer was lost with the primary, but whose WAL the
    // standby had, comes back as `Duplicate`: each order is applied or a
    // duplicate once, as the runner sees it (nothing is published twice).
    ensure!(
        counts.dead_lettered == 0 && counts.applied + counts.duplicates == n,
        "the runner should settle every order once, applied or found applied: {counts:?} ({live})"
    );
    let (rows, distinct, inbox) = totals(STANDBY)?;
    ensure!(
        rows == distinct && inbox == distinct,
        "{mode}: a business row without its inbox row or twice: {rows} rows, {distinct} ids, {inbox} inbox rows"
    );
    let lost = n as i64 - distinct;
    let report = format!(
        "{mode}: at {at} applied, {failed_over}; {distinct} of {n} on the new primary, {lost} acked and lost, {} retried, {} duplicates",
        counts.retried,
        counts.duplicates
    );
    match mode {
        "sync" => {
            ensure!(
                lost == 0,
                "synchronous replication lost acked messages: {report}"
            );
            ensure!(!warned, "a synchronous standby was warned about: {live}");
        }
        _ => {
            ensure!(
                lost > 0,
                "asynchronous replication lost nothing while the standby stalled: the check cannot fail ({report})"
            );
            ensure!(
                warned,
                "the runner did not WARN of the asynchronous standby: {live}"
            );
        }
    }
    Ok(report)
}

pub(crate) fn outbox_chain_synchronous_loses_nothing<B: Broker>(
    url: &str,
) -> Result<String, String> {
    outbox_chain::<B>(url, "sync")
}

pub(crate) fn outbox_chain_asynchronous_loses_acked_orders<B: Broker>(
    url: &str,
) -> Result<String, String> {
    outbox_chain::<B>(url, "async")
}

/// The outbox chain (A → relay → broker → B) with A's database failed
/// over mid-run: synchronous, every order exactly once through the chain,
/// in order per customer (rows the relay deleted after the broker's
/// confirm may come back and be published again: B's inbox absorbs them);
/// asynchronous, orders A acked while replication stalled are gone, from
/// A and, unless the relay had published them, from B.
fn outbox_chain<B: Broker>(broker: &str, mode: &str) -> Result<String, String> {
    if let Some(skipped) = skipped() {
        return Ok(skipped);
    }
    let n: u64 = 1_000;
    let pair = Failover::start(mode)?;
    let at = n / 4 + random_below(n / 4);
    let chain = crate::chain::across_failover::<B>(
        broker,
        &pair.vip_url(),
        &url(PRIMARY),
        &url(STANDBY),
        n,
        at,
        &mut || pair.fail_over(),
    )?;
    let report = format!(
        "{mode}: at {at} placed, {}; of {} orders: {} lost from A and B, {} applied by B but gone from A, {} in A never published, {} applied twice; the relay published {}",
        chain.failover,
        chain.n,
        chain.lost,
        chain.stray,
        chain.unpublished,
        chain.doubled,
        chain.published
    );
    ensure!(chain.doubled == 0 && chain.unpublished == 0, "{report}");
    match mode {
        "sync" => {
            let exact = chain.exact.map_err(|e| format!("{e}: {report}"))?;
            ensure!(chain.lost == 0 && chain.stray == 0, "{report}");
            Ok(format!("{report}; {exact}"))
        }
        _ => {
            ensure!(
                chain.lost + chain.stray > 0,
                "asynchronous replication lost nothing while the standby stalled: the check cannot fail ({report})"
            );
            Ok(report)
        }
    }
}
