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

impl<T> Codec<T> {
    /// A codec of the caller's own: how a value is stored and read back
    /// (the HTTP front door's stored responses).
    #[doc(hidden)]
    pub const fn new(
        encode: fn(&T) -> Result<Vec<u8>, String>,
        decode: fn(&[u8]) -> Result<T, String>,
    ) -> Self {
        Codec { encode, decode }
    }
}

impl<T> Clone for Codec<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Codec<T> {}

/// What a single-message call checks beyond its key, as the engine takes
/// it (the [`Inbox`](crate::Inbox) builder makes it).
#[derive(Debug, Clone, Default)]
#[doc(hidden)]
pub struct Options {
    fingerprint: Option<Result<Fingerprint, String>>,
    max_attempts: Option<u32>,
    wait: Option<std::time::Duration>,
}

impl Options {
    /// Nothing beyond the key.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A fingerprint that may have failed to compute: the call then fails
    /// with [`InboxError::FingerprintFailed`].
    pub(crate) fn fingerprint_or_error(mut self, fingerprint: Result<Fingerprint, String>) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Counts the body's failures per key, up to `max` (at least 1; 0 is
    /// refused when the call runs).
    pub(crate) fn max_attempts(mut self, max: u32) -> Self {
        self.max_attempts = Some(max);
        self
    }

    /// Bounds the claim's wait for an in-flight claim of the same key
    /// (`None`: the backend's own lock timeout).
    #[cfg_attr(not(feature = "async"), allow(dead_code))] // the async terminals set it
    pub(crate) fn wait(mut self, wait: Option<std::time::Duration>) -> Self {
        self.wait = wait;
        self
    }

    /// The claim of `key` for an outcome `O`, or the fingerprint's error.
    pub(crate) fn single_claim<'a, T, O: SingleOutcome<T>>(
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
            wait: self.wait,
        })
    }
}

/// What a single-message call returns, as the engine makes it:
/// [`Processed`], or [`Stored`] for a call that stores its body's value
/// (`store_result`). Not a stable API.
#[doc(hidden)]
pub trait SingleOutcome<T>: Sized + seal::Sealed {
    /// How the value is stored and read back (`None`: it is not).
    #[doc(hidden)]
    const CODEC: Option<Codec<T>>;
    /// What the caller gets for how the call ended.
    #[doc(hidden)]
    fn outcome(consumer: &str, key: &str, ended: Ended<T>) -> Result<Self, InboxError>;
}

mod seal {
    /// The seal of [`SingleOutcome`](super::SingleOutcome).
    pub trait Sealed {}
}

impl<T> seal::Sealed for Processed<T> {}

impl<T> SingleOutcome<T> for Processed<T> {
    const CODEC: Option<Codec<T>> = None;

    fn outcome(_: &str, _: &str, ended: Ended<T>) -> Result<Self, InboxError> {
        Ok(match ended {
            Ended::Applied(value) => Processed::Applied(value),
            Ended::Duplicate(_) => Processed::Duplicate,
        })
    }
}

impl<T> seal::Sealed for Stored<T> {}

impl<T: StoredResult> SingleOutcome<T> for Stored<T> {
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
pub(crate) fn encoder<T, O: SingleOutcome<T>>() -> Option<Encode<T>> {
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

/// How a counted failure of the body reads: its `Debug` form.
pub(crate) fn describe<E: std::fmt::Debug>(error: &E) -> String {
    format!("{error:?}")
}

/// How a panic of the body reads in the failure count.
pub fn describe_panic(payload: &(dyn std::any::Any + Send)) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string payload");
    format!("the body panicked: {message}")
}
