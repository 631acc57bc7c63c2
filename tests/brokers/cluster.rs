//! A broker node lost mid-run.
//!
//! NATS: a 3-node cluster with JetStream (`scripts/nats-cluster.sh`,
//! clients on 14222-14224). The library's runner (8 in flight) is given
//! one node's URL, as a service's seed list often is, and learns the
//! others from it. A third of the way in, a node is SIGKILLed:
//!
//! - a stream of 3 replicas: the node the consumer is connected to. The
//!   client reconnects to a surviving node, the stream elects a leader
//!   there, and every message is applied exactly once without the node
//!   coming back.
//! - a stream of 1 replica: the node that holds it. Nothing is delivered
//!   while it is down (the stream is gone with it); once it is back (its
//!   file store kept), every message is applied exactly once. With memory
//!   storage, or a disk lost with the node, its messages would be gone.
//! - the outbox chain (A → relay → B, streams of 3 replicas): the node A,
//!   the relay and B are connected to. The chain stays exact.
//!
//! RabbitMQ: a 3-node cluster (`scripts/rabbit-cluster.sh`, AMQP on
//! 5681-5683). The runner is given every node's URL
//! (`Consumer::connect_any`) and connects to node 1, where the queue was
//! declared. A third of the way in node 1 is SIGKILLed, and more messages
//! are published through node 2 while it is down:
//!
//! - a quorum queue: the runner connects to node 2, the queue elects a
//!   leader among the two left, and every message, those published while
//!   node 1 is down included, is applied exactly once without it.
//! - a classic queue (it lives on node 1): nothing is delivered while
//!   node 1 is down, and the messages published meanwhile are confirmed
//!   to their publisher and dropped: lost. Node 1 comes back (its disk
//!   kept) with the messages it held, which are applied exactly once.
//! - the outbox chain on quorum queues, the relay given every node's URL
//!   too: exact.
//!
//! Needs `INBOX_TEST_NATS_CLUSTER` (nats-server) or
//! `INBOX_TEST_RABBIT_CLUSTER` (Debian's RabbitMQ), both set by `.ci/run`.

use crate::scenarios::{command, ensure, orders, start_with, Broker, SKIPPED};
use std::time::{Duration, Instant};

/// `f` again, for up to 60 s, while JetStream's API times out: a new
/// cluster, or one that lost a node, elects its leaders first (a publish
/// made twice is stored once, or applied once by the inbox).
fn again<T>(mut f: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let began = Instant::now();
    loop {
        match f() {
            Err(e) if e.contains("timed out") && began.elapsed() < Duration::from_secs(60) => {
                std::thread::sleep(Duration::from_millis(500));
            }
            done => return done,
        }
    }
}

