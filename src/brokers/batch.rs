//! `run_batch`: the consumer runner's pass in batches. One batch at a
//! time, in delivery order: up to `max` deliveries, or what arrived within
//! `linger` of the first; the handler runs once for the batch (one
//! transaction: the batch claim, the body, and on Kafka each partition's
//! position moved once, behind the fence); then one settlement for the
//! batch.
//!
//! A batch that fails transiently is held and run again whole after the
//! policy's backoff, never given back to the broker, which would count a
//! delivery of every member: a batch's failure spends no member's
//! delivery budget, and a batch that reaches the budget is split instead.
//! One that fails permanently, or panics, is split in two, each half run
//! in order, until the failing message is alone and settled as `run`
//! settles it. Only a message alone is charged for failing: run again in
//! place and counted here (RabbitMQ, Kafka), or given back with the delay
//! and counted by the broker (JetStream, SQS). What went before it in the
//! batch is applied first, what comes after it next, so a partition's
//! order holds.

use super::runner::{Ended, Holds, Pass, Runner, MAX_PROBE_INTERVAL, PROBE_INTERVAL};
use super::{
    BrokerError, Consumer, HasInboxError, Inbound, Message, RunReport, Settlement, Source,
};
use crate::Batch;
use futures_util::stream::{Stream, StreamExt};
use inbox_runtime::__facade::{Position, Verdict};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::pin;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The batch of a `run_batch` without [`batch`](Consumer::batch): up to
/// 100 messages.
pub(crate) const DEFAULT_BATCH: usize = 100;
/// How long a batch of a `run_batch` without [`batch`](Consumer::batch)
/// waits for more messages after its first.
pub(crate) const DEFAULT_LINGER: Duration = Duration::from_millis(10);

impl<S, E> Consumer<S, E> {
    /// Batches for [`run_batch`](Self::run_batch): up to `max` messages
    /// (at least 1), or what arrived within `linger` of a batch's first
    /// message (default 100 and 10 ms). The broker's prefetch becomes
    /// `2 × max` (one batch handled, the next arriving); `in_flight` does
    /// not apply: one batch runs at a time, in delivery order. `run` and
    /// `run_tenants` ignore it.
    pub fn batch(mut self, max: usize, linger: Duration) -> Self {
        self.runner.batch = Some((max.max(1), linger));
        self
    }

