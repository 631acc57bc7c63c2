//! The dead messages: [`dead`], [`dead_matching`], [`retry`],
//! [`discard`] and their async twins, over one selection ([`DeadFilter`],
//! [`RetryTarget`]).

use super::headers::decode_headers;
use super::statements::{checked_limit, count_of, time, unexpected};
#[cfg(feature = "async")]
use crate::backend::asynchronous::{AsAsyncConnection, AsyncInboxConnection};
use crate::backend::outbox::{Answer, DeadRow, DeadWhere, Op};
use crate::backend::Statements;
use crate::error::InboxError;
use crate::ops::ops_error;
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;
use std::time::{SystemTime, UNIX_EPOCH};

/// A dead message: it failed to publish as often as the relay's
/// `max_publish_attempts` allows. It stays until [`retry`], [`discard`]
/// or [`purge`](super::purge).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadMessage {
    /// The message id.
    pub id: String,
    /// The destination.
    pub destination: String,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// Failed publishes.
    pub attempts: u32,
    /// The last failure's error.
    pub last_error: String,
    /// When it was enqueued.
    pub enqueued_at: SystemTime,
    /// When it became dead.
    pub dead_at: SystemTime,
    /// The payload, as enqueued.
    pub payload: Vec<u8>,
    /// The headers, as enqueued (with `otel`, the trace context's
    /// `traceparent`).
    pub headers: Vec<(String, String)>,
}

fn dead_of(rows: Vec<DeadRow>) -> Vec<DeadMessage> {
    rows.into_iter()
        .map(|row| DeadMessage {
            headers: decode_headers(row.headers.as_deref()),
            id: row.id,
            destination: row.destination,
            ordering_key: row.ordering_key,
            attempts: row.attempts.max(0) as u32,
            last_error: row.last_error.unwrap_or_default(),
            enqueued_at: time(row.created_at),
            dead_at: time(row.dead_at),
            payload: row.payload.unwrap_or_default(),
        })
        .collect()
}

/// Which dead messages to list, retry or discard: every condition set
/// must hold; a new filter takes every dead message. The values are bound
/// parameters, never SQL text.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::outbox::{self, DeadFilter};
/// use std::time::{Duration, SystemTime};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// let last_hour = DeadFilter::new()
///     .destination("orders")
///     .error_contains("timeout")
///     .dead_since(SystemTime::now() - Duration::from_secs(3600));
/// assert!(outbox::dead_matching(&mut conn, &last_hour, 100)?.is_empty());
/// assert_eq!(outbox::retry(&mut conn, &last_hour)?, 0);
/// assert_eq!(outbox::discard(&mut conn, &last_hour)?, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadFilter {
    destination: Option<String>,
    error_contains: Option<String>,
    dead_since: Option<SystemTime>,
    dead_before: Option<SystemTime>,
}

impl DeadFilter {
    /// Every dead message.
    pub fn new() -> Self {
        DeadFilter::default()
    }

    /// Only those to `destination`.
    pub fn destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = Some(destination.into());
        self
    }

    /// Only those whose last error contains `text` (ignoring case; `%`
    /// and `_` are plain characters).
    pub fn error_contains(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// Only those dead at `time` or later.
    pub fn dead_since(mut self, time: SystemTime) -> Self {
        self.dead_since = Some(time);
        self
    }

    /// Only those dead before `time`.
    pub fn dead_before(mut self, time: SystemTime) -> Self {
        self.dead_before = Some(time);
        self
    }

    pub(super) fn selection(&self) -> DeadWhere {
        let micros = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros().min(i64::MAX as u128) as i64)
        };
        DeadWhere {
            ids: None,
            failure_like: None,
            destination: self.destination.clone(),
            error_like: self.error_contains.as_deref().map(|text| {
                let mut pattern = String::from("%");
                for c in text.to_lowercase().chars() {
                    if matches!(c, '%' | '_' | '!') {
                        pattern.push('!');
                    }
                    pattern.push(c);
                }
                pattern.push('%');
                pattern
            }),
            since: self.dead_since.map(micros),
            before: self.dead_before.map(micros),
        }
    }
}

