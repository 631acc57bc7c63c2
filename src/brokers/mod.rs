//! What a consumer does with a handler's outcome, the same for every
//! broker: ack a message once its handler's transaction has committed
//! (`Applied`) or found it done before (`Duplicate`), redeliver it after a
//! transient error, dead-letter it after a permanent one or once the
//! broker has delivered it too often. The broker modules (`diesel_inbox::lapin`,
//! `diesel_inbox::nats`) read the message id and the delivery count from
//! their client's message and carry out the [`Settlement`].

use crate::{validate_key, InboxError, InvalidKey, Outcome};
use std::time::Duration;

mod batch;
mod message;
mod routed;
pub(crate) mod runner;
pub use message::Message;
pub use runner::{Consumer, RunReport, Source};
pub(crate) use runner::{Holds, Sealed};

/// What to tell the broker about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Done (applied now or before): acknowledge.
    Ack,
    /// Failed transiently: deliver it again after the policy's backoff
    /// ([`Policy::retry_delay_for`]): JetStream `Nak` with that delay; on
    /// AMQP the delivery is held for the delay, then `nack`ed with requeue
    /// (the channel's prefetch bounds how many are held at once).
    Retry,
    /// Failed for good, or delivered [`Policy::max_deliveries`] times:
    /// reject to the dead-letter exchange (AMQP) or terminate (JetStream).
    DeadLetter,
}

/// The safety-net delivery limit of a new [`Policy`]: with the default
/// backoff, 20 deliveries of a failing message span 7 to 14 minutes, so a
/// database outage shorter than that dead-letters nothing.
pub(crate) const DEFAULT_MAX_DELIVERIES: u32 = 20;

/// A handler error type that can hold an [`InboxError`]: where it keeps
/// one, so that the inbox's permanent refusals ([`is_inbox_permanent`]:
/// a reused key, attempts exhausted, an invalid key) are dead-lettered
/// whatever the [`Policy`]'s own rule says. Every `#[idempotent]`
/// handler's error type has `From<InboxError>`, so it can hold one; a
/// [`Policy`] needs this trait, so that the link cannot be forgotten (a
/// forgotten link would retry a refusal until the delivery limit).
///
/// Implemented for [`InboxError`], `diesel::result::Error` (a
/// `QueryResult` handler's refusal travels inside it) and boxed errors (the
/// error itself or any of its sources). For your own type, one line:
///
/// ```
/// use diesel_inbox::brokers::{HasInboxError, Policy, Settlement};
/// use diesel_inbox::{InboxError, Processed};
///
/// #[derive(Debug)]
/// enum AppError { Inbox(InboxError), Db(diesel::result::Error), BadPayload }
///
/// impl HasInboxError for AppError {
///     fn inbox_error(&self) -> Option<&InboxError> {
///         if let AppError::Inbox(e) = self { Some(e) } else { None }
///     }
/// }
///
/// let policy = Policy::new(|e: &AppError| matches!(e, AppError::BadPayload));
/// let reused = AppError::Inbox(InboxError::KeyReused { consumer: "orders".into(), key: "m-1".into() });
/// assert_eq!(policy.settlement(&Err::<Processed<()>, _>(reused), 1), Settlement::DeadLetter);
/// let outage = AppError::Db(diesel::result::Error::BrokenTransactionManager);
/// assert_eq!(policy.settlement(&Err::<Processed<()>, _>(outage), 1), Settlement::Retry);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say where it holds an `InboxError`",
    label = "the inbox's refusals in `{Self}` would be retried instead of dead-lettered",
    note = "implement `diesel_inbox::brokers::HasInboxError` for `{Self}`: `fn inbox_error(&self) -> Option<&InboxError>` (one match on its `Inbox` variant)"
)]
pub trait HasInboxError {
    /// The [`InboxError`] this error is or holds, if any.
    fn inbox_error(&self) -> Option<&InboxError>;
}

impl HasInboxError for InboxError {
    fn inbox_error(&self) -> Option<&InboxError> {
        Some(self)
    }
}

