//! What a backend under test supplies: its databases, its sync and async
//! connections, and access to the business table the tests assert on.
//! Each backend file (`tests/sqlite.rs`, ...) implements it once; the test
//! logic is generic over it.

use super::TestDb;
use diesel::connection::LoadConnection;
use diesel::result::QueryResult;
use diesel_inbox::InboxConnection;

/// One message of the behaviour tests: its key is unique to the test run.
#[derive(Clone, Debug)]
pub struct Msg {
    pub key: String,
    pub amount: i64,
    pub run: String,
}

pub fn msg(run: &str, key: impl Into<String>, amount: i64) -> Msg {
    Msg {
        key: key.into(),
        amount,
        run: run.to_string(),
    }
}

/// A database backend under test.
pub trait TestBackend: Sized + Send + Sync + 'static {
    /// The sync connection.
    type Conn: InboxConnection + LoadConnection + Send + 'static;
    /// The async connection (diesel-async), handed out by a deadpool pool.
    #[cfg(feature = "async")]
    type AsyncConn: diesel_inbox::AsyncInboxConnection<Backend: Send>
        + diesel_async::pooled_connection::PoolableConnection
        + 'static;

    /// The database the tests of this binary share, with the tables in
    /// place; `None` (after one line saying so) when the server is not
    /// configured.
    fn prepare(test: &str) -> Option<TestDb>;
    /// An empty database (or schema) of the test's own, removed at its end.
    fn fresh(test: &str) -> Option<TestDb>;
    /// Returns once every server that serves `url` has applied what was
    /// committed before (a Galera node applies another node's writes a
    /// moment after their commit); one server: at once.
    fn settle(url: &str) {
        let _ = url;
    }
    fn open(url: &str) -> Self::Conn;
    /// A deadpool pool of async connections (diesel-async's
    /// `AsyncDieselConnectionManager`), and the connection it hands out.
    #[cfg(feature = "async")]
    type Pool: Clone + Send + Sync + 'static;
    #[cfg(feature = "async")]
    type Pooled: std::ops::DerefMut<Target = Self::AsyncConn> + Send + 'static;
    #[cfg(feature = "async")]
    fn pool(url: &str) -> Self::Pool;
    #[cfg(feature = "async")]
    fn pooled(pool: &Self::Pool) -> impl std::future::Future<Output = Self::Pooled> + Send;

    /// One statement that fails with an error the backend reports for a
    /// deadlock or a busy database.
    fn fail_transiently(conn: &mut Self::Conn) -> QueryResult<()>;
    #[cfg(feature = "async")]
    fn fail_transiently_async(
        conn: &mut Self::AsyncConn,
    ) -> impl std::future::Future<Output = QueryResult<()>> + Send;
    /// `(per_connection_sql, ddl)` making `inbox_test_parent (id)` and
    /// `inbox_test_child (parent_id)` with a foreign key checked at COMMIT;
    /// `None` where the backend has none.
    const DEFERRED_FK: Option<(&'static str, &'static str)>;
    /// A multi-master cluster whose connections go to different nodes: a
    /// claim on one node does not make a delivery on another wait.
    const MULTI_MASTER: bool = false;

    /// The business write of a handler: one row in `inbox_test_effects`.
    fn write_effect(conn: &mut Self::Conn, run: &str, key: &str, amount: i64)
        -> QueryResult<usize>;
    /// One multi-row insert of the messages' effects.
    fn write_effects(conn: &mut Self::Conn, msgs: &[&Msg]) -> QueryResult<usize>;
    #[cfg(feature = "async")]
    fn write_effect_async(
        conn: &mut Self::AsyncConn,
        run: &str,
        key: &str,
        amount: i64,
    ) -> impl std::future::Future<Output = QueryResult<usize>> + Send;
    #[cfg(feature = "async")]
    fn write_effects_async(
        conn: &mut Self::AsyncConn,
        msgs: &[&Msg],
    ) -> impl std::future::Future<Output = QueryResult<usize>> + Send;

    /// The business rows of a run, as (key, amount), sorted.
    fn effects_of(conn: &mut Self::Conn, run: &str) -> Vec<(String, i64)>;
    /// The inbox rows of one key of one consumer.
    fn inbox_rows(conn: &mut Self::Conn, consumer: &str, key: &str) -> i64;
    /// The payloads of the outbox rows with message id `id`.
    fn outbox_payloads(conn: &mut Self::Conn, id: &str) -> Vec<Vec<u8>>;
    /// The `fingerprint` and `result` columns of one inbox row.
    fn inbox_extras(
        conn: &mut Self::Conn,
        consumer: &str,
        key: &str,
    ) -> (Option<Vec<u8>>, Option<Vec<u8>>);
}