/// The dead messages, oldest first, at most `limit` (1 to 100,000).
///
/// ```
/// use diesel::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// assert!(diesel_inbox::outbox::dead(&mut conn, 100)?.is_empty());
/// # Ok(())
/// # }
/// ```
pub fn dead<C>(conn: &mut C, limit: usize) -> Result<Vec<DeadMessage>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    dead_matching(conn, &DeadFilter::new(), limit)
}

/// The async twin of [`dead`].
#[cfg(feature = "async")]
pub async fn dead_async<P, C, Via>(
    conn: &mut P,
    limit: usize,
) -> Result<Vec<DeadMessage>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    dead_matching_async(conn, &DeadFilter::new(), limit).await
}

fn listing(filter: &DeadFilter, limit: usize) -> Result<Op, InboxError> {
    Ok(Op::Dead {
        which: filter.selection(),
        limit: checked_limit(limit)?,
    })
}

fn listed(answer: Answer) -> Result<Vec<DeadMessage>, InboxError> {
    rows_of(answer).map(dead_of)
}

/// The rows of a dead messages' listing.
pub(super) fn rows_of(answer: Answer) -> Result<Vec<DeadRow>, InboxError> {
    match answer {
        Answer::Dead(rows) => Ok(rows),
        other => Err(unexpected(other)),
    }
}

/// The dead messages `filter` selects, oldest first, at most `limit` (1
/// to 100,000). Example: [`DeadFilter`].
pub fn dead_matching<C>(
    conn: &mut C,
    filter: &DeadFilter,
    limit: usize,
) -> Result<Vec<DeadMessage>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    listed(C::Backend::outbox(conn, listing(filter, limit)?).map_err(ops_error::<C::Backend>)?)
}

/// The async twin of [`dead_matching`].
#[cfg(feature = "async")]
pub async fn dead_matching_async<P, C, Via>(
    conn: &mut P,
    filter: &DeadFilter,
    limit: usize,
) -> Result<Vec<DeadMessage>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    let op = listing(filter, limit)?;
    listed(
        conn.connection()
            .inbox_outbox(op)
            .await
            .map_err(ops_error::<C::Backend>)?,
    )
}

/// Every dead message, for [`retry`] and [`discard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllDead;

/// What [`retry`] and [`discard`] take: one dead message by id (`&str`,
/// `String`), the ones a [`DeadFilter`] selects, or [`AllDead`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryTarget {
    /// The dead message with this id.
    Id(String),
    /// The dead messages the filter selects.
    Matching(DeadFilter),
    /// Every dead message.
    AllDead,
    /// The dead messages of a failure group (see
    /// [`FailureGroup`](super::FailureGroup)) that `within` selects (the
    /// filter the group was read with), at most 10,000: a larger group is
    /// refused with [`InboxError::InvalidArgument`], and nothing changes.
    Group {
        /// The group's destination.
        destination: String,
        /// The group's failure: the last error with its ids and numbers
        /// masked ([`FailureGroup::failure`](super::FailureGroup::failure)).
        failure: String,
        /// Only the dead messages this filter selects.
        within: DeadFilter,
    },
}

impl From<&str> for RetryTarget {
    fn from(id: &str) -> Self {
        RetryTarget::Id(id.to_owned())
    }
}

impl From<String> for RetryTarget {
    fn from(id: String) -> Self {
        RetryTarget::Id(id)
    }
}

impl From<&String> for RetryTarget {
    fn from(id: &String) -> Self {
        RetryTarget::Id(id.clone())
    }
}

impl From<AllDead> for RetryTarget {
    fn from(_: AllDead) -> Self {
        RetryTarget::AllDead
    }
}

impl From<DeadFilter> for RetryTarget {
    fn from(filter: DeadFilter) -> Self {
        RetryTarget::Matching(filter)
    }
}

impl From<&DeadFilter> for RetryTarget {
    fn from(filter: &DeadFilter) -> Self {
        RetryTarget::Matching(filter.clone())
    }
}

impl RetryTarget {
    /// The selection, where one statement makes it (not for a group,
    /// whose members are read first: [`super::failures`]).
    fn selection(self) -> Selection {
        Selection::One(match self {
            RetryTarget::Id(id) => DeadWhere {
                ids: Some(vec![id]),
                ..DeadWhere::default()
            },
            RetryTarget::Matching(filter) => filter.selection(),
            RetryTarget::AllDead => DeadWhere::default(),
            RetryTarget::Group {
                destination,
                failure,
                within,
            } => return Selection::Group(destination, failure, within),
        })
    }
}

