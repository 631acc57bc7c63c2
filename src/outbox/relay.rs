//! The outbox relay, written once for every broker: claim a batch of due
//! messages, publish them through a [`Publish`]er with the broker's
//! confirms, settle each (delete, count a failure, or give it back), and
//! wait for the next wake-up or poll. One short transaction per batch
//! settles the batch before and claims the next, while a batch publishes.

use super::pool::RelayPool;
use super::publish::{Publish, PublishError};
use inbox_runtime::__facade::backoff;
use inbox_runtime::outbox::{self as steps, PublishOutcome};
use inbox_runtime::InboxError;
pub(crate) use settings::Settings;
use std::future::Future;
use std::pin::pin;
use std::time::{Duration, Instant};
pub use tenants::TenantRelay;
use tracing::Instrument;
use wakeups::{Doze, Next, LISTEN_OPEN_TIMEOUT};

mod listeners;
mod settings;
mod tenants;
mod wakeups;
mod wal;
mod wal_stream;

/// Why a relay stopped. Each variant keeps its cause as its
/// [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// A database error of [`Relay::run_once`] (`run` logs it and backs
    /// off instead).
    #[error("outbox relay: {0}")]
    Database(#[from] InboxError),
    /// No connection from the pool ([`Relay::run_once`]; `run` backs off).
    #[error("outbox relay: no database connection from the pool: {0}")]
    Pool(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The publisher cannot publish any more ([`PublishError::Closed`]).
    #[error("outbox relay: {0}")]
    Publisher(#[source] PublishError),
    /// The WAL outbox's replication connection ([`Relay::wal`]) failed or
    /// cannot open (its URL, the server's refusal, a stream that stopped);
    /// `run` logs it and backs off, then streams again from what the slot
    /// confirmed.
    #[error("outbox relay: {0}")]
    Replication(#[source] std::io::Error),
    /// The relay over tenants ([`Relay::tenants`]): tenant `tenant`'s
    /// relay stopped for `source`.
    #[error("outbox relay: tenant {tenant:?}: {source}")]
    Tenant {
        /// The tenant.
        tenant: String,
        /// Why its relay stopped.
        #[source]
        source: Box<RelayError>,
    },
}

/// What a relay did: see [`Relay::run_once`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RelayReport {
    /// Messages the broker confirmed (their rows are deleted).
    pub published: u64,
    /// Messages the broker refused, to be retried.
    pub failed: u64,
    /// Messages that became dead (refused `max_publish_attempts` times).
    pub dead: u64,
    /// Messages given back unpublished: the broker was unavailable. (A
    /// message kept back behind its key's refused one is given back too,
    /// and not counted here: the broker took the rest.)
    pub released: u64,
    /// Batches claimed.
    pub batches: u64,
    /// Database and pool errors `run` backed off from.
    pub errors: u64,
}

impl RelayReport {
    fn add(&mut self, other: RelayReport) {
        self.published += other.published;
        self.failed += other.failed;
        self.dead += other.dead;
        self.released += other.released;
        self.batches += other.batches;
        self.errors += other.errors;
    }
}

/// The default [`Relay::batch_size`].
pub(crate) const DEFAULT_BATCH_SIZE: usize = 100;

/// The default [`Relay::poll_interval`].
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The default [`Relay::max_publish_attempts`].
pub(crate) const DEFAULT_MAX_PUBLISH_ATTEMPTS: u32 = 10;
/// How long a relay holds the rows of a batch it claimed; another relay
/// takes them over only after this. The publisher's confirm wait is far
/// shorter, and a batch whose publish outlasts half of it is given back.
pub(crate) const LEASE: Duration = Duration::from_secs(60);

/// The longest poll interval or lease (a day): longer ones are this.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// How long [`Relay::run`] lets a pass under way finish after shutdown.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// The first wait after a refused publish; each further failure of the
/// message doubles it, up to [`MAX_RETRY_DELAY`], with jitter.
pub(crate) const RETRY_DELAY: Duration = Duration::from_secs(1);
/// The longest wait between two publishes of a refused message.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);
/// The first wait after the broker or the database was unavailable; it
/// doubles per failed pass, up to [`MAX_OUTAGE_DELAY`], with jitter.
pub(crate) const OUTAGE_DELAY: Duration = Duration::from_millis(500);
/// The longest wait between two passes during an outage.
pub(crate) const MAX_OUTAGE_DELAY: Duration = Duration::from_secs(30);

/// The outbox relay: publishes committed outbox rows through a broker and
/// deletes each once the broker confirmed it.
///
/// - **Claiming:** a batch of due messages, the oldest pending one of each
///   ordering key, in a short transaction (`FOR UPDATE SKIP LOCKED` on
///   PostgreSQL, MySQL 8 and MariaDB 10.6+; SQLite's immediate transaction
///   serializes claims); the rows are then held by this relay for its
///   lease ([`lease`](Self::lease), 60 s by default). Several relays share the work without publishing one row
///   at once.
/// - **Order:** a key's next message is claimed only after the previous
///   one is published (its row deleted) or dead.
/// - **Failures:** a refused message is retried with backoff
///   (1 s doubling to 60 s, with jitter) and becomes dead
///   after [`max_publish_attempts`](Self::max_publish_attempts) refusals; an unavailable
///   broker or database is waited out (0.5 s doubling to 30 s, with
///   jitter) and never makes a message dead.
/// - **Latency:** after an `#[idempotent]` call that enqueued commits, the
///   relays of its process wake at once. On PostgreSQL, `run` also
///   `LISTEN`s on a connection of its own (taken out of the pool), so that
///   the commits of other processes wake it too ([`outbox::set_notify`](super::set_notify));
///   it checks at start that a notification reaches it, and behind a
///   connection proxy in transaction mode (PgBouncer), where none can, it
///   says so once (WARN) and polls. Otherwise (MySQL/MariaDB, SQLite) rows
///   are found by polling every [`poll_interval`](Self::poll_interval),
///   which stays the safety net everywhere.
///
/// ```no_run
/// # #[cfg(all(feature = "lapin", feature = "postgres"))]
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel_async::pooled_connection::deadpool::Pool;
/// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
/// use diesel_async::AsyncPgConnection;
/// use diesel_inbox::outbox::{self, Relay};
/// use std::time::Duration;
///
/// let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new("postgres://localhost/shop");
/// let pool = Pool::builder(manager).max_size(2).build()?;
/// let publisher = outbox::lapin::Publisher::connect("amqp://localhost:5672/%2f", "orders-exchange");
/// let relay = Relay::new(pool, publisher)
///     .batch_size(200)
///     .poll_interval(Duration::from_millis(500))
///     .max_publish_attempts(8);
/// let report = relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// println!("published {}", report.published);
/// # Ok(())
/// # }
/// ```
pub struct Relay<D: RelayPool, P> {
    pool: D,
    publisher: P,
    settings: Settings,
    /// Where the next claim's look starts (PostgreSQL): the floor the last
    /// claim left, none after a failed step.
    floor: std::sync::Mutex<Option<steps::Floor>>,
    /// Whether it reads the WAL outbox too ([`wal`](Self::wal)): the
    /// replication connection's URL; and its connections for that.
    wal: Option<String>,
    wal_side: tokio::sync::Mutex<wal::WalSide<D::Connection>>,
    /// The tenant whose outbox this is ([`Relay::tenants`]): its name goes
    /// into each message's [`TENANT_HEADER`](crate::tenants::TENANT_HEADER).
    tenant: Option<std::sync::Arc<str>>,
    /// The most batches one pass claims (a relay over tenants takes turns
    /// between them); `None`: a pass claims until nothing is due.
    turn: Option<u64>,
}

impl<D: RelayPool, P> std::fmt::Debug for Relay<D, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("batch_size", &self.settings.batch_size)
            .field("poll_interval", &self.settings.poll_interval)
            .field("max_publish_attempts", &self.settings.max_publish_attempts)
            .field("lease", &self.settings.lease)
            .finish_non_exhaustive()
    }
}

