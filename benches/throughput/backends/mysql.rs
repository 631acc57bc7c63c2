//! MySQL/MariaDB: `INBOX_TEST_MYSQL_URL`; `--scale` and `--purge` in a
//! database of their own.

use crate::bench::{Bench, Server};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_inbox::inbox_messages as inbox;

pub struct Mysql;

/// `claim(key)`: the hand-written async claim.
#[cfg(feature = "async")]
fn claim(
    key: &str,
) -> impl diesel::query_builder::QueryFragment<diesel::mysql::Mysql>
       + diesel::query_builder::QueryId
       + Send
       + '_ {
    diesel::insert_or_ignore_into(inbox::table).values((
        inbox::consumer.eq("bench-async-raw"),
        inbox::message_id.eq(key),
    ))
}

impl Bench for Mysql {
    const NAME: &'static str = "mysql";
    const LABEL: &'static str = "MariaDB";
    const VERSION_SQL: &'static str = "version()";
    const OUTBOX_EMPTIED: Option<&'static str> = None;
    // A read view held open keeps InnoDB's purge from removing the rows
    // the relay deletes (delete-marked records the claim's read passes).
    const HOLD_SNAPSHOT: Option<&'static str> =
        Some("START TRANSACTION WITH CONSISTENT SNAPSHOT; SELECT count(*) FROM outbox_messages");
    type Conn = MysqlConnection;

    fn open(url: &str) -> MysqlConnection {
        MysqlConnection::establish(url).unwrap_or_else(|e| panic!("MySQL/MariaDB unreachable: {e}"))
    }

    fn tx<T>(
        conn: &mut MysqlConnection,
        f: impl FnOnce(&mut MysqlConnection) -> QueryResult<T>,
    ) -> QueryResult<T> {
        conn.transaction(f)
    }

    fn claim_by_hand(conn: &mut MysqlConnection, consumer: &str, key: &str) -> QueryResult<usize> {
        diesel::insert_or_ignore_into(inbox::table)
            .values((inbox::consumer.eq(consumer), inbox::message_id.eq(key)))
            .execute(conn)
    }

    super::orders_access!(MysqlConnection);

    #[cfg(feature = "async")]
    type AsyncConn = diesel_async::AsyncMysqlConnection;
    #[cfg(feature = "async")]
    const EXTRA: Option<&'static str> = None;

    #[cfg(feature = "async")]
    super::deadpool_types!(diesel_async::AsyncMysqlConnection);

    #[cfg(feature = "async")]
    fn pool(url: &str, size: usize) -> Self::Pool {
        let manager = diesel_async::pooled_connection::AsyncDieselConnectionManager::new(url);
        diesel_async::pooled_connection::deadpool::Pool::builder(manager)
            .max_size(size)
            .build()
            .expect("a pool")
    }

    #[cfg(feature = "async")]
    super::async_variants!();

    #[cfg(feature = "async")]
    async fn extra_async(_: &mut Self::AsyncConn, _: &crate::Order) -> QueryResult<()> {
        unreachable!("MySQL/MariaDB has no extra async variant")
    }
}

impl Server for Mysql {
    fn fresh(url: &str, name: &str) -> Result<(String, String), String> {
        Self::open(url)
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .map_err(|e| e.to_string())?;
        let base = url.split('?').next().unwrap_or(url);
        let server = &base[..base.rfind('/').ok_or("a database path in the URL")?];
        Ok((format!("{server}/{name}"), format!("DROP DATABASE {name}")))
    }

    const ANALYZE: &'static str = "ANALYZE TABLE inbox_messages";

    /// UUIDv4 text from RANDOM_BYTES (MariaDB 10.10+); UUID() would give
    /// time-ordered v1 keys. The rows come from the SEQUENCE engine's
    /// seq_1_to_N.
    fn scale_fill(rows: usize) -> String {
        format!(
            "INSERT INTO inbox_messages (consumer, message_id) \
             SELECT 'bench', k FROM (SELECT LOWER(CONCAT(HEX(RANDOM_BYTES(4)), '-', \
             HEX(RANDOM_BYTES(2)), '-4', SUBSTR(HEX(RANDOM_BYTES(2)), 2), '-', \
             SUBSTR('89ab', 1 + FLOOR(RAND() * 4), 1), SUBSTR(HEX(RANDOM_BYTES(2)), 2), '-', \
             HEX(RANDOM_BYTES(6)))) AS k FROM seq_1_to_{rows}) fresh_keys ORDER BY k"
        )
    }

    fn key_bytes(url: &str) -> Result<i64, String> {
        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "(SELECT CAST(DATA_LENGTH AS SIGNED) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_messages')",
        ))
        .get_result(&mut Self::open(url))
        .map_err(|e| e.to_string())
    }

    /// Numbers 0..rows from cross joins of a ten-row table.
    fn purge_fill(slice: usize, rows: usize, days: u64) -> String {
        let digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                      UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                      UNION ALL SELECT 8 UNION ALL SELECT 9)";
        let places = (rows.max(2) as f64).log10().ceil() as u32;
        let tables: Vec<String> = (0..places).map(|p| format!("{digits} t{p}")).collect();
        let number: Vec<String> = (0..places)
            .map(|p| format!("t{p}.d * {}", 10u64.pow(p)))
            .collect();
        format!(
            "INSERT INTO inbox_messages (consumer, message_id, received_at) \
             SELECT 'bench-old', CONCAT('s{slice}-', n), CURRENT_TIMESTAMP(6) - INTERVAL {days} DAY \
             FROM (SELECT {} AS n FROM {}) numbers WHERE n < {rows}",
            number.join(" + "),
            tables.join(", ")
        )
    }
}
