//! Errors of the inbox itself (the body's own errors stay the handler's `E`).

use crate::handler::RegisteredHandler;
use crate::key::InvalidKey;
use std::fmt;

/// An error raised by the inbox rather than by the handler's body.
///
/// A handler's error type must implement `From<InboxError>` (and
/// `From<diesel::result::Error>`); `InboxError` itself converts into
/// `diesel::result::Error`, so handlers returning `QueryResult<T>` work.
///
/// ```
/// use diesel_inbox::{InboxError, InvalidKey};
///
/// let err = InboxError::InvalidKey(InvalidKey::Empty);
/// assert_eq!(err.to_string(), "invalid inbox key: it is empty");
///
/// // Into diesel's error type, for `QueryResult` handlers:
/// let diesel_err: diesel::result::Error = err.into();
/// assert!(matches!(diesel_err, diesel::result::Error::QueryBuilderError(_)));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The message key is empty, too long or contains NUL; nothing was written
    /// and the body did not run.
    #[error("invalid inbox key: {0}")]
    InvalidKey(InvalidKey),
    /// The consumer name is empty, too long or contains NUL.
    #[error("invalid inbox consumer name: {0}")]
    InvalidConsumer(InvalidKey),
    /// Two or more `#[idempotent]` handlers of this program use the same
    /// consumer name without declaring it `shared`: each would report
    /// `Duplicate` for the messages the other applied, so none of them runs.
    /// Nothing was written and the body did not run.
    #[error("{}", ConsumerConflictMessage { consumer, handlers })]
    ConsumerConflict {
        /// The consumer name they share.
        consumer: String,
        /// Every handler using it, with its source location.
        handlers: Vec<&'static RegisteredHandler>,
    },
    /// The database refused the claim, the commit or the migration.
    #[error("inbox database error: {0}")]
    Database(diesel::result::Error),
    /// A retryable error (serialization failure, deadlock, SQLite busy) kept
    /// coming back; the transaction was rolled back each time.
    #[error("inbox transaction failed after {attempts} attempts: {source}")]
    RetriesExhausted {
        /// How many times the transaction ran.
        attempts: u32,
        /// The error of the last attempt.
        #[source]
        source: diesel::result::Error,
    },
    /// A statement in the body failed in a way that ended the transaction
    /// (PostgreSQL aborts it on any error; MySQL/MariaDB roll it back on a
    /// deadlock), but the body returned `Ok`: it swallowed the error.
    /// Nothing of the transaction was committed, the inbox row neither:
    /// propagate database errors with `?`.
    #[error("the handler body returned Ok after a failed statement ended its transaction; the inbox row was not committed (propagate database errors with `?`): {0}")]
    BodyIgnoredError(#[source] diesel::result::Error),
    /// `migrate` could not create or upgrade the table. When the cause is a
    /// missing privilege (PostgreSQL 42501, MySQL 1142/1044), the message
    /// says what the role needs.
    #[error("inbox migration failed: {0}{hint}", hint = privilege_hint(.0))]
    MigrationFailed(#[source] diesel::result::Error),
    /// `migrate` was called inside an open transaction on MySQL/MariaDB,
    /// where DDL would implicitly commit the caller's transaction.
    #[error("inbox migration refused: MySQL/MariaDB would implicitly commit the open transaction; call migrate() outside any transaction")]
    MigrationInTransaction,
    /// `migrate` found an `inbox_messages` table that the runtime cannot use
    /// correctly: with it, redeliveries could be applied twice or new
    /// messages reported as duplicates. Nothing was changed.
    #[error("{}", IncompatibleTableMessage(.0))]
    IncompatibleTable(Vec<TableProblem>),
    /// There is no `inbox_messages` table in the database the connection
    /// reaches (an operation other than `migrate`): run `migrate` first, or
    /// check the database and schema of the connection.
    #[error("there is no inbox_messages table in this database: run migrate() (or `diesel-inbox migrate`) first, or check the database URL and schema")]
    NoTable(#[source] diesel::result::Error),
    /// An operation that runs its own short transactions (`purge`) was
    /// called inside an open transaction, which would make them one long
    /// transaction holding every lock until the caller commits.
    #[error("inbox {operation} refused: it runs its own short transactions and must be called outside any transaction")]
    InTransaction {
        /// The operation refused.
        operation: &'static str,
    },
    /// An argument is out of range; nothing was done.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    // (The variants with a reason hold boxed strings: `InboxError` stays
    // as small as before them, 56 bytes.)
    /// The key was applied before with different content: the stored
    /// [`Fingerprint`](crate::Fingerprint) of its inbox row differs from
    /// this delivery's. A producer reused the key for another message; the
    /// body did not run and nothing was written. Never retried: redelivering
    /// it gives the same error, so dead-letter it and alert.
    #[error("message key {key:?} of consumer {consumer:?} was applied before with different content (its fingerprint differs): the producer reused the key; the body did not run")]
    KeyReused {
        /// The consumer (dedup scope).
        consumer: String,
        /// The reused key.
        key: String,
    },
    /// `max_attempts`: this key's deliveries failed `failures` times, as
    /// many as the handler allows, so the body did not run again and
    /// nothing was written. Never retried: dead-letter the message and
    /// acknowledge it. `diesel_inbox::attempts` shows the count;
    /// `diesel_inbox::forget` resets it (a deliberate retry).
    #[error("message {key:?} of consumer {consumer:?} failed {failures} times, as many as max_attempts allows; the body did not run (dead-letter it and acknowledge; `forget` resets the count). Last error: {last_error}")]
    AttemptsExhausted {
        /// The consumer (dedup scope).
        consumer: Box<str>,
        /// The message's key.
        key: Box<str>,
        /// The failures counted.
        failures: u32,
        /// The last failure's error.
        last_error: Box<str>,
    },
    /// The fingerprint of the message's content could not be computed (its
    /// `Serialize` implementation failed, or a map has keys that are not
    /// strings); nothing was written and the body did not run.
    #[error("the fingerprint of message {key:?} of consumer {consumer:?} could not be computed: {reason}")]
    FingerprintFailed {
        /// The consumer (dedup scope).
        consumer: Box<str>,
        /// The message's key.
        key: Box<str>,
        /// The serializer's error.
        reason: Box<str>,
    },
    /// `store_result`: the body's value could not be serialized; the
    /// transaction was rolled back, so nothing of it was committed.
    #[error("the result of message {key:?} of consumer {consumer:?} could not be stored: {reason}; the transaction was rolled back")]
    ResultNotStored {
        /// The consumer (dedup scope).
        consumer: Box<str>,
        /// The message's key.
        key: Box<str>,
        /// The serializer's error.
        reason: Box<str>,
    },
    /// `store_result`: a duplicate's stored value does not deserialize as
    /// the handler's success type (the type changed since the first
    /// delivery stored it). The message was applied before; the body did
    /// not run. Change the type compatibly (`#[serde(default)]` on new
    /// fields), or acknowledge such duplicates.
    #[error("the stored result of message {key:?} of consumer {consumer:?} cannot be read as the handler's type (did it change since the message was applied?): {reason}")]
    StoredResultUnreadable {
        /// The consumer (dedup scope).
        consumer: Box<str>,
        /// The message's key.
        key: Box<str>,
        /// The deserializer's error.
        reason: Box<str>,
    },
    /// The inbox schema in the database is newer than this release of the
    /// library knows: a newer release migrated it. Nothing was changed;
    /// run the newer release (rolling back to an older binary is refused
    /// rather than risk misreading the table).
    #[error("the inbox schema in the database is version {found}, newer than the version {supported} this release of diesel-inbox knows; upgrade diesel-inbox (a newer release migrated this database)")]
    SchemaTooNew {
        /// The version recorded in the database.
        found: u32,
        /// The newest version this release knows ([`SCHEMA_VERSION`](crate::SCHEMA_VERSION)).
        supported: u32,
    },
    /// [`outbox::enqueue`](crate::outbox::enqueue) was called outside a
    /// transaction. An outbox row in a transaction of its own would be a
    /// plain publish: it must be written in the transaction of the change
    /// it announces (an `#[idempotent]` body, or your own
    /// `conn.transaction(..)`). Nothing was written.
    #[error("{operation} refused: it must run inside the transaction of the change it announces (an #[idempotent] body, or conn.transaction(..)); outside one, nothing would tie the message to the change")]
    NotInTransaction {
        /// The operation refused.
        operation: &'static str,
    },
    /// Another delivery of this key was still in flight (its claim not
    /// yet committed or rolled back) when the call's bound on waiting for
    /// it ran out: the body did not run and nothing was written. Only a
    /// call with a wait bound (the HTTP front door's
    /// `Idempotent::wait`) gets it, in place of the backend's lock
    /// timeout; retry later, when the first has finished (its value is
    /// then returned, or the body runs if it rolled back).
    #[error("message {key:?} of consumer {consumer:?} is still being handled by another call: waited {wait:?} for it to commit or roll back; the body did not run")]
    InFlight {
        /// The consumer (dedup scope).
        consumer: Box<str>,
        /// The message's key.
        key: Box<str>,
        /// How long the call waited.
        wait: std::time::Duration,
    },
    /// An outgoing message's destination, ordering key, id or header is
    /// not something the outbox can store or a broker can carry; nothing
    /// was written.
    #[error("invalid outgoing message: {0}")]
    InvalidOutgoing(Box<str>),
    /// The WAL outbox is on ([`outbox::set_wal`](crate::outbox::set_wal))
    /// but cannot take the message: the database is not PostgreSQL, or it
    /// has no usable replication slot for the WAL outbox (none was created
    /// with [`outbox::wal::create`](crate::outbox::wal::create), or the
    /// server invalidated it). Nothing was written: a message no relay
    /// could read is refused rather than lost.
    #[error("the WAL outbox cannot take this message: {0}")]
    NoWalOutbox(Box<str>),
    /// A guarded statement refused to run (PostgreSQL): another client's
    /// statement ran under the name of one of diesel-inbox's prepared
    /// statements, or one of diesel-inbox's ran with another client's
    /// parameters. A connection proxy in transaction mode (PgBouncer before
    /// 1.21) does this when diesel's statement cache is on: it moves
    /// clients between server sessions, and prepared statements with them.
    /// Nothing of the call was committed; the message is not acknowledged
    /// as applied, so the broker's redelivery runs it again.
    ///
    /// `refusal` is what the guard saw, as the server's log shows it after
    /// `diesel-inbox: ` (with the hint naming the fix).
    ///
    /// ```
    /// let refused = diesel_inbox::InboxError::StatementsSharedByProxy {
    ///     refusal: "this prepared statement is the inbox claim, run with the parameters of another statement".into(),
    /// };
    /// assert!(refused.to_string().starts_with("diesel-inbox refused a statement"));
    /// assert!(refused.to_string().contains("PgBouncer 1.21 or later with max_prepared_statements"));
    /// ```
    #[error(
        "diesel-inbox refused a statement that a connection proxy mixed up with another \
         client's ({refusal}); nothing of this call was committed. A proxy in transaction \
         mode (PgBouncer before 1.21) shares prepared statements between clients: use \
         session pooling, PgBouncer 1.21 or later with max_prepared_statements, or disable \
         diesel's statement cache (CacheSize::Disabled); see diesel_inbox::guide::proxies"
    )]
    StatementsSharedByProxy {
        /// What the guard saw.
        refusal: Box<str>,
    },
    /// A consumer runner over tenants (`run_tenants`) got a message that
    /// names no tenant, or one its tenant set does not have: it is
    /// dead-lettered, never applied in another tenant's database.
    ///
    /// ```
    /// let e = diesel_inbox::InboxError::UnknownTenant { tenant: Some("acme".into()) };
    /// assert!(e.to_string().starts_with("the message names tenant \"acme\", which the tenant set does not have"));
    /// ```
    #[error(
        "the message names {}, which the tenant set does not have; it is dead-lettered, never applied in another tenant's database",
        match .tenant { Some(t) => format!("tenant {t:?}"), None => "no tenant".to_owned() }
    )]
    UnknownTenant {
        /// The tenant it names (`None`: it names none).
        tenant: Option<Box<str>>,
    },
    /// A consumer runner over tenants could not have a connection of the
    /// message's tenant (its database is down or does not answer, or the
    /// connection limit across tenants stayed reached): the message is
    /// redelivered.
    #[error("tenant {tenant:?}: no database connection: {reason}; the message is redelivered")]
    TenantUnavailable {
        /// The message's tenant.
        tenant: Box<str>,
        /// Why.
        reason: Box<str>,
    },
    /// A consumer runner over tenants dropped a handler that had not
    /// finished within its `Consumer::tenant_timeout` (its tenant's
    /// database stopped answering, say) and closed its connection, so the
    /// server rolls back what it had open. The delivery failed
    /// transiently: the policy redelivers it. A COMMIT already sent may
    /// have committed; the redelivery is then a `Duplicate`.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let e = diesel_inbox::InboxError::TenantTimedOut { tenant: "acme".into(), after: Duration::from_secs(60) };
    /// assert!(e.to_string().starts_with("tenant \"acme\": the handler did not finish within 60s"));
    /// ```
    #[error("tenant {tenant:?}: the handler did not finish within {after:?} (does its database answer?); it was dropped and its connection closed, and the delivery failed transiently")]
    TenantTimedOut {
        /// The message's tenant.
        tenant: Box<str>,
        /// The time limit it ran into.
        after: std::time::Duration,
    },
}

