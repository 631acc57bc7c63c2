//! What a call claims, and what the claim's result means: one key, or the
//! distinct keys of a batch. Shared by the sync and the async driver.

use crate::engine::{Claimed, Ended};
use crate::error::InboxError;
use crate::fingerprint::Fingerprint;
use crate::key::{validate_key, InboxKey};
use crate::processed::Batch;
use crate::rows::{AttemptsRow, StoredRow};
use std::collections::{HashMap, HashSet};

/// The fingerprint of a batch's message, or why it has none.
pub(crate) type FingerprintOf<'f, M> = dyn Fn(&M) -> Result<Fingerprint, String> + 'f;

/// What a single claim reads next, if anything.
pub(crate) enum Read {
    /// Nothing: the verdict is known.
    Done(Claimed),
    /// The duplicate's row ([`One::duplicate`]).
    Stored,
    /// The new claim's failure count ([`One::attempted`]).
    Attempts,
}

/// Whether a stored fingerprint refuses this delivery: only when both exist
/// and differ (a row written without one accepts any content).
fn reused(expected: Option<&Fingerprint>, stored: Option<&[u8]>) -> bool {
    matches!((expected, stored), (Some(expected), Some(stored)) if !expected.matches(stored))
}

/// What a single call claims: its key, the content's fingerprint, and
/// whether it wants the stored result of a duplicate.
pub(crate) struct One<'a> {
    pub(crate) consumer: &'a str,
    pub(crate) key: &'a str,
    pub(crate) fingerprint: Option<Fingerprint>,
    pub(crate) stored_result: bool,
    /// `max_attempts`: the failures after which the body no longer runs.
    pub(crate) max_attempts: Option<u32>,
    /// The bound on waiting for an in-flight claim of the same key.
    #[cfg_attr(not(feature = "async"), allow(dead_code))] // read by the async driver
    pub(crate) wait: Option<std::time::Duration>,
}

impl One<'_> {
    /// The fingerprint as the claim inserts it.
    pub(crate) fn fingerprint(&self) -> Option<&[u8]> {
        self.fingerprint.as_ref().map(Fingerprint::as_bytes)
    }

    /// Whether a duplicate's row must be read (its fingerprint checked, its
    /// result returned). Never skipped for a duplicate when asked for: a
    /// duplicate is exactly when a reused key shows.
    pub(crate) fn reads_duplicates(&self) -> bool {
        self.fingerprint.is_some() || self.stored_result
    }

    /// What to read after a claim that `inserted` its row (or not): a
    /// duplicate's row when it is checked, a new claim's failure count with
    /// `max_attempts`, else nothing.
    pub(crate) fn next_read(&self, inserted: bool) -> Read {
        match (inserted, self.max_attempts, self.reads_duplicates()) {
            (true, Some(_), _) => Read::Attempts,
            (true, None, _) => Read::Done(Claimed::New),
            (false, _, true) => Read::Stored,
            (false, _, false) => Read::Done(Claimed::Duplicate(None)),
        }
    }

    /// The verdict on a new claim whose failure count is `row`, and whether
    /// to delete that count in the claim's transaction (a success then
    /// clears it; a failure rolls the delete back and counts one more).
    pub(crate) fn attempted(&self, row: Option<AttemptsRow>) -> (Claimed, bool) {
        let Some((failures, last_error, _)) = row else {
            return (Claimed::New, false);
        };
        let failures = u32::try_from(failures).unwrap_or(0);
        match self.max_attempts {
            Some(max) if failures >= max => (
                Claimed::GaveUp {
                    failures,
                    last_error,
                },
                false,
            ),
            _ => (Claimed::New, true),
        }
    }

    /// Whether the call reads its key's stored result before its
    /// transaction: when it wants one.
    pub(crate) fn looks_up(&self) -> bool {
        self.stored_result
    }

    /// The verdict of the replay's read, which found `row` (a committed
    /// row with a stored result) or nothing: a replay, a reused key, or
    /// `None`, the claim's path.
    pub(crate) fn looked_up(&self, row: Option<StoredRow>) -> Option<Claimed> {
        let row = row?;
        row.2.as_ref()?;
        Some(self.duplicate(vec![row]))
    }

    /// The verdict on a duplicate whose row read as `rows` (none: the row
    /// was purged or forgotten since the claim saw it, so there is nothing
    /// to compare).
    pub(crate) fn duplicate(&self, rows: Vec<StoredRow>) -> Claimed {
        let Some((_, fingerprint, result)) = rows.into_iter().next() else {
            return Claimed::Duplicate(None);
        };
        if reused(self.fingerprint.as_ref(), fingerprint.as_deref()) {
            return Claimed::Reused(self.key.to_owned());
        }
        Claimed::Duplicate(result.filter(|_| self.stored_result))
    }
}

