//! `outbox relay`: a relay as a process of its own, publishing to RabbitMQ,
//! NATS JetStream or Kafka.

use crate::cli::RelayArgs;
use crate::Failure;
use std::process::ExitCode;

/// What a relay process relays: one database, or every tenant a list
/// names (`--tenants`).
#[cfg(any(feature = "lapin", feature = "nats", feature = "kafka"))]
enum Target<'a> {
    Database(&'a str),
    Tenants { source: &'a str },
}

/// The relay on the database `url`, until SIGTERM or Ctrl-C (or one pass
/// with `--once`).
#[cfg(any(feature = "lapin", feature = "nats", feature = "kafka"))]
pub(crate) fn run(url: &str, options: &RelayArgs) -> Result<ExitCode, Failure> {
    publish(&Target::Database(url), options)
}

/// One relay over every tenant `source` lists (`--tenants`), until SIGTERM
/// or Ctrl-C (or one pass over all with `--once`). The list is read again
/// every 10 s; every tenant must be of the first one's backend.
#[cfg(any(feature = "lapin", feature = "nats", feature = "kafka"))]
pub(crate) fn run_tenants(source: &str, options: &RelayArgs) -> Result<ExitCode, Failure> {
    if options.wal {
        return Err(Failure(
            "--wal streams one database's slot; with --tenants the relay reads each tenant's outbox table".into(),
        ));
    }
    // The list and its backend, checked before the broker is connected.
    let listed = crate::tenants::read(source)?;
    crate::tenants::one_backend(&listed)?;
    publish(&Target::Tenants { source }, options)
}

#[cfg(any(feature = "lapin", feature = "nats", feature = "kafka"))]
fn publish(target: &Target<'_>, options: &RelayArgs) -> Result<ExitCode, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("no async runtime: {e}")))?;
    runtime.block_on(async {
        if let Some(amqp) = &options.broker.amqp {
            return to_rabbitmq(target, amqp, options).await;
        }
        if let Some(nats) = &options.broker.nats {
            return to_nats(target, nats, options).await;
        }
        if let Some(brokers) = &options.broker.kafka {
            return to_kafka(target, brokers, options).await;
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

#[cfg(not(any(feature = "lapin", feature = "nats", feature = "kafka")))]
pub(crate) fn run_tenants(source: &str, options: &RelayArgs) -> Result<ExitCode, Failure> {
    run(source, options)
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
async fn to_rabbitmq(
    target: &Target<'_>,
    amqp: &str,
    options: &RelayArgs,
) -> Result<ExitCode, Failure> {
    let exchange = options.exchange.clone().unwrap_or_default();
    let publisher = diesel_inbox::outbox::lapin::Publisher::connect(amqp, exchange);
    database::relay(target, publisher, options).await
}

#[cfg(all(not(feature = "lapin"), any(feature = "nats", feature = "kafka")))]
async fn to_rabbitmq(_: &Target<'_>, _: &str, _: &RelayArgs) -> Result<ExitCode, Failure> {
    without("RabbitMQ", "lapin")
}

#[cfg(feature = "nats")]
async fn to_nats(
    target: &Target<'_>,
    nats: &str,
    options: &RelayArgs,
) -> Result<ExitCode, Failure> {
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(nats)
        .await
        .map_err(|e| Failure(format!("cannot connect to NATS at {nats}: {e}")))?;
    let publisher = diesel_inbox::outbox::nats::Publisher::new(async_nats::jetstream::new(client));
    database::relay(target, publisher, options).await
}

#[cfg(all(not(feature = "nats"), any(feature = "lapin", feature = "kafka")))]
async fn to_nats(_: &Target<'_>, _: &str, _: &RelayArgs) -> Result<ExitCode, Failure> {
    without("NATS", "nats")
}

/// An idempotent producer (a send librdkafka retries is written once, in
/// order) to `brokers`.
#[cfg(feature = "kafka")]
async fn to_kafka(
    target: &Target<'_>,
    brokers: &str,
    options: &RelayArgs,
) -> Result<ExitCode, Failure> {
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .create()
        .map_err(|e| Failure(format!("cannot create a Kafka producer for {brokers}: {e}")))?;
    let publisher = diesel_inbox::outbox::kafka::Publisher::new(producer);
    database::relay(target, publisher, options).await
}

#[cfg(all(not(feature = "kafka"), any(feature = "lapin", feature = "nats")))]
async fn to_kafka(_: &Target<'_>, _: &str, _: &RelayArgs) -> Result<ExitCode, Failure> {
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

    /// Runs a relay from the database `url` names (or every tenant) to
    /// `publisher`.
    pub(super) async fn relay<P: Publish + 'static>(
        target: &super::Target<'_>,
        publisher: P,
        options: &RelayArgs,
    ) -> Result<ExitCode, Failure> {
        match target {
            super::Target::Database(url) => {
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
            super::Target::Tenants { source } => tenants::relay(source, publisher, options).await,
        }
    }

    /// The relay over tenants, on pools of the backend of their URLs.
    mod tenants {
        use crate::cli::RelayArgs;
        use crate::pool::{stop, with_tenants, OnTenants};
        use crate::Failure;
        use diesel_inbox::outbox::{Publish, Relay};
        use diesel_inbox::tenants::{TenantPool, Tenants};
        use std::process::ExitCode;

        pub(in super::super) async fn relay<P: Publish + 'static>(
            source: &str,
            publisher: P,
            options: &RelayArgs,
        ) -> Result<ExitCode, Failure> {
            // One connection per tenant's pool: a relay's turn uses one.
            with_tenants(source, 1, Over { publisher, options }).await
        }

        struct Over<'a, P> {
            publisher: P,
            options: &'a RelayArgs,
        }

        impl<P: Publish + 'static> OnTenants for Over<'_, P> {
            async fn run<T>(self, tenants: Tenants<T>) -> Result<ExitCode, Failure>
            where
                T: TenantPool,
                T::Guard: 'static,
            {
                let Over { publisher, options } = self;
                let relay = super::configured(Relay::tenants(tenants, publisher), options);
                tracing::info!(
                    target: "diesel_inbox",
                    once = options.once,
                    batch_size = ?options.batch_size,
                    poll_interval = ?options.poll_interval,
                    lease = ?options.lease,
                    "diesel-inbox: outbox relay over tenants: started (stop with SIGTERM or Ctrl-C)"
                );
                super::reported(if options.once {
                    relay.run_once().await
                } else {
                    relay.run(stop()).await
                })
            }
        }
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
            let mut relay = configured(Relay::new(pool, publisher), options);
            if options.wal {
                relay = relay.wal(url);
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
            reported(if options.once {
                relay.run_once().await
            } else {
                relay.run(stop()).await
            })
        }
    }

    /// The command line's settings, on a relay on one database or one over
    /// tenants.
    trait Configure: Sized {
        fn batch_size(self, n: usize) -> Self;
        fn poll_interval(self, interval: std::time::Duration) -> Self;
        fn max_publish_attempts(self, n: u32) -> Self;
        fn lease(self, lease: std::time::Duration) -> Self;
    }

    impl<D: RelayPool, P: Publish> Configure for Relay<D, P> {
        fn batch_size(self, n: usize) -> Self {
            Relay::batch_size(self, n)
        }
        fn poll_interval(self, interval: std::time::Duration) -> Self {
            Relay::poll_interval(self, interval)
        }
        fn max_publish_attempts(self, n: u32) -> Self {
            Relay::max_publish_attempts(self, n)
        }
        fn lease(self, lease: std::time::Duration) -> Self {
            Relay::lease(self, lease)
        }
    }

    impl<T, P> Configure for diesel_inbox::outbox::TenantRelay<T, P>
    where
        T: diesel_inbox::tenants::TenantPool,
        T::Guard: 'static,
        P: Publish + 'static,
    {
        fn batch_size(self, n: usize) -> Self {
            Self::batch_size(self, n)
        }
        fn poll_interval(self, interval: std::time::Duration) -> Self {
            Self::poll_interval(self, interval)
        }
        fn max_publish_attempts(self, n: u32) -> Self {
            Self::max_publish_attempts(self, n)
        }
        fn lease(self, lease: std::time::Duration) -> Self {
            Self::lease(self, lease)
        }
    }

    /// `relay` with the settings the command line gives.
    fn configured<R: Configure>(mut relay: R, options: &RelayArgs) -> R {
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
        relay
    }

    /// What the relay did, on stdout.
    fn reported(
        report: Result<diesel_inbox::outbox::RelayReport, diesel_inbox::outbox::RelayError>,
    ) -> Result<ExitCode, Failure> {
        let report = report.map_err(|e| Failure(e.to_string()))?;
        println!(
            "published {}, failed {}, dead {}, given back {}",
            report.published, report.failed, report.dead, report.released
        );
        Ok(ExitCode::SUCCESS)
    }
}
