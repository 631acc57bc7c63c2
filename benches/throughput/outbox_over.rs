//! `--outbox --outbox-over nats,kafka`: the relay's rate against the
//! broker alone over NATS JetStream (`INBOX_TEST_NATS_URL`) and Kafka
//! (`INBOX_TEST_KAFKA_BROKERS`), as the `--outbox` rounds measure it over
//! RabbitMQ: each round fills the outbox with `--outbox-messages` messages
//! (a key each) and times, in alternating order, `Relay::run_once` with the
//! library's publisher (batches of `--outbox-batch`) and the same count of
//! messages published by the broker's client alone, in windows of the
//! batch size, each window's acknowledgements awaited (JetStream's publish
//! acks; Kafka's delivery reports, with `enable.idempotence`). With
//! `--outbox-relays N`, N relays (each with its pool) share each round's
//! outbox.

use crate::args::Args;
use crate::bench::Bench;
use crate::outbox_fill::{fill, median};
use diesel_inbox::outbox::{Publish, Relay};
use std::time::Instant;

/// One broker's relay and broker-alone loop.
trait Over {
    const NAME: &'static str;
    type Publisher: Publish + Clone + Send + Sync + 'static;
    /// The destination the messages go to, and the library's publisher.
    async fn open(round_id: &str) -> Result<(String, Self::Publisher, Self), String>
    where
        Self: Sized;
    /// Publishes `n` messages to the destination, in windows of `batch`.
    async fn alone(&self, n: usize, batch: usize) -> Result<(), String>;
}

fn env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

#[cfg(feature = "nats")]
struct Nats {
    js: async_nats::jetstream::Context,
    subject: String,
    /// Messages published alone so far (their ids stay unique: JetStream
    /// drops a repeated id within its window).
    sent: std::sync::atomic::AtomicUsize,
}

#[cfg(feature = "nats")]
impl Over for Nats {
    const NAME: &'static str = "NATS";
    type Publisher = diesel_inbox::outbox::nats::Publisher;