impl HasInboxError for diesel::result::Error {
    fn inbox_error(&self) -> Option<&InboxError> {
        match self {
            diesel::result::Error::QueryBuilderError(inner) => inner.downcast_ref::<InboxError>(),
            _ => None,
        }
    }
}

impl HasInboxError for Box<dyn std::error::Error + Send + Sync> {
    fn inbox_error(&self) -> Option<&InboxError> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&**self);
        while let Some(error) = next {
            if let Some(inbox) = error.downcast_ref::<InboxError>() {
                return Some(inbox);
            }
            next = error.source();
        }
        None
    }
}

/// Which of the handler's errors are permanent, and how often a failing
/// message may be delivered. The user decides what is permanent; nothing
/// is guessed from the error's text.
///
/// ```
/// use diesel_inbox::brokers::{Policy, Settlement};
/// use diesel_inbox::Processed;
///
/// #[derive(Debug)]
/// enum AppError { Invalid, Database }
///
/// # impl diesel_inbox::brokers::HasInboxError for AppError {
/// #     fn inbox_error(&self) -> Option<&diesel_inbox::InboxError> { None }
/// # }
/// let policy = Policy::new(|e: &AppError| matches!(e, AppError::Invalid)).max_deliveries(5);
/// assert_eq!(policy.settlement(&Ok::<_, AppError>(Processed::Applied(())), 1), Settlement::Ack);
/// assert_eq!(policy.settlement(&Ok::<Processed<()>, _>(Processed::Duplicate), 3), Settlement::Ack);
/// assert_eq!(policy.settlement(&Err::<Processed<()>, _>(AppError::Database), 1), Settlement::Retry);
/// assert_eq!(policy.settlement(&Err::<Processed<()>, _>(AppError::Database), 5), Settlement::DeadLetter);
/// assert_eq!(policy.settlement(&Err::<Processed<()>, _>(AppError::Invalid), 1), Settlement::DeadLetter);
///
/// // The inbox's own refusals are permanent by default.
/// let plain = Policy::new(|_: &diesel_inbox::InboxError| false);
/// let reused = diesel_inbox::InboxError::KeyReused { consumer: "orders".into(), key: "m-1".into() };
/// assert_eq!(plain.settlement(&Err::<Processed<()>, _>(reused), 1), Settlement::DeadLetter);
/// ```
pub struct Policy<E> {
    permanent: Box<dyn Fn(&E) -> bool + Send + Sync>,
    max_deliveries: Option<u32>,
    retry_delay: Duration,
    max_retry_delay: Duration,
}

impl<E> std::fmt::Debug for Policy<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("max_deliveries", &self.max_deliveries)
            .field("retry_delay", &self.retry_delay)
            .field("max_retry_delay", &self.max_retry_delay)
            .finish_non_exhaustive()
    }
}

impl<E: HasInboxError> Policy<E> {
    /// `permanent(e)` says whether an error is permanent (dead-letter at
    /// once) rather than transient (redeliver). The inbox's own refusals
    /// are permanent whatever it says ([`is_inbox_permanent`]): a key
    /// reused with other content, attempts exhausted, an invalid key,
    /// found in the error through [`HasInboxError`]. A safety-net delivery
    /// limit of 20 deliveries; a first retry delay of 1 s,
    /// doubled per delivery up to 60 s.
    pub fn new(permanent: impl Fn(&E) -> bool + Send + Sync + 'static) -> Self {
        Policy {
            permanent: Box::new(permanent),
            max_deliveries: Some(DEFAULT_MAX_DELIVERIES),
            retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(60),
        }
    }

