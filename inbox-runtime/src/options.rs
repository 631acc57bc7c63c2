//! What a call checks and stores beyond the key: the content's fingerprint
//! and the body's result. Shared by the sync and the async driver.

use crate::claim::One;
use crate::engine::{Encode, Ended};
use crate::error::InboxError;
use crate::fingerprint::Fingerprint;
use crate::processed::{Processed, Stored};

/// Serializes a body's value into the inbox row, and reads it back.
#[doc(hidden)]
pub struct Codec<T> {
    encode: Encode<T>,
    decode: fn(&[u8]) -> Result<T, String>,
}

impl<T> Clone for Codec<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Codec<T> {}

/// What a single-message call checks beyond its key: the options of
/// [`run_with`](crate::run_with) and `run_with_async`, which
/// `#[idempotent(fingerprint = "...")]` sets.
///
/// ```
/// use inbox_runtime::{Fingerprint, Options};
///
/// let options = Options::new().fingerprint(Fingerprint::of_bytes(b"payload"));
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default)]
pub struct Options {
    fingerprint: Option<Result<Fingerprint, String>>,
    max_attempts: Option<u32>,
}

impl Options {
    /// Nothing beyond the key: what [`run`](crate::run) does.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `fingerprint` with the inbox row; a redelivery of the same
    /// key whose fingerprint differs fails with
    /// [`InboxError::KeyReused`] without running the body.
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(Ok(fingerprint));
        self
    }

    /// A fingerprint that may have failed to compute (what the attribute
    /// passes): the call then fails with [`InboxError::FingerprintFailed`].
    #[doc(hidden)]
    pub fn fingerprint_or_error(mut self, fingerprint: Result<Fingerprint, String>) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Counts the body's failures (errors and panics) per key, each in a
    /// short transaction of its own after the rollback; once a key has
    /// failed `max` times, its deliveries fail with
    /// [`InboxError::AttemptsExhausted`] without running the body. A
    /// success deletes the count in its own transaction. `max` is at least
    /// 1 (0 is refused when the call runs).
    pub fn max_attempts(mut self, max: u32) -> Self {
        self.max_attempts = Some(max);
        self
    }

    /// The claim of `key` for an outcome `O`, or the fingerprint's error.
    pub(crate) fn one<'a, T, O: Outcome<T>>(
        &self,
        consumer: &'a str,
        key: &'a str,
    ) -> Result<One<'a>, InboxError> {
        let fingerprint = match &self.fingerprint {
            None => None,
            Some(Ok(fingerprint)) => Some(*fingerprint),
            Some(Err(reason)) => {
                return Err(InboxError::FingerprintFailed {
                    consumer: consumer.into(),
                    key: key.into(),
                    reason: reason.as_str().into(),
                })
            }
        };
        if self.max_attempts == Some(0) {
            return Err(InboxError::InvalidArgument(
                "max_attempts must be at least 1",
            ));
        }
        Ok(One {
            consumer,
            key,
            fingerprint,
            stored_result: O::CODEC.is_some(),
            max_attempts: self.max_attempts,
        })
    }
}

/// What a single-message call returns: [`Processed`], or [`Stored`] for a
/// call that stores its body's value (`store_result`). The return type
/// decides whether the value is stored.
pub trait Outcome<T>: Sized + crate::backend::Sealed {
    /// How the value is stored and read back (`None`: it is not).
    #[doc(hidden)]
    const CODEC: Option<Codec<T>>;
    /// What the caller gets for how the call ended.
    #[doc(hidden)]
    fn outcome(consumer: &str, key: &str, ended: Ended<T>) -> Result<Self, InboxError>;
}

impl<T> crate::backend::Sealed for Processed<T> {}

impl<T> Outcome<T> for Processed<T> {
    const CODEC: Option<Codec<T>> = None;

    fn outcome(_: &str, _: &str, ended: Ended<T>) -> Result<Self, InboxError> {
        Ok(match ended {
            Ended::Applied(value) => Processed::Applied(value),
            Ended::Duplicate(_) => Processed::Duplicate,
        })
    }
}

impl<T> crate::backend::Sealed for Stored<T> {}

impl<T: StoredResult> Outcome<T> for Stored<T> {
    const CODEC: Option<Codec<T>> = Some(T::CODEC);

    fn outcome(consumer: &str, key: &str, ended: Ended<T>) -> Result<Self, InboxError> {
        match ended {
            Ended::Applied(value) => Ok(Stored::Applied(value)),
            Ended::Duplicate(None) => Ok(Stored::Duplicate(None)),
            Ended::Duplicate(Some(bytes)) => (T::CODEC.decode)(&bytes)
                .map(|value| Stored::Duplicate(Some(value)))
                .map_err(|reason| InboxError::StoredResultUnreadable {
                    consumer: consumer.into(),
                    key: key.into(),
                    reason: reason.into(),
                }),
        }
    }
}

