//! Publishing the outbox to Kafka: the destination is the topic, the
//! ordering key is the record's key (so one key stays in one partition, in
//! order), the outbox id travels in the `message-id` header (which
//! `diesel_inbox::kafka`'s runner deduplicates on), the headers are
//! copied, and a publish counts only after its delivery report.
//!
//! Create the producer with `enable.idempotence=true`: a send that
//! librdkafka retries is then written once and in order, instead of again
//! at a new offset.

use super::{OutboxMessage, Publish, PublishError};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// A [`Publish`]er to Kafka topics.
///
/// ```no_run
/// # fn start() -> Result<(), Box<dyn std::error::Error>> {
/// use rdkafka::producer::FutureProducer;
/// use rdkafka::ClientConfig;
///
/// let producer: FutureProducer = ClientConfig::new()
///     .set("bootstrap.servers", "127.0.0.1:9092")
///     .set("enable.idempotence", "true")
///     .create()?;
/// let publisher = diesel_inbox::outbox::kafka::Publisher::new(producer);
/// # let _ = publisher;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Publisher {
    producer: FutureProducer,
    id_header: String,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("id_header", &self.id_header)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Publishes through `producer` (librdkafka reconnects by itself; a
    /// send it cannot deliver within its `message.timeout.ms` is given
    /// back to the relay).
    pub fn new(producer: FutureProducer) -> Self {
        Publisher {
            producer,
            id_header: crate::kafka::ID_HEADER.to_owned(),
        }
    }

    /// The header that carries the outbox id (default `message-id`, as
    /// the Kafka runner reads it).
    pub fn id_header(mut self, name: impl Into<String>) -> Self {
        self.id_header = name.into();
        self
    }
}

/// What a failed send means to the relay: the broker's refusal of this
/// record is counted; anything else (no broker, a timeout, a full queue)
/// is an outage.
fn failed(e: KafkaError) -> PublishError {
    let refused = matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidTopic
        )
    );
    match refused {
        true => PublishError::refused(e),
        false => PublishError::unavailable(e),
    }
}

impl Publish for Publisher {
    fn messaging_system(&self) -> Option<&str> {
        Some("kafka")
    }

    async fn publish<'a>(&'a self, messages: &'a [OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            let mut headers =
                OwnedHeaders::new_with_capacity(message.headers.len() + 1).insert(Header {
                    key: &self.id_header,
                    value: Some(message.id.as_str()),
                });
            for (name, value) in &message.headers {
                if *name != self.id_header {
                    headers = headers.insert(Header {
                        key: name,
                        value: Some(value.as_str()),
                    });
                }
            }
            let mut record = FutureRecord::to(&message.destination)
                .payload(&message.payload)
                .headers(headers);
            if let Some(key) = &message.ordering_key {
                record = record.key(key);
            }
            pending.push(
                self.producer
                    .send_result(record)
                    .map_err(|(e, _)| failed(e)),
            );
        }
        let mut results = Vec::with_capacity(messages.len());
        for sent in pending {
            results.push(match sent {
                Ok(delivery) => match delivery.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(failed(e)),
                    Err(_) => Err(PublishError::unavailable(
                        "the producer dropped the send before its delivery report",
                    )),
                },
                Err(e) => Err(e),
            });
        }
        results
    }
}
