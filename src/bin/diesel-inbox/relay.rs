//! `outbox relay`: a relay as a process of its own, publishing to RabbitMQ,
//! NATS JetStream or Kafka.

use crate::cli::RelayArgs;
use crate::Failure;
use std::process::ExitCode;

/// The relay on the database `url`, until SIGTERM or Ctrl-C (or one pass
/// with `--once`).
#[cfg(any(feature = "lapin", feature = "nats", feature = "kafka"))]
pub(crate) fn run(url: &str, options: &RelayArgs) -> Result<ExitCode, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("no async runtime: {e}")))?;
    runtime.block_on(async {
        if let Some(amqp) = &options.broker.amqp {
            return to_rabbitmq(url, amqp, options).await;
        }
        if let Some(nats) = &options.broker.nats {
            return to_nats(url, nats, options).await;
        }
        if let Some(brokers) = &options.broker.kafka {
            return to_kafka(url, brokers, options).await;
        }
        Err(Failure(
            "pass --amqp URL --exchange X, --nats URL or --kafka BROKERS".into(),
        ))
    })
}

#[cfg(not(any(feature = "lapin", feature = "nats", feature = "kafka")))]
pub(crate) fn run(_: &str, _: &RelayArgs) -> Result<ExitCode, Failure> {
    Err(Failure(
        "this diesel-inbox was built without a broker: cargo install diesel-inbox --features cli,lapin (or nats, or kafka)".into(),
    ))
}

/// The failure of a broker this binary was built without.
#[cfg(all(
    any(feature = "lapin", feature = "nats", feature = "kafka"),
    not(all(feature = "lapin", feature = "nats", feature = "kafka"))
))]
fn without(broker: &str, feature: &str) -> Result<ExitCode, Failure> {
    Err(Failure(format!(
        "this diesel-inbox was built without {broker}: cargo install diesel-inbox --features cli,{feature}"
    )))
}

#[cfg(feature = "lapin")]
async fn to_rabbitmq(url: &str, amqp: &str, options: &RelayArgs) -> Result<ExitCode, Failure> {
    let exchange = options.exchange.clone().unwrap_or_default();
    let publisher = diesel_inbox::outbox::lapin::Publisher::connect(amqp, exchange);
    database::relay(url, publisher, options).await
}

#[cfg(all(not(feature = "lapin"), any(feature = "nats", feature = "kafka")))]
async fn to_rabbitmq(_: &str, _: &str, _: &RelayArgs) -> Result<ExitCode, Failure> {
    without("RabbitMQ", "lapin")
}

#[cfg(feature = "nats")]
async fn to_nats(url: &str, nats: &str, options: &RelayArgs) -> Result<ExitCode, Failure> {
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(nats)
        .await
        .map_err(|e| Failure(format!("cannot connect to NATS at {nats}: {e}")))?;
    let publisher = diesel_inbox::outbox::nats::Publisher::new(async_nats::jetstream::new(client));
    database::relay(url, publisher, options).await
}

#[cfg(all(not(feature = "nats"), any(feature = "lapin", feature = "kafka")))]
async fn to_nats(_: &str, _: &str, _: &RelayArgs) -> Result<ExitCode, Failure> {
    without("NATS", "nats")
}

/// An idempotent producer (a send librdkafka retries is written once, in
/// order) to `brokers`.
#[cfg(feature = "kafka")]
async fn to_kafka(url: &str, brokers: &str, options: &RelayArgs) -> Result<ExitCode, Failure> {
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .create()
        .map_err(|e| Failure(format!("cannot create a Kafka producer for {brokers}: {e}")))?;
    let publisher = diesel_inbox::outbox::kafka::Publisher::new(producer);
    database::relay(url, publisher, options).await
}

#[cfg(all(not(feature = "kafka"), any(feature = "lapin", feature = "nats")))]
async fn to_kafka(_: &str, _: &str, _: &RelayArgs) -> Result<ExitCode, Failure> {
    without("Kafka", "kafka")
}

/// The relay on the pool of the database a URL names.
#[cfg(any(feature = "lapin", feature = "nats", feature = "kafka"))]
mod database {
    use crate::cli::RelayArgs;
    use crate::pool::{stop, with_pool, OnPool};
    use crate::Failure;
    use diesel_inbox::outbox::{Publish, Relay, RelayPool};
    use std::process::ExitCode;

    /// Runs a relay from the database `url` names to `publisher`.
    pub(super) async fn relay<P: Publish>(
        url: &str,
        publisher: P,
        options: &RelayArgs,
    ) -> Result<ExitCode, Failure> {
        with_pool(
            url,
            2,
            Run {
                publisher,
                options,
                url,
            },
        )
        .await
    }

    struct Run<'a, P> {
        publisher: P,
        options: &'a RelayArgs,
        url: &'a str,
    }

    impl<P: Publish> OnPool for Run<'_, P> {
        async fn run<D: RelayPool + 'static>(self, pool: D) -> Result<ExitCode, Failure> {
            let Run {
                publisher,
                options,
                url,
            } = self;
            let mut relay = Relay::new(pool, publisher);
            if options.wal {
                relay = relay.wal(url);
            }
            if let Some(size) = options.batch_size {
                relay = relay.batch_size(size);
            }
            if let Some(interval) = options.poll_interval {
                relay = relay.poll_interval(interval);
            }
            if let Some(attempts) = options.max_publish_attempts {
                relay = relay.max_publish_attempts(attempts);
            }
            if let Some(lease) = options.lease {
                relay = relay.lease(lease);
            }
            tracing::info!(
                target: "diesel_inbox",
                once = options.once,
                batch_size = ?options.batch_size,
                poll_interval = ?options.poll_interval,
                lease = ?options.lease,
                wal = options.wal,
                "diesel-inbox: outbox relay: started (stop with SIGTERM or Ctrl-C)"
            );
            let report = if options.once {
                relay.run_once().await.map_err(|e| Failure(e.to_string()))?
            } else {
                relay
                    .run(stop())
                    .await
                    .map_err(|e| Failure(e.to_string()))?
            };
            println!(
                "published {}, failed {}, dead {}, given back {}",
                report.published, report.failed, report.dead, report.released
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
