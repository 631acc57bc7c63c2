//! Publishing the outbox to Amazon SQS: the destination is the queue (its
//! URL, or its name, looked up once), the outbox id travels in the
//! `message-id` message attribute (which `diesel_inbox::sqs`'s runner
//! deduplicates on with `id_attribute("message-id")`), the headers are
//! copied as `String` attributes, and a publish counts only once SQS has
//! stored it. Messages go in `SendMessageBatch` requests of ten, sent
//! side by side.
//!
//! On a FIFO queue (its name ends in `.fifo`), the ordering key is the
//! `MessageGroupId` (a message without one is its own group) and the
//! outbox id the `MessageDeduplicationId`, so a message the relay
//! publishes again within SQS's five minutes is stored once.
//!
//! SQS bodies are text: a payload that is not UTF-8 is refused (counted
//! against the relay's `max_publish_attempts`, then dead), as is a message
//! with more than nine headers (SQS takes ten attributes, the id among
//! them).

use super::{OutboxMessage, Publish, PublishError};
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use aws_sdk_sqs::Client;
use std::collections::HashMap;
use std::sync::Mutex;

/// SQS's most message attributes per message.
const MAX_ATTRIBUTES: usize = 10;
/// The most entries of a `SendMessageBatch`.
const BATCH: usize = 10;
/// The most bytes of a `SendMessageBatch` this publisher sends (SQS's
/// limit was 256 KiB until 2025, and is 1 MiB now): a message larger alone
/// goes alone, and SQS says whether it takes it.
const BATCH_BYTES: usize = 256 * 1024;

