//! Amazon SQS consumers on the official
//! [aws-sdk-sqs](https://docs.rs/aws-sdk-sqs) client (feature `sqs`): the
//! consumer runner ([`Consumer`]), and [`lambda`] for a Lambda function
//! fed by an SQS event source. The handler's transaction commits first;
//! only then is the message deleted.
//!
//! - **The id** is the SQS `MessageId`, or the message attribute named by
//!   [`id_attribute`](crate::brokers::Consumer::id_attribute) (for a
//!   producer that sends a message again under a new SQS id: the relay's
//!   [`outbox::sqs::Publisher`](crate::outbox::sqs::Publisher) sets
//!   `message-id`).
//! - **Long polling**: up to ten messages per receive, waiting up to 20 s.
//! - **A visibility heartbeat**: every message the runner holds (running,
//!   prefetched, or held behind its FIFO group) is kept invisible: when
//!   two thirds of the visibility timeout are left, it is extended by the
//!   whole timeout again (`ChangeMessageVisibilityBatch`), so a handler slower
//!   than the timeout is not delivered to another consumer meanwhile. It
//!   stops when the message is settled, or dropped at shutdown.
//! - **Deletes** after each commit, batched: the deletes asked for while
//!   the last `DeleteMessageBatch` ran go in the next (up to ten).
//! - **Retries** by visibility: a transient failure makes the message
//!   visible again after the policy's backoff (`ChangeMessageVisibility`,
//!   in whole seconds). The deliveries are SQS's `ApproximateReceiveCount`.
//! - **Dead letters**: a permanent failure, or the policy's
//!   `max_deliveries`, sends the message to the dead-letter queue the
//!   queue's redrive policy names, then deletes it. A queue without a
//!   redrive policy has nowhere to send it: the message stays in the
//!   queue, invisible for 12 hours (SQS's longest), and the runner says so
//!   in a WARN. SQS's own redrive (`maxReceiveCount`) also moves a message
//!   that keeps failing, whichever limit comes first.
//! - **FIFO queues**: a message group's messages are handed to the handler
//!   one at a time, in order; when one is given back for a retry, the
//!   messages received behind it are given back too, so none overtakes it.
//!
//! ```no_run
//! # async fn start(client: aws_sdk_sqs::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use diesel_async::pooled_connection::deadpool::Pool;
//! use diesel_async::AsyncPgConnection;
//! use diesel_inbox::brokers::Policy;
//! use diesel_inbox::{idempotent, InboxError};
//!
//! #[idempotent(key = "id")]
//! async fn ship(conn: &mut AsyncPgConnection, id: &str, body: &[u8]) -> Result<(), InboxError> {
//!     let _ = (conn, body); // the business writes
//!     Ok(())
//! }
//!
//! # let pool: Pool<AsyncPgConnection> = todo!();
//! // `client` from `aws_config::load_from_env()`, say.
//! let queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders";
//! let report = diesel_inbox::sqs::Consumer::new(client, queue_url, Policy::new(|_: &InboxError| false))
//!     .in_flight(8)
//!     .run(
//!         async |id: &str, body: &[u8]| {
//!             let Ok(mut conn) = pool.get().await else {
//!                 return Err(InboxError::InvalidArgument("no database connection"));
//!             };
//!             ship(&mut conn, id, body).await
//!         },
//!         async {
//!             let _ = tokio::signal::ctrl_c().await;
//!         },
//!     )
//!     .await?;
//! println!("{report:?}");
//! # Ok(())
//! # }
//! ```

use crate::brokers::{usable_id, BrokerError, Inbound, Policy, Settlement};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use aws_sdk_sqs::Client;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

mod lambda;
mod lease;

pub use lambda::{lambda, lambda_by_attribute};

