//! What the messages an SQS runner holds share: the visibility heartbeat
//! (every message received and not yet settled is kept invisible), the
//! batched deletes, and FIFO queues' lanes (a group's next message is
//! handed out once the one before it is settled).

use super::Delivery;
use crate::brokers::BrokerError;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// SQS's longest visibility timeout (12 hours), in seconds.
pub(crate) const MAX_VISIBILITY: i32 = 43_200;
/// At most this many entries per batch request.
const BATCH: usize = 10;

/// The queue a runner consumes, and what its messages share.
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) url: String,
    pub(crate) name: String,
    pub(crate) fifo: bool,
    /// The visibility timeout asked for at receive, and renewed.
    pub(crate) visibility: Duration,
    /// The dead-letter queue's URL, from the queue's redrive policy.
    pub(crate) dead_letter: Option<String>,
    pub(crate) id_attribute: Option<String>,
    deletes: mpsc::UnboundedSender<(String, oneshot::Sender<Result<(), String>>)>,
    /// Where the lanes hand a group's next message to the runner.
    pub(crate) ready: mpsc::UnboundedSender<Result<Delivery, BrokerError>>,
    /// Set when intake stops (the shutdown future resolved): no receive
    /// starts after it.
    intake_stopped: tokio::sync::watch::Sender<bool>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next: u64,
    /// Every message received and not settled: its receipt handle, and
    /// until when SQS keeps it invisible (as estimated before the request
    /// that set it).
    leases: HashMap<u64, (String, Instant)>,
    /// FIFO: per message group, whether a message of it is out with the
    /// runner, and the messages held behind it.
    lanes: HashMap<String, VecDeque<Delivery>>,
}

impl Shared {
    pub(crate) fn new(
        queue: &super::Queue,
        dead_letter: Option<String>,
        fifo: bool,
        visibility: Duration,
        ready: mpsc::UnboundedSender<Result<Delivery, BrokerError>>,
    ) -> Arc<Self> {
        let (deletes, pending) = mpsc::unbounded_channel();
        tokio::spawn(delete_batches(
            queue.client.clone(),
            queue.url.clone(),
            pending,
        ));
        let shared = Arc::new(Shared {
            client: queue.client.clone(),
            url: queue.url.clone(),
            name: queue.name(),
            fifo,
            visibility,
            dead_letter,
            id_attribute: queue.id_attribute.clone(),
            deletes,
            ready,
            intake_stopped: tokio::sync::watch::Sender::new(false),
            state: Mutex::new(State::default()),
        });
        tokio::spawn(heartbeat(Arc::downgrade(&shared)));
        shared
    }

    /// Stops intake: no receive starts after this, and the one in flight
    /// gives its messages back.
    pub(crate) fn stop_intake(&self) {
        self.intake_stopped.send_replace(true);
    }

    /// Whether intake stopped.
    pub(crate) fn intake_stopped(&self) -> bool {
        *self.intake_stopped.borrow()
    }

    /// Resolves when intake stops.
    pub(crate) async fn intake_stopping(&self) {
        let mut stopped = self.intake_stopped.subscribe();
        let _ = stopped.wait_for(|stopped| *stopped).await;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts keeping a received message invisible: its lease number.
    pub(crate) fn lease(&self, receipt: &str, received: Instant) -> u64 {
        let mut state = self.state();
        state.next += 1;
        let n = state.next;
        state
            .leases
            .insert(n, (receipt.to_owned(), received + self.visibility));
        n
    }

    /// Stops renewing a message's visibility (it is being settled, or was
    /// dropped).
    pub(crate) fn release(&self, lease: u64) {
        self.state().leases.remove(&lease);
    }

    /// FIFO: hands `delivery` to the runner at once if nothing of its
    /// group is out, else holds it behind what is.
    pub(crate) fn arrive(&self, delivery: Delivery) {
        let Some(group) = delivery.group.clone().filter(|_| self.fifo) else {
            let _ = self.ready.send(Ok(delivery));
            return;
        };
        let mut state = self.state();
        match state.lanes.get_mut(&group) {
            Some(held) => held.push_back(delivery),
            None => {
                state.lanes.insert(group, VecDeque::new());
                drop(state);
                let _ = self.ready.send(Ok(delivery));
            }
        }
    }

    /// FIFO: the message of `group` that was out is settled. Done (deleted
    /// or dead-lettered): its group's next message goes out. Given back:
    /// the messages held behind it are given back too (their visibility
    /// ended), so that none overtakes it.
    pub(crate) async fn leave(&self, group: &str, done: bool) {
        // Taken out under the lock, sent or dropped after it (a dropped
        // delivery takes the lock).
        let (next, behind): (Option<Delivery>, Vec<Delivery>) = {
            let mut state = self.state();
            match (state.lanes.get_mut(group), done) {
                (None, _) => return,
                (Some(held), true) => match held.pop_front() {
                    Some(next) => (Some(next), Vec::new()),
                    None => {
                        state.lanes.remove(group);
                        return;
                    }
                },
                (Some(_), false) => (
                    None,
                    state.lanes.remove(group).map(Vec::from).unwrap_or_default(),
                ),
            }
        };
        if let Some(next) = next {
            let _ = self.ready.send(Ok(next));
            return;
        }
        let receipts: Vec<String> = behind.iter().map(|d| d.receipt.clone()).collect();
        for delivery in &behind {
            delivery.settled();
        }
        let _ = self.change_visibility(&receipts, 0).await;
    }

    /// FIFO: the message of `group` that was out was dropped unsettled:
    /// the messages held behind it are let go too (SQS delivers them again
    /// after it, when their visibility ends).
    pub(crate) fn abandon(&self, group: &str) {
        let behind = self.state().lanes.remove(group);
        for delivery in behind.iter().flatten() {
            delivery.settled();
        }
        drop(behind);
    }

    /// Deletes a message through the batched deletes: `Ok` once SQS
    /// deleted it.
    pub(crate) async fn delete(&self, receipt: &str) -> Result<(), BrokerError> {
        let (done, answer) = oneshot::channel();
        if self.deletes.send((receipt.to_owned(), done)).is_err() {
            return Err(BrokerError::Settle(
                "the runner's deletes have stopped".into(),
            ));
        }
        match answer.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(BrokerError::Settle(why.into())),
            Err(_) => Err(BrokerError::Settle(
                "the runner's deletes have stopped".into(),
            )),
        }
    }

