//! One record as the runner hands it to the handler ([`Delivery`]): its
//! id, its position and its settlement; and the stream of them
//! ([`Deliveries`]).

use super::state::{Lanes, Record, Shared, LANE_BUFFER};
use crate::brokers::{usable_id, BrokerError, Inbound, Message, Settlement};
use futures_util::Stream;
use inbox_runtime::__facade::{Position, Verdict};
use rdkafka::consumer::{ConsumerContext, DefaultConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message as _};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// The message's id: the `header`'s value when the message has it, else
/// `topic/partition/offset`; a valid inbox key either way.
pub fn message_id(message: &BorrowedMessage<'_>, header: &str) -> Result<String, BrokerError> {
    id_of(message, header).map_err(|why| BrokerError::NoMessageId { why })
}

pub(super) fn id_of(message: &BorrowedMessage<'_>, header: &str) -> Result<String, String> {
    let from_header = message.headers().and_then(|headers| {
        headers
            .iter()
            .find(|h| h.key == header)
            .map(|h| h.value.map(|v| String::from_utf8(v.to_vec())))
    });
    match from_header {
        Some(Some(Ok(id))) => usable_id(Some(&id), &format!("{header} header")),
        Some(Some(Err(_))) => Err(format!("the {header} header is not UTF-8")),
        Some(None) => Err(format!("the {header} header has no value")),
        None => usable_id(
            Some(&format!(
                "{}/{}/{}",
                message.topic(),
                message.partition(),
                message.offset()
            )),
            "topic, partition and offset",
        ),
    }
}

/// A message handed to the runner.
pub struct Delivery<C: ConsumerContext + 'static = DefaultConsumerContext> {
    pub(super) record: Arc<Record>,
    pub(super) floor: Option<i64>,
    pub(super) verdict: Mutex<Option<Verdict>>,
    pub(super) shared: Arc<Shared<C>>,
}

impl<C: ConsumerContext> std::fmt::Debug for Delivery<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl<C: ConsumerContext> crate::brokers::Sealed for Delivery<C> {}

