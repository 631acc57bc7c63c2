//! Many databases: a set of named tenant pools ([`Tenants`]), each opened on
//! first use, closed when idle, under one limit on connections across all
//! of them.
//!
//! Each tenant has a database of its own (or a schema of its own, through a
//! URL that selects it): its inbox, its outbox and its business tables. A
//! handler takes its tenant's connection from the set, so that the inbox
//! row lands in the tenant's database, in the tenant's transaction; one
//! relay publishes every tenant's outbox ([`Relay::tenants`](crate::outbox::Relay::tenants)).
//!
//! - **Which tenants:** a list ([`Tenants::list`]), a closure that lists
//!   them ([`Tenants::from_fn`], read again by [`refresh`](Tenants::refresh)),
//!   and changes at run time ([`insert`](Tenants::insert),
//!   [`remove`](Tenants::remove)).
//! - **Bounded connections:** a tenant's pool holds at most
//!   [`pool_size`](Tenants::pool_size) connections and is opened on first
//!   use; the pools open at once hold at most
//!   [`max_connections`](Tenants::max_connections) in all. To open another,
//!   the set closes the pool idle the longest, or waits (at most
//!   [`checkout_timeout`](Tenants::checkout_timeout)) for one to become
//!   idle. A pool unused for [`idle_timeout`](Tenants::idle_timeout) is
//!   closed.
//! - **Never another tenant's:** a connection is always the named
//!   tenant's; an unknown name is [`TenantError::Unknown`].
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn start() -> Result<(), Box<dyn std::error::Error>> {
//! use diesel_async::pooled_connection::deadpool::Pool;
//! use diesel_async::AsyncPgConnection;
//! use diesel_inbox::tenants::Tenants;
//!
//! let tenants: Tenants<Pool<AsyncPgConnection>> = Tenants::list([
//!     ("acme", "postgres://app@db1/acme"),
//!     ("globex", "postgres://app@db2/globex"),
//! ])
//! .max_connections(40)
//! .pool_size(4);
//! tenants.insert("initech", "postgres://app@db1/initech"); // at run time
//! let mut conn = tenants.connection("acme").await?; // acme's database, nobody else's
//! diesel_inbox::migrate_async(&mut *conn).await?;
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

mod handle;
mod pool;
use handle::Used;
#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "sqs"
))]
pub(crate) use handle::{connection_named, tenant_named, TenantOf};
pub use handle::{Tenant, TenantConnection};
pub use pool::TenantPool;

/// The header in which the relay over tenants ([`Relay::tenants`](crate::outbox::Relay::tenants))
/// names each message's tenant, and in which the runners look for it:
/// `x-tenant`. The relay sets it from the database it read the message
/// from, over any value the enqueue gave.
pub const TENANT_HEADER: &str = "x-tenant";

/// Names `tenant` in each message's [`TENANT_HEADER`], replacing any.
pub(crate) fn name_messages(tenant: &str, messages: &mut [inbox_runtime::outbox::OutboxMessage]) {
    for message in messages {
        message
            .headers
            .retain(|(name, _)| !name.eq_ignore_ascii_case(TENANT_HEADER));
        message
            .headers
            .push((TENANT_HEADER.to_owned(), tenant.to_owned()));
    }
}

