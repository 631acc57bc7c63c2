//! Publishing the outbox to RabbitMQ (lapin): the destination is the
//! routing key on the publisher's exchange; every publish is `mandatory`
//! and waits for the broker's publisher confirm, so an unroutable message
//! is a failure, not a silent drop. The AMQP `message_id` is the outbox id,
//! the headers are copied, and messages are persistent (delivery mode 2).

use super::{OutboxMessage, Publish, PublishError};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation};
use std::time::Duration;

/// How long a publish waits for the broker's confirm before the batch is
/// given back as unavailable.
pub(crate) const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest payload the publisher sends by default: RabbitMQ 3.x's
/// default `max_message_size` (128 MiB). RabbitMQ closes the channel on a
/// larger message instead of refusing just that one, so the publisher
/// refuses it first ([`max_message_size`](Publisher::max_message_size);
/// RabbitMQ 4's default is 16 MiB).
pub(crate) const DEFAULT_MAX_MESSAGE_SIZE: usize = 128 * 1024 * 1024;

/// A [`Publish`]er to a RabbitMQ exchange. A publish waits 10 s for the
/// broker's confirm; without one by then, the batch is given back as
/// unavailable (counted against no message).
///
/// ```no_run
/// # async fn start(channel: lapin::Channel) {
/// use diesel_inbox::outbox;
///
/// // On a channel of your own (it cannot be reopened if it closes):
/// let on_channel = outbox::lapin::Publisher::new(channel, "orders-exchange");
/// // On a connection of its own, made again after a broker outage:
/// let reconnecting = outbox::lapin::Publisher::connect("amqp://localhost:5672/%2f", "orders-exchange")
///     .max_message_size(16 * 1024 * 1024);
/// # }
/// ```
pub struct Publisher {
    exchange: String,
    max_message_size: usize,
    state: tokio::sync::Mutex<State>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("exchange", &self.exchange)
            .field("max_message_size", &self.max_message_size)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    connection: Option<lapin::Connection>,
    channel: Option<lapin::Channel>,
    /// Whether the channel is in confirm mode.
    confirming: bool,
    /// Whether the broker nacked a publish on the channel: a publisher of
    /// its own connection opens a new one before the next publish, at most
    /// once per [`RENEW_AFTER_NACK`] (a queue that nacks on purpose, full
    /// with `x-overflow = reject-publish`, must not cost a connection per
    /// publish).
    nacked: bool,
    /// When a nack last made it open a new connection.
    renewed: Option<std::time::Instant>,
    /// The nodes to connect to, and the one that answered last.
    nodes: Option<crate::lapin::Nodes>,
}

impl Publisher {
    /// Publishes to `exchange` (`""`: the default exchange, where the
    /// routing key is the queue's name) on `channel`. The channel is put
    /// in confirm mode at the first publish. If it closes, the relay stops
    /// with [`PublishError::Closed`]; [`connect`](Self::connect) reopens.
    pub fn new(channel: lapin::Channel, exchange: impl Into<String>) -> Self {
        Publisher {
            exchange: exchange.into(),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            state: tokio::sync::Mutex::new(State {
                channel: Some(channel),
                ..State::default()
            }),
        }
    }

    /// Publishes to `exchange` on a connection of its own to `url`, made
    /// at the first publish and made again after it fails.
    pub fn connect(url: impl Into<String>, exchange: impl Into<String>) -> Self {
        Self::connect_any([url], exchange)
    }

    /// [`connect`](Self::connect) to the first of a cluster's nodes that
    /// answers (`urls`, in order, from the one that answered last), and to
    /// the next that does after a failure: the relay goes on through the
    /// loss of the node it published to (each attempt bounded by
    /// [`NODE_CONNECT_TIMEOUT`](crate::lapin::NODE_CONNECT_TIMEOUT)).
    ///
    /// ```
    /// let nodes = ["amqp://rabbit-1:5672/%2f", "amqp://rabbit-2:5672/%2f"];
    /// let publisher = diesel_inbox::outbox::lapin::Publisher::connect_any(nodes, "orders-exchange");
    /// ```
    pub fn connect_any(
        urls: impl IntoIterator<Item = impl Into<String>>,
        exchange: impl Into<String>,
    ) -> Self {
        Publisher {
            exchange: exchange.into(),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            state: tokio::sync::Mutex::new(State {
                nodes: Some(crate::lapin::Nodes::new(urls)),
                ..State::default()
            }),
        }
    }

