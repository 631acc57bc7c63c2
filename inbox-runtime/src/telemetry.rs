//! What a handled message tells the outside: a `tracing` span per handler
//! call and an event when it ends, all under the target `diesel_inbox`
//! (DEBUG for applied and duplicate, WARN with the error's text for a
//! failure), and with the `metrics` feature, counters and a histogram
//! through the `metrics` facade. The engine reports here (once, for the sync and
//! the async drivers); the drivers only enter the span.
//!
//! Names follow OpenTelemetry's messaging conventions where one fits. Under
//! a tenant set (the relay over tenants, a runner over tenants), the
//! handler's counters and histogram (`messaging.client.consumed.messages`,
//! `messaging.process.duration`, `diesel_inbox.retries`) and the relay's
//! (`messaging.client.sent.messages`, `diesel_inbox.outbox.failed`,
//! `diesel_inbox.outbox.confirm_latency`) and the outbox's gauges (the
//! relay over tenants counts each tenant's outbox every 10 s) also carry
//! `diesel_inbox.tenant`, the tenant whose database the call ran on
//! (`for_tenant`), and the span `diesel_inbox.handle` its field `tenant`:
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `messaging.client.consumed.messages` | counter | `messaging.consumer.group.name`, `diesel_inbox.outcome` | handler calls, by consumer and outcome (`applied`, `duplicate`, `error`) |
//! | `messaging.process.duration` | histogram (seconds) | `messaging.consumer.group.name`, `diesel_inbox.outcome` | a handler call, claim to commit, retries included |
//! | `diesel_inbox.retries` | counter | `messaging.consumer.group.name` | transactions rerun after a transient error |
//! | `diesel_inbox.consumer.settled` | counter | `messaging.consumer.group.name` (the queue or JetStream consumer), `diesel_inbox.settlement` (`ack`, `retry`, `dead_letter`, `unsettled`) | broker deliveries settled by the broker glue and the consumer runners, as each is settled |
//! | `diesel_inbox.purged.rows` | counter | `messaging.consumer.group.name` (`*` for all) | rows a purge deleted |
//! | `diesel_inbox.outbox.pending` | gauge | | pending outbox messages, as `outbox::status` last counted them |
//! | `diesel_inbox.outbox.scheduled` | gauge | | outbox messages not yet due (`deliver_after`, `deliver_at`), likewise |
//! | `diesel_inbox.outbox.dead` | gauge | | dead outbox messages, likewise |
//! | `diesel_inbox.outbox.oldest_pending_age` | gauge (seconds) | | the oldest pending message's wait, likewise |
//! | `messaging.client.sent.messages` | counter | | outbox messages the broker confirmed |
//! | `diesel_inbox.outbox.failed` | counter | `diesel_inbox.outcome` (`failed`, `dead`) | publishes the broker refused |
//! | `diesel_inbox.outbox.confirm_latency` | histogram (seconds) | | enqueue (the transaction's start) to the broker's confirm |
//! | `diesel_inbox.outbox.purged.rows` | counter | | dead messages `outbox::purge` deleted |

use std::time::Instant;

pub(crate) use crate::target::TARGET;

/// How a handler call ended; a failure with the error's `Debug` text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Applied,
    Duplicate,
    Error(String),
}

impl Outcome {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Duplicate => "duplicate",
            Outcome::Error(_) => "error",
        }
    }
}

/// One handler call's span and clock.
pub(crate) struct Telemetry {
    span: tracing::Span,
    started: Instant,
    #[cfg(feature = "metrics")]
    consumer: String,
}