    /// Dead-letter a failing message once the broker has delivered it
    /// `n` times (the count comes from the broker: RabbitMQ's
    /// `x-delivery-count` on quorum queues, JetStream's `delivered`).
    /// Every delivery counts, whatever failed, a database outage's too: it
    /// is a safety net, not the poison limit, which is the handler's
    /// `max_attempts` (body failures only, guide: brokers). Keep it well
    /// above `max_attempts`; the default is 20: with the default backoff,
    /// 20 deliveries of a failing message span 7 to 14 minutes, so a
    /// database outage shorter than that dead-letters nothing.
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = Some(n);
        self
    }

    /// No delivery limit: a message is dead-lettered only for a permanent
    /// error (such as `AttemptsExhausted`, if the policy says so).
    pub fn unlimited_deliveries(mut self) -> Self {
        self.max_deliveries = None;
        self
    }

    /// The backoff's first delay before a failed message is delivered
    /// again (default 1 s); each further delivery doubles it, up to
    /// [`max_retry_delay`](Self::max_retry_delay), with jitter
    /// ([`retry_delay_for`](Self::retry_delay_for)).
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// The backoff's cap (default 60 s): a database outage of minutes
    /// redelivers each held message about once a minute instead of
    /// spinning it through the broker.
    pub fn max_retry_delay(mut self, cap: Duration) -> Self {
        self.max_retry_delay = cap;
        self
    }

    /// The delay before the next delivery of a message that failed
    /// transiently on delivery `deliveries` (1 for the first): the first
    /// delay doubled per earlier delivery, capped, then jittered to between
    /// half and all of it, so that messages failed by one outage do not
    /// come back in lockstep.
    ///
    /// ```
    /// use diesel_inbox::brokers::Policy;
    /// use std::time::Duration;
    ///
    /// let policy = Policy::new(|_: &diesel_inbox::InboxError| false)
    ///     .retry_delay(Duration::from_millis(100))
    ///     .max_retry_delay(Duration::from_secs(2));
    /// let first = policy.retry_delay_for(1);
    /// assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
    /// let fourth = policy.retry_delay_for(4);
    /// assert!(fourth >= Duration::from_millis(400) && fourth <= Duration::from_millis(800));
    /// assert!(policy.retry_delay_for(50) <= Duration::from_secs(2));
    /// ```
    pub fn retry_delay_for(&self, deliveries: u32) -> Duration {
        inbox_runtime::__facade::backoff(self.retry_delay, self.max_retry_delay, deliveries)
    }

    /// What to do with a message delivered `deliveries` times (this one
    /// included) whose handler returned `outcome` (any handler's:
    /// [`Processed`](crate::Processed), [`Stored`](crate::Stored)).
    pub fn settlement<O: Outcome>(&self, outcome: &Result<O, E>, deliveries: u32) -> Settlement {
        match outcome {
            Ok(_) => Settlement::Ack,
            Err(e) if (self.permanent)(e) => Settlement::DeadLetter,
            Err(e) if e.inbox_error().is_some_and(is_inbox_permanent) => Settlement::DeadLetter,
            Err(_) if self.max_deliveries.is_some_and(|max| deliveries >= max) => {
                Settlement::DeadLetter
            }
            Err(_) => Settlement::Retry,
        }
    }
}

/// Whether the inbox refused a delivery for good: its key was reused with
/// other content ([`InboxError::KeyReused`]), its body failed
/// `max_attempts` times ([`InboxError::AttemptsExhausted`]), its key
/// is not one the inbox can store ([`InboxError::InvalidKey`]), or it
/// names no tenant the runner has ([`InboxError::UnknownTenant`]). Every
/// redelivery would be refused the same way.
pub fn is_inbox_permanent(error: &InboxError) -> bool {
    matches!(
        error,
        InboxError::KeyReused { .. }
            | InboxError::AttemptsExhausted { .. }
            | InboxError::InvalidKey(_)
            | InboxError::UnknownTenant { .. }
    )
}

/// A handled message: the handler's outcome (`O`: its
/// [`Processed<T>`](crate::Processed) or [`Stored<T>`](crate::Stored)) and
/// what the broker was told.
#[derive(Debug)]
#[non_exhaustive]
pub struct Handled<O, E> {
    /// The message id the handler was given.
    pub message_id: String,
    /// What the handler returned.
    pub outcome: Result<O, E>,
    /// How the message was settled with the broker, after the handler's
    /// transaction had ended.
    pub settlement: Settlement,
    /// How often the broker had delivered it, this time included.
    pub deliveries: u32,
    /// A retry held for its backoff (AMQP) and given back before the
    /// backoff ran out: at shutdown, or when the health probe found the
    /// database back.
    pub released_early: bool,
}

