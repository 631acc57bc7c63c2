//! What the operations console shows on its first page ([`overview`]):
//! per consumer the rows kept, the rows applied per minute and the keys
//! failing; the outbox per destination; the stream positions. Its reads
//! walk indexes and bounded ranges, never a whole table
//! (`backend::overview`).

#[cfg(feature = "async")]
use crate::backend::asynchronous::{AsAsyncConnection, AsyncInboxConnection};
use crate::backend::outbox::{Answer, Op, OverviewOp, TallyRow, WalOp};
use crate::backend::Statements;
use crate::error::InboxError;
use crate::ops::{ops_error, StreamPosition};
use crate::outbox::OutboxStatus;
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How many minutes [`ConsumerActivity::per_minute`] covers.
pub const RATE_MINUTES: usize = crate::recent::MINUTES;

/// Up to how many rows a consumer's rows, and the outbox's, are counted
/// ([`RowCount::AtLeast`] beyond): each count reads at most this many
/// index entries.
pub const COUNT_CAP: u64 = 10_000;

/// Of each minute, the overview counts at most this many inbox rows (the
/// first by `received_at`): a minute with more is shown as a lower bound
/// ([`ConsumerActivity::at_least`]), so that the overview's cost is bounded
/// by the page, not by the traffic.
pub const RATE_CAP: u64 = 1_000;

/// At most this many consumers are shown.
const MAX_CONSUMERS: i32 = 500;

/// How many inbox rows a consumer keeps: counted exactly up to
/// [`COUNT_CAP`], so that a page over millions of rows reads no more than
/// that (`diesel-inbox stats` counts them all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowCount {
    /// Exactly this many.
    Exact(u64),
    /// At least this many (the count stopped there).
    AtLeast(u64),
}

/// One consumer (or HTTP endpoint, `http:<endpoint>`) in an [`Overview`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerActivity {
    /// The consumer.
    pub consumer: String,
    /// Its inbox rows.
    pub rows: RowCount,
    /// Rows applied per minute (by their `received_at`), the last
    /// [`RATE_MINUTES`] minutes of the database's clock, oldest first: the
    /// last entry is the current minute, so far.
    pub per_minute: Vec<u64>,
    /// For each entry of [`per_minute`](Self::per_minute), whether it is a
    /// lower bound: its minute had more than [`RATE_CAP`] rows (of every
    /// consumer together), and the entry counts this consumer's among the
    /// first of them by `received_at`. Exact otherwise.
    pub at_least: Vec<bool>,
    /// Keys whose deliveries are failing (`max_attempts` counts).
    pub failing: u64,
    /// Of those, the ones with at least the `max_attempts` given to
    /// [`overview`] failures: given up on. `None` without it.
    pub exhausted: Option<u64>,
}

/// What [`overview`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Overview {
    /// The consumers with rows or failing keys, in name order.
    pub consumers: Vec<ConsumerActivity>,
    /// The outbox ([`outbox::status`](crate::outbox::status)): of all its
    /// rows when [`outbox_rows`](Self::outbox_rows) is exact, else of its
    /// oldest [`COUNT_CAP`] rows (`diesel-inbox outbox status` counts
    /// all).
    pub outbox: OutboxStatus,
    /// The outbox's rows (live and dead).
    pub outbox_rows: RowCount,
    /// The stream positions of every consumer
    /// ([`positions`](crate::positions)).
    pub positions: Vec<StreamPosition>,
    /// The database's clock when it was read.
    pub at: SystemTime,
}

/// The overview's reads before the per-consumer counts.
struct First {
    now_micros: i64,
    consumers: Vec<String>,
    failing: Vec<TallyRow>,
    outbox: OutboxStatus,
    outbox_rows: RowCount,
    positions: Vec<StreamPosition>,
}

