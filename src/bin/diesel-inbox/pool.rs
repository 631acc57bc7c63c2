//! A diesel-async pool on the database a URL names, for the commands that
//! run on one (`outbox relay`, `console`), and the signal that stops them.

use crate::database::Backend;
use crate::Failure;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, PoolableConnection};
use diesel_inbox::outbox::RelayPool;
use diesel_inbox::AsyncInboxConnection;
use std::process::ExitCode;

/// What runs on the pool, whatever its backend.
pub(crate) trait OnPool {
    async fn run<D: RelayPool + 'static>(self, pool: D) -> Result<ExitCode, Failure>;
}

/// A pool of at most `size` `C`s on `url`.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn pool<C>(url: &str, size: usize) -> Result<Pool<C>, Failure>
where
    C: PoolableConnection + AsyncInboxConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    Pool::builder(AsyncDieselConnectionManager::<C>::new(url))
        .max_size(size)
        .build()
        .map_err(|e| Failure(format!("no connection pool: {e}")))
}

/// Runs `work` on a pool of at most `size` connections to `url`.
pub(crate) async fn with_pool<W: OnPool>(
    url: &str,
    size: usize,
    work: W,
) -> Result<ExitCode, Failure> {
    let _ = (size, &work);
    match Backend::of(url)? {
        #[cfg(feature = "postgres")]
        Backend::Postgres => {
            work.run(pool::<diesel_async::AsyncPgConnection>(url, size)?)
                .await
        }
        #[cfg(feature = "mysql")]
        Backend::Mysql => {
            work.run(pool::<diesel_async::AsyncMysqlConnection>(url, size)?)
                .await
        }
        #[cfg(feature = "sqlite")]
        Backend::Sqlite(path) => {
            type Sqlite = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<
                diesel::SqliteConnection,
            >;
            work.run(pool::<Sqlite>(path, size)?).await
        }
        #[allow(unreachable_patterns)]
        _ => Err(Failure(
            "this diesel-inbox was built without this database's feature".into(),
        )),
    }
}

/// Resolves at SIGTERM or Ctrl-C.
pub(crate) async fn stop() {
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
