//! The one call surface: [`Inbox`], a builder that holds a call's options
//! as data, with a terminal method per kind of call (sync or async, one
//! message or a batch, a body that may rerun or one that runs once).
//! `#[idempotent]` expands to the same builder.

#[cfg(feature = "async")]
use crate::asynchronous::{self, AsyncBatchBody, AsyncBody};
#[cfg(feature = "async")]
use crate::backend::asynchronous::AsyncInboxConnection;
use crate::claim::{BatchPlan, FingerprintOf};
use crate::error::InboxError;
use crate::fingerprint::Fingerprint;
use crate::key::InboxKey;
use crate::options::{Options, SingleOutcome};
use crate::processed::Batch;
use crate::registry::ConsumerName;
use crate::retry::ErrorClass;
use crate::transaction::{self, InboxConnection};
use diesel::connection::LoadConnection;
use diesel::result::Error;

mod modes;
pub use modes::*;

/// How often a transient failure reruns the transaction by default (the
/// attribute's default too: `inbox-macros` states it once more).
pub(crate) const DEFAULT_RETRIES: u32 = 3;

/// A handler call without the attribute: claims a message's key for a
/// consumer and runs a body in the same transaction, with the options the
/// builder holds.
///
/// Build it once per consumer (or per message, for a fingerprint of the
/// message's content), then call a terminal method per delivery:
///
/// | terminal | body | returns |
/// |---|---|---|
/// | [`run`](Inbox::run) | `FnMut(&mut C) -> Result<T, E>`, rerun on a transient error | `Processed<T>` (`Stored<T>` with [`store_result`](Inbox::store_result)) |
/// | [`run_once`](Inbox::run_once) | `FnOnce`: may move what it captures; never rerun | the same |
/// | [`run_batch`](Inbox::run_batch) | `FnMut(&mut C, Vec<&M>)`: the messages delivered for the first time | [`Batch<T>`] |
/// | `run_async`, `run_once_async`, `run_batch_async` (feature `async`) | `async` closures on a diesel-async connection | the same |
///
/// The options, each set once here:
/// - [`retries`](Inbox::retries): how often a transient failure (a
///   deadlock, a serialization failure, a lock timeout, SQLite busy)
///   reruns the whole transaction, claim and commit included (default 3,
///   the attribute's too);
/// - [`classify`](Inbox::classify): which errors of the body are transient
///   (default: [`ErrorClass::by_statements`], a failed statement of the
///   body says so, whatever `E` is);
/// - [`fingerprint`](Inbox::fingerprint): the content's [`Fingerprint`],
///   checked against a redelivery's ([`InboxError::KeyReused`]); for a
///   batch, a closure giving each message's;
/// - [`store_result`](Inbox::store_result): the body's value is stored and
///   returned to duplicates ([`Stored::Duplicate`](crate::Stored::Duplicate));
/// - [`max_attempts`](Inbox::max_attempts): failures of the body are
///   counted per key, and a key that failed that often is given up on
///   ([`InboxError::AttemptsExhausted`]).
///
/// The consumer is the scope of deduplication: a `&str` or `String` (a
/// plain name is not registered: code that calls this directly owns its
/// names). Retries happen only when the call owns the transaction: inside
/// the caller's transaction the call takes a savepoint, and a transient
/// error is returned at once, since the caller's work is lost too. A commit
/// that fails for a reason the body caused (a deferred foreign key) returns
/// the database error as the body's own `E`.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::{migrate, Inbox, Processed};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// migrate(&mut conn)?;
/// let mailer = Inbox::consumer("mailer").retries(5);
/// let send = |conn: &mut SqliteConnection| -> QueryResult<Processed<()>> {
///     mailer.run(conn, "m-1", |_conn| Ok(()))
/// };
/// assert_eq!(send(&mut conn)?, Processed::Applied(()));
/// assert_eq!(send(&mut conn)?, Processed::Duplicate);
/// # Ok(())
/// # }
/// ```
pub struct Inbox<'n, N: ?Sized = str, M = Plain, R = ByStatements> {
    consumer: &'n N,
    retries: Option<u32>,
    classify: R,
    mode: M,
    /// The bound on waiting for an in-flight claim of the same key
    /// (async calls only).
    wait: Option<std::time::Duration>,
}

