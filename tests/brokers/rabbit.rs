//! RabbitMQ through lapin: a quorum queue per scenario with a dead-letter
//! queue, publishing with confirms, the consumer loop with reconnects.

use crate::consumer::{apply_or_crash, block_on, open, policy, runner_policy, Counts, Options};
use crate::scenarios::Broker;
use diesel_inbox::brokers::BrokerError;
use futures_lite::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::time::{Duration, Instant};

pub struct Rabbit;

fn dlq(queue: &str) -> String {
    format!("{queue}.dlq")
}

async fn connect(url: &str) -> Result<Connection, String> {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| format!("connect to RabbitMQ: {e}"))
}

impl Broker for Rabbit {
    const NAME: &'static str = "rabbitmq";
    const URL_VAR: &'static str = "INBOX_TEST_AMQP_URL";
    const REDELIVERS_IN_PLACE: bool = true;

    fn own() -> Vec<crate::scenarios::Scenario> {
        let mut own: Vec<crate::scenarios::Scenario> = vec![
            (
                "connect_any_skips_a_node_that_is_down",
                connect_any_skips_a_node_that_is_down,
            ),
            ("node_lost_quorum_queue_loses_nothing", |_| {
                crate::cluster::rabbit_node_lost(true)
            }),
            ("node_lost_classic_queue_loses_what_it_acked", |_| {
                crate::cluster::rabbit_node_lost(false)
            }),
            ("node_lost_chain_stays_exact", |_| {
                crate::cluster::rabbit_chain_node_lost()
            }),
        ];
        #[cfg(feature = "postgres")]
        own.extend(Self::failover_scenarios());
        #[cfg(feature = "postgres")]
        own.push(("tenants_chain_with_kills", |url| {
            crate::tenants::chain_with_kills(url, crate::tenants::Server::Postgres)
        }));
        #[cfg(all(feature = "postgres", feature = "mysql"))]
        own.push(("tenants_chain_with_kills_mariadb", |url| {
            crate::tenants::chain_with_kills(url, crate::tenants::Server::Mariadb)
        }));
        own
    }

    fn setup(url: &str, queue: &str) -> Result<(), String> {
        declare(url, queue, None, true)
    }

    fn setup_limited(url: &str, queue: &str, max_deliveries: u32) -> Result<(), String> {
        declare(url, queue, Some(max_deliveries), true)
    }

