//! Every `#[idempotent]` handler of the program, as the attribute
//! registered it before `main` (the ground floor: the error of a consumer
//! conflict names them; `registry` checks them).

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
    pub(crate) consumer: &'static str,
    pub(crate) function: &'static str,
    pub(crate) file: &'static str,
    pub(crate) line: u32,
    pub(crate) shared: bool,
    /// The verdict of the conflict check, computed on first use.
    pub(crate) conflict: OnceLock<Option<Vec<&'static RegisteredHandler>>>,
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
/// otherwise their first call fails with [`InboxError::ConsumerConflict`](crate::InboxError::ConsumerConflict),
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
