//! Trace context end to end (feature `otel`), on the real brokers
//! (`INBOX_TEST_AMQP_URL`, `INBOX_TEST_NATS_URL`, and with the feature
//! `kafka` `INBOX_TEST_KAFKA_BROKERS`; a test without its broker
//! says so and returns): service A enqueues in a request's span, the relay
//! publishes, the broker carries the headers, service B's consumer runner
//! handles the message. Spans go to OpenTelemetry's in-memory exporter
//! through `tracing-opentelemetry`; the propagator is the W3C trace context
//! with baggage, installed globally as an application would.
#![cfg(all(
    feature = "otel",
    feature = "sqlite",
    feature = "lapin",
    feature = "nats"
))]
#![deny(warnings, clippy::all)]

mod common;
mod support;

use common::backend::TestBackend;
use common::backends::sqlite::Sqlite;
use diesel::prelude::*;
use diesel_inbox::brokers::Policy;
use diesel_inbox::outbox::{self, Outgoing, Relay};
use diesel_inbox::{Inbox, InboxError, Processed};
use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::TextMapCompositePropagator;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::{InMemorySpanExporter, Sampler, SdkTracerProvider, SpanData};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing_opentelemetry::OpenTelemetrySpanExt;

fn runtime() -> &'static tokio::runtime::Runtime {
    common::modes::runtime()
}

fn env(var: &str) -> Option<String> {
    common::server_var(var)
}

/// The process's tracing: a `tracing-opentelemetry` layer on a tracer
/// provider that samples what its parent sampled (roots: always), spans
/// kept in memory; the global propagator writes `traceparent`,
/// `tracestate` and `baggage`.
struct Telemetry {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
}

fn telemetry() -> &'static Telemetry {
    static ONCE: OnceLock<Telemetry> = OnceLock::new();
    ONCE.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-test"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("the only subscriber of this binary");
        opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(BaggagePropagator::new()),
        ]));
        Telemetry { exporter, provider }
    })
}

impl Telemetry {
    /// The spans ended so far.
    fn spans(&self) -> Vec<SpanData> {
        let _ = self.provider.force_flush();
        self.exporter
            .get_finished_spans()
            .expect("the exported spans")
    }
}

/// What service B's handler saw of its own span.
#[derive(Debug, Clone)]
struct Seen {
    trace_id: TraceId,
    span_id: SpanId,
    sampled: bool,
    tenant: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Broker {
    Rabbit,
    Nats,
    #[cfg(feature = "kafka")]
    Kafka,
}

/// The broker's side of a run: what the relay and the runner need.
enum Side {
    Rabbit,
    Nats(Box<async_nats::jetstream::Context>),
    #[cfg(feature = "kafka")]
    Kafka,
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &str) -> Option<String> {
    attribute(span, key).map(|v| v.as_str().into_owned())
}

/// The span of `kind` whose `messaging.message.id` is `id`.
fn messaging_span<'a>(spans: &'a [SpanData], kind: SpanKind, id: &str) -> &'a SpanData {
    let found: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.span_kind == kind && text(s, "messaging.message.id").as_deref() == Some(id))
        .collect();
    assert_eq!(found.len(), 1, "one {kind:?} span for {id}: {found:#?}");
    found[0]
}

