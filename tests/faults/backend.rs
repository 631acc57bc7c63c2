//! What the fault scenarios need to know of a backend, beyond the behaviour
//! suite's [`TestBackend`]: what it can do (capability constants, read by
//! the scenarios instead of comparing backend names) and its statements.

use crate::common::backend::TestBackend;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use std::time::Duration;

/// Which deadlock a backend can be driven into.
#[allow(dead_code)] // the server backends construct the others
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadlock {
    /// None: writers are serialized (SQLite).
    None,
    /// Two sessions lock two rows in opposite order (PostgreSQL 40P01).
    LockOrder,
    /// A claim rolled back while two redeliveries wait on its key (InnoDB
    /// 1213 from the shared-lock upgrade of a duplicate-key wait).
    DuplicateKey,
}

pub trait FaultBackend: TestBackend {
    /// The backend's name in scenario names and worker environments.
    const NAME: &'static str;
    /// Label in reports.
    const LABEL: &'static str;
    /// A query returning this session's server id as `id BIGINT`; `None`
    /// for an embedded database (no session to kill).
    const SESSION_ID_SQL: Option<&'static str>;
    /// The statement that ends another session, shown in the report.
    const KILL_STATEMENT: &'static str;
    /// The session setting that makes its transactions SERIALIZABLE with
    /// snapshot isolation and conflict detection (serialization failures);
    /// `None` where the backend has no such level.
    const SERIALIZABLE_SNAPSHOT: Option<&'static str>;
    /// Whether the least-privilege scenario can make a role (with
    /// `search_path` in its URL) here.
    const ROLES: bool;
    const DEADLOCK: Deadlock;
    /// A session setting under which a claim waiting on a lock gives up
    /// soon, and how soon.
    const SHORT_LOCK_WAIT: (&'static str, Duration);

    /// The statement that ends session `id`.
    fn kill_sql(id: u64) -> String;

    /// A database of the scenario's own whose server writes its messages
    /// in `locale`'s language; `None` where the backend has no such setting
    /// here, `Err` when the server refused it.
    fn in_language(
        _scenario: &str,
        _locale: &str,
    ) -> Option<Result<crate::common::TestDb, String>> {
        None
    }

    /// This session's server id, from `SESSION_ID_SQL`.
    fn session_id(conn: &mut Self::Conn) -> Option<u64>;
    #[cfg(feature = "async")]
    fn session_id_async(
        conn: &mut Self::AsyncConn,
    ) -> impl std::future::Future<Output = Option<u64>> + Send;

    /// The server's count of deadlocks so far, where it keeps one.
    fn deadlocks_so_far(_conn: &mut Self::Conn) -> Option<i64> {
        None
    }

    /// Adds `amount` to counter `name` (a conflicting write on purpose).
    fn add(conn: &mut Self::Conn, name: &str, amount: i64) -> QueryResult<usize>;
    #[cfg(feature = "async")]
    fn add_async(
        conn: &mut Self::AsyncConn,
        name: &str,
        amount: i64,
    ) -> impl std::future::Future<Output = QueryResult<usize>> + Send;
    fn counter(conn: &mut Self::Conn, name: &str) -> QueryResult<i64>;
    fn new_counter(conn: &mut Self::Conn, name: &str) -> QueryResult<usize>;

    /// The inbox rows of `consumer` whose keys start with `run`.
    fn inbox_rows_of_run(conn: &mut Self::Conn, consumer: &str, run: &str) -> i64;
    /// Enqueues `(seq, key, amount)` messages of `run`.
    fn enqueue(
        conn: &mut Self::Conn,
        run: &str,
        messages: &[(i64, String, i64)],
    ) -> QueryResult<usize>;
    /// Takes the next unacked message of `run` in order, counting the
    /// delivery: `(seq, earlier deliveries)`.
    fn receive(conn: &mut Self::Conn, run: &str) -> QueryResult<Option<(i64, i32)>>;
    /// Acks `seq`, running `before_commit` inside the ack's transaction.
    fn ack(
        conn: &mut Self::Conn,
        run: &str,
        seq: i64,
        before_commit: impl FnOnce(),
    ) -> QueryResult<()>;
    fn unacked(conn: &mut Self::Conn, run: &str) -> QueryResult<i64>;
}

/// The row of `FaultBackend::SESSION_ID_SQL`.
#[derive(diesel::QueryableByName)]
pub struct SessionId {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub id: i64,
}

/// Sets the session's short lock wait.
pub fn short_lock_wait<B: FaultBackend>(conn: &mut B::Conn) -> QueryResult<()> {
    conn.batch_execute(B::SHORT_LOCK_WAIT.0)
}

/// The fault tables' access, the same code for every connection type:
/// `fault_data_access!(Conn)` inside each `FaultBackend` impl.
macro_rules! fault_data_access {
    ($Conn:ty) => {
        fn session_id(conn: &mut $Conn) -> Option<u64> {
            let row: $crate::backend::SessionId = diesel::sql_query(Self::SESSION_ID_SQL?)
                .get_result(conn)
                .ok()?;
            Some(row.id as u64)
        }

        #[cfg(feature = "async")]
        async fn session_id_async(conn: &mut Self::AsyncConn) -> Option<u64> {
            let query = diesel::sql_query(Self::SESSION_ID_SQL?);
            let row: $crate::backend::SessionId =
                diesel_async::RunQueryDsl::get_result(query, conn)
                    .await
                    .ok()?;
            Some(row.id as u64)
        }

        fn add(conn: &mut $Conn, name: &str, amount: i64) -> QueryResult<usize> {
            use $crate::scenario::inbox_fault_counters as counters;
            diesel::update(counters::table.find(name))
                .set(counters::value.eq(counters::value + amount))
                .execute(conn)
        }

        #[cfg(feature = "async")]
        async fn add_async(
            conn: &mut Self::AsyncConn,
            name: &str,
            amount: i64,
        ) -> QueryResult<usize> {
            use $crate::scenario::inbox_fault_counters as counters;
            let update = diesel::update(counters::table.find(name))
                .set(counters::value.eq(counters::value + amount));
            diesel_async::RunQueryDsl::execute(update, conn).await
        }

        fn counter(conn: &mut $Conn, name: &str) -> QueryResult<i64> {
            use $crate::scenario::inbox_fault_counters as counters;
            counters::table
                .find(name)
                .select(counters::value)
                .first(conn)
        }

        fn new_counter(conn: &mut $Conn, name: &str) -> QueryResult<usize> {
            use $crate::scenario::inbox_fault_counters as counters;
            diesel::insert_into(counters::table)
                .values((counters::name.eq(name), counters::value.eq(0_i64)))
                .execute(conn)
        }

        fn inbox_rows_of_run(conn: &mut $Conn, consumer: &str, run: &str) -> i64 {
            use diesel_inbox::inbox_messages;
            inbox_messages::table
                .filter(inbox_messages::consumer.eq(consumer))
                .filter(inbox_messages::message_id.like(format!("{run}:%")))
                .count()
                .get_result(conn)
                .expect("count inbox rows")
        }

        fn enqueue(
            conn: &mut $Conn,
            run: &str,
            messages: &[(i64, String, i64)],
        ) -> QueryResult<usize> {
            use $crate::scenario::inbox_fault_queue as queue;
            let rows: Vec<_> = messages
                .iter()
                .map(|(seq, key, amount)| {
                    (
                        queue::run_id.eq(run),
                        queue::seq.eq(*seq),
                        queue::message_key.eq(key),
                        queue::amount.eq(*amount),
                    )
                })
                .collect();
            diesel::insert_into(queue::table)
                .values(&rows)
                .execute(conn)
        }

        fn receive(conn: &mut $Conn, run: &str) -> QueryResult<Option<(i64, i32)>> {
            use $crate::scenario::inbox_fault_queue as queue;
            conn.transaction(|c| {
                let row: Option<(i64, i32)> = queue::table
                    .filter(queue::run_id.eq(run))
                    .filter(queue::acked.eq(false))
                    .order(queue::seq)
                    .select((queue::seq, queue::deliveries))
                    .first(c)
                    .optional()?;
                if let Some((seq, _)) = row {
                    diesel::update(queue::table.find((run, seq)))
                        .set(queue::deliveries.eq(queue::deliveries + 1))
                        .execute(c)?;
                }
                Ok(row)
            })
        }

        fn ack(
            conn: &mut $Conn,
            run: &str,
            seq: i64,
            before_commit: impl FnOnce(),
        ) -> QueryResult<()> {
            use $crate::scenario::inbox_fault_queue as queue;
            conn.transaction(|c| {
                diesel::update(queue::table.find((run, seq)))
                    .set(queue::acked.eq(true))
                    .execute(c)?;
                before_commit();
                Ok(())
            })
        }

        fn unacked(conn: &mut $Conn, run: &str) -> QueryResult<i64> {
            use $crate::scenario::inbox_fault_queue as queue;
            queue::table
                .filter(queue::run_id.eq(run))
                .filter(queue::acked.eq(false))
                .count()
                .get_result(conn)
        }
    };
}

#[cfg(feature = "sqlite")]
impl FaultBackend for crate::common::backends::sqlite::Sqlite {
    const NAME: &'static str = "sqlite";
    const LABEL: &'static str = "SQLite (file, WAL)";
    const SESSION_ID_SQL: Option<&'static str> = None;
    const KILL_STATEMENT: &'static str = "";
    const SERIALIZABLE_SNAPSHOT: Option<&'static str> = None;
    const ROLES: bool = false;
    const DEADLOCK: Deadlock = Deadlock::None;
    const SHORT_LOCK_WAIT: (&'static str, Duration) =
        ("PRAGMA busy_timeout = 300", Duration::from_millis(300));

    fn kill_sql(_: u64) -> String {
        unreachable!("an embedded database has no session to kill")
    }

    fault_data_access!(diesel::SqliteConnection);
}

#[cfg(feature = "postgres")]
impl FaultBackend for crate::common::backends::postgres::Postgres {
    const NAME: &'static str = "postgres";
    const LABEL: &'static str = "PostgreSQL";
    const SESSION_ID_SQL: Option<&'static str> =
        Some("SELECT CAST(pg_backend_pid() AS BIGINT) AS id");
    const KILL_STATEMENT: &'static str = "pg_terminate_backend";
    const SERIALIZABLE_SNAPSHOT: Option<&'static str> =
        Some("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE");
    const ROLES: bool = true;
    const DEADLOCK: Deadlock = Deadlock::LockOrder;
    const SHORT_LOCK_WAIT: (&'static str, Duration) =
        ("SET lock_timeout = '300ms'", Duration::from_millis(300));

    fn kill_sql(id: u64) -> String {
        format!("SELECT pg_terminate_backend({id})")
    }

    fn in_language(scenario: &str, locale: &str) -> Option<Result<crate::common::TestDb, String>> {
        crate::common::backends::postgres::in_language(scenario, locale)
    }

    fault_data_access!(diesel::PgConnection);
}

#[cfg(feature = "mysql")]
impl FaultBackend for crate::common::backends::mysql::Mysql {
    const NAME: &'static str = "mysql";
    const LABEL: &'static str = "MariaDB";
    const SESSION_ID_SQL: Option<&'static str> =
        Some("SELECT CAST(CONNECTION_ID() AS SIGNED) AS id");
    const KILL_STATEMENT: &'static str = "KILL";
    const SERIALIZABLE_SNAPSHOT: Option<&'static str> = None;
    const ROLES: bool = false;
    const DEADLOCK: Deadlock = Deadlock::DuplicateKey;
    const SHORT_LOCK_WAIT: (&'static str, Duration) = (
        "SET SESSION innodb_lock_wait_timeout = 1",
        Duration::from_secs(1),
    );

    fn kill_sql(id: u64) -> String {
        format!("KILL {id}")
    }

    fn deadlocks_so_far(conn: &mut diesel::MysqlConnection) -> Option<i64> {
        #[derive(QueryableByName)]
        struct Status {
            #[diesel(sql_type = diesel::sql_types::Text)]
            #[diesel(column_name = Value)]
            value: String,
        }
        let rows: Vec<Status> = diesel::sql_query("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
            .load(conn)
            .ok()?;
        rows.first()?.value.parse().ok()
    }

    fault_data_access!(diesel::MysqlConnection);
}
