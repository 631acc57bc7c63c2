//! The operations console's reads of the inbox ([`OverviewOp`]): each
//! one an index walk or a bounded range, never a scan of the table, so
//! that a page over ten million rows answers in milliseconds. They run
//! through the outbox's machinery ([`Op::Overview`](super::outbox::Op)),
//! on a sync or an async connection alike.

use super::stmt::{Bind, Stmt};
use super::Internals;
use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;

/// One of the overview's reads.
#[derive(Debug, Clone)]
#[doc(hidden)]
pub enum OverviewOp {
    /// The consumers with inbox rows, at most `limit` (up to 500): a walk
    /// of the primary key, one index probe per consumer.
    Consumers { limit: i32 },
    /// The rows of `consumer`, counted up to `cap`.
    Kept { consumer: String, cap: i64 },
    /// Rows claimed per consumer in each minute that starts at one of
    /// `starts` (microseconds since 1970, whole minutes): of each minute,
    /// the first `cap` rows by `received_at` only (a range of its index),
    /// so that the read is bounded whatever the traffic. `label` is the
    /// consumer, `n` its rows among those read, `m` the minute's place in
    /// `starts`.
    Rates { starts: Vec<i64>, cap: i64 },
    /// Per consumer, the keys failing (`inbox_attempts`) and those with at
    /// least `exhausted_at` failures.
    Failing { exhausted_at: i32 },
    /// The database's clock, in microseconds (`n`).
    Clock,
    /// The outbox's status ([`StatusRow`](super::outbox::StatusRow)s) of
    /// its oldest `cap` rows only: a read of the primary key.
    Outbox { cap: i64 },
    /// The outbox's rows, counted up to `cap`.
    OutboxRows { cap: i64 },
}

/// A label and two counts: what every [`OverviewOp`] returns.
#[derive(Debug, Clone, QueryableByName)]
#[doc(hidden)]
pub struct TallyRow {
    #[diesel(sql_type = Text)]
    pub label: String,
    #[diesel(sql_type = BigInt)]
    pub n: i64,
    #[diesel(sql_type = BigInt)]
    pub m: i64,
}

/// The statement of `op`.
pub(crate) fn plan<B: Internals>(op: OverviewOp) -> Stmt {
    match op {
        // MySQL stops a recursion at 1,000 steps (`cte_max_recursion_depth`).
        OverviewOp::Consumers { limit } => Stmt::new()
            .sql(
                "WITH RECURSIVE walk (consumer, depth) AS (\
                 SELECT MIN(consumer), 1 FROM inbox_messages \
                 UNION ALL SELECT (SELECT MIN(i.consumer) FROM inbox_messages i \
                 WHERE i.consumer > walk.consumer), walk.depth + 1 FROM walk \
                 WHERE walk.consumer IS NOT NULL AND walk.depth < ",
            )
            .bind(Bind::Int(limit.clamp(1, 500)))
            .sql(
                ") SELECT consumer AS label, COUNT(*) AS n, COUNT(*) AS m FROM walk \
                 WHERE consumer IS NOT NULL GROUP BY consumer ORDER BY consumer",
            ),
        OverviewOp::Kept { consumer, cap } => Stmt::new()
            .sql(
                "SELECT consumer AS label, COUNT(*) AS n, COUNT(*) AS m FROM \
                 (SELECT consumer FROM inbox_messages WHERE consumer = ",
            )
            .bind(Bind::Text(consumer))
            .sql(" LIMIT ")
            .bind(Bind::Big(cap))
            .sql(") kept GROUP BY consumer"),
        OverviewOp::Rates { starts, cap } => {
            let (before, after) = B::RECEIVED_AT_OF_MICROS;
            let mut stmt = Stmt::new();
            for (place, start) in starts.into_iter().enumerate() {
                if place > 0 {
                    stmt = stmt.sql(" UNION ALL ");
                }
                stmt = stmt
                    .sql("SELECT label, n, m FROM (SELECT consumer AS label, COUNT(*) AS n, CAST(")
                    .bind(Bind::Big(place as i64))
                    .sql(" AS ")
                    .sql(B::BIGINT)
                    .sql(
                        ") AS m FROM (SELECT consumer FROM inbox_messages \
                         WHERE received_at >= ",
                    )
                    .sql(before)
                    .bind(Bind::Big(start))
                    .sql(after)
                    .sql(" AND received_at < ")
                    .sql(before)
                    .bind(Bind::Big(start + 60_000_000))
                    .sql(after)
                    .sql(" ORDER BY received_at LIMIT ")
                    .bind(Bind::Big(cap))
                    .sql(") first_rows GROUP BY consumer) minute_rows");
            }
            stmt
        }
        OverviewOp::Failing { exhausted_at } => Stmt::new()
            .sql(
                "SELECT consumer AS label, COUNT(*) AS n, \
                 COUNT(CASE WHEN failures >= ",
            )
            .bind(Bind::Int(exhausted_at))
            .sql(" THEN 1 END) AS m FROM inbox_attempts GROUP BY consumer ORDER BY consumer"),
        OverviewOp::OutboxRows { cap } => Stmt::new()
            .sql(
                "SELECT 'outbox' AS label, COUNT(*) AS n, COUNT(*) AS m FROM \
                 (SELECT seq FROM outbox_messages LIMIT ",
            )
            .bind(Bind::Big(cap))
            .sql(") counted"),
        // Planned as a status (`outbox::plan`).
        OverviewOp::Outbox { .. } => unreachable!("the outbox's status is planned by outbox::plan"),
        OverviewOp::Clock => Stmt::new()
            .sql("SELECT 'now' AS label, ")
            .sql(B::NOW_MICROS)
            .sql(" AS n, ")
            .sql(B::NOW_MICROS)
            .sql(" AS m"),
    }
}