/// The first reads: the clock, the consumers, the failing keys,
/// the outbox (its oldest rows, their count, the WAL slot where the
/// backend has one: `wal`) and the positions.
fn first_ops(max_attempts: Option<u32>, wal: bool) -> Vec<Op> {
    let cap = COUNT_CAP as i64;
    let mut ops = vec![
        Op::Overview(OverviewOp::Clock),
        Op::Overview(OverviewOp::Consumers {
            limit: MAX_CONSUMERS,
        }),
        Op::Overview(OverviewOp::Failing {
            exhausted_at: max_attempts.map_or(i32::MAX, |n| n.min(i32::MAX as u32) as i32),
        }),
        Op::Overview(OverviewOp::Outbox { cap }),
        Op::Overview(OverviewOp::OutboxRows { cap: cap + 1 }),
        Op::Positions { consumer: None },
    ];
    if wal {
        ops.push(Op::Wal(WalOp::SlotStatus));
    }
    ops
}

/// At most [`COUNT_CAP`], or more.
fn capped(n: i64) -> RowCount {
    match n.max(0) as u64 {
        n if n > COUNT_CAP => RowCount::AtLeast(COUNT_CAP),
        n => RowCount::Exact(n),
    }
}

fn tally(answer: Answer) -> Result<Vec<TallyRow>, InboxError> {
    match answer {
        Answer::Tally(rows) => Ok(rows),
        other => Err(crate::outbox::unexpected_answer(other)),
    }
}

impl First {
    fn of(answers: Vec<Answer>) -> Result<Self, InboxError> {
        let mut answers = answers.into_iter();
        let mut next = || {
            answers
                .next()
                .ok_or_else(|| InboxError::InvalidArgument("the overview's reads ended early"))
        };
        let now_micros = tally(next()?)?.first().map_or(0, |row| row.n);
        let mut consumers: Vec<String> = tally(next()?)?.into_iter().map(|row| row.label).collect();
        let failing = tally(next()?)?;
        let mut outbox = match next()? {
            Answer::Status(rows) => crate::outbox::counted_status(rows),
            other => return Err(crate::outbox::unexpected_answer(other)),
        };
        let outbox_rows = capped(tally(next()?)?.first().map_or(0, |row| row.n));
        let positions = crate::ops::positions_of(next()?)?;
        if let Ok(answer) = next() {
            match answer {
                Answer::Texts(texts) => outbox.wal = crate::outbox::wal_slot_of(texts)?,
                other => return Err(crate::outbox::unexpected_answer(other)),
            }
        }
        for row in &failing {
            if !consumers.contains(&row.label) {
                consumers.push(row.label.clone());
            }
        }
        consumers.sort();
        Ok(First {
            now_micros,
            consumers,
            failing,
            outbox,
            outbox_rows,
            positions,
        })
    }

    /// The starts of the rates' minutes (microseconds since 1970), oldest
    /// first: the last is the current minute's.
    fn minutes(&self) -> Vec<i64> {
        let now_minute = self.now_micros.div_euclid(60_000_000);
        (0..RATE_MINUTES as i64)
            .rev()
            .map(|ago| (now_minute - ago) * 60_000_000)
            .collect()
    }

    /// Each consumer's rows (counted up to [`COUNT_CAP`]), then the rates.
    fn count_ops(&self) -> Vec<Op> {
        let mut ops: Vec<Op> = self
            .consumers
            .iter()
            .map(|consumer| {
                Op::Overview(OverviewOp::Kept {
                    consumer: consumer.clone(),
                    cap: COUNT_CAP as i64 + 1,
                })
            })
            .collect();
        ops.push(Op::Overview(OverviewOp::Rates {
            starts: self.minutes(),
            cap: RATE_CAP as i64 + 1,
        }));
        ops
    }

    /// Per consumer, its rows per minute, and which minutes were cut at
    /// [`RATE_CAP`] (their counts lower bounds).
    fn rates(rows: &[TallyRow]) -> (BTreeMap<String, Vec<u64>>, Vec<bool>) {
        let mut read = [0u64; RATE_MINUTES];
        let mut per_minute: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for row in rows {
            let Some(place) = usize::try_from(row.m).ok().filter(|p| *p < RATE_MINUTES) else {
                continue;
            };
            let n = row.n.max(0) as u64;
            read[place] += n;
            per_minute
                .entry(row.label.clone())
                .or_insert_with(|| vec![0; RATE_MINUTES])[place] += n;
        }
        // One more than the cap is read: a minute of exactly the cap is
        // exact.
        (per_minute, read.iter().map(|n| *n > RATE_CAP).collect())
    }