impl<C: ConsumerContext + 'static> Inbound for Delivery<C> {
    // Kafka has no redelivery of one message: the runner holds a retry
    // for its backoff, then hands it out again.
    const HOLDS_RETRIES: bool = true;
    // A dead letter skips the message: only permanent errors do.
    const LIMITS_DELIVERIES: bool = false;

    fn message_id(&self) -> Result<String, BrokerError> {
        self.record
            .id
            .clone()
            .map_err(|why| BrokerError::NoMessageId { why })
    }

    fn deliveries(&self) -> u32 {
        self.record.deliveries
    }

    fn body(&self) -> &[u8] {
        &self.record.payload
    }

    fn origin(&self) -> String {
        format!("{}/{}", self.record.topic, self.record.partition)
    }

    #[cfg(feature = "otel")]
    const SYSTEM: &'static str = "kafka";

    #[cfg(feature = "otel")]
    fn destination(&self) -> String {
        self.record.topic.to_string()
    }

    #[cfg(feature = "otel")]
    fn group(&self) -> Option<String> {
        super::ffi::config(&self.shared.consumer, "group.id")
    }

    #[cfg(feature = "otel")]
    fn headers_named(&self, names: &[String]) -> Vec<(String, String)> {
        self.record
            .headers
            .iter()
            .filter(|(name, _)| names.iter().any(|n| n.eq_ignore_ascii_case(name)))
            .filter_map(|(name, value)| {
                Some((name.clone(), std::str::from_utf8(value).ok()?.to_owned()))
            })
            .collect()
    }

    fn view<'a>(&'a self, id: &'a str) -> Message<'a> {
        let record = &self.record;
        Message {
            deliveries: record.deliveries,
            headers: record
                .headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_slice()))
                .collect(),
            key: record.key.as_deref(),
            topic: Some(&record.topic),
            partition: Some(record.partition),
            offset: Some(record.offset),
            timestamp: record.timestamp,
            ..Message::new(id, &record.payload)
        }
    }

    async fn ack_batch(batch: &[&Self]) -> Result<(), BrokerError> {
        let Some(first) = batch.first() else {
            return Ok(());
        };
        // Each partition's offset after the last message of the batch, in
        // one commit request.
        let mut next: std::collections::BTreeMap<(&str, i32), i64> = Default::default();
        for delivery in batch {
            let record = &delivery.record;
            let at = next.entry((&record.topic, record.partition)).or_default();
            *at = (*at).max(record.offset + 1);
        }
        first.shared.commit_all(&next);
        Ok(())
    }

    fn position(&self) -> Option<Position> {
        Some(Position {
            topic: self.record.topic.to_string(),
            partition: self.record.partition,
            offset: self.record.offset,
            last: self.record.offset,
            floor: self.floor,
        })
    }

    fn stream_offset(&self) -> Option<(&str, i32, i64)> {
        let record = &self.record;
        Some((&record.topic, record.partition, record.offset))
    }

    fn fenced(&self, verdict: Option<Verdict>) {
        *self.verdict.lock().unwrap_or_else(|e| e.into_inner()) = verdict;
    }

    async fn settle(&self, settlement: Settlement, _delay: Duration) -> Result<(), BrokerError> {
        let verdict = self
            .verdict
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let record = &self.record;
        let (topic, partition) = (&*record.topic, record.partition);
        let shared = &self.shared;
        let mut lanes = shared.lanes();
        let Lanes {
            batched,
            lanes: all,
            ready,
            waker,
            ..
        } = &mut *lanes;
        // A batch given back at shutdown: nothing moves (what the group
        // hands out next starts from the committed offset).
        if *batched && settlement == Settlement::Retry {
            return Ok(());
        }
        let lane = all.entry((record.topic.clone(), partition)).or_default();
        lane.busy = false;
        match (settlement, verdict) {
            (Settlement::Retry, _) => {
                // Handed out again, first.
                lane.pending.push_front(Arc::new(Record {
                    topic: record.topic.clone(),
                    partition,
                    offset: record.offset,
                    payload: record.payload.clone(),
                    id: record.id.clone(),
                    deliveries: record.deliveries.saturating_add(1),
                    headers: record.headers.clone(),
                    key: record.key.clone(),
                    timestamp: record.timestamp,
                }));
            }
            // The stored position is elsewhere: continue from it. What was
            // received past this message came from before the seek.
            (Settlement::Ack, Some(Verdict::Passed(to) | Verdict::Behind(to))) => {
                lane.pending.clear();
                lane.received = None;
                lane.start = Some(to);
                shared.seek(topic, partition, to);
                if matches!(verdict, Some(Verdict::Passed(_))) {
                    shared.commit(topic, partition, to);
                }
                tracing::debug!(target: crate::TRACING_TARGET, topic, partition, offset = record.offset, stored = to, "diesel-inbox: the stored position is elsewhere; continuing from it");
            }
            // Applied, a duplicate, or dead-lettered: the partition moves on.
            (Settlement::Ack | Settlement::DeadLetter, _) => {
                if settlement == Settlement::DeadLetter {
                    tracing::warn!(target: crate::TRACING_TARGET, topic, partition, offset = record.offset, "diesel-inbox: the partition moves past a dead-lettered message; it stays in Kafka at this offset");
                }
                shared.commit(topic, partition, record.offset + 1);
                #[cfg(feature = "metrics")]
                shared.lag(topic, partition, record.offset + 1);
            }
        }
        match lane.pending.pop_front() {
            Some(next) => {
                lane.busy = true;
                ready.push_back(next);
            }
            None if lane.paused => {
                lane.paused = false;
                shared.pause(topic, partition, false);
            }
            None => {}
        }
        if let Some(waker) = waker.take() {
            waker.wake();
        }
        Ok(())
    }
}

/// The messages of [`Partitions`], as the runner reads them: each
/// partition's next message only once the one before it is settled.
#[doc(hidden)]
pub struct Deliveries<C: ConsumerContext + 'static = DefaultConsumerContext> {
    pub(super) shared: Arc<Shared<C>>,
    pub(super) next:
        Pin<Box<dyn std::future::Future<Output = Result<Arc<Record>, KafkaError>> + Send>>,
}