/// A [`Publish`]er to SQS queues.
///
/// ```no_run
/// # fn start(client: aws_sdk_sqs::Client) {
/// // `client` from `aws_config::load_from_env()`, say.
/// let publisher = diesel_inbox::outbox::sqs::Publisher::new(client);
/// # let _ = publisher;
/// # }
/// ```
pub struct Publisher {
    client: Client,
    id_attribute: String,
    urls: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("id_attribute", &self.id_attribute)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Publishes through `client` (its HTTP client retries and connects
    /// again by itself; a request that fails is given back to the relay).
    pub fn new(client: Client) -> Self {
        Publisher {
            client,
            id_attribute: "message-id".to_owned(),
            urls: Mutex::new(HashMap::new()),
        }
    }

    /// The message attribute that carries the outbox id (default
    /// `message-id`; the runner's `id_attribute` names the same).
    pub fn id_attribute(mut self, name: impl Into<String>) -> Self {
        self.id_attribute = name.into();
        self
    }

    /// The URL of `destination`: itself if it is one, else the URL of the
    /// queue of that name (looked up once).
    async fn url(&self, destination: &str) -> Result<String, PublishError> {
        if destination.starts_with("https://") || destination.starts_with("http://") {
            return Ok(destination.to_owned());
        }
        if let Some(url) = self.lock().get(destination) {
            return Ok(url.clone());
        }
        let request = self.client.get_queue_url().queue_name(destination).send();
        let found = tokio::time::timeout(crate::sqs::REQUEST_TIMEOUT, request)
            .await
            .map_err(|_| PublishError::unavailable("SQS did not answer within 30 s"))?
            .map_err(|e| {
                let missing = e
                    .as_service_error()
                    .is_some_and(|s| s.is_queue_does_not_exist());
                let why = aws_sdk_sqs::error::DisplayErrorContext(e).to_string();
                match missing {
                    true => {
                        PublishError::refused(format!("no SQS queue named {destination} ({why})"))
                    }
                    false => PublishError::unavailable(why),
                }
            })?;
        let url = found
            .queue_url()
            .ok_or_else(|| {
                PublishError::unavailable(format!("no URL for the queue {destination}"))
            })?
            .to_owned();
        self.lock().insert(destination.to_owned(), url.clone());
        Ok(url)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.urls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The batch entry of `message` (its index in the batch as its id).
    fn entry(
        &self,
        i: usize,
        message: &OutboxMessage,
        fifo: bool,
    ) -> Result<SendMessageBatchRequestEntry, PublishError> {
        let body = std::str::from_utf8(&message.payload).map_err(|_| {
            PublishError::refused("SQS message bodies are text, and this payload is not UTF-8")
        })?;
        let string = |value: &str| {
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .map_err(PublishError::refused)
        };
        let mut attributes = HashMap::with_capacity(message.headers.len() + 1);
        attributes.insert(self.id_attribute.clone(), string(&message.id)?);
        for (name, value) in &message.headers {
            if *name != self.id_attribute {
                attributes.insert(name.clone(), string(value)?);
            }
        }
        if attributes.len() > MAX_ATTRIBUTES {
            return Err(PublishError::refused(format!(
                "SQS takes {MAX_ATTRIBUTES} message attributes, and this message has {} (its headers and the id)",
                attributes.len()
            )));
        }
        let mut entry = SendMessageBatchRequestEntry::builder()
            .id(i.to_string())
            .message_body(body)
            .set_message_attributes(Some(attributes));
        if fifo {
            let group = message.ordering_key.as_deref().unwrap_or(&message.id);
            entry = entry
                .message_group_id(group)
                .message_deduplication_id(&message.id);
        }
        entry.build().map_err(PublishError::refused)
    }

    /// Sends `messages` (of one queue, at most ten) as one request: one
    /// result per message.
    async fn send(&self, url: &str, messages: &[&OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let fifo = super::super::sqs::queue_name(url).ends_with(".fifo");
        let mut results: Vec<Result<(), PublishError>> = vec![Ok(()); messages.len()];
        let mut entries = Vec::with_capacity(messages.len());
        for (i, message) in messages.iter().enumerate() {
            match self.entry(i, message, fifo) {
                Ok(entry) => entries.push(entry),
                Err(e) => results[i] = Err(e),
            }
        }
        if entries.is_empty() {
            return results;
        }
        let request = self
            .client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send();
        let Ok(sent) = tokio::time::timeout(crate::sqs::REQUEST_TIMEOUT, request).await else {
            let error = PublishError::unavailable("SQS did not answer within 30 s");
            for result in results.iter_mut().filter(|r| r.is_ok()) {
                *result = Err(error.clone());
            }
            return results;
        };
        match sent {
            Ok(answer) => {
                for failed in answer.failed() {
                    let Ok(i) = failed.id().parse::<usize>() else {
                        continue;
                    };
                    let why = format!(
                        "SQS did not store the message ({}: {})",
                        failed.code(),
                        failed.message().unwrap_or("")
                    );
                    if let Some(result) = results.get_mut(i) {
                        *result = Err(match failed.sender_fault() {
                            true => PublishError::refused(why),
                            false => PublishError::unavailable(why),
                        });
                    }
                }
            }
            Err(e) => {
                let refused = e.as_service_error().is_some_and(|s| {
                    s.is_queue_does_not_exist()
                        || s.is_batch_request_too_long()
                        || s.is_invalid_batch_entry_id()
                        || s.is_unsupported_operation()
                });
                let why = aws_sdk_sqs::error::DisplayErrorContext(e).to_string();
                let error = match refused {
                    true => PublishError::refused(why),
                    false => PublishError::unavailable(why),
                };
                for result in results.iter_mut().filter(|r| r.is_ok()) {
                    *result = Err(error.clone());
                }
            }
        }
        results
    }
}

impl Publish for Publisher {
    fn messaging_system(&self) -> Option<&str> {
        Some("aws_sqs")
    }

    fn messaging_route<'a>(&'a self, destination: &'a str) -> (&'a str, Option<&'a str>) {
        (super::super::sqs::queue_name(destination), None)
    }

    async fn publish<'a>(&'a self, messages: &'a [OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Result<(), PublishError>> = vec![Ok(()); messages.len()];
        // Per queue, in order: (the queue's URL, the indexes of its messages).
        let mut queues: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            match queues.iter_mut().find(|(d, _)| *d == message.destination) {
                Some((_, indexes)) => indexes.push(i),
                None => queues.push((message.destination.clone(), vec![i])),
            }
        }
        let mut requests = Vec::new();
        for (destination, indexes) in &queues {
            let url = match Box::pin(self.url(destination)).await {
                Ok(url) => url,
                Err(e) => {
                    for &i in indexes {
                        results[i] = Err(e.clone());
                    }
                    continue;
                }
            };
            for chunk in chunks(messages, indexes) {
                let url = url.clone();
                requests.push(async move {
                    let batch: Vec<&OutboxMessage> = chunk.iter().map(|&i| &messages[i]).collect();
                    // Boxed: the SDK's request futures are deep, and a
                    // relay's future (in the user's `async fn`) would
                    // otherwise pass the compiler's layout depth limit.
                    let sent = Box::pin(self.send(&url, &batch)).await;
                    (chunk, sent)
                });
            }
        }
        for (chunk, sent) in futures_util::future::join_all(requests).await {
            for (&i, result) in chunk.iter().zip(sent) {
                results[i] = result;
            }
        }
        results
    }
}

/// `indexes` of `messages` in batches of at most ten entries and
/// [`BATCH_BYTES`], in order.
fn chunks(messages: &[OutboxMessage], indexes: &[usize]) -> Vec<Vec<usize>> {
    let size = |m: &OutboxMessage| {
        m.payload.len()
            + m.id.len()
            + m.headers
                .iter()
                .map(|(n, v)| n.len() + v.len())
                .sum::<usize>()
    };
    let mut all: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for &i in indexes {
        let n = size(&messages[i]);
        match all.last_mut() {
            Some(last) if last.len() < BATCH && bytes + n <= BATCH_BYTES => {
                last.push(i);
                bytes += n;
            }
            _ => {
                all.push(vec![i]);
                bytes = n;
            }
        }
    }
    all
}
