//! The wake-up protocol of the outbox across processes (the runtime's
//! `outbox::notify`): an enqueue notifies only while a relay sleeps, and
//! a relay going to sleep waits for the transactions that may have
//! enqueued without notifying. Each step on a real server, in a database
//! of its own (notifications are per database).

use crate::common;
use common::backend::TestBackend;
use common::backends::postgres::Postgres;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use diesel_inbox::outbox::{self, Outgoing};
use inbox_runtime::outbox::{
    asleep_async, awake_async, listen_async, notified_async, settled_async, Listening,
};
use std::time::Duration;

/// Whether a notification reaches `listener` within `wait`.
async fn notified(listener: &mut AsyncPgConnection, wait: Duration) -> bool {
    match tokio::time::timeout(wait, notified_async(listener)).await {
        Ok(result) => {
            result.expect("the listening connection");
            true
        }
        Err(_) => false,
    }
}

fn enqueue(conn: &mut PgConnection, body: &str) {
    conn.transaction(|conn| {
        outbox::enqueue(conn, Outgoing::new("wakeups", body)).map_err(diesel::result::Error::from)
    })
    .expect("enqueue");
}

#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn an_enqueue_notifies_only_while_a_relay_sleeps_and_none_is_missed() {
    let Some(server) = Postgres::prepare("wakeups") else {
        return;
    };
    fn discard(url: &str) {
        let (server, name) = url.rsplit_once('/').expect("a URL with a database");
        let _ = Postgres::open(&format!("{server}/postgres"))
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    }
    let name = common::unique_identifier("wakeups");
    Postgres::open(&server.url)
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create database");
    let (base, _) = server.url.rsplit_once('/').expect("a URL with a database");
    let db = common::TestDb::owned(format!("{base}/{name}"), discard);
    let mut conn = Postgres::open(&db.url);
    diesel_inbox::migrate(&mut conn).expect("migrate");
    let runtime = common::modes::runtime();
    let quiet = Duration::from_millis(500);
    let (mut listener, mut notifier) = runtime.block_on(async {
        let listener = AsyncPgConnection::establish(&db.url)
            .await
            .expect("listener");
        let notifier = AsyncPgConnection::establish(&db.url)
            .await
            .expect("notifier");
        (listener, notifier)
    });
    let how = runtime
        .block_on(listen_async(
            &mut listener,
            &mut notifier,
            Duration::from_secs(5),
        ))
        .expect("listen");
    assert_eq!(how, Listening::Notified);

    // No relay sleeps: a commit that enqueued does not notify.
    enqueue(&mut conn, "while no relay sleeps");
    assert!(
        !runtime.block_on(notified(&mut listener, quiet)),
        "an enqueue notified while no relay slept"
    );

    // A transaction enqueues (no relay sleeps: it will not notify), and
    // the relay goes to sleep before it commits: the relay is told that a
    // transaction is still in progress, and told it ended after its
    // commit, so that its last pass comes after it.
    let mut snapshot = String::new();
    conn.transaction(|conn| {
        outbox::enqueue(conn, Outgoing::new("wakeups", "straggler"))
            .map_err(diesel::result::Error::from)?;
        let asleep = runtime
            .block_on(asleep_async(&mut listener, false, &mut snapshot))
            .expect("asleep");
        assert_eq!(
            asleep,
            Some(false),
            "the enqueuing transaction is unsettled"
        );
        let settled = runtime
            .block_on(settled_async(&mut listener, &snapshot))
            .expect("settled");
        assert!(!settled, "the enqueuing transaction is still in progress");
        Ok::<_, diesel::result::Error>(())
    })
    .expect("the straggler's transaction");
    // The snapshot is the server's: transactions of other databases in
    // progress when it was taken (the other suites beside this one in CI)
    // must end too, as a relay's backoff waits for them.
    let began = std::time::Instant::now();
    while !runtime
        .block_on(settled_async(&mut listener, &snapshot))
        .expect("settled")
    {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the straggler committed, and the snapshot's transactions did not all end within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !runtime.block_on(notified(&mut listener, quiet)),
        "the straggler probed before the relay slept: it did not notify"
    );

    // The relay sleeps: every enqueue notifies at its commit.
    for n in 0..3 {
        enqueue(&mut conn, &format!("while the relay sleeps {n}"));
        assert!(
            runtime.block_on(notified(&mut listener, Duration::from_secs(5))),
            "an enqueue did not notify a sleeping relay"
        );
    }
    // Asked again while asleep, it keeps its one lock.
    let again = runtime
        .block_on(asleep_async(&mut listener, true, &mut snapshot))
        .expect("asleep");
    assert!(again.is_some());

    // Awake again: no notification.
    runtime.block_on(awake_async(&mut listener)).expect("awake");
    enqueue(&mut conn, "while the relay is awake");
    assert!(
        !runtime.block_on(notified(&mut listener, quiet)),
        "an enqueue notified an awake relay"
    );

    // An exclusive holder of the lock (an enqueue's probe holds it for
    // one expression): the relay's wait for it is bounded, it polls
    // instead, and the bound was its transaction's alone: its session
    // keeps the server's `lock_timeout` and `synchronous_commit`.
    conn.batch_execute(
        "SELECT pg_advisory_lock(1684627297, \
         CAST(CAST(CAST('outbox_messages' AS regclass) AS oid) AS integer))",
    )
    .expect("hold the lock");
    let started = std::time::Instant::now();
    let refused = runtime
        .block_on(asleep_async(&mut listener, false, &mut snapshot))
        .expect("asleep");
    assert_eq!(refused, None, "the lock was not free: the relay polls");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the lock wait was not bounded: {:?}",
        started.elapsed()
    );
    conn.batch_execute(
        "SELECT pg_advisory_unlock(1684627297, \
         CAST(CAST(CAST('outbox_messages' AS regclass) AS oid) AS integer))",
    )
    .expect("give the lock back");
    let settings = runtime.block_on(async {
        diesel_async::RunQueryDsl::get_result::<(String, String)>(
            diesel::select((
                diesel::dsl::sql::<diesel::sql_types::Text>("current_setting('lock_timeout')"),
                diesel::dsl::sql::<diesel::sql_types::Text>(
                    "current_setting('synchronous_commit')",
                ),
            )),
            &mut listener,
        )
        .await
        .expect("settings")
    });
    assert_eq!(
        settings,
        ("0".to_string(), "on".to_string()),
        "the relay's listener kept a setting of its own session"
    );

    // A relay whose listening connection is gone holds nothing: the
    // enqueues stop notifying (its next connection is woken when it
    // listens, and polls meanwhile).
    let asleep = runtime
        .block_on(asleep_async(&mut listener, false, &mut snapshot))
        .expect("asleep");
    assert!(asleep.is_some());
    drop(listener);
    let mut other = runtime.block_on(async {
        let mut other = AsyncPgConnection::establish(&db.url).await.expect("other");
        assert_eq!(
            listen_async(&mut other, &mut notifier, Duration::from_secs(5))
                .await
                .expect("listen"),
            Listening::Notified
        );
        other
    });
    // The server releases a closed session's locks when it notices.
    std::thread::sleep(Duration::from_millis(200));
    enqueue(&mut conn, "after the relay's connection closed");
    assert!(
        !runtime.block_on(notified(&mut other, quiet)),
        "an enqueue notified for a relay whose connection is gone"
    );
    let rows: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "(SELECT count(*) FROM outbox_messages)",
    ))
    .get_result(&mut conn)
    .expect("count");
    assert_eq!(rows, 7, "every enqueue kept its row");
}
