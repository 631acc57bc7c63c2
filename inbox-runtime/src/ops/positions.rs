//! The stream positions the Kafka runner keeps in the handler's
//! transaction: [`positions`] lists them.

use super::transaction::ops_error;
#[cfg(feature = "async")]
use crate::backend::asynchronous::AsAsyncConnection;
use crate::backend::Statements;
use crate::error::InboxError;
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;
use diesel::result::Error;
use std::time::Duration;

/// Where a Kafka runner's consumer stands in one partition, as the
/// handlers' transactions wrote it (`diesel_inbox::kafka`): the offset of
/// the next message to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamPosition {
    /// The inbox consumer whose handler wrote it.
    pub consumer: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// `offset + 1` of the last message applied.
    pub next_offset: i64,
    /// When it last moved, by the database's clock.
    pub updated_at: std::time::SystemTime,
    /// How long ago that was, by the database's clock.
    pub age: Duration,
}

fn position_of(row: crate::backend::outbox::PositionRow) -> StreamPosition {
    let micros = |m: i64| Duration::from_micros(m.max(0) as u64);
    StreamPosition {
        consumer: row.consumer,
        topic: row.topic,
        partition: row.partition_id,
        next_offset: row.next_offset,
        updated_at: std::time::SystemTime::UNIX_EPOCH + micros(row.updated_at),
        age: micros(row.now - row.updated_at),
    }
}

pub(crate) fn positions_of(
    answer: crate::backend::outbox::Answer,
) -> Result<Vec<StreamPosition>, InboxError> {
    match answer {
        crate::backend::outbox::Answer::Positions(rows) => {
            Ok(rows.into_iter().map(position_of).collect())
        }
        other => Err(InboxError::Database(Error::QueryBuilderError(
            format!("a positions statement returned {other:?}").into(),
        ))),
    }
}

/// The stream positions the Kafka runner's handlers keep (of `consumer`,
/// or of all), ordered by consumer, topic and partition: the CLI's
/// `status CONSUMER` prints them.
///
/// ```
/// use diesel::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// assert!(diesel_inbox::positions(&mut conn, Some("shipping"))?.is_empty());
/// # Ok(())
/// # }
/// ```
pub fn positions<C>(conn: &mut C, consumer: Option<&str>) -> Result<Vec<StreamPosition>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let op = crate::backend::outbox::Op::Positions {
        consumer: consumer.map(str::to_owned),
    };
    positions_of(C::Backend::outbox(conn, op).map_err(ops_error::<C::Backend>)?)
}

/// The async twin of [`positions`].
#[cfg(feature = "async")]
pub async fn positions_async<P, C, Via>(
    conn: &mut P,
    consumer: Option<&str>,
) -> Result<Vec<StreamPosition>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: crate::AsyncInboxConnection,
{
    let op = crate::backend::outbox::Op::Positions {
        consumer: consumer.map(str::to_owned),
    };
    let answer = conn
        .connection()
        .inbox_outbox(op)
        .await
        .map_err(ops_error::<C::Backend>)?;
    positions_of(answer)
}
