//! The in-process wake-up of outbox relays: an `#[idempotent]` call whose
//! body enqueued an outgoing message wakes the relays of its process once
//! its transaction has committed, so that they publish at once instead of
//! at their next poll.
//!
//! The engine reads [`mark`] when the body starts and calls
//! [`after_commit`] with it once the call's own transaction has committed:
//! if any enqueue happened in between (this call's, or a concurrent one's,
//! which only makes a wake-up early), the relays wake. Two relaxed atomic
//! loads per call; the lock is taken only to wake.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

/// Enqueues so far, in this process.
static ENQUEUED: AtomicU64 = AtomicU64::new(0);
/// Wake-ups so far.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The relays waiting for the next wake-up.
static WAITING: Mutex<Vec<Waker>> = Mutex::new(Vec::new());

/// Counts an enqueue (in a transaction not yet committed).
pub(crate) fn enqueued() {
    ENQUEUED.fetch_add(1, Ordering::Relaxed);
}

/// What [`after_commit`] compares with.
pub(crate) fn mark() -> u64 {
    ENQUEUED.load(Ordering::Relaxed)
}

/// After a commit: wakes the relays if anything was enqueued since `mark`.
pub(crate) fn after_commit(mark: u64) {
    if ENQUEUED.load(Ordering::Relaxed) != mark {
        wake();
    }
}

/// Wakes every relay of this process that waits for new messages.
pub(crate) fn wake() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    let waiting = std::mem::take(&mut *WAITING.lock().unwrap_or_else(|e| e.into_inner()));
    for waker in waiting {
        waker.wake();
    }
}

/// The wake-ups so far: what [`Woken`] waits to change.
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::SeqCst)
}

/// Resolves at the first wake-up after [`generation`] returned `seen`.
pub(crate) struct Woken {
    pub(crate) seen: u64,
}

impl Future for Woken {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if generation() != self.seen {
            return Poll::Ready(());
        }
        // One entry per waiting task: a relay that polls again after each
        // poll interval, with no enqueue in between, keeps its one entry
        // instead of adding one every interval.
        let mut waiting = WAITING.lock().unwrap_or_else(|e| e.into_inner());
        if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
            waiting.push(cx.waker().clone());
        }
        drop(waiting);
        // A wake-up between the first check and the push is seen here.
        if generation() != self.seen {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_polled_again_and_again_waits_once_and_wakes() {
        struct Task;
        impl std::task::Wake for Task {
            fn wake(self: std::sync::Arc<Self>) {}
        }
        let waker = Waker::from(std::sync::Arc::new(Task));
        let mut context = Context::from_waker(&waker);
        let mut woken = std::pin::pin!(Woken { seen: generation() });
        for _ in 0..100 {
            assert!(woken.as_mut().poll(&mut context).is_pending());
        }
        let entries = WAITING.lock().unwrap().len();
        assert_eq!(entries, 1, "one entry for one task");
        wake();
        assert!(woken.as_mut().poll(&mut context).is_ready());
        assert!(WAITING.lock().unwrap().is_empty());
    }
}
