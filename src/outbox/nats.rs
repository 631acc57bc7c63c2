//! Publishing the outbox to NATS JetStream: the destination is the
//! subject, `Nats-Msg-Id` is the outbox id (so the stream also drops a
//! republished message within its duplicate window), the headers are
//! copied, and a publish counts only after its PubAck.

use super::{OutboxMessage, Publish, PublishError};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage as Message;

/// A [`Publish`]er to the JetStream streams that bind the destinations
/// as subjects.
///
/// ```no_run
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let publisher = diesel_inbox::outbox::nats::Publisher::new(async_nats::jetstream::new(client));
/// # let _ = publisher;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Publisher {
    context: async_nats::jetstream::Context,
}

impl Publisher {
    /// Publishes through `context` (the client reconnects by itself;
    /// publishes while it is away time out and are retried).
    pub fn new(context: async_nats::jetstream::Context) -> Self {
        Publisher { context }
    }
}

fn failed(e: async_nats::jetstream::context::PublishError) -> PublishError {
    match e.kind() {
        PublishErrorKind::StreamNotFound => {
            PublishError::refused(format!("no stream takes this subject ({e})"))
        }
        PublishErrorKind::MaxPayloadExceeded => PublishError::refused(e),
        PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => {
            PublishError::refused(e)
        }
        _ => PublishError::unavailable(e),
    }
}

impl Publish for Publisher {
    fn messaging_system(&self) -> Option<&str> {
        Some("nats")
    }

    async fn publish<'a>(&'a self, messages: &'a [OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            let mut publish = Message::build()
                .payload(message.payload.clone().into())
                .message_id(&message.id);
            for (name, value) in &message.headers {
                publish = publish.header(name.as_str(), value.as_str());
            }
            let sent = self
                .context
                .send_publish(message.destination.clone(), publish)
                .await;
            pending.push(sent.map_err(failed));
        }
        let mut results = Vec::with_capacity(messages.len());
        let mut streams: Vec<String> = Vec::new();
        for sent in pending {
            results.push(match sent {
                Ok(ack) => ack.await.map_err(failed).map(|ack| {
                    if !streams.contains(&ack.stream) {
                        streams.push(ack.stream);
                    }
                }),
                Err(e) => Err(e),
            });
        }
        // Each stream's durability, once per process (a lookup after the
        // first: the batch's confirms are in).
        for stream in streams {
            crate::nats::check_stream(self.context.clone(), stream).await;
        }
        results
    }
}
