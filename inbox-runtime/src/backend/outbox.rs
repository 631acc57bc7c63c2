//! The outbox's statements (and the stream positions' of the inbox's
//! Kafka runner), written once for every backend, and their runs on a sync
//! and an async connection. What differs between databases comes
//! in as the backend's constants (`Internals`): the clock (`NOW_MICROS`),
//! the locking clause of the relay's claim (`SKIP_LOCKED`) and the guard of
//! a cached write (`GUARDED`, `push_guard`). An operation is an owned [`Op`], so
//! that SQLite's async connection can hand it to its blocking thread whole.
//! The stream positions' own statements are in [`positions`].
// Without a backend feature nothing runs these.
#![cfg_attr(not(feature = "_any-backend"), allow(dead_code))]

#[cfg(all(feature = "async", feature = "_any-backend"))]
use super::statements::LoadOnAsync;
use super::statements::{ExecuteOn, LoadOn};
use super::Internals;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, Binary, HasSqlType, Integer, Nullable, Text, Untyped};
use diesel::QueryableByName;

use super::outbox_claim::ClaimPlan;
pub(crate) use super::outbox_claim::SeqRow;
pub use super::outbox_claim::{ClaimedRow, Floor, WindowRow};
#[cfg(feature = "async")]
pub use super::outbox_wal::AsideRow;
pub use super::outbox_wal::WalOp;
use super::outbox_wal::{self as wal, WalEmit, WalPlan};
use super::outbox_wal::{CountRow, TextRow};
use super::overview;
pub use super::overview::{OverviewOp, TallyRow};
pub(crate) use super::positions::OffsetRow;
pub use super::positions::PositionRow;
use super::positions::{self, moved, Move};
use super::stmt::{Bind, Stmt};
use crate::fence::{Fenced, Position};

/// One outbox operation and its arguments. (The relay's operations run
/// only with `async`.)
#[derive(Debug, Clone)]
#[doc(hidden)]
#[cfg_attr(not(feature = "async"), allow(dead_code))]
pub enum Op {
    /// Insert a message, in the caller's transaction.
    Enqueue(NewRow),
    /// The relay's claim, in a short transaction the caller opened: up to
    /// `limit` due rows, oldest first, skipping rows other relays hold: the
    /// oldest live row of each key (or a row without a key), then the
    /// later rows of those keys up to the first that is not due; each is
    /// held for `lease` microseconds under `token`.
    Claim {
        limit: i64,
        lease: i64,
        token: String,
        /// Where the look starts: the floor the relay's last claim left
        /// (`outbox_claim::Floor`), none for a look from the lowest `seq`.
        floor: Option<Floor>,
    },
    /// Deletes the published rows that `token` still holds.
    Published { token: String, seqs: Vec<i64> },
    /// A failed publish of a row `token` holds: counted, due again after
    /// `delay` microseconds, dead once it has failed `max_attempts` times.
    Failed {
        token: String,
        seq: i64,
        error: String,
        delay: i64,
        max_attempts: i32,
    },
    /// Gives rows back unpublished and uncounted (the broker was down).
    Released { token: String, seqs: Vec<i64> },
    /// Pending and dead messages per destination.
    Status,
    /// The dead messages `which` selects, oldest first, at most `limit`.
    Dead { which: DeadWhere, limit: i64 },
    /// The dead messages `which` selects without their payloads and
    /// headers (their failures, for the groups), newest first, at most
    /// `limit`.
    DeadFailures { which: DeadWhere, limit: i64 },
    /// Makes the dead messages `which` selects pending again.
    Retry { which: DeadWhere },
    /// Deletes the dead messages `which` selects.
    Discard { which: DeadWhere },
    /// One of the operations console's reads.
    Overview(OverviewOp),
    /// Deletes up to `limit` messages dead for longer than `older_than`
    /// microseconds, in the caller's transaction.
    PurgeDead { older_than: i64, limit: i64 },
    /// Moves each stream position of `consumer` to `last + 1` behind the
    /// fence ([`Position::admits`]), in the handler's transaction, in the
    /// given order: each stored row is read and locked first; the first
    /// refusal ends the op.
    Fence {
        consumer: String,
        positions: Vec<Position>,
    },
    /// The stored stream positions (of `consumer`, or of all).
    Positions { consumer: Option<String> },
    /// The WAL outbox's enqueue, in the caller's transaction: writes
    /// `record` (the message, encoded) to the WAL where the database has a
    /// usable slot (`Count(1)`), else nothing (`Count(0)`).
    Emit { record: Vec<u8>, notify: bool },
    /// The WAL relay's operations.
    Wal(WalOp),
}