    fn publish(url: &str, queue: &str, messages: &[(String, Vec<u8>)]) -> Result<(), String> {
        block_on(async {
            let conn = connect(url).await?;
            let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| e.to_string())?;
            let mut confirms = Vec::with_capacity(messages.len());
            for (id, body) in messages {
                let properties = BasicProperties::default()
                    .with_message_id(id.as_str().into())
                    .with_delivery_mode(2);
                confirms.push(
                    channel
                        .basic_publish(
                            "".into(),
                            queue.into(),
                            BasicPublishOptions::default(),
                            body,
                            properties,
                        )
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            for confirm in confirms {
                confirm
                    .await
                    .map_err(|e| format!("publisher confirm: {e}"))?;
            }
            conn.close(200, "done".into())
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn dead_lettered(url: &str, queue: &str) -> Result<String, String> {
        block_on(async {
            let conn = connect(url).await?;
            let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
            let passive = QueueDeclareOptions {
                passive: true,
                durable: true,
                ..QueueDeclareOptions::default()
            };
            let declared = channel
                .queue_declare(dlq(queue).into(), passive, FieldTable::default())
                .await
                .map_err(|e| e.to_string())?;
            match declared.message_count() {
                1 => Ok("1 message in the dead-letter queue".into()),
                n => Err(format!("{n} messages in the dead-letter queue, expected 1")),
            }
        })
    }

    fn drop_connections() -> Result<String, String> {
        let out = std::process::Command::new("rabbitmqctl")
            .args(["close_all_connections", "closed by the broker test"])
            .output()
            .map_err(|e| format!("rabbitmqctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "rabbitmqctl close_all_connections: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok("rabbitmqctl close_all_connections".into())
    }

    fn destination(queue: &str) -> String {
        queue.to_string()
    }

    fn outage(down: Duration) -> Result<String, String> {
        let ctl = |what: &str| -> Result<(), String> {
            let out = std::process::Command::new("rabbitmqctl")
                .arg(what)
                .output()
                .map_err(|e| format!("rabbitmqctl: {e}"))?;
            match out.status.success() {
                true => Ok(()),
                false => Err(format!(
                    "rabbitmqctl {what}: {}",
                    String::from_utf8_lossy(&out.stderr)
                )),
            }
        };
        ctl("stop_app")?;
        std::thread::sleep(down);
        ctl("start_app")?;
        Ok(format!(
            "RabbitMQ stopped for {} s (rabbitmqctl stop_app, start_app)",
            down.as_secs()
        ))
    }

    fn teardown(url: &str, queue: &str) {
        let _ = block_on(async {
            let conn = connect(url).await?;
            let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
            for name in [queue.to_string(), dlq(queue)] {
                let _ = channel
                    .queue_delete(name.into(), QueueDeleteOptions::default())
                    .await;
            }
            Ok::<_, String>(())
        });
    }

    fn consume() -> i32 {
        crate::consumer::run_process(consume)
    }
}

impl Rabbit {
    /// Fail-overs of PostgreSQL under the runner and the chain.
    #[cfg(feature = "postgres")]
    fn failover_scenarios() -> Vec<crate::scenarios::Scenario> {
        use crate::failover;
        vec![
            (
                "pg_failover_synchronous_standby_loses_nothing",
                failover::synchronous_standby_loses_nothing::<Rabbit>,
            ),
            (
                "pg_failover_asynchronous_standby_loses_acked_messages",
                failover::asynchronous_standby_loses_acked_messages::<Rabbit>,
            ),
            (
                "pg_failover_outbox_chain_synchronous_loses_nothing",
                failover::outbox_chain_synchronous_loses_nothing::<Rabbit>,
            ),
            (
                "pg_failover_outbox_chain_asynchronous_loses_acked_orders",
                failover::outbox_chain_asynchronous_loses_acked_orders::<Rabbit>,
            ),
        ]
    }
}

/// A quorum queue `queue` (a classic one unless `quorum`) dead-lettering
/// to `<queue>.dlq`, with the broker's own delivery limit when `limit` is
/// set.
fn declare(url: &str, queue: &str, limit: Option<u32>, quorum: bool) -> Result<(), String> {
    block_on(async {
        let conn = connect(url).await?;
        let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(dlq(queue).into(), durable, FieldTable::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(if quorum { "quorum" } else { "classic" }.into()),
        );
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(dlq(queue).as_str().into()),
        );
        if let Some(limit) = limit {
            // The quorum queue dead-letters a message requeued more
            // often than this by itself.
            arguments.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongInt(i32::try_from(limit).unwrap_or(i32::MAX)),
            );
        }
        channel
            .queue_declare(queue.into(), durable, arguments)
            .await
            .map_err(|e| format!("declare {queue}: {e}"))?;
        conn.close(200, "done".into())
            .await
            .map_err(|e| e.to_string())
    })
}

/// A queue `queue` of the kind asked for (quorum, else classic), on the
/// node `url` reaches (a classic queue lives there).
pub(crate) fn declare_kind(url: &str, queue: &str, quorum: bool) -> Result<(), String> {
    declare(url, queue, None, quorum)
}

/// Consumes until idle, reconnecting whenever the connection goes.
async fn consume(options: Options) -> Result<Counts, String> {
    if crate::consumer::runner_mode() {
        return consume_with_runner(options).await;
    }
    let mut db = open(&options.db).await?;
    let policy = policy();
    let mut counts = Counts::default();
    let started = Instant::now();
    loop {
        let conn = match connect(&options.url).await {
            Ok(conn) => conn,
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                eprintln!("{e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
        channel
            .basic_qos(options.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut deliveries = channel
            .basic_consume(
                options.queue.as_str().into(),
                format!("consumer-{}", std::process::id()).into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let delivery = match tokio::time::timeout(options.idle, deliveries.next()).await {
                Err(_) => return Ok(counts),
                Ok(Some(Ok(delivery))) => delivery,
                // The connection or the channel went: reconnect.
                Ok(Some(Err(_)) | None) => break,
            };
            let deliveries_so_far = diesel_inbox::lapin::deliveries(&delivery);
            let handled = diesel_inbox::lapin::handle(delivery, &policy, async |id, body| {
                apply_or_crash(&mut db, &options, deliveries_so_far, id, body).await
            })
            .await;
            match handled {
                Ok(handled) => counts.record(&handled),
                // The ack did not reach the broker: it redelivers.
                Err(BrokerError::Settle(_)) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        counts.reconnects += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The library's runner: `in_flight` = the prefetch, until SIGTERM or idle.
async fn consume_with_runner(options: Options) -> Result<Counts, String> {
    let shared = crate::consumer::Shared::new(&options.db).await?;
    // `INBOX_BROKER_NODES`: a cluster's URLs, comma-separated
    // (`connect_any`); else the broker's one URL.
    let consumer = match std::env::var("INBOX_BROKER_NODES") {
        Ok(nodes) if !nodes.is_empty() => diesel_inbox::lapin::Consumer::connect_any(
            nodes.split(','),
            options.queue.as_str(),
            runner_policy(),
        ),
        _ => diesel_inbox::lapin::Consumer::connect(
            options.url.as_str(),
            options.queue.as_str(),
            runner_policy(),
        ),
    };
    shared.serve(consumer, &options).await
}

/// `Consumer::connect_any` over three "nodes": a port nothing listens
/// on, a TCP proxy to the broker, and the broker itself. The runner
/// starts past the closed port, on the proxy. A third of the way in the
/// proxy closes its connections and refuses new ones (the node it was
/// connected to is lost): the runner connects again, past the proxy and
/// the closed port, to the broker, and every order is applied exactly
/// once.
pub(crate) fn connect_any_skips_a_node_that_is_down(url: &str) -> Result<String, String> {
    use crate::proxy::{Mode, Proxy};
    use crate::scenarios::{check_exact, command, ensure, orders, start, wait_for_applied};
    let n: u64 = 600;
    let run = start::<Rabbit>(url)?;
    Rabbit::publish(url, &run.queue, &orders(&run, n))?;
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        listener.local_addr().map_err(|e| e.to_string())?.port()
    };
    // The broker's host:port, from `amqp://user:pass@host:port/vhost`.
    let (head, rest) = url.rsplit_once('@').ok_or("an AMQP URL with credentials")?;
    let (address, vhost) = rest.split_once('/').unwrap_or((rest, ""));
    let address = if address.contains(':') {
        address.to_owned()
    } else {
        format!("{address}:5672")
    };
    let proxy = Proxy::start(
        address
            .parse()
            .map_err(|e| format!("the broker's address {address}: {e}"))?,
    )?;
    let through = format!("{head}@127.0.0.1:{}/{vhost}", proxy.port);
    let closed = format!("{head}@127.0.0.1:{dead}/{vhost}");
    let nodes = format!("{closed},{through},{url}");
    let mut runner = command::<Rabbit>(&run, 8, 0, true)?;
    runner
        .env("INBOX_BROKER_NODES", &nodes)
        .env("INBOX_BROKER_EXPECT_APPLIED", n.to_string())
        .env("INBOX_BROKER_IDLE_MS", "30000");
    let child = runner.spawn().map_err(|e| format!("spawn consumer: {e}"))?;
    wait_for_applied(&run, (n / 3) as i64)?;
    proxy.set(Mode::Refuse);
    let (stdout, counts) = crate::scenarios::runner_output(child)?;
    check_exact(&run, n)?;
    ensure!(counts.dead_lettered == 0, "{counts:?}");
    let reconnects = stdout
        .lines()
        .find(|l| l.starts_with("report "))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix("reconnects="))
        })
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    ensure!(
        reconnects >= 1,
        "the runner did not connect again after its node was lost: {stdout}"
    );
    Ok(format!(
        "nodes [a closed port, a proxy, the broker]: started on the proxy; the proxy lost at a third; connected again to the broker ({reconnects} reconnects); {n} orders applied exactly once ({} duplicates)",
        counts.duplicates
    ))
}