impl<N: ?Sized, M, R> std::fmt::Debug for Inbox<'_, N, M, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("retries", &self.retries.unwrap_or(DEFAULT_RETRIES))
            .finish_non_exhaustive()
    }
}

impl<'n, N: ConsumerName + ?Sized> Inbox<'n, N> {
    /// The calls of `consumer`, with the defaults: 3
    /// retries, errors classified by the body's statements, no
    /// fingerprint, nothing stored or counted.
    pub fn consumer(consumer: &'n N) -> Self {
        Inbox {
            consumer,
            retries: None,
            classify: ByStatements,
            mode: Plain,
            wait: None,
        }
    }
}

impl<'n, N: ?Sized, M, R> Inbox<'n, N, M, R> {
    /// How often a transient failure reruns the transaction (default 3;
    /// 0: never).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = Some(retries);
        self
    }

    /// Bounds how long the claim waits for another call that holds the
    /// same key in a transaction not yet ended (async terminals only; a
    /// sync call with it is refused): when the bound runs out, the call
    /// fails with [`InboxError::InFlight`] instead of the backend's lock
    /// timeout, and is not retried. PostgreSQL: the transaction's
    /// `lock_timeout` during the claim; MySQL/MariaDB: the session's
    /// `innodb_lock_wait_timeout` during the claim (whole seconds, rounded
    /// up); SQLite: the connection's busy timeout during its `BEGIN
    /// IMMEDIATE`. Each is restored after the claim. What the HTTP front
    /// door's `Idempotent::wait` sets.
    #[doc(hidden)]
    pub fn wait(mut self, wait: std::time::Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// How the body's errors are classified: [`ErrorClass::of`] asks `E`'s
    /// [`RetryableError`](crate::RetryableError) implementation,
    /// [`ErrorClass::permanent`] never retries, or a closure of your own.
    ///
    /// ```
    /// use diesel::prelude::*;
    /// use diesel_inbox::{migrate, ErrorClass, Inbox, Processed};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = SqliteConnection::establish(":memory:")?;
    /// migrate(&mut conn)?;
    /// let inbox = Inbox::consumer("mailer").classify(ErrorClass::of);
    /// let out: QueryResult<_> = inbox.run(&mut conn, "m-1", |_conn| Ok(1));
    /// assert_eq!(out?, Processed::Applied(1));
    /// # Ok(())
    /// # }
    /// ```
    pub fn classify<R2>(self, classify: R2) -> Inbox<'n, N, M, R2> {
        Inbox {
            consumer: self.consumer,
            retries: self.retries,
            wait: self.wait,
            classify,
            mode: self.mode,
        }
    }
}

