//! Sees the failed statements of a handler's body, whatever error type the
//! body turns them into.
//!
//! A body's error reaches the runtime only as the handler's own `E`: a plain
//! enum, `anyhow::Error`, a boxed error or a generic `E`, from which the
//! diesel error that caused it cannot be recovered. The runtime therefore
//! watches the statements themselves: a diesel [`Instrumentation`] on the
//! connection records each failed statement (the `FinishQuery` event
//! carries its `diesel::result::Error`), and after a body fails the runtime
//! asks whether any statement of that body failed with an error the
//! backend classifies as transient (a deadlock, a serialization failure, a
//! lock timeout, SQLite busy). If so, the whole transaction is rerun.
//!
//! A connection holds one instrumentation. The runtime installs its
//! [`ErrorObserver`] only on a connection that has none (diesel's no-op
//! default); it never replaces one of yours. To keep your own and this
//! detection, wrap yours: `conn.set_instrumentation(ErrorObserver::wrapping(yours))`.
//! Without an observer, body errors are retried only when `E` implements
//! [`RetryableError`](crate::RetryableError).

use diesel::connection::{Connection, Instrumentation, InstrumentationEvent};
use diesel::result::{DatabaseErrorKind, Error};

/// How many failed statements an observer remembers; older ones are
/// dropped (a body that fails more statements than this and still relies
/// on the first one being seen is far-fetched).
const REMEMBERED: usize = 16;

/// A failed statement, as far as retry decisions need it.
#[derive(Debug, Clone)]
pub(crate) struct FailedStatement {
    sequence: u64,
    kind: DatabaseErrorKind,
    info: RecordedInfo,
}

impl FailedStatement {
    /// A failed statement of `kind` with `message` (the engine's tests).
    #[cfg(all(test, feature = "mysql"))]
    pub(crate) fn with_message(kind: DatabaseErrorKind, message: &str) -> Self {
        FailedStatement {
            sequence: 0,
            kind,
            info: RecordedInfo {
                message: message.to_string(),
                details: None,
                hint: None,
            },
        }
    }

    /// An equivalent diesel error, for classification and error messages.
    pub(crate) fn to_error(&self) -> Error {
        Error::DatabaseError(self.kind, Box::new(self.info.clone()))
    }
}

/// The fields of a failed statement's error that classification reads:
/// the message, and the detail and hint (a PostgreSQL deadlock is known by
/// them, whatever the server's language).
#[derive(Debug, Clone)]
struct RecordedInfo {
    message: String,
    details: Option<String>,
    hint: Option<String>,
}

impl diesel::result::DatabaseErrorInformation for RecordedInfo {
    fn message(&self) -> &str {
        &self.message
    }
    fn details(&self) -> Option<&str> {
        self.details.as_deref()
    }
    fn hint(&self) -> Option<&str> {
        self.hint.as_deref()
    }
    fn table_name(&self) -> Option<&str> {
        None
    }
    fn column_name(&self) -> Option<&str> {
        None
    }
    fn constraint_name(&self) -> Option<&str> {
        None
    }
    fn statement_position(&self) -> Option<i32> {
        None
    }
}

/// A diesel [`Instrumentation`] that remembers the connection's failed
/// statements, so that the runtime can retry a transient failure inside a
/// handler's body whatever the body's error type.
///
/// The runtime installs one by itself on connections that have no
/// instrumentation. It also keeps that the connection's inbox tables passed
/// the shape check of its first claim, so that later claims skip it. If you
/// set your own instrumentation, wrap it so that both work. (Unwrapped, a
/// transient failure inside the body is retried only if the body's error
/// type says so, [`RetryableError`](crate::RetryableError), and the shape
/// check is remembered per process and backend instead of per connection:
/// run [`migrate`](crate::migrate) at start-up on each database, which
/// checks its tables.)
///
/// ```
/// use diesel::connection::{Instrumentation, InstrumentationEvent};
/// use diesel::prelude::*;
/// use diesel_inbox::ErrorObserver;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// conn.set_instrumentation(ErrorObserver::wrapping(|event: InstrumentationEvent<'_>| {
///     if let InstrumentationEvent::FinishQuery { query, error: Some(error), .. } = event {
///         eprintln!("query failed: {query}: {error}");
///     }
/// }));
/// diesel_inbox::migrate(&mut conn)?;
/// # Ok(())
/// # }
/// ```
pub struct ErrorObserver {
    inner: Option<Box<dyn Instrumentation>>,
    sequence: u64,
    failed: Vec<FailedStatement>,
    /// Whether the inbox tables' shape was checked on this connection
    /// (before its first claim).
    shape_checked: bool,
}

