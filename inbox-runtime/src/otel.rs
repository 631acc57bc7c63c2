//! Trace context across the outbox and the brokers (feature `otel`): the
//! one place that reads and writes it, for the enqueue (capture), the
//! relay (a PRODUCER span per message, injected into what it publishes)
//! and the consumer runners (a CONSUMER span per delivery, the child of
//! the context the message carries).
//!
//! Everything goes through OpenTelemetry's *global* propagator
//! (`opentelemetry::global::set_text_map_propagator`), so the headers are
//! whatever the application propagates (W3C `traceparent`/`tracestate`,
//! `baggage`, B3, ...). Spans are `tracing` spans; `tracing-opentelemetry`
//! turns them into OpenTelemetry spans when its layer is installed. Without
//! that layer and without OpenTelemetry context of its own, the capture
//! finds nothing and writes nothing.

use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::{global, Context};
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Whether the enqueue captures the context (on by default; the
/// benchmark turns it off to measure what it costs).
static CAPTURE: AtomicBool = AtomicBool::new(true);

/// Turns the enqueue's capture of the trace context on or off, process-wide
/// (on by default). For the benchmark's comparison; an application has no
/// reason to turn it off.
pub fn set_capture(on: bool) {
    CAPTURE.store(on, Ordering::Relaxed);
}

/// What the messaging spans say about a message (the OpenTelemetry
/// messaging conventions' attributes).
#[derive(Debug, Clone, Copy)]
pub struct Messaging<'a> {
    /// `messaging.system`: `rabbitmq`, `nats`, `kafka`; `None` for a
    /// publisher that does not say.
    pub system: Option<&'a str>,
    /// `messaging.destination.name`: the exchange (`""` for RabbitMQ's
    /// default one), subject or topic.
    pub destination: &'a str,
    /// `messaging.rabbitmq.destination.routing_key`: RabbitMQ's routing
    /// key (left out when `None` or empty).
    pub routing_key: Option<&'a str>,
    /// `messaging.message.id`.
    pub message_id: &'a str,
    /// `messaging.consumer.group.name` (consumers only).
    pub group: Option<&'a str>,
}

impl Messaging<'_> {
    /// A span's name, as the messaging conventions have it: the
    /// operation and the destination, or the operation alone where the
    /// destination has no name (RabbitMQ's default exchange).
    fn span_name(&self, operation: &str) -> String {
        match self.destination {
            "" => operation.to_owned(),
            destination => format!("{operation} {destination}"),
        }
    }

    /// The routing key, where there is one to record.
    fn routing_key(&self) -> Option<&str> {
        self.routing_key.filter(|key| !key.is_empty())
    }
}

/// The OpenTelemetry context of the current `tracing` span (through
/// `tracing-opentelemetry`), or, when that span carries none, the context
/// attached with OpenTelemetry's own API.
fn current() -> Context {
    let cx = tracing::Span::current().context();
    match cx.has_active_span() {
        true => cx,
        false => Context::current(),
    }
}

/// Whether `cx` has anything to propagate: a valid span context (sampled
/// or not) or baggage.
fn carries(cx: &Context) -> bool {
    cx.span().span_context().is_valid() || !cx.baggage().is_empty()
}

/// Headers as a carrier; names compared without case (brokers and
/// proxies may change it).
struct Carrier<'a>(&'a mut Vec<(String, String)>);

impl Injector for Carrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.retain(|(name, _)| !name.eq_ignore_ascii_case(key));
        if !value.is_empty() {
            self.0.push((key.to_owned(), value));
        }
    }
}

struct Headers<'a>(&'a [(String, String)]);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .map(|(_, value)| value.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_str()).collect()
    }
}

/// At enqueue: writes the current trace context (sampled or not, with its
/// baggage) into `headers` with the global propagator. A header the user
/// set (any case) wins: it is left as it is.
pub fn capture(headers: &mut Vec<(String, String)>) {
    if !CAPTURE.load(Ordering::Relaxed) {
        return;
    }
    let cx = current();
    if !carries(&cx) {
        return;
    }
    let mut fields = Vec::new();
    global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&cx, &mut Carrier(&mut fields))
    });
    for (name, value) in fields {
        if !headers
            .iter()
            .any(|(have, _)| have.eq_ignore_ascii_case(&name))
        {
            headers.push((name, value));
        }
    }
}

/// The context `headers` carry, by the global propagator (empty when they
/// carry none, or none the propagator can read).
pub fn extract(headers: &[(String, String)]) -> Context {
    global::get_text_map_propagator(|propagator| propagator.extract(&Headers(headers)))
}

/// The names of the headers the global propagator reads and writes.
pub fn fields() -> Vec<String> {
    global::get_text_map_propagator(|propagator| propagator.fields().map(str::to_owned).collect())
}

