//! Worker processes on one database: many at once, and one at a time,
//! aborting at every crash point and restarted.

use crate::backend::FaultBackend;
use crate::common::backend::TestBackend;
use crate::ensure;
use crate::scenario::{check_exact, env_num, env_var, setup, spawn_worker, text};
use crate::session::Session;
use crate::{delivery_stream, fault_run_id, message, CrashPoint, Outcome, ScenarioResult};
use diesel_inbox::Processed;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;

const STREAM_SEED: u64 = 0x5eed;

/// A worker process's role; returns its exit code.
pub fn worker<S: Session>(role: &str) -> i32 {
    match role {
        "stream" => stream_worker::<S>(),
        "queue" => queue_worker::<S>(),
        other => {
            eprintln!("unknown worker role {other}");
            2
        }
    }
}

/// Consumes its share of the shared stream with several threads (each a
/// session) and prints `applied=A duplicates=D errors=E`.
fn stream_worker<S: Session>() -> i32 {
    let (url, run) = (env_var("INBOX_FAULT_URL"), env_var("INBOX_FAULT_RUN"));
    let (index, workers, threads) = (
        env_num("INBOX_FAULT_INDEX"),
        env_num("INBOX_FAULT_WORKERS"),
        env_num("INBOX_FAULT_THREADS"),
    );
    let stream = delivery_stream(
        env_num("INBOX_FAULT_MESSAGES"),
        env_num("INBOX_FAULT_DUPLICATES"),
        STREAM_SEED,
    );
    let mine: Arc<Vec<i64>> = Arc::new(
        stream
            .iter()
            .enumerate()
            .filter(|(i, _)| i % workers == index)
            .map(|(_, s)| *s)
            .collect(),
    );
    let (mut applied, mut duplicates, mut errors) = (0u64, 0u64, Vec::new());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (url, run, mine) = (&url, &run, &mine);
                scope.spawn(move || {
                    let mut session = S::open(url);
                    let (mut applied, mut duplicates, mut errors) = (0u64, 0u64, Vec::new());
                    for seq in mine.iter().skip(t).step_by(threads) {
                        match session.consume(&message(run, *seq), None) {
                            Ok(Processed::Applied(())) => applied += 1,
                            Ok(Processed::Duplicate) => duplicates += 1,
                            Err(e) => errors.push(format!("{seq}: {e}")),
                        }
                    }
                    (applied, duplicates, errors)
                })
            })
            .collect();
        for h in handles {
            let (a, d, e) = h.join().expect("worker thread");
            applied += a;
            duplicates += d;
            errors.extend(e);
        }
    });
    for e in errors.iter().take(5) {
        eprintln!("error: {e}");
    }
    println!(
        "applied={applied} duplicates={duplicates} errors={}",
        errors.len()
    );
    0
}