/// The business-table access of `TestBackend`, the same code for every
/// connection type: `data_access!(Conn)` inside its impl.
#[macro_export]
macro_rules! data_access {
    ($Conn:ty) => {
        fn write_effect(
            conn: &mut $Conn,
            run: &str,
            key: &str,
            amount: i64,
        ) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use $crate::common::inbox_test_effects as effects;
            diesel::insert_into(effects::table)
                .values((
                    effects::run_id.eq(run),
                    effects::message_key.eq(key),
                    effects::amount.eq(amount),
                ))
                .execute(conn)
        }

        fn write_effects(
            conn: &mut $Conn,
            msgs: &[&$crate::common::backend::Msg],
        ) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use $crate::common::inbox_test_effects as effects;
            let rows: Vec<_> = msgs
                .iter()
                .map(|m| {
                    (
                        effects::run_id.eq(&m.run),
                        effects::message_key.eq(&m.key),
                        effects::amount.eq(m.amount),
                    )
                })
                .collect();
            diesel::insert_into(effects::table)
                .values(&rows)
                .execute(conn)
        }

        #[cfg(feature = "async")]
        async fn write_effect_async(
            conn: &mut Self::AsyncConn,
            run: &str,
            key: &str,
            amount: i64,
        ) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use $crate::common::inbox_test_effects as effects;
            let insert = diesel::insert_into(effects::table).values((
                effects::run_id.eq(run),
                effects::message_key.eq(key),
                effects::amount.eq(amount),
            ));
            diesel_async::RunQueryDsl::execute(insert, conn).await
        }

        #[cfg(feature = "async")]
        async fn write_effects_async(
            conn: &mut Self::AsyncConn,
            msgs: &[&$crate::common::backend::Msg],
        ) -> diesel::QueryResult<usize> {
            // One insert each: diesel has no multi-row insert for SQLite
            // through diesel-async.
            for m in msgs {
                Self::write_effect_async(conn, &m.run, &m.key, m.amount).await?;
            }
            Ok(msgs.len())
        }

        fn effects_of(conn: &mut $Conn, run: &str) -> Vec<(String, i64)> {
            use diesel::prelude::*;
            use $crate::common::inbox_test_effects as effects;
            let mut rows: Vec<(String, i64)> = effects::table
                .filter(effects::run_id.eq(run))
                .select((effects::message_key, effects::amount))
                .load(conn)
                .expect("load effects");
            rows.sort();
            rows
        }

        fn outbox_payloads(conn: &mut $Conn, id: &str) -> Vec<Vec<u8>> {
            use diesel::prelude::*;
            use diesel_inbox::outbox_messages;
            outbox_messages::table
                .filter(outbox_messages::id.eq(id))
                .select(outbox_messages::payload)
                .load(conn)
                .expect("load outbox rows")
        }

        fn inbox_rows(conn: &mut $Conn, consumer: &str, key: &str) -> i64 {
            use diesel::prelude::*;
            use diesel_inbox::inbox_messages;
            inbox_messages::table
                .filter(inbox_messages::consumer.eq(consumer))
                .filter(inbox_messages::message_id.eq(key))
                .count()
                .get_result(conn)
                .expect("count inbox rows")
        }

        fn inbox_extras(
            conn: &mut $Conn,
            consumer: &str,
            key: &str,
        ) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
            use diesel::prelude::*;
            use diesel_inbox::inbox_messages;
            inbox_messages::table
                .filter(inbox_messages::consumer.eq(consumer))
                .filter(inbox_messages::message_id.eq(key))
                .select((inbox_messages::fingerprint, inbox_messages::stored_result))
                .get_result(conn)
                .expect("read an inbox row")
        }
    };
}