impl<'n, N: ?Sized, M: Mode, R> Inbox<'n, N, M, R> {
    /// Stores `fingerprint` with the inbox row; a redelivery of the same
    /// key with another fingerprint fails with [`InboxError::KeyReused`]
    /// without running the body. For [`run`](Inbox::run): a
    /// [`Fingerprint`]; for [`run_batch`](Inbox::run_batch): a closure
    /// `Fn(&M) -> Fingerprint` giving each message's (a batch that reuses a
    /// key with other content is refused whole, and nothing is written).
    ///
    /// ```
    /// use diesel::prelude::*;
    /// use diesel_inbox::{migrate, Fingerprint, Inbox, InboxError, Processed};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = SqliteConnection::establish(":memory:")?;
    /// migrate(&mut conn)?;
    /// let mut handle = |conn: &mut SqliteConnection, body: &[u8]| -> Result<Processed<()>, InboxError> {
    ///     Inbox::consumer("mailer").fingerprint(Fingerprint::of_bytes(body)).run(conn, "m-1", |_conn| Ok(()))
    /// };
    /// assert_eq!(handle(&mut conn, b"hello")?, Processed::Applied(()));
    /// assert_eq!(handle(&mut conn, b"hello")?, Processed::Duplicate);
    /// assert!(matches!(handle(&mut conn, b"other"), Err(InboxError::KeyReused { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn fingerprint<P>(self, fingerprint: P) -> Inbox<'n, N, Checked<M::Stores, P>, R> {
        let max_attempts = self.mode.max_attempts();
        Inbox {
            consumer: self.consumer,
            retries: self.retries,
            wait: self.wait,
            classify: self.classify,
            mode: Checked {
                fingerprint,
                max_attempts,
                stores: std::marker::PhantomData,
            },
        }
    }

    /// A fingerprint that may have failed to compute (what the attribute
    /// passes): the call then fails with [`InboxError::FingerprintFailed`].
    #[doc(hidden)]
    pub fn fingerprint_or_error(
        self,
        fingerprint: Result<Fingerprint, String>,
    ) -> Inbox<'n, N, Checked<M::Stores, Result<Fingerprint, String>>, R> {
        self.fingerprint(fingerprint)
    }

    /// A batch's fingerprints that may fail to compute (what the attribute
    /// passes): `messages` fixes the closure's parameter type.
    #[doc(hidden)]
    pub fn batch_fingerprint_or_error<Msg, F>(
        self,
        messages: &[Msg],
        fingerprint: F,
    ) -> Inbox<'n, N, Checked<M::Stores, Fallible<F>>, R>
    where
        F: Fn(&Msg) -> Result<Fingerprint, String>,
    {
        let _ = messages;
        self.fingerprint(Fallible(fingerprint))
    }

    /// Counts the body's failures (errors and panics) per key, each in a
    /// short transaction of its own after the rollback; once a key has
    /// failed `max` times, its deliveries fail with
    /// [`InboxError::AttemptsExhausted`] without running the body. A
    /// success deletes the count. `max` is at least 1 (0 is refused when
    /// the call runs). Not for batches (refused when the call runs).
    pub fn max_attempts(self, max: u32) -> Inbox<'n, N, Checked<M::Stores, M::Fingerprint>, R> {
        let (fingerprint, stores) = self.mode.into_parts();
        Inbox {
            consumer: self.consumer,
            retries: self.retries,
            wait: self.wait,
            classify: self.classify,
            mode: Checked {
                fingerprint,
                max_attempts: Some(max),
                stores,
            },
        }
    }

    /// Stores the body's value as JSON in the claimed row, in the body's
    /// transaction; a duplicate returns it as `Stored::Duplicate(Some(v))`
    /// (feature `serde`; `T: Serialize + DeserializeOwned`). The call then
    /// returns [`Stored<T>`](crate::Stored). Not for batches: a batch's value belongs to
    /// none of its rows.
    pub fn store_result(self) -> Inbox<'n, N, Checked<StoreResult, M::Fingerprint>, R> {
        let max_attempts = self.mode.max_attempts();
        let (fingerprint, _) = self.mode.into_parts();
        Inbox {
            consumer: self.consumer,
            retries: self.retries,
            wait: self.wait,
            classify: self.classify,
            mode: Checked {
                fingerprint,
                max_attempts,
                stores: std::marker::PhantomData,
            },
        }
    }
}

