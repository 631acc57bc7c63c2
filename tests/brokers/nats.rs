//! NATS JetStream through async-nats: a file-stored stream and a durable
//! pull consumer per scenario, publishing with `Nats-Msg-Id`, the consumer
//! loop (the client reconnects by itself).

use crate::consumer::{apply_or_crash, block_on, open, policy, runner_policy, Counts, Options};
use crate::scenarios::Broker;
use async_nats::jetstream::{self, consumer::pull, stream};
use diesel_inbox::brokers::BrokerError;
use futures_lite::StreamExt;
use std::time::Duration;

pub struct Nats;

/// Unacked messages of a killed consumer come back after this.
const ACK_WAIT: Duration = Duration::from_secs(2);

async fn context(url: &str) -> Result<jetstream::Context, String> {
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(url)
        .await
        .map_err(|e| format!("connect to NATS: {e}"))?;
    Ok(jetstream::new(client))
}

fn stream_name(queue: &str) -> String {
    queue.replace(['.', '-'], "_")
}

impl Broker for Nats {
    const NAME: &'static str = "nats";
    const URL_VAR: &'static str = "INBOX_TEST_NATS_URL";
    const REDELIVERS_IN_PLACE: bool = false;

    fn own() -> Vec<crate::scenarios::Scenario> {
        Nats::cluster_scenarios()
    }

    fn setup(url: &str, queue: &str) -> Result<(), String> {
        // The policy decides when to stop (`Term`).
        create(url, queue, -1)
    }

    fn setup_limited(url: &str, queue: &str, max_deliveries: u32) -> Result<(), String> {
        create(url, queue, i64::from(max_deliveries))
    }

    fn publish(url: &str, queue: &str, messages: &[(String, Vec<u8>)]) -> Result<(), String> {
        block_on(async {
            let js = context(url).await?;
            let subject = format!("inbox.{}", stream_name(queue));
            let mut seen = std::collections::HashSet::new();
            let mut waited = false;
            for (id, body) in messages {
                if !seen.insert(id.clone()) && !waited {
                    // The second publishes (they follow every first one) go
                    // out after the duplicate window, so that JetStream
                    // stores them and the inbox must catch them.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    waited = true;
                }
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", id.as_str());
                js.publish_with_headers(subject.clone(), headers, body.clone().into())
                    .await
                    .map_err(|e| e.to_string())?
                    .await
                    .map_err(|e| format!("publish ack: {e}"))?;
            }
            Ok(())
        })
    }

    fn dead_lettered(url: &str, queue: &str) -> Result<String, String> {
        // Terminated messages are neither pending nor waiting for an ack.
        block_on(async {
            let js = context(url).await?;
            let stream = js
                .get_stream(stream_name(queue))
                .await
                .map_err(|e| e.to_string())?;
            let mut consumer: jetstream::consumer::PullConsumer = stream
                .get_consumer("consumer")
                .await
                .map_err(|e| e.to_string())?;
            let info = consumer.info().await.map_err(|e| e.to_string())?;
            if info.num_pending > 0 || info.num_ack_pending > 0 {
                return Err(format!(
                    "{} messages pending, {} waiting for an ack",
                    info.num_pending, info.num_ack_pending
                ));
            }
            Ok("terminated: nothing pending or waiting for an ack".into())
        })
    }

    fn drop_connections() -> Result<String, String> {
        restart_nats_server()
    }

    fn destination(queue: &str) -> String {
        format!("inbox.{}", stream_name(queue))
    }

