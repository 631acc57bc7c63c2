//! Where a [`Relay`](super::Relay) takes its database connections from:
//! a diesel-async deadpool or bb8 pool ([`RelayPool`], sealed).

use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::PoolableConnection;
use inbox_runtime::AsyncInboxConnection;
use std::future::Future;
use std::ops::DerefMut;

/// Where a [`Relay`](super::Relay) takes its database connections from: a diesel-async
/// deadpool [`Pool`] of an [`AsyncInboxConnection`] (`AsyncPgConnection`,
/// `AsyncMysqlConnection`, `SyncConnectionWrapper<SqliteConnection>`).
/// Sealed.
pub trait RelayPool: Send + Sync + sealed::Sealed {
    /// The connection.
    #[doc(hidden)]
    type Connection: AsyncInboxConnection;
    /// A connection checked out of the pool.
    #[doc(hidden)]
    type Guard: DerefMut<Target = Self::Connection> + Send;
    /// A connection, or why there is none.
    #[doc(hidden)]
    fn connection(
        &self,
    ) -> impl Future<Output = Result<Self::Guard, Box<dyn std::error::Error + Send + Sync + 'static>>>
           + Send;
    /// A connection of the relay's own, outside the pool (its `LISTEN`).
    #[doc(hidden)]
    fn dedicated(
        &self,
    ) -> impl Future<
        Output = Result<Self::Connection, Box<dyn std::error::Error + Send + Sync + 'static>>,
    > + Send;
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

impl<C> sealed::Sealed for Pool<C>
where
    C: PoolableConnection + AsyncInboxConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
}

impl<C> RelayPool for Pool<C>
where
    C: PoolableConnection + AsyncInboxConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    type Connection = C;
    type Guard = diesel_async::pooled_connection::deadpool::Object<C>;

    async fn connection(
        &self,
    ) -> Result<Self::Guard, Box<dyn std::error::Error + Send + Sync + 'static>> {
        Ok(self.get().await?)
    }

    /// A connection taken out of the pool for good (the pool may open
    /// another in its place).
    async fn dedicated(
        &self,
    ) -> Result<Self::Connection, Box<dyn std::error::Error + Send + Sync + 'static>> {
        Ok(diesel_async::pooled_connection::deadpool::Object::take(
            self.get().await?,
        ))
    }
}

/// A bb8 pool (feature `bb8`).
#[cfg(feature = "bb8")]
impl<C> sealed::Sealed for diesel_async::pooled_connection::bb8::Pool<C>
where
    C: PoolableConnection + AsyncInboxConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
}

#[cfg(feature = "bb8")]
impl<C> RelayPool for diesel_async::pooled_connection::bb8::Pool<C>
where
    C: PoolableConnection + AsyncInboxConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    type Connection = C;
    type Guard = diesel_async::pooled_connection::bb8::PooledConnection<'static, C>;

    async fn connection(
        &self,
    ) -> Result<Self::Guard, Box<dyn std::error::Error + Send + Sync + 'static>> {
        Ok(self.get_owned().await?)
    }

    async fn dedicated(
        &self,
    ) -> Result<Self::Connection, Box<dyn std::error::Error + Send + Sync + 'static>> {
        Ok(self.dedicated_connection().await?)
    }
}
