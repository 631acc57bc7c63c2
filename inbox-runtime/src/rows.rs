//! The rows the statements read, and what the operations return for
//! them: the ground floor, shared by the backends, the drivers and the
//! operations.

use std::time::{Duration, SystemTime};

/// One row of the inbox: a message a consumer has applied.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{idempotent, status};
///
/// #[idempotent(key = "id")]
/// fn ship(conn: &mut SqliteConnection, id: i64) -> QueryResult<()> {
///     Ok(())
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// ship(&mut conn, 7)?;
/// let entry = status(&mut conn, "ship", "7")?.expect("applied");
/// assert_eq!((entry.consumer.as_str(), entry.key.as_str()), ("ship", "7"));
/// assert!(entry.received_at <= std::time::SystemTime::now());
/// assert!(status(&mut conn, "ship", "8")?.is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxEntry {
    /// The consumer that applied the message.
    pub consumer: String,
    /// The message's key.
    pub key: String,
    /// When the message was claimed, by the database's clock.
    pub received_at: SystemTime,
}

/// The failure count of a key of a handler with `max_attempts`: see
/// [`attempts`](crate::attempts) (which has an example).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attempts {
    /// The consumer.
    pub consumer: String,
    /// The message's key.
    pub key: String,
    /// Failed deliveries counted (body errors and panics) since the last
    /// success or `forget`.
    pub failures: u32,
    /// The last failure's error (its `Debug` form, cut to 1,000 bytes).
    pub last_error: String,
    /// When the last failure was counted, by the database's clock.
    pub updated_at: SystemTime,
}

/// What the inbox holds for one consumer: see [`stats`](crate::stats) (which has an
/// example).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// The consumer.
    pub consumer: String,
    /// How many messages it has applied that are still recorded.
    pub rows: u64,
    /// When its oldest recorded message was claimed.
    pub oldest: SystemTime,
    /// When its newest recorded message was claimed.
    pub newest: SystemTime,
}

/// A row's key, fingerprint and stored result, as the claim's transaction
/// reads them for a duplicate.
pub(crate) type StoredRow = (String, Option<Vec<u8>>, Option<Vec<u8>>);

/// A key's failure count: failures, the last error, when it was counted
/// (microseconds since the epoch).
pub(crate) type AttemptsRow = (i32, String, i64);

/// A row of the failing keys' list: consumer, key, and an [`AttemptsRow`].
pub(crate) type FailingRow = (String, String, i32, String, i64);

/// A failing key's row as an [`Attempts`].
pub(crate) fn failing_of((consumer, key, failures, last_error, micros): FailingRow) -> Attempts {
    attempts_of(&consumer, &key, (failures, last_error, micros))
}

/// Longest error text the failure count keeps, in bytes.
#[cfg_attr(not(feature = "_any-backend"), allow(dead_code))]
const MAX_ERROR_TEXT: usize = 1_000;

/// `error`, cut to [`MAX_ERROR_TEXT`] bytes at a character boundary.
#[cfg_attr(not(feature = "_any-backend"), allow(dead_code))]
pub(crate) fn error_text(error: &str) -> &str {
    if error.len() <= MAX_ERROR_TEXT {
        return error;
    }
    let mut end = MAX_ERROR_TEXT;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    &error[..end]
}

/// A failure count's row, to [`Attempts`].
pub(crate) fn attempts_of(
    consumer: &str,
    key: &str,
    (failures, last_error, micros): AttemptsRow,
) -> Attempts {
    Attempts {
        consumer: consumer.to_owned(),
        key: key.to_owned(),
        failures: u32::try_from(failures).unwrap_or(0),
        last_error,
        updated_at: from_micros(micros),
    }
}

/// Microseconds since the Unix epoch, as the backends' statements read
/// `received_at`, to a time.
pub(crate) fn from_micros(micros: i64) -> SystemTime {
    let offset = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        SystemTime::UNIX_EPOCH + offset
    } else {
        SystemTime::UNIX_EPOCH - offset
    }
}

/// A row of the statements, to an entry.
#[cfg_attr(not(feature = "_any-backend"), allow(dead_code))]
pub(crate) fn entry((consumer, key, micros): (String, String, i64)) -> InboxEntry {
    InboxEntry {
        consumer,
        key,
        received_at: from_micros(micros),
    }
}

/// A row of the statements, to a consumer's stats.
#[cfg_attr(not(feature = "_any-backend"), allow(dead_code))]
pub(crate) fn consumer_stats(
    (consumer, rows, oldest, newest): (String, i64, i64, i64),
) -> ConsumerStats {
    ConsumerStats {
        consumer,
        rows: rows as u64,
        oldest: from_micros(oldest),
        newest: from_micros(newest),
    }
}