/// Which dead messages an operation takes: every condition given must
/// hold (bound parameters, never SQL text).
#[derive(Debug, Clone, Default)]
#[doc(hidden)]
pub struct DeadWhere {
    /// One of these ids (none: no message).
    pub ids: Option<Vec<String>>,
    pub destination: Option<String>,
    /// A `LIKE` pattern on the lower-cased last error, escaped with `!`.
    pub error_like: Option<String>,
    /// A `LIKE` pattern on the last error as it is (a missing one as
    /// empty), escaped with `!`: a failure group's candidates.
    pub failure_like: Option<String>,
    /// Dead at or after (microseconds since 1970).
    pub since: Option<i64>,
    /// Dead before.
    pub before: Option<i64>,
}

impl DeadWhere {
    /// `stmt` and ` WHERE dead_at IS NOT NULL AND ...`.
    fn push(self, stmt: Stmt) -> Stmt {
        let mut stmt = stmt.sql(" WHERE dead_at IS NOT NULL");
        match self.ids.as_deref() {
            None => {}
            Some([]) => stmt = stmt.sql(" AND 1 = 0"),
            Some([id]) => stmt = stmt.sql(" AND id = ").bind(Bind::Text(id.clone())),
            Some(ids) => {
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                stmt = stmt.sql(" AND id IN ").text_list(&ids);
            }
        }
        if let Some(destination) = self.destination {
            stmt = stmt
                .sql(" AND destination = ")
                .bind(Bind::Text(destination));
        }
        if let Some(pattern) = self.error_like {
            stmt = stmt
                .sql(" AND LOWER(last_error) LIKE ")
                .bind(Bind::Text(pattern))
                .sql(" ESCAPE '!'");
        }
        if let Some(pattern) = self.failure_like {
            stmt = stmt
                .sql(" AND COALESCE(last_error, '') LIKE ")
                .bind(Bind::Text(pattern))
                .sql(" ESCAPE '!'");
        }
        if let Some(since) = self.since {
            stmt = stmt.sql(" AND dead_at >= ").bind(Bind::Big(since));
        }
        if let Some(before) = self.before {
            stmt = stmt.sql(" AND dead_at < ").bind(Bind::Big(before));
        }
        stmt
    }
}

/// A message to insert.
#[derive(Debug, Clone)]
#[doc(hidden)]
pub struct NewRow {
    pub id: String,
    pub destination: String,
    pub key: Option<String>,
    pub payload: Vec<u8>,
    pub headers: Option<Vec<u8>>,
    /// Microseconds after the transaction's time before it is due.
    pub after: i64,
    /// Or the time it is due (microseconds since 1970).
    pub at: Option<i64>,
    /// Whether its commit wakes the relays of other processes, where the
    /// backend can (`Internals::push_enqueue_notify`).
    pub notify: bool,
}

/// What an [`Op`] returned.
#[derive(Debug)]
#[doc(hidden)]
#[cfg_attr(not(feature = "async"), allow(dead_code))]
pub enum Answer {
    /// Rows written or deleted.
    Count(usize),
    /// The claimed rows, and the floor the claim's look left.
    Claimed(Vec<ClaimedRow>, Option<Floor>),
    Status(Vec<StatusRow>),
    Dead(Vec<DeadRow>),
    Fenced(Fenced),
    Positions(Vec<PositionRow>),
    /// Texts (the WAL slot's name, the keys with live rows).
    Texts(Vec<String>),
    /// The console's counts ([`OverviewOp`]).
    Tally(Vec<TallyRow>),
}

/// One destination's counts.
#[derive(Debug, Clone, QueryableByName)]
#[doc(hidden)]
pub struct StatusRow {
    #[diesel(sql_type = Text)]
    pub destination: String,
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    #[diesel(sql_type = BigInt)]
    pub scheduled: i64,
    #[diesel(sql_type = BigInt)]
    pub dead: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub oldest_pending: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub next_scheduled: Option<i64>,
    #[diesel(sql_type = BigInt)]
    pub now: i64,
}

