//! The pool kinds a tenant set opens: deadpool's, and bb8's (feature
//! `bb8`).

use crate::outbox::RelayPool;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, PoolableConnection};
use std::future::Future;

/// A pool kind a [`Tenants`](super::Tenants) set opens for each tenant: a diesel-async
/// deadpool [`Pool`](diesel_async::pooled_connection::deadpool::Pool) or
/// (feature `bb8`) bb8 pool of an `AsyncPgConnection`,
/// `AsyncMysqlConnection` or `SyncConnectionWrapper<SqliteConnection>`.
/// Sealed.
pub trait TenantPool: RelayPool + Sized + 'static {
    /// A pool of at most `size` connections to `url`, which opens none
    /// until asked.
    #[doc(hidden)]
    fn open(
        url: &str,
        size: u32,
    ) -> impl Future<Output = Result<Self, Box<dyn std::error::Error + Send + Sync + 'static>>> + Send;

    /// Closes a connection whose work was dropped mid-way (a delivery past
    /// its time limit) instead of giving it back: its server session ends,
    /// rolling back what it had open, and no later checkout can read an
    /// answer that was meant for the dropped statement.
    #[doc(hidden)]
    fn discard(guard: Self::Guard);
}

impl<C> TenantPool for diesel_async::pooled_connection::deadpool::Pool<C>
where
    C: PoolableConnection + inbox_runtime::AsyncInboxConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    async fn open(
        url: &str,
        size: u32,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync + 'static>> {
        let manager = AsyncDieselConnectionManager::<C>::new(url);
        Ok(Self::builder(manager).max_size(size as usize).build()?)
    }

    fn discard(guard: Self::Guard) {
        // Out of the pool, then dropped: the connection closes now.
        drop(diesel_async::pooled_connection::deadpool::Object::<C>::take(guard));
    }
}

#[cfg(feature = "bb8")]
impl<C> TenantPool for diesel_async::pooled_connection::bb8::Pool<C>
where
    C: PoolableConnection + inbox_runtime::AsyncInboxConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    async fn open(
        url: &str,
        size: u32,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync + 'static>> {
        let manager = AsyncDieselConnectionManager::<C>::new(url);
        Ok(Self::builder().max_size(size).build(manager).await?)
    }

    fn discard(mut guard: Self::Guard) {
        // bb8 closes a connection given back broken, at once.
        use diesel_async::{AsyncConnection, TransactionManager};
        <C as AsyncConnection>::TransactionManager::transaction_manager_status_mut(&mut guard)
            .set_in_error();
        drop(guard);
    }
}
