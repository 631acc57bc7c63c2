//! What a measured database supplies, as the tests' `TestBackend` has it:
//! its connections, its transaction and hand-written claim, the business
//! writes, and for the server backends what `--scale` and `--purge` need.
//! Each backend file implements the traits once; the variants and modes
//! are generic over them.

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// The business-table and inbox access of [`Bench`], the same code for
/// every connection type: `orders_access!(Conn)` inside its impl.
macro_rules! orders_access {
    ($Conn:ty) => {
        fn insert_order(conn: &mut $Conn, order: &$crate::Order) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use $crate::bench_orders;
            diesel::insert_into(bench_orders::table)
                .values((
                    bench_orders::id.eq(&order.id),
                    bench_orders::amount.eq(order.amount),
                ))
                .execute(conn)
        }

        fn insert_orders<'o>(
            conn: &mut $Conn,
            orders: impl Iterator<Item = &'o $crate::Order>,
        ) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use $crate::bench_orders;
            let rows: Vec<_> = orders
                .map(|o| {
                    (
                        bench_orders::id.eq(&o.id),
                        bench_orders::amount.eq(o.amount),
                    )
                })
                .collect();
            diesel::insert_into(bench_orders::table)
                .values(&rows)
                .execute(conn)
        }

        fn version(url: &str) -> String {
            use diesel::prelude::*;
            diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
                Self::VERSION_SQL,
            ))
            .get_result(&mut Self::open(url))
            .unwrap_or_else(|e| format!("unknown ({e})"))
        }

        fn seen(conn: &mut $Conn, consumer: &str, key: &str) -> diesel::QueryResult<i64> {
            use diesel::prelude::*;
            use diesel_inbox::inbox_messages as inbox;
            inbox::table
                .filter(inbox::consumer.eq(consumer))
                .filter(inbox::message_id.eq(key))
                .count()
                .get_result(conn)
        }

        fn enqueue_by_hand(
            conn: &mut $Conn,
            id: &str,
            key: &str,
            payload: &[u8],
        ) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use diesel_inbox::outbox_messages as o;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64);
            diesel::insert_into(o::table)
                .values((
                    o::id.eq(id),
                    o::destination.eq("bench.stock"),
                    o::ordering_key.eq(key),
                    o::payload.eq(payload),
                    o::created_at.eq(now),
                    o::available_at.eq(now),
                    o::attempts.eq(0),
                ))
                .execute(conn)
        }

        fn hand_claim(conn: &mut $Conn, limit: usize) -> diesel::QueryResult<Vec<$crate::bench::HandRow>> {
            use diesel::prelude::*;
            type B = <$Conn as diesel::Connection>::Backend;
            // The relay's own settings (PostgreSQL: no JIT, no wait for the
            // WAL flush).
            let (setup, now, skip_locked) = diesel_inbox::__testing::relay_sql::<B>();
            if let Some(setup) = setup {
                diesel::connection::SimpleConnection::batch_execute(conn, setup)?;
            }
            diesel::sql_query(format!(
                "SELECT o.seq, o.id, o.destination, o.payload FROM outbox_messages o \
                 WHERE o.dead_at IS NULL AND o.available_at <= {now} \
                 AND (o.locked_until IS NULL OR o.locked_until < {now}) \
                 AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM outbox_messages e \
                 WHERE e.ordering_key = o.ordering_key AND e.seq < o.seq AND e.dead_at IS NULL)) \
                 ORDER BY o.seq LIMIT {limit}{skip_locked}"
            ))
            .load(conn)
        }

        fn hand_delete(conn: &mut $Conn, seqs: &[i64]) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use diesel_inbox::outbox_messages as o;
            diesel::delete(o::table.filter(o::seq.eq_any(seqs))).execute(conn)
        }

        fn record(conn: &mut $Conn, consumer: &str, key: &str) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use diesel_inbox::inbox_messages as inbox;
            diesel::insert_into(inbox::table)
                .values((inbox::consumer.eq(consumer), inbox::message_id.eq(key)))
                .execute(conn)
        }

        #[cfg(feature = "async")]
        async fn insert_order_async(
            conn: &mut Self::AsyncConn,
            order: &$crate::Order,
        ) -> diesel::QueryResult<usize> {
            use diesel::prelude::*;
            use $crate::bench_orders;
            let insert = diesel::insert_into(bench_orders::table).values((
                bench_orders::id.eq(&order.id),
                bench_orders::amount.eq(order.amount),
            ));
            diesel_async::RunQueryDsl::execute(insert, conn).await
        }
    };
}
use orders_access;

/// The pool and pooled connection types of a diesel-async connection
/// `$Conn` on deadpool, and taking a connection: `deadpool_types!(Conn)`
/// inside a [`Bench`] impl (its `pool` stays its own).
#[cfg(feature = "async")]
macro_rules! deadpool_types {
    ($Conn:ty) => {
        type Pool = diesel_async::pooled_connection::deadpool::Pool<$Conn>;
        type Pooled = diesel_async::pooled_connection::deadpool::Object<$Conn>;
        #[cfg(feature = "lapin")]
        type RelayPool = Self::Pool;

        #[cfg(feature = "lapin")]
        fn relay_pool(url: &str, size: usize) -> Self::Pool {
            Self::pool(url, size)
        }

        async fn pooled(pool: &Self::Pool) -> Result<Self::Pooled, String> {
            pool.get().await.map_err(|e| format!("pool: {e}"))
        }
    };
}
#[cfg(feature = "async")]
use deadpool_types;

/// The hand-written async variants on diesel-async's transaction (the
/// server backends), with the backend's `claim(key)` statement.
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
macro_rules! async_variants {
    () => {
        async fn bare_async(conn: &mut Self::AsyncConn, order: &$crate::Order) -> QueryResult<()> {
            use diesel_async::AsyncConnection;
            conn.transaction(async |c| {
                Self::insert_order_async(c, order).await?;
                Ok(())
            })
            .await
        }

        async fn raw_sql_async(
            conn: &mut Self::AsyncConn,
            order: &$crate::Order,
        ) -> QueryResult<()> {
            use diesel_async::AsyncConnection;
            conn.transaction(async |c| {
                if diesel_async::RunQueryDsl::execute(claim(&order.id), c).await? == 1 {
                    Self::insert_order_async(c, order).await?;
                }
                Ok(())
            })
            .await
        }
    };
}
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
use async_variants;
