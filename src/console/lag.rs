//! A Kafka partition's lag for the overview's stream positions (feature
//! `kafka`, [`ConsoleExt::kafka_lag`](super::ConsoleExt::kafka_lag)): its
//! high watermark, asked of the brokers, less the stored position.
//!
//! One console asks the brokers at most once at a time, and at most once
//! per refresh interval, however many tabs are open: the pages in between
//! take the last answer, and a page that comes while the brokers are being
//! asked waits for that answer rather than asking again. The asking runs
//! on one blocking thread with one client; it stops at the console's time
//! limit or when the console is dropped, and its client with it, so
//! brokers that do not answer hold no more than that one thread.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// At most this many partitions are asked (one request each).
const MAX_PARTITIONS: usize = 100;

/// How long one partition's watermarks may take.
const PER_PARTITION: Duration = Duration::from_secs(2);

/// How long an answer is used: the overview's refresh interval
/// (`console.js`).
const FRESH_FOR: Duration = Duration::from_secs(5);

/// A partition: its topic and number.
type Partition = (String, i32);

/// What the brokers said: each partition's high watermark, or why not.
type Answer = Result<HashMap<Partition, i64>, String>;

/// One console's lag asker (shared by its requests).
pub(super) struct Lags {
    brokers: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The last answer and when it was asked for.
    last: Option<(Instant, Answer)>,
    /// The asking under way, since when: its answer arrives here.
    asking: Option<(Instant, watch::Receiver<Option<Answer>>)>,
}

impl Lags {
    pub(super) fn new(brokers: String) -> Arc<Self> {
        Arc::new(Lags {
            brokers,
            state: Mutex::default(),
        })
    }

    /// The lag of each `(topic, partition, next_offset)`, in order (`None`
    /// for a partition not asked); or why the brokers did not say (within
    /// the console's time limit).
    pub(super) async fn lags(
        self: &Arc<Self>,
        positions: &[(String, i32, i64)],
    ) -> Result<Vec<Option<i64>>, String> {
        let wanted: Vec<Partition> = positions
            .iter()
            .take(MAX_PARTITIONS)
            .map(|(topic, partition, _)| (topic.clone(), *partition))
            .collect();
        let mut answer = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((asked, last)) = &state.last {
                let covers = last
                    .as_ref()
                    .map_or(true, |highs| wanted.iter().all(|p| highs.contains_key(p)));
                if asked.elapsed() < FRESH_FOR && covers {
                    return lags(last, positions);
                }
            }
            match &state.asking {
                // An asking that panicked dropped its sender, and one that
                // outlived its deadline is stuck: ask anew.
                Some((since, answer))
                    if answer.has_changed().is_ok()
                        && since.elapsed() < 2 * super::QUERY_TIME_LIMIT =>
                {
                    answer.clone()
                }
                _ => {
                    let (tell, answer) = watch::channel(None);
                    state.asking = Some((Instant::now(), answer.clone()));
                    let console = Arc::downgrade(self);
                    let brokers = self.brokers.clone();
                    tokio::task::spawn_blocking(move || ask(&console, &brokers, &wanted, &tell));
                    answer
                }
            }
        };
        let limit = super::QUERY_TIME_LIMIT;
        let said = match tokio::time::timeout(limit, answer.wait_for(Option::is_some)).await {
            Ok(Ok(said)) => said.clone().expect("waited for an answer"),
            Ok(Err(_)) => Err("the lag's asking ended without an answer".to_owned()),
            Err(_) => Err(format!(
                "the brokers did not answer within {} seconds",
                limit.as_secs()
            )),
        };
        lags(&said, positions)
    }
}

/// Asks the brokers for each partition's high watermark, on a blocking
/// thread, until the console's time limit or the console is gone; keeps
/// the answer and tells the waiting pages.
fn ask(
    console: &Weak<Lags>,
    brokers: &str,
    wanted: &[Partition],
    tell: &watch::Sender<Option<Answer>>,
) {
    // The answer is as old as its asking: its watermarks may be up to
    // the time limit older than the positions they are compared with.
    let asked = Instant::now();
    let answer = watermarks(console, brokers, wanted, asked + super::QUERY_TIME_LIMIT);
    if let Some(lags) = console.upgrade() {
        let mut state = lags.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.last = Some((asked, answer.clone()));
        state.asking = None;
    }
    tell.send_replace(Some(answer));
}

fn watermarks(
    console: &Weak<Lags>,
    brokers: &str,
    wanted: &[Partition],
    deadline: Instant,
) -> Answer {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| format!("no Kafka client for {brokers}: {e}"))?;
    let mut highs = HashMap::with_capacity(wanted.len());
    for (topic, partition) in wanted {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || console.strong_count() == 0 {
            return Err(format!(
                "the brokers did not answer within {} seconds",
                super::QUERY_TIME_LIMIT.as_secs()
            ));
        }
        let (_, high) = client
            .fetch_watermarks(topic, *partition, left.min(PER_PARTITION))
            .map_err(|e| format!("{topic}/{partition}: {e}"))?;
        highs.insert((topic.clone(), *partition), high);
    }
    Ok(highs)
}

/// Each position's lag from the watermarks (`None` where the answer has
/// no watermark for its partition).
fn lags(answer: &Answer, positions: &[(String, i32, i64)]) -> Result<Vec<Option<i64>>, String> {
    let highs = answer.as_ref().map_err(Clone::clone)?;
    Ok(positions
        .iter()
        .map(|(topic, partition, next)| {
            let high = highs.get(&(topic.clone(), *partition))?;
            Some((high - next).max(0))
        })
        .collect())
}