/// The headers as the outbox stores them: each name and value as a
/// 4-byte little-endian length and its bytes.
fn decode_headers(mut rest: &[u8]) -> Vec<(String, String)> {
    let mut parts = Vec::new();
    while !rest.is_empty() {
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        parts.push(String::from_utf8(rest[4..4 + len].to_vec()).expect("UTF-8"));
        rest = &rest[4 + len..];
    }
    parts
        .chunks(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect()
}

/// A trace id no other run uses.
fn fresh_trace_id() -> TraceId {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos();
    TraceId::from(nanos ^ (u128::from(std::process::id()) << 96))
}

/// A→relay→broker→B with four messages: a sampled request, an unsampled
/// one, one with baggage, one whose `traceparent` (set by hand) is broken.
fn end_to_end(broker: Broker) {
    let url = match broker {
        Broker::Rabbit => env("INBOX_TEST_AMQP_URL"),
        Broker::Nats => env("INBOX_TEST_NATS_URL"),
        #[cfg(feature = "kafka")]
        Broker::Kafka => env("INBOX_TEST_KAFKA_BROKERS"),
    };
    let Some(url) = url else { return };
    let telemetry = telemetry();
    let name = format!("{broker:?}").to_lowercase();
    let (Some(a), Some(b)) = (
        Sqlite::fresh(&format!("otel_a_{name}")),
        Sqlite::fresh(&format!("otel_b_{name}")),
    ) else {
        return;
    };
    diesel_inbox::migrate(&mut Sqlite::open(&a)).expect("migrate A");
    diesel_inbox::migrate(&mut Sqlite::open(&b)).expect("migrate B");
    let run = common::unique_identifier(&format!("otel_{name}"));
    let destination = match broker {
        Broker::Nats => format!("otel.{run}"),
        _ => run.clone(),
    };
    let id = |what: &str| format!("{what}-{run}");

    // Service A: four requests, each enqueuing in its own transaction.
    let mut conn = Sqlite::open(&a);
    let mut enqueue = |span: tracing::Span, message: Outgoing| {
        let _entered = span.enter();
        conn.transaction(|conn| outbox::enqueue(conn, message))
            .expect("enqueued");
    };
    let sampled = tracing::info_span!("POST /orders", otel.kind = "server");
    let sampled_trace = sampled.context().span().span_context().trace_id();
    let sampled_span = sampled.context().span().span_context().span_id();
    enqueue(
        sampled.clone(),
        Outgoing::new(destination.as_str(), "sampled").id(id("sampled")),
    );
    drop(sampled);

    let unsampled_trace = fresh_trace_id();
    let unsampled = tracing::info_span!("POST /unsampled", otel.kind = "server");
    let _ = unsampled.set_parent(Context::new().with_remote_span_context(SpanContext::new(
        unsampled_trace,
        SpanId::from(7u64),
        TraceFlags::default(),
        true,
        TraceState::default(),
    )));
    enqueue(
        unsampled,
        Outgoing::new(destination.as_str(), "unsampled").id(id("unsampled")),
    );

    let with_baggage = tracing::info_span!("POST /tenant", otel.kind = "server");
    let _ =
        with_baggage.set_parent(Context::new().with_baggage(vec![KeyValue::new("tenant", "t-9")]));
    let baggage_trace = with_baggage.context().span().span_context().trace_id();
    enqueue(
        with_baggage,
        Outgoing::new(destination.as_str(), "baggage").id(id("baggage")),
    );

    let broken = tracing::info_span!("POST /broken", otel.kind = "server");
    let broken_trace = broken.context().span().span_context().trace_id();
    enqueue(
        broken,
        Outgoing::new(destination.as_str(), "broken")
            .id(id("broken"))
            .header("traceparent", "00-not-a-trace-01"),
    );

    // The rows hold the context of their enqueue: sampled or not, with
    // baggage; the broken header the user set is kept as it is.
    use diesel_inbox::outbox_messages::dsl as rows;
    let stored: HashMap<String, Vec<(String, String)>> = rows::outbox_messages
        .select((rows::id, rows::headers))
        .load::<(String, Option<Vec<u8>>)>(&mut conn)
        .expect("the outbox rows")
        .into_iter()
        .map(|(id, headers)| (id, decode_headers(&headers.unwrap_or_default())))
        .collect();
    let header = |message: &str, name: &str| {
        stored[&id(message)]
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let parent = header("sampled", "traceparent").expect("a traceparent at enqueue");
    assert_eq!(parent, format!("00-{sampled_trace}-{sampled_span}-01"));
    let unsampled_parent = header("unsampled", "traceparent").expect("unsampled: still written");
    assert!(
        unsampled_parent.starts_with(&format!("00-{unsampled_trace}-"))
            && unsampled_parent.ends_with("-00"),
        "{unsampled_parent}"
    );
    assert_eq!(header("baggage", "baggage").as_deref(), Some("tenant=t-9"));
    assert_eq!(
        header("broken", "traceparent").as_deref(),
        Some("00-not-a-trace-01")
    );
    drop(conn);

    let seen: Mutex<HashMap<String, Seen>> = Mutex::new(HashMap::new());
    runtime().block_on(async {
        // The broker's side of the destination.
        let side = match broker {
            Broker::Rabbit => {
                common::rabbit_queue(&url, &destination).await;
                Side::Rabbit
            }
            Broker::Nats => {
                let client = async_nats::connect(&url).await.expect("connect to NATS");
                let js = async_nats::jetstream::new(client);
                let stream = js
                    .create_stream(async_nats::jetstream::stream::Config {
                        name: run.clone(),
                        subjects: vec![destination.clone()],
                        ..Default::default()
                    })
                    .await
                    .expect("create the stream");
                stream
                    .create_consumer(async_nats::jetstream::consumer::pull::Config {
                        durable_name: Some("service-b".into()),
                        ..Default::default()
                    })
                    .await
                    .expect("create the consumer");
                Side::Nats(Box::new(js))
            }
            #[cfg(feature = "kafka")]
            Broker::Kafka => {
                use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
                let admin: AdminClient<rdkafka::client::DefaultClientContext> =
                    rdkafka::ClientConfig::new()
                        .set("bootstrap.servers", &url)
                        .create()
                        .expect("a Kafka admin client");
                let created = admin
                    .create_topics(
                        &[NewTopic::new(&destination, 1, TopicReplication::Fixed(1))],
                        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
                    )
                    .await
                    .expect("create the topic");
                for result in created {
                    result.expect("the topic");
                }
                Side::Kafka
            }
        };

        // The relay, in service A.
        let pool = Sqlite::pool(&a);
        let report = match &side {
            Side::Rabbit => {
                Relay::new(pool, outbox::lapin::Publisher::connect(url.clone(), ""))
                    .run_once()
                    .await
            }
            Side::Nats(js) => {
                Relay::new(pool, outbox::nats::Publisher::new((**js).clone()))
                    .run_once()
                    .await
            }
            #[cfg(feature = "kafka")]
            Side::Kafka => {
                let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", &url)
                    .set("enable.idempotence", "true")
                    .create()
                    .expect("a Kafka producer");
                Relay::new(pool, outbox::kafka::Publisher::new(producer))
                    .run_once()
                    .await
            }
        }
        .expect("the relay");
        assert_eq!(report.published, 4, "{report:?}");

        // Service B: a consumer runner whose handler records its span.
        let pool = Sqlite::pool(&b);
        let handler = async |id: &str, _body: &[u8]| {
            let cx = tracing::Span::current().context();
            let span = cx.span().span_context().clone();
            seen.lock().expect("not poisoned").insert(
                id.to_owned(),
                Seen {
                    trace_id: span.trace_id(),
                    span_id: span.span_id(),
                    sampled: span.is_sampled(),
                    tenant: cx.baggage().get("tenant").map(|v| v.to_string()),
                },
            );
            let mut conn = Sqlite::pooled(&pool).await;
            Inbox::consumer("service-b")
                .run_async(&mut *conn, id, async |_conn| Ok::<_, InboxError>(()))
                .await
        };
        let policy = || Policy::new(|_: &InboxError| false);
        let quiet = Duration::from_millis(500);
        let ran = tokio::time::timeout(Duration::from_secs(60), async {
            match side {
                Side::Rabbit => {
                    diesel_inbox::lapin::Consumer::connect(
                        url.clone(),
                        destination.clone(),
                        policy(),
                    )
                    .exit_when_idle(quiet)
                    .run(handler, std::future::pending())
                    .await
                }
                Side::Nats(js) => {
                    let consumer = js
                        .get_stream(run.as_str())
                        .await
                        .expect("the stream")
                        .get_consumer("service-b")
                        .await
                        .expect("the consumer");
                    let ran = diesel_inbox::nats::Consumer::new(consumer, policy())
                        .exit_when_idle(quiet)
                        .run(handler, std::future::pending())
                        .await;
                    js.delete_stream(run.as_str())
                        .await
                        .expect("delete the stream");
                    ran
                }
                #[cfg(feature = "kafka")]
                Side::Kafka => {
                    use rdkafka::consumer::Consumer as _;
                    let consumer: rdkafka::consumer::StreamConsumer = rdkafka::ClientConfig::new()
                        .set("bootstrap.servers", &url)
                        .set("group.id", &run)
                        .set("session.timeout.ms", "6000")
                        .set("heartbeat.interval.ms", "1000")
                        .set("enable.auto.commit", "false")
                        .set("enable.auto.offset.store", "false")
                        .set("auto.offset.reset", "earliest")
                        .create()
                        .expect("a Kafka consumer");
                    consumer
                        .subscribe(&[destination.as_str()])
                        .expect("subscribe");
                    // The group assigns the partition after a join: the
                    // runner does not count the wait as idle.
                    diesel_inbox::kafka::Consumer::new(consumer, policy())
                        .exit_when_idle(quiet)
                        .run(handler, std::future::pending())
                        .await
                }
            }
        })
        .await
        .expect("the runner drained the destination")
        .expect("the runner");
        assert_eq!(ran.acked, 4, "{ran:?}");
    });

    // Each message was applied once by B's inbox: a redelivery is a
    // duplicate.
    let mut conn = Sqlite::open(&b);
    for message in ["sampled", "unsampled", "baggage", "broken"] {
        let again = Inbox::consumer("service-b")
            .run(&mut conn, &id(message), |_| Ok::<_, InboxError>(()))
            .expect("the inbox");
        assert_eq!(again, Processed::Duplicate, "{message}");
    }

    let seen = seen.into_inner().expect("not poisoned");
    let spans = telemetry.spans();
    let system = match broker {
        Broker::Rabbit => "rabbitmq",
        Broker::Nats => "nats",
        #[cfg(feature = "kafka")]
        Broker::Kafka => "kafka",
    };

    // Sampled: one trace from the request through the relay's producer
    // span to B's consumer span, in which B's handler ran.
    let send = messaging_span(&spans, SpanKind::Producer, &id("sampled"));
    let process = messaging_span(&spans, SpanKind::Consumer, &id("sampled"));
    assert_eq!(send.span_context.trace_id(), sampled_trace);
    assert_eq!(send.parent_span_id, sampled_span);
    assert_eq!(process.span_context.trace_id(), sampled_trace);
    assert_eq!(process.parent_span_id, send.span_context.span_id());
    assert!(process.parent_span_is_remote);
    let handler = &seen[&id("sampled")];
    assert_eq!(
        (handler.trace_id, handler.span_id, handler.sampled),
        (sampled_trace, process.span_context.span_id(), true)
    );
    // The same destination at both ends, as the messaging conventions name
    // it: on RabbitMQ the exchange (here the default one, "", so the span
    // is named after the operation alone) and the routing key apart.
    let (name, routing_key) = match broker {
        Broker::Rabbit => ("", Some(destination.as_str())),
        _ => (destination.as_str(), None),
    };
    for (span, operation) in [(send, "send"), (process, "process")] {
        assert_eq!(text(span, "messaging.system").as_deref(), Some(system));
        assert_eq!(
            text(span, "messaging.destination.name").as_deref(),
            Some(name)
        );
        assert_eq!(
            text(span, "messaging.rabbitmq.destination.routing_key").as_deref(),
            routing_key
        );
        assert_eq!(
            text(span, "messaging.operation.type").as_deref(),
            Some(operation)
        );
        let expected = match name {
            "" => operation.to_owned(),
            name => format!("{operation} {name}"),
        };
        assert_eq!(span.name, expected);
    }
    let group = match broker {
        Broker::Rabbit => destination.clone(),
        Broker::Nats => "service-b".to_owned(),
        #[cfg(feature = "kafka")]
        Broker::Kafka => run.clone(),
    };
    assert_eq!(text(process, "messaging.consumer.group.name"), Some(group));
    // The relay's batch span is linked from the producer span.
    assert_eq!(send.links.links.len(), 1, "{send:#?}");
    let batch = spans
        .iter()
        .find(|s| s.span_context == send.links.links[0].span_context)
        .expect("the linked batch span");
    assert_eq!(batch.name, "diesel_inbox.outbox.publish");

    // Unsampled: nothing exported, but the context travelled: B's handler
    // ran in the same (unsampled) trace.
    assert!(
        spans
            .iter()
            .all(|s| s.span_context.trace_id() != unsampled_trace),
        "an unsampled trace was exported"
    );
    let handler = &seen[&id("unsampled")];
    assert_eq!(
        (handler.trace_id, handler.sampled),
        (unsampled_trace, false)
    );

    // Baggage: it reaches B's handler.
    let handler = &seen[&id("baggage")];
    assert_eq!(handler.tenant.as_deref(), Some("t-9"));
    assert_eq!(handler.trace_id, baggage_trace);
    assert!(seen[&id("sampled")].tenant.is_none());

    // A broken stored context: the message went out in the relay's batch
    // trace (the producer span the child of the batch span), and B
    // continued that trace.
    let send = messaging_span(&spans, SpanKind::Producer, &id("broken"));
    let process = messaging_span(&spans, SpanKind::Consumer, &id("broken"));
    let batch = spans
        .iter()
        .find(|s| s.span_context.span_id() == send.parent_span_id)
        .expect("the producer span's parent");
    assert_eq!(batch.name, "diesel_inbox.outbox.publish");
    assert_eq!(send.span_context.trace_id(), batch.span_context.trace_id());
    assert_ne!(send.span_context.trace_id(), broken_trace);
    assert_eq!(
        process.span_context.trace_id(),
        send.span_context.trace_id()
    );
    assert_eq!(process.parent_span_id, send.span_context.span_id());
    assert_eq!(seen[&id("broken")].trace_id, send.span_context.trace_id());
}

#[test]
fn one_trace_from_the_request_through_the_relay_and_rabbitmq_to_the_consumer() {
    end_to_end(Broker::Rabbit);
}

#[test]
fn one_trace_from_the_request_through_the_relay_and_nats_to_the_consumer() {
    end_to_end(Broker::Nats);
}

#[cfg(feature = "kafka")]
#[test]
fn one_trace_from_the_request_through_the_relay_and_kafka_to_the_consumer() {
    end_to_end(Broker::Kafka);
}

/// A subscriber whose filter drops the library's spans (target
/// `diesel_inbox`): the relay forwards the stored context as it is, and
/// the handler's own spans still continue the request's trace.
#[test]
fn a_filter_that_drops_the_librarys_spans_still_continues_the_trace_in_the_handler() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;
    let Some(url) = env("INBOX_TEST_AMQP_URL") else {
        return;
    };
    let telemetry = telemetry();
    let (Some(a), Some(b)) = (
        Sqlite::fresh("otel_filtered_a"),
        Sqlite::fresh("otel_filtered_b"),
    ) else {
        return;
    };
    diesel_inbox::migrate(&mut Sqlite::open(&a)).expect("migrate A");
    diesel_inbox::migrate(&mut Sqlite::open(&b)).expect("migrate B");
    let queue = common::unique_identifier("otel_filtered");
    let id = format!("filtered-{queue}");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(telemetry.provider.tracer("otel-test-filtered"))
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            !meta.target().starts_with("diesel_inbox")
        }));
    let applied_in: Mutex<Option<TraceId>> = Mutex::new(None);
    let (trace, request_span) =
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            let request = tracing::info_span!("POST /filtered", otel.kind = "server");
            let (trace, request_span) = {
                let cx = request.context();
                let span = cx.span().span_context().clone();
                (span.trace_id(), span.span_id())
            };
            {
                let _entered = request.enter();
                Sqlite::open(&a)
                    .transaction(|conn| {
                        outbox::enqueue(conn, Outgoing::new(queue.as_str(), "x").id(id.as_str()))
                    })
                    .expect("enqueued");
            }
            drop(request);
            // One thread, so that every task sees this subscriber.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                common::rabbit_queue(&url, &queue).await;
                let report = Relay::new(
                    Sqlite::pool(&a),
                    outbox::lapin::Publisher::connect(url.clone(), ""),
                )
                .run_once()
                .await
                .expect("the relay");
                assert_eq!(report.published, 1, "{report:?}");
                let pool = Sqlite::pool(&b);
                let handler = async |id: &str, _body: &[u8]| {
                    let apply = tracing::info_span!("apply");
                    *applied_in.lock().expect("not poisoned") =
                        Some(apply.context().span().span_context().trace_id());
                    let _entered = apply.enter();
                    let mut conn = Sqlite::pooled(&pool).await;
                    Inbox::consumer("service-b")
                        .run_async(&mut *conn, id, async |_conn| Ok::<_, InboxError>(()))
                        .await
                };
                let ran = tokio::time::timeout(
                    Duration::from_secs(30),
                    diesel_inbox::lapin::Consumer::connect(
                        url.clone(),
                        queue.clone(),
                        Policy::new(|_: &InboxError| false),
                    )
                    .exit_when_idle(Duration::from_millis(500))
                    .run(handler, std::future::pending()),
                )
                .await
                .expect("the runner drained the queue")
                .expect("the runner");
                assert_eq!(ran.acked, 1, "{ran:?}");
            });
            (trace, request_span)
        });
    assert_eq!(*applied_in.lock().expect("not poisoned"), Some(trace));
    let spans = telemetry.spans();
    let apply: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == "apply" && s.span_context.trace_id() == trace)
        .collect();
    assert_eq!(apply.len(), 1, "{spans:#?}");
    // No span of the library's in between: the handler's span is the
    // child of the request's, across the outbox and the broker.
    assert_eq!(apply[0].parent_span_id, request_span);
    assert!(apply[0].parent_span_is_remote);
    assert!(
        spans
            .iter()
            .all(|s| text(s, "messaging.message.id").as_deref() != Some(id.as_str())),
        "a span of the library was exported through the filter"
    );
}