impl Telemetry {
    /// The span `diesel_inbox.handle` with the consumer and the key (for a
    /// batch, its description); outcome, attempts and duration are recorded
    /// when the call ends.
    pub(crate) fn start(consumer: &str, key: &str) -> Self {
        let span = tracing::info_span!(
            target: TARGET,
            "diesel_inbox.handle",
            consumer,
            key,
            tenant = tracing::field::Empty,
            outcome = tracing::field::Empty,
            attempts = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        if let Some(tenant) = tenant() {
            span.record("tenant", &*tenant);
        }
        Telemetry {
            span,
            started: Instant::now(),
            #[cfg(feature = "metrics")]
            consumer: consumer.to_owned(),
        }
    }

    /// The span the drivers enter while they drive the call.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// A transient error reruns the transaction.
    pub(crate) fn retried(&self) {
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "diesel_inbox.retries",
            &labelled(vec![(
                "messaging.consumer.group.name",
                self.consumer.clone()
            )])
        )
        .increment(1);
    }

    /// The call on `key` (or a batch's description) of `consumer` ended:
    /// the span's fields, and the event (inside the span).
    pub(crate) fn finished(&self, consumer: &str, key: &str, outcome: Outcome, attempts: u32) {
        let elapsed = self.started.elapsed();
        // The event comes first, so that its line shows the span's fields
        // recorded so far (consumer, key) and not the error a second time.
        match &outcome {
            Outcome::Applied => {
                tracing::debug!(target: TARGET, consumer, key, "diesel-inbox: applied")
            }
            Outcome::Duplicate => {
                crate::recent::duplicate(consumer);
                tracing::debug!(target: TARGET, consumer, key, "diesel-inbox: duplicate")
            }
            // A broker's glue reports the delivery's failure itself, in
            // one line with what happens next.
            Outcome::Error(error) if settled_by_caller_now() => {
                tracing::debug!(target: TARGET, consumer, key, error = %error, "diesel-inbox: the call failed")
            }
            Outcome::Error(error) => {
                tracing::warn!(target: TARGET, consumer, key, error = %error, "diesel-inbox: the call failed")
            }
        }
        self.span.record("outcome", outcome.as_str());
        self.span.record("attempts", attempts);
        self.span
            .record("duration_ms", elapsed.as_secs_f64() * 1000.0);
        if let Outcome::Error(error) = &outcome {
            self.span.record("error", error.as_str());
        }
        #[cfg(feature = "metrics")]
        {
            let labels = labelled(vec![
                ("messaging.consumer.group.name", self.consumer.clone()),
                ("diesel_inbox.outcome", outcome.as_str().to_owned()),
            ]);
            metrics::counter!("messaging.client.consumed.messages", &labels).increment(1);
            metrics::histogram!("messaging.process.duration", &labels)
                .record(elapsed.as_secs_f64());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = elapsed;
    }
}

/// A purge deleted `rows` (of `consumer`, or of all).
pub(crate) fn purged(consumer: Option<&str>, rows: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "diesel_inbox.purged.rows",
        "messaging.consumer.group.name" => consumer.unwrap_or("*").to_owned()
    )
    .increment(rows);
    #[cfg(not(feature = "metrics"))]
    let _ = (consumer, rows);
}