/// Receives the next message and owns it.
pub(super) fn receive<C: ConsumerContext + 'static>(
    shared: Arc<Shared<C>>,
) -> Pin<Box<dyn std::future::Future<Output = Result<Arc<Record>, KafkaError>> + Send>> {
    Box::pin(async move {
        let message = shared.consumer.recv().await?;
        Ok(Arc::new(Record {
            topic: Arc::from(message.topic()),
            partition: message.partition(),
            offset: message.offset(),
            payload: message.payload().unwrap_or_default().to_vec(),
            id: id_of(&message, &shared.id_header),
            deliveries: 1,
            headers: message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .filter_map(|h| Some((h.key.to_owned(), h.value?.to_vec())))
                        .collect()
                })
                .unwrap_or_default(),
            key: message.key().map(<[u8]>::to_vec),
            timestamp: message.timestamp().to_millis(),
        }))
    })
}

/// The lowest stored position a delivery's fence admits: the runner's
/// own (`start`), or, when the runner routes messages to their tenants'
/// databases, any position up to the message's offset. A tenant's
/// database holds the partition's position after that tenant's last
/// message, and the other tenants' messages since are no gap in it. A
/// position past the offset is still refused (a newer owner, or a zombie,
/// applied it, and everything of the partition before it was handled:
/// each partition is handled in offset order).
fn floor_of(routed: bool, start: Option<i64>) -> Option<i64> {
    match routed {
        true => Some(i64::MIN),
        false => start,
    }
}

impl<C: ConsumerContext + 'static> Deliveries<C> {
    pub(super) fn deliver(&self, record: Arc<Record>, floor: Option<i64>) -> Delivery<C> {
        Delivery {
            record,
            floor,
            verdict: Mutex::new(None),
            shared: self.shared.clone(),
        }
    }
}

impl<C: ConsumerContext + 'static> Stream for Deliveries<C> {
    type Item = Result<Delivery<C>, BrokerError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            {
                let mut lanes = self.shared.lanes();
                if let Some(record) = lanes.ready.pop_front() {
                    let floor = lanes
                        .lanes
                        .get(&(record.topic.clone(), record.partition))
                        .and_then(|lane| lane.start);
                    let floor = floor_of(lanes.routed, floor);
                    drop(lanes);
                    return Poll::Ready(Some(Ok(self.deliver(record, floor))));
                }
                match &mut lanes.waker {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    waker => *waker = Some(cx.waker().clone()),
                }
            }
            let received = match self.next.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(received) => received,
            };
            self.next = receive(self.shared.clone());
            let record = match received {
                Ok(record) => record,
                Err(KafkaError::MessageConsumptionFatal(code)) => {
                    return Poll::Ready(Some(Err(BrokerError::Broker(
                        KafkaError::MessageConsumptionFatal(code).into(),
                    ))));
                }
                Err(KafkaError::PartitionEOF(_)) => continue,
                Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) => {
                    return Poll::Ready(Some(Err(BrokerError::Broker(e.into()))));
                }
                Err(e) => {
                    tracing::warn!(target: crate::TRACING_TARGET, error = %e, "diesel-inbox: the Kafka consumer reported an error; going on");
                    continue;
                }
            };
            let shared = self.shared.clone();
            let mut lanes = shared.lanes();
            let (batched, routed) = (lanes.batched, lanes.routed);
            let lane = lanes
                .lanes
                .entry((record.topic.clone(), record.partition))
                .or_default();
            // Behind what was received before: the partition was assigned
            // again (from the committed offset), or librdkafka delivered
            // an offset twice. What waits from before is stale.
            if lane.received.is_some_and(|last| record.offset <= last) {
                lane.pending.retain(|r| r.offset < record.offset);
                lane.start = Some(record.offset);
            }
            if lane.start.is_none() {
                lane.start = Some(record.offset);
            }
            lane.received = Some(record.offset);
            if batched {
                let floor = floor_of(routed, lane.start);
                drop(lanes);
                return Poll::Ready(Some(Ok(self.deliver(record, floor))));
            }
            if lane.busy {
                lane.pending.push_back(record.clone());
                if lane.pending.len() >= LANE_BUFFER && !lane.paused {
                    lane.paused = true;
                    shared.pause(&record.topic, record.partition, true);
                }
                continue;
            }
            lane.busy = true;
            let floor = floor_of(routed, lane.start);
            drop(lanes);
            return Poll::Ready(Some(Ok(self.deliver(record, floor))));
        }
    }
}
