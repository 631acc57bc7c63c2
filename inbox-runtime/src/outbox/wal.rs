//! The WAL outbox (PostgreSQL, opt-in): an enqueue that writes its
//! message only to the write-ahead log, in the caller's transaction, and a
//! relay that reads it back through a logical replication slot, in commit
//! order, and confirms to the slot what it published.
//!
//! - [`set_wal`] turns it on for the enqueues of this process;
//!   [`create`] makes the slot (once per database, before the first such
//!   enqueue: an enqueue without a usable slot is refused,
//!   [`InboxError::NoWalOutbox`]).
//! - The relay reads whole transactions from the slot, publishes their
//!   messages in waves (a key's messages in order), writes into the
//!   outbox table the messages it cannot publish now (refused by the
//!   broker, or of a key that has live rows there: its order is the
//!   table's from then on), and only then confirms them. A relay killed
//!   before that publishes the same messages again, with their ids.
//!
//! The record of a message in the WAL: a version byte (1), then the id,
//! the destination, the ordering key (a presence byte first), the
//! payload and the stored headers (a presence byte first), each as a
//! 4-byte little-endian length and its bytes.
// The relay's side runs only with `async`.
#![cfg_attr(not(feature = "async"), allow(dead_code))]

#[cfg(feature = "async")]
use super::relay::{Claim, PublishOutcome, Settled};
#[cfg(feature = "async")]
use super::statements::short_transaction_async;
#[cfg(feature = "async")]
use crate::backend::asynchronous::AsyncInboxConnection;
use crate::backend::outbox::NewRow;
#[cfg(feature = "async")]
use crate::backend::outbox::{Answer, AsideRow, ClaimedRow, Op, WalOp};
use crate::backend::Internals;
use crate::error::InboxError;
use crate::ops::ops_error;
use crate::transaction::InboxConnection;
#[cfg(feature = "async")]
use std::time::Duration;

/// Whether enqueues write to the WAL outbox.
static WAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the WAL outbox on (or off) for the enqueues that follow, in the
/// whole process (default: off, the outbox table).
///
/// With it on, [`enqueue`](super::enqueue) on PostgreSQL writes no row:
/// it writes the message to the write-ahead log with
/// `pg_logical_emit_message`, in the caller's transaction (a rollback
/// takes it back), and a relay built with `Relay::wal` reads it from a
/// logical replication slot. No table row is inserted, updated or deleted
/// per message, which is what bounds the table outbox's speed: the relay
/// streams the slot and publishes faster than the table's (the guide's
/// outbox chapter, "The WAL outbox", has the figures).
///
/// On MySQL/MariaDB and SQLite it changes nothing: their enqueues write
/// to the table, which their relays read.
///
/// What it needs: PostgreSQL 14 or later with `wal_level = logical`, the
/// slot ([`create`]), a relay on direct connections (it streams the slot
/// over a replication connection, and its lock needs a session: no
/// transaction-mode proxy).
/// What it gives up, against the table: delays (a message with
/// `deliver_after`/`deliver_at` is refused), the enqueue's check that an
/// id is not pending already, and the slot keeps WAL on the server while
/// its relay is down. A message the broker refuses is kept aside in the
/// outbox table, with the table's retries and dead state, and its key's
/// later messages follow it there, in order. The guide's outbox chapter
/// ("The WAL outbox") has the details.
///
/// ```
/// diesel_inbox::outbox::set_wal(true);
/// # diesel_inbox::outbox::set_wal(false);
/// ```
pub fn set_wal(on: bool) {
    WAL.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether enqueues write to the WAL ([`set_wal`]).
pub(super) fn enqueue_to_wal() -> bool {
    WAL.load(std::sync::atomic::Ordering::Relaxed)
}

/// Creates the WAL outbox's replication slot (and its empty publication)
/// in this database, where they do not exist. Run it once, outside a
/// transaction, before enqueues write to the WAL ([`set_wal`]): creating
/// a slot waits for the transactions in progress to end. It needs
/// `wal_level = logical` (a server restart) and the `REPLICATION`
/// attribute (or a superuser).
///
/// Messages wait in the slot (the server keeps the WAL they are in)
/// until a relay publishes them; [`remove`] drops it. A slot the server
/// invalidated (`max_slot_wal_keep_size`) is an error here, which says
/// that its messages are lost: remove it and create it again.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # fn run(conn: &mut diesel::PgConnection) -> Result<(), diesel_inbox::InboxError> {
/// diesel_inbox::outbox::wal::create(conn)?;
/// diesel_inbox::outbox::set_wal(true);
/// # Ok(()) }
/// ```
pub fn create<C: InboxConnection>(conn: &mut C) -> Result<(), InboxError> {
    slot_statement(
        conn,
        crate::backend::outbox_wal::CREATE,
        "outbox::wal::create",
    )
}

/// Drops this database's WAL outbox slot and publication: the messages
/// in the WAL that no relay published yet are lost. Outside a
/// transaction.
pub fn remove<C: InboxConnection>(conn: &mut C) -> Result<(), InboxError> {
    slot_statement(
        conn,
        crate::backend::outbox_wal::DROP,
        "outbox::wal::remove",
    )
}

fn slot_statement<C: InboxConnection>(
    conn: &mut C,
    sql: &str,
    operation: &'static str,
) -> Result<(), InboxError> {
    if !<C::Backend as Internals>::WAL {
        return Err(InboxError::NoWalOutbox(
            "the WAL outbox is PostgreSQL's (logical decoding)".into(),
        ));
    }
    if crate::backend::transaction::transaction_open(conn) {
        return Err(InboxError::InTransaction { operation });
    }
    conn.batch_execute(sql).map_err(ops_error::<C::Backend>)
}

/// The record of `row` in the WAL ([the module's format](self)); a
/// delayed message is refused (the WAL has no delays).
pub(super) fn record(row: &NewRow) -> Result<Vec<u8>, InboxError> {
    if row.after != 0 || row.at.is_some() {
        return Err(InboxError::InvalidOutgoing(
            "a delayed message (deliver_after, deliver_at) needs the outbox table: \
             the WAL outbox (outbox::set_wal) publishes in commit order only"
                .into(),
        ));
    }
    let mut out = Vec::with_capacity(32 + row.payload.len() + row.destination.len());
    out.push(1);
    let put = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    };
    put(&mut out, row.id.as_bytes());
    put(&mut out, row.destination.as_bytes());
    match &row.key {
        Some(key) => {
            out.push(1);
            put(&mut out, key.as_bytes());
        }
        None => out.push(0),
    }
    put(&mut out, &row.payload);
    match &row.headers {
        Some(headers) => {
            out.push(1);
            put(&mut out, headers);
        }
        None => out.push(0),
    }
    Ok(out)
}