/// `outbox::status` counted the outbox.
pub(crate) fn outbox_status(pending: u64, scheduled: u64, dead: u64, oldest: std::time::Duration) {
    #[cfg(feature = "metrics")]
    {
        let labels = labelled(Vec::new());
        metrics::gauge!("diesel_inbox.outbox.pending", &labels).set(pending as f64);
        metrics::gauge!("diesel_inbox.outbox.scheduled", &labels).set(scheduled as f64);
        metrics::gauge!("diesel_inbox.outbox.dead", &labels).set(dead as f64);
        metrics::gauge!("diesel_inbox.outbox.oldest_pending_age", &labels)
            .set(oldest.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (pending, scheduled, dead, oldest);
}

/// A tenant left the relay over tenants: its outbox gauges read 0 from
/// now on, not the last count of an outbox no longer relayed.
#[cfg(feature = "async")]
pub fn outbox_status_gone(tenant: &str) {
    #[cfg(feature = "metrics")]
    {
        let labels = [("diesel_inbox.tenant", tenant.to_owned())];
        metrics::gauge!("diesel_inbox.outbox.pending", &labels).set(0.0);
        metrics::gauge!("diesel_inbox.outbox.scheduled", &labels).set(0.0);
        metrics::gauge!("diesel_inbox.outbox.dead", &labels).set(0.0);
        metrics::gauge!("diesel_inbox.outbox.oldest_pending_age", &labels).set(0.0);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = tenant;
}

/// The WAL outbox's slot as `outbox::status` read it: the WAL it keeps
/// and the WAL past its confirmed position (bytes).
pub(crate) fn outbox_wal_slot(retained: u64, unconfirmed: u64) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!("diesel_inbox.outbox.wal_retained_bytes").set(retained as f64);
        metrics::gauge!("diesel_inbox.outbox.wal_unconfirmed_bytes").set(unconfirmed as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (retained, unconfirmed);
}

/// A relay published messages that waited `latencies` from enqueue to
/// the broker's confirm.
#[cfg(feature = "async")]
pub(crate) fn outbox_published(latencies: &[std::time::Duration]) {
    #[cfg(feature = "metrics")]
    {
        let labels = labelled(Vec::new());
        metrics::counter!("messaging.client.sent.messages", &labels)
            .increment(latencies.len() as u64);
        let histogram = metrics::histogram!("diesel_inbox.outbox.confirm_latency", &labels);
        for latency in latencies {
            histogram.record(latency.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = latencies;
}

/// The broker refused messages: `failed` will be retried, `dead` will not.
#[cfg(feature = "async")]
pub(crate) fn outbox_failed(failed: u64, dead: u64) {
    #[cfg(feature = "metrics")]
    {
        for (outcome, n) in [("failed", failed), ("dead", dead)] {
            if n > 0 {
                let labels = labelled(vec![("diesel_inbox.outcome", outcome.to_owned())]);
                metrics::counter!("diesel_inbox.outbox.failed", &labels).increment(n);
            }
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (failed, dead);
}

/// An outbox purge deleted `rows` dead messages.
pub(crate) fn outbox_purged(_scope: Option<&str>, rows: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!("diesel_inbox.outbox.purged.rows").increment(rows);
    #[cfg(not(feature = "metrics"))]
    let _ = rows;
}

#[cfg(feature = "async")]
tokio::task_local! {
    /// The tenant whose database the task works on ([`for_tenant`]).
    static TENANT: std::sync::Arc<str>;
}

/// Runs `work` (a tenant's relay turn, a handler on a tenant's
/// connection) for `tenant`: its metrics carry the label
/// `diesel_inbox.tenant` and its handler spans the field `tenant`.
#[cfg(feature = "async")]
pub async fn for_tenant<F: std::future::Future>(tenant: std::sync::Arc<str>, work: F) -> F::Output {
    TENANT.scope(tenant, work).await
}

/// The tenant of the running task, if [`for_tenant`] set one.
fn tenant() -> Option<std::sync::Arc<str>> {
    #[cfg(feature = "async")]
    return TENANT.try_with(|tenant| tenant.clone()).ok();
    #[cfg(not(feature = "async"))]
    None
}

/// `labels` and, under a tenant, `diesel_inbox.tenant`.
#[cfg(feature = "metrics")]
fn labelled(mut labels: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    if let Some(tenant) = tenant() {
        labels.push(("diesel_inbox.tenant", tenant.to_string()));
    }
    labels
}

#[cfg(feature = "async")]
tokio::task_local! {
    /// Set while a broker's glue runs a handler: it reports the delivery's
    /// outcome itself.
    static SETTLED_BY_CALLER: ();
}

/// Runs `call` (a handler a broker's glue runs): a failed call is then
/// logged at DEBUG, since the glue logs the failed delivery, with what
/// happens to it, in one WARN line of its own.
#[cfg(feature = "async")]
pub async fn settled_by_caller<F: std::future::Future>(call: F) -> F::Output {
    SETTLED_BY_CALLER.scope((), call).await
}

fn settled_by_caller_now() -> bool {
    #[cfg(feature = "async")]
    return SETTLED_BY_CALLER.try_with(|_| ()).is_ok();
    #[cfg(not(feature = "async"))]
    false
}

/// `messages` broker deliveries of `consumer` (a queue, a JetStream
/// consumer) were settled: `settlement` is `ack`, `retry`, `dead_letter`
/// or `unsettled`.
pub fn consumer_settled(consumer: &str, settlement: &'static str, messages: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "diesel_inbox.consumer.settled",
        "messaging.consumer.group.name" => consumer.to_owned(),
        "diesel_inbox.settlement" => settlement
    )
    .increment(messages);
    #[cfg(not(feature = "metrics"))]
    let _ = (consumer, settlement, messages);
}

/// An action of the operations console (`retry`, `discard`,
/// `retry-matching`, `discard-matching`, `forget`) ended with `outcome`
/// (`done`, `refused`, `failed`), acting on `rows`: the counter
/// `diesel_inbox.console.actions` (by action and outcome) and
/// `diesel_inbox.console.rows` (rows changed, by action).
pub fn console_action(action: &str, outcome: &'static str, rows: u64) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!(
            "diesel_inbox.console.actions",
            "diesel_inbox.action" => action.to_owned(),
            "diesel_inbox.outcome" => outcome
        )
        .increment(1);
        metrics::counter!("diesel_inbox.console.rows", "diesel_inbox.action" => action.to_owned())
            .increment(rows);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (action, outcome, rows);
}

/// A Kafka partition's lag (messages not handled yet: the high watermark
/// less the runner's position), as the gauge `diesel_inbox.kafka.lag`
/// labelled `messaging.destination.name` and
/// `messaging.destination.partition.id`.
pub fn kafka_lag(topic: &str, partition: i32, lag: i64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(
        "diesel_inbox.kafka.lag",
        "messaging.destination.name" => topic.to_owned(),
        "messaging.destination.partition.id" => partition.to_string()
    )
    .set(lag as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = (topic, partition, lag);
}

/// The telemetry of one request through the HTTP front door: a span
/// `diesel_inbox.http` (the inbox call's `diesel_inbox.handle` runs
/// inside it) with the endpoint and the request's outcome (`applied`,
/// `replayed`, `conflict`, `mismatch`, `error`), and with `metrics`:
/// `diesel_inbox.http.requests` and `diesel_inbox.http.duration`, labelled
/// `http.route` (the endpoint) and `diesel_inbox.outcome`.
#[doc(hidden)]
pub struct HttpTelemetry {
    span: tracing::Span,
    started: Instant,
    #[cfg(feature = "metrics")]
    endpoint: String,
}

impl HttpTelemetry {
    /// A request to `endpoint` starts.
    pub fn start(endpoint: &str) -> Self {
        let span = tracing::info_span!(
            target: TARGET,
            "diesel_inbox.http",
            endpoint,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        HttpTelemetry {
            span,
            started: Instant::now(),
            #[cfg(feature = "metrics")]
            endpoint: endpoint.to_owned(),
        }
    }

    /// The request's span: enter it while the request runs.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The request ended with `outcome`.
    pub fn finished(&self, outcome: &'static str) {
        let elapsed = self.started.elapsed();
        self.span.record("outcome", outcome);
        self.span
            .record("duration_ms", elapsed.as_secs_f64() * 1000.0);
        tracing::debug!(target: TARGET, parent: &self.span, outcome, "diesel-inbox: HTTP request");
        #[cfg(feature = "metrics")]
        {
            let labels = [
                ("http.route", self.endpoint.clone()),
                ("diesel_inbox.outcome", outcome.to_owned()),
            ];
            metrics::counter!("diesel_inbox.http.requests", &labels).increment(1);
            metrics::histogram!("diesel_inbox.http.duration", &labels)
                .record(elapsed.as_secs_f64());
        }
    }
}
