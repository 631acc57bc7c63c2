//! The builder's type-level options: how a call is classified
//! ([`Classify`]), and its mode ([`Mode`]: plain or checked, with a stored
//! result and a fingerprint or not), each sealed, each saying which
//! terminal methods of [`Inbox`](super::Inbox) exist for it.

use crate::fingerprint::Fingerprint;
use crate::options::Options;
use crate::processed::{Processed, Stored};
use crate::retry::ErrorClass;
use crate::transaction::{InboxConnection, Steps};
use diesel::connection::LoadConnection;

mod sealed {
    /// The seal of [`Mode`](super::Mode) and its companions.
    pub trait Sealed {}
}

/// Which errors of the body are transient: [`ByStatements`] (the default),
/// or any `Fn(&E) -> ErrorClass<E>`, such as [`ErrorClass::of`] or
/// [`ErrorClass::permanent`].
pub trait Classify<E> {
    /// The class of `error`.
    fn class(&self, error: &E) -> ErrorClass<E>;
}

/// The default classification: a body's error is transient when a
/// statement of the body failed with a transient error
/// ([`ErrorClass::by_statements`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ByStatements;

impl<E> Classify<E> for ByStatements {
    fn class(&self, _: &E) -> ErrorClass<E> {
        ErrorClass::by_statements()
    }
}

impl<E, F: Fn(&E) -> ErrorClass<E>> Classify<E> for F {
    fn class(&self, error: &E) -> ErrorClass<E> {
        self(error)
    }
}

/// A call with no option beyond its key.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

/// A call that checks a fingerprint, stores its result or counts its
/// failures: it reads rows, so its connection is a `LoadConnection`, and
/// counted failures are described by the error's `Debug` form.
#[derive(Debug, Clone, Copy)]
pub struct Checked<S = NotStored, P = NoFingerprint> {
    pub(super) fingerprint: P,
    pub(super) max_attempts: Option<u32>,
    pub(super) stores: std::marker::PhantomData<S>,
}

/// No fingerprint.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFingerprint;

/// The body's value is not stored: the call returns [`Processed<T>`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NotStored;

/// The body's value is stored: the call returns [`Stored<T>`].
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreResult;

/// A batch fingerprint that may fail to compute (what the attribute
/// passes).
#[doc(hidden)]
pub struct Fallible<F>(pub(super) F);

/// What a call of this builder checks and returns; sealed.
pub trait Mode: sealed::Sealed {
    /// What a single call returns for a success `T`: [`Processed<T>`], or
    /// [`Stored<T>`] with `store_result`.
    type Output<T>;
    #[doc(hidden)]
    type Stores;
    #[doc(hidden)]
    type Fingerprint;
    #[doc(hidden)]
    fn max_attempts(&self) -> Option<u32>;
    #[doc(hidden)]
    fn into_parts(self) -> (Self::Fingerprint, std::marker::PhantomData<Self::Stores>);
}

impl sealed::Sealed for Plain {}
impl<S, P> sealed::Sealed for Checked<S, P> {}

impl Mode for Plain {
    type Output<T> = Processed<T>;
    type Stores = NotStored;
    type Fingerprint = NoFingerprint;
    fn max_attempts(&self) -> Option<u32> {
        None
    }
    fn into_parts(self) -> (NoFingerprint, std::marker::PhantomData<NotStored>) {
        (NoFingerprint, std::marker::PhantomData)
    }
}

impl<S: Stores, P> Mode for Checked<S, P> {
    type Output<T> = S::Output<T>;
    type Stores = S;
    type Fingerprint = P;
    fn max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }
    fn into_parts(self) -> (P, std::marker::PhantomData<S>) {
        (self.fingerprint, self.stores)
    }
}

/// Whether the body's value is stored: [`NotStored`] or [`StoreResult`].
pub trait Stores: sealed::Sealed {
    /// What a single call returns for a success `T`.
    type Output<T>;
}

impl sealed::Sealed for NotStored {}
impl sealed::Sealed for StoreResult {}

impl Stores for NotStored {
    type Output<T> = Processed<T>;
}

impl Stores for StoreResult {
    type Output<T> = Stored<T>;
}

/// The options of a single-message call.
#[doc(hidden)]
pub trait Single: Mode {
    fn options(&self) -> Options;
}

impl Single for Plain {
    fn options(&self) -> Options {
        Options::new()
    }
}

impl<S: Stores, P: SingleFingerprint> Single for Checked<S, P> {
    fn options(&self) -> Options {
        let options = match self.fingerprint.fingerprint() {
            Some(fingerprint) => Options::new().fingerprint_or_error(fingerprint),
            None => Options::new(),
        };
        match self.max_attempts {
            Some(max) => options.max_attempts(max),
            None => options,
        }
    }
}

/// A fingerprint of one message: a [`Fingerprint`], or none.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the fingerprint of one message",
    label = "a single call's fingerprint is a `Fingerprint`",
    note = "`Inbox::run` takes `.fingerprint(Fingerprint::of_bytes(..))`; a closure `|m| ..` is for `run_batch`"
)]
pub trait SingleFingerprint: sealed::Sealed {
    #[doc(hidden)]
    fn fingerprint(&self) -> Option<Result<Fingerprint, String>>;
}

impl sealed::Sealed for NoFingerprint {}
impl sealed::Sealed for Fingerprint {}
impl sealed::Sealed for Result<Fingerprint, String> {}
impl sealed::Sealed for Option<Result<Fingerprint, String>> {}