/// The default [`Tenants::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: u32 = 32;
/// The default [`Tenants::pool_size`].
pub const DEFAULT_POOL_SIZE: u32 = 2;
/// The default [`Tenants::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest idle or checkout timeout (a day): longer ones are taken as
/// this.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// The default [`Tenants::checkout_timeout`].
pub const DEFAULT_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a tenant's connection could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TenantError {
    /// The set has no tenant of this name (never added, or removed).
    #[error("diesel-inbox: no tenant named {0:?} (add it to the tenant set, or check the message's tenant)")]
    Unknown(String),
    /// The connection limit across tenants stayed reached, by pools in
    /// use, for the whole checkout timeout.
    #[error("diesel-inbox: tenant {tenant:?}: every one of the {max_connections} connections across tenants stayed in use for {waited:?}; raise Tenants::max_connections or lower Tenants::pool_size")]
    Exhausted {
        /// The tenant whose connection was asked for.
        tenant: String,
        /// [`Tenants::max_connections`].
        max_connections: u32,
        /// How long it waited.
        waited: Duration,
    },
    /// The tenant's pool could not be built or gave no connection (its
    /// database is down, its URL is wrong, the checkout timed out).
    #[error("diesel-inbox: tenant {tenant:?}: no connection: {source}")]
    Pool {
        /// The tenant.
        tenant: String,
        /// The pool's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The closure of [`Tenants::from_fn`] failed.
    #[error("diesel-inbox: the tenant list could not be read: {0}")]
    Source(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// What [`Tenants::from_fn`] calls: the tenants, as `(name, URL)` pairs.
type Lister = dyn Fn() -> Pin<
        Box<
            dyn Future<
                    Output = Result<
                        Vec<(String, String)>,
                        Box<dyn std::error::Error + Send + Sync + 'static>,
                    >,
                > + Send,
        >,
    > + Send
    + Sync;

/// A set of named tenant pools, opened on first use, closed when idle,
/// under one connection limit across them: see the [module](self).
/// Cloning it shares the set.
pub struct Tenants<T: TenantPool> {
    shared: Arc<Shared<T>>,
}

impl<T: TenantPool> Clone for Tenants<T> {
    fn clone(&self) -> Self {
        Tenants {
            shared: self.shared.clone(),
        }
    }
}

impl<T: TenantPool> std::fmt::Debug for Tenants<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let settings = self.settings();
        f.debug_struct("Tenants")
            .field("tenants", &self.names().len())
            .field("open_pools", &self.open_pools())
            .field("max_connections", &settings.max_connections)
            .field("pool_size", &settings.pool_size)
            .finish_non_exhaustive()
    }
}

struct Shared<T: TenantPool> {
    entries: Mutex<BTreeMap<String, Entry<T>>>,
    settings: Mutex<Settings>,
    /// One permit per connection the open pools may hold.
    budget: Mutex<Arc<Semaphore>>,
    /// A pool was opened: the limit's settings are fixed.
    used: std::sync::atomic::AtomicBool,
    lister: Option<Box<Lister>>,
    /// One refresh at a time, so that an older reading never replaces a
    /// newer one: the number of the last refresh that ended.
    refreshing: tokio::sync::Mutex<u64>,
    /// How many refreshes have started.
    refreshes: AtomicU64,
}

#[derive(Clone, Copy)]
struct Settings {
    max_connections: u32,
    pool_size: u32,
    idle_timeout: Duration,
    checkout_timeout: Duration,
}

struct Entry<T: TenantPool> {
    url: String,
    open: Option<Arc<Open<T>>>,
}

/// A tenant's open pool and the share of the connection limit it holds.
struct Open<T> {
    pool: T,
    /// Connections checked out of it now.
    users: AtomicUsize,
    /// When its last connection was checked out or returned.
    last_used: Mutex<Instant>,
    _permits: OwnedSemaphorePermit,
}

impl<T> Open<T> {
    fn touch(&self) {
        if let Ok(mut at) = self.last_used.lock() {
            *at = Instant::now();
        }
    }

    fn idle_for(&self) -> Option<Duration> {
        if self.users.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.last_used.lock().ok().map(|at| at.elapsed())
    }
}

impl<T: TenantPool> Tenants<T> {
    fn with(entries: BTreeMap<String, Entry<T>>, lister: Option<Box<Lister>>) -> Self {
        Tenants {
            shared: Arc::new(Shared {
                entries: Mutex::new(entries),
                settings: Mutex::new(Settings {
                    max_connections: DEFAULT_MAX_CONNECTIONS,
                    pool_size: DEFAULT_POOL_SIZE,
                    idle_timeout: DEFAULT_IDLE_TIMEOUT,
                    checkout_timeout: DEFAULT_CHECKOUT_TIMEOUT,
                }),
                budget: Mutex::new(Arc::new(Semaphore::new(DEFAULT_MAX_CONNECTIONS as usize))),
                used: std::sync::atomic::AtomicBool::new(false),
                lister,
                refreshing: tokio::sync::Mutex::new(0),
                refreshes: AtomicU64::new(0),
            }),
        }
    }