/// A message read back from the WAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) id: String,
    pub(super) destination: String,
    pub(super) key: Option<String>,
    pub(super) payload: Vec<u8>,
    pub(super) headers: Option<Vec<u8>>,
}

/// Reads a record ([`record`]'s format); `None` if it is not one.
pub(super) fn read_record(bytes: &[u8]) -> Option<Record> {
    let (&version, rest) = bytes.split_first()?;
    if version != 1 {
        return None;
    }
    let mut at = Cursor(rest);
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).ok();
    let id = text(at.bytes()?)?;
    let destination = text(at.bytes()?)?;
    let key = match at.flag()? {
        true => Some(text(at.bytes()?)?),
        false => None,
    };
    let payload = at.bytes()?.to_vec();
    let headers = match at.flag()? {
        true => Some(at.bytes()?.to_vec()),
        false => None,
    };
    at.0.is_empty().then_some(Record {
        id,
        destination,
        key,
        payload,
        headers,
    })
}

/// What is left of a record to read.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    /// A 4-byte little-endian length and that many bytes.
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(self.0.get(..4)?.try_into().ok()?) as usize;
        let part = self.0.get(4..4usize.checked_add(len)?)?;
        self.0 = &self.0[4 + len..];
        Some(part)
    }

    /// A presence byte.
    fn flag(&mut self) -> Option<bool> {
        let (&f, rest) = self.0.split_first()?;
        self.0 = rest;
        match f {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
}

/// PostgreSQL's epoch (2000-01-01) in microseconds after 1970's.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// What one read of the slot decoded: the outbox's messages in commit
/// order, each with its commit's time (microseconds since 1970).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Decoded {
    pub(super) messages: Vec<(Record, i64)>,
}

