//! One relay over every tenant of a [`Tenants`] set: each tenant's outbox
//! is relayed by the relay's own steps (a [`Relay`] on the tenant's pool),
//! in turns of a few batches, so that a tenant with a backlog takes its
//! turn behind the others, and a tenant whose database is down or slow
//! waits out its own backoff while the others go on.

use super::listeners::Listeners;
use super::wakeups::{Doze, Next};
use super::{
    Relay, RelayError, RelayReport, Settings, MAX_INTERVAL, MAX_OUTAGE_DELAY, OUTAGE_DELAY,
    SHUTDOWN_GRACE,
};
use crate::outbox::publish::{Publish, PublishError};
use crate::tenants::{Tenant, TenantPool, Tenants};
use futures_util::stream::{FuturesUnordered, StreamExt};
use inbox_runtime::__facade::backoff;
use inbox_runtime::outbox as steps;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// The default [`TenantRelay::turn`].
const DEFAULT_TURN: u64 = 4;
/// The default [`TenantRelay::refresh_interval`].
const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// The outbox relay over every tenant of a [`Tenants`] set, made by
/// [`Relay::tenants`]: each tenant's messages are published as one
/// [`Relay`] on its database publishes them (in order per ordering key,
/// with their headers, trace context and delays), with the tenant's name
/// in the [`TENANT_HEADER`](crate::tenants::TENANT_HEADER) of each message
/// in the spans (`tenant`) and in the metrics (`diesel_inbox.tenant`).
///
/// - **Turns:** a tenant with messages due gets a turn of
///   [`turn`](Self::turn) batches (default 4), then waits behind every
///   other tenant that is due: a backlog of a million does not starve a
///   tenant with ten.
/// - **Concurrency:** at most [`concurrency`](Self::concurrency) tenants
///   take their turn at once (default: the set's `max_connections`, less
///   the listeners, over its `pool_size`, so that their pools fit the
///   limit).
/// - **Isolation:** a tenant whose turn fails (its database is down, a
///   pool error) or outlasts three quarters of the [`lease`](Self::lease) (a database
///   that does not answer) is backed off on its own (0.5 s doubling to
///   30 s, with jitter, WARN with the tenant); the others go on.
/// - **Which tenants:** the set as it is now; every
///   [`refresh_interval`](Self::refresh_interval) (default 10 s) it is
///   read again ([`Tenants::refresh`]), so tenants added and removed
///   where the set's closure reads them are found without a restart.
/// - **Latency:** an idle tenant is looked at every
///   [`poll_interval`](Self::poll_interval); an `#[idempotent]` call that
///   enqueued in this process (or [`outbox::wake`](crate::outbox::wake))
///   makes every tenant due at once. On PostgreSQL, `run` also `LISTEN`s
///   on up to [`listeners`](Self::listeners) tenant databases (a
///   connection each, within the set's limit), so that another process's
///   enqueue there makes that tenant due at once.
/// - **Gauges** (feature `metrics`): [`run`](Self::run) counts each
///   tenant's outbox after its turn, at most every 10 s, into the outbox
///   gauges labelled `diesel_inbox.tenant`.
///
/// ```no_run
/// # #[cfg(all(feature = "lapin", feature = "postgres"))]
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel_async::pooled_connection::deadpool::Pool;
/// use diesel_async::AsyncPgConnection;
/// use diesel_inbox::outbox::{self, Relay};
/// use diesel_inbox::tenants::Tenants;
///
/// let tenants: Tenants<Pool<AsyncPgConnection>> =
///     Tenants::list([("acme", "postgres://app@db1/acme"), ("globex", "postgres://app@db2/globex")])
///         .max_connections(16);
/// let publisher = outbox::lapin::Publisher::connect("amqp://localhost:5672/%2f", "orders-exchange");
/// // Hears the enqueues of other processes in up to 4 tenant databases.
/// let relay = Relay::tenants(tenants, publisher).batch_size(200).listeners(4);
/// let report = relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// println!("published {}", report.published);
/// # Ok(())
/// # }
/// ```
pub struct TenantRelay<T: TenantPool, P> {
    tenants: Tenants<T>,
    publisher: Arc<P>,
    settings: Settings,
    turn: u64,
    concurrency: Option<usize>,
    refresh_interval: Duration,
    listeners: Option<usize>,
}