impl<N, M, R> Inbox<'_, N, M, R>
where
    N: ConsumerName + ?Sized,
{
    /// Claims `key` and runs `body` in the same transaction; commits both
    /// or neither. A transient failure reruns the whole transaction, up to
    /// [`retries`](Inbox::retries) times, so `body` may run more than once.
    ///
    /// ```
    /// use diesel::prelude::*;
    /// use diesel_inbox::{migrate, Inbox, Processed};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = SqliteConnection::establish(":memory:")?;
    /// migrate(&mut conn)?;
    /// let billing = Inbox::consumer("billing");
    /// let out: QueryResult<_> = billing.run(&mut conn, "invoice-7", |_conn| Ok(7));
    /// assert_eq!(out?, Processed::Applied(7));
    /// let again: QueryResult<Processed<i32>> = billing.run(&mut conn, "invoice-7", |_conn| Ok(7));
    /// assert_eq!(again?, Processed::Duplicate);
    /// # Ok(())
    /// # }
    /// ```
    pub fn run<C, K, T, E, F>(&self, conn: &mut C, key: &K, body: F) -> Result<M::Output<T>, E>
    where
        C: InboxConnection,
        M: SyncSteps<C, E>,
        M::Output<T>: SingleOutcome<T>,
        K: InboxKey + ?Sized,
        F: FnMut(&mut C) -> Result<T, E>, // reruns on a retry: clone what the body moves, or set `retries = 0`
        R: Classify<E>,
        E: From<InboxError> + From<Error> + std::fmt::Debug,
    {
        transaction::run_one(
            conn,
            self.consumer,
            key,
            &self.sync_options()?,
            self.retries.unwrap_or(DEFAULT_RETRIES),
            body,
            |e: &E| self.classify.class(e),
            M::steps(),
        )
    }

    /// [`run`](Inbox::run) for a body that can run only once (it moves a
    /// captured value): never rerun, its errors never retried. Refused
    /// ([`InboxError::InvalidArgument`]) when [`retries`](Inbox::retries)
    /// asked for more than 0.
    ///
    /// ```
    /// use diesel::prelude::*;
    /// use diesel_inbox::{migrate, Inbox, Processed};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = SqliteConnection::establish(":memory:")?;
    /// migrate(&mut conn)?;
    /// let payload = String::from("owned");
    /// let out: QueryResult<_> = Inbox::consumer("archiver").run_once(&mut conn, "m-1", move |_conn| Ok(payload));
    /// assert_eq!(out?, Processed::Applied("owned".to_string()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn run_once<C, K, T, E, F>(&self, conn: &mut C, key: &K, body: F) -> Result<M::Output<T>, E>
    where
        C: InboxConnection,
        M: SyncSteps<C, E>,
        M::Output<T>: SingleOutcome<T>,
        K: InboxKey + ?Sized,
        F: FnOnce(&mut C) -> Result<T, E>,
        E: From<InboxError> + From<Error> + std::fmt::Debug,
    {
        self.once()?;
        let mut body = Some(body);
        transaction::run_one(
            conn,
            self.consumer,
            key,
            &self.sync_options()?,
            0,
            |conn| match body.take() {
                Some(body) => body(conn),
                None => unreachable!("with retries = 0 the body runs at most once"),
            },
            |_: &E| ErrorClass::permanent(),
            M::steps(),
        )
    }

    /// Claims the keys of a whole batch in one transaction with one
    /// multi-row insert, runs `body` once with only the messages claimed
    /// for the first time, and commits once: the guarantees of
    /// [`run`](Inbox::run), for many messages at the cost of one
    /// transaction.
    ///
    /// `key` gives each message's key (a key repeated within the batch
    /// counts once: its first message is the one applied). Invalid keys
    /// refuse the whole batch before anything runs. When every message is
    /// a duplicate the body does not run and `value` is `None`.
    ///
    /// ```
    /// use diesel::prelude::*;
    /// use diesel_inbox::{migrate, Inbox};
    ///
    /// struct Order { id: u64 }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = SqliteConnection::establish(":memory:")?;
    /// migrate(&mut conn)?;
    /// let shipping = Inbox::consumer("shipping");
    /// let orders = [Order { id: 1 }, Order { id: 2 }];
    /// let first = shipping.run_batch(&mut conn, &orders, |o| o.id.to_string(),
    ///     |_conn, fresh: Vec<&Order>| -> QueryResult<usize> { Ok(fresh.len()) })?;
    /// assert_eq!((first.value, first.applied, first.duplicates), (Some(2), vec![0, 1], 0));
    ///
    /// let again = [Order { id: 2 }, Order { id: 3 }, Order { id: 3 }];
    /// let second = shipping.run_batch(&mut conn, &again, |o| o.id.to_string(),
    ///     |_conn, fresh: Vec<&Order>| -> QueryResult<usize> { Ok(fresh.len()) })?;
    /// assert_eq!((second.value, second.applied, second.duplicates), (Some(1), vec![1], 2));
    /// # Ok(())
    /// # }
    /// ```
    pub fn run_batch<C, Msg, T, E, F>(
        &self,
        conn: &mut C,
        messages: &[Msg],
        key: impl Fn(&Msg) -> String,
        body: F,
    ) -> Result<Batch<T>, E>
    where
        C: InboxConnection + LoadConnection,
        M: BatchMode<Msg>,
        F: FnMut(&mut C, Vec<&Msg>) -> Result<T, E>, // reruns on a retry: clone what the body moves, or set `retries = 0`
        R: Classify<E>,
        E: From<InboxError> + From<Error> + std::fmt::Debug,
    {
        let (consumer, plan) = self.plan(messages, key)?;
        transaction::run_batch(
            conn,
            consumer,
            messages,
            &plan,
            self.retries.unwrap_or(DEFAULT_RETRIES),
            body,
            |e: &E| self.classify.class(e),
        )
    }

    /// The options of a sync single call: a wait bound is for async
    /// calls (the sync drivers do not set it).
    fn sync_options(&self) -> Result<Options, InboxError>
    where
        M: Single,
    {
        match self.wait {
            Some(_) => Err(InboxError::InvalidArgument(
                "Inbox::wait bounds async calls only (run_async, run_once_async)",
            )),
            None => Ok(self.mode.options()),
        }
    }

    /// The checks of [`run_once`](Inbox::run_once): it cannot retry.
    fn once(&self) -> Result<(), InboxError> {
        match self.retries {
            Some(n) if n > 0 => Err(InboxError::InvalidArgument(
                "run_once runs the body at most once and cannot retry: drop `retries(n)`, or use `run` with a body that can rerun",
            )),
            _ => Ok(()),
        }
    }

    /// The consumer's name and the batch's plan: its keys validated, its
    /// fingerprints computed.
    fn plan<Msg>(
        &self,
        messages: &[Msg],
        key: impl Fn(&Msg) -> String,
    ) -> Result<(&str, BatchPlan), InboxError>
    where
        M: BatchMode<Msg>,
    {
        if self.mode.batch_max_attempts() {
            return Err(InboxError::InvalidArgument(
                "max_attempts counts the failures of one message's key: a batch cannot use it",
            ));
        }
        if self.wait.is_some() {
            return Err(InboxError::InvalidArgument(
                "Inbox::wait bounds a single call's claim (run_async, run_once_async): a batch cannot use it",
            ));
        }
        let consumer = self.consumer.consumer_name()?;
        let fingerprint = |m: &Msg| self.mode.fingerprint_of(m);
        let fingerprint: Option<&FingerprintOf<'_, Msg>> =
            M::HAS_FINGERPRINTS.then_some(&fingerprint);
        let plan = BatchPlan::new(consumer, messages, key, fingerprint)?;
        Ok((consumer, plan))
    }
}

