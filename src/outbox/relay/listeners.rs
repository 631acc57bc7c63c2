//! The `LISTEN` connections of a relay over tenants ([`TenantRelay`](super::TenantRelay)):
//! PostgreSQL notifies per database, so each tenant database heard takes a
//! connection of its own, kept outside the tenant's pool and counted in
//! the set's connection limit. At most [`Listeners::limit`] are open at
//! once: a tenant whose turn ends takes a free place, or the place of the
//! tenant that has found nothing the longest (for at least
//! [`HOLD`]) when its own turn found messages. The others poll.

use super::wakeups::{hear, Deaf, Doze, PROBE_WAIT};
use super::RelayError;
use crate::tenants::{TenantPool, Tenants};
use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};
use inbox_runtime::outbox as steps;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// How long a listened tenant that found nothing keeps its place against
/// a tenant that found messages.
pub(super) const HOLD: Duration = Duration::from_secs(10);

type Hearing = Abortable<Pin<Box<dyn Future<Output = (Arc<str>, u64)> + Send>>>;

/// The tenants listened to, and their listeners' futures (polled by the
/// relay loop through [`deaf`](Listeners::deaf)).
pub(super) struct Listeners {
    /// The most open at once.
    pub(super) limit: usize,
    by_tenant: BTreeMap<Arc<str>, Listener>,
    running: FuturesUnordered<Hearing>,
    /// Tenants whose database no notification reaches: not tried again.
    deaf: BTreeSet<Arc<str>>,
    /// Told at each notification (the flags say whose).
    rung: Arc<tokio::sync::Notify>,
    ids: u64,
}

struct Listener {
    id: u64,
    /// The tenant's database URL when it opened: a tenant moved to
    /// another database is listened to there instead.
    url: String,
    abort: AbortHandle,
    heard: Arc<AtomicBool>,
    /// When a turn of its tenant last found messages (or it was listened to).
    active: Instant,
}

impl Listeners {
    /// Listeners for `limit` tenant databases at most (none where the
    /// connection `C` has no notifications).
    pub(super) fn new<C: inbox_runtime::AsyncInboxConnection>(limit: usize) -> Self {
        Self::up_to(if steps::notifies::<C>() { limit } else { 0 })
    }

    fn up_to(limit: usize) -> Self {
        Listeners {
            limit,
            by_tenant: BTreeMap::new(),
            running: FuturesUnordered::new(),
            deaf: BTreeSet::new(),
            rung: Arc::new(tokio::sync::Notify::new()),
            ids: 0,
        }
    }

    /// No listeners (`run_once`).
    pub(super) fn none() -> Self {
        Listeners::up_to(0)
    }

    /// The listener of `name` now, if any: its id.
    pub(super) fn of(&self, name: &str) -> Option<u64> {
        self.by_tenant.get(name).map(|l| l.id)
    }

    /// After a turn of `name` (`found`: it claimed messages): listens to
    /// its database if there is room, or if it found messages and a
    /// listened tenant has found none for [`HOLD`]: that one's listener
    /// closes, and its name is in `evicted` (the relay makes it due: a
    /// notification it had heard is read no more). Returns the relay
    /// loop's side of the new listener.
    pub(super) fn offer<T: TenantPool>(
        &mut self,
        tenants: &Tenants<T>,
        name: &Arc<str>,
        found: bool,
        poll_interval: Duration,
        evicted: &mut Option<Arc<str>>,
    ) -> Option<(u64, Doze)> {
        let now = Instant::now();
        if let Some(listener) = self.by_tenant.get_mut(name) {
            if found {
                listener.active = now;
            }
            return None;
        }
        if self.limit == 0 || self.deaf.contains(name) {
            return None;
        }
        let url = tenants.url(name)?;
        if self.by_tenant.len() >= self.limit {
            let oldest = self
                .by_tenant
                .iter()
                .min_by_key(|(_, l)| l.active)
                .filter(|(_, l)| found && now.duration_since(l.active) >= HOLD)
                .map(|(n, _)| n.clone())?;
            self.remove(&oldest);
            *evicted = Some(oldest);
        }
        self.ids += 1;
        let id = self.ids;
        let heard = Arc::new(AtomicBool::new(false));
        let (doze, mut asked) = Doze::new();
        let (abort, registration) = AbortHandle::new_pair();
        let (tenants, tenant, flag, rung) = (
            tenants.clone(),
            name.clone(),
            heard.clone(),
            self.rung.clone(),
        );
        let span = tracing::info_span!(target: crate::TRACING_TARGET, "diesel_inbox.outbox.tenant", tenant = %name);
        let listening = async move {
            let open = || async {
                let pool_error = |e: crate::tenants::TenantError| RelayError::Pool(e.into());
                let mut kept = tenants.dedicated(&tenant).await.map_err(pool_error)?;
                let mut notifier = tenants.connection(&tenant).await.map_err(pool_error)?;
                let how =
                    steps::listen_async(&mut kept.connection, &mut *notifier, PROBE_WAIT).await?;
                Ok((kept.connection, kept.share, how))
            };
            let ring = || {
                flag.store(true, Ordering::Release);
                rung.notify_one();
            };
            match hear(open, ring, &mut asked, poll_interval).await {
                Deaf::Polls | Deaf::Unreachable => (tenant, id),
            }
        }
        .instrument(span);
        let boxed: Pin<Box<dyn Future<Output = (Arc<str>, u64)> + Send>> = Box::pin(listening);
        self.running.push(Abortable::new(boxed, registration));
        self.by_tenant.insert(
            name.clone(),
            Listener {
                id,
                url,
                abort,
                heard,
                active: now,
            },
        );
        Some((id, doze))
    }

    /// Closes `name`'s listener, if any (its connection closes, and with
    /// it the lock that made enqueues notify), and forgets that it was
    /// deaf (a tenant removed, or moved to another database).
    pub(super) fn remove(&mut self, name: &str) {
        if let Some(listener) = self.by_tenant.remove(name) {
            listener.abort.abort();
        }
        self.deaf.remove(name);
    }

    /// Closes the listeners of tenants whose URL is no longer the one
    /// they listen on (moved to another database; removed); returns
    /// their names, for the relay to make them due.
    pub(super) fn follow<T: TenantPool>(&mut self, tenants: &Tenants<T>) -> Vec<Arc<str>> {
        let moved: Vec<Arc<str>> = self
            .by_tenant
            .iter()
            .filter(|(name, l)| !tenants.has_url(name, &l.url))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &moved {
            self.remove(name);
        }
        moved
    }

    /// What is told at each notification: then [`heard`](Self::heard)
    /// says whose.
    pub(super) fn bell(&self) -> Arc<tokio::sync::Notify> {
        self.rung.clone()
    }

    /// The tenants notified since the last call.
    pub(super) fn heard(&self) -> Vec<Arc<str>> {
        self.by_tenant
            .iter()
            .filter(|(_, l)| l.heard.swap(false, Ordering::AcqRel))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Drives the listeners; resolves with a tenant whose database no
    /// notification reaches (said at WARN by its listener), whose place
    /// is then free. Pending while there is none.
    pub(super) async fn deaf(&mut self) -> Arc<str> {
        loop {
            match self.running.next().await {
                Some(Ok((name, id))) => {
                    if self.of(&name) == Some(id) {
                        self.by_tenant.remove(&name);
                        self.deaf.insert(name.clone());
                        return name;
                    }
                }
                // Closed by `remove`.
                Some(Err(_)) => {}
                None => std::future::pending::<()>().await,
            }
        }
    }
}
