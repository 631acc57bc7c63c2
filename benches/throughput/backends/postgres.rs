//! PostgreSQL: `INBOX_TEST_POSTGRES_URL`; `--scale` and `--purge` in a
//! schema of their own.

use crate::bench::{Bench, Server};
use crate::Order;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_inbox::inbox_messages as inbox;

pub struct Postgres;

/// `claim(key)`: the hand-written async claim.
#[cfg(feature = "async")]
fn claim(
    key: &str,
) -> impl diesel::query_builder::QueryFragment<diesel::pg::Pg> + diesel::query_builder::QueryId + Send + '_
{
    diesel::insert_into(inbox::table)
        .values((
            inbox::consumer.eq("bench-async-raw"),
            inbox::message_id.eq(key),
        ))
        .on_conflict((inbox::consumer, inbox::message_id))
        .do_nothing()
}

impl Bench for Postgres {
    const NAME: &'static str = "postgres";
    const LABEL: &'static str = "PostgreSQL";
    const VERSION_SQL: &'static str = "version()";
    // Without autovacuum (Debian's test servers here run with it off) the
    // dead rows would pile up round after round and run after run, and the
    // claims of later samples would scan them. A production server's
    // autovacuum keeps up with an outbox; this does its work untimed.
    const OUTBOX_EMPTIED: Option<&'static str> = Some("VACUUM outbox_messages");
    // The same servers analyze nothing either: without statistics of the
    // outbox's columns (`txid` above all, whose values move on with every
    // transaction) the planner scans the table for the relay's look where
    // a production server's, analyzing the churning table, uses the index.
    const OUTBOX_FILLED: Option<&'static str> = Some("ANALYZE outbox_messages");
    const HOLD_SNAPSHOT: Option<&'static str> =
        Some("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox_messages");
    type Conn = PgConnection;

    fn open(url: &str) -> PgConnection {
        PgConnection::establish(url).unwrap_or_else(|e| panic!("PostgreSQL unreachable: {e}"))
    }

    fn tx<T>(
        conn: &mut PgConnection,
        f: impl FnOnce(&mut PgConnection) -> QueryResult<T>,
    ) -> QueryResult<T> {
        conn.transaction(f)
    }

    fn claim_by_hand(conn: &mut PgConnection, consumer: &str, key: &str) -> QueryResult<usize> {
        diesel::insert_into(inbox::table)
            .values((inbox::consumer.eq(consumer), inbox::message_id.eq(key)))
            .on_conflict((inbox::consumer, inbox::message_id))
            .do_nothing()
            .execute(conn)
    }

    super::orders_access!(PgConnection);

    #[cfg(feature = "async")]
    type AsyncConn = diesel_async::AsyncPgConnection;
    #[cfg(feature = "async")]
    const EXTRA: Option<&'static str> = Some("async_pipelined");

    #[cfg(feature = "async")]
    super::deadpool_types!(diesel_async::AsyncPgConnection);

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

    /// `async_pipelined`: BEGIN and the claim go out together (two
    /// requests, one round trip), then the write and COMMIT; ROLLBACK on
    /// any error. Outside diesel's transaction manager.
    #[cfg(feature = "async")]
    async fn extra_async(
        conn: &mut diesel_async::AsyncPgConnection,
        order: &Order,
    ) -> QueryResult<()> {
        use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
        let shared: &AsyncPgConnection = conn;
        let (mut a, mut b) = (shared, shared);
        let begin = SimpleAsyncConnection::batch_execute(&mut a, "BEGIN");
        let claimed = diesel_async::RunQueryDsl::execute(claim(&order.id), &mut b);
        let body = async {
            let (_, claimed) = tokio::try_join!(begin, claimed)?;
            if claimed == 1 {
                let mut c = shared;
                let insert = diesel::insert_into(crate::bench_orders::table).values((
                    crate::bench_orders::id.eq(&order.id),
                    crate::bench_orders::amount.eq(order.amount),
                ));
                diesel_async::RunQueryDsl::execute(insert, &mut c).await?;
            }
            Ok::<_, diesel::result::Error>(())
        };
        match body.await {
            Ok(()) => conn.batch_execute("COMMIT").await,
            Err(e) => {
                let _ = conn.batch_execute("ROLLBACK").await;
                Err(e)
            }
        }
    }
}

impl Server for Postgres {
    fn fresh(url: &str, name: &str) -> Result<(String, String), String> {
        Self::open(url)
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .map_err(|e| e.to_string())?;
        let separator = if url.contains('?') { '&' } else { '?' };
        Ok((
            format!("{url}{separator}options=-c%20search_path%3D{name}"),
            format!("DROP SCHEMA {name} CASCADE"),
        ))
    }

    // VACUUM refuses to run inside a multi-statement batch.
    const ANALYZE: &'static str = "VACUUM ANALYZE inbox_messages";

    fn scale_fill(rows: usize) -> String {
        format!(
            "INSERT INTO inbox_messages (consumer, message_id) \
             SELECT 'bench', k FROM (SELECT gen_random_uuid()::text AS k \
             FROM generate_series(1, {rows})) fresh_keys ORDER BY k"
        )
    }

    fn key_bytes(url: &str) -> Result<i64, String> {
        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "pg_relation_size('inbox_messages_pkey')",
        ))
        .get_result(&mut Self::open(url))
        .map_err(|e| e.to_string())
    }

    fn purge_fill(slice: usize, rows: usize, days: u64) -> String {
        format!(
            "INSERT INTO inbox_messages (consumer, message_id, received_at) \
             SELECT 'bench-old', 's{slice}-' || g, (now() AT TIME ZONE 'UTC') - interval '{days} days' \
             FROM generate_series(1, {rows}) g"
        )
    }
}