impl<T: TenantPool, P> std::fmt::Debug for TenantRelay<T, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantRelay")
            .field("tenants", &self.tenants)
            .field("settings", &self.settings)
            .field("turn", &self.turn)
            .finish_non_exhaustive()
    }
}

impl<T, P> Relay<Tenant<T>, P>
where
    T: TenantPool,
    T::Guard: 'static,
    P: Publish,
{
    /// One relay over every tenant of `tenants`, publishing through
    /// `publisher`: see [`TenantRelay`].
    pub fn tenants(tenants: Tenants<T>, publisher: P) -> TenantRelay<T, P> {
        TenantRelay {
            tenants,
            publisher: Arc::new(publisher),
            settings: Settings::default(),
            turn: DEFAULT_TURN,
            concurrency: None,
            refresh_interval: DEFAULT_REFRESH_INTERVAL,
            listeners: None,
        }
    }
}

/// A tenant's relay, and when its next turn is due.
struct Slot<T: TenantPool, P> {
    /// Which slot of this tenant's name it is (a tenant removed and added
    /// again while a turn of its runs has a new one).
    id: u64,
    relay: Arc<Relay<Tenant<T>, Arc<P>>>,
    due: Instant,
    /// Its turns that failed in a row.
    outages: u32,
    /// Its turn is under way.
    busy: bool,
    /// The relay loop's side of its listener, and the listener's id, while
    /// its database is listened to ([`Listeners`]).
    doze: Option<(u64, Doze)>,
    /// A notification or an enqueue of this process since its last turn.
    woken: bool,
    /// When a turn of its was last asked to count its outbox for the
    /// gauges (a turn that fails does not count: the next count is then
    /// at most 10 s later).
    #[cfg(feature = "metrics")]
    counted: Option<Instant>,
}

/// How a tenant's turn ended.
enum Turn {
    Ran(Result<(), RelayError>),
    /// It outlasted three quarters of the lease and was dropped.
    TimedOut,
}

type Running = Pin<Box<dyn Future<Output = Ended> + Send>>;

/// A tenant's turn that ended: its name, its slot's id, what it did.
struct Ended {
    name: Arc<str>,
    id: u64,
    report: RelayReport,
    turn: Turn,
    /// The doze it took, given back.
    doze: Option<(u64, Doze)>,
    /// When to pass again, by the doze (listened tenants).
    next: Option<Next>,
}

