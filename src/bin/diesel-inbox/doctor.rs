//! `doctor`'s brokers: what each JetStream stream named keeps through a
//! crash or the loss of a node (`diesel_inbox::nats::stream_durability`).

use crate::Failure;
use diesel_inbox::Prerequisite;

/// The storage and replicas of each of `streams` on the NATS server at
/// `url`, scoped `nats stream NAME`.
#[cfg(feature = "nats")]
pub(crate) fn nats_streams(
    url: &str,
    streams: &[String],
) -> Result<Vec<(String, Prerequisite)>, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("no async runtime: {e}")))?;
    runtime.block_on(async {
        let client =
            tokio::time::timeout(std::time::Duration::from_secs(10), async_nats::connect(url))
                .await
                .map_err(|_| {
                    Failure(format!(
                        "cannot connect to NATS at {url}: no answer within 10 s"
                    ))
                })?
                .map_err(|e| Failure(format!("cannot connect to NATS at {url}: {e}")))?;
        let js = async_nats::jetstream::new(client);
        let mut listed = Vec::new();
        for name in streams {
            let stream = js
                .get_stream(name)
                .await
                .map_err(|e| Failure(format!("the JetStream stream {name} on {url}: {e}")))?;
            let config = stream.cached_info().config.clone();
            listed.extend(
                diesel_inbox::nats::stream_durability(&config)
                    .into_iter()
                    .map(|p| (format!("nats stream {name}"), p)),
            );
        }
        Ok(listed)
    })
}

#[cfg(not(feature = "nats"))]
pub(crate) fn nats_streams(_: &str, _: &[String]) -> Result<Vec<(String, Prerequisite)>, Failure> {
    Err(Failure(
        "this diesel-inbox was built without NATS: cargo install diesel-inbox --features cli,nats"
            .into(),
    ))
}
