//! What a consumer does with a handler's outcome, the same for every
//! broker: ack a message once its handler's transaction has committed
//! (`Applied`) or found it done before (`Duplicate`), redeliver it after a
//! transient error, dead-letter it after a permanent one or once the
//! broker has delivered it too often. The broker modules (`diesel_inbox::lapin`,
//! `diesel_inbox::nats`) read the message id and the delivery count from
//! their client's message and carry out the [`Settlement`].

use crate::{validate_key, InboxError, InvalidKey, Outcome};
use std::time::Duration;

pub(crate) mod runner;
pub(crate) use runner::Sealed;
pub use runner::{
    Consumer, RunReport, Source, MAX_PROBE_INTERVAL, MAX_RECONNECT_DELAY, PROBE_INTERVAL,
    RECONNECT_DELAY,
};

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
pub const DEFAULT_MAX_DELIVERIES: u32 = 20;

/// Where a handler's error holds an [`InboxError`].
type FindInboxError<E> = dyn Fn(&E) -> Option<&InboxError> + Send + Sync;

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
    inbox_error: Box<FindInboxError<E>>,
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

impl<E> Policy<E> {
    /// `permanent(e)` says whether an error is permanent (dead-letter at
    /// once) rather than transient (redeliver). The inbox's own refusals
    /// are permanent whatever it says ([`is_inbox_permanent`]): a key
    /// reused with other content, attempts exhausted, an invalid key, when
    /// the handler's error is an [`InboxError`] or a diesel error holding
    /// one (for an error type of your own, say where it holds one with
    /// [`inbox_error`](Self::inbox_error)). A safety-net delivery limit
    /// of [`DEFAULT_MAX_DELIVERIES`]; a first retry delay of 1 s, doubled
    /// per delivery up to 60 s.
    pub fn new(permanent: impl Fn(&E) -> bool + Send + Sync + 'static) -> Self
    where
        E: 'static,
    {
        Policy {
            permanent: Box::new(permanent),
            inbox_error: Box::new(inbox_error_in::<E>),
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
    /// above `max_attempts`; the default is [`DEFAULT_MAX_DELIVERIES`].
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = Some(n);
        self
    }

    /// Where an error of the handler's own type holds an [`InboxError`]
    /// (`AppError::Inbox(e)`, say), so that the inbox's permanent refusals
    /// ([`is_inbox_permanent`]) are dead-lettered by default for it too.
    ///
    /// ```
    /// use diesel_inbox::brokers::{Policy, Settlement};
    /// use diesel_inbox::{InboxError, Processed};
    ///
    /// #[derive(Debug)]
    /// enum AppError { Inbox(InboxError), Database }
    ///
    /// let policy = Policy::new(|_: &AppError| false).inbox_error(|e| match e {
    ///     AppError::Inbox(inner) => Some(inner),
    ///     AppError::Database => None,
    /// });
    /// let reused = AppError::Inbox(InboxError::KeyReused { consumer: "orders".into(), key: "m-1".into() });
    /// assert_eq!(policy.settlement(&Err::<Processed<()>, _>(reused), 1), Settlement::DeadLetter);
    /// assert_eq!(policy.settlement(&Err::<Processed<()>, _>(AppError::Database), 1), Settlement::Retry);
    /// ```
    pub fn inbox_error(
        mut self,
        find: impl Fn(&E) -> Option<&InboxError> + Send + Sync + 'static,
    ) -> Self {
        self.inbox_error = Box::new(find);
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
    /// let policy = Policy::new(|_: &()| false)
    ///     .retry_delay(Duration::from_millis(100))
    ///     .max_retry_delay(Duration::from_secs(2));
    /// let first = policy.retry_delay_for(1);
    /// assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
    /// let fourth = policy.retry_delay_for(4);
    /// assert!(fourth >= Duration::from_millis(400) && fourth <= Duration::from_millis(800));
    /// assert!(policy.retry_delay_for(50) <= Duration::from_secs(2));
    /// ```
    pub fn retry_delay_for(&self, deliveries: u32) -> Duration {
        jittered_backoff(self.retry_delay, self.max_retry_delay, deliveries)
    }

    /// What to do with a message delivered `deliveries` times (this one
    /// included) whose handler returned `outcome` (any handler's:
    /// [`Processed`](crate::Processed), [`Stored`](crate::Stored)).
    pub fn settlement<O: Outcome>(&self, outcome: &Result<O, E>, deliveries: u32) -> Settlement {
        match outcome {
            Ok(_) => Settlement::Ack,
            Err(e) if (self.permanent)(e) => Settlement::DeadLetter,
            Err(e) if (self.inbox_error)(e).is_some_and(is_inbox_permanent) => {
                Settlement::DeadLetter
            }
            Err(_) if self.max_deliveries.is_some_and(|max| deliveries >= max) => {
                Settlement::DeadLetter
            }
            Err(_) => Settlement::Retry,
        }
    }
}

/// Whether the inbox refused a delivery for good: its key was reused with
/// other content ([`InboxError::KeyReused`]), its body failed
/// `max_attempts` times ([`InboxError::AttemptsExhausted`]), or its key
/// is not one the inbox can store ([`InboxError::InvalidKey`]). Every
/// redelivery would be refused the same way.
pub fn is_inbox_permanent(error: &InboxError) -> bool {
    matches!(
        error,
        InboxError::KeyReused { .. }
            | InboxError::AttemptsExhausted { .. }
            | InboxError::InvalidKey(_)
    )
}

/// The [`InboxError`] an error is or holds: itself, or a diesel error that
/// carries one (`QueryResult` handlers).
fn inbox_error_in<E: 'static>(error: &E) -> Option<&InboxError> {
    let any: &dyn std::any::Any = error;
    if let Some(inbox) = any.downcast_ref::<InboxError>() {
        return Some(inbox);
    }
    match any.downcast_ref::<diesel::result::Error>() {
        Some(diesel::result::Error::QueryBuilderError(inner)) => inner.downcast_ref::<InboxError>(),
        _ => None,
    }
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
}

/// Why a message was not handled, or could not be settled.
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
    Settle(String),
    /// The broker connection or channel failed while consuming (a consumer
    /// runner returns it after finishing the deliveries in flight): connect
    /// again and run again; what was not acked is redelivered.
    #[error("the broker connection failed: {0}")]
    Broker(String),
}

/// A broker's message, as [`handle`] needs it: each broker module
/// implements it for its client's message type. Sealed by [`Sealed`].
#[doc(hidden)]
pub trait Inbound: Sealed {
    /// The id to deduplicate on, or why there is none.
    fn message_id(&self) -> Result<String, BrokerError>;
    /// How often the broker has delivered it, this time included.
    fn deliveries(&self) -> u32;
    fn body(&self) -> &[u8];
    /// Tells the broker; `retry_delay` is the backoff's delay of a retry.
    fn settle(
        &self,
        settlement: Settlement,
        retry_delay: Duration,
    ) -> impl std::future::Future<Output = Result<(), BrokerError>>;
}

/// The one consume step of every broker: the id (a message without one is
/// dead-lettered and reported), the handler, the policy's settlement, and
/// only then the broker's ack, requeue or dead-letter.
pub(crate) async fn handle<M, O, E, F>(
    message: M,
    policy: &Policy<E>,
    handler: F,
) -> Result<Handled<O, E>, BrokerError>
where
    M: Inbound,
    O: Outcome,
    E: std::fmt::Debug,
    F: AsyncFnOnce(&str, &[u8]) -> Result<O, E>,
{
    let id = match message.message_id() {
        Ok(id) => id,
        Err(e) => {
            message
                .settle(Settlement::DeadLetter, Duration::ZERO)
                .await?;
            tracing::warn!(target: "diesel_inbox", error = %e, "diesel-inbox: dead-lettered a message without a usable id");
            return Err(e);
        }
    };
    let deliveries = message.deliveries();
    let outcome = handler(&id, message.body()).await;
    let settlement = policy.settlement(&outcome, deliveries);
    message
        .settle(settlement, policy.retry_delay_for(deliveries))
        .await?;
    if let (Settlement::DeadLetter, Err(e)) = (settlement, &outcome) {
        tracing::warn!(target: "diesel_inbox", message_id = %id, deliveries, error = ?e, "diesel-inbox: dead-lettered a message");
    }
    Ok(Handled {
        message_id: id,
        outcome,
        settlement,
        deliveries,
    })
}

/// A message id the inbox can key on, or why not.
pub(crate) fn usable_id(id: Option<&str>, what: &str) -> Result<String, String> {
    let id = id.ok_or_else(|| format!("no {what}"))?;
    validate_key(id).map_err(|e: InvalidKey| format!("{what}: {e}"))?;
    Ok(id.to_owned())
}

/// The `n`th delay of a backoff (1 for the first): `first` doubled per
/// earlier one, capped at `cap`, then jittered to between half and all of
/// it, so that what one outage failed does not come back in lockstep. The
/// consumers' redeliveries and the outbox relay's retries.
pub(crate) fn jittered_backoff(first: Duration, cap: Duration, n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(31);
    let delay = first.saturating_mul(1u32 << doublings).min(cap);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // Between half and all of the delay.
    delay / 2 + delay.mul_f64(f64::from(nanos % 1_000_000) / 2_000_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Processed;

    fn settle<E: 'static>(policy: &Policy<E>, error: E) -> Settlement {
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
