//! Real rows, made by the library on each backend: consumers that applied
//! messages, a handler with `max_attempts` that gave up on one key and is
//! failing on another, an HTTP idempotency key, an outbox with dead
//! (refused by the publisher), scheduled and pending messages, and on
//! PostgreSQL a Kafka stream position.

use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::PoolableConnection;
use diesel_inbox::outbox::{
    self, OutboxMessage, Outgoing, Publish, PublishError, Relay, RelayPool,
};
use diesel_inbox::{AsyncInboxConnection, Inbox, InboxError};
use std::time::Duration;

/// The names of one backend's run: unique, so that nothing else in the
/// database is taken for them.
pub struct Names {
    pub billing: String,
    /// The consumer whose handler enqueues the outbox's messages.
    pub orders: String,
    pub import: String,
    pub endpoint: String,
    /// The destination whose messages the publisher refuses (dead).
    pub dead: String,
    pub later: String,
    pub pending: String,
    /// The dead message whose payload is a script.
    pub script_id: String,
    /// The dead message whose payload is binary.
    pub binary_id: String,
    /// The destination of the failure groups' dead messages.
    pub grouped: String,
}

/// The hostile payload: shown as text, never run.
pub const SCRIPT: &str =
    "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">";

/// The failing handler's `max_attempts`.
pub const MAX_ATTEMPTS: u32 = 3;

impl Names {
    pub fn new(backend: &str) -> Names {
        let stamp = crate::support::run_stamp();
        let name = |what: &str| format!("console-{backend}-{what}-{stamp}");
        Names {
            billing: name("billing"),
            orders: name("orders"),
            import: name("import"),
            endpoint: name("pay"),
            dead: name("dead"),
            later: name("later"),
            pending: name("pending"),
            script_id: name("script-msg"),
            binary_id: name("binary-msg"),
            grouped: name("grouped"),
        }
    }
}

/// Refuses every message to one destination (the broker's refusal, as a
/// publisher of your own reports it); publishes the rest nowhere.
pub struct Refusing(pub String);

impl Publish for Refusing {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        messages
            .iter()
            .map(|m| {
                if m.destination == self.0 {
                    Err(PublishError::refused(format!(
                        "<b>refused</b>: no route for {}",
                        m.destination
                    )))
                } else {
                    Ok(())
                }
            })
            .collect()
    }
}

/// The failing handler's error (its `Debug` is the stored last error).
#[derive(Debug)]
#[allow(dead_code)] // read through Debug
pub enum Upstream {
    Said(&'static str),
    Inbox(InboxError),
    Db(diesel::result::Error),
}

impl From<diesel::result::Error> for Upstream {
    fn from(e: diesel::result::Error) -> Self {
        Upstream::Db(e)
    }
}

impl From<InboxError> for Upstream {
    fn from(e: InboxError) -> Self {
        Upstream::Inbox(e)
    }
}

/// Applies `n` messages of `consumer` (keys `k-1` ...).
pub async fn apply<C>(
    pool: &Pool<C>,
    consumer: &str,
    keys: std::ops::Range<u32>,
) -> Result<(), String>
where
    C: AsyncInboxConnection + PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    for i in keys {
        let applied: Result<_, InboxError> = Inbox::consumer(consumer)
            .run_async(&mut *conn, &format!("k-{i}"), async |_conn: &mut C| Ok(()))
            .await;
        if applied.map_err(|e| format!("apply k-{i}: {e}"))? != diesel_inbox::Processed::Applied(())
        {
            return Err(format!("{consumer} k-{i} was not applied"));
        }
    }
    Ok(())
}

/// Everything but the Kafka position; the dead messages through a relay
/// of `publisher` that refuses the `dead` destination.
pub async fn produce<C, P>(pool: &Pool<C>, names: &Names, publisher: P) -> Result<(), String>
where
    C: AsyncInboxConnection + PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
    Pool<C>: RelayPool + Clone,
    P: Publish + 'static,
{
    apply(pool, &names.billing, 1..6).await?;
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    // One key given up on (MAX_ATTEMPTS failures), one failing once.
    let import = Inbox::consumer(&names.import).max_attempts(MAX_ATTEMPTS);
    for (key, failures) in [("k-bad", MAX_ATTEMPTS), ("k-flaky", 1)] {
        for _ in 0..failures {
            let failed: Result<_, Upstream> = import
                .run_async(&mut *conn, key, async |_conn: &mut C| {
                    Err::<(), _>(Upstream::Said("<i>upstream</i> said no"))
                })
                .await;
            if failed.is_ok() {
                return Err(format!("{key}: a failing body was applied"));
            }
        }
    }
    // An HTTP idempotency key.
    let key = diesel_inbox::http::IdempotencyKey::parse("order-77").map_err(|e| e.to_string())?;
    let response = diesel_inbox::http::Idempotent::new(&names.endpoint, "user-1", &key)
        .run_async(&mut *conn, async |_conn: &mut C| {
            Ok::<_, InboxError>((axum::http::StatusCode::CREATED, "created"))
        })
        .await
        .map_err(|e| e.to_string())?;
    if response.status() != axum::http::StatusCode::CREATED {
        return Err(format!(
            "the HTTP key's request answered {}",
            response.status()
        ));
    }
    // Two messages the relay's publisher refuses: dead after one attempt.
    drop(conn);
    enqueue(
        pool,
        &names.orders,
        "o-1",
        vec![
            Outgoing::new(&names.dead, SCRIPT.as_bytes().to_vec())
                .id(&names.script_id)
                .header("x-tenant", "<b>acme</b>")
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                ),
            Outgoing::new(&names.dead, vec![0u8, 159, 146, 150, 255]).id(&names.binary_id),
        ],
    )
    .await?;
    let relay = Relay::new(pool.clone(), publisher).max_publish_attempts(1);
    let report = relay.run_once().await.map_err(|e| e.to_string())?;
    if report.dead != 2 {
        return Err(format!("the relay's pass: {report:?}, not 2 dead"));
    }
    // Then one scheduled in an hour, two pending (no relay runs now).
    enqueue(
        pool,
        &names.orders,
        "o-2",
        vec![
            Outgoing::new(&names.later, b"later".to_vec()).deliver_after(Duration::from_secs(3600)),
            Outgoing::new(&names.pending, b"pending 1".to_vec()),
            Outgoing::new(&names.pending, b"pending 2".to_vec()),
        ],
    )
    .await
}