/// What a [`RetryTarget`] selects: rows one statement selects, or a
/// failure group's (destination, failure, filter), whose members are read
/// first.
enum Selection {
    One(DeadWhere),
    Group(String, String, DeadFilter),
}

/// Runs `make(which)` for what `target` selects, and returns how many
/// rows it changed: one statement (for a group, on its members' ids, read
/// first), so that it changes all or nothing.
fn act<C>(conn: &mut C, target: RetryTarget, make: fn(DeadWhere) -> Op) -> Result<u64, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let selections = match target.selection() {
        Selection::One(which) => vec![which],
        Selection::Group(destination, failure, within) => {
            let Some(scan) = super::failures::members(&destination, &failure, within.selection())
            else {
                return Ok(0);
            };
            let rows = rows_of(C::Backend::outbox(conn, scan).map_err(ops_error::<C::Backend>)?)?;
            vec![super::failures::chosen(rows, &destination, &failure)?]
        }
    };
    let mut changed = 0;
    for which in selections {
        changed +=
            count_of(C::Backend::outbox(conn, make(which)).map_err(ops_error::<C::Backend>)?)?;
    }
    Ok(changed)
}

/// The async twin of [`act`].
#[cfg(feature = "async")]
async fn act_async<P, C, Via>(
    conn: &mut P,
    target: RetryTarget,
    make: fn(DeadWhere) -> Op,
) -> Result<u64, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    let conn = conn.connection();
    let selections = match target.selection() {
        Selection::One(which) => vec![which],
        Selection::Group(destination, failure, within) => {
            let Some(scan) = super::failures::members(&destination, &failure, within.selection())
            else {
                return Ok(0);
            };
            let rows = rows_of(
                conn.inbox_outbox(scan)
                    .await
                    .map_err(ops_error::<C::Backend>)?,
            )?;
            vec![super::failures::chosen(rows, &destination, &failure)?]
        }
    };
    let mut changed = 0;
    for which in selections {
        changed += count_of(
            conn.inbox_outbox(make(which))
                .await
                .map_err(ops_error::<C::Backend>)?,
        )?;
    }
    Ok(changed)
}

fn retried(which: DeadWhere) -> Op {
    Op::Retry { which }
}

fn discarded(which: DeadWhere) -> Op {
    Op::Discard { which }
}

/// Makes dead messages pending again, with their attempts reset: one by
/// id, the ones a [`DeadFilter`] selects, a failure group
/// ([`RetryTarget::Group`]) or [`AllDead`]. Returns how many. A replayed message is published as soon as a relay finds it; a
/// message of an ordering key that was published past goes out after the
/// later ones of its key.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::outbox::{self, AllDead};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// assert_eq!(outbox::retry(&mut conn, "no-such-id")?, 0);
/// assert_eq!(outbox::retry(&mut conn, AllDead)?, 0);
/// # Ok(())
/// # }
/// ```
pub fn retry<C>(conn: &mut C, which: impl Into<RetryTarget>) -> Result<u64, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let replayed = act(conn, which.into(), retried)?;
    crate::wake::wake();
    Ok(replayed)
}

/// The async twin of [`retry`].
#[cfg(feature = "async")]
pub async fn retry_async<P, C, Via>(
    conn: &mut P,
    which: impl Into<RetryTarget>,
) -> Result<u64, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    let replayed = act_async(conn, which.into(), retried).await?;
    crate::wake::wake();
    Ok(replayed)
}

/// Deletes dead messages (never a live one): one by id, the ones a
/// [`DeadFilter`] selects, a failure group ([`RetryTarget::Group`]) or
/// [`AllDead`]. Returns how many. Example:
/// [`DeadFilter`].
pub fn discard<C>(conn: &mut C, which: impl Into<RetryTarget>) -> Result<u64, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    act(conn, which.into(), discarded)
}

/// The async twin of [`discard`].
#[cfg(feature = "async")]
pub async fn discard_async<P, C, Via>(
    conn: &mut P,
    which: impl Into<RetryTarget>,
) -> Result<u64, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    act_async(conn, which.into(), discarded).await
}
