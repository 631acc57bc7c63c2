// Every async operation takes what handlers take: the connection itself,
// and a pooled one from deadpool or bb8 (`&mut pooled`), with no `*`.
use diesel_async::pooled_connection::{bb8, deadpool};
use diesel_async::AsyncPgConnection;
use diesel_inbox::{
    attempts_async, forget_async, migrate_async, purge_async, stats_async, status_async, Purge,
};
use std::time::Duration;

async fn every_operation(
    conn: &mut AsyncPgConnection,
    deadpooled: &mut deadpool::Object<AsyncPgConnection>,
    bb8ed: &mut bb8::PooledConnection<'_, AsyncPgConnection>,
) -> Result<(), diesel_inbox::InboxError> {
    let day = Duration::from_secs(86_400);
    migrate_async(conn).await?;
    migrate_async(deadpooled).await?;
    migrate_async(bb8ed).await?;
    status_async(deadpooled, "billing", "m-1").await?;
    attempts_async(deadpooled, "billing", "m-1").await?;
    forget_async(deadpooled, "billing", "m-1").await?;
    stats_async(deadpooled).await?;
    purge_async(deadpooled, day, 1_000).await?;
    Purge::new(day).run_async(deadpooled).await?;
    Purge::new(day).count_async(bb8ed).await?;
    status_async(bb8ed, "billing", "m-1").await?;
    status_async(&mut **deadpooled, "billing", "m-1").await?;
    Ok(())
}

// A generic caller over the connection type still works.
async fn generic<C: diesel_inbox::AsyncInboxConnection>(conn: &mut C) {
    let _ = migrate_async(conn).await;
}

pub fn main() {
    let _ = every_operation;
    let _ = generic::<AsyncPgConnection>;
}