/// Why a message was not handled, or could not be settled. `Settle` and
/// `Broker` keep the client's error as their
/// [`source`](std::error::Error::source) (and say it in their text, as
/// sqlx's and lapin's errors do).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The message carries no usable id: nothing to deduplicate on. It was
    /// dead-lettered (rejected without requeue, or terminated), never acked.
    #[error("message without a usable id ({why}); it was dead-lettered, not acked")]
    NoMessageId {
        /// What was wrong with it.
        why: String,
    },
    /// The broker refused the ack, nack or reject (e.g. the connection was
    /// lost): the broker redelivers the message, and the inbox reports it
    /// `Duplicate` if its transaction had committed.
    #[error("could not settle the message with the broker: {0}")]
    Settle(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The broker connection or channel failed while consuming (a consumer
    /// runner returns it after finishing the deliveries in flight): connect
    /// again and run again; what was not acked is redelivered.
    #[error("the broker connection failed: {0}")]
    Broker(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The broker client is configured in a way the runner cannot use
    /// safely (Kafka: offsets committed automatically): nothing was
    /// consumed.
    #[error("the consumer cannot be run as configured: {0}")]
    Config(String),
}

/// A broker's message, as [`handle`] needs it: each broker module
/// implements it for its client's message type. Sealed by [`Sealed`].
#[doc(hidden)]
pub trait Inbound: Sealed {
    /// Whether a retry is held in the process for its delay before it is
    /// given back (AMQP has no delayed requeue), rather than given back at
    /// once with the delay (JetStream's `Nak(delay)`).
    const HOLDS_RETRIES: bool;
    /// Whether [`Policy::max_deliveries`] dead-letters a message that keeps
    /// failing transiently. Not on Kafka, where a dead letter moves the
    /// partition past the message: a database outage must not skip
    /// messages, so only a permanent error (`max_attempts` exhausted among
    /// them) dead-letters there.
    const LIMITS_DELIVERIES: bool = true;
    /// The id to deduplicate on, or why there is none.
    fn message_id(&self) -> Result<String, BrokerError>;
    /// How often the broker has delivered it, this time included.
    fn deliveries(&self) -> u32;
    fn body(&self) -> &[u8];
    /// Where it came from, for logs: the routing key, the JetStream
    /// consumer.
    fn origin(&self) -> String;
    /// Its stream position, for a broker whose positions the handler's
    /// transaction keeps (Kafka): the first inbox call of the handler
    /// moves it behind the fence.
    fn position(&self) -> Option<inbox_runtime::__facade::Position> {
        None
    }
    /// Its topic, partition and offset, for a broker whose positions the
    /// handler's transaction keeps (Kafka), without copying: how a batch
    /// groups its messages by partition.
    fn stream_offset(&self) -> Option<(&str, i32, i64)> {
        None
    }
    /// What the fence found, told before [`settle`](Self::settle) (`None`:
    /// no inbox call moved the position).
    fn fenced(&self, verdict: Option<inbox_runtime::__facade::Verdict>) {
        let _ = verdict;
    }
    /// `messaging.system` on the consumer span (feature `otel`).
    #[cfg(feature = "otel")]
    const SYSTEM: &'static str;
    /// Where it was sent: the exchange (`""`: RabbitMQ's default one),
    /// subject or topic (`messaging.destination.name`).
    #[cfg(feature = "otel")]
    fn destination(&self) -> String;
    /// RabbitMQ's routing key (`messaging.rabbitmq.destination.routing_key`).
    #[cfg(feature = "otel")]
    fn routing_key(&self) -> Option<String> {
        None
    }
    /// Its consumer group, when the message says (else the runner's name).
    #[cfg(feature = "otel")]
    fn group(&self) -> Option<String> {
        None
    }
    /// The headers of `names` it carries (the trace context's), with
    /// their values.
    #[cfg(feature = "otel")]
    fn headers_named(&self, names: &[String]) -> Vec<(String, String)>;
    /// Tells the broker; `retry_delay` is the backoff's delay of a retry
    /// (already waited out when [`HOLDS_RETRIES`](Self::HOLDS_RETRIES)).
    fn settle(
        &self,
        settlement: Settlement,
        retry_delay: Duration,
    ) -> impl std::future::Future<Output = Result<(), BrokerError>>;
    /// The message as a handler reads it, with its `id`.
    fn view<'a>(&'a self, id: &'a str) -> Message<'a> {
        Message {
            deliveries: self.deliveries(),
            ..Message::new(id, self.body())
        }
    }
    /// Tells the broker that the runner still holds the message
    /// (JetStream: `Progress`, which restarts its `ack_wait`), every third
    /// of the source's [`lease`](Source::lease) while a batch waits for
    /// its retry; nothing by default.
    fn in_progress(&self) -> impl std::future::Future<Output = Result<(), BrokerError>> {
        async { Ok(()) }
    }
    /// Acks the messages of a batch whose transaction committed, in
    /// delivery order, in as few requests as the broker allows (each
    /// one's `settle` by default).
    fn ack_batch(batch: &[&Self]) -> impl std::future::Future<Output = Result<(), BrokerError>> {
        async move {
            for message in batch {
                message.settle(Settlement::Ack, Duration::ZERO).await?;
            }
            Ok(())
        }
    }
}

/// Where a delivery is handled: the consumer it is logged under (`None`:
/// the message's own [`origin`](Inbound::origin)), the holds that
/// shutdown or a recovered database cut short, and whom to tell at once
/// that a handler failed transiently (the runner's health probe; before
/// the retry's hold, which can last a minute).
pub(crate) struct Context<'a> {
    pub(crate) consumer: Option<&'a str>,
    pub(crate) holds: &'a Holds,
    pub(crate) transient: Option<&'a tokio::sync::Notify>,
}

/// The one consume step of every broker: the id (a message without one is
/// dead-lettered and reported), the handler, the policy's settlement, and
/// only then the broker's ack, requeue or dead-letter. Each settlement is
/// reported as it happens: a `tracing` event (DEBUG for an ack, one WARN
/// line for a failed delivery saying what happens next) and, with the
/// `metrics` feature, the counter `diesel_inbox.consumer.settled`.
pub(crate) async fn handle<M, O, E, F>(
    message: M,
    policy: &Policy<E>,
    context: Context<'_>,
    handler: F,
) -> Result<Handled<O, E>, BrokerError>
where
    M: Inbound,
    O: Outcome,
    E: HasInboxError + std::fmt::Debug,
    F: AsyncFnOnce(&Message<'_>) -> Result<O, E>,
{
    let origin;
    let consumer = match context.consumer {
        Some(name) => name,
        None => {
            origin = message.origin();
            &origin
        }
    };
    let id = match message.message_id() {
        Ok(id) => id,
        Err(e) => {
            let settled = message.settle(Settlement::DeadLetter, Duration::ZERO).await;
            inbox_runtime::__facade::consumer_settled(
                consumer,
                settled_label(&settled, Settlement::DeadLetter),
                1,
            );
            settled?;
            tracing::warn!(target: crate::TRACING_TARGET, consumer, error = %e, "diesel-inbox: a message without a usable id was dead-lettered");
            return Err(e);
        }
    };
    let deliveries = message.deliveries();
    let view = message.view(&id);
    let call = inbox_runtime::__facade::settled_by_caller(handler(&view));
    // The handler runs in a consumer span, the child of the context the
    // message carries.
    #[cfg(feature = "otel")]
    let call = {
        use inbox_runtime::__facade::otel;
        let (destination, group) = (message.destination(), message.group());
        let routing_key = message.routing_key();
        let messaging = otel::Messaging {
            system: Some(M::SYSTEM),
            destination: &destination,
            routing_key: routing_key.as_deref(),
            message_id: &id,
            group: group.as_deref().or(Some(consumer)),
        };
        otel::consume(messaging, &message.headers_named(&otel::fields()), call)
    };
    let outcome = match message.position() {
        None => call.await,
        Some(position) => {
            let (outcome, verdict) = inbox_runtime::__facade::at_position(position, call).await;
            message.fenced(verdict);
            outcome
        }
    };
    let counted = match M::LIMITS_DELIVERIES {
        true => deliveries,
        false => 1,
    };
    let settlement = policy.settlement(&outcome, counted);
    let delay = policy.retry_delay_for(deliveries);
    let mut released_early = false;
    if settlement == Settlement::Retry {
        if let Some(transient) = context.transient {
            transient.notify_one();
        }
        if M::HOLDS_RETRIES {
            released_early = context.holds.hold(delay).await;
        }
    }
    let settled = message.settle(settlement, delay).await;
    inbox_runtime::__facade::consumer_settled(consumer, settled_label(&settled, settlement), 1);
    match (&settled, settlement, &outcome) {
        (Err(e), _, _) => {
            tracing::warn!(target: crate::TRACING_TARGET, message_id = %id, consumer, error = %e, "diesel-inbox: the broker did not take the settlement; it will redeliver the message");
        }
        (Ok(()), Settlement::Ack, _) => {
            tracing::debug!(target: crate::TRACING_TARGET, message_id = %id, consumer, delivery = deliveries, "diesel-inbox: acked");
        }
        (Ok(()), Settlement::Retry, Err(e)) => {
            let next = match released_early {
                true => "given back early (shutdown, or the database is back)".to_string(),
                false => format!("redelivered in {:.1} s", delay.as_secs_f64()),
            };
            tracing::warn!(target: crate::TRACING_TARGET, message_id = %id, consumer, delivery = deliveries, error = ?e, "diesel-inbox: delivery failed; {next}");
        }
        (Ok(()), Settlement::DeadLetter, Err(e)) => {
            tracing::warn!(target: crate::TRACING_TARGET, message_id = %id, consumer, delivery = deliveries, error = ?e, "diesel-inbox: delivery failed; dead-lettered");
        }
        (Ok(()), _, Ok(_)) => {}
    }
    settled?;
    Ok(Handled {
        message_id: id,
        outcome,
        settlement,
        deliveries,
        released_early,
    })
}

/// The `diesel_inbox.settlement` label of a settlement that `settled`.
fn settled_label(settled: &Result<(), BrokerError>, settlement: Settlement) -> &'static str {
    match (settled, settlement) {
        (Err(_), _) => "unsettled",
        (Ok(()), Settlement::Ack) => "ack",
        (Ok(()), Settlement::Retry) => "retry",
        (Ok(()), Settlement::DeadLetter) => "dead_letter",
    }
}

/// A message id the inbox can key on, or why not.
pub(crate) fn usable_id(id: Option<&str>, what: &str) -> Result<String, String> {
    let id = id.ok_or_else(|| format!("no {what}"))?;
    validate_key(id).map_err(|e: InvalidKey| format!("{what}: {e}"))?;
    Ok(id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Processed;

    fn settle<E: HasInboxError>(policy: &Policy<E>, error: E) -> Settlement {
        policy.settlement(&Err::<Processed<()>, _>(error), 1)
    }

    #[test]
    fn the_inbox_refusals_are_dead_lettered_through_a_diesel_error() {
        let policy = Policy::new(|_: &diesel::result::Error| false);
        let exhausted = InboxError::AttemptsExhausted {
            consumer: "orders".into(),
            key: "m-1".into(),
            failures: 5,
            last_error: "boom".into(),
        };
        assert_eq!(settle(&policy, exhausted.into()), Settlement::DeadLetter);
        let invalid = crate::validate_key("").expect_err("an empty key is invalid");
        assert_eq!(
            settle(&policy, InboxError::InvalidKey(invalid).into()),
            Settlement::DeadLetter
        );
        // A database error (an outage, a deadlock) is redelivered.
        assert_eq!(
            settle(&policy, diesel::result::Error::BrokenTransactionManager),
            Settlement::Retry
        );
        let retries = InboxError::InvalidArgument("retries");
        assert_eq!(settle(&policy, retries.into()), Settlement::Retry);
    }
}