/// The `aws-sdk-sqs` crate this runner is built on (1.x, at least 1.119),
/// re-exported so a `Client` of yours is the one the runner takes.
///
/// Its HTTP client is not enabled here: bring one with the crate's
/// `default-https-client` feature, `aws-config`, or your own (guide:
/// sqs, "A local endpoint").
///
/// ```no_run
/// use diesel_inbox::sqs::aws_sdk_sqs;
///
/// fn queue(client: aws_sdk_sqs::Client) -> diesel_inbox::sqs::Consumer<diesel_inbox::InboxError> {
///     diesel_inbox::sqs::Consumer::new(
///         client,
///         "http://localhost:4566/000000000000/orders",
///         diesel_inbox::brokers::Policy::new(|_: &diesel_inbox::InboxError| false),
///     )
/// }
/// ```
pub use aws_sdk_sqs;

/// The `aws_lambda_events` crate (1.x, at least 1.2, feature `sqs`) whose
/// `SqsEvent` and `SqsBatchResponse` [`lambda`] takes and returns.
///
/// ```no_run
/// use diesel_inbox::sqs::aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
///
/// fn nothing_failed(_: SqsEvent) -> SqsBatchResponse {
///     SqsBatchResponse::default()
/// }
/// ```
pub use aws_lambda_events;
use lease::{Shared, MAX_VISIBILITY};

/// An SQS consumer runner: the loop of
/// [`brokers::Consumer`](crate::brokers::Consumer) over one queue (module
/// docs: ids, heartbeat, deletes, retries, dead letters, FIFO order).
pub type Consumer<E> = crate::brokers::Consumer<Queue, E>;

/// The queue a [`Consumer`] reads.
pub struct Queue {
    client: Client,
    url: String,
    id_attribute: Option<String>,
    visibility: Option<Duration>,
    wait: Duration,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("url", &self.url)
            .field("id_attribute", &self.id_attribute)
            .field("visibility_timeout", &self.visibility)
            .field("wait_time", &self.wait)
            .finish_non_exhaustive()
    }
}

impl Queue {
    fn name(&self) -> String {
        queue_name(&self.url).to_owned()
    }
}

/// The queue's name: the last part of its URL.
pub(crate) fn queue_name(url: &str) -> &str {
    url.trim_end_matches('/').rsplit('/').next().unwrap_or(url)
}

impl<E> crate::brokers::Consumer<Queue, E> {
    /// A runner for the queue at `queue_url`, settling as `policy` says.
    /// `client` brings its HTTP client, region and credentials (from
    /// `aws_config`, say).
    pub fn new(client: Client, queue_url: impl Into<String>, policy: Policy<E>) -> Self {
        crate::brokers::Consumer::with(
            Queue {
                client,
                url: queue_url.into(),
                id_attribute: None,
                visibility: None,
                wait: Duration::from_secs(20),
            },
            policy,
        )
    }

    /// Deduplicate on the message attribute `name` (a `String` attribute)
    /// instead of the SQS `MessageId`: for producers that send a message
    /// again under a new SQS id (the relay's publisher sets `message-id`).
    /// A message without it is dead-lettered, never acked.
    pub fn id_attribute(mut self, name: impl Into<String>) -> Self {
        self.source.id_attribute = Some(name.into());
        self
    }

    /// The visibility timeout asked for at each receive, and renewed by
    /// the heartbeat while a message is held (default: the queue's own;
    /// at least 1 s, at most 12 hours). A killed consumer's messages come
    /// back after it.
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        let secs = timeout.as_secs().clamp(1, MAX_VISIBILITY as u64);
        self.source.visibility = Some(Duration::from_secs(secs));
        self
    }

    /// How long a receive waits for messages (long polling; default 20 s,
    /// SQS's longest; at least 1 s, so that an empty queue is not asked
    /// again and again; at most 20 s).
    pub fn wait_time(mut self, wait: Duration) -> Self {
        self.source.wait = wait.clamp(Duration::from_secs(1), Duration::from_secs(20));
        self
    }
}

