//! The consumer loop of every broker, written once: deliveries in flight up
//! to a limit, each through [`handle`](super::handle); intake paused while
//! a health probe fails after a transient error; on shutdown, intake
//! stopped, the deliveries in flight finished within a deadline, the ones
//! not started given back. The broker modules (`lapin::Consumer`,
//! `nats::Consumer`) supply the stream of deliveries and its prefetch.

use super::{handle, BrokerError, Context, HasInboxError, Inbound, Message, Policy, Settlement};
use crate::Outcome;
use futures_util::stream::{FuturesUnordered, Stream, StreamExt};
use std::future::Future;
use std::pin::{pin, Pin};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A health probe: `true` when the database answers.
pub(crate) type Probe = Box<dyn Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// A probe running under its time limit: `Err` when it timed out.
pub(crate) type Probing =
    Pin<Box<dyn Future<Output = Result<bool, tokio::time::error::Elapsed>> + Send>>;

/// The first wait between two health probes while intake is paused; each
/// failed probe doubles it, up to [`MAX_PROBE_INTERVAL`].
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// The longest wait between two health probes while intake is paused:
/// intake resumes at most about this long (plus one probe) after the
/// database is back.
pub(crate) const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a health probe may take (default of
/// [`health_probe_timeout`](Consumer::health_probe_timeout)): one that has
/// not answered by then has failed. A database that accepts connections
/// and answers nothing (a stalled server, a blackholed route) never fails a
/// pool's `get` by itself.
pub(crate) const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `run_tenants` lets one delivery run by default
/// ([`tenant_timeout`](Consumer::tenant_timeout)).
pub(crate) const TENANT_TIMEOUT: Duration = Duration::from_secs(60);

/// What every broker's consumer runner is configured with.
pub(crate) struct Runner<E> {
    pub(crate) policy: Policy<E>,
    pub(crate) in_flight: usize,
    pub(crate) deadline: Duration,
    pub(crate) probe: Option<Probe>,
    pub(crate) probe_timeout: Duration,
    /// `exit_when_idle`: how long nothing must happen before the runner
    /// asks the broker whether anything is left.
    pub(crate) idle: Option<Duration>,
    /// `batch`: the most messages of a batch, and how long a batch waits
    /// for more after its first.
    pub(crate) batch: Option<(usize, Duration)>,
    /// How long the broker waits for a settlement before it delivers a
    /// message again, where the runner must say that it still holds one
    /// ([`Source::lease`]: JetStream's `ack_wait`).
    pub(crate) lease: Option<Duration>,
    /// `tenant_by`: where `run_tenants` reads a message's tenant (else its
    /// `x-tenant` header).
    pub(crate) tenant_of: Option<TenantOf>,
    /// `tenant_timeout`: how long `run_tenants` lets one delivery run.
    pub(crate) tenant_timeout: Duration,
}

/// Where a runner over tenants reads a message's tenant.
pub(crate) type TenantOf = Box<crate::tenants::TenantOf>;

impl<E> Runner<E> {
    /// How many deliveries the broker may have unsettled with the runner:
    /// `in_flight`, or two batches (one handled, the next arriving).
    pub(crate) fn prefetch(&self) -> usize {
        match self.batch {
            Some((max, _)) => max.saturating_mul(2),
            None => self.in_flight,
        }
    }

    /// Starts the health probe, under its time limit.
    pub(crate) fn probe(&self) -> Option<Probing> {
        let probe = self.probe.as_ref()?;
        Some(Box::pin(tokio::time::timeout(self.probe_timeout, probe())))
    }
}

/// The retries a runner holds for their backoff (AMQP, which has no
/// delayed requeue), and the signal that gives them back at once: at
/// shutdown, and when the health probe finds the database back.
pub(crate) struct Holds(Option<watch::Receiver<u64>>);

impl Holds {
    /// Holds that `release` gives back when its value changes.
    pub(crate) fn released_by(release: watch::Receiver<u64>) -> Self {
        Holds(Some(release))
    }

    /// Holds that only their delay ends (the broker glue's `handle`).
    #[cfg(any(feature = "lapin", feature = "nats", feature = "sqs"))]
    pub(crate) fn none() -> Self {
        Holds(None)
    }

    /// Waits out `delay`, or less if the runner gives its holds back
    /// first: `true` then.
    pub(crate) async fn hold(&self, delay: Duration) -> bool {
        let Some(release) = &self.0 else {
            tokio::time::sleep(delay).await;
            return false;
        };
        let mut release = release.clone();
        let seen = *release.borrow_and_update();
        tokio::select! {
            () = tokio::time::sleep(delay) => false,
            _ = release.wait_for(|now| *now != seen) => true,
        }
    }
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
    /// The queue or consumer, as logs and metrics name it.
    #[doc(hidden)]
    fn name(&self) -> String;
    /// Starts consuming with `prefetch` deliveries unacked at most.
    #[doc(hidden)]
    #[allow(async_fn_in_trait)]
    async fn open(&mut self, prefetch: usize) -> Result<Self::Deliveries, BrokerError>;
    /// The runner will take batches: hand every message out as it
    /// arrives (Kafka's lanes otherwise hold a partition's next message
    /// until the one before it is settled).
    #[doc(hidden)]
    fn batching(&mut self) {}
    /// The runner routes each message to its tenant's database
    /// (`run_tenants`): Kafka's positions of one partition are then spread
    /// over many databases.
    #[doc(hidden)]
    fn routing(&mut self) {}
    /// How long the broker waits for a settlement before it delivers a
    /// message again, when only [`Inbound::in_progress`] keeps a message
    /// the runner holds from coming back (JetStream's `ack_wait`); `None`
    /// where nothing has to be said (RabbitMQ, Kafka; SQS renews its
    /// leases by itself).
    #[doc(hidden)]
    fn lease(&self) -> Option<Duration> {
        None
    }
    /// What stops taking new messages from the broker at once, called
    /// when the shutdown future resolves, before the handlers in flight
    /// drain (SQS: no receive starts after it); `None` where the
    /// broker's intake stops with [`stop`](Self::stop), after the drain.
    #[doc(hidden)]
    fn intake_stopper(&self, deliveries: &Self::Deliveries) -> Option<Box<dyn Fn() + Send + Sync>> {
        let _ = deliveries;
        None
    }
    /// Stops the broker's deliveries (intake has stopped).
    #[doc(hidden)]
    #[allow(async_fn_in_trait)]
    async fn stop(&mut self, deliveries: &mut Self::Deliveries);
    /// How long [`stop`](Self::stop) may take, at least (SQS: a receive in
    /// flight finishes its long poll); the runner's health-probe timeout
    /// where it is longer.
    #[doc(hidden)]
    fn stop_within(&self) -> Duration {
        Duration::ZERO
    }
    /// How many messages the broker still has for this consumer, ready or
    /// waiting to be delivered again (`exit_when_idle`).
    #[doc(hidden)]
    #[allow(async_fn_in_trait)]
    async fn backlog(&mut self) -> Result<u64, BrokerError>;
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
/// every broker; `diesel_inbox::lapin::Consumer`,
/// `diesel_inbox::nats::Consumer` and `diesel_inbox::kafka::Consumer` are
/// its three forms (features `lapin`, `nats`, `kafka`), each made by its
/// module's constructor.
///
/// - [`in_flight`](Self::in_flight) deliveries at once (default 8), and
///   the broker's prefetch set to the same number: size it to the
///   database pool.
/// - Every handler outcome ([`Processed`](crate::Processed),
///   [`Stored`](crate::Stored)), settled as the broker module's `handle`
///   settles it; the inbox's own refusals dead-lettered
///   ([`Policy::new`], [`HasInboxError`](super::HasInboxError)).
/// - Each settlement reported when it happens: a DEBUG event per ack, one
///   WARN line per failed delivery (its id, the consumer, the error, and
///   what happens next), and the `metrics` counter
///   `diesel_inbox.consumer.settled` (guide: brokers).
/// - A message without an id is dead-lettered with a WARN line, and the
///   loop goes on.
/// - After a transient failure, a [`health_probe`](Self::health_probe)
///   runs beside the deliveries in flight, under a time limit
///   ([`health_probe_timeout`](Self::health_probe_timeout), default
///   5 s); while it fails, no new delivery is taken, and it is run again
///   after 250 ms, doubling up to 1 s (with jitter). When it succeeds again, intake resumes and
///   the retries held for their backoff (RabbitMQ) are given back at once.
///   During a database outage the deliveries wait instead of cycling
///   through the broker towards its delivery limit.
/// - On shutdown (the future given to [`run`](Self::run) resolves) it stops
///   the broker's deliveries, gives back the retries it holds, finishes
///   the deliveries in flight within the
///   [`shutdown_deadline`](Self::shutdown_deadline) (default 30 s; what is
///   still running then is dropped, rolled back and redelivered), gives
///   back the prefetched ones at once, and returns its [`RunReport`]. No
///   probe, database or broker that does not answer holds it longer than
///   the deadline plus one probe timeout.
/// - With [`exit_when_idle`](Self::exit_when_idle), it also returns once
///   nothing is in flight or held, nothing arrived for a while, and the
///   broker has nothing left for it (drain, then exit).
/// - The runner reconnects: if the broker connection fails, `run` finishes
///   what is in flight and connects again with a backoff
///   (0.5 s doubling up to 30 s, with jitter); nothing
///   unacked is lost. `lapin::Consumer::connect` and every
///   `nats::Consumer` do; a RabbitMQ runner made on a channel of yours
///   (`lapin::Consumer::new`) cannot, and returns [`BrokerError::Broker`].
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
            .field("health_probe_timeout", &self.runner.probe_timeout)
            .field("exit_when_idle", &self.runner.idle)
            .field("tenant_timeout", &self.runner.tenant_timeout)
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
                probe_timeout: HEALTH_PROBE_TIMEOUT,
                idle: None,
                batch: None,
                lease: None,
                tenant_of: None,
                tenant_timeout: TENANT_TIMEOUT,
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
    /// 1`, say), run after a delivery fails transiently, beside the
    /// deliveries in flight: while it fails, no new delivery is taken.
    pub fn health_probe<P, Fut>(mut self, probe: P) -> Self
    where
        P: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = bool> + Send + 'static,
    {
        self.runner.probe = Some(Box::new(move || Box::pin(probe())));
        self
    }

    /// How long a health probe may take before it counts as failed
    /// (default 5 s; at least 1 ms).
    pub fn health_probe_timeout(mut self, timeout: Duration) -> Self {
        self.runner.probe_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Drain, then exit: `run` also returns once no delivery is in flight
    /// or held for a retry, none has arrived or finished for `quiet`, and
    /// the broker says it has nothing left for this consumer (RabbitMQ: no
    /// ready message in the queue; JetStream: nothing pending or awaiting
    /// an ack; Kafka: no lag on its assigned partitions, and, until the
    /// group has assigned it one, not idle for up to
    /// 60 s, so that a group's join is not
    /// taken for an empty topic). For batch jobs and for tests; a service runs until its
    /// shutdown future resolves. [`RunReport::idle`] says which ended it.
    pub fn exit_when_idle(mut self, quiet: Duration) -> Self {
        self.runner.idle = Some(quiet);
        self
    }

    /// Consumes until `shutdown` resolves (or, with
    /// [`exit_when_idle`](Self::exit_when_idle), until the queue is
    /// drained), running `handler` on each delivery's id and body. When
    /// the broker connection fails (or the broker ends the consumer), the
    /// deliveries in flight are finished and the runner connects again,
    /// after 0.5 s doubled per failed attempt up to 30 s (with jitter),
    /// where its source can
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
        E: HasInboxError + std::fmt::Debug,
        F: AsyncFn(&str, &[u8]) -> Result<O, E>,
    {
        // `batch` is `run_batch`'s: one message at a time here (a Kafka
        // partition's lane hands out its next message only once the one
        // before it is settled).
        self.runner.batch = None;
        self.drive(
            &Single {
                handler,
                outcome: std::marker::PhantomData,
            },
            shutdown,
        )
        .await
    }

    /// The loop around the passes over a stream of deliveries: open,
    /// reconnect, drain and exit, shut down.
    pub(crate) async fn drive<P>(
        mut self,
        pass: &P,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RunReport, BrokerError>
    where
        S: Source,
        P: Pass<S::Message, E>,
    {
        self.runner.lease = self.source.lease();
        if self.runner.batch.is_some() {
            self.source.batching();
        }
        let mut shutdown = pin!(shutdown);
        let mut total = RunReport::default();
        let name = self.source.name();
        let mut deliveries = tokio::select! {
            biased;
            () = shutdown.as_mut() => return Ok(total),
            opened = self.source.open(self.runner.prefetch()) => opened?,
        };
        loop {
            // At the shutdown signal, intake stops before the drain.
            let stop_intake = self.source.intake_stopper(&deliveries);
            let signal = async {
                shutdown.as_mut().await;
                if let Some(stop) = &stop_intake {
                    stop();
                }
            };
            let (ended, mut rest) = pass
                .pass(&self.runner, &name, &mut total, deliveries, signal)
                .await;
            let why = match ended {
                Ended::Quiet => {
                    let backlog =
                        tokio::time::timeout(self.runner.probe_timeout, self.source.backlog())
                            .await;
                    match backlog {
                        Ok(Ok(0)) => {
                            total.idle = true;
                            self.finish(&mut total, &mut rest).await;
                            return Ok(total);
                        }
                        Ok(Ok(left)) => {
                            tracing::debug!(target: crate::TRACING_TARGET, consumer = %name, left, "diesel-inbox: quiet, but the broker still has messages for this consumer");
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(target: crate::TRACING_TARGET, consumer = %name, error = %e, "diesel-inbox: could not ask the broker what is left; consuming on");
                        }
                        Err(_) => {
                            tracing::debug!(target: crate::TRACING_TARGET, consumer = %name, "diesel-inbox: the broker did not say in time what is left; consuming on");
                        }
                    }
                    deliveries = rest;
                    continue;
                }
                Ended::Shutdown => {
                    self.finish(&mut total, &mut rest).await;
                    return Ok(total);
                }
                Ended::Stream => BrokerError::Broker("the broker ended the consumer".into()),
                Ended::Failed(e) => e,
            };
            drop(rest);
            if !self.source.can_reconnect() {
                return Err(why);
            }
            tracing::warn!(target: crate::TRACING_TARGET, consumer = %name, error = %why, "diesel-inbox: the broker connection failed; connecting again");
            let mut attempts = 1;
            deliveries = loop {
                let wait = inbox_runtime::__facade::backoff(
                    RECONNECT_DELAY,
                    MAX_RECONNECT_DELAY,
                    attempts,
                );
                let reopened = tokio::select! {
                    biased;
                    () = shutdown.as_mut() => return Ok(total),
                    reopened = async {
                        tokio::time::sleep(wait).await;
                        self.source.reconnect().await?;
                        self.source.open(self.runner.prefetch()).await
                    } => reopened,
                };
                match reopened {
                    Ok(deliveries) => break deliveries,
                    Err(e) => {
                        tracing::warn!(target: crate::TRACING_TARGET, consumer = %name, error = %e, "diesel-inbox: connecting again failed; retrying");
                        attempts += 1;
                    }
                }
            };
            total.reconnects += 1;
        }
    }

    /// Stops the broker's deliveries and gives back what the stream still
    /// holds, each within a bound: a broker that does not answer does not
    /// hold the runner.
    async fn finish(&mut self, report: &mut RunReport, rest: &mut S::Deliveries)
    where
        S: Source,
    {
        let within = self.runner.probe_timeout.max(self.source.stop_within());
        let _ = tokio::time::timeout(within, self.source.stop(rest)).await;
        report.returned +=
            give_back(rest, self.runner.prefetch(), Duration::from_millis(200)).await;
    }
}

/// One pass of the loop over a stream of deliveries, until shutdown, the
/// quiet time, or the stream's end or failure: one delivery at a time
/// ([`Single`], `run`) or in batches (`run_batch`).
pub(crate) trait Pass<M: Inbound, E> {
    async fn pass<D>(
        &self,
        runner: &Runner<E>,
        consumer: &str,
        report: &mut RunReport,
        deliveries: D,
        shutdown: impl Future<Output = ()>,
    ) -> (Ended, D)
    where
        D: Stream<Item = Result<M, BrokerError>> + Unpin;
}

/// `run`'s pass: each delivery through [`handle`], `in_flight` at once.
struct Single<F, O> {
    handler: F,
    outcome: std::marker::PhantomData<fn() -> O>,
}

impl<M, E, O, F> Pass<M, E> for Single<F, O>
where
    M: Inbound,
    O: Outcome,
    E: HasInboxError + std::fmt::Debug,
    F: AsyncFn(&str, &[u8]) -> Result<O, E>,
{
    async fn pass<D>(
        &self,
        runner: &Runner<E>,
        consumer: &str,
        report: &mut RunReport,
        deliveries: D,
        shutdown: impl Future<Output = ()>,
    ) -> (Ended, D)
    where
        D: Stream<Item = Result<M, BrokerError>> + Unpin,
    {
        let handler = async |m: &Message<'_>| (self.handler)(m.id(), m.body()).await;
        run(runner, consumer, report, deliveries, handler, shutdown).await
    }
}

/// Why one pass of the loop over a stream of deliveries ended.
pub(crate) enum Ended {
    /// The shutdown future resolved.
    Shutdown,
    /// Nothing ran, was held or arrived for the `exit_when_idle` quiet
    /// time: ask the broker what is left.
    Quiet,
    /// The stream ended (the broker cancelled the consumer, or closed the
    /// channel).
    Stream,
    /// The stream failed (the connection went).
    Failed(BrokerError),
}

/// The first wait before a consumer runner connects again after the
/// broker connection failed; doubled per failed attempt up to
/// [`MAX_RECONNECT_DELAY`].
pub(crate) const RECONNECT_DELAY: Duration = Duration::from_millis(500);
/// The longest wait between two attempts to connect again.
pub(crate) const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(30);

/// What a consumer runner did, when it returned. The same counts are
/// reported as each settlement happens (guide: brokers, "What a runner
/// reports").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// Deliveries acked (`Applied` or `Duplicate`).
    pub acked: u64,
    /// Deliveries given back for a retry after a transient error.
    pub retried: u64,
    /// Of the retries, those held for their backoff (RabbitMQ) and given
    /// back before it ran out: at shutdown, or when the health probe found
    /// the database back.
    pub released_early: u64,
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
    /// Deliveries received but not started when the runner stopped, given
    /// back at once.
    pub returned: u64,
    /// How often intake paused because the health probe failed.
    pub pauses: u64,
    /// Health probes that did not answer within the probe timeout.
    pub probe_timeouts: u64,
    /// How often the runner connected again after the broker connection
    /// failed.
    pub reconnects: u64,
    /// Batches handed to a `run_batch` handler (every run of one counts:
    /// a retry, each half of a split).
    pub batches: u64,
    /// Whether the runner ended because the queue was drained
    /// ([`Consumer::exit_when_idle`]) rather than by shutdown.
    pub idle: bool,
}

impl RunReport {
    /// Counts a finished delivery.
    fn count<O, E>(&mut self, done: Result<super::Handled<O, E>, BrokerError>) {
        match done {
            Ok(handled) => match handled.settlement {
                Settlement::Ack => self.acked += 1,
                Settlement::Retry => {
                    self.retried += 1;
                    self.released_early += u64::from(handled.released_early);
                }
                Settlement::DeadLetter => self.dead_lettered += 1,
            },
            Err(BrokerError::NoMessageId { .. }) => self.without_id += 1,
            Err(_) => self.unsettled += 1,
        }
    }
}

/// Runs the loop over `deliveries` until `shutdown` resolves, the stream
/// ends, or (`exit_when_idle`) nothing happens for the quiet time; an
/// error of the stream ends it too, after the deliveries in flight. Counts
/// into `report`.
pub(super) async fn run<M, S, O, E, F>(
    runner: &Runner<E>,
    consumer: &str,
    report: &mut RunReport,
    mut deliveries: S,
    handler: F,
    shutdown: impl Future<Output = ()>,
) -> (Ended, S)
where
    M: Inbound,
    S: Stream<Item = Result<M, BrokerError>> + Unpin,
    O: Outcome,
    E: HasInboxError + std::fmt::Debug,
    F: AsyncFn(&Message<'_>) -> Result<O, E>,
{
    // Declared before the deliveries that borrow it.
    let (release, released) = watch::channel(0u64);
    let holds = Holds(Some(released));
    // A handler's transient failure, told before its retry is held.
    let transient = tokio::sync::Notify::new();
    let mut running = FuturesUnordered::new();
    let mut shutdown = pin!(shutdown);
    // The health: a probe running beside the deliveries, or the time of
    // the next one while intake is paused.
    let mut probing: Option<Probing> = None;
    let mut next_probe: Option<Instant> = None;
    let mut paused = false;
    // Failed probes in a row: the next probe waits the backoff of that
    // many failures.
    let mut probe_failures = 0;
    let mut last_activity = Instant::now();
    let mut ended = Ended::Shutdown;
    let handler = &handler;
    let (holds, transient) = (&holds, &transient);
    loop {
        let healthy = !paused && probing.is_none();
        // `exit_when_idle`: when the quiet time would be up.
        let quiet_at = runner.idle.map(|quiet| last_activity + quiet);
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(done) = running.next(), if !running.is_empty() => {
                last_activity = Instant::now();
                report.count(done);
            }
            () = transient.notified(), if healthy && runner.probe.is_some() => {
                probing = runner.probe();
            }
            answer = async {
                match probing.as_mut() {
                    Some(probe) => probe.await,
                    None => std::future::pending().await,
                }
            }, if probing.is_some() => {
                probing = None;
                if answer == Ok(true) {
                    probe_failures = 0;
                    if paused {
                        paused = false;
                        // The database is back: the retries held for
                        // their backoff go back to the broker now.
                        release.send_modify(|generation| *generation += 1);
                        tracing::info!(target: crate::TRACING_TARGET, consumer, "diesel-inbox: the health probe succeeded; taking deliveries again");
                    }
                } else {
                    if answer.is_err() {
                        report.probe_timeouts += 1;
                    }
                    if !paused {
                        paused = true;
                        report.pauses += 1;
                        let why = match answer {
                            Err(_) => format!("did not answer within {:?}", runner.probe_timeout),
                            Ok(_) => "failed".to_string(),
                        };
                        tracing::warn!(target: crate::TRACING_TARGET, consumer, "diesel-inbox: the health probe {why} after a transient error; taking no new deliveries until it succeeds");
                    }
                    probe_failures += 1;
                    next_probe = Some(
                        Instant::now()
                            + inbox_runtime::__facade::backoff(
                                PROBE_INTERVAL,
                                MAX_PROBE_INTERVAL,
                                probe_failures,
                            ),
                    );
                }
            }
            () = tokio::time::sleep_until(next_probe.unwrap_or_else(Instant::now)), if next_probe.is_some() => {
                next_probe = None;
                probing = runner.probe();
            }
            () = tokio::time::sleep_until(quiet_at.unwrap_or_else(Instant::now)), if quiet_at.is_some() && healthy && running.is_empty() => {
                ended = Ended::Quiet;
                break;
            }
            next = deliveries.next(), if healthy && running.len() < runner.in_flight => match next {
                Some(Ok(delivery)) => {
                    last_activity = Instant::now();
                    let context = Context { consumer: Some(consumer), holds, transient: Some(transient) };
                    running.push(handle(delivery, &runner.policy, context, handler));
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
    // Whatever a probe is doing, it no longer matters; the retries held
    // for their backoff go back to the broker now.
    drop(probing);
    release.send_modify(|generation| *generation += 1);
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
        tracing::warn!(target: crate::TRACING_TARGET, consumer, abandoned, "diesel-inbox: shutdown deadline passed with deliveries in flight; they were rolled back and will be redelivered");
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
