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
                        tracing::warn!(target: crate::TRACING_TARGET, "diesel-inbox: outbox relay: the WAL outbox has no usable replication slot in this database; create it with diesel_inbox::outbox::wal::create (enqueues to the WAL are refused until then)");
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
        // A stream kept from the last pass may have been closed meanwhile
        // (the server's `wal_sender_timeout` while the relay slept): it
        // confirmed all it read, so a new one takes over with nothing lost.
        let mut kept = side.stream.is_some();
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
            let Some(stream) = side.stream.as_mut() else {
                return Ok(true);
            };
            let chunk = match stream.read(upto, self.batch_size).await {
                Ok(chunk) => chunk,
                Err(e) if kept => {
                    tracing::debug!(target: crate::TRACING_TARGET, error = %e, "diesel-inbox: outbox relay: the WAL stream kept from the last pass is gone; streaming again");
                    kept = false;
                    side.stream = None;
                    continue;
                }
                Err(e) => return Err(RelayError::Replication(e)),
            };
            kept = false;
            let Some(end) = chunk.end else {
                return Ok(true);
            };
            if let Some((read, claim)) = steps::wal_claim_async(conn, &chunk.messages).await? {
                let messages = read.len() as u64;
                let delivered = self.publish(claim).await;
                if delivered.stops() {
                    // Nothing is settled: the stream is closed, and the
                    // whole read is published again (the broker has some
                    // of it, with the same ids).
                    report.released += messages;
                    return match delivered.closed {
                        Some(e) => Err(RelayError::Publisher(e)),
                        None => Ok(false),
                    };
                }
                let settled =
                    steps::wal_settle_async(conn, read, &delivered.claim, &delivered.outcomes)
                        .await?;
                report.published += settled.published;
                report.failed += settled.failed;
                report.dead += settled.dead;
                report.batches += 1;
            }
            stream.confirm(end).await.map_err(RelayError::Replication)?;
        }
    }
}
