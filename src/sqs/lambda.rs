//! A Lambda function fed by an SQS event source: each record of the
//! event through the handler, the failed ones reported back as partial
//! batch failures.

use crate::brokers::{
    usable_id, BrokerError, Context, HasInboxError, Holds, Inbound, Policy, Settlement,
};
use crate::Outcome;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use std::borrow::Borrow;
use std::sync::Mutex;
use std::time::Duration;

/// Runs each record of an SQS event through `handler` (an
/// `#[idempotent]` handler's call: its transaction records the message id
/// with the business change), in order, and returns the records that
/// failed as `batch_item_failures`: Lambda deletes the others and SQS
/// delivers those again (enable `ReportBatchItemFailures` on the event
/// source mapping). The id is the record's `MessageId`
/// ([`lambda_by_attribute`] for a message attribute).
///
/// - `Applied` and `Duplicate` succeed: a redelivered record whose
///   transaction had committed is not applied again.
/// - An error fails the record (SQS's redrive policy dead-letters it after
///   its `maxReceiveCount`), and so does a record without a usable id;
///   each is logged as a WARN line, as the runners log.
/// - From a FIFO queue (its ARN ends in `.fifo`), the first failure fails
///   every record after it too, unrun, so that none overtakes it.
///
/// ```no_run
/// use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
/// use diesel_async::pooled_connection::deadpool::Pool;
/// use diesel_async::AsyncPgConnection;
/// use diesel_inbox::{idempotent, InboxError};
///
/// #[idempotent(key = "id")]
/// async fn ship(conn: &mut AsyncPgConnection, id: &str, body: &[u8]) -> Result<(), InboxError> {
///     let _ = (conn, body); // the business writes
///     Ok(())
/// }
///
/// // The function's body, with `lambda_runtime`: `service_fn(|e: LambdaEvent<SqsEvent>| ...)`.
/// async fn function(pool: &Pool<AsyncPgConnection>, event: SqsEvent) -> SqsBatchResponse {
///     diesel_inbox::sqs::lambda(event, async |id: &str, body: &[u8]| {
///         let Ok(mut conn) = pool.get().await else {
///             return Err(InboxError::InvalidArgument("no database connection"));
///         };
///         ship(&mut conn, id, body).await
///     })
///     .await
/// }
/// ```
pub async fn lambda<O, E, F>(event: impl Borrow<SqsEvent>, handler: F) -> SqsBatchResponse
where
    O: Outcome,
    E: HasInboxError + std::fmt::Debug,
    F: AsyncFn(&str, &[u8]) -> Result<O, E>,
{
    run(event.borrow(), None, handler).await
}

/// [`lambda`], deduplicating on the message attribute `name` (a `String`
/// attribute, such as the relay's `message-id`) instead of the
/// `MessageId`. A record without it fails.
pub async fn lambda_by_attribute<O, E, F>(
    event: impl Borrow<SqsEvent>,
    name: &str,
    handler: F,
) -> SqsBatchResponse
where
    O: Outcome,
    E: HasInboxError + std::fmt::Debug,
    F: AsyncFn(&str, &[u8]) -> Result<O, E>,
{
    run(event.borrow(), Some(name), handler).await
}

async fn run<O, E, F>(event: &SqsEvent, attribute: Option<&str>, handler: F) -> SqsBatchResponse
where
    O: Outcome,
    E: HasInboxError + std::fmt::Debug,
    F: AsyncFn(&str, &[u8]) -> Result<O, E>,
{
    // Every failure is reported back; SQS decides when to dead-letter.
    let policy = Policy::new(|_: &E| false).unlimited_deliveries();
    let failed = Mutex::new(Vec::new());
    let holds = Holds::none();
    let mut blocked = false;
    for record in &event.records {
        let queue = record
            .event_source_arn
            .as_deref()
            .map(|arn| arn.rsplit(':').next().unwrap_or(arn))
            .unwrap_or("sqs");
        let fifo = queue.ends_with(".fifo");
        let record = Record {
            record,
            attribute,
            failed: &failed,
        };
        if blocked {
            record.fail();
            continue;
        }
        let context = Context {
            consumer: Some(queue),
            holds: &holds,
            transient: None,
        };
        let handled = crate::brokers::handle(
            record,
            &policy,
            context,
            async |m: &crate::brokers::Message<'_>| handler(m.id(), m.body()).await,
        )
        .await;
        let ok = matches!(&handled, Ok(h) if h.settlement == Settlement::Ack);
        blocked = fifo && !ok;
    }
    let mut response = SqsBatchResponse::default();
    for id in failed
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = id;
        response.batch_item_failures.push(failure);
    }
    response
}

/// A record of the event, as the one consume step reads it; a retry or a
/// dead letter reports it failed.
struct Record<'a> {
    record: &'a SqsMessage,
    attribute: Option<&'a str>,
    failed: &'a Mutex<Vec<String>>,
}

impl Record<'_> {
    fn fail(&self) {
        if let Some(id) = &self.record.message_id {
            self.failed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(id.clone());
        }
    }
}

impl crate::brokers::Sealed for Record<'_> {}

impl Inbound for Record<'_> {
    const HOLDS_RETRIES: bool = false;

    fn message_id(&self) -> Result<String, BrokerError> {
        let id = match self.attribute {
            None => usable_id(self.record.message_id.as_deref(), "SQS MessageId"),
            Some(name) => usable_id(
                self.record
                    .message_attributes
                    .get(name)
                    .and_then(|v| v.string_value.as_deref()),
                &format!("message attribute {name}"),
            ),
        };
        id.map_err(|why| BrokerError::NoMessageId { why })
    }

    /// With its message attributes whose values are strings.
    fn view<'a>(&'a self, id: &'a str) -> crate::brokers::Message<'a> {
        let headers = self
            .record
            .message_attributes
            .iter()
            .filter_map(|(name, value)| {
                Some((name.as_str(), value.string_value.as_deref()?.as_bytes()))
            })
            .collect();
        crate::brokers::Message {
            deliveries: self.deliveries(),
            headers,
            ..crate::brokers::Message::new(id, self.body())
        }
    }

    fn deliveries(&self) -> u32 {
        self.record
            .attributes
            .get("ApproximateReceiveCount")
            .and_then(|n| n.parse().ok())
            .unwrap_or(1)
            .max(1)
    }

    fn body(&self) -> &[u8] {
        self.record.body.as_deref().unwrap_or("").as_bytes()
    }

    fn origin(&self) -> String {
        self.record.event_source_arn.clone().unwrap_or_default()
    }

    #[cfg(feature = "otel")]
    const SYSTEM: &'static str = "aws_sqs";

    #[cfg(feature = "otel")]
    fn destination(&self) -> String {
        let arn = self.record.event_source_arn.as_deref().unwrap_or("");
        arn.rsplit(':').next().unwrap_or(arn).to_owned()
    }

    #[cfg(feature = "otel")]
    fn headers_named(&self, names: &[String]) -> Vec<(String, String)> {
        self.record
            .message_attributes
            .iter()
            .filter(|(name, _)| names.iter().any(|n| n.eq_ignore_ascii_case(name)))
            .filter_map(|(name, value)| Some((name.clone(), value.string_value.clone()?)))
            .collect()
    }

    async fn settle(&self, settlement: Settlement, _: Duration) -> Result<(), BrokerError> {
        if settlement != Settlement::Ack {
            self.fail();
        }
        Ok(())
    }
}