#[cfg(feature = "async")]
impl<N, M, R> Inbox<'_, N, M, R>
where
    N: ConsumerName + Sync + ?Sized,
    M: Sync,
    R: Sync,
{
    /// [`run`](Inbox::run) on a diesel-async connection: the body is an
    /// async closure, `async |conn| -> Result<T, E> { .. }`, whose
    /// future must be `Send` (as for diesel-async's own `transaction`),
    /// so that the handler can be spawned on a multi-thread runtime. A
    /// retry runs a copy of the body (a closure that borrows its
    /// captures, the default for `async |..|`, is `Clone`), after an
    /// async sleep: the executor thread is never blocked.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future (a timeout, a cancelled task) at any
    /// await before the commit is sent commits nothing. Dropped while the
    /// `COMMIT` is in flight, the transaction may have committed, claim
    /// and body together, exactly as when the connection drops at that
    /// moment: treat a cancelled delivery as not acked, and its
    /// redelivery reports [`Processed::Duplicate`](crate::Processed::Duplicate)
    /// if it had. A connection dropped with the call is marked broken (or
    /// inside its transaction) in diesel-async's transaction manager,
    /// which diesel-async's pools discard; a connection of your own must
    /// be dropped. The guide's async page ("Cancel safety") says what a
    /// drop does at each await.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel::prelude::*;
    /// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    /// use diesel_async::AsyncConnection;
    /// use diesel_inbox::{Inbox, Processed};
    ///
    /// let mut conn = SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await?;
    /// diesel_inbox::migrate_async(&mut conn).await?;
    /// let mailer = Inbox::consumer("mailer");
    /// for expected in [Processed::Applied(7), Processed::Duplicate] {
    ///     let outcome: QueryResult<_> = mailer.run_async(&mut conn, "m-1", async |_conn| Ok(7)).await;
    ///     assert_eq!(outcome?, expected);
    /// }
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "sqlite"))]
    /// # fn main() {}
    /// ```
    // rustfmt moves the comments off their bounds, and they are what
    // rustc quotes when a bound fails.
    #[rustfmt::skip]
    pub async fn run_async<C, K, T, E, F>(
        &self,
        conn: &mut C,
        key: &K,
        body: F,
    ) -> Result<M::Output<T>, E>
    where
        C: AsyncInboxConnection,
        M: AsyncSteps<E>,
        M::Output<T>: SingleOutcome<T>,
        K: InboxKey + ?Sized,
        for<'c> F: AsyncBody<&'c mut C, Result<T, E>, Fut: Send> // no Rc or guard across .await
            + Clone // a retry runs a copy: clone what the body moves, or set `retries = 0`
            + Send,
        T: Send,
        E: From<InboxError> + From<Error> + std::fmt::Debug + Send,
        R: Classify<E>,
    {
        let next_body = move || body.clone();
        asynchronous::run_one(
            conn,
            self.consumer,
            key,
            &self.mode.options().wait(self.wait),
            self.retries.unwrap_or(DEFAULT_RETRIES),
            next_body,
            |e: &E| self.classify.class(e),
            M::describe(),
        )
        .await
    }

    /// [`run_once`](Inbox::run_once) on a diesel-async connection: a
    /// body that can run only once, never rerun.
    ///
    /// Cancel safety: as [`run_async`](Inbox::run_async).
    pub async fn run_once_async<C, K, T, E, F>(
        &self,
        conn: &mut C,
        key: &K,
        body: F,
    ) -> Result<M::Output<T>, E>
    where
        C: AsyncInboxConnection,
        M: AsyncSteps<E>,
        M::Output<T>: SingleOutcome<T>,
        K: InboxKey + ?Sized,
        for<'c> F: AsyncBody<&'c mut C, Result<T, E>, Fut: Send> // no Rc or guard across .await
            + Send,
        T: Send,
        E: From<InboxError> + From<Error> + std::fmt::Debug + Send,
    {
        self.once()?;
        let mut body = Some(body);
        let next_body = move || match body.take() {
            Some(body) => body,
            None => unreachable!("with retries = 0 the body runs at most once"),
        };
        asynchronous::run_one(
            conn,
            self.consumer,
            key,
            &self.mode.options().wait(self.wait),
            0,
            next_body,
            |_: &E| ErrorClass::permanent(),
            M::describe(),
        )
        .await
    }

    /// [`run_batch`](Inbox::run_batch) on a diesel-async connection:
    /// one transaction and one multi-row claim for a whole batch; the
    /// body, `async |conn, fresh: Vec<&M>| ..`, gets the messages
    /// claimed for the first time.
    ///
    /// Cancel safety: as [`run_async`](Inbox::run_async); a batch
    /// commits all of its first deliveries or none.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel::prelude::*;
    /// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    /// use diesel_async::AsyncConnection;
    /// use diesel_inbox::Inbox;
    ///
    /// let mut conn = SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await?;
    /// diesel_inbox::migrate_async(&mut conn).await?;
    /// let ids = [1_u64, 2, 2];
    /// let batch: QueryResult<_> = Inbox::consumer("shipping")
    ///     .run_batch_async(&mut conn, &ids, |id| id.to_string(), async |_conn, fresh: Vec<&u64>| Ok(fresh.len()))
    ///     .await;
    /// let batch = batch?;
    /// assert_eq!((batch.value, batch.applied, batch.duplicates), (Some(2), vec![0, 1], 1));
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "sqlite"))]
    /// # fn main() {}
    /// ```
    // rustfmt moves the comments off their bounds, and they are what
    // rustc quotes when a bound fails.
    #[rustfmt::skip]
    pub async fn run_batch_async<C, Msg, T, E, F>(
        &self,
        conn: &mut C,
        messages: &[Msg],
        key: impl Fn(&Msg) -> String,
        body: F,
    ) -> Result<Batch<T>, E>
    where
        C: AsyncInboxConnection,
        M: BatchMode<Msg>,
        Msg: Sync,
        for<'c, 'm> F: AsyncBatchBody<&'c mut C, Vec<&'m Msg>, Result<T, E>, Fut: Send>
            + Clone // a retry runs a copy: clone what the body moves, or set `retries = 0`
            + Send,
        T: Send,
        E: From<InboxError> + From<Error> + std::fmt::Debug + Send,
        R: Classify<E>,
    {
        let (consumer, plan) = self.plan(messages, key)?;
        asynchronous::run_batch(
            conn,
            consumer,
            messages,
            &plan,
            self.retries.unwrap_or(DEFAULT_RETRIES),
            body,
            |e: &E| self.classify.class(e),
        )
        .await
    }
}