/// `run_batch` runs its handler in one CONSUMER span per batch, `process
/// <queue>` with `messaging.batch.message_count`, linked to each message's
/// producer span (a batch has no one parent).
#[test]
fn a_batch_is_processed_in_one_span_linked_to_each_message() {
    let Some(url) = env("INBOX_TEST_AMQP_URL") else {
        return;
    };
    let telemetry = telemetry();
    let (Some(a), Some(b)) = (Sqlite::fresh("otel_batch_a"), Sqlite::fresh("otel_batch_b")) else {
        return;
    };
    diesel_inbox::migrate(&mut Sqlite::open(&a)).expect("migrate A");
    diesel_inbox::migrate(&mut Sqlite::open(&b)).expect("migrate B");
    let queue = common::unique_identifier("otel_batch");
    let ids: Vec<String> = (1..=3).map(|n| format!("batch-{n}-{queue}")).collect();
    let mut conn = Sqlite::open(&a);
    for id in &ids {
        let request = tracing::info_span!("POST /batch", otel.kind = "server");
        let _entered = request.enter();
        conn.transaction(|conn| {
            outbox::enqueue(conn, Outgoing::new(queue.as_str(), "x").id(id.as_str()))
        })
        .expect("enqueued");
    }
    let ran_in: Mutex<Vec<SpanId>> = Mutex::new(Vec::new());
    runtime().block_on(async {
        common::rabbit_queue(&url, &queue).await;
        let report = Relay::new(
            Sqlite::pool(&a),
            outbox::lapin::Publisher::connect(url.clone(), ""),
        )
        .run_once()
        .await
        .expect("the relay");
        assert_eq!(report.published, 3, "{report:?}");
        let pool = Sqlite::pool(&b);
        let handler = async |messages: &[diesel_inbox::brokers::Message<'_>]| {
            ran_in.lock().expect("not poisoned").push(
                tracing::Span::current()
                    .context()
                    .span()
                    .span_context()
                    .span_id(),
            );
            let mut conn = Sqlite::pooled(&pool).await;
            Inbox::consumer("service-b-batch")
                .run_batch_async(
                    &mut *conn,
                    messages,
                    |m| m.id().to_owned(),
                    async |_conn, _fresh| Ok::<_, InboxError>(()),
                )
                .await
        };
        let ran = tokio::time::timeout(
            Duration::from_secs(30),
            diesel_inbox::lapin::Consumer::connect(
                url.clone(),
                queue.clone(),
                Policy::new(|_: &InboxError| false),
            )
            .batch(10, Duration::from_millis(300))
            .exit_when_idle(Duration::from_millis(500))
            .run_batch(handler, std::future::pending()),
        )
        .await
        .expect("the runner drained the queue")
        .expect("the runner");
        assert_eq!((ran.acked, ran.batches), (3, 1), "{ran:?}");
    });
    let spans = telemetry.spans();
    let process: Vec<&SpanData> = spans
        .iter()
        .filter(|s| {
            s.span_kind == SpanKind::Consumer
                && text(s, "messaging.rabbitmq.destination.routing_key").as_deref()
                    == Some(queue.as_str())
        })
        .collect();
    assert_eq!(process.len(), 1, "{process:#?}");
    let process = process[0];
    assert_eq!(
        attribute(process, "messaging.batch.message_count"),
        Some(&Value::I64(3))
    );
    assert_eq!(
        text(process, "messaging.system").as_deref(),
        Some("rabbitmq")
    );
    assert_eq!(
        *ran_in.lock().expect("not poisoned"),
        vec![process.span_context.span_id()]
    );
    // The links are the producer spans, carried (remote) by the messages.
    let key = |c: &SpanContext| format!("{:?}/{:?}", c.trace_id(), c.span_id());
    let mut linked: Vec<String> = process
        .links
        .links
        .iter()
        .inspect(|l| assert!(l.span_context.is_remote()))
        .map(|l| key(&l.span_context))
        .collect();
    let mut sent: Vec<String> = ids
        .iter()
        .map(|id| key(&messaging_span(&spans, SpanKind::Producer, id).span_context))
        .collect();
    linked.sort();
    sent.sort();
    assert_eq!(linked, sent);
}
