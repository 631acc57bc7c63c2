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

    fn setup(url: &str, queue: &str) -> Result<(), String> {
        declare(url, queue, None)
    }

    fn setup_limited(url: &str, queue: &str, max_deliveries: u32) -> Result<(), String> {
        declare(url, queue, Some(max_deliveries))
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

/// A quorum queue `queue` dead-lettering to `<queue>.dlq`, with the
/// broker's own delivery limit when `limit` is set.
fn declare(url: &str, queue: &str, limit: Option<u32>) -> Result<(), String> {
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
            AMQPValue::LongString("quorum".into()),
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
    let consumer = diesel_inbox::lapin::Consumer::connect(
        options.url.as_str(),
        options.queue.as_str(),
        runner_policy(),
    );
    shared.serve(consumer, &options).await
}