pub fn many_processes<S: Session>() -> ScenarioResult {
    const PROCESSES: usize = 4;
    const THREADS: usize = 2;
    const MESSAGES: usize = 5_000;
    const DUPLICATE_PERCENT: usize = 30;
    let (db, mut conn) = setup::<S::B>("many_processes")?;
    let run = fault_run_id();
    let stream_len = delivery_stream(MESSAGES, DUPLICATE_PERCENT, STREAM_SEED).len();
    let children: Vec<_> = (0..PROCESSES)
        .map(|index| {
            spawn_worker::<S::B>(
                S::MODE,
                "stream",
                &[
                    ("INBOX_FAULT_URL", db.url.clone()),
                    ("INBOX_FAULT_RUN", run.clone()),
                    ("INBOX_FAULT_INDEX", index.to_string()),
                    ("INBOX_FAULT_WORKERS", PROCESSES.to_string()),
                    ("INBOX_FAULT_THREADS", THREADS.to_string()),
                    ("INBOX_FAULT_MESSAGES", MESSAGES.to_string()),
                    ("INBOX_FAULT_DUPLICATES", DUPLICATE_PERCENT.to_string()),
                ],
            )
            .spawn()
            .map_err(|e| format!("spawn worker: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let (mut applied, mut duplicates, mut errors) = (0usize, 0usize, 0usize);
    for child in children {
        let out = text(child.wait_with_output())?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "worker failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find(|l| l.starts_with("applied="))
            .ok_or("worker printed no counts")?;
        let nums: Vec<usize> = line
            .split_whitespace()
            .filter_map(|kv| kv.split('=').nth(1)?.parse().ok())
            .collect();
        ensure!(nums.len() == 3, "bad worker line {line}");
        applied += nums[0];
        duplicates += nums[1];
        errors += nums[2];
        if nums[2] > 0 {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    ensure!(errors == 0, "{errors} deliveries failed");
    ensure!(
        applied == MESSAGES,
        "{applied} applied for {MESSAGES} messages"
    );
    ensure!(
        applied + duplicates == stream_len,
        "{} outcomes for {stream_len} deliveries",
        applied + duplicates
    );
    check_exact::<S::B>(&mut conn, &run, 0..MESSAGES as i64)?;
    Ok(Outcome::Pass(format!(
        "| {} | many processes, one database ({} handlers) | {PROCESSES} processes × {THREADS} sessions | {MESSAGES} ({stream_len} deliveries) | {DUPLICATE_PERCENT}% duplicates, shuffled, delivered concurrently | {applied} applied, {duplicates} duplicates, 0 errors; business rows exact |",
        S::B::LABEL,
        S::MODE
    )))
}

/// Takes unacked messages in order (through a sync connection: the
/// "broker"), handles each in its session, acks it; aborts at
/// `INBOX_FAULT_CRASH` on the first delivery of every fifth message.
fn queue_worker<S: Session>() -> i32 {
    let (url, run) = (env_var("INBOX_FAULT_URL"), env_var("INBOX_FAULT_RUN"));
    let point = CrashPoint::parse(&env_var("INBOX_FAULT_CRASH")).expect("a crash point");
    let mut broker = S::B::open(&url);
    let mut session = S::open(&url);
    loop {
        let (seq, earlier_deliveries) = match S::B::receive(&mut broker, &run) {
            Ok(Some(row)) => row,
            Ok(None) => return 0,
            Err(e) => {
                eprintln!("receive failed: {e}");
                return 3;
            }
        };
        let crash = (earlier_deliveries == 0 && seq % 5 == 0).then_some(point);
        if crash == Some(CrashPoint::BeforeClaim) {
            std::process::abort();
        }
        if let Err(e) = session.consume(&message(&run, seq), crash) {
            eprintln!("handler failed on {seq}: {e}");
            return 4;
        }
        if crash == Some(CrashPoint::AfterCommit) {
            std::process::abort();
        }
        let acked = S::B::ack(&mut broker, &run, seq, || {
            if crash == Some(CrashPoint::DuringAck) {
                std::process::abort();
            }
        });
        if let Err(e) = acked {
            eprintln!("ack failed on {seq}: {e}");
            return 5;
        }
    }
}

pub fn crash_at_every_point<S: Session>() -> ScenarioResult {
    const MESSAGES: i64 = 200;
    let (db, mut conn) = setup::<S::B>("crash_at_every_point")?;
    let mut crashes_by_point = Vec::new();
    for point in CrashPoint::ALL {
        let run = fault_run_id();
        let messages: Vec<_> = (0..MESSAGES)
            .map(|seq| {
                let m = message(&run, seq);
                (seq, m.key, m.amount)
            })
            .collect();
        text(S::B::enqueue(&mut conn, &run, &messages))?;
        let mut crashes = 0;
        loop {
            ensure!(
                crashes <= MESSAGES,
                "{}: workers keep crashing",
                point.name()
            );
            let out = spawn_worker::<S::B>(
                S::MODE,
                "queue",
                &[
                    ("INBOX_FAULT_URL", db.url.clone()),
                    ("INBOX_FAULT_RUN", run.clone()),
                    ("INBOX_FAULT_CRASH", point.name().to_string()),
                ],
            )
            .output()
            .map_err(|e| format!("spawn worker: {e}"))?;
            if out.status.success() {
                break;
            }
            ensure!(
                out.status.signal() == Some(6),
                "{}: worker failed ({}): {}",
                point.name(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            crashes += 1;
        }
        ensure!(
            crashes == MESSAGES / 5,
            "{}: {crashes} crashes, expected {}",
            point.name(),
            MESSAGES / 5
        );
        let unacked = text(S::B::unacked(&mut conn, &run))?;
        ensure!(
            unacked == 0,
            "{}: {unacked} messages never acked",
            point.name()
        );
        check_exact::<S::B>(&mut conn, &run, 0..MESSAGES)
            .map_err(|e| format!("{}: {e}", point.name()))?;
        crashes_by_point.push(format!("{} {crashes}", point.name()));
    }
    Ok(Outcome::Pass(format!(
        "| {} | crash at every point ({} handlers) | 1 worker process at a time, restarted after each abort | {MESSAGES} per crash point | `abort()` on the first delivery of every 5th message: {} | every message acked, applied once; business rows exact |",
        S::B::LABEL,
        S::MODE,
        crashes_by_point.join(", ")
    )))
}
