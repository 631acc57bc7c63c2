//! A relay running in a task of its own until the test says stop.
#![cfg(feature = "relay")]

use diesel_inbox::outbox::{Publish, Relay, RelayError, RelayPool, RelayReport};

/// `relay.run` in a task: send `true` on the sender to stop it; the task
/// yields what `run` returned.
pub fn spawn<D, P>(
    relay: Relay<D, P>,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Result<RelayReport, RelayError>>,
)
where
    D: RelayPool + 'static,
    P: Publish + 'static,
{
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(async move {
        relay
            .run(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
    });
    (stop, running)
}