/// The keys of a batch: validated, the first message of each distinct key,
/// and the distinct keys in one lock order.
pub(crate) struct BatchPlan {
    keys: Vec<String>,
    /// The fingerprint of each message, when the handler has them.
    fingerprints: Option<Vec<Fingerprint>>,
    /// Input positions of the first message of each distinct key.
    firsts: Vec<usize>,
    /// Positions (into `keys`) of the distinct keys, sorted by key: every
    /// batch claims in this one order, so overlapping batches wait for each
    /// other rather than deadlock.
    sorted: Vec<usize>,
}

impl BatchPlan {
    /// Refuses the whole batch if one key is invalid, if a fingerprint
    /// cannot be computed, or if two messages of the batch share a key but
    /// not their content.
    pub(crate) fn new<M>(
        consumer: &str,
        messages: &[M],
        key: impl Fn(&M) -> String,
        fingerprint: Option<&FingerprintOf<'_, M>>,
    ) -> Result<Self, InboxError> {
        let keys: Vec<String> = messages.iter().map(key).collect();
        for key in &keys {
            validate_key(key).map_err(InboxError::InvalidKey)?;
        }
        let fingerprints = match fingerprint {
            None => None,
            Some(fingerprint) => Some(
                messages
                    .iter()
                    .zip(&keys)
                    .map(|(message, key)| {
                        fingerprint(message).map_err(|reason| InboxError::FingerprintFailed {
                            consumer: consumer.into(),
                            key: key.as_str().into(),
                            reason: reason.into(),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let mut seen = HashMap::with_capacity(keys.len());
        let mut firsts = Vec::with_capacity(keys.len());
        for i in 0..keys.len() {
            match seen.entry(keys[i].as_str()) {
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(i);
                    firsts.push(i);
                }
                // A repeat within the batch is a duplicate of its first
                // message, checked like one.
                std::collections::hash_map::Entry::Occupied(first) => {
                    if let Some(fingerprints) = &fingerprints {
                        if fingerprints[i] != fingerprints[*first.get()] {
                            return Err(InboxError::KeyReused {
                                consumer: consumer.to_owned(),
                                key: keys[i].clone(),
                            });
                        }
                    }
                }
            }
        }
        let mut sorted = firsts.clone();
        sorted.sort_unstable_by(|&a, &b| keys[a].cmp(&keys[b]));
        Ok(BatchPlan {
            keys,
            fingerprints,
            firsts,
            sorted,
        })
    }

    /// The distinct keys, in claim order.
    pub(crate) fn distinct(&self) -> Vec<&str> {
        self.sorted.iter().map(|&i| self.keys[i].as_str()).collect()
    }

    /// The fingerprints of the distinct keys, in claim order.
    pub(crate) fn distinct_fingerprints(&self) -> Option<Vec<&[u8]>> {
        let fingerprints = self.fingerprints.as_ref()?;
        Some(
            self.sorted
                .iter()
                .map(|&i| fingerprints[i].as_bytes())
                .collect(),
        )
    }

    /// The keys to read after a claim that inserted `claimed`: the
    /// duplicates, when the batch has fingerprints to check (none
    /// otherwise: a plain batch's duplicates cost nothing more).
    pub(crate) fn to_check(&self, claimed: &[String]) -> Vec<&str> {
        if self.fingerprints.is_none() || claimed.len() == self.sorted.len() {
            return Vec::new();
        }
        let claimed: HashSet<&str> = claimed.iter().map(String::as_str).collect();
        self.distinct()
            .into_iter()
            .filter(|key| !claimed.contains(key))
            .collect()
    }

    /// The verdict on a claim whose first deliveries are at `applied`,
    /// given the rows read for [`to_check`](Self::to_check)'s keys.
    pub(crate) fn verdict(&self, applied: &[usize], rows: &[StoredRow]) -> Claimed {
        if let Some(fingerprints) = &self.fingerprints {
            let first: HashMap<&str, usize> = self
                .firsts
                .iter()
                .map(|&i| (self.keys[i].as_str(), i))
                .collect();
            for (key, stored, _) in rows {
                let expected = first.get(key.as_str()).map(|&i| &fingerprints[i]);
                if reused(expected, stored.as_deref()) {
                    return Claimed::Reused(key.clone());
                }
            }
        }
        if applied.is_empty() {
            Claimed::Duplicate(None)
        } else {
            Claimed::New
        }
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

    /// The outcome of a batch that ended as `ended` for the messages
    /// `claimed` for the first time (a duplicate applied none of them).
    pub(crate) fn outcome<T>(&self, ended: Ended<T>, claimed: Vec<usize>) -> Batch<T> {
        let (value, applied) = match ended {
            Ended::Applied(value) => (Some(value), claimed),
            // Nothing committed: every message was a duplicate, or the
            // stream position's fence refused the batch after its claim
            // (rolled back).
            Ended::Duplicate(_) => (None, Vec::new()),
        };
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

/// A validated single key, owned or borrowed.
pub(crate) fn single_key<K: InboxKey + ?Sized>(
    key: &K,
) -> Result<std::borrow::Cow<'_, str>, InboxError> {
    let key = key.inbox_key();
    validate_key(&key).map_err(InboxError::InvalidKey)?;
    Ok(key)
}
