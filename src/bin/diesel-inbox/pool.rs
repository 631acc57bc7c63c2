//! A diesel-async pool on the database a URL names, for the commands that
//! run on one (`outbox relay`, `console`), the tenant set of `--tenants`
//! for the same commands over every tenant, and the signal that stops
//! them.

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

/// What runs on a tenant set, whatever its backend.
#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "console"
))]
pub(crate) trait OnTenants {
    async fn run<T>(self, tenants: diesel_inbox::tenants::Tenants<T>) -> Result<ExitCode, Failure>
    where
        T: diesel_inbox::tenants::TenantPool,
        T::Guard: 'static;
}

/// `work` on the tenant set `source` lists (`--tenants`), its pools of
/// `pool_size` connections on the first tenant's backend. The set reads
/// `source` again when it refreshes; a list whose tenants are then on
/// another backend fails the refresh.
#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "console"
))]
pub(crate) async fn with_tenants<W: OnTenants>(
    source: &str,
    pool_size: u32,
    work: W,
) -> Result<ExitCode, Failure> {
    let listed = crate::tenants::read(source)?;
    let kind = crate::tenants::one_backend(&listed)?;
    let _ = (&work, pool_size);
    match Backend::of(&listed[0].1)? {
        #[cfg(feature = "postgres")]
        Backend::Postgres => {
            work.run(set::<Pool<diesel_async::AsyncPgConnection>>(
                source, kind, pool_size,
            ))
            .await
        }
        #[cfg(feature = "mysql")]
        Backend::Mysql => {
            work.run(set::<Pool<diesel_async::AsyncMysqlConnection>>(
                source, kind, pool_size,
            ))
            .await
        }
        #[cfg(feature = "sqlite")]
        Backend::Sqlite(_) => {
            type Sqlite = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<
                diesel::SqliteConnection,
            >;
            work.run(set::<Pool<Sqlite>>(source, kind, pool_size)).await
        }
        #[allow(unreachable_patterns)]
        _ => Err(Failure(
            "this diesel-inbox was built without the tenants' database feature".into(),
        )),
    }
}

/// The tenant set of `source`, every tenant on `kind`'s backend.
#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "console"
))]
fn set<T: diesel_inbox::tenants::TenantPool>(
    source: &str,
    kind: crate::tenants::Kind,
    pool_size: u32,
) -> diesel_inbox::tenants::Tenants<T> {
    let source = source.to_owned();
    diesel_inbox::tenants::Tenants::from_fn(move || {
        let source = source.clone();
        async move {
            let listed = tokio::task::spawn_blocking(move || {
                let listed = crate::tenants::read(&source)?;
                if !listed.is_empty() && crate::tenants::one_backend(&listed)? != kind {
                    return Err(Failure(
                        "the tenants are now on another backend than at start: one process serves one backend".into(),
                    ));
                }
                // A SQLite tenant's pool opens the file's path.
                Ok(listed
                    .into_iter()
                    .map(|(name, url)| match Backend::of(&url) {
                        Ok(Backend::Sqlite(path)) => {
                            let path = path.to_owned();
                            (name, path)
                        }
                        _ => (name, url),
                    })
                    .collect::<Vec<_>>())
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|Failure(e)| e)?;
            Ok(listed)
        }
    })
    .pool_size(pool_size)
}