    fn setup_ordered(url: &str, queue: &str) -> Result<(), String> {
        Self::setup(url, queue)?;
        block_on(async {
            let js = context(url).await?;
            let stream = js
                .get_stream(stream_name(queue))
                .await
                .map_err(|e| e.to_string())?;
            stream
                .delete_consumer("consumer")
                .await
                .map_err(|e| format!("delete consumer: {e}"))?;
            stream
                .create_consumer(pull::Config {
                    durable_name: Some("consumer".into()),
                    ack_wait: ACK_WAIT,
                    max_deliver: -1,
                    max_ack_pending: 1,
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("create consumer: {e}"))?;
            Ok(())
        })
    }

    fn outage(down: Duration) -> Result<String, String> {
        stop_nats_server(down).map(|how| format!("{how}, down for {} s", down.as_secs()))
    }

    fn teardown(url: &str, queue: &str) {
        let _ = block_on(async {
            let js = context(url).await?;
            js.delete_stream(stream_name(queue))
                .await
                .map_err(|e| e.to_string())
        });
    }

    fn consume() -> i32 {
        crate::consumer::run_process(consume)
    }
}

/// `queue`'s file-stored stream and its durable pull consumer, which
/// JetStream delivers a message to at most `max_deliver` times (-1: no
/// limit).
fn create(url: &str, queue: &str, max_deliver: i64) -> Result<(), String> {
    create_replicated(url, queue, max_deliver, 1, false)
}

/// [`create`] with `replicas` copies of the stream (a cluster's nodes);
/// `ordered`: one message unacked at a time (as `setup_ordered`).
pub(crate) fn create_replicated(
    url: &str,
    queue: &str,
    max_deliver: i64,
    replicas: usize,
    ordered: bool,
) -> Result<(), String> {
    block_on(async {
        let js = context(url).await?;
        let stream = js
            .create_stream(stream::Config {
                name: stream_name(queue),
                subjects: vec![format!("inbox.{}", stream_name(queue))],
                storage: stream::StorageType::File,
                num_replicas: replicas,
                // Short, so that the tests' second publishes of an id
                // (after it) reach the consumer.
                duplicate_window: Duration::from_millis(200),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("create stream: {e}"))?;
        stream
            .create_consumer(pull::Config {
                durable_name: Some("consumer".into()),
                ack_wait: ACK_WAIT,
                max_deliver,
                max_ack_pending: if ordered { 1 } else { 0 },
                ..Default::default()
            })
            .await
            .map_err(|e| format!("create consumer: {e}"))?;
        Ok(())
    })
}

/// Kills the running nats-server and starts it again with the same
/// command line (JetStream keeps its file store).
fn restart_nats_server() -> Result<String, String> {
    stop_nats_server(Duration::ZERO)
}

/// The scenario's durable pull consumer on `queue`'s stream.
pub async fn pull_consumer(
    url: &str,
    queue: &str,
) -> Result<jetstream::consumer::PullConsumer, String> {
    // As a service's start does: JetStream may still be recovering its
    // streams after a restart (an earlier scenario restarts the server),
    // and answers requests only when it has: try for up to 30 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let found = async {
            context(url)
                .await?
                .get_stream(stream_name(queue))
                .await
                .map_err(|e| e.to_string())?
                .get_consumer("consumer")
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        match found {
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("the pull consumer, again after: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            done => return done,
        }
    }
}

/// Stops nats-server, waits `down`, starts it again with its arguments.
fn stop_nats_server(down: Duration) -> Result<String, String> {
    let pid = std::fs::read_dir("/proc")
        .map_err(|e| e.to_string())?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            // The machine's server, not a node of scripts/nats-cluster.sh.
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "nats-server")
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| !String::from_utf8_lossy(&c).contains("inbox-test"))
        })
        .ok_or("no nats-server process")?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|e| e.to_string())?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    std::process::Command::new("kill")
        .arg(pid.to_string())
        .status()
        .map_err(|e| e.to_string())?;
    for _ in 0..100 {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(down);
    std::process::Command::new("setsid")
        .arg("-f")
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("restart nats-server: {e}"))?;
    Ok(format!("nats-server restarted ({})", args.join(" ")))
}

/// Consumes until idle. The client reconnects by itself; the pull stream
/// reports the outage as errors, which are skipped.
async fn consume(options: Options) -> Result<Counts, String> {
    if crate::consumer::runner_mode() {
        return consume_with_runner(options).await;
    }
    let mut db = open(&options.db).await?;
    let policy = policy();
    let mut counts = Counts::default();
    let js = context(&options.url).await?;
    let stream = js
        .get_stream(stream_name(&options.queue))
        .await
        .map_err(|e| e.to_string())?;
    let consumer: jetstream::consumer::PullConsumer = stream
        .get_consumer("consumer")
        .await
        .map_err(|e| e.to_string())?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(usize::from(options.prefetch))
        .heartbeat(Duration::from_millis(500))
        .expires(Duration::from_secs(1))
        .messages()
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let message = match tokio::time::timeout(options.idle, messages.next()).await {
            Err(_) => return Ok(counts),
            Ok(None) => return Err("the message stream ended".into()),
            Ok(Some(Err(e))) => {
                eprintln!("stream: {e}");
                counts.reconnects += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Ok(Some(Ok(message))) => message,
        };
        let deliveries_so_far = diesel_inbox::nats::deliveries(&message);
        let handled = diesel_inbox::nats::handle(message, &policy, async |id, body| {
            apply_or_crash(&mut db, &options, deliveries_so_far, id, body).await
        })
        .await;
        match handled {
            Ok(handled) => counts.record(&handled),
            // The ack did not reach the server: it redelivers after ack_wait.
            Err(BrokerError::Settle(e)) => eprintln!("ack: {e}"),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The library's runner: `in_flight` = the prefetch, until SIGTERM or idle.
async fn consume_with_runner(options: Options) -> Result<Counts, String> {
    let shared = crate::consumer::Shared::new(&options.db).await?;
    let js = context(&options.url).await?;
    let consumer: jetstream::consumer::PullConsumer = js
        .get_stream(stream_name(&options.queue))
        .await
        .map_err(|e| e.to_string())?
        .get_consumer("consumer")
        .await
        .map_err(|e| e.to_string())?;
    let consumer = diesel_inbox::nats::Consumer::new(consumer, runner_policy());
    shared.serve(consumer, &options).await
}

/// The server name of the node that leads `queue`'s stream (a cluster's).
pub(crate) fn stream_leader(url: &str, queue: &str) -> Result<String, String> {
    block_on(async {
        let mut stream = context(url)
            .await?
            .get_stream(stream_name(queue))
            .await
            .map_err(|e| e.to_string())?;
        let info = stream.info().await.map_err(|e| e.to_string())?;
        info.cluster
            .as_ref()
            .and_then(|c| c.leader.clone())
            .ok_or_else(|| format!("stream {} has no leader", stream_name(queue)))
    })
}

/// Scenarios of a 3-node cluster (`scripts/nats-cluster.sh`).
impl Nats {
    pub(crate) fn cluster_scenarios() -> Vec<crate::scenarios::Scenario> {
        vec![
            ("node_lost_three_replicas_loses_nothing", |_| {
                crate::cluster::nats_node_lost(3)
            }),
            ("node_lost_one_replica_waits_for_it", |_| {
                crate::cluster::nats_node_lost(1)
            }),
            ("node_lost_chain_stays_exact", |_| {
                crate::cluster::nats_chain_node_lost()
            }),
        ]
    }
}
