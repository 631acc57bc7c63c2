//! What a call claims, and what the claim's result means: one key, or the
//! distinct keys of a batch. Shared by the sync and the async driver.

use crate::error::InboxError;
use crate::key::{validate_key, InboxKey};
use crate::processed::Batch;
use std::collections::HashSet;

/// The keys of a batch: validated, the first message of each distinct key,
/// and the distinct keys in one lock order.
pub(crate) struct BatchPlan {
    keys: Vec<String>,
    /// Input positions of the first message of each distinct key.
    firsts: Vec<usize>,
    /// Positions (into `keys`) of the distinct keys, sorted by key: every
    /// batch claims in this one order, so overlapping batches wait for each
    /// other rather than deadlock.
    sorted: Vec<usize>,
}

impl BatchPlan {
    /// Refuses the whole batch if one key is invalid.
    pub(crate) fn new<M>(messages: &[M], key: impl Fn(&M) -> String) -> Result<Self, InboxError> {
        let keys: Vec<String> = messages.iter().map(key).collect();
        for key in &keys {
            validate_key(key).map_err(InboxError::InvalidKey)?;
        }
        let mut seen = HashSet::with_capacity(keys.len());
        let firsts: Vec<usize> = (0..keys.len())
            .filter(|&i| seen.insert(keys[i].as_str()))
            .collect();
        let mut sorted = firsts.clone();
        sorted.sort_unstable_by(|&a, &b| keys[a].cmp(&keys[b]));
        Ok(BatchPlan {
            keys,
            firsts,
            sorted,
        })
    }

    /// The distinct keys, in claim order.
    pub(crate) fn distinct(&self) -> Vec<&str> {
        self.sorted.iter().map(|&i| self.keys[i].as_str()).collect()
    }

    /// Input positions of the messages whose keys `claimed` holds (first
    /// deliveries), in input order.
    pub(crate) fn applied(&self, claimed: &[String]) -> Vec<usize> {
        let claimed: HashSet<&str> = claimed.iter().map(String::as_str).collect();
        self.firsts
            .iter()
            .copied()
            .filter(|&i| claimed.contains(self.keys[i].as_str()))
            .collect()
    }

    /// The outcome of a batch whose body returned `value` (`None`: it did not
    /// run) for the messages at `applied`.
    pub(crate) fn outcome<T>(&self, value: Option<T>, applied: Vec<usize>) -> Batch<T> {
        Batch {
            value,
            duplicates: self.keys.len() - applied.len(),
            applied,
        }
    }

    /// A name for logs.
    pub(crate) fn describe(&self) -> String {
        format!("batch of {}", self.keys.len())
    }
}

/// What a claim found new: for one key, whether its row was inserted; for a
/// batch, the input positions of its first deliveries.
pub(crate) trait Work: Default {
    /// Whether the body has anything to run.
    fn any(&self) -> bool;
}

impl Work for bool {
    fn any(&self) -> bool {
        *self
    }
}

impl Work for Vec<usize> {
    fn any(&self) -> bool {
        !self.is_empty()
    }
}

/// A validated single key, owned or borrowed.
pub(crate) fn single_key<K: InboxKey + ?Sized>(
    key: &K,
) -> Result<std::borrow::Cow<'_, str>, InboxError> {
    let key = key.inbox_key();
    validate_key(&key).map_err(InboxError::InvalidKey)?;
    Ok(key)
}
