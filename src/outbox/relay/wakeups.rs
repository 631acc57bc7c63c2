//! How a relay hears of the enqueues of other processes: its `LISTEN`
//! connection, and, on it, the lock that tells enqueues whether a relay
//! sleeps (so that they notify only then: the protocol is in the
//! runtime's `outbox::notify`). [`Doze`] is the relay loop's side: after a
//! pass that found nothing it asks the listener to say the relay sleeps,
//! and when it is woken, to say it is awake.

use super::{Relay, RelayError, OUTAGE_DELAY};
use crate::outbox::pool::RelayPool;
use crate::outbox::publish::Publish;
use inbox_runtime::__facade::backoff;
use inbox_runtime::outbox as steps;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long the relay waits for a notification it sends its own `LISTEN`
/// connection before it decides that none can reach it.
pub(super) const PROBE_WAIT: Duration = Duration::from_secs(2);
/// How long opening and checking the `LISTEN` connection may take before
/// it is tried again.
pub(super) const LISTEN_OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the relay loop waits for the listener's answer (a listener
/// stuck on a server that does not answer must not hold the loop).
const ANSWER_WAIT: Duration = Duration::from_millis(500);
/// The first wait before a relay that may sleep looks again whether the
/// transactions in progress when it went to sleep have ended (doubling
/// up to the poll interval).
const UNSETTLED_WAIT: Duration = Duration::from_millis(5);

/// What the relay loop asks its listener.
pub(super) enum Ask {
    /// Say that the relay sleeps: `Some(settled)`, or `None` (poll).
    Asleep(oneshot::Sender<Option<bool>>),
    /// Whether the transactions in progress when it went to sleep ended.
    Settled(oneshot::Sender<Option<bool>>),
    /// Say that the relay is awake.
    Awake,
}

/// The relay loop's side of the protocol.
pub(super) struct Doze {
    asks: mpsc::UnboundedSender<Ask>,
    state: State,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Enqueues need not notify: the relay passes again before it sleeps.
    Awake,
    /// Enqueues notify. `settled`: no transaction that may have enqueued
    /// without notifying is still in progress; else the relay has waited
    /// `waits` times for them.
    Asleep { settled: bool, waits: u32 },
}

/// What the relay loop does after a pass (which ends when nothing is
/// left to claim).
pub(super) enum Next {
    /// Pass again at once (it went to sleep just now: the pass sees what
    /// was committed before).
    Pass,
    /// Wait for a wake-up, at most this long.
    Wait(Duration),
    /// Wait this long, wake-ups or not, and pass again (awake: enqueues do
    /// not notify, and what they commit meanwhile is one batch).
    Linger(Duration),
}

/// How long a relay whose pass published something waits before it
/// passes again, awake: under a steady flow the relay claims what arrived
/// meanwhile as one batch, and goes to sleep (enqueues then notify) only
/// after a pass that found nothing.
pub(super) const LINGER: Duration = Duration::from_millis(5);

impl Doze {
    pub(super) fn new() -> (Self, mpsc::UnboundedReceiver<Ask>) {
        let (asks, asked) = mpsc::unbounded_channel();
        let doze = Doze {
            asks,
            state: State::Awake,
        };
        (doze, asked)
    }

    /// After a pass: if it `found` messages, linger awake; else go to
    /// sleep (then pass once more), or wait for a notification (`poll` at
    /// most), or for the transactions that may not have notified (a short
    /// wait).
    pub(super) async fn after_pass(&mut self, poll: Duration, found: bool) -> Next {
        if found {
            if self.state != State::Awake {
                let _ = self.asks.send(Ask::Awake);
                self.state = State::Awake;
            }
            return Next::Linger(LINGER.min(poll));
        }
        match self.state {
            State::Awake => match self.ask(Ask::Asleep).await {
                Some(settled) => {
                    self.state = State::Asleep { settled, waits: 0 };
                    Next::Pass
                }
                None => Next::Wait(poll),
            },
            State::Asleep { settled: true, .. } => Next::Wait(poll),
            State::Asleep {
                settled: false,
                waits,
            } => {
                self.state = State::Asleep {
                    settled: false,
                    waits: waits + 1,
                };
                Next::Wait(backoff(UNSETTLED_WAIT, poll, waits + 1).min(poll))
            }
        }
    }

    /// Before the pass that follows a wait: woken, the relay is awake;
    /// else, if it waited for unsettled transactions, it looks whether
    /// they ended.
    pub(super) async fn before_pass(&mut self, woken: bool) {
        match self.state {
            State::Asleep { .. } if woken => {
                let _ = self.asks.send(Ask::Awake);
                self.state = State::Awake;
            }
            State::Asleep {
                settled: false,
                waits,
            } => {
                self.state = match self.ask(Ask::Settled).await {
                    Some(settled) => State::Asleep { settled, waits },
                    None => State::Awake,
                };
            }
            _ => {}
        }
    }

    /// The listener's answer, `None` if it has none within [`ANSWER_WAIT`].
    async fn ask(&self, ask: fn(oneshot::Sender<Option<bool>>) -> Ask) -> Option<bool> {
        let (answer, answered) = oneshot::channel();
        self.asks.send(ask(answer)).ok()?;
        tokio::time::timeout(ANSWER_WAIT, answered)
            .await
            .ok()?
            .ok()?
    }
}

/// Answers `None` to every ask (no connection that listens).
async fn refuse(asked: &mut mpsc::UnboundedReceiver<Ask>) -> std::convert::Infallible {
    loop {
        match asked.recv().await {
            Some(Ask::Asleep(answer) | Ask::Settled(answer)) => {
                let _ = answer.send(None);
            }
            Some(Ask::Awake) => {}
            None => return std::future::pending().await,
        }
    }
}

