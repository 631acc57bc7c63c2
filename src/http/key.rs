//! The `Idempotency-Key` header, read and checked.

use super::IDEMPOTENCY_KEY;
use http::HeaderMap;

/// The longest key accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// The `Idempotency-Key` of a request: 1 to 255 bytes of visible ASCII
/// (`!` to `~`). A structured-field string (`"..."`, as the IETF draft
/// writes it) is accepted and its quotes removed.
///
/// In an axum handler it is an extractor: a request without the header,
/// or with a key that is empty, too long, repeated or not visible ASCII,
/// is answered `400 Bad Request` with an `application/problem+json` body
/// before the handler runs. `Option<IdempotencyKey>` makes the header
/// optional (absent: `None`); a header that is present but invalid is
/// still a `400`.
///
/// ```
/// use diesel_inbox::http::{IdempotencyKey, InvalidIdempotencyKey};
///
/// assert_eq!(IdempotencyKey::parse("order-7")?.as_str(), "order-7");
/// assert_eq!(IdempotencyKey::parse("\"order-7\"")?.as_str(), "order-7");
/// assert_eq!(IdempotencyKey::parse(""), Err(InvalidIdempotencyKey::Empty));
/// assert!(IdempotencyKey::parse("two words").is_err());
/// # Ok::<(), InvalidIdempotencyKey>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a request's `Idempotency-Key` was refused (answered `400` with
/// `application/problem+json` by the axum extractor).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidIdempotencyKey {
    /// The request has no `Idempotency-Key` header.
    #[error("the request has no Idempotency-Key header; this endpoint requires one")]
    Missing,
    /// The header is there more than once.
    #[error("the Idempotency-Key header is given more than once")]
    Repeated,
    /// The key is empty.
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// The key is longer than [`MAX_IDEMPOTENCY_KEY_BYTES`].
    #[error("the Idempotency-Key is {0} bytes long; at most 255 are allowed")]
    TooLong(usize),
    /// The key has a byte outside visible ASCII (`!` to `~`): a space, a
    /// control character, a non-ASCII byte.
    #[error("the Idempotency-Key has a character outside visible ASCII at byte {0}")]
    NotVisibleAscii(usize),
}

impl IdempotencyKey {
    /// Checks a key as the header carries it.
    pub fn parse(value: &str) -> Result<Self, InvalidIdempotencyKey> {
        Self::from_bytes(value.as_bytes())
    }

    /// The key of a request's headers: `Ok(None)` without the header.
    ///
    /// ```
    /// use diesel_inbox::http::{IdempotencyKey, InvalidIdempotencyKey};
    /// use http::HeaderMap;
    ///
    /// let mut headers = HeaderMap::new();
    /// assert_eq!(IdempotencyKey::from_headers(&headers), Ok(None));
    /// headers.insert("idempotency-key", "k-1".parse().unwrap());
    /// assert_eq!(IdempotencyKey::from_headers(&headers)?.unwrap().as_str(), "k-1");
    /// headers.append("idempotency-key", "k-2".parse().unwrap());
    /// assert_eq!(IdempotencyKey::from_headers(&headers), Err(InvalidIdempotencyKey::Repeated));
    /// # Ok::<(), InvalidIdempotencyKey>(())
    /// ```
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, InvalidIdempotencyKey> {
        let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(InvalidIdempotencyKey::Repeated);
        }
        Self::from_bytes(value.as_bytes()).map(Some)
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, InvalidIdempotencyKey> {
        // A structured-field string: its quotes are not part of the key.
        let (bytes, offset) = match bytes {
            [b'"', inner @ .., b'"'] => (inner, 1),
            _ => (bytes, 0),
        };
        if bytes.is_empty() {
            return Err(InvalidIdempotencyKey::Empty);
        }
        if bytes.len() > MAX_IDEMPOTENCY_KEY_BYTES {
            return Err(InvalidIdempotencyKey::TooLong(bytes.len()));
        }
        if let Some(at) = bytes.iter().position(|b| !b.is_ascii_graphic()) {
            return Err(InvalidIdempotencyKey::NotVisibleAscii(at + offset));
        }
        let key = std::str::from_utf8(bytes).expect("visible ASCII is UTF-8");
        Ok(IdempotencyKey(key.to_owned()))
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for IdempotencyKey {
    type Err = InvalidIdempotencyKey;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Self::parse(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_visible_ascii_of_1_to_255_bytes() {
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::parse(&"k".repeat(256)),
            Err(InvalidIdempotencyKey::TooLong(256))
        );
        assert_eq!(
            IdempotencyKey::parse("\"\""),
            Err(InvalidIdempotencyKey::Empty)
        );
        assert_eq!(
            IdempotencyKey::parse("a\tb"),
            Err(InvalidIdempotencyKey::NotVisibleAscii(1))
        );
        assert_eq!(
            IdempotencyKey::parse("\"a b\""),
            Err(InvalidIdempotencyKey::NotVisibleAscii(2))
        );
        assert_eq!(
            IdempotencyKey::parse("clé"),
            Err(InvalidIdempotencyKey::NotVisibleAscii(2))
        );
    }
}