/// A cluster started by `scripts/<script>`, stopped and removed when
/// dropped.
struct Cluster(&'static str);

impl Cluster {
    /// `Err(SKIPPED...)` unless `var` is set (see [`skipped`]).
    fn start(script: &'static str, var: &str, ports: &str) -> Result<Cluster, String> {
        if std::env::var(var).map_or(true, |v| v.is_empty()) {
            return Err(format!(
                "{SKIPPED}{var} is not set (set it to 1 where scripts/{script} may run a cluster on ports {ports})"
            ));
        }
        let cluster = Cluster(script);
        cluster.run(&["start"])?;
        Ok(cluster)
    }

    fn run(&self, args: &[&str]) -> Result<String, String> {
        crate::scenarios::script(self.0, args)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.run(&["stop"]);
    }
}

/// A skipped scenario's `Err(SKIPPED...)` as its `Ok` report.
fn skipped(result: Result<String, String>) -> Result<String, String> {
    match result {
        Err(e) if e.starts_with(SKIPPED) => Ok(e),
        other => other,
    }
}

#[cfg(feature = "nats")]
fn nats_cluster() -> Result<Cluster, String> {
    Cluster::start(
        "nats-cluster.sh",
        "INBOX_TEST_NATS_CLUSTER",
        "14222-14224, 16222-16224 and 18222-18224",
    )
}

#[cfg(feature = "nats")]
pub(crate) fn nats_node_lost(replicas: usize) -> Result<String, String> {
    skipped(nats_node_lost_on(replicas))
}

#[cfg(feature = "nats")]
fn nats_node_lost_on(replicas: usize) -> Result<String, String> {
    use crate::nats::Nats;
    let n: u64 = 2_000;
    let cluster = nats_cluster()?;
    let script = |args: &[&str]| cluster.run(args);
    let seed = script(&["url", "1"])?;
    let run = start_with::<Nats>(&seed, |url, queue| {
        again(|| crate::nats::create_replicated(url, queue, -1, replicas, false))
    })?;
    again(|| Nats::publish(&seed, &run.queue, &orders(&run, n)))?;
    // The node to lose: the consumer's (its seed) when the stream has
    // copies elsewhere, else the one that holds the stream.
    let leader = again(|| crate::nats::stream_leader(&seed, &run.queue))?;
    let victim = match replicas {
        1 => leader.trim_start_matches('n').to_owned(),
        _ => "1".to_owned(),
    };
    let mut consumer = command::<Nats>(&run, 8, 0, true)?;
    consumer
        .env("INBOX_BROKER_IDLE_MS", "60000")
        .env("INBOX_BROKER_EXPECT_APPLIED", n.to_string());
    let child = consumer
        .spawn()
        .map_err(|e| format!("spawn consumer: {e}"))?;
    crate::scenarios::wait_for_applied(&run, (n / 3) as i64)?;
    let at = crate::scenarios::applied_so_far(&run);
    script(&["kill", &victim])?;
    let killed = Instant::now();
    let mut report = format!("{replicas} replica(s): node n{victim} SIGKILLed at {at} applied");
    if replicas == 1 {
        // Nothing can be delivered while the only copy is down.
        std::thread::sleep(Duration::from_secs(5));
        let during = crate::scenarios::applied_so_far(&run);
        script(&["restart", &victim])?;
        report.push_str(&format!(
            ", {} applied in the 5 s it was down, then restarted (its file store kept)",
            during - at
        ));
    }
    let (_, counts) = crate::scenarios::runner_output(child)?;
    crate::scenarios::check_exact(&run, n)?;
    ensure!(counts.dead_lettered == 0, "dead-lettered: {counts:?}");
    let survivor = script(&["url", if victim == "1" { "2" } else { "1" }])?;
    let after = again(|| crate::nats::stream_leader(&survivor, &run.queue))?;
    ensure!(
        replicas == 1 || after != format!("n{victim}"),
        "the stream's leader is still the killed node n{victim}"
    );
    Ok(format!(
        "{report}; every order applied exactly once {:.1} s after the kill (stream leader {leader} before, {after} after), {} retried, {} duplicates",
        killed.elapsed().as_secs_f64(),
        counts.retried,
        counts.duplicates
    ))
}

/// The outbox chain with streams of 3 replicas; node 1, which A, the
/// relay and B are connected to, SIGKILLed a third of the way in.
#[cfg(feature = "nats")]
pub(crate) fn nats_chain_node_lost() -> Result<String, String> {
    skipped((|| {
        let cluster = nats_cluster()?;
        // The streams made (and removed) through node 2; A, the relay and
        // B connect to node 1 and learn the others from it.
        let (node1, node2) = (cluster.run(&["url", "1"])?, cluster.run(&["url", "2"])?);
        crate::chain::across_node_loss::<crate::nats::Nats>(
            &node2,
            &node1,
            &|url, queue, ordered| {
                again(|| crate::nats::create_replicated(url, queue, -1, 3, ordered))
            },
            &mut || {
                cluster
                    .run(&["kill", "1"])
                    .map(|_| "node n1 SIGKILLed".into())
            },
        )
    })())
}

#[cfg(feature = "lapin")]
fn rabbit_cluster() -> Result<Cluster, String> {
    Cluster::start(
        "rabbit-cluster.sh",
        "INBOX_TEST_RABBIT_CLUSTER",
        "5681-5683 and 25681-25683",
    )
}

/// Publishes `messages` to `queue` with confirms, as a plain publisher
/// does (not `mandatory`): how many the broker acked and nacked.
#[cfg(feature = "lapin")]
fn publish_confirmed(
    url: &str,
    queue: &str,
    messages: &[(String, Vec<u8>)],
) -> Result<(u64, u64), String> {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::Confirmation;
    crate::consumer::block_on(async {
        let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .map_err(|e| format!("connect to {url}: {e}"))?;
        let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let (mut acked, mut nacked) = (0, 0);
        for (id, body) in messages {
            let properties = lapin::BasicProperties::default()
                .with_message_id(id.as_str().into())
                .with_delivery_mode(2);
            let confirm = channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    body,
                    properties,
                )
                .await
                .map_err(|e| e.to_string())?;
            let confirm = tokio::time::timeout(Duration::from_secs(30), confirm)
                .await
                .map_err(|_| format!("no publisher confirm within 30 s from {url}"))?
                .map_err(|e| format!("publisher confirm: {e}"))?;
            match confirm {
                Confirmation::Nack(_) => nacked += 1,
                _ => acked += 1,
            }
        }
        let _ = conn.close(200, "done".into()).await;
        Ok((acked, nacked))
    })
}