/// A dead message.
#[derive(Debug, Clone, QueryableByName)]
#[doc(hidden)]
pub struct DeadRow {
    #[diesel(sql_type = Text)]
    pub id: String,
    #[diesel(sql_type = Text)]
    pub destination: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub ordering_key: Option<String>,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_error: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub created_at: i64,
    #[diesel(sql_type = BigInt)]
    pub dead_at: i64,
    /// `None` where the statement left it out ([`Op::DeadFailures`]).
    #[diesel(sql_type = Nullable<Binary>)]
    pub payload: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    pub headers: Option<Vec<u8>>,
}

/// The outbox's enqueue: one fixed statement per backend, cached as the
/// claims are (its query id is its own type), its SQL all static pieces
/// and its binds the row's own values (moved in, not copied), so that the handler's path builds
/// no SQL text. Where the backend guards its cached writes
/// (`Internals::GUARDED`, PostgreSQL), it is `INSERT .. SELECT` behind the
/// guard and returns its marker, [`ENQUEUED`], checked by [`enqueued`].
#[derive(Debug, Clone)]
pub(crate) struct Enqueue(NewRow);

impl<B> QueryFragment<B> for Enqueue
where
    B: Internals + HasSqlType<Text> + HasSqlType<Binary> + HasSqlType<BigInt>,
    String: ToSql<Text, B>,
    Vec<u8>: ToSql<Binary, B>,
    i64: ToSql<BigInt, B>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, B>) -> QueryResult<()> {
        let row = &self.0;
        out.push_sql(
            "INSERT INTO outbox_messages (id, destination, ordering_key, payload, headers, \
             created_at, available_at, attempts) ",
        );
        out.push_sql(if B::GUARDED { "SELECT " } else { "VALUES (" });
        out.push_bind_param::<Text, String>(&row.id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, String>(&row.destination)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<Text>, Option<String>>(&row.key)?;
        out.push_sql(", ");
        out.push_bind_param::<Binary, Vec<u8>>(&row.payload)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<Binary>, Option<Vec<u8>>>(&row.headers)?;
        out.push_sql(", ");
        out.push_sql(B::NOW_MICROS);
        // Due at `at`, or `after` past the transaction's time (the same
        // statement for every message: one cached statement).
        out.push_sql(", COALESCE(");
        out.push_bind_param::<Nullable<BigInt>, Option<i64>>(&row.at)?;
        out.push_sql(", ");
        out.push_sql(B::NOW_MICROS);
        out.push_sql(" + ");
        out.push_bind_param::<BigInt, i64>(&row.after)?;
        out.push_sql("), 0");
        if B::GUARDED {
            B::push_enqueue_notify(&mut out, &row.notify)?;
            B::push_guard(&mut out, ENQUEUE_STATEMENT)?;
            out.push_sql(" RETURNING '");
            out.push_sql(ENQUEUED);
            out.push_sql("' AS marker");
        } else {
            out.push_sql(")");
        }
        Ok(())
    }
}

