//! Async pools for the harnesses that run servers (HTTP) or consumers
//! (Kafka) on each backend.
#![cfg(feature = "async")]

use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, PoolableConnection,
};

/// A deadpool pool of at most `size` connections `C` on `url`.
pub fn deadpool<C>(url: String, size: usize) -> Result<Pool<C>, String>
where
    C: PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    deadpool_with(url, size, ManagerConfig::default())
}

/// [`deadpool`] with the connections made and recycled as `config` says.
pub fn deadpool_with<C>(
    url: String,
    size: usize,
    config: ManagerConfig<C>,
) -> Result<Pool<C>, String>
where
    C: PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    Pool::builder(AsyncDieselConnectionManager::<C>::new_with_config(
        url, config,
    ))
    .max_size(size)
    .build()
    .map_err(|e| e.to_string())
}
