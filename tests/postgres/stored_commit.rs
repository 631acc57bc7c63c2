//! The PostgreSQL suite's tests of the stored result's write and the
//! commit behind it on the async path (`tests/postgres.rs`, module
//! `stored_commit`): the commit never overtakes a write that is still
//! being prepared, so no call fails for it, whatever happened to the
//! connection's statement cache before.

use crate::suite::{fresh, open};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use diesel_inbox::{ErrorClass, Inbox, InboxError, Stored};

fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    diesel::select(diesel::dsl::sql::<BigInt>(&format!("({sql})")))
        .get_result(conn)
        .expect("count")
}

/// A fresh schema with the inbox and a business table, its URL and a
/// sync connection to check rows with.
fn setup(test: &str) -> Option<(crate::common::TestDb, PgConnection)> {
    let db = fresh(test)?;
    let mut conn = open(&db);
    diesel_inbox::migrate(&mut conn).expect("migrate");
    conn.batch_execute("CREATE TABLE stored_orders (key TEXT PRIMARY KEY)")
        .expect("business table");
    Some((db, conn))
}

/// A `store_result` call whose body writes the business row of `key`
/// and returns 7; with `go_on`, the body then runs a statement that
/// fails and ignores the error (on PostgreSQL that aborts the
/// transaction, so the stored result's write fails to prepare).
async fn stored(
    conn: &mut AsyncPgConnection,
    key: &str,
    go_on: bool,
) -> Result<Stored<u32>, InboxError> {
    Inbox::consumer("stored-commit")
        .retries(0)
        .classify(|_: &InboxError| ErrorClass::permanent())
        .store_result()
        .run_async(conn, key, async |conn: &mut AsyncPgConnection| {
            let insert = diesel::sql_query("INSERT INTO stored_orders (key) VALUES ($1)")
                .bind::<Text, _>(key);
            diesel_async::RunQueryDsl::execute(insert, &mut *conn).await?;
            if go_on {
                let failing = diesel::sql_query("SELECT 1 / 0");
                let _ignored = diesel_async::RunQueryDsl::execute(failing, conn).await;
            }
            Ok(7u32)
        })
        .await
}

/// Whether `key` is committed: its business row and its inbox row with
/// the stored result, both or neither.
fn committed(sync: &mut PgConnection, key: &str) -> bool {
    let business = count(
        sync,
        &format!("SELECT count(*) FROM stored_orders WHERE key = '{key}'"),
    );
    let inbox = count(
        sync,
        &format!(
            "SELECT count(*) FROM inbox_messages \
             WHERE message_id = '{key}' AND result IS NOT NULL"
        ),
    );
    assert_eq!(business, inbox, "{key}: body and stored result together");
    business == 1
}

/// The connection's first stored result fails to prepare (its body went
/// on after a failed statement, so the transaction is aborted): nothing
/// was cached, and the next call's write is prepared again, with its
/// commit sent only after it. Every later call applies.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn a_write_that_failed_to_prepare_does_not_fail_the_next_call() {
    let Some((db, mut sync)) = setup("stored_commit_prepare") else {
        return;
    };
    crate::common::modes::runtime().block_on(async {
        let mut conn = AsyncPgConnection::establish(&db).await.expect("connect");
        let failed = stored(&mut conn, "p0", true).await;
        assert!(failed.is_err(), "an aborted body is an error: {failed:?}");
        for key in ["p1", "p2", "p3"] {
            let outcome = stored(&mut conn, key, false).await;
            assert!(
                matches!(outcome, Ok(Stored::Applied(7))),
                "{key}: {outcome:?}"
            );
        }
    });
    assert!(
        !committed(&mut sync, "p0"),
        "the aborted call commits nothing"
    );
    for key in ["p1", "p2", "p3"] {
        assert!(committed(&mut sync, key), "{key} applied");
    }
}

/// The statement cache dropped after the write was cached (by setting
/// its size): the write is prepared again, with its commit behind it,
/// so every call applies, with the cache disabled and enabled again.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn stored_results_apply_after_the_statement_cache_is_resized() {
    use diesel::connection::CacheSize;
    let Some((db, mut sync)) = setup("stored_commit_cache") else {
        return;
    };
    let keys = ["c0", "c1", "c2", "c3", "c4", "c5"];
    crate::common::modes::runtime().block_on(async {
        let mut conn = AsyncPgConnection::establish(&db).await.expect("connect");
        for (i, key) in keys.into_iter().enumerate() {
            match i {
                2 => conn.set_prepared_statement_cache_size(CacheSize::Disabled),
                4 => conn.set_prepared_statement_cache_size(CacheSize::Unbounded),
                _ => {}
            }
            let outcome = stored(&mut conn, key, false).await;
            assert!(
                matches!(outcome, Ok(Stored::Applied(7))),
                "{key}: {outcome:?}"
            );
        }
    });
    for key in keys {
        assert!(committed(&mut sync, key), "{key} applied");
    }
}