    fn finish(
        self,
        mut counts: Vec<Answer>,
        max_attempts: Option<u32>,
    ) -> Result<Overview, InboxError> {
        let rates = match counts.pop() {
            Some(answer) => tally(answer)?,
            None => {
                return Err(InboxError::InvalidArgument(
                    "the overview's reads ended early",
                ))
            }
        };
        let (per_minute, at_least) = Self::rates(&rates);
        let mut consumers = Vec::with_capacity(self.consumers.len());
        for (consumer, count) in self.consumers.iter().zip(counts) {
            let kept = tally(count)?.first().map_or(0, |row| row.n);
            let failing = self.failing.iter().find(|row| &row.label == consumer);
            consumers.push(ConsumerActivity {
                consumer: consumer.clone(),
                rows: capped(kept),
                per_minute: per_minute
                    .get(consumer.as_str())
                    .cloned()
                    .unwrap_or_else(|| vec![0; RATE_MINUTES]),
                at_least: at_least.clone(),
                failing: failing.map_or(0, |row| row.n.max(0) as u64),
                exhausted: max_attempts.map(|_| failing.map_or(0, |row| row.m.max(0) as u64)),
            });
        }
        Ok(Overview {
            consumers,
            outbox: self.outbox,
            outbox_rows: self.outbox_rows,
            positions: self.positions,
            at: UNIX_EPOCH + Duration::from_micros(self.now_micros.max(0) as u64),
        })
    }
}

/// What the operations console shows first: per consumer its rows (up
/// to [`COUNT_CAP`]), its rows applied per minute and its failing keys
/// (`max_attempts`: the handlers' setting, which the table does not
/// record, to count the keys given up on); the outbox (of its oldest
/// [`COUNT_CAP`] rows, when it holds more); the stream positions. Its
/// reads walk the indexes and bounded ranges: none reads a whole table,
/// so that it answers in milliseconds over millions of rows. It sets no
/// metric ([`outbox::status`](crate::outbox::status) does).
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{idempotent, InboxError, RowCount};
///
/// #[idempotent(key = "id")]
/// fn bill(conn: &mut SqliteConnection, id: i64) -> Result<(), InboxError> {
///     Ok(())
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// bill(&mut conn, 1)?;
/// bill(&mut conn, 2)?;
/// let overview = diesel_inbox::overview(&mut conn, Some(5))?;
/// let bill = &overview.consumers[0];
/// assert_eq!((bill.consumer.as_str(), bill.rows), ("bill", RowCount::Exact(2)));
/// assert_eq!(bill.per_minute.iter().sum::<u64>(), 2);
/// assert_eq!((bill.failing, bill.exhausted), (0, Some(0)));
/// assert_eq!((overview.outbox.pending, overview.outbox_rows), (0, RowCount::Exact(0)));
/// # Ok(())
/// # }
/// ```
pub fn overview<C>(conn: &mut C, max_attempts: Option<u32>) -> Result<Overview, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let run = |conn: &mut C, ops: Vec<Op>| -> Result<Vec<Answer>, InboxError> {
        ops.into_iter()
            .map(|op| C::Backend::outbox(conn, op).map_err(ops_error::<C::Backend>))
            .collect()
    };
    let wal = <C::Backend as crate::backend::Internals>::WAL;
    let first = First::of(run(conn, first_ops(max_attempts, wal))?)?;
    let counts = run(conn, first.count_ops())?;
    first.finish(counts, max_attempts)
}

/// The async twin of [`overview`].
#[cfg(feature = "async")]
pub async fn overview_async<P, C, Via>(
    conn: &mut P,
    max_attempts: Option<u32>,
) -> Result<Overview, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    async fn run<C: AsyncInboxConnection>(
        conn: &mut C,
        ops: Vec<Op>,
    ) -> Result<Vec<Answer>, InboxError> {
        let mut answers = Vec::with_capacity(ops.len());
        for op in ops {
            answers.push(
                conn.inbox_outbox(op)
                    .await
                    .map_err(ops_error::<C::Backend>)?,
            );
        }
        Ok(answers)
    }
    let conn = conn.connection();
    let wal = <C::Backend as crate::backend::Internals>::WAL;
    let first = First::of(run(conn, first_ops(max_attempts, wal)).await?)?;
    let counts = run(conn, first.count_ops()).await?;
    first.finish(counts, max_attempts)
}
