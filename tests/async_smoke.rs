#![cfg(all(feature = "async", feature = "sqlite"))]
use diesel::prelude::*;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::AsyncConnection;
use diesel_inbox::{idempotent, Processed};

type Conn = SyncConnectionWrapper<SqliteConnection>;

#[idempotent(key = "id")]
async fn handle(conn: &mut Conn, id: i64) -> QueryResult<i64> {
    let _ = conn;
    tokio::task::yield_now().await;
    Ok(id * 2)
}

#[idempotent(batch = "ids", key = "|i| *i")]
async fn handle_batch(conn: &mut Conn, ids: &[i64]) -> QueryResult<usize> {
    let _ = conn;
    Ok(ids.len())
}

#[tokio::test(flavor = "multi_thread")]
async fn smoke() {
    let mut conn = Conn::establish(":memory:").await.unwrap();
    diesel_inbox::migrate_async(&mut conn).await.unwrap();
    assert_eq!(handle(&mut conn, 1).await.unwrap(), Processed::Applied(2));
    assert_eq!(handle(&mut conn, 1).await.unwrap(), Processed::Duplicate);
    let b = handle_batch(&mut conn, &[1, 2, 2]).await.unwrap();
    assert_eq!((b.value, b.applied, b.duplicates), (Some(2), vec![0, 1], 1));
    let handle = tokio::spawn(async move {
        let mut conn = Conn::establish(":memory:").await.unwrap();
        diesel_inbox::migrate_async(&mut conn).await.unwrap();
        handle(&mut conn, 5).await
    });
    assert_eq!(handle.await.unwrap().unwrap(), Processed::Applied(10));
}
