//! One backoff for everything that waits after a failure: a transaction
//! rerun after a deadlock (the engine), a purge batch, `migrate`'s lock, a
//! failure count, a broker redelivery (the consumer runners' policy) and
//! the outbox relay's outages. Each delay is the first one doubled per
//! earlier attempt, capped, then jittered to between half and all of it,
//! so that what one fault failed together does not come back in lockstep.
//!
//! The jitter is random: SipHash (the standard library's `RandomState`,
//! keyed from the operating system's randomness once per process) of a
//! process-wide counter. A clock's sub-second digits, which this replaced,
//! are the same for every relay or consumer that failed at the same
//! instant.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The `n`th delay (1 for the first): `first` doubled `n - 1` times,
/// capped at `cap`, then jittered to between half and all of it.
///
/// ```
/// use std::time::Duration;
/// # use inbox_runtime::__facade::backoff;
/// let (first, cap) = (Duration::from_millis(100), Duration::from_secs(2));
/// let third = backoff(first, cap, 3);
/// assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
/// assert!(backoff(first, cap, 40) <= cap);
/// ```
pub fn backoff(first: Duration, cap: Duration, n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(31);
    let delay = first.saturating_mul(1u32 << doublings).min(cap);
    delay / 2 + (delay / 2).mul_f64(unit())
}

/// A transaction's rerun after a transient error (`attempt` 1 for the
/// first): 2 to 4 ms, doubling up to 256 to 512 ms.
pub(crate) fn rerun(attempt: u32) -> Duration {
    backoff(
        Duration::from_millis(4),
        Duration::from_millis(512),
        attempt,
    )
}

/// A random number in `[0, 1)`.
fn unit() -> f64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = KEYS.get_or_init(RandomState::new).build_hasher();
    hasher.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
    // The top 53 bits: every such value is exact in an f64.
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_within_half_and_all() {
        let (first, cap) = (Duration::from_millis(100), Duration::from_secs(1));
        for n in 1..=10 {
            let full = (first * 2u32.pow(n - 1)).min(cap);
            let got = backoff(first, cap, n);
            assert!(
                got >= full / 2 && got <= full,
                "delay {n}: {got:?} of {full:?}"
            );
        }
    }

    #[test]
    fn the_jitter_spreads_delays_that_start_at_once() {
        let first = Duration::from_secs(1);
        let delays: Vec<Duration> = (0..64).map(|_| backoff(first, first, 1)).collect();
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(
            distinct.len() > 48,
            "{} distinct delays of 64",
            distinct.len()
        );
        // Spread over the whole range, not bunched at one end: a draw in
        // each quarter of [0.5 s, 1 s].
        for quarter in 0..4u32 {
            let low = Duration::from_millis(500 + 125 * u64::from(quarter));
            let high = low + Duration::from_millis(125);
            assert!(
                delays.iter().any(|d| *d >= low && *d < high),
                "no delay in [{low:?}, {high:?}): {delays:?}"
            );
        }
    }
}
