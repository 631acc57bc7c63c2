//! A relay running in a task of its own until the test says stop; a
//! publisher that records its calls; a fresh PostgreSQL database.
#![cfg(feature = "relay")]

use diesel_inbox::outbox::{
    OutboxMessage, Publish, PublishError, Relay, RelayError, RelayPool, RelayReport,
};
use std::sync::{Arc, Mutex};

/// `relay.run` in a task: send `true` on the sender to stop it; the task
/// yields what `run` returned.
pub fn spawn<D, P>(
    relay: Relay<D, P>,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Result<RelayReport, RelayError>>,
)
where
    D: RelayPool + 'static,
    P: Publish + 'static,
{
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(async move {
        relay
            .run(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
    });
    (stop, running)
}

/// A publisher that records the payloads of each call (a batch of the
/// relay's) and refuses the payload `refuse` names.
#[derive(Clone, Default)]
pub struct Calls {
    pub refuse: Arc<Mutex<Option<String>>>,
    pub calls: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Publish for Calls {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let refuse = self.refuse.lock().expect("not poisoned").clone();
        let payloads: Vec<String> = messages
            .iter()
            .map(|m| String::from_utf8(m.payload.clone()).expect("utf-8"))
            .collect();
        let results = payloads
            .iter()
            .map(|p| match &refuse {
                Some(r) if r == p => Err(PublishError::refused("422 from the endpoint")),
                _ => Ok(()),
            })
            .collect();
        self.calls.lock().expect("not poisoned").push(payloads);
        results
    }
}

#[cfg(feature = "postgres")]
mod database {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    use diesel::PgConnection;
    use diesel_async::{AsyncConnection, AsyncPgConnection};

    /// A fresh database on the test server, dropped at the end.
    pub struct Database {
        pub admin: String,
        pub name: String,
        pub url: String,
    }

    impl Database {
        pub fn create(test: &str) -> Database {
            let admin = std::env::var("INBOX_TEST_POSTGRES_URL").expect("INBOX_TEST_POSTGRES_URL");
            let name = format!("relay_{test}_{}", std::process::id());
            let (base, _) = admin.rsplit_once('/').expect("a URL with a database");
            let url = format!("{base}/{name}");
            let mut conn = PgConnection::establish(&admin).expect("the test server");
            // One statement each: a multi-statement string runs as one
            // transaction, which DROP/CREATE DATABASE refuse.
            conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .expect("drop a database left behind");
            conn.batch_execute(&format!("CREATE DATABASE {name}"))
                .expect("a fresh database");
            Database { admin, name, url }
        }
    }

    impl Database {
        /// A connection to it, after `migrate`.
        pub async fn migrated(&self) -> AsyncPgConnection {
            let mut conn = AsyncPgConnection::establish(&self.url)
                .await
                .expect("connect");
            diesel_inbox::migrate_async(&mut conn)
                .await
                .expect("migrate");
            conn
        }
    }

    impl Drop for Database {
        fn drop(&mut self) {
            if let Ok(mut conn) = PgConnection::establish(&self.admin) {
                // A WAL outbox slot keeps its database (and the server's
                // WAL): its stream ended, then the slot dropped, then the
                // database (a stream ends a moment after its relay).
                let slots = format!(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                     WHERE database = '{0}' AND active_pid IS NOT NULL; \
                     SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                     WHERE database = '{0}'",
                    self.name
                );
                for _ in 0..100 {
                    if conn.batch_execute(&slots).is_ok() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                let _ = conn.batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ));
            }
        }
    }
}
#[cfg(feature = "postgres")]
pub use database::Database;

/// Waits until a relay sleeps in the database of `conn` (PostgreSQL), so
/// that only a notification wakes it before its poll: its `LISTEN`
/// connection holds the advisory lock that makes enqueues notify, and the
/// transactions in progress when it took the lock have ended (until then
/// it passes again after waits that double: the runtime's
/// `outbox::notify`), and its current wait has ended too. Other tests'
/// transactions on the same server can keep it passing for seconds.
/// Panics after `limit`.
#[cfg(feature = "postgres")]
pub fn wait_until_asleep(conn: &mut diesel::PgConnection, limit: std::time::Duration) {
    use diesel::RunQueryDsl;
    use std::time::{Duration, Instant};
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let count = |conn: &mut diesel::PgConnection, sql: &str| {
        diesel::sql_query(sql)
            .get_result::<Count>(conn)
            .expect("a count")
            .n
    };
    // pg_advisory_lock_shared(1684627297, the outbox's oid), granted.
    let held = "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND granted \
                AND mode = 'ShareLock' AND classid = 1684627297 AND objsubid = 2 \
                AND objid = CAST(CAST('outbox_messages' AS regclass) AS oid) \
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
    let started = Instant::now();
    while count(conn, held) == 0 {
        assert!(
            started.elapsed() < limit,
            "no relay went to sleep within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The transactions in progress now: those the relay listed as it took
    // the lock, if still in progress, are among them.
    std::thread::sleep(Duration::from_millis(100));
    let asleep_at = Instant::now();
    #[derive(diesel::QueryableByName)]
    struct Snapshot {
        #[diesel(sql_type = diesel::sql_types::Text)]
        snapshot: String,
    }
    let snapshot = diesel::sql_query("SELECT CAST(pg_current_snapshot() AS text) AS snapshot")
        .get_result::<Snapshot>(conn)
        .expect("a snapshot")
        .snapshot;
    let running = format!(
        "SELECT count(*) AS n FROM pg_snapshot_xip(CAST('{snapshot}' AS pg_snapshot)) AS x \
         WHERE pg_xact_status(x) = 'in progress'"
    );
    while count(conn, &running) > 0 {
        assert!(
            started.elapsed() < limit,
            "transactions in progress since the relay went to sleep still are after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The relay's wait since it last looked is at most as long as it has
    // waited in all.
    std::thread::sleep(asleep_at.elapsed() + Duration::from_millis(300));
    assert!(
        count(conn, held) > 0,
        "the relay woke while nothing was enqueued"
    );
}
