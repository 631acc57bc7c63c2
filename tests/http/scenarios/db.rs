//! What the scenarios read and hold in the database directly, on each
//! backend: business rows, stored responses, a fresh connection's lock
//! wait, and a transaction kept open.

use super::{Backend, Rollback};
use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Text};
use diesel::{Connection, RunQueryDsl};
use diesel_inbox::http::{consumer_name, message_id, IdempotencyKey};

impl Backend {
    /// Business rows of `(scope, key)`.
    pub(super) fn rows(&self, scope: &str, key: &str) -> Result<i64, String> {
        self.count(
            "SELECT COUNT(*) AS n FROM http_payments WHERE scope = ? AND idem_key = ?",
            scope,
            key,
        )
    }

    /// Inbox rows (stored responses) of `(scope, key)` at `endpoint`.
    pub(super) fn stored(&self, endpoint: &str, scope: &str, key: &str) -> Result<i64, String> {
        let key = IdempotencyKey::parse(key).map_err(|e| e.to_string())?;
        self.count(
            "SELECT COUNT(*) AS n FROM inbox_messages WHERE consumer = ? AND message_id = ?",
            &consumer_name(endpoint),
            &message_id(scope, &key),
        )
    }

    /// A fresh connection's lock wait setting (what the server's body
    /// reports, see `Db::LOCK_WAIT`).
    pub(super) fn lock_wait(&self) -> Result<String, String> {
        #[derive(diesel::QueryableByName)]
        struct Setting {
            #[diesel(sql_type = Text)]
            v: String,
        }
        macro_rules! setting {
            ($conn:ty, $sql:expr) => {{
                let mut conn = <$conn>::establish(&self.url).map_err(|e| e.to_string())?;
                let row: Setting = diesel::sql_query($sql)
                    .get_result(&mut conn)
                    .map_err(|e| e.to_string())?;
                Ok(row.v)
            }};
        }
        match self.kind {
            #[cfg(feature = "postgres")]
            "postgres" => setting!(
                diesel::PgConnection,
                "SELECT current_setting('lock_timeout') AS v"
            ),
            #[cfg(feature = "mysql")]
            "mysql" => setting!(
                diesel::MysqlConnection,
                "SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS CHAR) AS v"
            ),
            _ => Ok("busy timeout".into()),
        }
    }

    /// Runs `sql` (binds `a`, `b`) in a transaction of its own that stays
    /// open until the returned closure rolls it back.
    pub(super) fn hold(&self, sql: &str, a: &str, b: &str) -> Result<Rollback, String> {
        macro_rules! hold {
            ($conn:ty, $begin:expr, $sql:expr) => {{
                let mut conn = <$conn>::establish(&self.url).map_err(|e| e.to_string())?;
                conn.batch_execute($begin).map_err(|e| e.to_string())?;
                diesel::sql_query($sql)
                    .bind::<Text, _>(a)
                    .bind::<Text, _>(b)
                    .execute(&mut conn)
                    .map_err(|e| e.to_string())?;
                let rollback: Rollback =
                    Box::new(move || conn.batch_execute("ROLLBACK").map_err(|e| e.to_string()));
                Ok(rollback)
            }};
        }
        match self.kind {
            "sqlite" => hold!(
                diesel::SqliteConnection,
                "PRAGMA busy_timeout = 10000; BEGIN IMMEDIATE",
                sql
            ),
            #[cfg(feature = "postgres")]
            "postgres" => hold!(
                diesel::PgConnection,
                "BEGIN",
                sql.replacen('?', "$1", 1).replacen('?', "$2", 1)
            ),
            #[cfg(feature = "mysql")]
            "mysql" => hold!(diesel::MysqlConnection, "BEGIN", sql),
            other => Err(format!("no such backend {other}")),
        }
    }

    pub(super) fn count(&self, sql: &str, a: &str, b: &str) -> Result<i64, String> {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        macro_rules! count {
            ($conn:ty, $sql:expr) => {{
                let mut conn = <$conn>::establish(&self.url).map_err(|e| e.to_string())?;
                let counted: Count = diesel::sql_query($sql)
                    .bind::<Text, _>(a)
                    .bind::<Text, _>(b)
                    .get_result(&mut conn)
                    .map_err(|e| e.to_string())?;
                Ok(counted.n)
            }};
        }
        match self.kind {
            "sqlite" => {
                let mut conn =
                    diesel::SqliteConnection::establish(&self.url).map_err(|e| e.to_string())?;
                conn.batch_execute("PRAGMA busy_timeout = 10000")
                    .map_err(|e| e.to_string())?;
                let counted: Count = diesel::sql_query(sql)
                    .bind::<Text, _>(a)
                    .bind::<Text, _>(b)
                    .get_result(&mut conn)
                    .map_err(|e| e.to_string())?;
                Ok(counted.n)
            }
            #[cfg(feature = "postgres")]
            "postgres" => count!(
                diesel::PgConnection,
                sql.replacen('?', "$1", 1).replacen('?', "$2", 1)
            ),
            #[cfg(feature = "mysql")]
            "mysql" => count!(diesel::MysqlConnection, sql),
            other => Err(format!("no such backend {other}")),
        }
    }
}
