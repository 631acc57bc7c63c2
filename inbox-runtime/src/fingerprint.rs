//! Payload fingerprints: what a handler's `fingerprint = "..."` stores with
//! the inbox row, so that a key reused for different content is refused.

use sha2::{Digest, Sha256};
use std::fmt;

/// The fingerprint format this release writes: `FORMAT` then the SHA-256
/// digest.
const FORMAT: u8 = 1;
/// Bytes of a stored fingerprint: the format byte and the digest.
pub(crate) const LEN: usize = 33;

/// A stable, versioned hash of a message's content, stored with its inbox
/// row by `#[idempotent(key = "...", fingerprint = "...")]`.
///
/// The format is part of the inbox schema and never changes for a given
/// version byte:
///
/// - byte 0 is the format version, `1`;
/// - bytes 1..33 are the SHA-256 digest of the content's bytes:
///   - a value that is `AsRef<[u8]>` (`Vec<u8>`, `&[u8]`, `String`, `&str`,
///     `bytes::Bytes`, ...): its bytes as they are;
///   - any `serde::Serialize` value (feature `serde`): its canonical JSON,
///     `serde_json`'s compact form with every object's keys sorted, so a
///     `HashMap` has one fingerprint whatever its iteration order.
///
/// Fingerprints of different formats never compare equal, so a future
/// format cannot be mistaken for this one; a row stored without a
/// fingerprint (by a handler without one, or before the schema upgrade)
/// accepts any content.
///
/// ```
/// use diesel_inbox::Fingerprint;
///
/// let a = Fingerprint::of_bytes(b"{\"amount\":10}");
/// assert_eq!(a, Fingerprint::of_bytes(b"{\"amount\":10}"));
/// assert_ne!(a, Fingerprint::of_bytes(b"{\"amount\":11}"));
/// assert_eq!(a.as_bytes().len(), 33);
/// assert_eq!(a.as_bytes()[0], 1); // the format
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; LEN]);

impl Fingerprint {
    /// The fingerprint of raw bytes.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        let mut out = [0u8; LEN];
        out[0] = FORMAT;
        out[1..].copy_from_slice(&Sha256::digest(bytes));
        Fingerprint(out)
    }

    /// The fingerprint of a `Serialize` value: of its canonical JSON (keys
    /// of every object sorted). Fails like `serde_json::to_value` does (a
    /// map whose keys are not strings or numbers, a failing `Serialize`
    /// implementation).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use diesel_inbox::Fingerprint;
    ///
    /// let one: HashMap<&str, i32> = [("a", 1), ("b", 2)].into();
    /// let other: HashMap<&str, i32> = [("b", 2), ("a", 1)].into();
    /// assert_eq!(Fingerprint::of_serialize(&one)?, Fingerprint::of_serialize(&other)?);
    /// assert_eq!(Fingerprint::of_serialize(&one)?, Fingerprint::of_bytes(br#"{"a":1,"b":2}"#));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    #[cfg(feature = "serde")]
    #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
    pub fn of_serialize<T: serde::Serialize + ?Sized>(
        value: &T,
    ) -> Result<Self, serde_json::Error> {
        let value = serde_json::to_value(value)?;
        let mut json = Vec::new();
        canonical(&value, &mut json);
        Ok(Self::of_bytes(&json))
    }

    /// The stored form: the format byte, then the digest.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether `stored` (a row's fingerprint column) is this fingerprint.
    pub(crate) fn matches(&self, stored: &[u8]) -> bool {
        self.0[..] == *stored
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint(v{}:", self.0[0])?;
        for byte in &self.0[1..9] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "…)")
    }
}

/// Compact JSON with every object's keys in byte order, whatever order the
/// map holds them in (serde_json keeps insertion order when some crate in
/// the build enables its `preserve_order` feature).
#[cfg(feature = "serde")]
fn canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // A string's JSON is fixed by serde_json's escaping rules.
                out.extend(serde_json::to_vec(key).expect("a string serializes"));
                out.push(b':');
                canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend(serde_json::to_vec(scalar).expect("a scalar serializes")),
    }
}

/// What `fingerprint = "expr"` expands to: the fingerprint of `expr`'s
/// value, bytes first, else `Serialize` (autoref specialization; see
/// `__private`). Not a stable API.
#[doc(hidden)]
pub mod dispatch {
    use super::Fingerprint;

