//! Failure groups: the dead messages grouped by destination and failure
//! (the last error with its ids and numbers masked), as the operations
//! console's dead page and `diesel-inbox outbox dead --groups` show them;
//! a group is retried or discarded whole through
//! [`RetryTarget::Group`] (its members found by [`super::failures`]).

use super::dead::{rows_of, DeadFilter, RetryTarget};
use super::failures::failure_of;
use super::statements::{checked_limit, time};
#[cfg(feature = "async")]
use crate::backend::asynchronous::{AsAsyncConnection, AsyncInboxConnection};
use crate::backend::outbox::{DeadRow, Op};
use crate::backend::Statements;
use crate::error::InboxError;
use crate::ops::ops_error;
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;
use std::collections::HashMap;
use std::time::SystemTime;

/// Dead messages to one destination that failed the same way: their last
/// errors are equal once ids and numbers are masked (every word that
/// holds a digit becomes `#`, runs of white space one space, cut at 240
/// characters), so `timeout after 30s on 10.0.0.7:9092` and `timeout
/// after 5s on 10.0.0.9:9092` are one group, `timeout after # on #`.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::outbox::{self, DeadFilter};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// for group in outbox::dead_groups(&mut conn, &DeadFilter::new(), 10_000)? {
///     println!("{} x{}: {}", group.destination, group.count, group.failure);
///     if group.failure.contains("no route") {
///         outbox::retry(&mut conn, &group)?;
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailureGroup {
    /// The destination.
    pub destination: String,
    /// The failure: the last error, ids and numbers masked.
    pub failure: String,
    /// How many dead messages the group has (of those read).
    pub count: u64,
    /// When its first member died.
    pub first_dead_at: SystemTime,
    /// When its last member died.
    pub last_dead_at: SystemTime,
    /// The id of its newest member.
    pub example_id: String,
    /// That member's last error, as the broker said it.
    pub example_error: String,
    /// The filter it was read with: its retry and discard keep to it.
    within: DeadFilter,
}

/// A group's retry or discard takes its members that the filter it was
/// read with selects (at most 10,000).
impl From<&FailureGroup> for RetryTarget {
    fn from(group: &FailureGroup) -> Self {
        RetryTarget::Group {
            destination: group.destination.clone(),
            failure: group.failure.clone(),
            within: group.within.clone(),
        }
    }
}

impl From<FailureGroup> for RetryTarget {
    fn from(group: FailureGroup) -> Self {
        RetryTarget::Group {
            destination: group.destination,
            failure: group.failure,
            within: group.within,
        }
    }
}

/// The groups of `rows`, the largest first (then the latest).
fn grouped(rows: Vec<DeadRow>, within: &DeadFilter) -> Vec<FailureGroup> {
    let mut groups: HashMap<(String, String), FailureGroup> = HashMap::new();
    // Newest first: the first member seen is the example.
    for row in rows {
        let error = row.last_error.unwrap_or_default();
        let failure = failure_of(&error);
        let dead_at = time(row.dead_at);
        let group = groups
            .entry((row.destination.clone(), failure.clone()))
            .or_insert_with(|| FailureGroup {
                destination: row.destination,
                failure,
                count: 0,
                first_dead_at: dead_at,
                last_dead_at: dead_at,
                example_id: row.id,
                example_error: error,
                within: within.clone(),
            });
        group.count += 1;
        group.first_dead_at = group.first_dead_at.min(dead_at);
        group.last_dead_at = group.last_dead_at.max(dead_at);
    }
    let mut groups: Vec<FailureGroup> = groups.into_values().collect();
    groups.sort_by(|a, b| {
        (b.count, b.last_dead_at, &a.destination, &a.failure).cmp(&(
            a.count,
            a.last_dead_at,
            &b.destination,
            &b.failure,
        ))
    });
    groups
}

fn reading(filter: &DeadFilter, scan: usize) -> Result<Op, InboxError> {
    Ok(Op::DeadFailures {
        which: filter.selection(),
        limit: checked_limit(scan)?,
    })
}

/// The failure groups of the newest `scan` dead messages `filter` selects
/// (1 to 100,000), the largest first. Their payloads are not read.
/// Example: [`FailureGroup`].
pub fn dead_groups<C>(
    conn: &mut C,
    filter: &DeadFilter,
    scan: usize,
) -> Result<Vec<FailureGroup>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let op = reading(filter, scan)?;
    rows_of(C::Backend::outbox(conn, op).map_err(ops_error::<C::Backend>)?)
        .map(|rows| grouped(rows, filter))
}

/// The async twin of [`dead_groups`].
#[cfg(feature = "async")]
pub async fn dead_groups_async<P, C, Via>(
    conn: &mut P,
    filter: &DeadFilter,
    scan: usize,
) -> Result<Vec<FailureGroup>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    let op = reading(filter, scan)?;
    rows_of(
        conn.connection()
            .inbox_outbox(op)
            .await
            .map_err(ops_error::<C::Backend>)?,
    )
    .map(|rows| grouped(rows, filter))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_count_and_order() {
        let row = |id: &str, destination: &str, error: &str, dead_at: i64| DeadRow {
            id: id.into(),
            destination: destination.into(),
            ordering_key: None,
            attempts: 5,
            last_error: Some(error.into()),
            created_at: 0,
            dead_at,
            payload: None,
            headers: None,
        };
        // Newest first, as the statement reads them.
        let groups = grouped(
            vec![
                row("c", "orders", "timeout after 9s", 30),
                row("b", "mail", "refused", 20),
                row("a", "orders", "timeout after 1s", 10),
            ],
            &DeadFilter::new(),
        );
        assert_eq!(groups.len(), 2);
        assert_eq!(
            (groups[0].destination.as_str(), groups[0].failure.as_str()),
            ("orders", "timeout after #")
        );
        assert_eq!(groups[0].count, 2);
        assert_eq!(groups[0].example_id, "c");
        assert_eq!(groups[0].example_error, "timeout after 9s");
        assert_eq!(groups[0].first_dead_at, time(10));
        assert_eq!(groups[0].last_dead_at, time(30));
        assert_eq!(groups[1].count, 1);
    }
}