/// Refuses every message to one destination with the error its payload
/// says.
struct RefusesAsTold(String);

impl Publish for RefusesAsTold {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        messages
            .iter()
            .map(|m| match m.destination == self.0 {
                true => Err(PublishError::refused(
                    String::from_utf8_lossy(&m.payload).into_owned(),
                )),
                false => Ok(()),
            })
            .collect()
    }
}

/// The failures the failure groups' scenario makes dead (to
/// `names.grouped`): three timeouts that differ by numbers, one hostile.
pub const GROUPED_ERRORS: [&str; 4] = [
    "timeout after 3s on 10.0.0.7:9092",
    "timeout after 12s on 10.0.0.9:9092",
    "timeout after 5s on 10.0.0.7:9093",
    "<i>quota</i> exceeded",
];

/// Dead messages to `names.grouped`, one per [`GROUPED_ERRORS`].
pub async fn grouped_dead<C>(pool: &Pool<C>, names: &Names) -> Result<(), String>
where
    C: AsyncInboxConnection + PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
    Pool<C>: RelayPool + Clone,
{
    let messages = GROUPED_ERRORS
        .iter()
        .map(|error| Outgoing::new(&names.grouped, error.as_bytes().to_vec()))
        .collect();
    enqueue(pool, &names.orders, "o-groups", messages).await?;
    let relay =
        Relay::new(pool.clone(), RefusesAsTold(names.grouped.clone())).max_publish_attempts(1);
    let report = relay.run_once().await.map_err(|e| e.to_string())?;
    if report.dead != 4 {
        return Err(format!("the relay's pass: {report:?}, not 4 dead"));
    }
    Ok(())
}

/// A handler of `consumer` that applies `key` and enqueues `messages` in
/// its transaction.
async fn enqueue<C>(
    pool: &Pool<C>,
    consumer: &str,
    key: &str,
    messages: Vec<Outgoing>,
) -> Result<(), String>
where
    C: AsyncInboxConnection + PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let applied: Result<_, InboxError> = Inbox::consumer(consumer)
        .run_async(&mut *conn, key, async |conn: &mut C| {
            for message in messages.clone() {
                outbox::enqueue_async(&mut *conn, message).await?;
            }
            Ok(())
        })
        .await;
    match applied.map_err(|e| format!("{consumer} {key}: {e}"))? {
        diesel_inbox::Processed::Applied(()) => Ok(()),
        other => Err(format!("{consumer} {key}: {other:?}")),
    }
}

/// A Kafka stream position of `consumer`: one record produced to a new
/// topic and applied by the Kafka runner, which writes the position in
/// the handler's transaction; then one more record, not consumed (a lag
/// of 1).
#[cfg(feature = "kafka")]
pub async fn kafka_position(
    pool: &Pool<diesel_async::AsyncPgConnection>,
    brokers: &str,
    consumer: &str,
    topic: &str,
) -> Result<(), String> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::consumer::{Consumer as _, StreamConsumer};
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::ClientConfig;

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| e.to_string())?;
    for created in admin
        .create_topics(
            &[NewTopic::new(topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| e.to_string())?
    {
        created.map_err(|(topic, e)| format!("creating {topic}: {e}"))?;
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| e.to_string())?;
    producer
        .send(
            FutureRecord::to(topic).key("k").payload("shipped").headers(
                OwnedHeaders::new().insert(Header {
                    key: "message-id",
                    value: Some("ship-1"),
                }),
            ),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e.to_string())?;
    let kafka: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", consumer)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .map_err(|e| e.to_string())?;
    kafka.subscribe(&[topic]).map_err(|e| e.to_string())?;
    let policy = diesel_inbox::brokers::Policy::new(|_: &crate::support::AppError| false);
    let report = diesel_inbox::kafka::Consumer::new(kafka, policy)
        .exit_when_idle(Duration::from_secs(2))
        .run(
            async |id: &str, _body: &[u8]| {
                let mut conn = pool
                    .get()
                    .await
                    .map_err(|e| crate::support::AppError::Pool(e.to_string()))?;
                Inbox::consumer(consumer)
                    .run_async(
                        &mut *conn,
                        id,
                        async |_conn: &mut diesel_async::AsyncPgConnection| {
                            Ok::<_, crate::support::AppError>(())
                        },
                    )
                    .await
            },
            tokio::time::sleep(Duration::from_secs(90)),
        )
        .await
        .map_err(|e| e.to_string())?;
    if report.acked != 1 {
        return Err(format!("the Kafka runner: {report:?}, not 1 acked"));
    }
    // One more, not consumed: a lag of 1.
    producer
        .send(
            FutureRecord::to(topic).key("k").payload("later"),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e.to_string())?;
    Ok(())
}
