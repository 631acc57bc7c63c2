//! A Kafka partition's lag for the overview's stream positions (feature
//! `kafka`, [`ConsoleExt::kafka_lag`](super::ConsoleExt::kafka_lag)): its
//! high watermark, asked of the brokers, less the stored position.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use std::time::Duration;

/// At most this many partitions are asked (one request each).
const MAX_PARTITIONS: usize = 100;

/// The lag of each `(topic, partition, next_offset)`, in order; or why the
/// brokers did not say (within the console's time limit).
pub(super) async fn lags(
    brokers: &str,
    positions: Vec<(String, i32, i64)>,
) -> Result<Vec<i64>, String> {
    let brokers = brokers.to_owned();
    let ask = tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .map_err(|e| format!("no Kafka client for {brokers}: {e}"))?;
        positions
            .iter()
            .take(MAX_PARTITIONS)
            .map(|(topic, partition, next)| {
                client
                    .fetch_watermarks(topic, *partition, Duration::from_secs(2))
                    .map(|(_, high)| (high - next).max(0))
                    .map_err(|e| format!("{topic}/{partition}: {e}"))
            })
            .collect()
    });
    match tokio::time::timeout(super::QUERY_TIME_LIMIT, ask).await {
        Ok(Ok(lags)) => lags,
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "the brokers did not answer within {} seconds",
            super::QUERY_TIME_LIMIT.as_secs()
        )),
    }
}
