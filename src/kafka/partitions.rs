//! The runner's source: the partitions the group assigned, the
//! configuration it refuses, what `exit_when_idle` counts as idle, and the
//! backlog.

use crate::brokers::BrokerError;
use rdkafka::consumer::{Consumer as _, ConsumerContext, DefaultConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::Offset;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::delivery::{receive, Deliveries, Delivery};
use super::ffi;
use super::state::{Lanes, Shared};

/// The partitions a [`Consumer`](super::Consumer) reads: the user's consumer and the state
/// of each partition's lane.
pub struct Partitions<C: ConsumerContext + 'static = DefaultConsumerContext> {
    pub(super) shared: Arc<Shared<C>>,
    /// When the runner opened it, and whether the group has assigned it a
    /// partition since: until then its backlog is unknown, not empty.
    pub(super) opened: Option<std::time::Instant>,
    pub(super) assigned: bool,
}

/// How long a runner with [`exit_when_idle`](crate::brokers::Consumer::exit_when_idle)
/// waits for its group to assign it a partition before it counts an empty
/// assignment as nothing left (a group with more members than partitions
/// leaves some without any). A first join, or one after a member left
/// without leaving the group, can take the group's session timeout (45 s
/// by default).
pub(crate) const GROUP_JOIN_WAIT: Duration = Duration::from_secs(60);

impl<C: ConsumerContext> std::fmt::Debug for Partitions<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partitions")
            .field("id_header", &self.shared.id_header)
            .finish_non_exhaustive()
    }
}

impl<C: ConsumerContext> Partitions<C> {
    pub(super) fn new(consumer: StreamConsumer<C>, id_header: &str) -> Self {
        Partitions {
            shared: Arc::new(Shared {
                consumer,
                id_header: id_header.to_owned(),
                lanes: Mutex::new(Lanes::default()),
            }),
            opened: None,
            assigned: false,
        }
    }

    /// Sets the id header, before the runner shares the state.
    pub(super) fn set_id_header(&mut self, name: String) {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.id_header = name;
        }
    }
}

impl<C: ConsumerContext> crate::brokers::Sealed for Partitions<C> {}

impl<C: ConsumerContext + 'static> crate::brokers::Source for Partitions<C> {
    type Message = Delivery<C>;
    type Deliveries = Deliveries<C>;

    fn name(&self) -> String {
        let topics: Vec<String> = match self.shared.consumer.subscription() {
            Ok(list) => list
                .elements()
                .iter()
                .map(|e| e.topic().to_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        format!("kafka:{}", topics.join(","))
    }

    async fn open(&mut self, _prefetch: usize) -> Result<Deliveries<C>, BrokerError> {
        for setting in ["enable.auto.commit", "enable.auto.offset.store"] {
            match ffi::config(&self.shared.consumer, setting).as_deref() {
                Some("false") => {}
                found => {
                    return Err(BrokerError::Config(format!(
                        "the Kafka consumer has `{setting}` = {}: the runner commits each partition's offset itself, after the database; set `{setting}` to \"false\"",
                        found.unwrap_or("(unreadable)")
                    )))
                }
            }
        }
        if self.shared.lanes().routed {
            // Over tenants, a stored position below the runner's start is
            // another tenant's gap, so the runner cannot tell a stretch of
            // the partition skipped by the group's offsets (expired, reset
            // to the end) from it: the group must never skip.
            let reset = ffi::config(&self.shared.consumer, "auto.offset.reset");
            if !matches!(
                reset.as_deref(),
                Some("smallest" | "earliest" | "beginning" | "error")
            ) {
                return Err(BrokerError::Config(format!(
                    "the Kafka consumer has `auto.offset.reset` = {}: over tenants (`run_tenants`) the runner cannot tell a stretch of a partition the group's offsets skip (expired while the group was down, then reset to the end) from other tenants' messages; set `auto.offset.reset` to \"earliest\" (what was applied comes again and is a duplicate)",
                    reset.as_deref().unwrap_or("(not set: latest)")
                )));
            }
        }
        self.opened.get_or_insert_with(std::time::Instant::now);
        Ok(Deliveries {
            shared: self.shared.clone(),
            next: receive(self.shared.clone()),
        })
    }

    fn batching(&mut self) {
        self.shared.lanes().batched = true;
    }

    fn routing(&mut self) {
        self.shared.lanes().routed = true;
    }

    async fn stop(&mut self, _deliveries: &mut Deliveries<C>) {
        // The consumer is yours: it leaves its group when you drop it.
    }

    async fn backlog(&mut self) -> Result<u64, BrokerError> {
        let shared = self.shared.clone();
        let (left, assigned) = tokio::task::spawn_blocking(move || backlog(&shared))
            .await
            .map_err(|e| BrokerError::Broker(e.into()))??;
        self.assigned |= assigned;
        let subscribed = self
            .shared
            .consumer
            .subscription()
            .is_ok_and(|list| list.count() > 0);
        let joining = self
            .opened
            .is_some_and(|opened| opened.elapsed() < GROUP_JOIN_WAIT);
        match !self.assigned && subscribed && joining {
            // Not assigned yet: what is left is unknown, not nothing.
            true => Ok(left.max(1)),
            false => Ok(left),
        }
    }

    fn can_reconnect(&self) -> bool {
        true
    }

    async fn reconnect(&mut self) -> Result<(), BrokerError> {
        // librdkafka reconnects by itself.
        Ok(())
    }
}

/// Messages of the assigned partitions not handled yet: the high
/// watermark less the position, per partition (transaction markers count);
/// and whether any partition is assigned.
pub(super) fn backlog<C: ConsumerContext + 'static>(
    shared: &Shared<C>,
) -> Result<(u64, bool), BrokerError> {
    let consumer = &shared.consumer;
    let broker = |e: KafkaError| BrokerError::Broker(e.into());
    let positions = consumer.position().map_err(broker)?;
    let waiting: u64 = shared
        .lanes()
        .lanes
        .values()
        .map(|lane| lane.pending.len() as u64)
        .sum();
    let mut left = waiting;
    for element in positions.elements() {
        let (low, high) = consumer
            .fetch_watermarks(element.topic(), element.partition(), Duration::from_secs(5))
            .map_err(broker)?;
        let at = match element.offset() {
            Offset::Offset(at) => at,
            _ => low,
        };
        let lag = (high - at).max(0);
        inbox_runtime::__facade::kafka_lag(element.topic(), element.partition(), lag);
        left += lag as u64;
    }
    Ok((left, positions.count() > 0))
}