    /// Sets the visibility of `receipts` to `seconds` from now, in batches.
    pub(crate) async fn change_visibility(
        &self,
        receipts: &[String],
        seconds: i32,
    ) -> Result<Vec<usize>, BrokerError> {
        change_visibility(&self.client, &self.url, receipts, seconds).await
    }
}

/// Sets the visibility of `receipts`, ten per request: the indexes of
/// those SQS changed.
async fn change_visibility(
    client: &Client,
    url: &str,
    receipts: &[String],
    seconds: i32,
) -> Result<Vec<usize>, BrokerError> {
    let mut changed = Vec::with_capacity(receipts.len());
    for (chunk, receipts) in receipts.chunks(BATCH).enumerate() {
        let entries = receipts
            .iter()
            .enumerate()
            .map(|(i, receipt)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .visibility_timeout(seconds)
                    .build()
                    .map_err(|e| BrokerError::Settle(e.into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let request = client
            .change_message_visibility_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send();
        let answer = super::answer(request, Duration::ZERO)
            .await
            .map_err(|e| BrokerError::Settle(e.into()))?;
        for ok in answer.successful() {
            if let Ok(i) = ok.id().parse::<usize>() {
                changed.push(chunk * BATCH + i);
            }
        }
    }
    Ok(changed)
}

/// Renews the visibility of every message held, while the runner holds
/// any: each tick (a sixth of the timeout), those whose visibility ends
/// within two thirds of the timeout are made invisible for the whole
/// timeout again, so a renewal has half the timeout to reach SQS. Ends
/// with the runner's queue state.
async fn heartbeat(shared: Weak<Shared>) {
    let Some(visibility) = shared.upgrade().map(|s| s.visibility) else {
        return;
    };
    let tick = (visibility / 6).max(Duration::from_millis(250));
    let seconds = i32::try_from(visibility.as_secs()).unwrap_or(MAX_VISIBILITY);
    loop {
        tokio::time::sleep(tick).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        let due: Vec<(u64, String)> = shared
            .state()
            .leases
            .iter()
            .filter(|(_, (_, until))| *until <= now + visibility * 2 / 3)
            .map(|(n, (receipt, _))| (*n, receipt.clone()))
            .collect();
        if due.is_empty() {
            continue;
        }
        let receipts: Vec<String> = due.iter().map(|(_, r)| r.clone()).collect();
        match shared.change_visibility(&receipts, seconds).await {
            Ok(changed) => {
                let mut state = shared.state();
                for i in changed {
                    if let Some(lease) = state.leases.get_mut(&due[i].0) {
                        lease.1 = now + visibility;
                    }
                }
                tracing::trace!(target: crate::TRACING_TARGET, queue = %shared.name, renewed = receipts.len(), "diesel-inbox: SQS visibility renewed");
            }
            Err(e) => {
                tracing::warn!(target: crate::TRACING_TARGET, queue = %shared.name, error = %e, "diesel-inbox: could not renew the visibility of the messages in hand; SQS may deliver them again meanwhile (the inbox keeps that a Duplicate)");
            }
        }
    }
}

/// Deletes in batches: every delete asked for while the last request ran
/// goes in the next one (up to ten), so that many commits at once share a
/// request and one alone waits for none.
async fn delete_batches(
    client: Client,
    url: String,
    mut pending: mpsc::UnboundedReceiver<(String, oneshot::Sender<Result<(), String>>)>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while pending.recv_many(&mut batch, BATCH).await > 0 {
        // A moment for more, so that commits close together share a
        // request.
        let filled = Instant::now() + super::FILL;
        while batch.len() < BATCH {
            let room = BATCH - batch.len();
            match tokio::time::timeout_at(filled, pending.recv_many(&mut batch, room)).await {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        let entries: Vec<_> = batch
            .iter()
            .enumerate()
            .filter_map(|(i, (receipt, _))| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .build()
                    .ok()
            })
            .collect();
        let request = client
            .delete_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries))
            .send();
        let answer = super::answer(request, Duration::ZERO).await;
        match answer {
            Ok(answer) => {
                let mut failed: HashMap<usize, String> = answer
                    .failed()
                    .iter()
                    .filter_map(|f| {
                        let why = format!("{}: {}", f.code(), f.message().unwrap_or(""));
                        Some((f.id().parse().ok()?, why))
                    })
                    .collect();
                for (i, (_, done)) in batch.drain(..).enumerate() {
                    let _ = done.send(match failed.remove(&i) {
                        Some(why) => Err(format!("SQS did not delete the message ({why})")),
                        None => Ok(()),
                    });
                }
            }
            Err(why) => {
                for (_, done) in batch.drain(..) {
                    let _ = done.send(Err(format!("the delete failed: {why}")));
                }
            }
        }
    }
}
