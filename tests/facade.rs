//! Every public name of the runtime, through the paths users write
//! (`diesel_inbox::...`): this file does not compile when the facade leaves
//! one out, and the test below fails when the runtime exports a name this
//! file does not list.

#[allow(unused_imports)]
use diesel_inbox::{
    attempts, attempts_list, consumers, ddl, durability, forget, guide, idempotent, inbox,
    inbox_messages, migrate, outbox, outbox_messages, overview, positions, purge,
    recent_duplicates, schema_version, stats, status, validate_key, Attempts, Batch,
    ConsumerActivity, ConsumerName, ConsumerStats, ErrorClass, ErrorObserver, Fingerprint, Inbox,
    InboxBackend, InboxConnection, InboxEntry, InboxError, InboxKey, InvalidKey, Outcome, Overview,
    Prerequisite, Processed, Purge, PurgeReport, RegisteredHandler, RetryableError, RowCount,
    Stored, StoredResult, StreamPosition, TableProblem, Verdict, COUNT_CAP, MAX_KEY_BYTES,
    MAX_PURGE_BATCH, RATE_CAP, RATE_MINUTES, SCHEMA_VERSION,
};

#[allow(unused_imports)]
use diesel_inbox::inbox::{
    BatchFingerprint, BatchMode, ByStatements, Checked, Classify, Mode, NoFingerprint, NotStored,
    Plain, Single, SingleFingerprint, StoreResult, Stores,
};

#[cfg(feature = "async")]
#[allow(unused_imports)]
use diesel_inbox::{
    attempts_async, attempts_list_async, durability_async, forget_async, migrate_async,
    overview_async, positions_async, purge_async, stats_async, status_async, AsAsyncConnection,
    AsyncBatchBody, AsyncBody, AsyncInboxConnection,
};

#[allow(unused_imports)]
use diesel_inbox::outbox::{
    dead, dead_groups, dead_matching, discard, enqueue, purge as outbox_purge, retry, set_notify,
    status as outbox_status, wake, AllDead, DeadFilter, DeadMessage, DestinationStatus,
    FailureGroup, OutboxMessage, OutboxStatus, Outgoing, RetryTarget,
};

#[cfg(feature = "async")]
#[allow(unused_imports)]
use diesel_inbox::outbox::{
    dead_async, dead_groups_async, dead_matching_async, discard_async, enqueue_async,
    purge_async as outbox_purge_async, retry_async, status_async as outbox_status_async,
};

#[cfg(feature = "console")]
#[allow(unused_imports)]
use diesel_inbox::console::{router, ConsoleExt, Operator, QUERY_TIME_LIMIT};

#[cfg(feature = "relay")]
#[allow(unused_imports)]
use diesel_inbox::outbox::{
    ErrorSource, Publish, PublishError, Relay, RelayError, RelayPool, RelayReport,
};

#[cfg(any(feature = "lapin", feature = "nats", feature = "kafka"))]
#[allow(unused_imports)]
use diesel_inbox::brokers::{BrokerError, Handled, Policy, Settlement};

#[cfg(feature = "kafka")]
#[allow(unused_imports)]
use diesel_inbox::kafka::{
    message_id as kafka_message_id, Consumer as KafkaConsumer, Delivery, Partitions, ID_HEADER,
};

#[cfg(feature = "kafka")]
#[allow(unused_imports)]
use diesel_inbox::outbox::kafka::Publisher as KafkaPublisher;

#[cfg(feature = "lapin")]
#[allow(unused_imports)]
use diesel_inbox::lapin::{deliveries, handle, message_id};

#[cfg(feature = "nats")]
#[allow(unused_imports)]
use diesel_inbox::nats::{
    deliveries as nats_deliveries, handle as nats_handle, message_id as nats_message_id,
};

/// The names the runtime's `lib.rs` exports with `pub use` (and its public
/// modules), read from its source.
fn runtime_exports() -> Vec<String> {
    let lib = include_str!("../inbox-runtime/src/lib.rs");
    let mut names = Vec::new();
    let mut statement = String::new();
    for line in lib.lines() {
        let line = line.trim();
        if let Some(module) = line.strip_prefix("pub mod ") {
            let module = module.trim_end_matches(';').trim();
            if !module.starts_with("__") {
                names.push(module.to_string());
            }
            continue;
        }
        if line.starts_with("pub use ") || !statement.is_empty() {
            statement.push_str(line);
            statement.push(' ');
            if !line.ends_with(';') {
                continue;
            }
            let body = statement
                .trim()
                .trim_start_matches("pub use ")
                .trim_end_matches(';');
            let list = match body.split_once('{') {
                Some((_, rest)) => rest.trim_end_matches('}').to_string(),
                None => body.rsplit("::").next().unwrap_or(body).to_string(),
            };
            names.extend(
                list.split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty() && !n.starts_with("__"))
                    .map(String::from),
            );
            statement.clear();
        }
    }
    names
}

#[test]
fn every_runtime_export_is_listed_here() {
    let this = include_str!("facade.rs");
    let (listed, _) = this
        .split_once("/// The names the runtime's")
        .expect("the lists above");
    let missing: Vec<String> = runtime_exports()
        .into_iter()
        .filter(|name| {
            !listed
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|word| word == name)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "exported by inbox-runtime but not checked through diesel_inbox:: here: {missing:?}"
    );
    assert!(runtime_exports().len() > 40, "{:?}", runtime_exports());
}
