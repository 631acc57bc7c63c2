//! Message keys: what identifies a delivery, and what makes a key valid.

use std::borrow::Cow;
use std::fmt;

/// The longest key (and consumer name) the inbox stores, in bytes.
///
/// Longer values are refused rather than truncated: MySQL's `INSERT IGNORE`
/// would silently cut them, and two long keys could then collide.
pub const MAX_KEY_BYTES: usize = 255;

/// A value that identifies a message for deduplication.
///
/// The key is stored as text and compared byte for byte: `"Key"`, `"key"` and
/// `"key "` are three different keys. Integers are stored in decimal, UUIDs
/// (feature `uuid`) in lowercase hyphenated form.
///
/// Implement it for your own id types:
///
/// ```
/// use std::borrow::Cow;
/// use diesel_inbox::InboxKey;
///
/// struct OrderId(u64);
///
/// impl InboxKey for OrderId {
///     fn inbox_key(&self) -> Cow<'_, str> {
///         Cow::Owned(format!("order-{}", self.0))
///     }
/// }
///
/// assert_eq!(OrderId(7).inbox_key(), "order-7");
/// assert_eq!("m-1".inbox_key(), "m-1");
/// assert_eq!(42_i64.inbox_key(), "42");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an inbox key",
    label = "the key's type must implement `InboxKey`",
    note = "`InboxKey` is implemented for `str`, `String`, integers, `uuid::Uuid` (feature `uuid`) and references to them; implement it for your own id types"
)]
pub trait InboxKey {
    /// The key as it is stored in `inbox_messages.message_id`.
    fn inbox_key(&self) -> Cow<'_, str>;
}

impl InboxKey for str {
    fn inbox_key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl InboxKey for String {
    fn inbox_key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl InboxKey for Box<str> {
    fn inbox_key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl InboxKey for Cow<'_, str> {
    fn inbox_key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl InboxKey for std::sync::Arc<str> {
    fn inbox_key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl InboxKey for std::rc::Rc<str> {
    fn inbox_key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl<T: InboxKey + ?Sized> InboxKey for &T {
    fn inbox_key(&self) -> Cow<'_, str> {
        (**self).inbox_key()
    }
}

impl<T: InboxKey + ?Sized> InboxKey for &mut T {
    fn inbox_key(&self) -> Cow<'_, str> {
        (**self).inbox_key()
    }
}

macro_rules! integer_keys {
    ($($int:ty),*) => {$(
        impl InboxKey for $int {
            fn inbox_key(&self) -> Cow<'_, str> {
                Cow::Owned(self.to_string())
            }
        }
    )*};
}
integer_keys!(i8, i16, i32, i64, i128, u8, u16, u32, u64, u128, isize, usize);
integer_keys!(
    std::num::NonZeroI8,
    std::num::NonZeroI16,
    std::num::NonZeroI32,
    std::num::NonZeroI64,
    std::num::NonZeroI128,
    std::num::NonZeroIsize,
    std::num::NonZeroU8,
    std::num::NonZeroU16,
    std::num::NonZeroU32,
    std::num::NonZeroU64,
    std::num::NonZeroU128,
    std::num::NonZeroUsize
);

#[cfg(feature = "uuid")]
impl InboxKey for uuid::Uuid {
    fn inbox_key(&self) -> Cow<'_, str> {
        Cow::Owned(self.hyphenated().to_string())
    }
}

/// Why a key or consumer name was refused.
///
/// ```
/// use diesel_inbox::{validate_key, InvalidKey};
///
/// assert_eq!(validate_key(""), Err(InvalidKey::Empty));
/// assert_eq!(validate_key("a\0b"), Err(InvalidKey::ContainsNul));
/// assert_eq!(validate_key(&"x".repeat(256)), Err(InvalidKey::TooLong { len: 256 }));
/// assert_eq!(validate_key("order-1"), Ok(()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidKey {
    /// The key is the empty string.
    Empty,
    /// The key is longer than [`MAX_KEY_BYTES`] bytes (UTF-8).
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The key contains a NUL byte, which PostgreSQL cannot store in text.
    ContainsNul,
}

impl fmt::Display for InvalidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidKey::Empty => f.write_str("it is empty"),
            InvalidKey::TooLong { len } => {
                write!(
                    f,
                    "it is {len} bytes long; at most {MAX_KEY_BYTES} bytes are allowed"
                )
            }
            InvalidKey::ContainsNul => f.write_str("it contains a NUL byte"),
        }
    }
}

impl std::error::Error for InvalidKey {}

/// Checks that a key (or consumer name) can be stored without loss:
/// not empty, at most [`MAX_KEY_BYTES`] bytes, no NUL byte.
///
/// The handler runtime calls this before touching the database.
///
/// ```
/// assert!(diesel_inbox::validate_key("évènement-1").is_ok());
/// assert!(diesel_inbox::validate_key("").is_err());
/// ```
pub fn validate_key(key: &str) -> Result<(), InvalidKey> {
    if key.is_empty() {
        Err(InvalidKey::Empty)
    } else if key.len() > MAX_KEY_BYTES {
        Err(InvalidKey::TooLong { len: key.len() })
    } else if key.as_bytes().contains(&0) {
        Err(InvalidKey::ContainsNul)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multibyte_key_crossing_the_limit_is_too_long() {
        // 127 two-byte characters = 254 bytes; one more crosses 255.
        let fits = "é".repeat(127);
        assert_eq!(validate_key(&fits), Ok(()));
        let over = "é".repeat(128);
        assert_eq!(validate_key(&over), Err(InvalidKey::TooLong { len: 256 }));
    }

    #[test]
    fn integer_keys_are_decimal() {
        assert_eq!((-5_i32).inbox_key(), "-5");
        assert_eq!(200_u8.inbox_key(), "200");
        assert_eq!((-128_i8).inbox_key(), "-128");
        assert_eq!(u64::MAX.inbox_key(), "18446744073709551615");
    }
}
