//! A relay's side of the outbox: one short transaction settles what was
//! published and claims the next batch ([`step_async`]).

#[cfg(feature = "async")]
use super::headers::decode_headers;
#[cfg(feature = "async")]
use super::id::uuid_v7;
#[cfg(feature = "async")]
use super::statements::{count_of, micros, now_micros, relay_transaction, time, unexpected};
#[cfg(feature = "async")]
use crate::backend::asynchronous::AsyncInboxConnection;
#[cfg(feature = "async")]
use crate::backend::outbox::{Answer, ClaimedRow, Floor, Op};
#[cfg(feature = "async")]
use crate::error::InboxError;
#[cfg(feature = "async")]
use crate::ops::ops_error;
#[cfg(feature = "async")]
use diesel::result::Error;
#[cfg(feature = "async")]
use std::time::Duration;
use std::time::SystemTime;

/// A message a relay claimed, as its publisher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxMessage {
    /// The message id: AMQP `message_id`, NATS `Nats-Msg-Id`.
    pub id: String,
    /// The routing key (RabbitMQ) or subject (NATS).
    pub destination: String,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// The body.
    pub payload: Vec<u8>,
    /// The headers, in the order they were set.
    pub headers: Vec<(String, String)>,
    /// Failed publishes before this one.
    pub attempts: u32,
    /// When it was enqueued (the database's clock).
    pub enqueued_at: SystemTime,
}

#[cfg(feature = "async")]
/// What a relay's claim holds: the messages, and the lease under which
/// they are the relay's until it settles them.
#[doc(hidden)]
#[derive(Debug)]
pub struct Claim {
    token: String,
    pub(super) seqs: Vec<i64>,
    created: Vec<i64>,
    /// The claimed messages in waves ([`waves`](Self::waves)): the first
    /// wave holds the oldest claimed message of each ordering key and the
    /// messages without one, the second each key's next, and so on; oldest
    /// first within a wave.
    pub messages: Vec<OutboxMessage>,
    /// Where each wave of `messages` ends: a key's message is published
    /// only once the broker confirmed its key's message of the wave before.
    pub waves: Vec<usize>,
}

#[cfg(feature = "async")]
impl Claim {
    /// The claim of `rows` (oldest first), arranged in waves.
    pub(super) fn of(token: String, rows: Vec<ClaimedRow>) -> Self {
        let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        let mut rows: Vec<(usize, ClaimedRow)> = rows
            .into_iter()
            .map(|row| {
                let wave = match &row.ordering_key {
                    Some(key) => {
                        let next = seen.entry(key.clone()).or_insert(0);
                        *next += 1;
                        *next - 1
                    }
                    None => 0,
                };
                (wave, row)
            })
            .collect();
        // Stable: oldest first within a wave.
        rows.sort_by_key(|(wave, _)| *wave);
        let mut claim = Claim {
            token,
            seqs: Vec::with_capacity(rows.len()),
            created: Vec::with_capacity(rows.len()),
            messages: Vec::with_capacity(rows.len()),
            waves: Vec::new(),
        };
        for (i, (wave, row)) in rows.into_iter().enumerate() {
            // Wave `w` starts: wave `w - 1` ends here.
            if wave > claim.waves.len() {
                claim.waves.push(i);
            }
            claim.seqs.push(row.seq);
            claim.created.push(row.created_at);
            claim.messages.push(OutboxMessage {
                id: row.id,
                destination: row.destination,
                ordering_key: row.ordering_key,
                payload: row.payload,
                headers: decode_headers(row.headers.as_deref()),
                attempts: row.attempts.max(0) as u32,
                enqueued_at: time(row.created_at),
            });
        }
        if !claim.messages.is_empty() {
            claim.waves.push(claim.messages.len());
        }
        claim
    }
}