    /// The largest payload sent (default 128 MiB, RabbitMQ
    /// 3.x's default `max_message_size`; RabbitMQ 4's is 16 MiB); a
    /// larger message is refused, and dead after `max_publish_attempts`. Set it to
    /// the broker's `max_message_size`.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// The channel to publish on, in confirm mode: (re)connected if this
    /// publisher owns its connection.
    async fn channel(&self, state: &mut State) -> Result<lapin::Channel, PublishError> {
        // A channel that was nacked is not used again when another can be
        // opened: after a quorum queue's leader was lost, RabbitMQ 3.10
        // was seen to nack every later publish of a channel that had
        // published to it (for minutes), and none of a new connection's.
        let usable = state
            .channel
            .as_ref()
            .is_some_and(|c| c.status().connected())
            && !(state.nacked
                && state.nodes.is_some()
                && state
                    .renewed
                    .is_none_or(|at| at.elapsed() >= RENEW_AFTER_NACK));
        if state.nacked && !usable {
            state.renewed = Some(std::time::Instant::now());
        }
        if !usable {
            match &state.nodes {
                None => {
                    return Err(PublishError::closed(
                        "the channel closed, and a Publisher::new cannot open another: use Publisher::connect",
                    ))
                }
                // Nothing to wait for: the relay stops with the error.
                Some(nodes) if nodes.is_empty() => {
                    return Err(PublishError::closed(crate::lapin::NO_URL))
                }
                Some(_) => {}
            }
            state.channel = None;
            state.confirming = false;
            state.nacked = false;
            if let Some(old) = state.connection.take() {
                let _ = old.close(200, "reconnecting".into()).await;
            }
            let nodes = state
                .nodes
                .as_mut()
                .expect("a publisher of its own connection");
            let connection = nodes.connect().await.map_err(PublishError::unavailable)?;
            tracing::info!(target: crate::TRACING_TARGET, node = nodes.current(), "diesel-inbox: outbox relay: connected to RabbitMQ");
            state.channel = Some(connection.create_channel().await.map_err(unavailable)?);
            state.connection = Some(connection);
        }
        let channel = state.channel.clone().expect("a channel was opened above");
        if !state.confirming {
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(unavailable)?;
            state.confirming = true;
        }
        Ok(channel)
    }
}

/// How often a nack may make a publisher of its own connection open a
/// new one.
const RENEW_AFTER_NACK: std::time::Duration = std::time::Duration::from_secs(10);

fn unavailable(e: lapin::Error) -> PublishError {
    PublishError::unavailable(e)
}

fn properties(message: &OutboxMessage) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in &message.headers {
        headers.insert(
            ShortString::from(name.as_str()),
            AMQPValue::LongString(value.as_str().into()),
        );
    }
    BasicProperties::default()
        .with_message_id(message.id.as_str().into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

impl Publish for Publisher {
    fn messaging_system(&self) -> Option<&str> {
        Some("rabbitmq")
    }

    fn messaging_route<'a>(&'a self, destination: &'a str) -> (&'a str, Option<&'a str>) {
        (&self.exchange, Some(destination))
    }

    async fn publish<'a>(&'a self, messages: &'a [OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut state = self.state.lock().await;
        let channel = match self.channel(&mut state).await {
            Ok(channel) => channel,
            Err(e) => return vec![Err(e); messages.len()],
        };
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            if message.payload.len() > self.max_message_size {
                pending.push(Err(PublishError::refused(format!(
                    "the payload of {} bytes is larger than the publisher's max_message_size of {} bytes",
                    message.payload.len(),
                    self.max_message_size
                ))));
                continue;
            }
            let sent = channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    message.destination.as_str().into(),
                    options,
                    &message.payload,
                    properties(message),
                )
                .await;
            pending.push(sent.map_err(unavailable));
        }
        let mut results = Vec::with_capacity(messages.len());
        for sent in pending {
            let confirm = match sent {
                Ok(confirm) => confirm,
                Err(e) => {
                    results.push(Err(e));
                    continue;
                }
            };
            results.push(match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
                Ok(Ok(Confirmation::Ack(None))) => Ok(()),
                Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(PublishError::refused(format!(
                    "unroutable: exchange {:?} has no queue bound for routing key {:?} ({} {})",
                    self.exchange,
                    returned.delivery.routing_key.as_str(),
                    returned.reply_code,
                    returned.reply_text.as_str()
                ))),
                Ok(Ok(Confirmation::Nack(_))) => {
                    state.nacked = true;
                    Err(PublishError::refused("the broker nacked the message"))
                }
                Ok(Ok(Confirmation::NotRequested)) => Err(PublishError::unavailable(
                    "the channel is not in confirm mode",
                )),
                Ok(Err(e)) => Err(unavailable(e)),
                Err(_) => Err(PublishError::unavailable(format!(
                    "no confirm within {CONFIRM_TIMEOUT:?}"
                ))),
            });
        }
        // A channel that failed mid-batch is made again at the next one.
        if !channel.status().connected() {
            state.confirming = false;
        }
        results
    }
}
