//! A relay's settings, kept in their ranges: the same for a relay on one
//! database and one over tenants.

#[cfg(doc)]
use super::Relay;
use super::{
    DEFAULT_BATCH_SIZE, DEFAULT_MAX_PUBLISH_ATTEMPTS, DEFAULT_POLL_INTERVAL, LEASE, MAX_INTERVAL,
};
use std::time::Duration;

/// A relay's settings, the same for a relay on one database and one over
/// tenants ([`Relay::tenants`]), each kept in its range.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub(crate) batch_size: usize,
    pub(crate) poll_interval: Duration,
    pub(crate) max_publish_attempts: u32,
    pub(crate) lease: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            batch_size: DEFAULT_BATCH_SIZE,
            poll_interval: DEFAULT_POLL_INTERVAL,
            max_publish_attempts: DEFAULT_MAX_PUBLISH_ATTEMPTS,
            lease: LEASE,
        }
    }
}

impl Settings {
    /// [`Relay::batch_size`]: 1 to 10,000.
    pub(crate) fn batch_size(&mut self, n: usize) {
        self.batch_size = n.clamp(1, 10_000);
    }

    /// [`Relay::poll_interval`]: 1 ms to a day.
    pub(crate) fn poll_interval(&mut self, interval: Duration) {
        self.poll_interval = interval.clamp(Duration::from_millis(1), MAX_INTERVAL);
    }

    /// [`Relay::max_publish_attempts`]: at least 1.
    pub(crate) fn max_publish_attempts(&mut self, n: u32) {
        self.max_publish_attempts = n.max(1);
    }

    /// [`Relay::lease`]: 1 s to a day.
    pub(crate) fn lease(&mut self, lease: Duration) {
        self.lease = lease.clamp(Duration::from_secs(1), MAX_INTERVAL);
    }
}
