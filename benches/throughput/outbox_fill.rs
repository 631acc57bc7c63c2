//! What the relay's measurements share (`--outbox` and the measurements
//! it runs over a backlog and a long transaction): the outbox filled for a
//! round, and the median of a round's samples.

use crate::bench::Bench;
use diesel::connection::SimpleConnection;
use diesel_inbox::outbox::{self, Outgoing};

/// The median of `samples` (sorted in place).
pub(crate) fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Fills the outbox with `n` messages for `destination`, spread over
/// `keys` ordering keys (0: a key of its own for each).
pub(crate) fn fill<B: Bench>(
    url: &str,
    n: usize,
    keys: usize,
    destination: &str,
) -> Result<(), String> {
    let mut conn = B::open(url);
    conn.batch_execute("DELETE FROM outbox_messages")
        .map_err(|e| e.to_string())?;
    // Every round deletes what the last one left (PostgreSQL then vacuums:
    // `Bench::OUTBOX_EMPTIED`).
    if let Some(sql) = B::OUTBOX_EMPTIED {
        conn.batch_execute(sql).map_err(|e| e.to_string())?;
    }
    B::tx(&mut conn, |conn| {
        for i in 0..n {
            let key = format!("k{}", if keys == 0 { i } else { i % keys });
            outbox::enqueue(
                conn,
                Outgoing::new(destination, vec![7u8; 64]).ordering_key(&key),
            )?;
        }
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    if let Some(sql) = B::OUTBOX_FILLED {
        conn.batch_execute(sql).map_err(|e| e.to_string())?;
    }
    Ok(())
}
