//! Stream positions kept in the handler's own transaction (Kafka): a
//! consumer runner puts the positions of the messages it hands to a
//! handler in scope ([`at_position`] for one message, [`at_positions`] for
//! a batch: one per partition); the first async inbox call inside (single
//! or batch) takes them ([`take`]), writes them to `inbox_positions` in its
//! transaction, behind a guard that never moves one backwards (the fence),
//! and reports what it found ([`Verdict`], per position). The runner reads
//! the verdicts when the handler returns.
//!
//! A position is `(consumer, topic, partition)` to the offset after the
//! last message applied: `offset + 1` of what committed, never assuming
//! that offsets are contiguous.

// Only async calls take a position (the runners are async).
#![cfg_attr(not(feature = "async"), allow(dead_code))]

use std::sync::{Arc, Mutex};

/// How long a transaction that moves a stream position may sit idle (its
/// client sends nothing) before PostgreSQL ends its session: a consumer
/// stopped inside its transaction holds its partition's position row, and
/// the new owner waits on it, for at most this long.
#[cfg_attr(not(all(test, feature = "postgres")), allow(dead_code))] // the tests tie PostgreSQL's to it
pub(crate) const FENCED_IDLE_LIMIT_SECS: u64 = 30;

/// The position of the message a handler runs for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The message's offset (a batch's: its first message's on this
    /// partition): the guard admits a stored position up to it.
    pub offset: i64,
    /// The offset of the last message the call applies on this partition
    /// (`offset` for one message): the position moves to `last + 1`.
    pub last: i64,
    /// The lowest stored position the runner accepts as its own: the
    /// stored position it last wrote or learned for this partition (a
    /// message it dead-lettered, or one of a handler without the inbox,
    /// moves the stream past what is stored). `None`: the stored position
    /// must be this message's offset (or none yet), as for the first
    /// message of a partition the runner sees.
    pub floor: Option<i64>,
}

/// What the fence found, reported to the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The position moved to `offset + 1` and the transaction committed.
    Written,
    /// The stored position is past this message (`> offset`): a newer
    /// owner, or this one before, applied it. Nothing was applied; the
    /// call returned `Duplicate`. Continue from the stored position.
    Passed(i64),
    /// The stored position is before what the runner accepts (below the
    /// floor, or below the offset without one): messages between it and
    /// this one were not applied. Nothing was applied; the call returned
    /// `Duplicate`. Continue from the stored position.
    Behind(i64),
}

/// The statement layer's answer to a fence write, in the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// The position was written (inserted, or moved forward).
    Moved,
    /// The stored position of the `index`th position of the call, which
    /// the guard refused to move (the positions after it were not read).
    Refused {
        /// Which of the call's positions.
        index: usize,
        /// What is stored for it.
        stored: i64,
    },
}

impl Position {
    /// Whether the guard lets a stored position `stored` move to this
    /// message's `offset + 1`.
    pub(crate) fn admits(&self, stored: Option<i64>) -> bool {
        match stored {
            None => true,
            Some(s) => self.floor.unwrap_or(self.offset) <= s && s <= self.offset,
        }
    }

    /// The verdict on a refused stored position.
    pub(crate) fn refused(&self, stored: i64) -> Verdict {
        match stored > self.offset {
            true => Verdict::Passed(stored),
            false => Verdict::Behind(stored),
        }
    }
}

/// The positions in scope, and what became of them.
#[derive(Debug)]
struct Slot {
    positions: Vec<Position>,
    state: Mutex<State>,
}

#[derive(Debug, Clone)]
enum State {
    /// No inbox call has taken them.
    Open,
    /// An inbox call holds them.
    Taken,
    /// An inbox call reported them: a verdict per position (`None`: not
    /// read, after another position was refused).
    Done(Vec<Option<Verdict>>),
}

#[cfg(feature = "async")]
tokio::task_local! {
    static SLOT: Arc<Slot>;
}

/// Runs `call` with `position` in scope, and returns what the first
/// inbox call that took it reported (`None`: no async inbox call ran to
/// its end, or the handler's transaction did not commit).
#[cfg(feature = "async")]
pub async fn at_position<F: std::future::Future>(
    position: Position,
    call: F,
) -> (F::Output, Option<Verdict>) {
    let (output, mut verdicts) = at_positions(vec![position], call).await;
    (output, verdicts.pop().flatten())
}

/// Runs `call` (a batch's handler) with `positions` in scope (one per
/// partition, in the order their rows are locked: sort them), and returns
/// what the first inbox call that took them reported, per position
/// (`None`: no async inbox call ran to its end, the handler's transaction
/// did not commit, or another position was refused before this one was
/// read).
#[cfg(feature = "async")]
pub async fn at_positions<F: std::future::Future>(
    positions: Vec<Position>,
    call: F,
) -> (F::Output, Vec<Option<Verdict>>) {
    let count = positions.len();
    let slot = Arc::new(Slot {
        positions,
        state: Mutex::new(State::Open),
    });
    let output = SLOT.scope(slot.clone(), call).await;
    let verdicts = match &*slot.state.lock().unwrap_or_else(|e| e.into_inner()) {
        State::Done(verdicts) => verdicts.clone(),
        State::Open | State::Taken => vec![None; count],
    };
    (output, verdicts)
}

/// The position in scope, for the inbox call that takes it: `None` when
/// there is none, or another call took it.
pub(crate) fn take() -> Option<Taken> {
    #[cfg(feature = "async")]
    return SLOT
        .try_with(|slot| {
            let mut state = slot.state.lock().unwrap_or_else(|e| e.into_inner());
            match *state {
                State::Open => {
                    *state = State::Taken;
                    Some(Taken(slot.clone()))
                }
                State::Taken | State::Done(_) => None,
            }
        })
        .ok()
        .flatten();
    #[cfg(not(feature = "async"))]
    None
}

/// A position an inbox call took: reported once, or given back (for a
/// later call in the same handler) when dropped unreported.
#[derive(Debug)]
pub(crate) struct Taken(Arc<Slot>);

impl Taken {
    pub(crate) fn positions(&self) -> &[Position] {
        &self.0.positions
    }

    /// Reports that every position moved, and the transaction committed.
    pub(crate) fn written(&self) {
        let verdicts = vec![Some(Verdict::Written); self.0.positions.len()];
        *self.0.state.lock().unwrap_or_else(|e| e.into_inner()) = State::Done(verdicts);
    }

    /// Reports that the guard refused the `index`th position, `stored`.
    pub(crate) fn refused(&self, index: usize, stored: i64) {
        let mut verdicts = vec![None; self.0.positions.len()];
        if let (Some(verdict), Some(position)) =
            (verdicts.get_mut(index), self.0.positions.get(index))
        {
            *verdict = Some(position.refused(stored));
        }
        *self.0.state.lock().unwrap_or_else(|e| e.into_inner()) = State::Done(verdicts);
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*state, State::Taken) {
            *state = State::Open;
        }
    }
}

impl PartialEq for Taken {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Taken {}