impl From<diesel::result::Error> for InboxError {
    /// [`InboxError::Database`], but a guard's refusal, which is
    /// [`InboxError::StatementsSharedByProxy`].
    fn from(error: diesel::result::Error) -> Self {
        match crate::backend::errors::refusal(&error) {
            Some(refusal) => InboxError::StatementsSharedByProxy {
                refusal: refusal.into(),
            },
            None => InboxError::Database(error),
        }
    }
}

/// One reason an existing inbox table cannot be used, and how to fix it.
///
/// ```
/// use diesel_inbox::TableProblem;
///
/// let problem = TableProblem::new("the primary key is (message_id)", "make it (consumer, message_id)");
/// assert_eq!(problem.to_string(), "the primary key is (message_id); fix: make it (consumer, message_id)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableProblem {
    /// What is wrong, and what it would do to messages.
    pub problem: String,
    /// How to fix it.
    pub fix: String,
}

impl TableProblem {
    /// A problem and its fix.
    pub fn new(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        TableProblem {
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

impl fmt::Display for TableProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; fix: {}", self.problem, self.fix)
    }
}

struct IncompatibleTableMessage<'a>(&'a [TableProblem]);

impl fmt::Display for IncompatibleTableMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.len();
        write!(
            f,
            "the existing inbox_messages table cannot be used safely ({count} problem{}):",
            if count == 1 { "" } else { "s" }
        )?;
        for problem in self.0 {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

struct ConsumerConflictMessage<'a> {
    consumer: &'a str,
    handlers: &'a [&'static RegisteredHandler],
}