impl SingleFingerprint for NoFingerprint {
    fn fingerprint(&self) -> Option<Result<Fingerprint, String>> {
        None
    }
}

impl SingleFingerprint for Fingerprint {
    fn fingerprint(&self) -> Option<Result<Fingerprint, String>> {
        Some(Ok(*self))
    }
}

impl SingleFingerprint for Result<Fingerprint, String> {
    fn fingerprint(&self) -> Option<Result<Fingerprint, String>> {
        Some(self.clone())
    }
}

/// A fingerprint the caller may or may not have (the HTTP front door's).
impl SingleFingerprint for Option<Result<Fingerprint, String>> {
    fn fingerprint(&self) -> Option<Result<Fingerprint, String>> {
        self.clone()
    }
}

/// What a sync single call runs beyond its body, on connection `C` with
/// error `E`.
#[diagnostic::on_unimplemented(
    message = "a call with a fingerprint, a stored result or `max_attempts` needs a connection that loads rows and an error type that implements `Debug`",
    label = "`{C}` must implement `LoadConnection` and `{E}` must implement `Debug`",
    note = "every diesel connection loads rows (`PgConnection`, `MysqlConnection`, `SqliteConnection`, r2d2's `PooledConnection`); derive `Debug` for the error type"
)]
#[doc(hidden)]
pub trait SyncSteps<C, E>: Single {
    fn steps() -> Steps<C, E>;
}

impl<C: InboxConnection, E> SyncSteps<C, E> for Plain {
    fn steps() -> Steps<C, E> {
        Steps::plain()
    }
}

impl<C, E, S, P> SyncSteps<C, E> for Checked<S, P>
where
    C: InboxConnection + LoadConnection,
    E: std::fmt::Debug,
    S: Stores,
    P: SingleFingerprint,
{
    fn steps() -> Steps<C, E> {
        Steps::with_options()
    }
}

/// How an async single call describes the body's counted failures.
#[diagnostic::on_unimplemented(
    message = "a call with a fingerprint, a stored result or `max_attempts` needs an error type that implements `Debug`",
    label = "`{E}` must implement `Debug`",
    note = "derive `Debug` for the error type"
)]
#[doc(hidden)]
pub trait AsyncSteps<E>: Single {
    fn describe() -> Option<fn(&E) -> String>;
}

impl<E> AsyncSteps<E> for Plain {
    fn describe() -> Option<fn(&E) -> String> {
        None
    }
}

impl<E: std::fmt::Debug, S: Stores, P: SingleFingerprint> AsyncSteps<E> for Checked<S, P> {
    fn describe() -> Option<fn(&E) -> String> {
        Some(crate::options::describe::<E>)
    }
}

/// What a batch call checks beyond its keys: its messages' fingerprints.
/// A batch has no `store_result`.
#[diagnostic::on_unimplemented(
    message = "this call cannot run a batch of `{Msg}`",
    label = "a batch has no `store_result`, and its fingerprint is a closure `Fn(&{Msg}) -> Fingerprint`",
    note = "a batch's body returns one value for all its messages, which belongs to none of their rows: drop `store_result()`; give `.fingerprint(|m: &{Msg}| Fingerprint::of_bytes(..))`"
)]
#[doc(hidden)]
pub trait BatchMode<Msg>: Mode {
    const HAS_FINGERPRINTS: bool;
    fn fingerprint_of(&self, message: &Msg) -> Result<Fingerprint, String>;
    fn batch_max_attempts(&self) -> bool;
}

impl<Msg> BatchMode<Msg> for Plain {
    const HAS_FINGERPRINTS: bool = false;
    fn fingerprint_of(&self, _: &Msg) -> Result<Fingerprint, String> {
        unreachable!("a batch without fingerprints computes none")
    }
    fn batch_max_attempts(&self) -> bool {
        false
    }
}

impl<Msg, P: BatchFingerprint<Msg>> BatchMode<Msg> for Checked<NotStored, P> {
    const HAS_FINGERPRINTS: bool = P::PRESENT;
    fn fingerprint_of(&self, message: &Msg) -> Result<Fingerprint, String> {
        self.fingerprint.of(message)
    }
    fn batch_max_attempts(&self) -> bool {
        self.max_attempts.is_some()
    }
}

/// The fingerprints of a batch's messages: a closure
/// `Fn(&M) -> Fingerprint`, or none.
#[doc(hidden)]
pub trait BatchFingerprint<Msg> {
    const PRESENT: bool;
    fn of(&self, message: &Msg) -> Result<Fingerprint, String>;
}

impl<Msg> BatchFingerprint<Msg> for NoFingerprint {
    const PRESENT: bool = false;
    fn of(&self, _: &Msg) -> Result<Fingerprint, String> {
        unreachable!("a batch without fingerprints computes none")
    }
}

impl<Msg, F: Fn(&Msg) -> Fingerprint> BatchFingerprint<Msg> for F {
    const PRESENT: bool = true;
    fn of(&self, message: &Msg) -> Result<Fingerprint, String> {
        Ok(self(message))
    }
}

impl<Msg, F: Fn(&Msg) -> Result<Fingerprint, String>> BatchFingerprint<Msg> for Fallible<F> {
    const PRESENT: bool = true;
    fn of(&self, message: &Msg) -> Result<Fingerprint, String> {
        (self.0)(message)
    }
}