    /// A set of the tenants listed, as `(name, database URL)` pairs; a name
    /// listed twice keeps its last URL.
    ///
    /// ```
    /// # #[cfg(feature = "postgres")] {
    /// use diesel_async::pooled_connection::deadpool::Pool;
    /// use diesel_async::AsyncPgConnection;
    /// use diesel_inbox::tenants::Tenants;
    ///
    /// let tenants: Tenants<Pool<AsyncPgConnection>> =
    ///     Tenants::list([("acme", "postgres://app@db1/acme"), ("globex", "postgres://app@db2/globex")]);
    /// assert_eq!(tenants.names(), ["acme", "globex"]);
    /// assert!(tenants.remove("globex"));
    /// assert_eq!(tenants.names(), ["acme"]);
    /// # }
    /// ```
    pub fn list<N: Into<String>, U: Into<String>>(
        tenants: impl IntoIterator<Item = (N, U)>,
    ) -> Self {
        let entries = tenants
            .into_iter()
            .map(|(name, url)| {
                let entry = Entry {
                    url: url.into(),
                    open: None,
                };
                (name.into(), entry)
            })
            .collect();
        Self::with(entries, None)
    }

    /// A set whose tenants `lister` says, as `(name, database URL)` pairs:
    /// read by [`refresh`](Self::refresh) (a relay over the set calls it
    /// every [`Relay::refresh_interval`](crate::outbox::TenantRelay::refresh_interval)),
    /// so tenants added to or removed from where it reads (a directory
    /// table in a control database, a file, a service) are found without a
    /// restart. The set is empty until the first refresh.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel_async::pooled_connection::deadpool::Pool;
    /// use diesel_async::AsyncPgConnection;
    /// use diesel_inbox::tenants::Tenants;
    ///
    /// let tenants: Tenants<Pool<AsyncPgConnection>> = Tenants::from_fn(|| async {
    ///     let text = std::fs::read_to_string("/etc/shop/tenants")?;
    ///     Ok(text
    ///         .lines()
    ///         .filter_map(|line| line.split_once(' '))
    ///         .map(|(name, url)| (name.to_owned(), url.to_owned()))
    ///         .collect())
    /// });
    /// tenants.refresh().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_fn<F, Fut>(lister: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<
                Output = Result<
                    Vec<(String, String)>,
                    Box<dyn std::error::Error + Send + Sync + 'static>,
                >,
            > + Send
            + 'static,
    {
        Self::with(BTreeMap::new(), Some(Box::new(move || Box::pin(lister()))))
    }

    /// The most connections the open pools hold in all (default 32; at
    /// least [`pool_size`](Self::pool_size)). Set it before the set's first
    /// connection: after it, the limit stays as it was (a WARN says so).
    pub fn max_connections(self, n: u32) -> Self {
        self.set(|s| s.max_connections = n.max(1));
        self
    }

    /// The most connections one tenant's pool holds (default 2; at least
    /// 1, at most [`max_connections`](Self::max_connections)). Set it
    /// before the set's first connection, as `max_connections`.
    pub fn pool_size(self, n: u32) -> Self {
        self.set(|s| s.pool_size = n.max(1));
        self
    }

    /// How long a tenant's pool stays open unused (default 60 s).
    pub fn idle_timeout(self, timeout: Duration) -> Self {
        self.set(|s| s.idle_timeout = timeout);
        self
    }

    /// How long [`connection`](Self::connection) waits for the connection
    /// limit, and then for the tenant's pool (default 30 s): a database
    /// that does not answer gives [`TenantError::Pool`] after it.
    pub fn checkout_timeout(self, timeout: Duration) -> Self {
        self.set(|s| s.checkout_timeout = timeout);
        self
    }

    /// Changes the settings. `max_connections` and `pool_size` hold the
    /// pools' share of the limit: once a pool was opened they stay as they
    /// were (a WARN says so), so that the limit never counts twice.
    fn set(&self, change: impl FnOnce(&mut Settings)) {
        let mut settings = self
            .shared
            .settings
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let before = *settings;
        change(&mut settings);
        settings.idle_timeout = settings.idle_timeout.min(MAX_WAIT);
        settings.checkout_timeout = settings.checkout_timeout.min(MAX_WAIT);
        if (settings.max_connections, settings.pool_size)
            == (before.max_connections, before.pool_size)
        {
            return;
        }
        if self.shared.used.load(Ordering::Acquire) {
            tracing::warn!(target: crate::TRACING_TARGET, max_connections = before.max_connections, pool_size = before.pool_size, "diesel-inbox: tenants: max_connections and pool_size are kept as they were: set them before the set's first connection");
            settings.max_connections = before.max_connections;
            settings.pool_size = before.pool_size;
            return;
        }
        settings.pool_size = settings.pool_size.min(settings.max_connections);
        *self.shared.budget.lock().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(Semaphore::new(settings.max_connections as usize));
    }

