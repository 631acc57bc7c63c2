//! Every `#[idempotent]` handler of the program, registered before `main`,
//! so that two handlers cannot share a consumer scope by accident.
//!
//! The default consumer name is the function's name: it survives moving the
//! function to another module (a name that changed with the module path
//! would make every redelivery that arrives after such a deploy apply
//! again). Two handlers with the same name in different modules or trait
//! impls would then share a scope silently; the registry makes that an
//! error instead ([`InboxError::ConsumerConflict`]), checked once per
//! handler before its first claim.

use crate::error::InboxError;
use crate::handler::{consumers, RegisteredHandler};

impl RegisteredHandler {
    /// The consumer name, or [`InboxError::ConsumerConflict`] when another
    /// handler uses it too and not every one of them says `shared`.
    pub(crate) fn checked_consumer(&'static self) -> Result<&'static str, InboxError> {
        let conflict = self.conflict.get_or_init(|| {
            let same: Vec<&'static RegisteredHandler> = consumers()
                .into_iter()
                .filter(|other| other.consumer == self.consumer)
                .collect();
            let accidental = same.len() > 1 && !same.iter().all(|h| h.shared);
            accidental.then_some(same)
        });
        match conflict {
            None => Ok(self.consumer),
            Some(handlers) => Err(InboxError::ConsumerConflict {
                consumer: self.consumer.to_string(),
                handlers: handlers.clone(),
            }),
        }
    }
}

/// Where a claim's consumer name comes from: a plain name given to
/// [`Inbox::consumer`](crate::Inbox::consumer) (`&str`, `String`), or a registered
/// `#[idempotent]` handler (checked against the others first). A plain name
/// is not registered: code that calls `Inbox` directly owns its names.
///
/// ```
/// use diesel_inbox::{ConsumerName, InboxError};
///
/// assert_eq!("billing".consumer_name().unwrap(), "billing");
/// assert!(matches!("".consumer_name(), Err(InboxError::InvalidConsumer(_))));
/// ```
pub trait ConsumerName: seal::Sealed {
    /// The validated name.
    #[doc(hidden)]
    fn consumer_name(&self) -> Result<&str, InboxError>;
}

mod seal {
    /// The seal of [`ConsumerName`](super::ConsumerName).
    pub trait Sealed {}
}

impl seal::Sealed for str {}
impl seal::Sealed for String {}
impl seal::Sealed for &'static RegisteredHandler {}

impl ConsumerName for str {
    fn consumer_name(&self) -> Result<&str, InboxError> {
        crate::key::validate_key(self).map_err(InboxError::InvalidConsumer)?;
        Ok(self)
    }
}

impl ConsumerName for String {
    fn consumer_name(&self) -> Result<&str, InboxError> {
        self.as_str().consumer_name()
    }
}

impl ConsumerName for &'static RegisteredHandler {
    fn consumer_name(&self) -> Result<&str, InboxError> {
        // The attribute validated the name at compile time.
        self.checked_consumer()
    }
}
