//! The duplicates of each consumer, per minute, in this process: a
//! duplicate leaves no row, so the operations console cannot count them
//! in the database. Only the duplicate path counts (an applied message
//! pays nothing): a lock and a slot per consumer.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// How many minutes are kept: the console's window.
pub const MINUTES: usize = 30;

/// A consumer's counts: `counts[m % MINUTES]` is minute `m`'s, for the
/// minutes since `latest - MINUTES`.
struct Window {
    latest: u64,
    counts: [u64; MINUTES],
}

fn windows() -> &'static Mutex<HashMap<String, Window>> {
    static WINDOWS: OnceLock<Mutex<HashMap<String, Window>>> = OnceLock::new();
    WINDOWS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn minute_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60)
}

impl Window {
    /// Moves the window to `minute`, zeroing the minutes it passes.
    fn advance(&mut self, minute: u64) {
        if minute <= self.latest {
            return;
        }
        for m in (self.latest + 1)..=minute.min(self.latest + MINUTES as u64) {
            self.counts[(m % MINUTES as u64) as usize] = 0;
        }
        if minute > self.latest + MINUTES as u64 {
            self.counts = [0; MINUTES];
        }
        self.latest = minute;
    }
}

/// A duplicate of `consumer` now.
pub(crate) fn duplicate(consumer: &str) {
    let minute = minute_now();
    let mut windows = windows().lock().unwrap_or_else(|e| e.into_inner());
    let window = match windows.get_mut(consumer) {
        Some(window) => window,
        None => windows.entry(consumer.to_owned()).or_insert(Window {
            latest: minute,
            counts: [0; MINUTES],
        }),
    };
    window.advance(minute);
    window.counts[(minute % MINUTES as u64) as usize] += 1;
}

/// The duplicates this process saw per consumer, per minute of its clock,
/// the last [`RATE_MINUTES`](crate::RATE_MINUTES) minutes, oldest first (the last entry is the
/// current minute, so far). Consumers with none are absent.
///
/// ```
/// // A process that handled no duplicate has nothing to show.
/// assert!(diesel_inbox::recent_duplicates().iter().all(|(_, minutes)| minutes.len() == 30));
/// ```
pub fn recent_duplicates() -> Vec<(String, Vec<u64>)> {
    let minute = minute_now();
    let mut windows = windows().lock().unwrap_or_else(|e| e.into_inner());
    let mut all: Vec<(String, Vec<u64>)> = windows
        .iter_mut()
        .map(|(consumer, window)| {
            window.advance(minute);
            let minutes = (0..MINUTES as u64)
                .map(|ago| {
                    let m = minute.wrapping_sub(MINUTES as u64 - 1 - ago);
                    window.counts[(m % MINUTES as u64) as usize]
                })
                .collect();
            (consumer.clone(), minutes)
        })
        .filter(|(_, minutes): &(String, Vec<u64>)| minutes.iter().any(|n| *n > 0))
        .collect();
    all.sort();
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_forgets_the_minutes_it_passes() {
        let mut window = Window {
            latest: 100,
            counts: [0; MINUTES],
        };
        window.counts[(100 % MINUTES as u64) as usize] = 7;
        window.advance(100 + MINUTES as u64 - 1);
        assert_eq!(window.counts.iter().sum::<u64>(), 7);
        window.advance(100 + MINUTES as u64);
        assert_eq!(window.counts.iter().sum::<u64>(), 0);
        window.counts[0] = 3;
        window.advance(10_000);
        assert_eq!(window.counts.iter().sum::<u64>(), 0);
    }

    #[test]
    fn duplicates_are_counted_in_the_current_minute() {
        duplicate("recent-test");
        duplicate("recent-test");
        let all = recent_duplicates();
        let (_, minutes) = all
            .iter()
            .find(|(consumer, _)| consumer == "recent-test")
            .expect("counted");
        assert_eq!(minutes.len(), MINUTES);
        assert_eq!(minutes[MINUTES - 1], 2);
    }
}