    /// Wraps the expression's value for method resolution.
    pub struct FingerprintProbe<'a, T: ?Sized>(pub &'a T);

    /// A value that is bytes: hashed as they are.
    pub trait ViaBytes {
        fn __diesel_inbox_fingerprint(&self) -> Fingerprinted;
    }

    impl<T: AsRef<[u8]> + ?Sized> ViaBytes for &FingerprintProbe<'_, T> {
        fn __diesel_inbox_fingerprint(&self) -> Fingerprinted {
            Fingerprinted::Ready(Fingerprint::of_bytes(self.0.as_ref()))
        }
    }

    /// Anything else: its canonical JSON, if it is `Serialize` (checked by
    /// [`fingerprint`]'s bound, so the error names the expression).
    pub trait ViaSerialize<'a, T: ?Sized> {
        fn __diesel_inbox_fingerprint(&self) -> NeedsSerialize<'a, T>;
    }

    impl<'a, T: ?Sized> ViaSerialize<'a, T> for FingerprintProbe<'a, T> {
        fn __diesel_inbox_fingerprint(&self) -> NeedsSerialize<'a, T> {
            NeedsSerialize(self.0)
        }
    }

    /// A value whose fingerprint is taken from its bytes.
    pub enum Fingerprinted {
        #[doc(hidden)]
        Ready(Fingerprint),
    }

    /// A value that is not bytes: it must be `Serialize`.
    pub struct NeedsSerialize<'a, T: ?Sized>(&'a T);

    /// What [`fingerprint`] accepts.
    #[diagnostic::on_unimplemented(
        message = "the `fingerprint` expression's value cannot be fingerprinted",
        label = "neither bytes (`AsRef<[u8]>`) nor `serde::Serialize`",
        note = "fingerprint = \"...\" takes bytes (`Vec<u8>`, `&[u8]`, `String`, `&str`, ...) or, with the `serde` feature of diesel-inbox, any `serde::Serialize` value; fingerprint a field that is, e.g. `fingerprint = \"msg.body\"`"
    )]
    pub trait IntoFingerprint {
        /// The fingerprint, or why the value has none.
        fn into_fingerprint(self) -> Result<Fingerprint, String>;
    }

    impl IntoFingerprint for Fingerprinted {
        fn into_fingerprint(self) -> Result<Fingerprint, String> {
            match self {
                Fingerprinted::Ready(fingerprint) => Ok(fingerprint),
            }
        }
    }

    #[cfg(feature = "serde")]
    impl<T: serde::Serialize + ?Sized> IntoFingerprint for NeedsSerialize<'_, T> {
        fn into_fingerprint(self) -> Result<Fingerprint, String> {
            Fingerprint::of_serialize(self.0).map_err(|e| e.to_string())
        }
    }

    /// The fingerprint of a probed value.
    pub fn fingerprint(value: impl IntoFingerprint) -> Result<Fingerprint, String> {
        value.into_fingerprint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_is_stable() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1: the stored form must not change.
        let f = Fingerprint::of_bytes(b"abc");
        let hex: String = f.as_bytes()[1..]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(f.as_bytes()[0], 1);
    }

    #[test]
    #[allow(clippy::needless_borrow)] // the expansion's autoref, as it is generated
    fn dispatch_prefers_bytes() {
        #[allow(unused_imports)]
        use dispatch::{FingerprintProbe, ViaBytes as _, ViaSerialize as _};
        let body = String::from("abc");
        let f = dispatch::fingerprint((&&FingerprintProbe(&body)).__diesel_inbox_fingerprint());
        assert_eq!(f, Ok(Fingerprint::of_bytes(b"abc")));
    }

    #[cfg(feature = "serde")]
    #[test]
    #[allow(clippy::needless_borrow)] // the expansion's autoref, as it is generated
    fn serialize_values_are_canonical_json() {
        #[allow(unused_imports)]
        use dispatch::{FingerprintProbe, ViaBytes as _, ViaSerialize as _};
        let value = serde_json::json!({"b": [1, {"d": 1, "c": "x"}], "a": null});
        let f = dispatch::fingerprint((&&FingerprintProbe(&value)).__diesel_inbox_fingerprint());
        assert_eq!(
            f,
            Ok(Fingerprint::of_bytes(
                br#"{"a":null,"b":[1,{"c":"x","d":1}]}"#
            ))
        );
    }
}