    fn settings(&self) -> Settings {
        *self
            .shared
            .settings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry<T>>> {
        self.shared
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The tenants' names, in order.
    pub fn names(&self) -> Vec<String> {
        self.entries().keys().cloned().collect()
    }

    /// Whether the set has a tenant of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.entries().contains_key(name)
    }

    /// Adds a tenant, or gives an existing one a new URL (its open pool is
    /// closed once its connections are returned). Returns whether the
    /// name is new.
    pub fn insert(&self, name: impl Into<String>, url: impl Into<String>) -> bool {
        let url = url.into();
        match self.entries().entry(name.into()) {
            std::collections::btree_map::Entry::Occupied(mut entry) => {
                let entry = entry.get_mut();
                if entry.url != url {
                    entry.url = url;
                    entry.open = None;
                }
                false
            }
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert(Entry { url, open: None });
                true
            }
        }
    }

    /// Removes a tenant: its name is unknown from now on, and its pool is
    /// closed once its connections are returned. Returns whether it was
    /// there.
    pub fn remove(&self, name: &str) -> bool {
        self.entries().remove(name).is_some()
    }

    /// Reads the tenants again from [`from_fn`](Self::from_fn)'s closure:
    /// adds the new, removes the gone, and gives a changed URL to its
    /// tenant. A set built by [`list`](Self::list) is unchanged. Returns
    /// the number of tenants. One reading runs at a time; calls made while
    /// one waits share the next reading, and a reading is never applied
    /// after a newer one.
    pub async fn refresh(&self) -> Result<usize, TenantError> {
        let Some(lister) = &self.shared.lister else {
            return Ok(self.entries().len());
        };
        // Refreshes run one at a time: a caller that waited while another
        // read the source, having started after this call, takes its
        // result (many callers at once cost one reading), and no reading
        // is applied after a newer one.
        let asked = self.shared.refreshes.load(Ordering::Acquire);
        let mut ended = self.shared.refreshing.lock().await;
        if *ended > asked {
            return Ok(self.entries().len());
        }
        let number = self.shared.refreshes.fetch_add(1, Ordering::AcqRel) + 1;
        let listed = lister().await.map_err(TenantError::Source)?;
        let listed: BTreeMap<String, String> = listed.into_iter().collect();
        let mut entries = self.entries();
        entries.retain(|name, _| listed.contains_key(name));
        for (name, url) in listed {
            let entry = entries.entry(name).or_insert_with(|| Entry {
                url: url.clone(),
                open: None,
            });
            if entry.url != url {
                entry.url = url;
                entry.open = None;
            }
        }
        *ended = number;
        Ok(entries.len())
    }

