//! The consumer loop of every broker, written once: deliveries in flight up
//! to a limit, each through [`handle`](super::handle); intake paused while
//! a health probe fails after a transient error; on shutdown, intake
//! stopped, the deliveries in flight finished within a deadline, the ones
//! not started given back. The broker modules (`lapin::Consumer`,
//! `nats::Consumer`) supply the stream of deliveries and its prefetch.

use super::{handle, BrokerError, Inbound, Policy, Settlement};
use crate::Outcome;
use futures_util::stream::{FuturesUnordered, Stream, StreamExt};
use std::future::Future;
use std::pin::{pin, Pin};
use std::time::Duration;

/// A health probe: `true` when the database answers.
pub(crate) type Probe = Box<dyn Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// The first wait between two health probes while intake is paused; each
/// failed probe doubles it, up to [`MAX_PROBE_INTERVAL`].
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// The longest wait between two health probes.
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(15);

/// What every broker's consumer runner is configured with.
pub(crate) struct Runner<E> {
    pub(crate) policy: Policy<E>,
    pub(crate) in_flight: usize,
    pub(crate) deadline: Duration,
    pub(crate) probe: Option<Probe>,
}

/// Where a consumer runner takes its deliveries from: a broker module's
/// queue or consumer (`lapin::Queue`, `nats::Pull`). Sealed.
#[doc(hidden)]
pub trait Source: Sealed {
    /// The broker's message.
    #[doc(hidden)]
    type Message: Inbound;
    /// The deliveries, as the runner reads them.
    #[doc(hidden)]
    type Deliveries: Stream<Item = Result<Self::Message, BrokerError>> + Unpin;
    /// Starts consuming with `prefetch` deliveries unacked at most.
    #[doc(hidden)]
    #[allow(async_fn_in_trait)]
    async fn open(&mut self, prefetch: usize) -> Result<Self::Deliveries, BrokerError>;
    /// Stops the broker's deliveries (intake has stopped).
    #[doc(hidden)]
    #[allow(async_fn_in_trait)]
    async fn stop(&mut self, deliveries: &mut Self::Deliveries);
    /// Whether [`reconnect`](Self::reconnect) can make a new connection.
    #[doc(hidden)]
    fn can_reconnect(&self) -> bool;
    /// Connects again after the connection failed (then [`open`](Self::open)).
    #[doc(hidden)]
    #[allow(async_fn_in_trait)]
    async fn reconnect(&mut self) -> Result<(), BrokerError>;
}

/// Seals [`Source`].
#[doc(hidden)]
pub trait Sealed {}

/// A consumer runner: the loop of a production consumer, written once for
/// every broker; `diesel_inbox::lapin::Consumer` and
/// `diesel_inbox::nats::Consumer` are its two forms (features `lapin`,
/// `nats`), each made by its module's `Consumer::new`.
///
/// - [`in_flight`](Self::in_flight) deliveries at once (default 8), and
///   the broker's prefetch set to the same number: size it to the
///   database pool.
/// - Every handler outcome ([`Processed`](crate::Processed),
///   [`Stored`](crate::Stored)), settled as the broker module's `handle`
///   settles it; the inbox's own refusals dead-lettered by default
///   ([`Policy::new`]).
/// - A message without an id is dead-lettered with a WARN line, and the
///   loop goes on.
/// - After a transient failure, a [`health_probe`](Self::health_probe)
///   that fails pauses intake until it succeeds (probed after
///   [`PROBE_INTERVAL`], doubling up to [`MAX_PROBE_INTERVAL`]): during a
///   database outage the deliveries wait instead of cycling through the
///   broker towards its delivery limit.
/// - On shutdown (the future given to [`run`](Self::run) resolves) it stops
///   the broker's deliveries, finishes the ones in flight within the
///   [`shutdown_deadline`](Self::shutdown_deadline) (default 30 s; what is
///   still running then is dropped, rolled back and redelivered), gives
///   back the prefetched ones at once, and returns its [`RunReport`].
/// - If the broker connection fails, `run` finishes what is in flight and
///   connects again with a backoff ([`RECONNECT_DELAY`] doubling up to
///   [`MAX_RECONNECT_DELAY`]); nothing unacked is lost. A RabbitMQ runner
///   made on a channel of yours (`lapin::Consumer::new`) cannot, and
///   returns [`BrokerError::Broker`]: use `lapin::Consumer::connect`.
pub struct Consumer<S, E> {
    pub(crate) source: S,
    pub(crate) runner: Runner<E>,
}

impl<S: std::fmt::Debug, E> std::fmt::Debug for Consumer<S, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("source", &self.source)
            .field("in_flight", &self.runner.in_flight)
            .field("shutdown_deadline", &self.runner.deadline)
            .field("health_probe", &self.runner.probe.is_some())
            .field("policy", &self.runner.policy)
            .finish()
    }
}