/// Decodes `pgoutput`'s rows ([`ChangeRow::data`]): `B`egin (its commit
/// time), `M`essage (ours by their prefix; others' are skipped). Anything
/// else (`C`ommit, a table's change if someone added a table to the
/// publication) is skipped. A message of ours that
/// does not read is an error: it is not skipped silently.
pub(super) fn decode<'a>(rows: impl IntoIterator<Item = &'a [u8]>) -> Result<Decoded, String> {
    let int = |b: &[u8], at: usize| -> Option<i64> {
        Some(i64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    let mut decoded = Decoded::default();
    let mut committed = 0;
    for data in rows {
        match data.first() {
            Some(b'B') => {
                committed = int(data, 9).ok_or("a short Begin message")? + PG_EPOCH_MICROS;
            }
            Some(b'M') => {
                // flags (1), lsn (8), prefix (C string), length (4), content.
                let rest = data.get(10..).ok_or("a short logical message")?;
                let nul = rest
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or("a logical message without its prefix's end")?;
                if &rest[..nul] != crate::backend::outbox_wal::PREFIX.as_bytes() {
                    continue;
                }
                let body = &rest[nul + 1..];
                let len = body
                    .get(..4)
                    .map(|b| u32::from_be_bytes(b.try_into().unwrap_or_default()) as usize)
                    .ok_or("a short logical message")?;
                let content = body.get(4..4 + len).ok_or("a short logical message")?;
                let record = read_record(content)
                    .ok_or("an outbox message in the WAL that does not read as one")?;
                decoded.messages.push((record, committed));
            }
            _ => {}
        }
    }
    Ok(decoded)
}

/// One read of the slot, for the relay: its messages (those it may
/// publish now are [`wal_claim_async`]'s [`Claim`], in waves; the others
/// it keeps aside at once: their key has live rows in the outbox table),
/// settled by [`wal_settle_async`].
#[cfg(feature = "async")]
#[doc(hidden)]
#[derive(Debug)]
pub struct WalRead {
    /// Every message read, in commit order (a claimed message's `seq` is
    /// its index here).
    messages: Vec<(Record, i64)>,
    /// The indexes of those kept aside at once.
    aside: Vec<usize>,
}

#[cfg(feature = "async")]
impl WalRead {
    /// Messages read (published or kept aside once settled).
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether it read no message.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

/// The statement that starts streaming `slot` on a replication
/// connection (from the slot's confirmed position), decoded by `pgoutput`
/// with the WAL outbox's messages.
#[doc(hidden)]
pub fn wal_start_replication(slot: &str) -> String {
    crate::backend::outbox_wal::start_replication(slot)
}

/// This database's WAL outbox slot, if it has a usable one.
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn wal_slot_async<C: AsyncInboxConnection>(
    conn: &mut C,
) -> Result<Option<String>, InboxError> {
    match run(conn, WalOp::Slot).await? {
        Answer::Texts(mut slots) if slots.len() <= 1 => Ok(slots.pop()),
        Answer::Texts(slots) => Err(InboxError::NoWalOutbox(
            format!("this database has more than one WAL outbox slot: {slots:?}").into(),
        )),
        other => Err(super::statements::unexpected(other)),
    }
}

/// Takes the WAL relay's lock on `conn` (a connection the relay keeps:
/// the lock is its session's), without waiting: whether this relay now
/// reads the slot (one relay at a time does).
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn wal_lock_async<C: AsyncInboxConnection>(conn: &mut C) -> Result<bool, InboxError> {
    Ok(super::statements::count_of(run(conn, WalOp::Lock).await?)? == 1)
}

/// Where the WAL is flushed to now (a relay reads the stream up to
/// there before it calls a read done).
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn wal_flushed_async<C: AsyncInboxConnection>(conn: &mut C) -> Result<u64, InboxError> {
    Ok(super::statements::count_of(run(conn, WalOp::Flushed).await?)? as u64)
}

/// `changes` (`pgoutput`'s messages of whole transactions, read from the
/// slot) decoded, with the keys among them that have live rows in the
/// outbox table now; [`WalDecoded::claim`] splits them.
#[cfg(feature = "async")]
#[doc(hidden)]
#[derive(Debug)]
pub struct WalDecoded {
    messages: Vec<(Record, i64)>,
    live: std::collections::HashSet<String>,
}

/// Decodes `changes` and asks the outbox table which of their keys have
/// live rows; `None` when they hold no message of ours.
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn wal_decode_async<C: AsyncInboxConnection>(
    conn: &mut C,
    changes: &[Vec<u8>],
) -> Result<Option<WalDecoded>, InboxError> {
    let decoded = decode(changes.iter().map(Vec::as_slice)).map_err(|why| {
        InboxError::Database(diesel::result::Error::DeserializationError(
            format!("the WAL outbox's slot: {why}").into(),
        ))
    })?;
    if decoded.messages.is_empty() {
        return Ok(None);
    }
    let mut keys: Vec<String> = decoded
        .messages
        .iter()
        .filter_map(|(m, _)| m.key.clone())
        .collect();
    keys.sort();
    keys.dedup();
    let live = if keys.is_empty() {
        Default::default()
    } else {
        match run(conn, WalOp::LiveKeys { keys }).await? {
            Answer::Texts(live) => live.into_iter().collect(),
            other => return Err(super::statements::unexpected(other)),
        }
    };
    Ok(Some(WalDecoded {
        messages: decoded.messages,
        live,
    }))
}

#[cfg(feature = "async")]
impl WalDecoded {
    /// Splits the messages into what to publish now (the claim, in waves;
    /// a message's `seq` is its place in the read) and what to keep aside
    /// at once: those of a key with live rows in the table, or among
    /// `also` (keys an earlier read kept aside since the table was asked).
    pub fn claim(self, also: &[String]) -> (WalRead, Claim) {
        let mut aside = Vec::new();
        let mut rows = Vec::new();
        for (i, (m, committed)) in self.messages.iter().enumerate() {
            if m.key
                .as_ref()
                .is_some_and(|k| self.live.contains(k) || also.contains(k))
            {
                aside.push(i);
                continue;
            }
            rows.push(ClaimedRow {
                seq: i as i64,
                id: m.id.clone(),
                destination: m.destination.clone(),
                ordering_key: m.key.clone(),
                payload: m.payload.clone(),
                headers: m.headers.clone(),
                attempts: 0,
                created_at: *committed,
                available_at: *committed,
                locked_until: None,
                now_micros: super::statements::now_micros(),
            });
        }
        let read = WalRead {
            messages: self.messages,
            aside,
        };
        (read, Claim::of(String::new(), rows))
    }
}

/// Settles a [`WalRead`] after its claim's publish (`outcomes[i]` is how
/// `claim.messages[i]`'s ended; none may be `Released` by an
/// unavailable broker: such a read is not settled, and is read again):
/// writes into the outbox table, in commit order, the messages kept
/// aside, refused (counted, due after their backoff, dead at once when
/// the relay allows one attempt) and kept back behind a refused one of
/// their key. The relay then confirms the read's end to the slot. Also
/// returns the keys it kept aside (their next messages go there too).
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn wal_settle_async<C: AsyncInboxConnection>(
    conn: &mut C,
    read: WalRead,
    claim: &Claim,
    outcomes: &[PublishOutcome],
) -> Result<(Settled, Vec<String>), InboxError> {
    let mut settled = Settled::default();
    let mut aside: Vec<(usize, i32, Option<String>, Duration, bool)> = read
        .aside
        .iter()
        .map(|&i| (i, 0, None, Duration::ZERO, false))
        .collect();
    let mut latencies = Vec::new();
    let now = super::statements::now_micros();
    for (message, (seq, outcome)) in claim.messages.iter().zip(claim.seqs.iter().zip(outcomes)) {
        let i = *seq as usize;
        match outcome {
            PublishOutcome::Published => {
                settled.published += 1;
                latencies.push(super::statements::micros(now - read.messages[i].1));
            }
            PublishOutcome::Failed {
                error,
                retry_in,
                max_publish_attempts,
            } => {
                let dead = *max_publish_attempts <= 1;
                if dead {
                    settled.dead += 1;
                    tracing::warn!(target: crate::target::TARGET, id = %message.id, destination = %message.destination, attempts = 1, error = %error, "diesel-inbox: outbox message is dead");
                } else {
                    settled.failed += 1;
                }
                aside.push((i, 1, Some(error.clone()), *retry_in, dead));
            }
            PublishOutcome::Released => aside.push((i, 0, None, Duration::ZERO, false)),
        }
    }
    aside.sort_by_key(|(i, ..)| *i);
    let ops: Vec<Op> = aside
        .iter()
        .map(|(i, attempts, error, delay, dead)| {
            let (m, committed) = &read.messages[*i];
            Op::Wal(WalOp::Aside(AsideRow {
                id: m.id.clone(),
                destination: m.destination.clone(),
                key: m.key.clone(),
                payload: m.payload.clone(),
                headers: m.headers.clone(),
                created_at: *committed,
                delay: delay.as_micros() as i64,
                attempts: *attempts,
                last_error: error
                    .as_deref()
                    .map(|e| crate::rows::error_text(e).to_owned()),
                dead: *dead,
            }))
        })
        .collect();
    if !ops.is_empty() {
        let answers = super::statements::transaction_of(conn, ops, None)
            .await
            .map_err(ops_error::<C::Backend>)?;
        for ((i, ..), answer) in aside.iter().zip(answers) {
            if super::statements::count_of(answer)? != 1 {
                return Err(InboxError::InvalidOutgoing(
                    format!(
                        "the WAL outbox's message {:?} has the id of another message in the outbox \
                         table, so the relay cannot keep it aside there and stops before it: \
                         purge or delete that row (ids must be unique)",
                        read.messages[*i].0.id
                    )
                    .into(),
                ));
            }
        }
    }
    crate::telemetry::outbox_published(&latencies);
    crate::telemetry::outbox_failed(settled.failed, settled.dead);
    let mut keys: Vec<String> = aside
        .iter()
        .filter_map(|(i, ..)| read.messages[*i].0.key.clone())
        .collect();
    keys.sort();
    keys.dedup();
    Ok((settled, keys))
}

#[cfg(feature = "async")]
async fn run<C: AsyncInboxConnection>(conn: &mut C, op: WalOp) -> Result<Answer, InboxError> {
    short_transaction_async(conn, Op::Wal(op))
        .await
        .map_err(ops_error::<C::Backend>)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: Option<&str>, headers: Option<Vec<u8>>) -> NewRow {
        NewRow {
            id: "id-1".into(),
            destination: "orders".into(),
            key: key.map(str::to_owned),
            payload: vec![0, 1, 2, 255],
            headers,
            after: 0,
            at: None,
            notify: false,
        }
    }

    #[test]
    fn a_record_reads_back() {
        for (key, headers) in [
            (None, None),
            (Some("k"), Some(vec![1, 0, 0, 0, b'a'])),
            (Some(""), None),
        ] {
            let row = row(key, headers.clone());
            let back = read_record(&record(&row).unwrap()).unwrap();
            assert_eq!(
                back,
                Record {
                    id: "id-1".into(),
                    destination: "orders".into(),
                    key: key.map(str::to_owned),
                    payload: vec![0, 1, 2, 255],
                    headers,
                }
            );
        }
        let bytes = record(&row(Some("k"), None)).unwrap();
        assert_eq!(read_record(&bytes[..bytes.len() - 1]), None);
        assert_eq!(read_record(&[2]), None);
    }

    #[test]
    fn a_delayed_message_is_refused() {
        let mut delayed = row(None, None);
        delayed.after = 5;
        assert!(matches!(
            record(&delayed),
            Err(InboxError::InvalidOutgoing(_))
        ));
    }

    /// pgoutput's rows as PostgreSQL 15 wrote them for a transaction with
    /// one message of ours and one of another prefix.
    #[test]
    fn pgoutput_rows_decode() {
        let content = record(&row(Some("k"), None)).unwrap();
        let mut begin = vec![b'B'];
        begin.extend(0x47eb028i64.to_be_bytes());
        begin.extend(1_000_000i64.to_be_bytes());
        begin.extend(7u32.to_be_bytes());
        let message = |prefix: &str, content: &[u8]| {
            let mut m = vec![b'M', 1];
            m.extend(0x47d2e60i64.to_be_bytes());
            m.extend(prefix.as_bytes());
            m.push(0);
            m.extend((content.len() as u32).to_be_bytes());
            m.extend(content);
            m
        };
        let mut commit = vec![b'C', 0];
        commit.extend(0x47eb028i64.to_be_bytes());
        commit.extend(0x47eb210i64.to_be_bytes());
        commit.extend(1_000_000i64.to_be_bytes());
        let ours = message(crate::backend::outbox_wal::PREFIX, &content);
        let others = message("someone_else", b"x");
        let rows = [&begin[..], &others, &ours, &commit];
        let decoded = decode(rows).unwrap();
        assert_eq!(decoded.messages.len(), 1);
        assert_eq!(decoded.messages[0].1, 1_000_000 + PG_EPOCH_MICROS);
        assert_eq!(decoded.messages[0].0.key.as_deref(), Some("k"));
        let bad = message(crate::backend::outbox_wal::PREFIX, b"\x01\x05");
        assert!(decode([&begin[..], &bad, &commit]).is_err());
    }
}