impl ErrorObserver {
    /// An observer that forwards nothing.
    pub fn new() -> Self {
        ErrorObserver {
            inner: None,
            sequence: 0,
            failed: Vec::new(),
            shape_checked: false,
        }
    }

    /// An observer that forwards every event to `inner`, your own
    /// instrumentation.
    pub fn wrapping(inner: impl Instrumentation) -> Self {
        ErrorObserver {
            inner: Some(Box::new(inner)),
            ..ErrorObserver::new()
        }
    }
}

impl Default for ErrorObserver {
    fn default() -> Self {
        ErrorObserver::new()
    }
}

impl std::fmt::Debug for ErrorObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorObserver")
            .field("wraps_another", &self.inner.is_some())
            .field("failed", &self.failed)
            .finish()
    }
}

impl ErrorObserver {
    /// Remembers a failed statement's error.
    fn remember(
        &mut self,
        kind: DatabaseErrorKind,
        info: &dyn diesel::result::DatabaseErrorInformation,
    ) {
        self.sequence += 1;
        if self.failed.len() == REMEMBERED {
            self.failed.remove(0);
        }
        self.failed.push(FailedStatement {
            sequence: self.sequence,
            kind,
            info: RecordedInfo {
                message: info.message().to_string(),
                details: info.details().map(str::to_string),
                hint: info.hint().map(str::to_string),
            },
        });
    }
}

/// [`remember_refusal`] when `error` is a guard's refusal.
pub(crate) fn remember_refusal_of(current: &mut dyn Instrumentation, error: &Error) {
    if crate::backend::errors::refusal(error).is_some() {
        remember_refusal(current, error);
    }
}

/// Remembers `error`, a guard's refusal that the runtime read from a
/// statement's answer (the server saw no failure: another statement ran
/// under the guarded one's name), on a connection whose instrumentation
/// is `current`, so that the engine finds it among the body's failures
/// as it finds a refusal the server raised. Nothing without an observer.
pub(crate) fn remember_refusal(current: &mut dyn Instrumentation, error: &Error) {
    if let (Some(observer), Error::DatabaseError(kind, info)) =
        (current.downcast_mut::<ErrorObserver>(), error)
    {
        observer.remember(*kind, &**info);
    }
}

impl Instrumentation for ErrorObserver {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let InstrumentationEvent::FinishQuery {
            error: Some(Error::DatabaseError(kind, info)),
            ..
        } = &event
        {
            self.remember(*kind, &**info);
        }
        if let Some(inner) = &mut self.inner {
            inner.on_connection_event(event);
        }
    }
}

/// A point in a connection's statement history; `None` when no observer
/// watches the connection (the body's failed statements are then unknown).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark(Option<u64>);

/// What a connection's instrumentation is.
enum Installed {
    /// Ours, at this point of its history.
    Observer(u64),
    /// diesel's no-op: nobody's, so ours may take its place.
    Nothing,
    /// The user's own: left alone.
    Theirs,
}

fn installed(instrumentation: &mut dyn Instrumentation) -> Installed {
    if let Some(observer) = instrumentation.downcast_ref::<ErrorObserver>() {
        return Installed::Observer(observer.sequence);
    }
    // The concrete type behind the trait object (upcast to `Any`: its
    // vtable's, not `dyn Instrumentation`'s).
    let concrete: &dyn std::any::Any = &*instrumentation;
    if concrete.type_id() == no_instrumentation() {
        Installed::Nothing
    } else {
        Installed::Theirs
    }
}

/// The type of diesel's no-op instrumentation: what a connection without
/// one hands out (every diesel and diesel-async connection keeps its
/// instrumentation as a `DynInstrumentation`, whose `none()` is diesel's
/// API for connection implementations, behind the feature this crate
/// enables).
fn no_instrumentation() -> std::any::TypeId {
    static NONE: std::sync::OnceLock<std::any::TypeId> = std::sync::OnceLock::new();
    *NONE.get_or_init(|| {
        let none = diesel::connection::DynInstrumentation::none();
        let concrete: &dyn std::any::Any = &*none;
        concrete.type_id()
    })
}

fn failed(instrumentation: &mut dyn Instrumentation, mark: Mark) -> Vec<FailedStatement> {
    let Mark(Some(since)) = mark else {
        return Vec::new();
    };
    match instrumentation.downcast_ref::<ErrorObserver>() {
        Some(observer) => observer
            .failed
            .iter()
            .filter(|failed| failed.sequence > since)
            .cloned()
            .collect(),
        // Replaced by the body itself: nothing known.
        None => Vec::new(),
    }
}