impl<S, E> Consumer<S, E> {
    pub(crate) fn with(source: S, policy: Policy<E>) -> Self {
        Consumer {
            source,
            runner: Runner {
                policy,
                in_flight: 8,
                deadline: Duration::from_secs(30),
                probe: None,
            },
        }
    }

    /// Deliveries handled at once, and the broker's prefetch (default 8;
    /// at least 1). No more than the database pool has connections.
    pub fn in_flight(mut self, n: usize) -> Self {
        self.runner.in_flight = n.max(1);
        self
    }

    /// How long shutdown waits for the deliveries in flight (default 30 s).
    pub fn shutdown_deadline(mut self, deadline: Duration) -> Self {
        self.runner.deadline = deadline;
        self
    }

    /// A check that the database answers (a pooled connection and `SELECT
    /// 1`, say), run after a delivery fails transiently: while it fails, no
    /// new delivery is taken.
    pub fn health_probe<P, Fut>(mut self, probe: P) -> Self
    where
        P: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = bool> + Send + 'static,
    {
        self.runner.probe = Some(Box::new(move || Box::pin(probe())));
        self
    }

    /// Consumes until `shutdown` resolves, running `handler` on each
    /// delivery's id and body. When the broker connection fails (or the
    /// broker ends the consumer), the deliveries in flight are finished
    /// and the runner connects again, after [`RECONNECT_DELAY`] doubled per
    /// failed attempt up to [`MAX_RECONNECT_DELAY`], where its source can
    /// (`lapin::Consumer::connect`, every `nats::Consumer`); one that cannot
    /// (`lapin::Consumer::new` on a channel of yours) returns
    /// [`BrokerError::Broker`] instead.
    pub async fn run<O, F>(
        mut self,
        handler: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RunReport, BrokerError>
    where
        S: Source,
        O: Outcome,
        E: std::fmt::Debug,
        F: AsyncFn(&str, &[u8]) -> Result<O, E>,
    {
        let mut shutdown = pin!(shutdown);
        let mut total = RunReport::default();
        let mut deliveries = self.source.open(self.runner.in_flight).await?;
        loop {
            let (ended, mut rest) = run(
                &self.runner,
                &mut total,
                deliveries,
                &handler,
                shutdown.as_mut(),
            )
            .await;
            let why = match ended {
                Ended::Shutdown => {
                    self.source.stop(&mut rest).await;
                    total.returned =
                        give_back(&mut rest, self.runner.in_flight, Duration::from_millis(200))
                            .await;
                    return Ok(total);
                }
                Ended::Stream => BrokerError::Broker("the broker ended the consumer".into()),
                Ended::Failed(e) => e,
            };
            drop(rest);
            if !self.source.can_reconnect() {
                return Err(why);
            }
            tracing::warn!(target: "diesel_inbox", error = %why, "diesel-inbox: the broker connection failed; connecting again");
            let mut wait = RECONNECT_DELAY;
            deliveries = loop {
                tokio::select! {
                    biased;
                    () = shutdown.as_mut() => return Ok(total),
                    () = tokio::time::sleep(wait) => {}
                }
                let reopened = match self.source.reconnect().await {
                    Ok(()) => self.source.open(self.runner.in_flight).await,
                    Err(e) => Err(e),
                };
                match reopened {
                    Ok(deliveries) => break deliveries,
                    Err(e) => {
                        tracing::warn!(target: "diesel_inbox", error = %e, "diesel-inbox: connecting again failed; retrying");
                        wait = (wait * 2).min(MAX_RECONNECT_DELAY);
                    }
                }
            };
            total.reconnects += 1;
        }
    }
}

/// Why one pass of the loop over a stream of deliveries ended.
enum Ended {
    /// The shutdown future resolved.
    Shutdown,
    /// The stream ended (the broker cancelled the consumer, or closed the
    /// channel).
    Stream,
    /// The stream failed (the connection went).
    Failed(BrokerError),
}

/// The first wait before a consumer runner connects again after the
/// broker connection failed; doubled per failed attempt up to
/// [`MAX_RECONNECT_DELAY`].
pub const RECONNECT_DELAY: Duration = Duration::from_millis(500);
/// The longest wait between two attempts to connect again.
pub const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(30);

/// What a consumer runner did, when it returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// Deliveries acked (`Applied` or `Duplicate`).
    pub acked: u64,
    /// Deliveries given back for a retry after a transient error.
    pub retried: u64,
    /// Deliveries dead-lettered: a permanent error, or the delivery limit.
    pub dead_lettered: u64,
    /// Deliveries without a usable id (dead-lettered, WARN logged).
    pub without_id: u64,
    /// Deliveries whose ack, requeue or reject the broker did not take (it
    /// redelivers them).
    pub unsettled: u64,
    /// Deliveries still running at the shutdown deadline, dropped
    /// unsettled: their transactions never committed, and the broker
    /// redelivers them.
    pub abandoned: u64,
    /// Deliveries received but not started at shutdown, given back at once.
    pub returned: u64,
    /// How often intake paused because the health probe failed.
    pub pauses: u64,
    /// How often the runner connected again after the broker connection
    /// failed.
    pub reconnects: u64,
}

