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
use std::sync::OnceLock;

/// One `#[idempotent]` handler, as the attribute registered it: its
/// consumer name and where it is defined. Listed by [`consumers`].
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::idempotent;
///
/// #[idempotent(key = "id")]
/// fn on_refund(conn: &mut SqliteConnection, id: i64) -> QueryResult<()> {
///     Ok(())
/// }
///
/// let handler = diesel_inbox::consumers()
///     .into_iter()
///     .find(|h| h.consumer() == "on_refund")
///     .expect("registered before main");
/// assert!(handler.function().ends_with("::on_refund"));
/// assert!(handler.file().ends_with(".rs"));
/// assert!(!handler.is_shared());
/// ```
pub struct RegisteredHandler {
    consumer: &'static str,
    function: &'static str,
    file: &'static str,
    line: u32,
    shared: bool,
    /// The verdict of the conflict check, computed on first use.
    conflict: OnceLock<Option<Vec<&'static RegisteredHandler>>>,
}

impl RegisteredHandler {
    #[doc(hidden)]
    pub const fn new(
        consumer: &'static str,
        function: &'static str,
        file: &'static str,
        line: u32,
        shared: bool,
    ) -> Self {
        RegisteredHandler {
            consumer,
            function,
            file,
            line,
            shared,
            conflict: OnceLock::new(),
        }
    }

    /// The consumer name: the scope of deduplication.
    pub fn consumer(&self) -> &'static str {
        self.consumer
    }

    /// The function's path: `module::path::name` (for methods, the module
    /// of the `impl` block and the method's name).
    pub fn function(&self) -> &'static str {
        self.function
    }

    /// The source file of the function.
    pub fn file(&self) -> &'static str {
        self.file
    }

    /// The line of the `#[idempotent]` attribute.
    pub fn line(&self) -> u32 {
        self.line
    }

    /// Whether the handler declared `shared`: it deduplicates together with
    /// the other handlers of the same consumer.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

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

impl std::fmt::Debug for RegisteredHandler {
    // Not the cached verdict: it refers back to this handler.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredHandler")
            .field("consumer", &self.consumer)
            .field("function", &self.function)
            .field("file", &self.file)
            .field("line", &self.line)
            .field("shared", &self.shared)
            .finish()
    }
}

#[doc(hidden)]
pub struct Registration(pub &'static RegisteredHandler);

inventory::collect!(Registration);

/// Every `#[idempotent]` handler linked into this program, sorted by
/// consumer name, then file and line.
///
/// Two handlers share a consumer name only when each declares `shared`;
/// otherwise their first call fails with [`InboxError::ConsumerConflict`],
/// naming both. Use this list at start-up to log what the process consumes,
/// or in a test to pin the consumer names (a rename changes the scope, and
/// redeliveries after the deploy would apply again).
///
/// ```
/// mod billing {
///     use diesel::prelude::*;
///     use diesel_inbox::idempotent;
///
///     #[idempotent(key = "id", consumer = "billing.invoice-paid")]
///     pub fn handle(conn: &mut SqliteConnection, id: i64) -> QueryResult<()> { Ok(()) }
/// }
///
/// let names: Vec<&str> = diesel_inbox::consumers().iter().map(|h| h.consumer()).collect();
/// assert!(names.contains(&"billing.invoice-paid"));
/// ```
pub fn consumers() -> Vec<&'static RegisteredHandler> {
    let mut all: Vec<&'static RegisteredHandler> = inventory::iter::<Registration>
        .into_iter()
        .map(|registration| registration.0)
        .collect();
    all.sort_by_key(|h| (h.consumer, h.file, h.line, h.function));
    all
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
pub trait ConsumerName: crate::backend::Sealed {
    /// The validated name.
    #[doc(hidden)]
    fn consumer_name(&self) -> Result<&str, InboxError>;
}

impl crate::backend::Sealed for str {}
impl crate::backend::Sealed for String {}
impl crate::backend::Sealed for &'static RegisteredHandler {}

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