/// Slot ids, unique in the process.
static SLOT_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl<T, P> TenantRelay<T, P>
where
    T: TenantPool,
    T::Guard: 'static,
    P: Publish + 'static,
{
    /// [`Relay::batch_size`], for each tenant (default 100).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.settings.batch_size(n);
        self
    }

    /// How often an idle tenant is looked at (default 1 s):
    /// [`Relay::poll_interval`].
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.settings.poll_interval(interval);
        self
    }

    /// [`Relay::max_publish_attempts`] (default 10).
    pub fn max_publish_attempts(mut self, n: u32) -> Self {
        self.settings.max_publish_attempts(n);
        self
    }

    /// [`Relay::lease`] (default 60 s); a tenant's turn that outlasts three
    /// quarters of it is dropped and the tenant backed off.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease(lease);
        self
    }

    /// The batches a tenant publishes in one turn before the tenants due
    /// behind it take theirs (default 4; at least 1). A longer turn opens
    /// fewer connections where the set's limit makes tenants share them (a
    /// turn of 1 published 0.67 of one database's rate over 100 tenants
    /// and 16 connections, a turn of 4 1.16: docs/performance.md); a
    /// shorter one lets a tenant due behind a backlog in sooner when every
    /// place is taken.
    pub fn turn(mut self, batches: u64) -> Self {
        self.turn = batches.max(1);
        self
    }

    /// How many tenants take their turn at once (default: the set's
    /// `max_connections`, less the [`listeners`](Self::listeners), over its
    /// `pool_size`; at least 1). Set, it also bounds the listeners to what
    /// the limit leaves beside that many pools.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = Some(n.max(1));
        self
    }

    /// How many tenant databases `run` listens on at once, on PostgreSQL
    /// (default: an eighth of the set's `max_connections`; at most what
    /// leaves one tenant's pool beside them; 0 turns it off). Each takes
    /// one connection of the set's limit, kept outside the tenant's pool.
    /// A tenant takes a free place after its turn, or, when its turn found
    /// messages, the place of a tenant that has found none for 10 s; the
    /// others are looked at every [`poll_interval`](Self::poll_interval).
    pub fn listeners(mut self, n: usize) -> Self {
        self.listeners = Some(n);
        self
    }

    /// How often `run` reads the tenant set again (default 10 s):
    /// [`Tenants::refresh`].
    pub fn refresh_interval(mut self, interval: Duration) -> Self {
        self.refresh_interval = interval.clamp(Duration::from_millis(1), MAX_INTERVAL);
        self
    }

    /// The tenant set.
    pub fn tenant_set(&self) -> &Tenants<T> {
        &self.tenants
    }

    fn slot(&self, name: &str) -> Option<Slot<T, P>> {
        let tenant = self.tenants.tenant(name)?;
        let mut relay = Relay::new(tenant, self.publisher.clone());
        relay.settings = self.settings;
        relay.tenant = Some(Arc::from(name));
        relay.turn = Some(self.turn);
        Some(Slot {
            id: SLOT_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            relay: Arc::new(relay),
            due: Instant::now(),
            outages: 0,
            busy: false,
            doze: None,
            woken: false,
            #[cfg(feature = "metrics")]
            counted: None,
        })
    }

    /// Brings `slots` in line with the set: a slot for each new tenant, none
    /// (and no listener) for a removed one.
    fn follow(&self, slots: &mut BTreeMap<Arc<str>, Slot<T, P>>, listeners: &mut Listeners) {
        let names = self.tenants.names();
        slots.retain(|name, _| {
            let kept = names.binary_search_by(|n| n.as_str().cmp(name)).is_ok();
            if !kept {
                // Its gauges read 0, not the last count.
                inbox_runtime::__facade::outbox_status_gone(name);
                listeners.remove(name);
            }
            kept
        });
        for name in names {
            if !slots.contains_key(name.as_str()) {
                if let Some(slot) = self.slot(&name) {
                    slots.insert(Arc::from(name), slot);
                }
            }
        }
        self.unlisten_moved(slots, listeners);
    }

    /// Closes the listeners of tenants moved to another database (their
    /// enqueues there do not notify the old one) and makes those tenants
    /// due: they are listened to again, there, after their turn.
    fn unlisten_moved(
        &self,
        slots: &mut BTreeMap<Arc<str>, Slot<T, P>>,
        listeners: &mut Listeners,
    ) {
        for name in listeners.follow(&self.tenants) {
            if let Some(slot) = slots.get_mut(&name) {
                wake_slot(slot, Instant::now());
            }
        }
    }

    /// How many tenants take their turn at once, beside `listening`
    /// connections kept by listeners.
    fn concurrent(&self, listening: usize) -> usize {
        self.concurrency
            .unwrap_or_else(|| self.tenants.fair_share_beside(listening as u32))
            .max(1)
    }

    /// How many tenant databases `run` may listen on: at most what the
    /// limit leaves beside one tenant's pool, or beside the pools of
    /// [`concurrency`](Self::concurrency) tenants where it is set.
    fn listener_limit(&self) -> usize {
        let room = match self.concurrency {
            Some(n) => self.tenants.beside_pools(n as u32),
            None => self.tenants.beside_pools(1),
        };
        self.listeners
            .unwrap_or((self.tenants.max_connections_now() / 8) as usize)
            .min(room as usize)
    }

    /// How long a turn may take: three quarters of the lease. A batch's
    /// publish gives back what the broker did not confirm at half the
    /// lease, and the step after it settles the batch; a turn still
    /// running at this bound (a database that does not answer) is dropped,
    /// and its rows are claimed again when their lease ends.
    fn bound(&self) -> Duration {
        self.settings.lease * 3 / 4
    }

    /// One tenant's turn, bounded by [`bound`](Self::bound), in a span
    /// that names the tenant; with `count`, a turn that ran then counts the
    /// tenant's outbox for its gauges (labelled with the tenant), within
    /// the same bound or 10 s, whichever is shorter. A listened tenant's
    /// turn also tells its listener whether the relay sleeps
    /// ([`Doze`]): `listener` is its listener's id now.
    fn start(
        &self,
        name: Arc<str>,
        slot: &mut Slot<T, P>,
        count: bool,
        listener: Option<u64>,
    ) -> Running {
        let bound = self.bound();
        let (relay, id) = (slot.relay.clone(), slot.id);
        let poll = self.settings.poll_interval;
        let woken = std::mem::take(&mut slot.woken);
        // A doze of a listener closed since is dropped.
        let mut doze = slot.doze.take().filter(|(of, _)| Some(*of) == listener);
        let span = tracing::info_span!(target: crate::TRACING_TARGET, "diesel_inbox.outbox.tenant", tenant = %name);
        Box::pin(
            async move {
                let mut report = RelayReport::default();
                if let Some((_, doze)) = doze.as_mut() {
                    doze.before_pass(woken).await;
                }
                // The relay's metrics carry the tenant.
                let pass =
                    inbox_runtime::__facade::for_tenant(name.clone(), relay.pass(&mut report));
                let turn = match tokio::time::timeout(bound, pass).await {
                    Ok(ran) => Turn::Ran(ran),
                    Err(_) => Turn::TimedOut,
                };
                let next = match (&turn, doze.as_mut()) {
                    (Turn::Ran(Ok(())), Some((_, doze))) if report.released == 0 => {
                        Some(doze.after_pass(poll, report.batches > 0).await)
                    }
                    _ => None,
                };
                #[cfg(feature = "metrics")]
                if count && matches!(turn, Turn::Ran(Ok(()))) {
                    let within = bound.min(super::STATUS_INTERVAL);
                    inbox_runtime::__facade::for_tenant(name.clone(), relay.count_status(within))
                        .await;
                }
                #[cfg(not(feature = "metrics"))]
                let _ = count;
                Ended {
                    name,
                    id,
                    report,
                    turn,
                    doze,
                    next,
                }
            }
            .instrument(span),
        )
    }

    /// Why a turn that outlasted [`bound`](Self::bound) was dropped.
    fn timed_out(&self) -> RelayError {
        RelayError::Pool(
            format!(
                "a turn outlasted three quarters of the lease ({:?}) and was dropped; its rows are claimed again when their lease ends",
                self.bound()
            )
            .into(),
        )
    }

    /// Publishes what is due now in every tenant, in turns, until no
    /// tenant has anything due: one pass over all, for tests and
    /// cron-style use. A tenant whose turn fails takes no more turns; the
    /// others go on to the end, and then the first error is returned,
    /// naming its tenant ([`RelayError::Tenant`]).
    pub async fn run_once(&self) -> Result<RelayReport, RelayError> {
        self.tenants
            .refresh()
            .await
            .map_err(|e| RelayError::Pool(e.into()))?;
        let mut slots = BTreeMap::new();
        self.follow(&mut slots, &mut Listeners::none());
        let mut report = RelayReport::default();
        let mut failed: Option<RelayError> = None;
        // Every tenant once, in name order; a tenant whose turn used all
        // its batches goes to the back of the line for another (no round
        // waits for its slowest turn).
        let mut due: VecDeque<Arc<str>> = slots.keys().cloned().collect();
        let mut running: FuturesUnordered<Running> = FuturesUnordered::new();
        loop {
            while running.len() < self.concurrent(0) {
                let Some(name) = due.pop_front() else { break };
                let slot = slots.get_mut(&name).expect("listed");
                running.push(self.start(name.clone(), slot, false, None));
            }
            let Some(ended) = running.next().await else {
                break;
            };
            report.add(ended.report);
            let error = match ended.turn {
                Turn::Ran(Ok(())) => {
                    if ended.report.batches >= self.turn && ended.report.released == 0 {
                        due.push_back(ended.name);
                    }
                    continue;
                }
                Turn::Ran(Err(e)) => e,
                Turn::TimedOut => self.timed_out(),
            };
            report.errors += 1;
            tracing::warn!(target: crate::TRACING_TARGET, tenant = %ended.name, error = %error, "diesel-inbox: outbox relay: a tenant's turn failed; the others go on");
            failed.get_or_insert(RelayError::tenant(&ended.name, error));
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Publishes every tenant's outbox until `shutdown` resolves, then
    /// returns what it did. Turns under way at shutdown finish within
    /// 10 s, or are dropped (their rows are claimed again when their lease
    /// ends). Tenants' database outages are logged (WARN, with the tenant)
    /// and waited out, each on its own; only [`PublishError::Closed`] stops
    /// it early.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<RelayReport, RelayError> {
        let mut shutdown = pin!(shutdown);
        let mut slots: BTreeMap<Arc<str>, Slot<T, P>> = BTreeMap::new();
        let mut running: FuturesUnordered<Running> = FuturesUnordered::new();
        let mut report = RelayReport::default();
        // The set is read beside the turns (a control database that does
        // not answer holds no tenant's turn), one read at a time.
        type Reading<'a> =
            Pin<Box<dyn Future<Output = Result<usize, crate::tenants::TenantError>> + Send + 'a>>;
        let mut reading: Option<Reading<'_>> = Some(Box::pin(self.tenants.refresh()));
        let mut read_at = Instant::now();
        let mut seen = steps::wake_generation();
        let mut listeners = Listeners::new::<T::Connection>(self.listener_limit());
        let bell = listeners.bell();
        // Why the publisher stopped the relay.
        let mut closed: Option<RelayError> = None;
        loop {
            self.tenants.close_idle();
            // A tenant moved by `Tenants::insert` is listened to there.
            self.unlisten_moved(&mut slots, &mut listeners);
            // The tenants due, longest due first, as many as may run.
            let now = Instant::now();
            let free = self
                .concurrent(listeners.limit)
                .saturating_sub(running.len());
            let mut due: Vec<(Instant, Arc<str>)> = slots
                .iter()
                .filter(|(_, s)| !s.busy && s.due <= now)
                .map(|(name, s)| (s.due, name.clone()))
                .collect();
            due.sort();
            for (_, name) in due.into_iter().take(free) {
                let slot = slots.get_mut(&name).expect("listed above");
                slot.busy = true;
                // The tenant's outbox gauges, after its turn, every
                // STATUS_INTERVAL.
                #[cfg(feature = "metrics")]
                let count = slot
                    .counted
                    .is_none_or(|at| at.elapsed() >= super::STATUS_INTERVAL);
                #[cfg(feature = "metrics")]
                if count {
                    slot.counted = Some(now);
                }
                #[cfg(not(feature = "metrics"))]
                let count = false;
                let listener = listeners.of(&name);
                running.push(self.start(name, slot, count, listener));
            }
            // When to look again: the next tenant due (only if one more
            // may run), the next read of the set.
            let free = self
                .concurrent(listeners.limit)
                .saturating_sub(running.len());
            let next = slots
                .values()
                .filter(|s| free > 0 && !s.busy)
                .map(|s| s.due)
                .chain(reading.is_none().then(|| read_at + self.refresh_interval))
                .min()
                .unwrap_or(now + self.settings.poll_interval)
                .max(now);
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(ended) = running.next(), if !running.is_empty() => {
                    report.add(ended.report);
                    // A tenant removed (or removed and added again)
                    // meanwhile has no slot of this id.
                    match slots.get_mut(&ended.name) {
                        Some(slot) if slot.id == ended.id => {
                            slot.busy = false;
                            let ran = matches!(ended.turn, Turn::Ran(Ok(())));
                            if let Err(e) = self.after_turn(&ended.name, slot, &ended.report, ended.turn, ended.next, &mut report) {
                                // The publisher cannot publish any more: the
                                // other turns finish, then the relay stops.
                                closed = Some(e);
                                break;
                            }
                            // Its doze back, if its listener still is; a
                            // place for a listener, if it is not listened.
                            slot.doze = ended.doze.filter(|(of, _)| listeners.of(&ended.name) == Some(*of));
                            let mut evicted = None;
                            if ran {
                                let offered = listeners.offer(&self.tenants, &ended.name, ended.report.batches > 0, self.settings.poll_interval, &mut evicted);
                                slot.doze = offered.or(slot.doze.take());
                            }
                            // A notification its listener had heard is
                            // read no more.
                            if let Some(slot) = evicted.and_then(|name| slots.get_mut(&name)) {
                                wake_slot(slot, Instant::now());
                            }
                        }
                        Some(_) => {}
                        // Removed during its turn, whose count may have
                        // come after `follow` set its gauges to 0.
                        None => inbox_runtime::__facade::outbox_status_gone(&ended.name),
                    }
                }
                read = async { reading.as_mut().expect("guarded").await }, if reading.is_some() => {
                    reading = None;
                    read_at = Instant::now();
                    if let Err(e) = read {
                        tracing::warn!(target: crate::TRACING_TARGET, error = %e, "diesel-inbox: outbox relay: the tenant set could not be read again; relaying the tenants known");
                    }
                    self.follow(&mut slots, &mut listeners);
                }
                () = steps::woken(seen) => {
                    seen = steps::wake_generation();
                    let now = Instant::now();
                    for slot in slots.values_mut() {
                        wake_slot(slot, now);
                    }
                }
                () = bell.notified() => {
                    let now = Instant::now();
                    for name in listeners.heard() {
                        if let Some(slot) = slots.get_mut(&name) {
                            wake_slot(slot, now);
                        }
                    }
                }
                name = listeners.deaf() => {
                    // It polls from now on.
                    if let Some(slot) = slots.get_mut(&name) {
                        slot.doze = None;
                    }
                }
                () = tokio::time::sleep_until(next.into()) => {
                    if reading.is_none() && read_at.elapsed() >= self.refresh_interval {
                        reading = Some(Box::pin(self.tenants.refresh()));
                    }
                }
            }
        }
        drop(reading);
        // Their connections close; a turn's question to its listener is
        // answered at once (it polls).
        drop(listeners);
        // Shutdown: the turns under way finish within the grace.
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while let Some(ended) = running.next().await {
                report.add(ended.report);
                if !slots.contains_key(&ended.name) {
                    // Removed during its turn, as in the loop above.
                    inbox_runtime::__facade::outbox_status_gone(&ended.name);
                }
                if let Turn::Ran(Err(e)) = ended.turn {
                    if let RelayError::Publisher(_) = e {
                        closed.get_or_insert(RelayError::tenant(&ended.name, e));
                        continue;
                    }
                    report.errors += 1;
                    tracing::warn!(target: crate::TRACING_TARGET, tenant = %ended.name, error = %e, "diesel-inbox: outbox relay: a tenant's last turn before shutdown failed");
                }
            }
        })
        .await;
        if drained.is_err() {
            let tenants: Vec<String> = slots
                .iter()
                .filter(|(_, s)| s.busy)
                .map(|(name, _)| name.to_string())
                .collect();
            tracing::warn!(target: crate::TRACING_TARGET, grace = ?SHUTDOWN_GRACE, ?tenants, "diesel-inbox: outbox relay: tenants' turns did not finish within the shutdown grace; their rows are claimed again when their lease ends");
        }
        match closed {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// When `slot`'s tenant is due again after its turn; an error when the
    /// publisher cannot publish any more.
    fn after_turn(
        &self,
        name: &str,
        slot: &mut Slot<T, P>,
        pass: &RelayReport,
        turn: Turn,
        next: Option<Next>,
        report: &mut RelayReport,
    ) -> Result<(), RelayError> {
        let now = Instant::now();
        let failed = match turn {
            Turn::Ran(Ok(())) if pass.released > 0 => {
                slot.outages += 1;
                let wait = backoff(OUTAGE_DELAY, MAX_OUTAGE_DELAY, slot.outages);
                tracing::warn!(target: crate::TRACING_TARGET, tenant = %name, released = pass.released, wait_ms = wait.as_millis() as u64, "diesel-inbox: outbox relay: the broker is unavailable; backing off");
                slot.due = now + wait;
                return Ok(());
            }
            Turn::Ran(Ok(())) => {
                slot.outages = 0;
                // A full turn: more is likely due; behind the others.
                // Else, listened, when its doze says (a notification may
                // make it due sooner); polled, after the poll interval.
                // Woken during its turn (after its claim, maybe): at once.
                slot.due = if pass.batches >= self.turn || slot.woken {
                    now
                } else {
                    match next {
                        Some(Next::Pass) => now,
                        Some(Next::Wait(wait) | Next::Linger(wait)) => now + wait,
                        None => now + self.settings.poll_interval,
                    }
                };
                return Ok(());
            }
            Turn::Ran(Err(RelayError::Publisher(e))) => {
                return Err(RelayError::tenant(name, RelayError::Publisher(e)))
            }
            Turn::Ran(Err(e)) => e.to_string(),
            Turn::TimedOut => self.timed_out().to_string(),
        };
        report.errors += 1;
        slot.outages += 1;
        let wait = backoff(OUTAGE_DELAY, MAX_OUTAGE_DELAY, slot.outages);
        tracing::warn!(target: crate::TRACING_TARGET, tenant = %name, error = %failed, wait_ms = wait.as_millis() as u64, "diesel-inbox: outbox relay: a tenant's turn failed; backing off that tenant");
        slot.due = now + wait;
        Ok(())
    }
}

/// Something may be due in `slot`'s outbox: its turn comes at once,
/// unless it is backed off after an outage.
fn wake_slot<T: TenantPool, P>(slot: &mut Slot<T, P>, now: Instant) {
    slot.woken = true;
    if slot.outages == 0 {
        slot.due = slot.due.min(now);
    }
}

impl RelayError {
    /// `e`, of tenant `name`.
    fn tenant(name: &str, e: RelayError) -> RelayError {
        RelayError::Tenant {
            tenant: name.to_owned(),
            source: Box::new(e),
        }
    }
}

/// A publisher shared by the relays of several tenants.
impl<P: Publish> Publish for Arc<P> {
    fn publish<'a>(
        &'a self,
        messages: &'a [inbox_runtime::outbox::OutboxMessage],
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send + 'a {
        (**self).publish(messages)
    }

    fn messaging_system(&self) -> Option<&str> {
        (**self).messaging_system()
    }

    fn messaging_route<'a>(&'a self, destination: &'a str) -> (&'a str, Option<&'a str>) {
        (**self).messaging_route(destination)
    }
}