/// The mark of a connection whose instrumentation is `current`; `None`
/// when it has none, and an observer must be installed first.
fn mark_of(current: &mut dyn Instrumentation) -> Option<Mark> {
    match installed(current) {
        Installed::Observer(sequence) => Some(Mark(Some(sequence))),
        Installed::Nothing => None,
        Installed::Theirs => Some(Mark(None)),
    }
}

/// Marks the connection's statement history before a body runs, installing
/// an [`ErrorObserver`] first if the connection has no instrumentation.
pub(crate) fn mark<C: Connection>(conn: &mut C) -> Mark {
    mark_of(conn.instrumentation()).unwrap_or_else(|| {
        conn.set_instrumentation(ErrorObserver::new());
        Mark(Some(0))
    })
}

/// The backends whose inbox tables passed the shape check in this process
/// on a connection that could not keep it: one whose instrumentation is
/// the user's own and does not wrap an [`ErrorObserver`]. diesel offers no
/// other per-connection state and no identity of the database a connection
/// reaches (`docs/upstream.md`), so for such connections the check is
/// remembered per process and backend: a table's shape does not change
/// under a running service without `migrate`, and `migrate` at start-up
/// checks each database's tables whatever the instrumentation.
static CHECKED_IN_PROCESS: std::sync::Mutex<Vec<std::any::TypeId>> =
    std::sync::Mutex::new(Vec::new());

fn checked_in_process(backend: std::any::TypeId) -> bool {
    CHECKED_IN_PROCESS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .contains(&backend)
}

/// Whether the inbox tables' shape still needs checking on a connection of
/// backend `B` whose instrumentation is `current`: until an observer on it
/// has recorded a check, or, on a connection with an instrumentation of the
/// user's own that does not wrap an [`ErrorObserver`], until a check passed
/// in this process ([`CHECKED_IN_PROCESS`]). Never once per claim.
pub(crate) fn shape_unchecked<B: 'static>(current: &mut dyn Instrumentation) -> bool {
    match current.downcast_ref::<ErrorObserver>() {
        Some(observer) => !observer.shape_checked,
        None => match installed(current) {
            Installed::Theirs => !checked_in_process(std::any::TypeId::of::<B>()),
            Installed::Nothing | Installed::Observer(_) => true,
        },
    }
}

/// Records that the shape was checked on a connection of backend `B` whose
/// instrumentation is `current`; `false` when it has no instrumentation,
/// and an observer must be installed first.
fn record_shape_check<B: 'static>(current: &mut dyn Instrumentation) -> bool {
    if let Some(observer) = current.downcast_mut::<ErrorObserver>() {
        observer.shape_checked = true;
        return true;
    }
    match installed(current) {
        Installed::Nothing => false,
        Installed::Theirs | Installed::Observer(_) => {
            let mut checked = CHECKED_IN_PROCESS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let backend = std::any::TypeId::of::<B>();
            if !checked.contains(&backend) {
                checked.push(backend);
            }
            true
        }
    }
}

/// Records on the connection that its inbox tables' shape was checked,
/// installing an [`ErrorObserver`] first if it has no instrumentation.
pub(crate) fn shape_checked<C: Connection<Backend: 'static>>(conn: &mut C) {
    if !record_shape_check::<C::Backend>(conn.instrumentation()) {
        let mut observer = ErrorObserver::new();
        observer.shape_checked = true;
        conn.set_instrumentation(observer);
    }
}

/// [`shape_checked`] for a diesel-async connection.
#[cfg(feature = "async")]
pub(crate) fn shape_checked_async<C>(conn: &mut C)
where
    C: diesel_async::AsyncConnection<Backend: 'static>,
{
    if !record_shape_check::<C::Backend>(conn.instrumentation()) {
        let mut observer = ErrorObserver::new();
        observer.shape_checked = true;
        conn.set_instrumentation(observer);
    }
}

/// The failed statements since `mark`, oldest first (empty when nothing
/// failed or nothing watched).
pub(crate) fn failed_since<C: Connection>(conn: &mut C, mark: Mark) -> Vec<FailedStatement> {
    failed(conn.instrumentation(), mark)
}

/// [`mark`] for a diesel-async connection.
#[cfg(feature = "async")]
pub(crate) fn mark_async<C: diesel_async::AsyncConnection>(conn: &mut C) -> Mark {
    mark_of(conn.instrumentation()).unwrap_or_else(|| {
        conn.set_instrumentation(ErrorObserver::new());
        Mark(Some(0))
    })
}

/// [`failed_since`] for a diesel-async connection.
#[cfg(feature = "async")]
pub(crate) fn failed_since_async<C: diesel_async::AsyncConnection>(
    conn: &mut C,
    mark: Mark,
) -> Vec<FailedStatement> {
    failed(conn.instrumentation(), mark)
}