#[cfg(feature = "async")]
/// How one claimed message's publish ended.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The broker confirmed it: the row is deleted.
    Published,
    /// The broker refused this message (unroutable, no stream, too
    /// large): counted; due again after `retry_in`; dead at
    /// `max_publish_attempts`.
    Failed {
        error: String,
        retry_in: Duration,
        max_publish_attempts: u32,
    },
    /// Not published, through no fault of the message (the broker is
    /// down, the relay stops): given back uncounted.
    Released,
}

#[cfg(feature = "async")]
/// What settling a claim did.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settled {
    pub published: u64,
    pub failed: u64,
    pub dead: u64,
    pub released: u64,
}

/// What a relay's [`step_async`] did: the settlements' counts, and the
/// next batch when it claimed one that is not empty.
#[doc(hidden)]
#[cfg(feature = "async")]
#[derive(Debug, Default)]
pub struct Stepped {
    pub settled: Settled,
    pub claim: Option<Claim>,
}

/// One step of a relay, in one short transaction: settles each
/// `(claim, outcomes)` of `settle` (`outcomes[i]` is how
/// `claim.messages[i]`'s publish ended; a row another relay took over
/// after the lease ran out is left to it), then, with `next = Some((limit,
/// lease))`, claims up to `limit` due messages: of each ordering key the
/// oldest that is not dead and its next ones up to the first not due,
/// skipping rows other relays hold (`FOR UPDATE SKIP LOCKED`; SQLite's
/// immediate transaction serializes claims), each held for `lease`, in
/// waves ([`Claim::waves`]). The claim sees the settlements before it: a
/// published message lets its key's next one through.
///
/// A relay's check of the database server at start: the catalog query,
/// which reads the settings a commit's durability stands on and says once
/// per process (WARN) where the server may lose committed transactions.
#[doc(hidden)]
#[cfg(feature = "async")]
pub async fn check_server_async<C: AsyncInboxConnection>(conn: &mut C) -> Result<(), Error> {
    conn.catalog().await.map(|_| ())
}

/// Reports published, failed and dead messages to telemetry (the
/// commit-to-confirm latency of each published one, a WARN per dead one).
///
/// `floor` is where the claim's look starts (PostgreSQL): the relay keeps
/// the one its last claim left, and starts again from none after an error.
#[doc(hidden)]
#[cfg(feature = "async")]
pub async fn step_async<C: AsyncInboxConnection>(
    conn: &mut C,
    settle: &[(&Claim, &[PublishOutcome])],
    next: Option<(usize, Duration)>,
    floor: &mut Option<Floor>,
) -> Result<Stepped, InboxError> {
    let mut ops = Vec::new();
    let plans: Vec<SettlePlan> = settle
        .iter()
        .map(|(claim, outcomes)| SettlePlan::of(claim, outcomes, &mut ops))
        .collect();
    let token = next.map(|(limit, lease)| {
        let token = uuid_v7();
        ops.push(Op::Claim {
            limit: limit.clamp(1, 100_000) as i64,
            lease: lease.as_micros() as i64,
            token: token.clone(),
            floor: floor.take(),
        });
        token
    });
    if ops.is_empty() {
        return Ok(Stepped::default());
    }
    let mut answers = relay_transaction(conn, ops)
        .await
        .map_err(ops_error::<C::Backend>)?
        .into_iter();
    let mut stepped = Stepped::default();
    for ((claim, _), plan) in settle.iter().zip(plans) {
        plan.read(claim, &mut answers, &mut stepped.settled)?;
    }
    if let Some(token) = token {
        match answers.next() {
            Some(Answer::Claimed(rows, left)) => {
                *floor = left;
                stepped.claim = (!rows.is_empty()).then(|| Claim::of(token, rows));
            }
            Some(other) => return Err(unexpected(other)),
            None => return Err(unexpected_end()),
        }
    }
    Ok(stepped)
}

/// The statements of one claim's settlement, and where their answers go.
#[cfg(feature = "async")]
struct SettlePlan {
    /// The failed messages' indexes, errors and attempt limits, one
    /// statement each.
    failed: Vec<(usize, String, u32)>,
    /// The published messages' indexes, one delete.
    published: Vec<usize>,
    /// Whether one update gives rows back.
    released: bool,
}