/// How the engine stores an outcome's value, if it does.
pub(crate) fn encoder<T, O: Outcome<T>>() -> Option<Encode<T>> {
    O::CODEC.map(|codec| codec.encode)
}

/// A success type `store_result` can store: `Serialize + DeserializeOwned`,
/// with the `serde` feature.
#[cfg_attr(
    feature = "serde",
    diagnostic::on_unimplemented(
        message = "`store_result` stores the handler's success type as JSON: `{Self}` must implement `serde::Serialize` and `serde::de::DeserializeOwned`",
        label = "`{Self}` cannot be stored",
        note = "derive them: #[derive(serde::Serialize, serde::Deserialize)]; or drop `store_result`"
    )
)]
#[cfg_attr(
    not(feature = "serde"),
    diagnostic::on_unimplemented(
        message = "`store_result` needs the `serde` feature of diesel-inbox",
        label = "stored as JSON through serde",
        note = "enable it: diesel-inbox = {{ version = \"0.1\", features = [\"serde\"] }} (with your backend), and make the success type `Serialize + Deserialize`"
    )
)]
pub trait StoredResult: Sized {
    /// JSON through `serde_json`.
    #[doc(hidden)]
    const CODEC: Codec<Self>;
}

#[cfg(feature = "serde")]
impl<T: serde::Serialize + serde::de::DeserializeOwned> StoredResult for T {
    const CODEC: Codec<Self> = Codec {
        encode: |value| serde_json::to_vec(value).map_err(|e| e.to_string()),
        decode: |bytes| serde_json::from_slice(bytes).map_err(|e| e.to_string()),
    };
}

/// The fingerprint of a batch's message, or why it has none.
pub(crate) type FingerprintOf<'f, M> = dyn Fn(&M) -> Result<Fingerprint, String> + 'f;
/// [`FingerprintOf`], stored in the options.
type BatchFingerprint<'f, M> = Box<dyn Fn(&M) -> Result<Fingerprint, String> + Send + Sync + 'f>;

/// What a batch call checks beyond its keys: the options of
/// [`run_batch_with`](crate::run_batch_with) and `run_batch_with_async`.
///
/// A batch has no `store_result`: its body returns one value for all its
/// messages, which belongs to none of their rows.
///
/// ```
/// use inbox_runtime::{BatchOptions, Fingerprint};
///
/// struct Order { id: u64, body: Vec<u8> }
/// let options = BatchOptions::new().fingerprint(|o: &Order| Fingerprint::of_bytes(&o.body));
/// # let _ = options;
/// ```
pub struct BatchOptions<'f, M> {
    fingerprint: Option<BatchFingerprint<'f, M>>,
}

impl<M> Default for BatchOptions<'_, M> {
    fn default() -> Self {
        BatchOptions { fingerprint: None }
    }
}

impl<'f, M> BatchOptions<'f, M> {
    /// Nothing beyond the keys: what [`run_batch`](crate::run_batch) does.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores each message's fingerprint with its row; a message whose key
    /// was applied before with another fingerprint, or that repeats an
    /// earlier key of the batch with another fingerprint, fails the whole
    /// batch with [`InboxError::KeyReused`] (nothing is written).
    pub fn fingerprint(
        mut self,
        fingerprint: impl Fn(&M) -> Fingerprint + Send + Sync + 'f,
    ) -> Self {
        self.fingerprint = Some(Box::new(move |m| Ok(fingerprint(m))));
        self
    }

    /// A fingerprint that may fail to compute (what the attribute passes).
    #[doc(hidden)]
    pub fn fingerprint_or_error(
        mut self,
        fingerprint: impl Fn(&M) -> Result<Fingerprint, String> + Send + Sync + 'f,
    ) -> Self {
        self.fingerprint = Some(Box::new(fingerprint));
        self
    }

    pub(crate) fn fingerprints(&self) -> Option<&FingerprintOf<'f, M>> {
        self.fingerprint
            .as_deref()
            .map(|f| f as &FingerprintOf<'f, M>)
    }
}

/// The options of a batch of `messages` (what a batch handler with a
/// `fingerprint` expands to: the messages fix `M` for its closure).
#[doc(hidden)]
pub fn batch_options<'f, M>(messages: &[M]) -> BatchOptions<'f, M> {
    let _ = messages;
    BatchOptions::new()
}

/// How a counted failure of the body reads: its `Debug` form.
pub(crate) fn describe<E: std::fmt::Debug>(error: &E) -> String {
    format!("{error:?}")
}

/// How a panic of the body reads in the failure count.
pub(crate) fn describe_panic(payload: &(dyn std::any::Any + Send)) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string payload");
    format!("the body panicked: {message}")
}
