//! The consumer runner over tenants: each message handled with a
//! connection of the tenant it names ([`Consumer::run_tenants`]).

use super::runner::{run, Ended, Pass, RunReport, Runner, Source};
use super::{BrokerError, Consumer, HasInboxError, Inbound, Message};
use crate::Outcome;
use futures_util::stream::Stream;
use std::future::Future;
use std::time::Duration;

impl<S, E> Consumer<S, E> {
    /// Where [`run_tenants`](Self::run_tenants) reads a message's tenant
    /// (default: its `x-tenant` header,
    /// [`TENANT_HEADER`](crate::tenants::TENANT_HEADER)); `None` for a
    /// message that names none.
    ///
    /// ```
    /// # #[cfg(all(feature = "lapin", feature = "postgres"))] {
    /// use diesel_inbox::brokers::{Message, Policy};
    /// use diesel_inbox::lapin::Consumer;
    ///
    /// // The tenant is the first part of the routing key's message id: "acme:order-7".
    /// let consumer = Consumer::connect("amqp://localhost:5672/%2f", "orders", Policy::new(|_: &diesel_inbox::InboxError| false))
    ///     .tenant_by(|m: &Message<'_>| m.id().split_once(':').map(|(tenant, _)| tenant.to_owned()));
    /// # let _ = consumer;
    /// # }
    /// ```
    pub fn tenant_by(
        mut self,
        tenant_of: impl Fn(&Message<'_>) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.runner.tenant_of = Some(Box::new(tenant_of));
        self
    }

    /// How long [`run_tenants`](Self::run_tenants) lets a handler run on
    /// its tenant's connection (default 60 s; at least 1 ms; the checkout
    /// before it is bounded by the set's
    /// [`checkout_timeout`](crate::tenants::Tenants::checkout_timeout)). A
    /// handler still running then (its tenant's database stopped
    /// answering mid-statement, say) is dropped and its connection closed,
    /// not given back to the pool, so the server rolls back what it had
    /// open; the delivery fails transiently
    /// ([`InboxError::TenantTimedOut`](crate::InboxError::TenantTimedOut))
    /// and the policy settles it (redelivered with its backoff). A COMMIT
    /// already sent may have committed: the redelivery is then a
    /// `Duplicate`, applied once. Set it above the longest a handler may
    /// take, and on NATS below the consumer's `ack_wait` (JetStream
    /// delivers a message again after it, while the first delivery still
    /// runs). On SQLite a statement under way cannot be interrupted: the
    /// drop waits for it.
    ///
    /// ```
    /// # #[cfg(all(feature = "lapin", feature = "postgres"))] {
    /// use diesel_inbox::brokers::Policy;
    /// use diesel_inbox::lapin::Consumer;
    /// use std::time::Duration;
    ///
    /// let consumer = Consumer::connect("amqp://localhost:5672/%2f", "orders", Policy::new(|_: &diesel_inbox::InboxError| false))
    ///     .tenant_timeout(Duration::from_secs(20));
    /// # let _ = consumer;
    /// # }
    /// ```
    pub fn tenant_timeout(mut self, timeout: Duration) -> Self {
        self.runner.tenant_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Consumes as [`run`](Self::run) does, each message in its tenant's
    /// database: the handler gets a connection of the tenant the message
    /// names (its `x-tenant` header, or [`tenant_by`](Self::tenant_by)),
    /// from `tenants`, and the message. An `#[idempotent]` handler's inbox
    /// row, business rows and outbox rows all land there, in one
    /// transaction.
    ///
    /// - A message that names no tenant, or one `tenants` does not have, is
    ///   dead-lettered ([`InboxError::UnknownTenant`](crate::InboxError::UnknownTenant)),
    ///   never applied anywhere else. A set read from a source
    ///   ([`Tenants::from_fn`](crate::tenants::Tenants::from_fn)) is read
    ///   again first: a tenant added there since is found, not
    ///   dead-lettered (and a source that cannot be read makes the message
    ///   wait, as below).
    /// - A tenant whose database gives no connection (down, stalled, or
    ///   the connection limit across tenants reached for the set's
    ///   checkout timeout) fails the delivery transiently
    ///   ([`InboxError::TenantUnavailable`](crate::InboxError::TenantUnavailable)):
    ///   it is redelivered with the policy's backoff.
    /// - On Kafka, each tenant's database keeps the partition's position
    ///   after that tenant's last message: a zombie is refused where a
    ///   newer owner has moved its tenant's position past its message, and
    ///   its message is otherwise a `Duplicate` of the inbox row. A stored
    ///   position behind the group's offset is no sign of a gap here (one
    ///   tenant's messages are not contiguous in a partition), so the
    ///   consumer must have `auto.offset.reset` = `earliest`
    ///   ([`BrokerError::Config`] otherwise): offsets that expired while
    ///   the group was down then replay duplicates instead of skipping. An
    ///   operator's reset of the offsets forward skips, as asked; a
    ///   database restored from a backup is not replayed.
    /// - A handler that runs longer than
    ///   [`tenant_timeout`](Self::tenant_timeout) (default 60 s) is
    ///   dropped, its connection closed (the server rolls back), and the
    ///   delivery fails transiently
    ///   ([`InboxError::TenantTimedOut`](crate::InboxError::TenantTimedOut)).
    ///
    /// ```no_run
    /// # #[cfg(all(feature = "lapin", feature = "postgres"))]
    /// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel_async::pooled_connection::deadpool::Pool;
    /// use diesel_async::AsyncPgConnection;
    /// use diesel_inbox::brokers::{Message, Policy};
    /// use diesel_inbox::tenants::Tenants;
    /// use diesel_inbox::{lapin::Consumer, InboxError, Processed};
    ///
    /// let tenants: Tenants<Pool<AsyncPgConnection>> =
    ///     Tenants::list([("acme", "postgres://app@db1/acme"), ("globex", "postgres://app@db2/globex")]);
    /// let consumer = Consumer::connect("amqp://localhost:5672/%2f", "orders", Policy::new(|_: &InboxError| false));
    /// consumer
    ///     .run_tenants(&tenants, async |conn: &mut AsyncPgConnection, m: &Message<'_>| {
    ///         // ... the business rows, in the tenant's database ...
    ///         diesel_inbox::Inbox::consumer("orders")
    ///             .run_async(conn, m.id(), async |_conn| Ok::<_, InboxError>(()))
    ///             .await
    ///     }, async { tokio::signal::ctrl_c().await.ok(); })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_tenants<T, O, F>(
        mut self,
        tenants: &crate::tenants::Tenants<T>,
        handler: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RunReport, BrokerError>
    where
        S: Source,
        O: Outcome,
        E: HasInboxError + From<crate::InboxError> + std::fmt::Debug,
        T: crate::tenants::TenantPool,
        T::Guard: 'static,
        F: AsyncFn(&mut T::Connection, &Message<'_>) -> Result<O, E>,
    {
        // One message at a time, as `run` (`batch` is `run_batch`'s).
        self.runner.batch = None;
        self.source.routing();
        self.drive(
            &Routed {
                tenants,
                handler,
                outcome: std::marker::PhantomData,
            },
            shutdown,
        )
        .await
    }
}

/// `run_tenants`'s pass: each delivery through [`handle`] with a
/// connection of its tenant, `in_flight` at once.
struct Routed<'t, T: crate::tenants::TenantPool, F, O> {
    tenants: &'t crate::tenants::Tenants<T>,
    handler: F,
    outcome: std::marker::PhantomData<fn() -> O>,
}

impl<M, E, O, F, T> Pass<M, E> for Routed<'_, T, F, O>
where
    M: Inbound,
    O: Outcome,
    E: HasInboxError + From<crate::InboxError> + std::fmt::Debug,
    T: crate::tenants::TenantPool,
    T::Guard: 'static,
    F: AsyncFn(&mut T::Connection, &Message<'_>) -> Result<O, E>,
{
    async fn pass<D>(
        &self,
        runner: &Runner<E>,
        consumer: &str,
        report: &mut RunReport,
        deliveries: D,
        shutdown: impl Future<Output = ()>,
    ) -> (Ended, D)
    where
        D: Stream<Item = Result<M, BrokerError>> + Unpin,
    {
        let (tenant_of, timeout) = (runner.tenant_of.as_deref(), runner.tenant_timeout);
        let handler = async |m: &Message<'_>| -> Result<O, E> {
            let name = crate::tenants::tenant_named(tenant_of, m)?;
            // The handler's metrics and span carry the tenant.
            inbox_runtime::__facade::for_tenant(name.clone(), async {
                // Bounded by the set's checkout timeout.
                let mut conn = crate::tenants::connection_named(self.tenants, &name).await?;
                match tokio::time::timeout(timeout, (self.handler)(&mut *conn, m)).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        // Dropped mid-way: the connection is closed, not
                        // given back (the server rolls back what it had
                        // open, and no later delivery reads an answer
                        // meant for this one).
                        conn.discard();
                        Err(crate::InboxError::TenantTimedOut {
                            tenant: name.as_ref().into(),
                            after: timeout,
                        }
                        .into())
                    }
                }
            })
            .await
        };
        run(runner, consumer, report, deliveries, handler, shutdown).await
    }
}