    /// Whether the set is read from a source ([`from_fn`](Self::from_fn)),
    /// which [`refresh`](Self::refresh) reads again.
    #[cfg(any(
        feature = "lapin",
        feature = "nats",
        feature = "kafka",
        feature = "sqs",
        feature = "console"
    ))]
    pub(crate) fn reads_a_source(&self) -> bool {
        self.shared.lister.is_some()
    }

    /// The [`checkout_timeout`](Self::checkout_timeout) in force.
    #[cfg(any(
        feature = "lapin",
        feature = "nats",
        feature = "kafka",
        feature = "sqs"
    ))]
    pub(crate) fn checkout_timeout_now(&self) -> Duration {
        self.settings().checkout_timeout
    }

    /// How many tenants' pools fit the connection limit at once, beside
    /// `kept` connections held outside them ([`dedicated`](Self::dedicated)).
    pub(crate) fn fair_share_beside(&self, kept: u32) -> usize {
        let settings = self.settings();
        (settings.max_connections.saturating_sub(kept) / settings.pool_size.max(1)).max(1) as usize
    }

    /// Tenant `name`'s database URL now, if it is in the set.
    pub(crate) fn url(&self, name: &str) -> Option<String> {
        self.entries().get(name).map(|entry| entry.url.clone())
    }

    /// Whether tenant `name` is in the set with this database URL.
    pub(crate) fn has_url(&self, name: &str, url: &str) -> bool {
        self.entries()
            .get(name)
            .is_some_and(|entry| entry.url == url)
    }

    /// [`max_connections`](Self::max_connections) in force.
    pub(crate) fn max_connections_now(&self) -> u32 {
        self.settings().max_connections
    }

    /// The connections the set's limit leaves beside `pools` tenants'
    /// pools: how many [`dedicated`](Self::dedicated) ones may be kept.
    pub(crate) fn beside_pools(&self, pools: u32) -> u32 {
        let settings = self.settings();
        settings
            .max_connections
            .saturating_sub(settings.pool_size.saturating_mul(pools))
    }

    /// The pools open now.
    pub fn open_pools(&self) -> usize {
        self.entries().values().filter(|e| e.open.is_some()).count()
    }

    /// The semaphore of the connection limit (one permit a connection).
    fn budget(&self) -> Arc<Semaphore> {
        self.shared
            .budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The connections the open pools may hold now, by the limit's count:
    /// each open pool reserves [`pool_size`](Self::pool_size) (a pool
    /// closed while its connections are out keeps its share until they are
    /// returned). Never above [`max_connections`](Self::max_connections).
    pub fn reserved_connections(&self) -> u32 {
        let budget = self.budget();
        self.settings()
            .max_connections
            .saturating_sub(budget.available_permits() as u32)
    }

    /// Closes the pools unused for [`idle_timeout`](Self::idle_timeout);
    /// returns how many. Every checkout does it too.
    pub fn close_idle(&self) -> usize {
        let idle_timeout = self.settings().idle_timeout;
        let mut closed = 0;
        for entry in self.entries().values_mut() {
            if entry
                .open
                .as_ref()
                .and_then(|open| open.idle_for())
                .is_some_and(|idle| idle >= idle_timeout)
            {
                entry.open = None;
                closed += 1;
            }
        }
        closed
    }

    /// Closes the open pool unused the longest, but not `keep`'s; returns
    /// whether there was one.
    fn close_least_recent(&self, keep: &str) -> bool {
        let mut entries = self.entries();
        let oldest = entries
            .iter()
            .filter(|(name, _)| name.as_str() != keep)
            .filter_map(|(name, e)| Some((e.open.as_ref()?.idle_for()?, name.clone())))
            .max();
        match oldest {
            Some((_, name)) => {
                if let Some(entry) = entries.get_mut(&name) {
                    entry.open = None;
                }
                true
            }
            None => false,
        }
    }

    /// A handle on one tenant, for a [`Relay`](crate::outbox::Relay) or to
    /// keep; `None` for an unknown name.
    pub fn tenant(&self, name: &str) -> Option<Tenant<T>> {
        self.contains(name).then(|| Tenant {
            name: Arc::from(name),
            tenants: self.clone(),
        })
    }

    /// A connection of tenant `name`'s database, from its pool (opened now
    /// if it is not open). Waits at most
    /// [`checkout_timeout`](Self::checkout_timeout) in all.
    pub async fn connection(&self, name: &str) -> Result<TenantConnection<T>, TenantError> {
        let settings = self.settings();
        let started = Instant::now();
        // Counted from here until dropped: a checkout that fails, or is
        // dropped while it waits, leaves the pool idle again.
        let used = Used(self.open(name, settings, started).await?);
        let left = settings.checkout_timeout.saturating_sub(started.elapsed());
        let guard = match tokio::time::timeout(left, used.0.pool.connection()).await {
            Ok(Ok(guard)) => guard,
            Ok(Err(source)) => {
                return Err(TenantError::Pool {
                    tenant: name.to_owned(),
                    source,
                });
            }
            Err(_) => {
                return Err(TenantError::Pool {
                    tenant: name.to_owned(),
                    source: format!(
                        "the database gave no connection in {:?}",
                        settings.checkout_timeout
                    )
                    .into(),
                });
            }
        };
        Ok(TenantConnection { guard, open: used })
    }

    /// A connection of tenant `name`'s database outside its pool, for the
    /// caller to keep (a relay's `LISTEN`): it takes one connection of
    /// [`max_connections`](Self::max_connections) until dropped, and then
    /// closes (it is never given back to a pool, since it may hold session
    /// state). To make room the set closes the pool idle the longest; it
    /// does not wait for one ([`TenantError::Exhausted`] at once).
    pub(crate) async fn dedicated(&self, name: &str) -> Result<Dedicated<T>, TenantError> {
        let settings = self.settings();
        self.shared.used.store(true, Ordering::Release);
        self.close_idle();
        let url = self
            .url(name)
            .ok_or_else(|| TenantError::Unknown(name.to_owned()))?;
        let budget = self.budget();
        let share = loop {
            match budget.clone().try_acquire_owned() {
                Ok(share) => break share,
                Err(_) if self.close_least_recent(name) => continue,
                Err(_) => {
                    return Err(TenantError::Exhausted {
                        tenant: name.to_owned(),
                        max_connections: settings.max_connections,
                        waited: Duration::ZERO,
                    })
                }
            }
        };
        let pool_error = |source| TenantError::Pool {
            tenant: name.to_owned(),
            source,
        };
        let opening = async {
            let pool = T::open(&url, 1).await?;
            crate::outbox::RelayPool::dedicated(&pool).await
        };
        let connection = tokio::time::timeout(settings.checkout_timeout, opening)
            .await
            .map_err(|_| {
                pool_error(
                    format!(
                        "the database gave no connection in {:?}",
                        settings.checkout_timeout
                    )
                    .into(),
                )
            })?
            .map_err(pool_error)?;
        Ok(Dedicated { connection, share })
    }

    /// Tenant `name`'s open pool, one user more (opened now, within the
    /// connection limit, if it was not).
    async fn open(
        &self,
        name: &str,
        settings: Settings,
        started: Instant,
    ) -> Result<Arc<Open<T>>, TenantError> {
        self.shared.used.store(true, Ordering::Release);
        self.close_idle();
        loop {
            let url = {
                let entries = self.entries();
                let entry = entries
                    .get(name)
                    .ok_or_else(|| TenantError::Unknown(name.to_owned()))?;
                if let Some(open) = &entry.open {
                    open.users.fetch_add(1, Ordering::AcqRel);
                    open.touch();
                    return Ok(open.clone());
                }
                entry.url.clone()
            };
            let budget = self.budget();
            let permits = match budget.clone().try_acquire_many_owned(settings.pool_size) {
                Ok(permits) => permits,
                Err(_) => {
                    if self.close_least_recent(name) {
                        continue;
                    }
                    let left = settings.checkout_timeout.saturating_sub(started.elapsed());
                    if left.is_zero() {
                        return Err(TenantError::Exhausted {
                            tenant: name.to_owned(),
                            max_connections: settings.max_connections,
                            waited: started.elapsed(),
                        });
                    }
                    // A pool in use becomes idle (and closable), or one is
                    // closed: look again soon.
                    match tokio::time::timeout(
                        left.min(Duration::from_millis(50)),
                        budget.acquire_many_owned(settings.pool_size),
                    )
                    .await
                    {
                        Ok(Ok(permits)) => permits,
                        _ => continue,
                    }
                }
            };
            let pool =
                T::open(&url, settings.pool_size)
                    .await
                    .map_err(|source| TenantError::Pool {
                        tenant: name.to_owned(),
                        source,
                    })?;
            let mut entries = self.entries();
            let Some(entry) = entries.get_mut(name) else {
                return Err(TenantError::Unknown(name.to_owned()));
            };
            if entry.url != url {
                // Its URL changed while the pool opened: open the new one.
                continue;
            }
            let open = entry.open.get_or_insert_with(|| {
                Arc::new(Open {
                    pool,
                    users: AtomicUsize::new(0),
                    last_used: Mutex::new(Instant::now()),
                    _permits: permits,
                })
            });
            open.users.fetch_add(1, Ordering::AcqRel);
            open.touch();
            return Ok(open.clone());
        }
    }
}

/// A connection of one tenant's database outside its pool
/// ([`Tenants::dedicated`]): one connection of the set's limit until
/// dropped, when it closes.
pub(crate) struct Dedicated<T: TenantPool> {
    pub(crate) connection: T::Connection,
    /// Its place in the limit, given back when dropped.
    pub(crate) share: OwnedSemaphorePermit,
}