impl RunReport {
    fn count<O, E>(&mut self, done: Result<super::Handled<O, E>, BrokerError>) -> bool {
        match done {
            Ok(handled) => match handled.settlement {
                Settlement::Ack => self.acked += 1,
                Settlement::Retry => {
                    self.retried += 1;
                    return true;
                }
                Settlement::DeadLetter => self.dead_lettered += 1,
            },
            Err(BrokerError::NoMessageId { .. }) => self.without_id += 1,
            Err(_) => self.unsettled += 1,
        }
        false
    }
}

/// Runs the loop over `deliveries` until `shutdown` resolves or the stream
/// ends; an error of the stream ends it too, after the deliveries in flight.
/// Counts into `report`.
async fn run<M, S, O, E, F>(
    runner: &Runner<E>,
    report: &mut RunReport,
    mut deliveries: S,
    handler: F,
    shutdown: impl Future<Output = ()>,
) -> (Ended, S)
where
    M: Inbound,
    S: Stream<Item = Result<M, BrokerError>> + Unpin,
    O: Outcome,
    E: std::fmt::Debug,
    F: AsyncFn(&str, &[u8]) -> Result<O, E>,
{
    let mut running = FuturesUnordered::new();
    let mut shutdown = pin!(shutdown);
    let mut paused = false;
    let mut probe_wait = PROBE_INTERVAL;
    let mut ended = Ended::Shutdown;
    let handler = &handler;
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(done) = running.next(), if !running.is_empty() => {
                let retried = report.count(done);
                if let (true, false, Some(probe)) = (retried, paused, &runner.probe) {
                    if !probe().await {
                        paused = true;
                        probe_wait = PROBE_INTERVAL;
                        report.pauses += 1;
                        tracing::warn!(target: "diesel_inbox", "diesel-inbox: the health probe failed after a transient error; taking no new deliveries until it succeeds");
                    }
                }
            }
            () = tokio::time::sleep(probe_wait), if paused => {
                if let Some(probe) = &runner.probe {
                    if probe().await {
                        paused = false;
                        tracing::info!(target: "diesel_inbox", "diesel-inbox: the health probe succeeded; taking deliveries again");
                    } else {
                        probe_wait = (probe_wait * 2).min(MAX_PROBE_INTERVAL);
                    }
                }
            }
            next = deliveries.next(), if !paused && running.len() < runner.in_flight => match next {
                Some(Ok(delivery)) => {
                    running.push(handle(delivery, &runner.policy, handler));
                }
                Some(Err(e)) => {
                    ended = Ended::Failed(e);
                    break;
                }
                None => {
                    ended = Ended::Stream;
                    break;
                }
            },
        }
    }
    // Finish what runs, within the deadline; what remains is dropped
    // unsettled (rolled back: never acked, so redelivered).
    let drained = tokio::time::timeout(runner.deadline, async {
        while let Some(done) = running.next().await {
            report.count(done);
        }
    })
    .await;
    if drained.is_err() {
        let abandoned = running.len() as u64;
        report.abandoned += abandoned;
        tracing::warn!(target: "diesel_inbox", abandoned, "diesel-inbox: shutdown deadline passed with deliveries in flight; they were rolled back and will be redelivered");
    }
    drop(running);
    (ended, deliveries)
}

/// Gives back, at once, the deliveries a stream still holds after intake
/// stopped (prefetched, never started): at most `prefetch` of them (a
/// stream that keeps pulling would never end), waiting at most `wait` for
/// each.
async fn give_back<M, S>(deliveries: &mut S, prefetch: usize, wait: Duration) -> u64
where
    M: Inbound,
    S: Stream<Item = Result<M, BrokerError>> + Unpin,
{
    let mut returned = 0;
    for _ in 0..prefetch {
        let Ok(Some(Ok(delivery))) = tokio::time::timeout(wait, deliveries.next()).await else {
            break;
        };
        if delivery
            .settle(Settlement::Retry, Duration::ZERO)
            .await
            .is_ok()
        {
            returned += 1;
        }
    }
    returned
}