impl fmt::Display for ConsumerConflictMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "consumer `{}` is used by {} handlers: ",
            self.consumer,
            self.handlers.len()
        )?;
        for (n, handler) in self.handlers.iter().enumerate() {
            if n > 0 {
                f.write_str(", ")?;
            }
            write!(
                f,
                "`{}` ({}:{}{})",
                handler.function(),
                handler.file(),
                handler.line(),
                if handler.is_shared() { ", shared" } else { "" }
            )?;
        }
        f.write_str(
            "; each would skip the messages the others applied. Give each its own \
             `consumer = \"...\"`, or add `shared` to every one of them if they deliberately \
             deduplicate together",
        )
    }
}

fn privilege_hint(error: &diesel::result::Error) -> &'static str {
    if crate::backend::errors::is_privilege_error(error) {
        "; the role running migrate() needs to create and alter tables in the schema, \
         or run migrate() (or the DDL in diesel_inbox::ddl) once as a role that can"
    } else {
        ""
    }
}

impl From<InboxError> for diesel::result::Error {
    /// Database errors come back as they were; the inbox's own errors become
    /// [`QueryBuilderError`](diesel::result::Error::QueryBuilderError) holding
    /// the [`InboxError`] (downcast it to inspect it).
    fn from(err: InboxError) -> Self {
        match err {
            InboxError::Database(source) => source,
            other => diesel::result::Error::QueryBuilderError(Box::new(other)),
        }
    }
}