/// How long one SQS request may take (a receive: its long poll more): a
/// server that accepts connections and answers nothing is an error after
/// it, never a wait without end.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The answer to an SQS request within [`REQUEST_TIMEOUT`] (plus
/// `extra`), or why there is none, in one line.
pub(crate) async fn answer<T, E>(
    request: impl std::future::Future<Output = Result<T, aws_sdk_sqs::error::SdkError<E>>>,
    extra: Duration,
) -> Result<T, String>
where
    E: std::error::Error + Send + Sync + 'static,
{
    match tokio::time::timeout(REQUEST_TIMEOUT + extra, request).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(sqs_error(e)),
        Err(_) => Err(format!(
            "SQS did not answer within {} s",
            (REQUEST_TIMEOUT + extra).as_secs()
        )),
    }
}

/// An SQS error with its causes, in one line.
fn sqs_error<E: std::error::Error + Send + Sync + 'static>(
    error: aws_sdk_sqs::error::SdkError<E>,
) -> String {
    aws_sdk_sqs::error::DisplayErrorContext(error).to_string()
}

/// A message the runner received: settled through its queue's shared
/// state (deletes, heartbeat, lanes).
#[doc(hidden)]
pub struct Delivery {
    message: aws_sdk_sqs::types::Message,
    receipt: String,
    group: Option<String>,
    shared: Arc<Shared>,
    lease: u64,
    /// When the receive that brought it was asked for: SQS caps its
    /// visibility at 12 hours from then.
    received: Instant,
    /// Settled and its group's lane moved on, or given back with its
    /// group: nothing left to do on drop. A settlement cut short (the
    /// shutdown deadline) leaves it unset, so that the drop lets the
    /// group's held messages go rather than keep them (and their
    /// heartbeat) forever.
    done: AtomicBool,
    _permit: OwnedSemaphorePermit,
}

impl Delivery {
    fn settled(&self) {
        self.done.store(true, Ordering::Release);
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.shared.release(self.lease);
        if self.done.load(Ordering::Acquire) {
            return;
        }
        // Dropped unsettled (shutdown, a lost stream): SQS delivers it
        // again when its visibility ends, and its group's messages held
        // behind it with it.
        if let Some(group) = self.group.as_deref().filter(|_| self.shared.fifo) {
            self.shared.abandon(group);
        }
    }
}

impl crate::brokers::Sealed for Delivery {}

impl Inbound for Delivery {
    // `ChangeMessageVisibility`: SQS waits out the delay itself.
    const HOLDS_RETRIES: bool = false;

    fn message_id(&self) -> Result<String, BrokerError> {
        let id = match &self.shared.id_attribute {
            None => usable_id(self.message.message_id(), "SQS MessageId"),
            Some(name) => usable_id(
                self.message
                    .message_attributes()
                    .and_then(|a| a.get(name))
                    .and_then(|v| v.string_value()),
                &format!("message attribute {name}"),
            ),
        };
        id.map_err(|why| BrokerError::NoMessageId { why })
    }

