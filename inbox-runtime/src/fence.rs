//! Stream positions kept in the handler's own transaction (Kafka): a
//! consumer runner puts the position of the message it hands to a handler
//! in scope ([`at_position`]); the first single async inbox call inside
//! takes it ([`take`]), writes it to `inbox_positions` in its transaction,
//! behind a guard that never moves it backwards (the fence), and reports
//! what it found ([`Verdict`]). The runner reads the verdict when the
//! handler returns.
//!
//! A position is `(consumer, topic, partition)` to the offset after the
//! last message applied: `offset + 1` of what committed, never assuming
//! that offsets are contiguous.

// Only async calls take a position (the runners are async).
#![cfg_attr(not(feature = "async"), allow(dead_code))]

use std::sync::{Arc, Mutex};

/// The position of the message a handler runs for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The message's offset.
    pub offset: i64,
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
    /// The stored position, which the guard refused to move.
    Refused(i64),
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

/// A position in scope, and what became of it.
#[derive(Debug)]
struct Slot {
    position: Position,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// No inbox call has taken it.
    Open,
    /// An inbox call holds it.
    Taken,
    /// An inbox call reported it.
    Done(Verdict),
}

#[cfg(feature = "async")]
tokio::task_local! {
    static SLOT: Arc<Slot>;
}

/// Runs `call` with `position` in scope, and returns what the first
/// inbox call that took it reported (`None`: no single async inbox call
/// ran to its end, or the handler's transaction did not commit).
#[cfg(feature = "async")]
pub async fn at_position<F: std::future::Future>(
    position: Position,
    call: F,
) -> (F::Output, Option<Verdict>) {
    let slot = Arc::new(Slot {
        position,
        state: Mutex::new(State::Open),
    });
    let output = SLOT.scope(slot.clone(), call).await;
    let verdict = match *slot.state.lock().unwrap_or_else(|e| e.into_inner()) {
        State::Done(verdict) => Some(verdict),
        State::Open | State::Taken => None,
    };
    (output, verdict)
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
    pub(crate) fn position(&self) -> &Position {
        &self.0.position
    }

    /// Reports what the fence found.
    pub(crate) fn report(&self, verdict: Verdict) {
        *self.0.state.lock().unwrap_or_else(|e| e.into_inner()) = State::Done(verdict);
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