/// How [`hear`] stopped: nothing can reach the listener (said at WARN).
pub(super) enum Deaf {
    /// The backend has no notifications.
    Polls,
    /// A notification sent to its own connection did not arrive (a proxy
    /// that keeps no session).
    Unreachable,
}

/// What [`hear`] listens on: a connection kept for it alone, what it
/// holds while it listens (a tenant's share of the connection limit),
/// and whether a notification reached it ([`steps::listen_async`]).
pub(super) type Opened<C, K> = (C, K, steps::Listening);

/// Hears the enqueues of other processes on the connection `open` gives,
/// and calls `heard` at each, and once each time it listens again (for
/// what was enqueued meanwhile); answers the relay loop's [`Ask`]s on it.
/// A lost or failed connection is opened again after a backoff. Returns
/// only when nothing can reach it, said once at WARN: the caller then
/// polls.
pub(super) async fn hear<C, K, F>(
    open: impl Fn() -> F,
    heard: impl Fn(),
    asked: &mut mpsc::UnboundedReceiver<Ask>,
    poll_interval: Duration,
) -> Deaf
where
    C: inbox_runtime::AsyncInboxConnection,
    F: std::future::Future<Output = Result<Opened<C, K>, RelayError>>,
{
    let mut failures = 0u32;
    loop {
        let opened = tokio::select! {
            opened = tokio::time::timeout(LISTEN_OPEN_TIMEOUT, open()) => opened,
            never = refuse(asked) => match never {},
        };
        let error = match opened {
            Ok(Ok((_, _, steps::Listening::Polls))) => return Deaf::Polls,
            Ok(Ok((_, _, steps::Listening::Unreachable))) => {
                tracing::warn!(target: crate::TRACING_TARGET, probe_wait = ?PROBE_WAIT, ?poll_interval, "diesel-inbox: outbox relay: a notification sent to its own LISTEN connection did not arrive: a connection proxy in transaction mode (PgBouncer's pool_mode = transaction) keeps no session for LISTEN. The relay polls instead; give it a direct connection (or session pooling) for wake-ups from other processes");
                return Deaf::Unreachable;
            }
            Ok(Ok((mut listener, _held, steps::Listening::Notified))) => {
                failures = 0;
                tracing::debug!(target: crate::TRACING_TARGET, "diesel-inbox: outbox relay: listening for the enqueues of other processes");
                heard();
                serve(&mut listener, &heard, asked).await
            }
            Ok(Err(e)) => e,
            Err(_) => RelayError::Pool(
                format!("no listening connection within {LISTEN_OPEN_TIMEOUT:?}").into(),
            ),
        };
        failures += 1;
        tracing::debug!(target: crate::TRACING_TARGET, error = %error, "diesel-inbox: outbox relay: its LISTEN connection failed; polling until it is open again");
        let pause = tokio::time::sleep(backoff(OUTAGE_DELAY, super::MAX_OUTAGE_DELAY, failures));
        tokio::select! {
            () = pause => {}
            never = refuse(asked) => match never {},
        }
    }
}

impl<D, P> Relay<D, P>
where
    D: RelayPool,
    P: Publish,
{
    /// Hears the enqueues of other processes where the backend notifies
    /// (PostgreSQL), on a connection of its own ([`hear`]), and wakes the
    /// relays of this process at each; never returns (`run` drops it).
    /// Where nothing can reach it (another backend; a proxy that keeps no
    /// session) it only answers `None`: the relay polls.
    pub(super) async fn listen(
        &self,
        asked: &mut mpsc::UnboundedReceiver<Ask>,
    ) -> std::convert::Infallible {
        if steps::notifies::<D::Connection>() {
            let open = || async {
                let mut listener = self.pool.dedicated().await.map_err(RelayError::Pool)?;
                let mut notifier = self.pool.connection().await.map_err(RelayError::Pool)?;
                let how = steps::listen_async(&mut listener, &mut *notifier, PROBE_WAIT).await?;
                Ok((listener, (), how))
            };
            hear(open, steps::wake, asked, self.settings.poll_interval).await;
        }
        refuse(asked).await
    }
}

/// On a listening connection: calls `heard` at each notification and
/// answers the relay loop, until the connection fails.
async fn serve<C: inbox_runtime::AsyncInboxConnection>(
    listener: &mut C,
    heard: &impl Fn(),
    asked: &mut mpsc::UnboundedReceiver<Ask>,
) -> RelayError {
    // Whether this connection holds the sleeping relay's lock, and the
    // snapshot taken when it went to sleep.
    let mut held = false;
    let mut snapshot = String::new();
    loop {
        let ask = tokio::select! {
            notified = steps::notified_async(listener) => match notified {
                Ok(()) => {
                    heard();
                    continue;
                }
                Err(e) => return RelayError::Database(e),
            },
            ask = asked.recv() => ask,
        };
        let answered = match ask {
            None => return std::future::pending().await,
            Some(Ask::Asleep(answer)) => {
                let asleep = steps::asleep_async(listener, held, &mut snapshot).await;
                held = matches!(asleep, Ok(Some(_)));
                let _ = answer.send(asleep.as_ref().ok().copied().flatten());
                asleep.map(drop)
            }
            Some(Ask::Settled(answer)) => {
                let settled = match held {
                    true => steps::settled_async(listener, &snapshot).await.map(Some),
                    false => Ok(None),
                };
                let _ = answer.send(settled.as_ref().ok().copied().flatten());
                settled.map(drop)
            }
            Some(Ask::Awake) if held => {
                held = false;
                steps::awake_async(listener).await
            }
            Some(Ask::Awake) => Ok(()),
        };
        // A failed statement: the connection is given up (its lock with
        // it) and opened again.
        if let Err(e) = answered {
            return RelayError::Database(e);
        }
    }
}