    /// With its message attributes whose values are strings.
    fn view<'a>(&'a self, id: &'a str) -> crate::brokers::Message<'a> {
        let headers = self
            .message
            .message_attributes()
            .map(|attributes| {
                attributes
                    .iter()
                    .filter_map(|(name, value)| {
                        Some((name.as_str(), value.string_value()?.as_bytes()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        crate::brokers::Message {
            deliveries: self.deliveries(),
            headers,
            ..crate::brokers::Message::new(id, self.body())
        }
    }

    fn deliveries(&self) -> u32 {
        self.message
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
            .and_then(|n| n.parse().ok())
            .unwrap_or(1)
            .max(1)
    }

    fn body(&self) -> &[u8] {
        self.message.body().unwrap_or("").as_bytes()
    }

    fn origin(&self) -> String {
        self.shared.name.clone()
    }

    #[cfg(feature = "otel")]
    const SYSTEM: &'static str = "aws_sqs";

    #[cfg(feature = "otel")]
    fn destination(&self) -> String {
        self.shared.name.clone()
    }

    #[cfg(feature = "otel")]
    fn headers_named(&self, names: &[String]) -> Vec<(String, String)> {
        let Some(attributes) = self.message.message_attributes() else {
            return Vec::new();
        };
        attributes
            .iter()
            .filter(|(name, _)| names.iter().any(|n| n.eq_ignore_ascii_case(name)))
            .filter_map(|(name, value)| Some((name.clone(), value.string_value()?.to_owned())))
            .collect()
    }

    async fn settle(
        &self,
        settlement: Settlement,
        retry_delay: Duration,
    ) -> Result<(), BrokerError> {
        // Kept invisible by the heartbeat until it is deleted (a slow
        // delete must not let it come back); a retry's visibility is the
        // runner's from now on.
        let result = match settlement {
            Settlement::Ack => self.shared.delete(&self.receipt).await,
            Settlement::Retry => {
                self.shared.release(self.lease);
                let seconds = retry_delay.as_secs_f64().ceil() as i64;
                self.visible_in(seconds.clamp(0, i64::from(MAX_VISIBILITY)) as i32)
                    .await
            }
            Settlement::DeadLetter => self.dead_letter().await,
        };
        self.shared.release(self.lease);
        if let Some(group) = self.group.as_deref().filter(|_| self.shared.fifo) {
            let done = result.is_ok() && settlement != Settlement::Retry;
            self.shared.leave(group, done).await;
        }
        self.settled();
        result
    }

    async fn ack_batch(batch: &[&Self]) -> Result<(), BrokerError> {
        let deletes = batch
            .iter()
            .map(|m| m.settle(Settlement::Ack, Duration::ZERO));
        let results = futures_util::future::join_all(deletes).await;
        results.into_iter().collect()
    }
}

impl Delivery {
    /// Makes the message visible again in `seconds`.
    async fn visible_in(&self, seconds: i32) -> Result<(), BrokerError> {
        let request = self
            .shared
            .client
            .change_message_visibility()
            .queue_url(&self.shared.url)
            .receipt_handle(&self.receipt)
            .visibility_timeout(seconds)
            .send();
        answer(request, Duration::ZERO)
            .await
            .map(|_| ())
            .map_err(|e| BrokerError::Settle(e.into()))
    }

    /// Sends the message to the redrive policy's dead-letter queue, then
    /// deletes it; without one, keeps it invisible as long as SQS allows
    /// and says so.
    async fn dead_letter(&self) -> Result<(), BrokerError> {
        let Some(dead_letter) = &self.shared.dead_letter else {
            self.shared.release(self.lease);
            // SQS allows 12 hours from the receive in all: what is left of
            // them, less a margin for the request's own time.
            let held = self.received.elapsed().as_secs() + PARK_MARGIN_SECS;
            let left = u64::try_from(MAX_VISIBILITY)
                .unwrap_or(0)
                .saturating_sub(held);
            let seconds = i32::try_from(left).unwrap_or(MAX_VISIBILITY);
            self.visible_in(seconds).await?;
            tracing::warn!(
                target: crate::TRACING_TARGET,
                queue = %self.shared.name,
                message_id = self.message.message_id().unwrap_or(""),
                invisible_for_s = seconds,
                "diesel-inbox: SQS: the queue has no redrive policy, so no dead-letter queue: this message stays in the queue, invisible for {}h{:02}m, then is delivered again; give the queue a redrive policy (RedrivePolicy with deadLetterTargetArn and maxReceiveCount) to keep such messages out of it",
                seconds / 3600,
                seconds % 3600 / 60
            );
            return Ok(());
        };
        let mut send = self
            .shared
            .client
            .send_message()
            .queue_url(dead_letter)
            .message_body(self.message.body().unwrap_or(""))
            .set_message_attributes(self.message.message_attributes().cloned());
        if let Some(group) = &self.group {
            let id = self.message.message_id().unwrap_or(&self.receipt);
            send = send
                .message_group_id(group)
                .message_deduplication_id(id.chars().take(128).collect::<String>());
        }
        answer(send.send(), Duration::ZERO).await.map_err(|e| {
            BrokerError::Settle(format!("sending it to the dead-letter queue failed: {e}").into())
        })?;
        self.shared.delete(&self.receipt).await
    }
}

/// How much of SQS's 12 hours a message kept without a dead-letter queue
/// leaves unasked (the request's own time, and clocks).
const PARK_MARGIN_SECS: u64 = 60;

/// The messages of a [`Queue`], as the runner reads them: received by a
/// task of their own, up to the prefetch not yet settled.
#[doc(hidden)]
pub struct Deliveries {
    ready: mpsc::UnboundedReceiver<Result<Delivery, BrokerError>>,
    receiver: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
}

impl Drop for Deliveries {
    fn drop(&mut self) {
        // Once intake stopped, the receive in flight ends by itself and
        // gives its messages back: cut short, they would stay invisible
        // for the whole visibility timeout.
        if !self.shared.intake_stopped() {
            self.receiver.abort();
        }
    }
}

impl futures_util::Stream for Deliveries {
    type Item = Result<Delivery, BrokerError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.ready.poll_recv(cx)
    }
}

impl crate::brokers::Sealed for Queue {}

impl crate::brokers::Source for Queue {
    type Message = Delivery;
    type Deliveries = Deliveries;

    fn name(&self) -> String {
        Queue::name(self)
    }

    async fn open(&mut self, prefetch: usize) -> Result<Deliveries, BrokerError> {
        let attributes = answer(
            self.client
                .get_queue_attributes()
                .queue_url(&self.url)
                .attribute_names(QueueAttributeName::RedrivePolicy)
                .attribute_names(QueueAttributeName::VisibilityTimeout)
                .attribute_names(QueueAttributeName::FifoQueue)
                .send(),
            Duration::ZERO,
        )
        .await
        .map_err(|e| BrokerError::Broker(e.into()))?;
        let attributes = attributes.attributes().cloned().unwrap_or_default();
        let fifo = self.url.ends_with(".fifo")
            || attributes
                .get(&QueueAttributeName::FifoQueue)
                .is_some_and(|v| v == "true");
        let visibility = self.visibility.unwrap_or_else(|| {
            let secs = attributes
                .get(&QueueAttributeName::VisibilityTimeout)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(30);
            Duration::from_secs(secs.max(1))
        });
        let dead_letter = match attributes.get(&QueueAttributeName::RedrivePolicy) {
            Some(policy) => Some(self.dead_letter_url(policy).await?),
            None => None,
        };
        let (ready, deliveries) = mpsc::unbounded_channel();
        let shared = Shared::new(self, dead_letter, fifo, visibility, ready);
        let receiver = tokio::spawn(receive(shared.clone(), prefetch.max(1), self.wait));
        Ok(Deliveries {
            ready: deliveries,
            receiver,
            shared,
        })
    }

    fn intake_stopper(&self, deliveries: &Deliveries) -> Option<Box<dyn Fn() + Send + Sync>> {
        let shared = deliveries.shared.clone();
        Some(Box::new(move || shared.stop_intake()))
    }

    async fn stop(&mut self, deliveries: &mut Deliveries) {
        // The receive in flight finishes (its long poll at most) and gives
        // its messages back.
        deliveries.shared.stop_intake();
        let _ = (&mut deliveries.receiver).await;
    }

    fn stop_within(&self) -> Duration {
        self.wait + Duration::from_secs(5)
    }

    async fn backlog(&mut self) -> Result<u64, BrokerError> {
        let answer = answer(
            self.client
                .get_queue_attributes()
                .queue_url(&self.url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
                .send(),
            Duration::ZERO,
        )
        .await
        .map_err(|e| BrokerError::Broker(e.into()))?;
        Ok(answer
            .attributes()
            .map(|a| a.values().filter_map(|v| v.parse::<u64>().ok()).sum())
            .unwrap_or(0))
    }

    fn can_reconnect(&self) -> bool {
        true
    }

    async fn reconnect(&mut self) -> Result<(), BrokerError> {
        // The SDK's HTTP client connects again by itself; `open` reads
        // the queue's attributes again.
        Ok(())
    }
}

impl Queue {
    /// The URL of the dead-letter queue a redrive policy names (its
    /// `deadLetterTargetArn`: `arn:aws:sqs:<region>:<account>:<name>`).
    async fn dead_letter_url(&self, policy: &str) -> Result<String, BrokerError> {
        let arn = redrive_target(policy).ok_or_else(|| {
            BrokerError::Config(format!(
                "the queue's redrive policy names no dead-letter queue: {policy}"
            ))
        })?;
        let mut parts = arn.split(':');
        let (account, name) = (parts.nth(4), parts.next());
        let Some(name) = name else {
            return Err(BrokerError::Config(format!(
                "the queue's dead-letter queue is not an SQS ARN: {arn}"
            )));
        };
        let found = answer(
            self.client
                .get_queue_url()
                .queue_name(name)
                .set_queue_owner_aws_account_id(account.map(str::to_owned))
                .send(),
            Duration::ZERO,
        )
        .await
        .map_err(|e| BrokerError::Broker(e.into()))?;
        found.queue_url().map(str::to_owned).ok_or_else(|| {
            BrokerError::Broker(format!("no URL for the dead-letter queue {name}").into())
        })
    }
}

/// The `deadLetterTargetArn` of a redrive policy (JSON).
fn redrive_target(policy: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(policy).ok()?;
    value
        .get("deadLetterTargetArn")?
        .as_str()
        .map(str::to_owned)
}

/// How long a receive waits for room for more messages, and a delete for
/// more deletes, before it goes with what it has.
pub(crate) const FILL: Duration = Duration::from_millis(5);

/// The receiving task: long polls while fewer than `prefetch` messages
/// are held, and hands each to the runner (FIFO: through its group's
/// lane). A failed receive ends the stream with the error (the runner
/// connects again with its backoff).
async fn receive(shared: Arc<Shared>, prefetch: usize, wait: Duration) {
    let room = Arc::new(Semaphore::new(prefetch));
    let visibility = i32::try_from(shared.visibility.as_secs()).unwrap_or(MAX_VISIBILITY);
    loop {
        let first = tokio::select! {
            biased;
            () = shared.intake_stopping() => return,
            permit = room.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        // A receive's worth (ten, or the prefetch), waiting a moment for
        // the room the deliveries finishing now give back: fewer, fuller
        // receives (SQS bills per request).
        let want = prefetch.min(10);
        let mut permits = vec![first];
        let filled = Instant::now() + FILL;
        while permits.len() < want {
            match room.clone().try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) if Instant::now() >= filled => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
        if shared.intake_stopped() {
            return;
        }
        let asked = Instant::now();
        let request = shared
            .client
            .receive_message()
            .queue_url(&shared.url)
            .max_number_of_messages(permits.len() as i32)
            .wait_time_seconds(wait.as_secs() as i32)
            .visibility_timeout(visibility)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_attribute_names("All")
            .send();
        let answer = match answer(request, wait).await {
            Ok(answer) => answer,
            Err(e) => {
                let _ = shared.ready.send(Err(BrokerError::Broker(e.into())));
                return;
            }
        };
        if shared.intake_stopped() {
            // Received after intake stopped: back at once, handed to no one.
            let receipts: Vec<String> = answer
                .messages()
                .iter()
                .filter_map(|m| m.receipt_handle().map(str::to_owned))
                .collect();
            if !receipts.is_empty() {
                if let Err(e) = shared.change_visibility(&receipts, 0).await {
                    tracing::warn!(target: crate::TRACING_TARGET, queue = %shared.name, error = %e, "diesel-inbox: SQS: could not give back the messages received as intake stopped; they come back when their visibility ends");
                }
            }
            return;
        }
        for message in answer.messages() {
            let Some(permit) = permits.pop() else {
                break;
            };
            let Some(receipt) = message.receipt_handle().map(str::to_owned) else {
                continue;
            };
            let group = message
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                .cloned();
            let lease = shared.lease(&receipt, asked);
            shared.arrive(Delivery {
                message: message.clone(),
                receipt,
                group,
                shared: shared.clone(),
                lease,
                received: asked,
                done: AtomicBool::new(false),
                _permit: permit,
            });
        }
    }
}