    /// Consumes in batches until `shutdown` resolves (or, with
    /// [`exit_when_idle`](Self::exit_when_idle), until the queue is
    /// drained): `handler` gets each batch's messages, in delivery order,
    /// and returns the [`Batch`] of an `#[idempotent(batch = ..)]` call (or
    /// of [`Inbox::run_batch_async`](crate::Inbox::run_batch_async)) that
    /// claims them in one transaction. Reconnects, drains and shuts down
    /// as [`run`](Self::run) does.
    ///
    /// - **Settled once per batch**, after its transaction committed:
    ///   Kafka, each partition's offset in one commit request; RabbitMQ and
    ///   JetStream, each message's ack.
    /// - **Kafka positions**: each partition's position moves once per
    ///   batch, to its last offset + 1, in the batch's transaction, behind
    ///   the fence; a partition whose stored position says another
    ///   consumer has it is dropped from the batch (the runner continues
    ///   from the stored position), and the rest of the batch runs again.
    /// - **A transient failure** (the policy's [`Retry`](Settlement::Retry))
    ///   runs the batch again after the policy's backoff, in place
    ///   (JetStream is told meanwhile that its messages are in progress).
    ///   It spends no message's delivery budget
    ///   ([`max_deliveries`](super::Policy::max_deliveries), and the
    ///   broker's own limit): a batch that reaches the budget is split as
    ///   below. Only a message alone is charged for its failures: run
    ///   again in place (Kafka, RabbitMQ), or given back with the delay
    ///   (JetStream, SQS), as `run` does.
    /// - **A permanent failure or a panic** splits the batch in two halves,
    ///   run in order, until the failing message is alone: it alone is
    ///   settled as `run` settles it (dead-lettered), and every other
    ///   message is applied once, however often the halves failed
    ///   transiently on the way.
    ///
    /// ```no_run
    /// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel_async::pooled_connection::deadpool::Pool;
    /// use diesel_async::AsyncPgConnection;
    /// use diesel_inbox::brokers::{Message, Policy};
    /// use diesel_inbox::{idempotent, Batch, InboxError};
    /// use std::time::Duration;
    ///
    /// #[idempotent(batch = "messages", key = "|m| m.id()")]
    /// async fn ship_all(
    ///     conn: &mut AsyncPgConnection,
    ///     messages: &[Message<'_>],
    /// ) -> Result<usize, InboxError> {
    ///     let _ = conn; // the business writes, one multi-row statement
    ///     Ok(messages.len())
    /// }
    ///
    /// # let (consumer, pool): (rdkafka::consumer::StreamConsumer, Pool<AsyncPgConnection>) = todo!();
    /// let report = diesel_inbox::kafka::Consumer::new(consumer, Policy::new(|_: &InboxError| false))
    ///     .batch(500, Duration::from_millis(5))
    ///     .run_batch(
    ///         async |batch: &[Message<'_>]| -> Result<Batch<usize>, InboxError> {
    ///             let Ok(mut conn) = pool.get().await else {
    ///                 return Err(InboxError::InvalidArgument("no database connection"));
    ///             };
    ///             ship_all(&mut conn, batch).await
    ///         },
    ///         async {
    ///             let _ = tokio::signal::ctrl_c().await;
    ///         },
    ///     )
    ///     .await?;
    /// println!("{report:?}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_batch<T, F>(
        mut self,
        handler: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RunReport, BrokerError>
    where
        S: Source,
        E: HasInboxError + std::fmt::Debug,
        F: AsyncFn(&[Message<'_>]) -> Result<Batch<T>, E>,
    {
        self.runner
            .batch
            .get_or_insert((DEFAULT_BATCH, DEFAULT_LINGER));
        let batched = Batched {
            handler,
            value: std::marker::PhantomData,
        };
        self.drive(&batched, shutdown).await
    }
}

/// `run_batch`'s pass.
struct Batched<F, T> {
    handler: F,
    value: std::marker::PhantomData<fn() -> T>,
}

impl<M, E, T, F> Pass<M, E> for Batched<F, T>
where
    M: Inbound,
    E: HasInboxError + std::fmt::Debug,
    F: AsyncFn(&[Message<'_>]) -> Result<Batch<T>, E>,
{
    async fn pass<D>(
        &self,
        runner: &Runner<E>,
        consumer: &str,
        report: &mut RunReport,
        mut deliveries: D,
        shutdown: impl Future<Output = ()>,
    ) -> (Ended, D)
    where
        D: Stream<Item = Result<M, BrokerError>> + Unpin,
    {
        let (max, linger) = runner.batch.unwrap_or((DEFAULT_BATCH, DEFAULT_LINGER));
        let mut shutdown = pin!(shutdown);
        let mut last_activity = Instant::now();
        loop {
            let quiet_at = runner.idle.map(|quiet| last_activity + quiet);
            let first = tokio::select! {
                biased;
                () = &mut shutdown => return (Ended::Shutdown, deliveries),
                () = tokio::time::sleep_until(quiet_at.unwrap_or_else(Instant::now)), if quiet_at.is_some() => {
                    return (Ended::Quiet, deliveries);
                }
                next = deliveries.next() => next,
            };
            let mut batch = Vec::with_capacity(max);
            match first {
                Some(Ok(delivery)) => batch.push(delivery),
                Some(Err(e)) => return (Ended::Failed(e), deliveries),
                None => return (Ended::Stream, deliveries),
            }
            // What else arrives within the linger, up to the batch's size.
            let mut ended = None;
            let mut lingered = pin!(tokio::time::sleep(linger));
            while batch.len() < max {
                tokio::select! {
                    biased;
                    next = deliveries.next() => match next {
                        Some(Ok(delivery)) => batch.push(delivery),
                        Some(Err(e)) => {
                            ended = Some(Ended::Failed(e));
                            break;
                        }
                        None => {
                            ended = Some(Ended::Stream);
                            break;
                        }
                    },
                    () = &mut lingered => break,
                }
            }
            // The batch runs to its end; shutdown gives back what waits for
            // a retry, and bounds the rest by the deadline.
            let (release, released) = watch::channel(0u64);
            let holds = Holds::released_by(released);
            let mut done = Done::default();
            let stopped = {
                let work = process(runner, consumer, &batch, &self.handler, &holds, &mut done);
                let mut work = pin!(work);
                tokio::select! {
                    biased;
                    () = &mut work => false,
                    () = &mut shutdown => {
                        release.send_modify(|generation| *generation += 1);
                        if tokio::time::timeout(runner.deadline, &mut work).await.is_err() {
                            true
                        } else {
                            ended.get_or_insert(Ended::Shutdown);
                            false
                        }
                    }
                }
            };
            done.add_to(report);
            if stopped {
                let abandoned = (batch.len() - done.settled) as u64;
                report.abandoned += abandoned;
                tracing::warn!(target: crate::TRACING_TARGET, consumer, abandoned, "diesel-inbox: shutdown deadline passed with a batch in flight; it was rolled back and will be redelivered");
                return (Ended::Shutdown, deliveries);
            }
            last_activity = Instant::now();
            if let Some(ended) = ended {
                return (ended, deliveries);
            }
        }
    }
}

/// What a batch's processing did, counted into the [`RunReport`] when it
/// ends (or is abandoned at the shutdown deadline).
#[derive(Default)]
struct Done {
    report: RunReport,
    /// Deliveries settled (or given back).
    settled: usize,
}

impl Done {
    fn add_to(&self, report: &mut RunReport) {
        let done = &self.report;
        report.acked += done.acked;
        report.retried += done.retried;
        report.released_early += done.released_early;
        report.dead_lettered += done.dead_lettered;
        report.without_id += done.without_id;
        report.unsettled += done.unsettled;
        report.batches += done.batches;
        report.pauses += done.pauses;
        report.probe_timeouts += done.probe_timeouts;
    }

    /// Counts `n` deliveries settled with `settlement` (`settled`: what
    /// the broker said).
    fn settled(
        &mut self,
        consumer: &str,
        n: usize,
        settlement: Settlement,
        settled: &Result<(), BrokerError>,
    ) {
        self.settled += n;
        let n64 = n as u64;
        let label = match (settled, settlement) {
            (Err(_), _) => {
                self.report.unsettled += n64;
                "unsettled"
            }
            (Ok(()), Settlement::Ack) => {
                self.report.acked += n64;
                "ack"
            }
            (Ok(()), Settlement::Retry) => {
                self.report.retried += n64;
                "retry"
            }
            (Ok(()), Settlement::DeadLetter) => {
                self.report.dead_lettered += n64;
                "dead_letter"
            }
        };
        inbox_runtime::__facade::consumer_settled(consumer, label, n64);
        if let Err(e) = settled {
            tracing::warn!(target: crate::TRACING_TARGET, consumer, messages = n, error = %e, "diesel-inbox: the broker did not take the settlement; it will redeliver the messages");
        }
    }
}

/// A run of the batch to handle, in delivery order.
enum Part {
    /// Deliveries (their positions in the batch) for one handler call,
    /// and how often this very call failed transiently before.
    Call(Vec<usize>, u32),
    /// A delivery without a usable id: dead-lettered, in its turn.
    NoId(usize, BrokerError),
}

/// Handles one batch to its end: every delivery settled, or given back at
/// shutdown.
async fn process<M, E, T, F>(
    runner: &Runner<E>,
    consumer: &str,
    batch: &[M],
    handler: &F,
    holds: &Holds,
    done: &mut Done,
) where
    M: Inbound,
    E: HasInboxError + std::fmt::Debug,
    F: AsyncFn(&[Message<'_>]) -> Result<Batch<T>, E>,
{
    let policy = &runner.policy;
    let mut ids = Vec::with_capacity(batch.len());
    let mut parts = VecDeque::new();
    let mut call = Vec::new();
    for (at, delivery) in batch.iter().enumerate() {
        match delivery.message_id() {
            Ok(id) => {
                ids.push(id);
                call.push(at);
            }
            Err(e) => {
                ids.push(String::new());
                if !call.is_empty() {
                    parts.push_back(Part::Call(std::mem::take(&mut call), 0));
                }
                parts.push_back(Part::NoId(at, e));
            }
        }
    }
    if !call.is_empty() {
        parts.push_back(Part::Call(call, 0));
    }
    // Runs of a batch (or a part of it) by the runner: a delivery's count
    // as the handler reads it is the broker's plus these.
    let mut reruns = vec![0u32; batch.len()];
    // Its failures alone, held and run again in place (RabbitMQ, Kafka):
    // what its delivery budget counts is the broker's count plus these.
    let mut charged = vec![0u32; batch.len()];
    while let Some(part) = parts.pop_front() {
        let (part, failures) = match part {
            Part::NoId(at, e) => {
                let settled = batch[at]
                    .settle(Settlement::DeadLetter, Duration::ZERO)
                    .await;
                done.settled(consumer, 1, Settlement::DeadLetter, &settled);
                if settled.is_ok() {
                    done.report.dead_lettered -= 1;
                    done.report.without_id += 1;
                }
                tracing::warn!(target: crate::TRACING_TARGET, consumer, error = %e, "diesel-inbox: a message without a usable id was dead-lettered");
                continue;
            }
            Part::Call(part, failures) => (part, failures),
        };
        let messages: Vec<Message<'_>> = part
            .iter()
            .map(|&at| {
                let mut message = batch[at].view(&ids[at]);
                message.deliveries = message.deliveries.saturating_add(reruns[at]);
                message
            })
            .collect();
        let positions = positions(batch, &part);
        done.report.batches += 1;
        let call = inbox_runtime::__facade::caught(inbox_runtime::__facade::settled_by_caller(
            handler(&messages),
        ));
        // One CONSUMER span for the batch, linked to the messages' contexts.
        #[cfg(feature = "otel")]
        let call = {
            use inbox_runtime::__facade::otel;
            let first = batch[part[0]].destination();
            let destination = match part.iter().all(|&at| batch[at].destination() == first) {
                true => first,
                false => consumer.to_owned(),
            };
            let routing_key = batch[part[0]].routing_key();
            let routing_key = match part
                .iter()
                .all(|&at| batch[at].routing_key() == routing_key)
            {
                true => routing_key,
                false => None,
            };
            let group = batch[part[0]].group();
            let carried = || {
                let fields = otel::fields();
                part.iter()
                    .map(|&at| batch[at].headers_named(&fields))
                    .collect()
            };
            let messaging = otel::Messaging {
                system: Some(M::SYSTEM),
                destination: &destination,
                routing_key: routing_key.as_deref(),
                message_id: "",
                group: group.as_deref().or(Some(consumer)),
            };
            otel::consume_batch(messaging, part.len(), carried, call)
        };
        let (outcome, verdicts) = match positions.is_empty() {
            true => (call.await, Vec::new()),
            false => {
                let scope = positions.iter().map(|(_, p)| p.clone()).collect();
                inbox_runtime::__facade::at_positions(scope, call).await
            }
        };
        drop(messages);
        // A failing part spends its own budget, never its members': only
        // a message isolated alone is charged for failing.
        let deliveries = part
            .iter()
            .map(|&at| batch[at].deliveries().saturating_add(charged[at]))
            .max()
            .unwrap_or(1)
            .saturating_add(failures);
        let error = match outcome {
            Ok(Ok(_)) => {
                // A partition another consumer has: continue from its
                // stored position, and run the rest again.
                let refused: Vec<(&(String, i32), Verdict)> = positions
                    .iter()
                    .zip(&verdicts)
                    .filter_map(|((partition, _), verdict)| match verdict {
                        Some(v @ (Verdict::Passed(_) | Verdict::Behind(_))) => {
                            Some((partition, *v))
                        }
                        _ => None,
                    })
                    .collect();
                if refused.is_empty() {
                    let acked: Vec<&M> = part.iter().map(|&at| &batch[at]).collect();
                    let settled = M::ack_batch(&acked).await;
                    done.settled(consumer, acked.len(), Settlement::Ack, &settled);
                    tracing::debug!(target: crate::TRACING_TARGET, consumer, messages = acked.len(), "diesel-inbox: batch acked");
                    continue;
                }
                let of = |at: usize| {
                    batch[at]
                        .stream_offset()
                        .map(|(topic, partition, _)| (topic.to_owned(), partition))
                };
                for (partition, verdict) in &refused {
                    let mut theirs = part
                        .iter()
                        .filter(|&&at| of(at).as_ref() == Some(*partition));
                    if let Some(&first) = theirs.next() {
                        batch[first].fenced(Some(*verdict));
                        let settled = batch[first].settle(Settlement::Ack, Duration::ZERO).await;
                        done.settled(consumer, 1 + theirs.count(), Settlement::Ack, &settled);
                    }
                }
                let gone = |at: &usize| {
                    refused
                        .iter()
                        .any(|(partition, _)| of(*at).as_ref() == Some(*partition))
                };
                for later in parts.iter_mut() {
                    if let Part::Call(later, _) = later {
                        let before = later.len();
                        later.retain(|at| !gone(at));
                        done.settled(consumer, before - later.len(), Settlement::Ack, &Ok(()));
                    }
                }
                let rest: Vec<usize> = part.into_iter().filter(|at| !gone(at)).collect();
                if !rest.is_empty() {
                    parts.push_front(Part::Call(rest, failures));
                }
                continue;
            }
            Ok(Err(error)) => Some(error),
            Err(panic) => {
                let why = inbox_runtime::__facade::describe_panic(panic.as_ref());
                tracing::warn!(target: crate::TRACING_TARGET, consumer, messages = part.len(), "diesel-inbox: the batch handler panicked ({why}); splitting the batch");
                None
            }
        };
        let counted = match M::LIMITS_DELIVERIES {
            true => deliveries,
            false => 1,
        };
        let (settlement, error) = match error {
            Some(error) => {
                let failed = Err::<Batch<T>, _>(error);
                (policy.settlement(&failed, counted), failed.err())
            }
            None => (Settlement::DeadLetter, None),
        };
        match settlement {
            Settlement::Retry => {
                let delay = policy.retry_delay_for(deliveries);
                tracing::warn!(target: crate::TRACING_TARGET, consumer, messages = part.len(), delivery = deliveries, error = ?error, "diesel-inbox: batch failed; running it again in {:.1} s", delay.as_secs_f64());
                let alone = part.len() == 1;
                let given_back = alone && !M::HOLDS_RETRIES;
                if given_back {
                    // Its own failure: given back with the delay, which the
                    // broker counts (JetStream's `delivered`, SQS's receive
                    // count).
                    let settled = batch[part[0]].settle(Settlement::Retry, delay).await;
                    done.settled(consumer, 1, Settlement::Retry, &settled);
                }
                // A part of more than one is held here, never given back:
                // the broker would count a delivery of every member.
                let held: Vec<usize> = match given_back {
                    true => members(&parts).collect(),
                    false => part.iter().copied().chain(members(&parts)).collect(),
                };
                let wait = async {
                    (!given_back && holds.hold(delay).await)
                        || !healthy(runner, consumer, holds, done).await
                };
                if holding(batch, &held, runner.lease, wait).await {
                    // Shutdown: give back what is left.
                    let first = match given_back {
                        true => Vec::new(),
                        false => part,
                    };
                    give_back(batch, consumer, parts.drain(..).collect(), first, done).await;
                    return;
                }
                if given_back {
                    continue;
                }
                for &at in &part {
                    reruns[at] += 1;
                }
                let failures = match alone {
                    true => {
                        charged[part[0]] += 1;
                        0
                    }
                    false => failures + 1,
                };
                done.report.retried += part.len() as u64;
                parts.push_front(Part::Call(part, failures));
            }
            Settlement::DeadLetter | Settlement::Ack if part.len() > 1 => {
                let right = part[part.len() / 2..].to_vec();
                let left = part[..part.len() / 2].to_vec();
                parts.push_front(Part::Call(right, 0));
                parts.push_front(Part::Call(left, 0));
            }
            Settlement::DeadLetter | Settlement::Ack => {
                let at = part[0];
                let settled = batch[at]
                    .settle(Settlement::DeadLetter, Duration::ZERO)
                    .await;
                done.settled(consumer, 1, Settlement::DeadLetter, &settled);
                tracing::warn!(target: crate::TRACING_TARGET, message_id = %ids[at], consumer, delivery = deliveries, error = ?error, "diesel-inbox: delivery failed; dead-lettered (isolated from its batch)");
            }
        }
    }
}

/// Gives back, at shutdown, `first` and the parts after it: redelivered
/// later, never applied here.
async fn give_back<M: Inbound>(
    batch: &[M],
    consumer: &str,
    parts: Vec<Part>,
    first: Vec<usize>,
    done: &mut Done,
) {
    let mut left = first;
    for part in parts {
        match part {
            Part::Call(part, _) => left.extend(part),
            Part::NoId(at, _) => left.push(at),
        }
    }
    for at in left {
        let settled = batch[at].settle(Settlement::Retry, Duration::ZERO).await;
        done.settled(consumer, 1, Settlement::Retry, &settled);
        done.report.released_early += u64::from(settled.is_ok());
    }
}

/// The deliveries of the parts still to handle.
fn members(parts: &VecDeque<Part>) -> impl Iterator<Item = usize> + '_ {
    parts.iter().flat_map(|part| match part {
        Part::Call(members, _) => members.clone(),
        Part::NoId(at, _) => vec![*at],
    })
}

/// Waits for `wait` while the runner holds `held`, telling the broker so
/// at once and then every third of its `lease` (JetStream's `ack_wait`),
/// so that it does not deliver them again meanwhile.
async fn holding<M: Inbound>(
    batch: &[M],
    held: &[usize],
    lease: Option<Duration>,
    wait: impl Future<Output = bool>,
) -> bool {
    let Some(lease) = lease else {
        return wait.await;
    };
    let mut wait = pin!(wait);
    let mut next = Instant::now();
    loop {
        tokio::select! {
            biased;
            stopped = &mut wait => return stopped,
            () = tokio::time::sleep_until(next) => {
                let told = held.iter().map(|&at| batch[at].in_progress());
                for told in futures_util::future::join_all(told).await {
                    if let Err(e) = told {
                        tracing::debug!(target: crate::TRACING_TARGET, error = %e, "diesel-inbox: could not tell the broker a held message is in progress; it may deliver it again (the inbox keeps that a Duplicate)");
                    }
                }
                next = Instant::now() + lease / 3;
            }
        }
    }
}

/// After a transient failure, with a health probe: waits until it
/// succeeds (intake is paused meanwhile: the runner takes no new batch),
/// probing after 250 ms, doubling up to 1 s. `false`: shutdown came first.
async fn healthy<E>(runner: &Runner<E>, consumer: &str, holds: &Holds, done: &mut Done) -> bool {
    let mut failures = 0;
    while let Some(probe) = runner.probe() {
        let answer = probe.await;
        if answer == Ok(true) {
            if failures > 0 {
                tracing::info!(target: crate::TRACING_TARGET, consumer, "diesel-inbox: the health probe succeeded; taking deliveries again");
            }
            return true;
        }
        if answer.is_err() {
            done.report.probe_timeouts += 1;
        }
        if failures == 0 {
            done.report.pauses += 1;
            tracing::warn!(target: crate::TRACING_TARGET, consumer, "diesel-inbox: the health probe failed after a transient error; taking no new deliveries until it succeeds");
        }
        failures += 1;
        let wait = inbox_runtime::__facade::backoff(PROBE_INTERVAL, MAX_PROBE_INTERVAL, failures);
        if holds.hold(wait).await {
            return false;
        }
    }
    true
}

/// The stream positions of a batch's part (Kafka), one per partition: from
/// its first message's offset (with that message's floor) to its last's,
/// sorted by partition (the order their rows are locked in).
fn positions<M: Inbound>(batch: &[M], part: &[usize]) -> Vec<((String, i32), Position)> {
    let mut by_partition: BTreeMap<(&str, i32), (usize, i64)> = BTreeMap::new();
    for &at in part {
        if let Some((topic, partition, offset)) = batch[at].stream_offset() {
            by_partition
                .entry((topic, partition))
                .and_modify(|(_, last)| *last = (*last).max(offset))
                .or_insert((at, offset));
        }
    }
    by_partition
        .into_iter()
        .filter_map(|((topic, partition), (first, last))| {
            let position = batch[first].position()?;
            Some(((topic.to_owned(), partition), Position { last, ..position }))
        })
        .collect()
}