/// How many messages `queue` holds ready (a passive declare).
#[cfg(feature = "lapin")]
fn queue_depth(url: &str, queue: &str) -> Result<u64, String> {
    use lapin::options::QueueDeclareOptions;
    crate::consumer::block_on(async {
        let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .map_err(|e| format!("connect to {url}: {e}"))?;
        let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
        let passive = QueueDeclareOptions {
            passive: true,
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let declared = channel
            .queue_declare(queue.into(), passive, lapin::types::FieldTable::default())
            .await
            .map_err(|e| format!("passive declare {queue}: {e}"))?;
        let _ = conn.close(200, "done".into()).await;
        Ok(u64::from(declared.message_count()))
    })
}

/// The ids of `run`'s orders applied, each with how often.
#[cfg(feature = "lapin")]
fn applied_ids(
    run: &crate::scenarios::Run,
) -> Result<std::collections::HashMap<String, i64>, String> {
    use diesel::prelude::*;
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        message_id: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        times: i64,
    }
    let mut conn = SqliteConnection::establish(&run.db).map_err(|e| e.to_string())?;
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT message_id, COUNT(*) AS times FROM broker_effects GROUP BY message_id",
    )
    .load(&mut conn)
    .map_err(|e| e.to_string())?;
    Ok(rows.into_iter().map(|r| (r.message_id, r.times)).collect())
}

/// A 3-node RabbitMQ cluster; the queue (`quorum`, or a classic one)
/// declared on node 1, which the runner (every node's URL) connects to;
/// node 1 SIGKILLed a third of the way in, 200 more orders published
/// through node 2 while it is down.
#[cfg(feature = "lapin")]
pub(crate) fn rabbit_node_lost(quorum: bool) -> Result<String, String> {
    skipped(rabbit_node_lost_on(quorum))
}