    async fn open(id: &str) -> Result<(String, Self::Publisher, Self), String> {
        use async_nats::jetstream::{self, stream};
        let url = env("INBOX_TEST_NATS_URL").ok_or("INBOX_TEST_NATS_URL is not set")?;
        let client = async_nats::connect(url).await.map_err(|e| e.to_string())?;
        let js = jetstream::new(client);
        let name = format!("bench_outbox_{}", id.replace(['.', '-'], "_"));
        let subject = format!("bench.{name}");
        js.create_stream(stream::Config {
            name,
            subjects: vec![subject.clone()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
        let publisher = diesel_inbox::outbox::nats::Publisher::new(js.clone());
        let sent = std::sync::atomic::AtomicUsize::new(0);
        Ok((subject.clone(), publisher, Nats { js, subject, sent }))
    }

    async fn alone(&self, n: usize, batch: usize) -> Result<(), String> {
        let mut sent = 0;
        while sent < n {
            let mut acks = Vec::new();
            for _ in sent..(sent + batch).min(n) {
                let mut headers = async_nats::HeaderMap::new();
                let id = self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                headers.insert("Nats-Msg-Id", format!("{}-{id}", self.subject).as_str());
                acks.push(
                    self.js
                        .publish_with_headers(self.subject.clone(), headers, vec![7u8; 64].into())
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            sent += acks.len();
            for ack in acks {
                ack.await.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

#[cfg(feature = "kafka")]
struct Kafka {
    producer: rdkafka::producer::FutureProducer,
    topic: String,
}

#[cfg(feature = "kafka")]
impl Over for Kafka {
    const NAME: &'static str = "Kafka";
    type Publisher = diesel_inbox::outbox::kafka::Publisher;

    async fn open(id: &str) -> Result<(String, Self::Publisher, Self), String> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;
        use rdkafka::ClientConfig;
        let brokers =
            env("INBOX_TEST_KAFKA_BROKERS").ok_or("INBOX_TEST_KAFKA_BROKERS is not set")?;
        let topic = format!("bench-outbox-{id}");
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .map_err(|e| e.to_string())?;
        for created in admin
            .create_topics(
                &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(std::time::Duration::from_secs(10))),
            )
            .await
            .map_err(|e| e.to_string())?
        {
            created.map_err(|(t, e)| format!("creating {t}: {e}"))?;
        }
        let producer = || {
            ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("enable.idempotence", "true")
                .create::<rdkafka::producer::FutureProducer>()
                .map_err(|e| e.to_string())
        };
        let publisher = diesel_inbox::outbox::kafka::Publisher::new(producer()?);
        Ok((
            topic.clone(),
            publisher,
            Kafka {
                producer: producer()?,
                topic,
            },
        ))
    }

    async fn alone(&self, n: usize, batch: usize) -> Result<(), String> {
        use rdkafka::producer::FutureRecord;
        let payload = vec![7u8; 64];
        let mut sent = 0;
        while sent < n {
            let mut pending = Vec::new();
            for i in sent..(sent + batch).min(n) {
                let key = format!("k{i}");
                let record = FutureRecord::to(&self.topic).key(&key).payload(&payload);
                pending.push(
                    self.producer
                        .send_result(record)
                        .map_err(|(e, _)| e.to_string())?,
                );
            }
            sent += pending.len();
            for delivery in pending {
                delivery
                    .await
                    .map_err(|_| "the producer was dropped".to_string())?
                    .map_err(|(e, _)| e.to_string())?;
            }
        }
        Ok(())
    }
}

/// The rounds over each broker `--outbox-over` names: a JSON object per
/// broker, printed as a line each.
pub(crate) fn measure<B: Bench>(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    args: &Args,
) -> Result<String, String> {
    let mut results = Vec::new();
    for broker in &args.outbox_over {
        let result = match broker.as_str() {
            #[cfg(feature = "nats")]
            "nats" => rounds::<B, Nats>(runtime, url, args)?,
            #[cfg(feature = "kafka")]
            "kafka" => rounds::<B, Kafka>(runtime, url, args)?,
            other => {
                return Err(format!(
                    "--outbox-over: no such broker in this build: {other}"
                ))
            }
        };
        results.push(result);
    }
    Ok(format!("[{}]", results.join(", ")))
}

fn rounds<B: Bench, O: Over>(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    args: &Args,
) -> Result<String, String> {
    let (n, batch) = (args.outbox_messages, args.outbox_batch);
    let (destination, publisher, over) = runtime.block_on(O::open(&crate::run_id()))?;
    // `--outbox-relays` relays, each with its pool, share the outbox.
    let relays: Vec<_> = (0..args.outbox_relays.max(1))
        .map(|_| Relay::new(B::relay_pool(url, 4), publisher.clone()).batch_size(batch))
        .collect();
    let (mut relayed, mut alone, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let mut pair = [0.0; 2];
        for k in 0..2 {
            let variant = (k + round) % 2;
            fill::<B>(url, n, 0, &destination)?;
            let began = Instant::now();
            if variant == 0 {
                let runs = relays.iter().map(|relay| relay.run_once());
                let reports = runtime.block_on(futures_util::future::join_all(runs));
                let mut published = 0;
                for report in reports {
                    published += report.map_err(|e| e.to_string())?.published;
                }
                if published != n as u64 {
                    return Err(format!("the relays published {published} of {n}"));
                }
            } else {
                runtime.block_on(over.alone(n, batch))?;
            }
            pair[variant] = n as f64 / began.elapsed().as_secs_f64();
        }
        relayed.push(pair[0]);
        alone.push(pair[1]);
        ratios.push(pair[0] / pair[1]);
    }
    let (relay_rate, alone_rate, ratio) = (
        median(&mut relayed),
        median(&mut alone),
        median(&mut ratios),
    );
    println!(
        "{}: {} relay(s) over {} {relay_rate:.0} msg/s, {} alone {alone_rate:.0}; relay/broker {ratio:.2} (median of the rounds' ratios; of the medians {:.2}; {} rounds of {n}, batch {batch})",
        B::LABEL,
        relays.len(),
        O::NAME,
        O::NAME,
        relay_rate / alone_rate,
        args.rounds
    );
    Ok(format!(
        "{{\"broker\": \"{}\", \"relays\": {}, \"relay\": {relay_rate:.1}, \"broker_alone\": {alone_rate:.1}, \"relay_over_broker\": {ratio:.3}}}",
        O::NAME,
        relays.len()
    ))
}
