//! The runner's state shared by its source and its deliveries: the
//! user's consumer, and a lane of waiting records per partition (paused
//! when full) with the offsets that completed.

use rdkafka::consumer::{CommitMode, Consumer as _, ConsumerContext, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Duration;

#[cfg(feature = "metrics")]
use super::ffi;

/// How long a seek may take (a local operation of librdkafka's).
pub(super) const SEEK_TIMEOUT: Duration = Duration::from_secs(5);

/// How many messages of one partition wait in the runner while the one
/// before them runs, before the partition is paused (librdkafka then drops
/// what it fetched past them, and fetches again from after the last one
/// when resumed).
pub(super) const LANE_BUFFER: usize = 256;

pub(super) struct Shared<C: ConsumerContext + 'static> {
    pub(super) consumer: StreamConsumer<C>,
    pub(super) id_header: String,
    pub(super) lanes: Mutex<Lanes>,
}

impl<C: ConsumerContext> Shared<C> {
    pub(super) fn lanes(&self) -> MutexGuard<'_, Lanes> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn pause(&self, topic: &str, partition: i32, pause: bool) {
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, partition);
        let done = match pause {
            true => self.consumer.pause(&list),
            false => self.consumer.resume(&list),
        };
        if let Err(e) = done {
            tracing::debug!(target: crate::TRACING_TARGET, topic, partition, error = %e, "diesel-inbox: pausing or resuming a partition failed (revoked?)");
        }
    }

    /// Commits `next` as the partition's offset in Kafka (for lag tools),
    /// without waiting.
    pub(super) fn commit(&self, topic: &str, partition: i32, next: i64) {
        let mut list = TopicPartitionList::new();
        if list
            .add_partition_offset(topic, partition, Offset::Offset(next))
            .is_err()
        {
            return;
        }
        if let Err(e) = self.consumer.commit(&list, CommitMode::Async) {
            tracing::debug!(target: crate::TRACING_TARGET, topic, partition, next, error = %e, "diesel-inbox: committing the Kafka offset failed (the database's position stands)");
        }
    }

    /// Commits each partition's `next` offset in Kafka in one request,
    /// without waiting (a batch's).
    pub(super) fn commit_all(&self, next: &std::collections::BTreeMap<(&str, i32), i64>) {
        let mut list = TopicPartitionList::new();
        for (&(topic, partition), &at) in next {
            if list
                .add_partition_offset(topic, partition, Offset::Offset(at))
                .is_err()
            {
                return;
            }
            #[cfg(feature = "metrics")]
            self.lag(topic, partition, at);
        }
        if let Err(e) = self.consumer.commit(&list, CommitMode::Async) {
            tracing::debug!(target: crate::TRACING_TARGET, error = %e, "diesel-inbox: committing the Kafka offsets failed (the database's positions stand)");
        }
    }

    /// Sets the lag gauge of the partition from librdkafka's cached high
    /// watermark (no request to the broker), `next` being the runner's
    /// position.
    #[cfg(feature = "metrics")]
    pub(super) fn lag(&self, topic: &str, partition: i32, next: i64) {
        let Ok(name) = std::ffi::CString::new(topic) else {
            return;
        };
        if let Some(high) = ffi::high_watermark(&self.consumer, &name, partition) {
            inbox_runtime::__facade::kafka_lag(topic, partition, (high - next).max(0));
        }
    }

    pub(super) fn seek(&self, topic: &str, partition: i32, to: i64) {
        if let Err(e) = self
            .consumer
            .seek(topic, partition, Offset::Offset(to), SEEK_TIMEOUT)
        {
            tracing::warn!(target: crate::TRACING_TARGET, topic, partition, offset = to, error = %e, "diesel-inbox: seeking the partition to the database's position failed (revoked?)");
        }
    }
}

/// Every partition's lane, and the messages ready to hand out.
#[derive(Default)]
pub(super) struct Lanes {
    /// The runner takes batches ([`run_batch`](crate::brokers::Consumer::run_batch)):
    /// every message is handed out as it arrives (the runner handles one
    /// batch at a time, in offset order), and no lane waits or pauses.
    pub(super) batched: bool,
    /// The runner routes each message to its tenant's database
    /// ([`run_tenants`](crate::brokers::Consumer::run_tenants)): a
    /// partition's positions are spread over many databases, so a
    /// database's stored position below the runner's own is another
    /// tenant's gap, not messages skipped.
    pub(super) routed: bool,
    pub(super) lanes: HashMap<(Arc<str>, i32), Lane>,
    /// The next message of lanes that are free, oldest lane first.
    pub(super) ready: VecDeque<Arc<Record>>,
    /// The stream's task, woken when a message becomes ready.
    pub(super) waker: Option<Waker>,
}

/// One partition: at most one message handed out at a time.
#[derive(Default)]
pub(super) struct Lane {
    /// A message of this partition is being handled.
    pub(super) busy: bool,
    /// Messages received while it was, in offset order (at most
    /// [`LANE_BUFFER`]: the partition is paused then).
    pub(super) pending: VecDeque<Arc<Record>>,
    pub(super) paused: bool,
    /// The offset of the last message received.
    pub(super) received: Option<i64>,
    /// Where the current contiguous run of received messages began (the
    /// first message received, or where the runner sought to): the lowest
    /// stored position the fence accepts.
    pub(super) start: Option<i64>,
}

/// A received message, owned.
#[derive(Debug)]
pub(super) struct Record {
    pub(super) topic: Arc<str>,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) payload: Vec<u8>,
    pub(super) id: Result<String, String>,
    pub(super) deliveries: u32,
    /// Its headers that have a value.
    pub(super) headers: Vec<(String, Vec<u8>)>,
    pub(super) key: Option<Vec<u8>>,
    /// Milliseconds since 1970.
    pub(super) timestamp: Option<i64>,
}