#[cfg(feature = "lapin")]
fn rabbit_node_lost_on(quorum: bool) -> Result<String, String> {
    use crate::rabbit::Rabbit;
    let (n, m): (u64, u64) = (1_500, 200);
    let cluster = rabbit_cluster()?;
    let seed = cluster.run(&["url", "1"])?;
    let nodes = cluster.run(&["urls"])?;
    let survivor = cluster.run(&["url", "2"])?;
    let run = start_with::<Rabbit>(&seed, |url, queue| {
        crate::rabbit::declare_kind(url, queue, quorum)
    })?;
    let all = orders(&run, n + m);
    Rabbit::publish(&seed, &run.queue, &all[..n as usize])?;
    let mut runner = command::<Rabbit>(&run, 8, 0, true)?;
    runner
        .env("INBOX_BROKER_NODES", &nodes)
        .env("INBOX_BROKER_IDLE_MS", "90000")
        // A classic queue drops what is published while its node is down
        // (checked below): the runner stops once the others are applied.
        .env(
            "INBOX_BROKER_EXPECT_APPLIED",
            if quorum { n + m } else { n }.to_string(),
        );
    let child = runner.spawn().map_err(|e| format!("spawn consumer: {e}"))?;
    crate::scenarios::wait_for_applied(&run, (n / 3) as i64)?;
    let at = crate::scenarios::applied_so_far(&run);
    cluster.run(&["kill", "1"])?;
    let killed = Instant::now();
    // What was in flight on node 1's connection settles first.
    std::thread::sleep(Duration::from_secs(1));
    let (acked, nacked) = publish_confirmed(&survivor, &run.queue, &all[n as usize..])?;
    let down_from = crate::scenarios::applied_so_far(&run);
    std::thread::sleep(Duration::from_secs(5));
    let down_to = crate::scenarios::applied_so_far(&run);
    let mut report = format!(
        "{} queue: node 1 SIGKILLed at {at} of {n} applied; {m} more published through node 2 while it was down ({acked} acked, {nacked} nacked); {} applied in 5 s while it was down",
        if quorum { "quorum" } else { "classic" },
        down_to - down_from
    );
    if !quorum {
        cluster.run(&["restart", "1"])?;
        report.push_str("; node 1 restarted (its disk kept)");
    }
    let (stdout, counts) = crate::scenarios::runner_output(child)?;
    ensure!(counts.dead_lettered == 0, "dead-lettered: {counts:?}");
    let warned = stdout
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("classic_queue_warnings="))
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| format!("no live line: {stdout}"))?;
    let applied = applied_ids(&run)?;
    let doubled: Vec<_> = applied.iter().filter(|(_, &t)| t != 1).collect();
    ensure!(doubled.is_empty(), "applied more than once: {doubled:?}");
    let missing = |range: &[(String, Vec<u8>)]| {
        range
            .iter()
            .filter(|(id, _)| !applied.contains_key(id))
            .count() as u64
    };
    let (before, during) = (missing(&all[..n as usize]), missing(&all[n as usize..]));
    ensure!(
        before == 0,
        "{before} of the {n} orders published before the kill were never applied ({report})"
    );
    if quorum {
        ensure!(
            during == 0 && nacked == 0,
            "{during} of the {m} orders published while node 1 was down were never applied ({report})"
        );
        crate::scenarios::check_exact(&run, n + m)?;
        ensure!(
            warned == 0,
            "the runner took a quorum queue for a classic one"
        );
        Ok(format!(
            "{report}; every order applied exactly once without node 1, {:.1} s after the kill ({} duplicates)",
            killed.elapsed().as_secs_f64(),
            counts.duplicates
        ))
    } else {
        ensure!(
            down_to == down_from,
            "a classic queue whose node is down delivered ({report})"
        );
        // Once at most (once per process); it needs a redelivery flagged
        // as such, which a SIGKILLed node may not have recorded.
        ensure!(
            warned <= 1,
            "the runner WARNed {warned} times of a classic queue, expected once at most ({report})"
        );
        ensure!(
            nacked == 0,
            "the broker nacked {nacked} publishes: the loss below must be of acked ones ({report})"
        );
        // Not applied, and not in the queue either: lost.
        std::thread::sleep(Duration::from_secs(1));
        let waiting = queue_depth(&seed, &run.queue)?;
        let lost = during.saturating_sub(waiting);
        ensure!(
            lost > 0,
            "a classic queue lost nothing of what was published while its node was down: the test cannot show the loss it exists for ({report}; {waiting} still queued)"
        );
        Ok(format!(
            "{report}; the {n} orders it held applied exactly once after it came back; of the {acked} acked while it was down, {lost} lost (never delivered, not in the queue); the runner WARNed {warned} time(s) of a classic queue",
        ))
    }
}

/// The outbox chain on quorum queues; node 1, which A, the relay and B
/// connect to first, SIGKILLed a third of the way in.
#[cfg(feature = "lapin")]
pub(crate) fn rabbit_chain_node_lost() -> Result<String, String> {
    skipped((|| {
        let cluster = rabbit_cluster()?;
        let seed = cluster.run(&["url", "1"])?;
        let nodes = cluster.run(&["urls"])?;
        crate::chain::across_node_loss::<crate::rabbit::Rabbit>(
            &seed,
            &nodes,
            &|url, queue, _| crate::rabbit::declare_kind(url, queue, true),
            &mut || {
                cluster
                    .run(&["kill", "1"])
                    .map(|_| "node 1 SIGKILLed".into())
            },
        )
    })())
}