/// Stand-ins for the async terminals when the `async` feature is off: an
/// `async fn` handler then fails to compile with one error that says so.
#[cfg(not(feature = "async"))]
mod without_async {
    use super::*;

    #[diagnostic::on_unimplemented(
        message = "`async fn` handlers need the `async` feature of diesel-inbox",
        label = "this handler is an `async fn`",
        note = "enable it: diesel-inbox = {{ version = \"0.1\", features = [\"async\", \"postgres\"] }} (with your backend), or make the handler a sync `fn` on a sync diesel connection"
    )]
    #[doc(hidden)]
    pub trait AsyncFeatureEnabled {}

    #[doc(hidden)]
    impl<N: ?Sized, M: Mode, R> Inbox<'_, N, M, R> {
        pub async fn run_async<C, K: ?Sized, T, E, F>(
            &self,
            _: &mut C,
            _: &K,
            _: F,
        ) -> Result<M::Output<T>, E>
        where
            C: AsyncFeatureEnabled,
            F: AsyncFnOnce(&mut C) -> Result<T, E>,
        {
            unreachable!("never implemented")
        }

        pub async fn run_once_async<C, K: ?Sized, T, E, F>(
            &self,
            _: &mut C,
            _: &K,
            _: F,
        ) -> Result<M::Output<T>, E>
        where
            C: AsyncFeatureEnabled,
            F: AsyncFnOnce(&mut C) -> Result<T, E>,
        {
            unreachable!("never implemented")
        }

        pub async fn run_batch_async<C, Msg, T, E, F>(
            &self,
            _: &mut C,
            _: &[Msg],
            _: impl Fn(&Msg) -> String,
            _: F,
        ) -> Result<Batch<T>, E>
        where
            C: AsyncFeatureEnabled,
            F: AsyncFnOnce(&mut C, Vec<&Msg>) -> Result<T, E>,
        {
            unreachable!("never implemented")
        }
    }
}