impl<D, P> Relay<D, P>
where
    D: RelayPool,
    P: Publish,
{
    /// A relay of the outbox in `pool`'s database, publishing through
    /// `publisher`.
    pub fn new(pool: D, publisher: P) -> Self {
        Relay {
            pool,
            publisher,
            settings: Settings::default(),
            floor: std::sync::Mutex::new(None),
            wal: None,
            wal_side: Default::default(),
            tenant: None,
            turn: None,
        }
    }

    /// Makes the relay also publish the WAL outbox's messages (default:
    /// it does not): those that enqueues wrote to the write-ahead log
    /// with [`outbox::set_wal`](super::set_wal) on (PostgreSQL 14 and
    /// later, `wal_level = logical`, the slot made by
    /// [`outbox::wal::create`](super::wal::create)).
    ///
    /// `url` is the pool's database, for a replication connection:
    /// `postgres://user:password@host:port/database` (a role with the
    /// `REPLICATION` attribute, or a superuser; no TLS; no proxy).
    ///
    /// Each pass first reads the slot. The relay keeps a connection out of
    /// the pool with a session lock (one relay of a database reads its
    /// slot at a time, the others only the table) and a replication
    /// connection streaming the slot (`START_REPLICATION`): the server
    /// decodes each transaction once, as it commits, and sends it. The
    /// pass reads whole transactions up to where the WAL was flushed when
    /// it began, [`batch_size`](Self::batch_size) messages at a time,
    /// publishes them in waves (a key's messages in order), writes into
    /// the outbox table those it cannot publish now (refused by the
    /// broker: counted, retried with backoff, dead after
    /// [`max_publish_attempts`](Self::max_publish_attempts); or of a key
    /// with live rows there, which keep their order), and only then
    /// confirms them to the slot. Then the pass goes on with the table, as
    /// without it. A relay killed before it confirmed, or a server that
    /// crashed before its next checkpoint, publishes those messages again,
    /// with their ids: at least once, as the table's relay.
    ///
    /// ```no_run
    /// # #[cfg(all(feature = "lapin", feature = "postgres"))]
    /// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel::Connection;
    /// use diesel_async::pooled_connection::deadpool::Pool;
    /// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    /// use diesel_async::AsyncPgConnection;
    /// use diesel_inbox::outbox::{self, Relay};
    ///
    /// let url = "postgres://localhost/shop";
    /// // Once per database, outside a transaction.
    /// outbox::wal::create(&mut diesel::PgConnection::establish(url)?)?;
    /// // In every process that enqueues.
    /// outbox::set_wal(true);
    ///
    /// let pool = Pool::builder(AsyncDieselConnectionManager::<AsyncPgConnection>::new(url)).build()?;
    /// let publisher = outbox::lapin::Publisher::connect("amqp://localhost:5672/%2f", "orders-exchange");
    /// let relay = Relay::new(pool, publisher).wal(url).batch_size(500);
    /// relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn wal(mut self, url: impl Into<String>) -> Self {
        self.wal = Some(url.into());
        self
    }

    /// Messages claimed and published at once (default 100; 1 to 10,000).
    /// A batch may hold several messages of one ordering key: they are
    /// published in waves, each after its key's previous one was
    /// confirmed. Each claim reads the oldest live rows once (four per
    /// message it may take), so a larger batch also divides that read's
    /// cost. On MySQL/MariaDB and SQLite the read starts at the lowest
    /// `seq`; on PostgreSQL it starts where the last one left off, so the
    /// rows a long transaction keeps as dead tuples are not passed again
    /// (the guide's outbox chapter, "Claiming").
    pub fn batch_size(mut self, n: usize) -> Self {
        self.settings.batch_size(n);
        self
    }

    /// How often `run` looks for messages when nothing woke it (default
    /// 1 s): the latency of delayed messages, and of messages enqueued by
    /// other processes where no notification reaches the relay (MySQL,
    /// SQLite, a transaction-mode proxy) or in a transaction of your own
    /// without [`outbox::wake`](super::wake).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.settings.poll_interval(interval);
        self
    }

    /// Refusals by the broker after which a message is dead (default 10;
    /// at least 1).
    pub fn max_publish_attempts(mut self, n: u32) -> Self {
        self.settings.max_publish_attempts(n);
        self
    }

    /// How long a claimed batch is this relay's (default 60 s, at
    /// least 1 s): a relay that dies leaves its rows to the others after
    /// it. A batch whose publish outlasts half of it is given back, so
    /// keep it well above the broker's confirm time.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease(lease);
        self
    }

    /// Publishes what is due now, batch after batch, until a claim finds
    /// nothing, a batch publishes nothing (only failures), or the broker
    /// is unavailable: one pass, for tests and cron-style use. A key's
    /// next message is due once the previous one is published or dead, so
    /// one pass publishes a key's backlog in order. The next batch is
    /// claimed while the current one is being published (its rows are
    /// held, so the claim skips them and their keys' later messages).
    /// Database and pool errors are returned.
    pub async fn run_once(&self) -> Result<RelayReport, RelayError> {
        let mut report = RelayReport::default();
        self.pass(&mut report).await.map(|()| report)
    }

    /// [`run_once`](Self::run_once), counting into `report` as it goes (a
    /// pass that fails after publishing keeps what it published).
    ///
    /// Batch `k` is published while one transaction settles batch `k - 1`
    /// and claims batch `k + 1`: one short transaction per batch, and the
    /// database's work overlaps the broker's. The claim sees the
    /// settlement before it, so a key's next message is claimed once the
    /// previous one is published; batch `k`'s rows are held, so the claim
    /// skips them and their keys' later messages.
    async fn pass(&self, report: &mut RelayReport) -> Result<(), RelayError> {
        if self.wal.is_some() && !self.wal_pass(report).await? {
            // The broker is unavailable.
            return Ok(());
        }
        let mut current = self.step(report, &[], true).await?;
        // Batches claimed; a turn ends after `self.turn` of them.
        let mut claimed = u64::from(current.is_some());
        let more = |claimed: u64| self.turn.is_none_or(|turn| claimed < turn);
        let mut unsettled: Option<Delivered> = None;
        loop {
            let Some(claim) = current.take() else {
                // Nothing more was due when the last batch was claimed (or
                // the turn is over): settle it, and claim what its keys let
                // through.
                let Some(last) = unsettled.take() else {
                    return Ok(());
                };
                current = self.step(report, &[last], more(claimed)).await?;
                claimed += u64::from(current.is_some());
                continue;
            };
            let earlier: Vec<Delivered> = unsettled.take().into_iter().collect();
            let (delivered, stepped) = tokio::join!(
                self.publish(claim),
                self.step(report, &earlier, more(claimed))
            );
            match stepped {
                Ok(next) => {
                    claimed += u64::from(next.is_some());
                    current = next;
                }
                Err(e) => {
                    // The batches whose settlement failed, and the one just
                    // published, are settled once more without a claim
                    // (their rows would otherwise wait for the lease to end,
                    // then be published again).
                    let mut settle = earlier;
                    settle.push(delivered);
                    let _ = self.step(report, &settle, false).await;
                    return Err(e);
                }
            }
            if delivered.stops() {
                // The broker is unavailable or the publisher closed: this
                // batch is settled and the next given back, uncounted.
                let closed = delivered.closed.clone();
                let mut settle = vec![delivered];
                settle.extend(current.take().map(Delivered::released));
                self.step(report, &settle, false).await?;
                return match closed {
                    Some(e) => Err(RelayError::Publisher(e)),
                    None => Ok(()),
                };
            }
            unsettled = Some(delivered);
        }
    }

    /// Publishes until `shutdown` resolves, then returns what it did.
    ///
    /// A pass under way when `shutdown` resolves is finished within
    /// 10 s; one still running then (a database or broker
    /// that does not answer) is dropped, and the rows it held are claimed
    /// again when their lease runs out. Database, pool and broker outages
    /// are logged (WARN, target `diesel_inbox`) and waited out; only
    /// [`PublishError::Closed`] stops it early.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<RelayReport, RelayError> {
        let (doze, mut asked) = Doze::new();
        // The server's check beside the listener (it must not hold the
        // listener's answers).
        let listen = async { tokio::join!(self.check_server(), self.listen(&mut asked)).1 };
        tokio::select! {
            biased;
            ran = self.run_polling(shutdown, doze) => ran,
            never = listen => match never {},
        }
    }

    /// The database server's durability settings, read once at start
    /// beside the first pass (a WARN, once per process, where the server
    /// may lose committed transactions); bounded, and a failure left to
    /// the passes to report.
    async fn check_server(&self) {
        let checked = tokio::time::timeout(LISTEN_OPEN_TIMEOUT, async {
            let mut conn = self.pool.connection().await.map_err(RelayError::Pool)?;
            steps::check_server_async(&mut *conn)
                .await
                .map_err(|e| RelayError::Database(InboxError::Database(e)))
        })
        .await;
        if let Ok(Err(e)) = checked {
            tracing::debug!(target: crate::TRACING_TARGET, error = %e, "diesel-inbox: outbox relay: its check of the database server's settings failed");
        }
    }

    /// `run` without the listener; `doze` tells it when the relay sleeps.
    async fn run_polling(
        &self,
        shutdown: impl Future<Output = ()>,
        mut doze: Doze,
    ) -> Result<RelayReport, RelayError> {
        let mut shutdown = pin!(shutdown);
        let mut report = RelayReport::default();
        let mut outages = 0u32;
        #[cfg(feature = "metrics")]
        let mut counted = Instant::now() - STATUS_INTERVAL;
        loop {
            let seen = steps::wake_generation();
            let mut pass = RelayReport::default();
            let mut lingering = false;
            let (passed, stopping) = {
                let mut running = pin!(self.pass(&mut pass));
                tokio::select! {
                    biased;
                    passed = &mut running => (passed, false),
                    () = &mut shutdown => {
                        match tokio::time::timeout(SHUTDOWN_GRACE, &mut running).await {
                            Ok(passed) => (passed, true),
                            Err(_) => {
                                tracing::warn!(target: crate::TRACING_TARGET, grace = ?SHUTDOWN_GRACE, "diesel-inbox: outbox relay: a pass did not finish within the shutdown grace; its rows are claimed again when their lease ends");
                                (Ok(()), true)
                            }
                        }
                    }
                }
            };
            report.add(pass);
            if stopping {
                return match passed {
                    Err(RelayError::Publisher(e)) => Err(RelayError::Publisher(e)),
                    Err(e) => {
                        report.errors += 1;
                        tracing::warn!(target: crate::TRACING_TARGET, error = %e, "diesel-inbox: outbox relay: the last pass before shutdown failed");
                        Ok(report)
                    }
                    Ok(()) => Ok(report),
                };
            }
            let wait = match passed {
                Ok(()) => {
                    if pass.released > 0 {
                        outages += 1;
                        let wait = backoff(OUTAGE_DELAY, MAX_OUTAGE_DELAY, outages);
                        tracing::warn!(target: crate::TRACING_TARGET, released = pass.released, wait_ms = wait.as_millis() as u64, "diesel-inbox: outbox relay: the broker is unavailable; backing off");
                        wait
                    } else {
                        outages = 0;
                        match doze
                            .after_pass(self.settings.poll_interval, pass.batches > 0)
                            .await
                        {
                            Next::Pass => Duration::ZERO,
                            Next::Wait(wait) => wait,
                            Next::Linger(wait) => {
                                lingering = true;
                                wait
                            }
                        }
                    }
                }
                Err(RelayError::Publisher(e)) => return Err(RelayError::Publisher(e)),
                Err(e) => {
                    report.errors += 1;
                    outages += 1;
                    tracing::warn!(target: crate::TRACING_TARGET, error = %e, "diesel-inbox: outbox relay pass failed; backing off");
                    backoff(OUTAGE_DELAY, MAX_OUTAGE_DELAY, outages)
                }
            };
            #[cfg(feature = "metrics")]
            if counted.elapsed() >= STATUS_INTERVAL {
                counted = Instant::now();
                self.count_status(STATUS_INTERVAL).await;
            }
            let wakes = outages == 0 && !lingering;
            let woken = tokio::select! {
                biased;
                () = &mut shutdown => return Ok(report),
                () = steps::woken(seen), if wakes => true,
                () = tokio::time::sleep(wait) => false,
            };
            doze.before_pass(woken).await;
        }
    }

    /// Counts the outbox for its gauges ([`outbox::status`](crate::outbox::status)),
    /// at most `within`: a stalled database must not hold the loop (and
    /// with it shutdown) here. A failure is left to the passes to report.
    #[cfg(feature = "metrics")]
    pub(super) async fn count_status(&self, within: Duration) {
        let _ = tokio::time::timeout(within, async {
            if let Ok(mut conn) = self.pool.connection().await {
                let _ = steps::status_async(&mut *conn).await;
            }
        })
        .await;
    }

    /// One short transaction on a connection of its own: settles
    /// `settle`, counting it into `report`, then, with `claim`, claims the
    /// next batch (`None`: nothing is due). Run again after a transient
    /// failure (a deadlock, Galera's certification conflict): the broker
    /// has the settled messages, and a settlement given up would leave
    /// their rows held until the lease ends, then publish them twice.
    async fn step(
        &self,
        report: &mut RelayReport,
        settle: &[Delivered],
        claim: bool,
    ) -> Result<Option<steps::Claim>, RelayError> {
        type Backend<D> =
            <<D as RelayPool>::Connection as diesel_async::AsyncConnectionCore>::Backend;
        if settle.is_empty() && !claim {
            // Nothing to settle, nothing to claim (a turn of one batch,
            // beside that batch's publish): no checkout, whose recycle
            // check is a round trip, and on a tenant set whose limit is
            // reached may close one pool and open another.
            return Ok(None);
        }
        let held_back: u64 = settle.iter().map(|d| d.held_back).sum();
        let settle: Vec<(&steps::Claim, &[PublishOutcome])> = settle
            .iter()
            .map(|d| (&d.claim, d.outcomes.as_slice()))
            .collect();
        let next = claim.then_some((self.settings.batch_size, self.settings.lease));
        let mut attempt = 0;
        let stepped = loop {
            attempt += 1;
            let mut conn = self.pool.connection().await.map_err(RelayError::Pool)?;
            // Taken for the step: a step that fails (or is dropped) leaves
            // none, and the next look starts from the lowest `seq`.
            let mut floor = self.floor.lock().map(|mut f| f.take()).unwrap_or(None);
            let step = steps::step_async(&mut *conn, &settle, next, &mut floor).await;
            if let Ok(mut kept) = self.floor.lock() {
                *kept = floor;
            }
            match step {
                Err(InboxError::Database(e))
                    if attempt < STEP_ATTEMPTS
                        && inbox_runtime::__facade::is_transient::<Backend<D>>(&e) =>
                {
                    drop(conn);
                    tokio::time::sleep(OUTAGE_DELAY / 10 * attempt).await;
                }
                stepped => break stepped.map_err(RelayError::Database)?,
            }
        };
        let settled = stepped.settled;
        report.published += settled.published;
        report.failed += settled.failed;
        report.dead += settled.dead;
        report.released += settled.released.saturating_sub(held_back);
        report.batches += u64::from(stepped.claim.is_some());
        Ok(stepped.claim)
    }

    /// Publishes one claimed batch: how each message's publish ended.
    async fn publish(&self, mut claim: steps::Claim) -> Delivered {
        let claimed = claim.messages.len();
        if let Some(tenant) = &self.tenant {
            crate::tenants::name_messages(tenant, &mut claim.messages);
        }
        let span = tracing::info_span!(target: crate::TRACING_TARGET, "diesel_inbox.outbox.publish", messages = claimed);
        // One producer span per message, the child of the context stored
        // at enqueue; its own context replaces that one in the headers.
        #[cfg(feature = "otel")]
        let sends: Vec<tracing::Span> = claim
            .messages
            .iter_mut()
            .map(|message| {
                use inbox_runtime::__facade::otel;
                let (destination, routing_key) =
                    self.publisher.messaging_route(&message.destination);
                let messaging = otel::Messaging {
                    system: self.publisher.messaging_system(),
                    destination,
                    routing_key,
                    message_id: &message.id,
                    group: None,
                };
                otel::producer_span(messaging, &mut message.headers, &span)
            })
            .collect();
        let started = Instant::now();
        let mut results = vec![None; claimed];
        let publish = self.publish_waves(&claim, &mut results);
        let mut stopped = match tokio::time::timeout(
            self.settings.lease / 2,
            publish.instrument(span.clone()),
        )
        .await
        {
            Ok(stopped) => stopped,
            Err(_) => {
                tracing::warn!(target: crate::TRACING_TARGET, claimed, timeout_ms = (self.settings.lease / 2).as_millis() as u64, "diesel-inbox: outbox relay: a batch's publish outlasted half the lease; what the broker had not confirmed is given back");
                true
            }
        };
        let mut closed = None;
        let mut warned = false;
        // Kept back behind its key's refused message while the broker took
        // the rest: given back as the others are, but no sign of an outage.
        let mut held_back = 0;
        let outcomes: Vec<PublishOutcome> = results
            .into_iter()
            .enumerate()
            .map(|(i, result)| match result {
                Some(Ok(())) => PublishOutcome::Published,
                Some(Err(PublishError::Refused(why))) => PublishOutcome::Failed {
                    error: why.to_string(),
                    retry_in: backoff(RETRY_DELAY, MAX_RETRY_DELAY, claim.messages[i].attempts + 1),
                    max_publish_attempts: self.settings.max_publish_attempts,
                },
                Some(Err(e @ PublishError::Closed(_))) => {
                    closed = Some(e);
                    stopped = true;
                    PublishOutcome::Released
                }
                Some(Err(e @ PublishError::Unavailable(_))) => {
                    // Once per batch (the pass stops at it), with why.
                    if !warned {
                        warned = true;
                        tracing::warn!(target: crate::TRACING_TARGET, error = %e, "diesel-inbox: outbox relay: a publish failed; the batch's messages are given back");
                    }
                    stopped = true;
                    PublishOutcome::Released
                }
                // Kept back behind its key's unpublished message, or not
                // reached (the broker became unavailable, the publish
                // outlasted half the lease).
                None => {
                    held_back += 1;
                    PublishOutcome::Released
                }
            })
            .collect();
        if stopped {
            // Not reached: the outage's.
            held_back = 0;
        }
        #[cfg(feature = "otel")]
        for (send, outcome) in sends.iter().zip(&outcomes) {
            if *outcome != PublishOutcome::Published {
                inbox_runtime::__facade::otel::failed(send);
            }
        }
        tracing::debug!(
            target: crate::TRACING_TARGET,
            parent: &span,
            claimed,
            published = outcomes.iter().filter(|o| **o == PublishOutcome::Published).count(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "diesel-inbox: outbox batch"
        );
        Delivered {
            claim,
            outcomes,
            closed,
            stopped,
            held_back,
        }
    }

    /// Publishes `claim`'s waves in turn, each as one batch, into
    /// `results` (`None`: not published): a key's message is published
    /// only once its key's message of the wave before was confirmed, so a
    /// key's messages reach the broker in order, and a refused one keeps
    /// its key's later ones back. Stops at a wave that found the broker
    /// unavailable, or that a publisher answered for fewer messages than
    /// it was given; returns whether it stopped so.
    async fn publish_waves(
        &self,
        claim: &steps::Claim,
        results: &mut [Option<Result<(), PublishError>>],
    ) -> bool {
        let mut behind = std::collections::HashSet::new();
        let mut start = 0;
        for &end in &claim.waves {
            let wave = &claim.messages[start..end];
            let kept: Vec<bool> = wave
                .iter()
                .map(|m| m.ordering_key.as_ref().is_some_and(|k| behind.contains(k)))
                .collect();
            let answers = if kept.contains(&true) {
                let some: Vec<_> = wave
                    .iter()
                    .zip(&kept)
                    .filter(|(_, kept)| !**kept)
                    .map(|(m, _)| m.clone())
                    .collect();
                if some.is_empty() {
                    start = end;
                    continue;
                }
                self.publisher.publish(&some).await
            } else {
                self.publisher.publish(wave).await
            };
            let mut answers = answers.into_iter();
            let mut stop = false;
            for (i, kept) in (start..end).zip(kept) {
                if kept {
                    continue;
                }
                let answer = answers.next().unwrap_or_else(|| {
                    Err(PublishError::unavailable(
                        "the publisher answered for fewer messages than it was given",
                    ))
                });
                stop |= matches!(
                    answer,
                    Err(PublishError::Unavailable(_) | PublishError::Closed(_))
                );
                if answer.is_err() {
                    if let Some(key) = &claim.messages[i].ordering_key {
                        behind.insert(key.clone());
                    }
                }
                results[i] = Some(answer);
            }
            if stop {
                return true;
            }
            start = end;
        }
        false
    }
}

/// A claimed batch after its publish, to be settled.
struct Delivered {
    claim: steps::Claim,
    /// How each message's publish ended.
    outcomes: Vec<PublishOutcome>,
    /// The publisher cannot publish any more.
    closed: Option<PublishError>,
    /// The broker was unavailable or the publisher closed: messages were
    /// given back.
    stopped: bool,
    /// Given back behind their key's refused message, the broker up: not
    /// `released` (which tells `run` the broker is unavailable).
    held_back: u64,
}

impl Delivered {
    /// A claim given back unpublished.
    fn released(claim: steps::Claim) -> Self {
        Delivered {
            outcomes: vec![PublishOutcome::Released; claim.messages.len()],
            claim,
            closed: None,
            stopped: true,
            held_back: 0,
        }
    }

    /// Whether the pass ends after it: messages were given back because
    /// the broker was unavailable or the publisher closed.
    fn stops(&self) -> bool {
        self.stopped
    }
}

/// How often a relay step runs in all when it keeps failing transiently.
const STEP_ATTEMPTS: u32 = 5;

/// How often `run` refreshes the outbox gauges (feature `metrics`).
#[cfg(feature = "metrics")]
pub(super) const STATUS_INTERVAL: Duration = Duration::from_secs(10);