// Its own type is its id (as diesel's statements): one cached statement.
impl QueryId for Enqueue {
    type QueryId = Enqueue;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl Query for Enqueue {
    type SqlType = Untyped;
}

impl<Conn> diesel::RunQueryDsl<Conn> for Enqueue {}

/// The statements of `op`, as [`Plan`] says to run them (the op's values
/// move into the binds: an enqueue's payload is not copied).
fn plan<B: Internals>(op: Op) -> Plan {
    let now = B::NOW_MICROS;
    match op {
        Op::Enqueue(row) => Plan::Enqueue(row),
        Op::Claim {
            limit,
            lease,
            token,
            floor,
        } => Plan::Claim(ClaimPlan {
            token,
            lease,
            limit,
            floor,
        }),
        Op::Published { token, seqs } => Plan::Execute(
            Stmt::new()
                .sql("DELETE FROM outbox_messages WHERE locked_by = ")
                .bind(Bind::Text(token))
                .sql(" AND seq IN ")
                .seq_list(&seqs),
        ),
        // `dead_at` first: MySQL assigns left to right, with the new
        // `attempts` in later expressions.
        Op::Failed {
            token,
            seq,
            error,
            delay,
            max_attempts,
        } => Plan::Execute(
            Stmt::new()
                .sql("UPDATE outbox_messages SET dead_at = CASE WHEN attempts + 1 >= ")
                .bind(Bind::Int(max_attempts))
                .sql(" THEN ")
                .sql(now)
                .sql(" ELSE NULL END, attempts = attempts + 1, last_error = ")
                .bind(Bind::Text(crate::rows::error_text(&error).to_owned()))
                .sql(", available_at = ")
                .sql(now)
                .sql(" + ")
                .bind(Bind::Big(delay))
                .sql(", locked_by = NULL, locked_until = NULL WHERE seq = ")
                .bind(Bind::Big(seq))
                .sql(" AND locked_by = ")
                .bind(Bind::Text(token)),
        ),
        Op::Released { token, seqs } => Plan::Execute(
            Stmt::new()
                .sql("UPDATE outbox_messages SET locked_by = NULL, locked_until = NULL WHERE locked_by = ")
                .bind(Bind::Text(token))
                .sql(" AND seq IN ")
                .seq_list(&seqs),
        ),
        // Scheduled: never tried and not yet due (a retried row's
        // `available_at` is its backoff: pending). A pending row became due
        // at its `available_at` if never tried (its enqueue, its delivery
        // time or its replay), else at its enqueue.
        Op::Status => Plan::Status(status::<B>(None)),
        Op::Overview(OverviewOp::Outbox { cap }) => Plan::Status(status::<B>(Some(cap))),
        Op::Dead { which, limit } => Plan::Dead(
            which
                .push(Stmt::new().sql(
                    "SELECT id, destination, ordering_key, attempts, last_error, created_at, \
                     dead_at, payload, headers FROM outbox_messages",
                ))
                .sql(" ORDER BY seq LIMIT ")
                .bind(Bind::Big(limit)),
        ),
        Op::DeadFailures { which, limit } => Plan::Dead(
            which
                .push(Stmt::new().sql(
                    "SELECT id, destination, ordering_key, attempts, last_error, created_at, \
                     dead_at, NULL AS payload, NULL AS headers FROM outbox_messages",
                ))
                .sql(" ORDER BY seq DESC LIMIT ")
                .bind(Bind::Big(limit)),
        ),
        // A row made live again is found by a relay's floor.
        Op::Retry { which } => Plan::Execute(
            which.push(
                Stmt::new()
                    .sql(
                        "UPDATE outbox_messages SET dead_at = NULL, attempts = 0, last_error = NULL, \
                         available_at = ",
                    )
                    .sql(now)
                    .sql(B::SET_TXID.unwrap_or("")),
            ),
        ),
        Op::Discard { which } => {
            Plan::Execute(which.push(Stmt::new().sql("DELETE FROM outbox_messages")))
        }
        Op::Overview(op) => Plan::Tally(overview::plan::<B>(op)),
        Op::Fence {
            consumer,
            positions: all,
        } => Plan::Fence(
            B::FENCED_IDLE_LIMIT.map(|bound| Stmt::new().sql("SELECT ").sql(bound)),
            positions::fence(consumer, all),
        ),
        Op::Positions { consumer } => Plan::Positions(positions::list::<B>(consumer)),
        Op::Emit { .. } if !B::WAL => Plan::Wal(WalPlan::Refused),
        Op::Emit { record, notify } => Plan::Emit(WalEmit { record, notify }),
        Op::Wal(op) => Plan::Wal(wal::plan::<B>(op)),
        Op::PurgeDead { older_than, limit } => Plan::Purge(
            Stmt::new()
                .sql("SELECT seq FROM outbox_messages WHERE dead_at IS NOT NULL AND dead_at < ")
                .sql(now)
                .sql(" - ")
                .bind(Bind::Big(older_than))
                .sql(" ORDER BY seq LIMIT ")
                .bind(Bind::Big(limit)),
        ),
    }
}

/// Pending, scheduled and dead messages per destination: of the whole
/// table, or (`capped`) of its oldest rows only, a read of the primary
/// key's first `cap` entries.
fn status<B: Internals>(capped: Option<i64>) -> Stmt {
    let now = B::NOW_MICROS;
    let stmt = Stmt::new()
        .sql(
            "SELECT destination, \
                     COUNT(CASE WHEN dead_at IS NULL AND NOT (attempts = 0 AND available_at > ",
        )
        .sql(now)
        .sql(
            ") THEN 1 END) AS pending, \
                     COUNT(CASE WHEN dead_at IS NULL AND attempts = 0 AND available_at > ",
        )
        .sql(now)
        .sql(
            " THEN 1 END) AS scheduled, COUNT(dead_at) AS dead, \
                     MIN(CASE WHEN dead_at IS NULL AND NOT (attempts = 0 AND available_at > ",
        )
        .sql(now)
        .sql(
            ") THEN CASE WHEN attempts = 0 THEN available_at ELSE created_at END END) \
                     AS oldest_pending, \
                     MIN(CASE WHEN dead_at IS NULL AND attempts = 0 AND available_at > ",
        )
        .sql(now)
        .sql(" THEN available_at END) AS next_scheduled, ")
        .sql(now)
        .sql(" AS now FROM ");
    match capped {
        None => stmt.sql("outbox_messages"),
        Some(cap) => stmt
            .sql(
                "(SELECT destination, dead_at, attempts, available_at, created_at \
                 FROM outbox_messages ORDER BY seq LIMIT ",
            )
            .bind(Bind::Big(cap))
            .sql(") oldest"),
    }
    .sql(" GROUP BY destination ORDER BY destination")
}

/// What the enqueue is called in the guard's error (`Internals::push_guard`).
const ENQUEUE_STATEMENT: &str = "outbox enqueue";
/// The row only the guarded enqueue returns.
const ENQUEUED: &str = "diesel-inbox enqueue";

/// The guarded enqueue's row.
#[derive(Debug, QueryableByName)]
pub(crate) struct MarkerRow {
    #[diesel(sql_type = Text)]
    marker: String,
}

/// The guarded enqueue inserted one row when it returned its own marker
/// once; anything else was another statement under its name.
fn enqueued(rows: &[MarkerRow]) -> QueryResult<Answer> {
    match rows {
        [row] if row.marker == ENQUEUED => Ok(Answer::Count(1)),
        [] => Err(super::errors::misrouted(
            ENQUEUE_STATEMENT,
            "returned no row of its own",
        )),
        _ => Err(super::errors::misrouted(
            ENQUEUE_STATEMENT,
            "returned rows that are not its own",
        )),
    }
}

/// How an [`Op`]'s statements run.
enum Plan {
    Execute(Stmt),
    /// The enqueue: executed, or (guarded) its marker row checked.
    Enqueue(NewRow),
    /// The claim's statements ([`ClaimPlan`]).
    Claim(ClaimPlan),
    Status(Stmt),
    Dead(Stmt),
    Tally(Stmt),
    /// The select of the rows, then their delete.
    Purge(Stmt),
    /// Per topic, the moves of the stored positions the guard admits in
    /// one statement where the backend can; then, for what that did not
    /// move, the transaction's idle bound (where the backend has one, once),
    /// the select of the stored positions (locked) and their moves.
    Fence(Option<Stmt>, Vec<Move>),
    Positions(Stmt),
    /// The WAL outbox's enqueue: its row read ([`wal::emitted`]).
    Emit(WalEmit),
    Wal(WalPlan),
}

/// The delete of the rows a purge found; none when it found nothing.
fn purge(rows: &[SeqRow]) -> Option<Stmt> {
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    (!seqs.is_empty()).then(|| {
        Stmt::new()
            .sql("DELETE FROM outbox_messages WHERE dead_at IS NOT NULL AND seq IN ")
            .seq_list(&seqs)
    })
}

/// Runs `op` on a sync connection.
pub(crate) fn run<C>(conn: &mut C, op: Op) -> QueryResult<Answer>
where
    C: diesel::connection::LoadConnection<Backend: Internals>,
    Stmt: ExecuteOn<C::Backend>
        + LoadOn<C::Backend, ClaimedRow>
        + LoadOn<C::Backend, WindowRow>
        + LoadOn<C::Backend, StatusRow>
        + LoadOn<C::Backend, DeadRow>
        + LoadOn<C::Backend, SeqRow>
        + LoadOn<C::Backend, OffsetRow>
        + LoadOn<C::Backend, PositionRow>
        + LoadOn<C::Backend, TextRow>
        + LoadOn<C::Backend, CountRow>
        + LoadOn<C::Backend, TallyRow>,
    Enqueue: ExecuteOn<C::Backend> + LoadOn<C::Backend, MarkerRow>,
    WalEmit: LoadOn<C::Backend, TextRow>,
{
    Ok(match plan::<C::Backend>(op) {
        Plan::Execute(stmt) => Answer::Count(stmt.execute_on(conn)?),
        Plan::Enqueue(row) if C::Backend::GUARDED => enqueued(&Enqueue(row).load_on(conn)?)?,
        Plan::Enqueue(row) => Answer::Count(Enqueue(row).execute_on(conn)?),
        Plan::Claim(claim) => {
            type B<C> = <C as diesel::Connection>::Backend;
            let window: Vec<WindowRow> =
                claim.window::<B<C>>(claim.floor.as_ref()).load_on(conn)?;
            let floor = Floor::after(&window, claim.floor.as_ref());
            let mut look = claim.look(&window);
            if let Some(beyond) = claim.beyond::<B<C>>(&look) {
                look.add(LoadOn::<B<C>, SeqRow>::load_on(beyond, conn)?);
            }
            let heads: Vec<ClaimedRow> = match claim.lock::<B<C>>(&look) {
                Some(lock) => lock.load_on(conn)?,
                None => Vec::new(),
            };
            let rows = match claim.followers::<B<C>>(&heads) {
                Some(followers) => {
                    ClaimPlan::heads_and_due_followers(heads, followers.load_on(conn)?)
                }
                None => heads,
            };
            let rows = match claim.live_rows_in_taken_runs::<B<C>>(&rows) {
                Some(between) => ClaimPlan::contiguous(rows, &between.load_on(conn)?),
                None => rows,
            };
            if let Some(update) = claim.hold::<B<C>>(&rows) {
                update.execute_on(conn)?;
            }
            Answer::Claimed(rows, floor)
        }
        Plan::Status(stmt) => Answer::Status(stmt.load_on(conn)?),
        Plan::Dead(stmt) => Answer::Dead(stmt.load_on(conn)?),
        Plan::Tally(stmt) => Answer::Tally(stmt.load_on(conn)?),
        Plan::Purge(select) => match purge(&LoadOn::<C::Backend, SeqRow>::load_on(select, conn)?) {
            Some(delete) => Answer::Count(delete.execute_on(conn)?),
            None => Answer::Count(0),
        },
        Plan::Fence(mut bound, moves) => {
            for topic in moves {
                let topic = match topic.admitted::<C::Backend>() {
                    Some(update) => {
                        let moved: Vec<OffsetRow> = update.load_on(conn)?;
                        match topic.without(&moved) {
                            Some(rest) => rest,
                            None => continue,
                        }
                    }
                    None => topic,
                };
                if let Some(bound) = bound.take() {
                    bound.execute_on(conn)?;
                }
                let stored: Vec<OffsetRow> = topic.select::<C::Backend>().load_on(conn)?;
                match topic.of::<C::Backend>(&stored) {
                    Ok(writes) => {
                        for (write, rows) in writes {
                            moved(write.execute_on(conn)?, rows)?;
                        }
                    }
                    Err(refused) => return Ok(Answer::Fenced(refused)),
                }
            }
            Answer::Fenced(Fenced::Moved)
        }
        Plan::Positions(stmt) => Answer::Positions(stmt.load_on(conn)?),
        Plan::Emit(emit) => Answer::Count(wal::emitted(&emit.load_on(conn)?)?),
        Plan::Wal(WalPlan::Texts(stmt)) => Answer::Texts(texts(stmt.load_on(conn)?)),
        Plan::Wal(WalPlan::Count(stmt)) => Answer::Count(wal::count(&stmt.load_on(conn)?)?),
        Plan::Wal(WalPlan::Refused) => return Err(wal::refused()),
    })
}

/// The texts of `rows` that are not NULL.
fn texts(rows: Vec<TextRow>) -> Vec<String> {
    rows.into_iter().filter_map(|row| row.text).collect()
}

/// Runs `op` on a diesel-async connection (PostgreSQL, MySQL/MariaDB;
/// SQLite's async connection hands [`run`] to its blocking thread).
#[cfg(all(feature = "async", feature = "_any-backend"))]
pub(crate) async fn run_async<C>(conn: &mut C, op: Op) -> QueryResult<Answer>
where
    C: diesel_async::AsyncConnection<Backend: Internals> + Send,
    Stmt: QueryFragment<C::Backend>
        + QueryId
        + LoadOnAsync<C::Backend, ClaimedRow>
        + LoadOnAsync<C::Backend, WindowRow>
        + LoadOnAsync<C::Backend, StatusRow>
        + LoadOnAsync<C::Backend, DeadRow>
        + LoadOnAsync<C::Backend, SeqRow>
        + LoadOnAsync<C::Backend, OffsetRow>
        + LoadOnAsync<C::Backend, PositionRow>
        + LoadOnAsync<C::Backend, TextRow>
        + LoadOnAsync<C::Backend, CountRow>
        + LoadOnAsync<C::Backend, TallyRow>,
    Enqueue: QueryFragment<C::Backend> + QueryId + LoadOnAsync<C::Backend, MarkerRow>,
    WalEmit: LoadOnAsync<C::Backend, TextRow>,
{
    use diesel_async::RunQueryDsl;
    Ok(match plan::<C::Backend>(op) {
        Plan::Execute(stmt) => Answer::Count(stmt.execute(conn).await?),
        Plan::Enqueue(row) if C::Backend::GUARDED => {
            enqueued(&Enqueue(row).load_on_async(conn).await?)?
        }
        Plan::Enqueue(row) => Answer::Count(Enqueue(row).execute(conn).await?),
        Plan::Claim(claim) => {
            type B<C> = <C as diesel_async::AsyncConnectionCore>::Backend;
            let window: Vec<WindowRow> = claim
                .window::<B<C>>(claim.floor.as_ref())
                .load_on_async(conn)
                .await?;
            let floor = Floor::after(&window, claim.floor.as_ref());
            let mut look = claim.look(&window);
            if let Some(beyond) = claim.beyond::<B<C>>(&look) {
                look.add(LoadOnAsync::<B<C>, SeqRow>::load_on_async(beyond, conn).await?);
            }
            let heads: Vec<ClaimedRow> = match claim.lock::<B<C>>(&look) {
                Some(lock) => lock.load_on_async(conn).await?,
                None => Vec::new(),
            };
            let rows = match claim.followers::<B<C>>(&heads) {
                Some(followers) => {
                    ClaimPlan::heads_and_due_followers(heads, followers.load_on_async(conn).await?)
                }
                None => heads,
            };
            let rows = match claim.live_rows_in_taken_runs::<B<C>>(&rows) {
                Some(between) => ClaimPlan::contiguous(rows, &between.load_on_async(conn).await?),
                None => rows,
            };
            if let Some(update) = claim.hold::<B<C>>(&rows) {
                update.execute(conn).await?;
            }
            Answer::Claimed(rows, floor)
        }
        Plan::Status(stmt) => Answer::Status(stmt.load_on_async(conn).await?),
        Plan::Dead(stmt) => Answer::Dead(stmt.load_on_async(conn).await?),
        Plan::Tally(stmt) => Answer::Tally(stmt.load_on_async(conn).await?),
        Plan::Purge(select) => {
            let rows = LoadOnAsync::<C::Backend, SeqRow>::load_on_async(select, conn).await?;
            match purge(&rows) {
                Some(delete) => Answer::Count(delete.execute(conn).await?),
                None => Answer::Count(0),
            }
        }
        Plan::Fence(mut bound, moves) => {
            for topic in moves {
                let topic = match topic.admitted::<C::Backend>() {
                    Some(update) => {
                        let moved =
                            LoadOnAsync::<C::Backend, OffsetRow>::load_on_async(update, conn)
                                .await?;
                        match topic.without(&moved) {
                            Some(rest) => rest,
                            None => continue,
                        }
                    }
                    None => topic,
                };
                if let Some(bound) = bound.take() {
                    bound.execute(conn).await?;
                }
                let select = topic.select::<C::Backend>();
                let stored =
                    LoadOnAsync::<C::Backend, OffsetRow>::load_on_async(select, conn).await?;
                match topic.of::<C::Backend>(&stored) {
                    Ok(writes) => {
                        for (write, rows) in writes {
                            moved(write.execute(conn).await?, rows)?;
                        }
                    }
                    Err(refused) => return Ok(Answer::Fenced(refused)),
                }
            }
            Answer::Fenced(Fenced::Moved)
        }
        Plan::Positions(stmt) => Answer::Positions(stmt.load_on_async(conn).await?),
        Plan::Emit(emit) => Answer::Count(wal::emitted(&emit.load_on_async(conn).await?)?),
        Plan::Wal(WalPlan::Texts(stmt)) => Answer::Texts(texts(stmt.load_on_async(conn).await?)),
        Plan::Wal(WalPlan::Count(stmt)) => {
            Answer::Count(wal::count(&stmt.load_on_async(conn).await?)?)
        }
        Plan::Wal(WalPlan::Refused) => return Err(wal::refused()),
    })
}
