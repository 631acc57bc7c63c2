//! A tenant's handle ([`Tenant`]), a connection checked out of its pool
//! ([`TenantConnection`]), and a runner's way to the tenant a message names.

use super::{Open, TenantError, TenantPool, Tenants};
use crate::outbox::RelayPool;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Where a runner over tenants reads a message's tenant
/// (`Consumer::tenant_by`).
#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "sqs"
))]
pub(crate) type TenantOf = dyn Fn(&crate::brokers::Message<'_>) -> Option<String> + Send + Sync;

/// The tenant `m` names (`tenant_of`, else its [`TENANT_HEADER`]), for a
/// runner over tenants: none is
/// [`InboxError::UnknownTenant`](crate::InboxError::UnknownTenant)
/// (dead-lettered).
#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "sqs"
))]
pub(crate) fn tenant_named(
    tenant_of: Option<&TenantOf>,
    m: &crate::brokers::Message<'_>,
) -> Result<Arc<str>, crate::InboxError> {
    let name = match tenant_of {
        Some(tenant_of) => tenant_of(m),
        None => m
            .header(super::TENANT_HEADER)
            .and_then(|value| std::str::from_utf8(value).ok())
            .map(str::to_owned),
    };
    match name.filter(|n| !n.is_empty()) {
        Some(name) => Ok(name.into()),
        None => Err(crate::InboxError::UnknownTenant { tenant: None }),
    }
}

/// A connection of the tenant `name`, for a runner over tenants: an
/// unknown tenant is
/// [`InboxError::UnknownTenant`](crate::InboxError::UnknownTenant)
/// (dead-lettered), no connection
/// [`InboxError::TenantUnavailable`](crate::InboxError::TenantUnavailable)
/// (redelivered). A tenant the set does not know is looked up again in
/// the set's source ([`Tenants::refresh`]) before it is called unknown: a
/// tenant added since the set was read is not dead-lettered; a source
/// that cannot be read leaves the message to be redelivered.
#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "sqs"
))]
pub(crate) async fn connection_named<T: TenantPool>(
    tenants: &Tenants<T>,
    name: &str,
) -> Result<TenantConnection<T>, crate::InboxError> {
    let unavailable = |reason: String| crate::InboxError::TenantUnavailable {
        tenant: name.into(),
        reason: reason.into(),
    };
    let first = match tenants.connection(name).await {
        Err(TenantError::Unknown(_)) if tenants.reads_a_source() => {
            let wait = tenants.checkout_timeout_now();
            match tokio::time::timeout(wait, tenants.refresh()).await {
                Ok(Ok(_)) => tenants.connection(name).await,
                Ok(Err(e)) => {
                    return Err(unavailable(format!(
                        "not in the tenant set, whose source could not be read again: {e}"
                    )))
                }
                Err(_) => {
                    return Err(unavailable(format!(
                        "not in the tenant set, whose source did not answer within {wait:?}"
                    )))
                }
            }
        }
        other => other,
    };
    first.map_err(|e| match e {
        TenantError::Unknown(tenant) => crate::InboxError::UnknownTenant {
            tenant: Some(tenant.into()),
        },
        e => unavailable(e.to_string()),
    })
}

/// A connection of one tenant's database, checked out of its pool; returned
/// to it when dropped. Derefs to the connection.
pub struct TenantConnection<T: TenantPool> {
    // Returned to the pool before the pool's share of the limit is.
    pub(super) guard: T::Guard,
    pub(super) open: Used<T>,
}

impl<T: TenantPool> TenantConnection<T> {
    /// Closes the connection instead of giving it back to its pool
    /// ([`TenantPool::discard`]): for one whose work was dropped mid-way.
    #[cfg(any(
        feature = "lapin",
        feature = "nats",
        feature = "kafka",
        feature = "sqs"
    ))]
    pub(crate) fn discard(self) {
        let TenantConnection { guard, open } = self;
        T::discard(guard);
        drop(open);
    }
}

/// One user of an open pool, counted until dropped.
pub(super) struct Used<T>(pub(super) Arc<Open<T>>);

impl<T> Drop for Used<T> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.users.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<T: TenantPool> Deref for TenantConnection<T> {
    type Target = T::Connection;
    fn deref(&self) -> &T::Connection {
        &self.guard
    }
}

impl<T: TenantPool> DerefMut for TenantConnection<T> {
    fn deref_mut(&mut self) -> &mut T::Connection {
        &mut self.guard
    }
}

impl<T: TenantPool> std::fmt::Debug for TenantConnection<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantConnection")
            .field("pool_users", &self.open.0.users.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// One tenant of a [`Tenants`] set: its connections come from its pool in
/// the set. A [`Relay`](crate::outbox::Relay) takes its connections from it.
pub struct Tenant<T: TenantPool> {
    pub(super) name: Arc<str>,
    pub(super) tenants: Tenants<T>,
}

impl<T: TenantPool> Clone for Tenant<T> {
    fn clone(&self) -> Self {
        Tenant {
            name: self.name.clone(),
            tenants: self.tenants.clone(),
        }
    }
}

impl<T: TenantPool> std::fmt::Debug for Tenant<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant").field("name", &self.name).finish()
    }
}

impl<T: TenantPool> Tenant<T> {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A connection of its database: [`Tenants::connection`].
    pub async fn connection(&self) -> Result<TenantConnection<T>, TenantError> {
        self.tenants.connection(&self.name).await
    }
}

impl<T: TenantPool> crate::outbox::pool::sealed::Sealed for Tenant<T> {}

impl<T: TenantPool> RelayPool for Tenant<T>
where
    T::Guard: 'static,
{
    type Connection = T::Connection;
    type Guard = TenantConnection<T>;

    async fn connection(
        &self,
    ) -> Result<Self::Guard, Box<dyn std::error::Error + Send + Sync + 'static>> {
        Ok(self.tenants.connection(&self.name).await?)
    }

    /// A tenant's connections all come from its pool, within the set's
    /// limit: none is taken out for good.
    async fn dedicated(
        &self,
    ) -> Result<Self::Connection, Box<dyn std::error::Error + Send + Sync + 'static>> {
        Err(format!(
            "diesel-inbox: tenant {:?}: a tenant's connections stay in its pool",
            self.name
        )
        .into())
    }
}