#[cfg(feature = "async")]
impl SettlePlan {
    /// Pushes the settlement's statements onto `ops`: the failures'
    /// counts, the published rows' delete, the given-back rows' release.
    fn of(claim: &Claim, outcomes: &[PublishOutcome], ops: &mut Vec<Op>) -> Self {
        let mut plan = SettlePlan {
            failed: Vec::new(),
            published: Vec::new(),
            released: false,
        };
        let mut released = Vec::new();
        for (i, outcome) in outcomes.iter().enumerate().take(claim.seqs.len()) {
            let seq = claim.seqs[i];
            match outcome {
                PublishOutcome::Published => plan.published.push(i),
                PublishOutcome::Released => released.push(seq),
                PublishOutcome::Failed {
                    error,
                    retry_in,
                    max_publish_attempts,
                } => {
                    plan.failed.push((i, error.clone(), *max_publish_attempts));
                    ops.push(Op::Failed {
                        token: claim.token.clone(),
                        seq,
                        error: error.clone(),
                        delay: retry_in.as_micros() as i64,
                        max_attempts: (*max_publish_attempts).min(i32::MAX as u32) as i32,
                    });
                }
            }
        }
        if !plan.published.is_empty() {
            ops.push(Op::Published {
                token: claim.token.clone(),
                seqs: plan.published.iter().map(|&i| claim.seqs[i]).collect(),
            });
        }
        if !released.is_empty() {
            plan.released = true;
            ops.push(Op::Released {
                token: claim.token.clone(),
                seqs: released,
            });
        }
        plan
    }

    /// Reads the settlement's answers off `answers`, in the order [`of`]
    /// pushed its statements, counts them into `settled` and reports them
    /// to telemetry.
    ///
    /// [`of`]: SettlePlan::of
    fn read(
        self,
        claim: &Claim,
        answers: &mut impl Iterator<Item = Answer>,
        settled: &mut Settled,
    ) -> Result<(), InboxError> {
        let (failed, dead) = (settled.failed, settled.dead);
        for (i, error, max_attempts) in self.failed {
            let updated = count_of(answers.next().ok_or_else(unexpected_end)?)?;
            let message = &claim.messages[i];
            if updated == 1 && message.attempts + 1 >= max_attempts {
                settled.dead += 1;
                tracing::warn!(
                    target: crate::target::TARGET,
                    id = %message.id,
                    destination = %message.destination,
                    attempts = message.attempts + 1,
                    error = %error,
                    "diesel-inbox: outbox message is dead"
                );
            } else {
                settled.failed += updated;
            }
        }
        if !self.published.is_empty() {
            settled.published += count_of(answers.next().ok_or_else(unexpected_end)?)?;
            let now = now_micros();
            let latencies: Vec<Duration> = self
                .published
                .iter()
                .map(|&i| micros(now - claim.created[i]))
                .collect();
            crate::telemetry::outbox_published(&latencies);
        }
        if self.released {
            settled.released += count_of(answers.next().ok_or_else(unexpected_end)?)?;
        }
        crate::telemetry::outbox_failed(settled.failed - failed, settled.dead - dead);
        Ok(())
    }
}

#[cfg(feature = "async")]
pub(super) fn unexpected_end() -> InboxError {
    InboxError::Database(Error::QueryBuilderError(
        "an outbox settlement returned fewer answers than statements".into(),
    ))
}

/// The wake-ups so far: [`woken`] waits for the next.
#[doc(hidden)]
pub fn wake_generation() -> u64 {
    crate::wake::generation()
}

/// Resolves at the first [`wake`](super::wake) after [`wake_generation`] returned
/// `seen`.
#[doc(hidden)]
pub fn woken(seen: u64) -> impl std::future::Future<Output = ()> + Send {
    crate::wake::Woken { seen }
}
