//! A relay's reads of the WAL outbox ([`Relay::wal`]): on a connection of
//! its own that holds the WAL relay's lock (one relay reads a database's
//! slot at a time) and a replication connection streaming the slot, read
//! whole transactions, publish their messages in waves, keep aside in the
//! outbox table what cannot be published now, then confirm the read to the
//! slot.

use super::wal_stream::{Stream, Target};
use super::{Relay, RelayError, RelayReport};
use crate::outbox::pool::RelayPool;
use crate::outbox::publish::Publish;
use inbox_runtime::outbox as steps;

/// The WAL relay's connections, its slot, and whether it holds the lock.
pub(super) struct WalSide<C> {
    conn: Option<C>,
    stream: Option<Stream>,
    slot: String,
    held: bool,
    /// Whether "no slot" was said (once per relay).
    said: bool,
}

impl<C> Default for WalSide<C> {
    fn default() -> Self {
        WalSide {
            conn: None,
            stream: None,
            slot: String::new(),
            held: false,
            said: false,
        }
    }
}

impl<D, P> Relay<D, P>
where
    D: RelayPool,
    P: Publish,
{
    /// Publishes what the WAL outbox's slot holds up to where the WAL was
    /// flushed when the pass began. `Ok(false)`: the broker was
    /// unavailable (the read is given back: the stream is closed, and the
    /// next pass reads again from what the slot confirmed); the pass stops
    /// there. Another relay holding the slot, or no slot (said once, at
    /// WARN), leaves it to the table.
    pub(super) async fn wal_pass(&self, report: &mut RelayReport) -> Result<bool, RelayError> {
        let mut side = self.wal_side.lock().await;
        let passed = self.wal_reads(&mut side, report).await;
        if !matches!(passed, Ok(true)) {
            // The stream starts again from the slot's confirmed position;
            // after an error, the connection (and with it the lock) is
            // opened again.
            side.stream = None;
        }
        if passed.is_err() {
            side.conn = None;
            side.held = false;
        }
        passed
    }

    async fn wal_reads(
        &self,
        side: &mut WalSide<D::Connection>,
        report: &mut RelayReport,
    ) -> Result<bool, RelayError> {
        if side.conn.is_none() {
            let mut conn = self.pool.dedicated().await.map_err(RelayError::Pool)?;
            match steps::wal_slot_async(&mut conn).await? {
                Some(slot) => side.slot = slot,
                None => {
                    if !side.said {
                        side.said = true;
                        tracing::warn!(target: crate::TRACING_TARGET, "diesel-inbox: outbox relay: the WAL outbox has no usable replication slot in this database; create it with diesel_inbox::outbox::wal::create (enqueues to the WAL are refused until then; a slot the server invalidated must be removed, and its messages are lost: outbox status says so)");
                    }
                    return Ok(true);
                }
            }
            side.conn = Some(conn);
            side.held = false;
        }
        let Some(conn) = side.conn.as_mut() else {
            return Ok(true);
        };
        if !side.held {
            side.held = steps::wal_lock_async(conn).await?;
            if !side.held {
                // Another relay reads the slot.
                return Ok(true);
            }
        }
        let upto = steps::wal_flushed_async(conn).await?;
        let mut next = self.wal_read(side, upto, true).await?;
        let (Some(conn), Some(stream)) = (side.conn.as_mut(), side.stream.as_mut()) else {
            return Ok(true);
        };
        // Keys the last read kept aside in the table (its settlement came
        // after this read asked the table).
        let mut also: Vec<String> = Vec::new();
        loop {
            let Some((decoded, end)) = next.take() else {
                return Ok(true);
            };
            let Some(decoded) = decoded else {
                stream.confirm(end).await.map_err(RelayError::Replication)?;
                next = read_next(stream, conn, upto, self.settings.batch_size).await?;
                continue;
            };
            let (read, claim) = decoded.claim(&also);
            let messages = read.len() as u64;
            // The next read (the server's decoding, the table's live keys)
            // while the broker confirms this one.
            let (delivered, following) = tokio::join!(
                self.publish(claim),
                read_next(stream, conn, upto, self.settings.batch_size)
            );
            if delivered.stops() {
                // Nothing is settled: the stream is closed, and the whole
                // read is published again (the broker has some of it, with
                // the same ids).
                report.released += messages;
                return match delivered.closed {
                    Some(e) => Err(RelayError::Publisher(e)),
                    None => Ok(false),
                };
            }
            let (settled, aside) =
                steps::wal_settle_async(conn, read, &delivered.claim, &delivered.outcomes).await?;
            report.published += settled.published;
            report.failed += settled.failed;
            report.dead += settled.dead;
            report.batches += 1;
            stream.confirm(end).await.map_err(RelayError::Replication)?;
            also = aside;
            next = following?;
        }
    }

    /// The first read of a pass: on the stream kept from the last pass, or
    /// (if the server closed that one meanwhile: it had confirmed all it
    /// read, so nothing is lost) on a new one.
    async fn wal_read(
        &self,
        side: &mut WalSide<D::Connection>,
        upto: u64,
        mut kept: bool,
    ) -> Result<Option<(Option<steps::WalDecoded>, u64)>, RelayError> {
        kept &= side.stream.is_some();
        loop {
            if side.stream.is_none() {
                let url = self.wal.as_deref().unwrap_or_default();
                let target = Target::parse(url)
                    .map_err(|why| RelayError::Replication(std::io::Error::other(why)))?;
                side.stream = Some(
                    Stream::open(&target, &side.slot)
                        .await
                        .map_err(RelayError::Replication)?,
                );
            }
            let (Some(conn), Some(stream)) = (side.conn.as_mut(), side.stream.as_mut()) else {
                return Ok(None);
            };
            match read_next(stream, conn, upto, self.settings.batch_size).await {
                Err(RelayError::Replication(e)) if kept => {
                    tracing::debug!(target: crate::TRACING_TARGET, error = %e, "diesel-inbox: outbox relay: the WAL stream kept from the last pass is gone; streaming again");
                    kept = false;
                    side.stream = None;
                }
                read => return read,
            }
        }
    }
}

/// The next read of the stream, decoded, with the table's live keys; and
/// the position to confirm once it is settled. `None`: nothing new.
async fn read_next<C: inbox_runtime::AsyncInboxConnection>(
    stream: &mut Stream,
    conn: &mut C,
    upto: u64,
    batch_size: usize,
) -> Result<Option<(Option<steps::WalDecoded>, u64)>, RelayError> {
    let chunk = stream
        .read(upto, batch_size)
        .await
        .map_err(RelayError::Replication)?;
    let Some(end) = chunk.end else {
        return Ok(None);
    };
    Ok(Some((
        steps::wal_decode_async(conn, &chunk.messages).await?,
        end,
    )))
}
