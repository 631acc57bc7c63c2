//! Retryable conflicts: serialization failures and deadlocks, with the
//! handlers' own error types.

use crate::backend::{Deadlock, FaultBackend};
use crate::common::backend::TestBackend;
use crate::common::TestDb;
use crate::ensure;
use crate::scenario::{setup, text};
use crate::session::Session;
use crate::{fault_run_id, message, Outcome, ScenarioResult};
use diesel_inbox::{InboxError, Processed};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Barrier, Mutex};
use std::time::Duration;

fn no_serializable<B: FaultBackend>() -> Option<ScenarioResult> {
    B::SERIALIZABLE_SNAPSHOT.is_none().then(|| {
        Ok(Outcome::Skip(
            "no SERIALIZABLE level with snapshot isolation and conflict detection".into(),
        ))
    })
}

pub fn serializable_overlapping_writes<S: Session>() -> ScenarioResult {
    if let Some(skip) = no_serializable::<S::B>() {
        return skip;
    }
    const THREADS: usize = 4;
    const MESSAGES: i64 = 100;
    let (db, mut conn) = setup::<S::B>("serializable_overlapping_writes")?;
    let run = fault_run_id();
    let total = format!("{run}:total");
    text(S::B::new_counter(&mut conn, &total))?;
    let runs = AtomicU32::new(0);
    let barrier = Barrier::new(THREADS);
    let results: Vec<Result<(usize, usize), String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (db, run, barrier, runs) = (&db, &run, &barrier, &runs);
                scope.spawn(move || -> Result<(usize, usize), String> {
                    let mut session = S::open(db);
                    text(session.execute(S::B::SERIALIZABLE_SNAPSHOT.expect("checked")))?;
                    barrier.wait();
                    let (mut applied, mut duplicates) = (0, 0);
                    for n in 0..MESSAGES {
                        let seq = (n + t as i64 * MESSAGES / THREADS as i64) % MESSAGES;
                        match session.add_to_shared_counter(&message(run, seq), runs) {
                            Ok(Processed::Applied(())) => applied += 1,
                            Ok(Processed::Duplicate) => duplicates += 1,
                            Err(e) => return Err(format!("{seq}: {e}")),
                        }
                    }
                    Ok((applied, duplicates))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    let (mut applied, mut duplicates) = (0, 0);
    for r in results {
        let (a, d) = r?;
        applied += a;
        duplicates += d;
    }
    let runs = runs.load(Ordering::SeqCst) as i64;
    let expected_total: i64 = (0..MESSAGES).map(|s| message(&run, s).amount).sum();
    let counted = text(S::B::counter(&mut conn, &total))?;
    ensure!(applied == MESSAGES as usize, "{applied} applied");
    ensure!(
        duplicates == (THREADS - 1) * MESSAGES as usize,
        "{duplicates} duplicates"
    );
    ensure!(
        counted == expected_total,
        "counter {counted}, expected {expected_total}"
    );
    ensure!(
        S::B::effects_of(&mut conn, &run).len() == MESSAGES as usize,
        "business rows not exact"
    );
    ensure!(
        runs > MESSAGES,
        "no serialization failure happened ({runs} body runs): the scenario proved nothing"
    );
    Ok(Outcome::Pass(format!(
        "| {} | SERIALIZABLE handlers, overlapping writes ({}) | {THREADS} sessions | {MESSAGES} × {THREADS} deliveries | every body updates one shared row | {} serialization failures retried; counter and business rows exact, no errors |",
        S::B::LABEL,
        S::MODE,
        runs - MESSAGES
    )))
}

pub fn serialization_failure_retried_then_exhausted<S: Session>() -> ScenarioResult {
    if let Some(skip) = no_serializable::<S::B>() {
        return skip;
    }
    let (db, mut conn) = setup::<S::B>("serialization_failure")?;
    serialization_failure_on::<S>(&db, &mut conn)
}

/// [`serialization_failure_retried_then_exhausted`] on a given database.
pub fn serialization_failure_on<S: Session>(
    db: &TestDb,
    conn: &mut <S::B as TestBackend>::Conn,
) -> ScenarioResult {
    let mut session = S::open(db);
    text(session.execute(S::B::SERIALIZABLE_SNAPSHOT.expect("checked")))?;
    let other = Mutex::new(S::B::open(db));
    let run = fault_run_id();
    let total = format!("{run}:total");
    text(S::B::new_counter(conn, &total))?;

    // Interfered once: the second attempt commits.
    let runs = AtomicU32::new(0);
    let first = message(&run, 1);
    let out = text(session.interfered(&first, &other, 1, &runs))?;
    ensure!(out.is_applied(), "not applied after one retry");
    let attempts = runs.load(Ordering::SeqCst);
    ensure!(attempts == 2, "{attempts} attempts, expected 2");
    let counted = text(S::B::counter(conn, &total))?;
    ensure!(counted == 1000 + first.amount, "counter {counted}");

    // Interfered every time: 1 + retries attempts, then an error naming them.
    let runs = AtomicU32::new(0);
    let second = message(&run, 2);
    let err = match session.interfered(&second, &other, u32::MAX, &runs) {
        Err(e) => e,
        Ok(p) => return Err(format!("expected exhaustion, got {p:?}")),
    };
    let inbox = match &err {
        diesel::result::Error::QueryBuilderError(inner) => inner.downcast_ref::<InboxError>(),
        _ => None,
    };
    ensure!(
        matches!(
            inbox,
            Some(InboxError::RetriesExhausted { attempts: 3, .. })
        ),
        "expected RetriesExhausted after 3 attempts, got {err:?}"
    );
    let attempts = runs.load(Ordering::SeqCst);
    ensure!(attempts == 3, "{attempts} attempts");
    ensure!(
        S::B::inbox_rows_of_run(conn, "fault-interfered", &run) == 1,
        "the exhausted message left an inbox row"
    );
    Ok(Outcome::Pass(format!(
        "| {} | forced serialization failure (40001, {}) | 2 sessions | 2 | a concurrent update after the snapshot, once / on every attempt | applied on attempt 2; then `{err}` |",
        S::B::LABEL,
        S::MODE
    )))
}

pub fn deadlock_retried<S: Session>() -> ScenarioResult {
    match S::B::DEADLOCK {
        Deadlock::LockOrder => {
            let (db, mut conn) = setup::<S::B>("deadlock_retried")?;
            lock_order_deadlock::<S>(&db, &mut conn)
        }
        Deadlock::DuplicateKey => duplicate_key_deadlock::<S>(),
        Deadlock::None => Ok(Outcome::Skip("writers are serialized: no deadlock".into())),
    }
}

/// Two handlers lock two rows in opposite order, on a given database.
pub fn lock_order_deadlock<S: Session>(
    db: &TestDb,
    conn: &mut <S::B as TestBackend>::Conn,
) -> ScenarioResult {
    const ROUNDS: i64 = 3;
    let run = fault_run_id();
    let (x, y) = (format!("{run}:x"), format!("{run}:y"));
    text(S::B::new_counter(conn, &x))?;
    text(S::B::new_counter(conn, &y))?;
    let mut retried = 0;
    for round in 0..ROUNDS {
        let meet = Barrier::new(2);
        let outcomes: Vec<_> = std::thread::scope(|scope| {
            let pair: Vec<_> = [(&x, &y), (&y, &x)]
                .into_iter()
                .enumerate()
                .map(|(i, (first, second))| {
                    let (db, run, meet) = (db, &run, &meet);
                    scope.spawn(move || {
                        let runs = AtomicU32::new(0);
                        let mut session = S::open(db);
                        let m = message(run, round * 2 + i as i64);
                        let out = session.lock_two(&m, first, second, meet, &runs);
                        (
                            out.map_err(|e| format!("{e:?}")),
                            runs.load(Ordering::SeqCst),
                        )
                    })
                })
                .collect();
            pair.into_iter().map(|h| h.join()).collect()
        });
        for outcome in outcomes {
            let (out, runs) = outcome.map_err(|_| "handler panicked")?;
            ensure!(
                matches!(out, Ok(Processed::Applied(()))),
                "round {round}: {out:?}"
            );
            retried += runs - 1;
        }
    }
    ensure!(
        retried >= ROUNDS as u32,
        "{retried} retries for {ROUNDS} deadlocks"
    );
    let (vx, vy) = (
        text(S::B::counter(conn, &x))?,
        text(S::B::counter(conn, &y))?,
    );
    ensure!(vx == 2 * ROUNDS && vy == 2 * ROUNDS, "counters {vx}, {vy}");
    ensure!(
        S::B::effects_of(conn, &run).len() == 2 * ROUNDS as usize,
        "business rows not exact"
    );
    Ok(Outcome::Pass(format!(
        "| {} | deadlock (40P01, {} handlers) | 2 sessions × {ROUNDS} rounds | {} | two handlers lock two rows in opposite order; their error type is a plain enum with only `Debug` | {retried} deadlock victims retried (seen by the runtime from the failed statement); all applied once, counters exact |",
        S::B::LABEL,
        S::MODE,
        2 * ROUNDS
    )))
}

fn duplicate_key_deadlock<S: Session>() -> ScenarioResult {
    const ROUNDS: i64 = 10;
    let (db, mut conn) = setup::<S::B>("deadlock_retried")?;
    let run = fault_run_id();
    let before = S::B::deadlocks_so_far(&mut conn);
    for seq in 0..ROUNDS {
        let m = message(&run, seq);
        let (first, outcomes) = std::thread::scope(|scope| {
            let (claimed_tx, claimed_rx) = mpsc::channel();
            let (db, m) = (&db, &m);
            let holder = scope.spawn(move || {
                let mut session = S::open(db);
                text(session.hold_then_fail(m, &claimed_tx))
            });
            if claimed_rx.recv_timeout(Duration::from_secs(10)).is_err() {
                return (Err("the first session never claimed".to_string()), vec![]);
            }
            let waiters: Vec<_> = (0..2)
                .map(|_| {
                    scope.spawn(move || {
                        let mut session = S::open(db);
                        text(session.dupkey_apply(m))
                    })
                })
                .collect();
            let first = holder
                .join()
                .unwrap_or_else(|_| Err("holder panicked".into()));
            let outcomes: Vec<_> = waiters
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|_| Err("waiter panicked".into())))
                .collect();
            (first, outcomes)
        });
        ensure!(
            matches!(first, Err(ref e) if e != "the first session never claimed"),
            "the holder was meant to roll back: {first:?}"
        );
        let outcomes: Vec<_> = outcomes.into_iter().collect::<Result<_, String>>()?;
        let applied = outcomes.iter().filter(|o| o.is_applied()).count();
        ensure!(
            applied == 1,
            "round {seq}: {applied} of the two waiters applied ({outcomes:?})"
        );
    }
    let deadlocks = match (before, S::B::deadlocks_so_far(&mut conn)) {
        (Some(before), Some(after)) => (after - before).to_string(),
        _ => "unknown".to_string(),
    };
    let rows = S::B::effects_of(&mut conn, &run);
    ensure!(
        rows.len() == ROUNDS as usize,
        "{} business rows for {ROUNDS} keys",
        rows.len()
    );
    Ok(Outcome::Pass(format!(
        "| {} | three-session duplicate-key deadlock ({} handlers) | 3 sessions × {ROUNDS} rounds | {ROUNDS} | a claim rolled back while two redeliveries wait on it | {deadlocks} InnoDB deadlocks (1213) retried; exactly one waiter applied each round, no errors |",
        S::B::LABEL,
        S::MODE
    )))
}