/// The relay's span for one message it publishes: a PRODUCER span, the
/// child of the context stored with the message at enqueue, linked to the
/// relay's batch span `batch`. Where the stored context is absent or
/// unreadable (a broken `traceparent` set by hand), it is the child of
/// `batch` instead: the message goes out in the relay's trace, nothing
/// fails. The span's own context replaces the stored one in `headers`
/// (stored baggage kept), so that the consumer becomes its child.
pub fn producer_span(
    messaging: Messaging<'_>,
    headers: &mut Vec<(String, String)>,
    batch: &tracing::Span,
) -> tracing::Span {
    let stored = extract(headers);
    let span = tracing::info_span!(
        target: crate::target::TARGET,
        parent: batch,
        "diesel_inbox.outbox.send",
        otel.name = %messaging.span_name("send"),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.system = messaging.system,
        messaging.operation.type = "send",
        messaging.destination.name = messaging.destination,
        messaging.rabbitmq.destination.routing_key = messaging.routing_key(),
        messaging.message.id = messaging.message_id,
    );
    if stored.span().span_context().is_valid() {
        let link = batch.context().span().span_context().clone();
        let _ = span.set_parent(stored);
        if link.is_valid() {
            span.add_link(link);
        }
    } else if !stored.baggage().is_empty() {
        let parent = batch.context();
        let baggage: Vec<_> = stored
            .baggage()
            .iter()
            .map(|(key, (value, _))| opentelemetry::KeyValue::new(key.clone(), value.clone()))
            .collect();
        let _ = span.set_parent(parent.with_baggage(baggage));
    }
    let cx = span.context();
    if carries(&cx) {
        global::get_text_map_propagator(|propagator| {
            propagator.inject_context(&cx, &mut Carrier(headers))
        });
    }
    span
}

/// Marks a producer span failed (the broker refused the message, or did
/// not confirm it).
pub fn failed(span: &tracing::Span) {
    span.record("otel.status_code", "error");
}

/// A consumer runner's handler call `call` for one delivery, run in a
/// CONSUMER span, the child of the context the message carries
/// (`headers`: the propagator's [`fields`] the delivery has); with none,
/// the child of the current span. The carried context is also attached
/// as OpenTelemetry's current context while `call` runs, so that where a
/// filter drops the span (target `diesel_inbox`, level INFO) the spans
/// the handler opens still continue the message's trace.
pub fn consume<F: std::future::Future>(
    messaging: Messaging<'_>,
    headers: &[(String, String)],
    call: F,
) -> opentelemetry::trace::WithContext<tracing::instrument::Instrumented<F>> {
    let span = tracing::info_span!(
        target: crate::target::TARGET,
        "diesel_inbox.consume",
        otel.name = %messaging.span_name("process"),
        otel.kind = "consumer",
        messaging.system = messaging.system,
        messaging.operation.type = "process",
        messaging.destination.name = messaging.destination,
        messaging.rabbitmq.destination.routing_key = messaging.routing_key(),
        messaging.message.id = messaging.message_id,
        messaging.consumer.group.name = messaging.group,
    );
    let carried = extract(headers);
    let attached = match carries(&carried) {
        true => {
            let _ = span.set_parent(carried.clone());
            carried
        }
        false => Context::current(),
    };
    opentelemetry::trace::FutureExt::with_context(
        tracing::Instrument::instrument(call, span),
        attached,
    )
}

/// A consumer runner's handler call `call` for a batch of deliveries
/// (`run_batch`), run in one CONSUMER span, `process {destination}` with
/// `messaging.batch.message_count`, the child of the current span and
/// linked to each context the messages carry (`carried`: each message's
/// propagator [`fields`], read only when the span is recorded), as OpenTelemetry's conventions have a batch
/// process: a batch has no one parent. Messages without a context add no
/// link.
pub fn consume_batch<F: std::future::Future>(
    messaging: Messaging<'_>,
    count: usize,
    carried: impl FnOnce() -> Vec<Vec<(String, String)>>,
    call: F,
) -> tracing::instrument::Instrumented<F> {
    let span = tracing::info_span!(
        target: crate::target::TARGET,
        "diesel_inbox.consume",
        otel.name = %messaging.span_name("process"),
        otel.kind = "consumer",
        messaging.system = messaging.system,
        messaging.operation.type = "process",
        messaging.destination.name = messaging.destination,
        messaging.rabbitmq.destination.routing_key = messaging.routing_key(),
        messaging.batch.message_count = i64::try_from(count).unwrap_or(i64::MAX),
        messaging.consumer.group.name = messaging.group,
    );
    // Read only for a span that is recorded.
    if span.is_disabled() {
        return tracing::Instrument::instrument(call, span);
    }
    for headers in carried() {
        let link = extract(&headers).span().span_context().clone();
        if link.is_valid() {
            span.add_link(link);
        }
    }
    tracing::Instrument::instrument(call, span)
}
