//! Randomized schedules (proptest): body errors, panics, crashes after
//! commit and redeliveries over several sessions, in random order.

use crate::backend::FaultBackend;
use crate::scenario::{check_exact, setup};
use crate::session::{Fate, Session};
use crate::{fault_run_id, message, Outcome, ScenarioResult};
use diesel_inbox::Processed;
use std::panic::AssertUnwindSafe;

pub fn randomized_schedules<S: Session>() -> ScenarioResult {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    const WORKERS: usize = 3;
    const MESSAGES: i64 = 6;
    let cases: u32 = std::env::var("INBOX_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let (db, check) = setup::<S::B>("randomized_schedules")?;
    let check = std::cell::RefCell::new(check);
    let workers = std::cell::RefCell::new((0..WORKERS).map(|_| S::open(&db)).collect::<Vec<S>>());
    let fate = prop_oneof![
        4 => Just(Fate::Acked),
        2 => Just(Fate::BodyFails),
        1 => Just(Fate::Panics),
        2 => Just(Fate::CrashAfterCommit),
    ];
    let step = (0..WORKERS, 0..MESSAGES, fate);
    let schedule = proptest::collection::vec(step, 1..40);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let deliveries = std::cell::Cell::new(0usize);
    let prev_hook = std::panic::take_hook();
    // The injected panics are expected: keep them off stderr.
    std::panic::set_hook(Box::new(|_| {}));
    let result = runner.run(&schedule, |steps| {
        let run = fault_run_id();
        let mut acked = [false; MESSAGES as usize];
        let mut workers = workers.borrow_mut();
        // Whether the delivery ended in an ack.
        let mut deliver = |worker: usize, seq: i64, fate: Fate| -> Result<bool, TestCaseError> {
            deliveries.set(deliveries.get() + 1);
            let session = &mut workers[worker];
            let out = std::panic::catch_unwind(AssertUnwindSafe(|| {
                session.scheduled(&message(&run, seq), fate)
            }));
            Ok(match (fate, out) {
                (Fate::Panics, Err(_)) | (Fate::BodyFails, Ok(Err(_))) => false,
                (Fate::Panics | Fate::BodyFails, Ok(Ok(Processed::Duplicate))) => true,
                (Fate::Acked, Ok(Ok(_))) => true,
                (Fate::CrashAfterCommit, Ok(Ok(_))) => false,
                (fate, other) => {
                    prop_assert!(
                        false,
                        "{fate:?} delivery of {seq}: {:?}",
                        other.map(|r| r.map_err(|e| e.to_string()))
                    );
                    false
                }
            })
        };
        for (worker, seq, fate) in steps {
            if deliver(worker, seq, fate)? {
                acked[seq as usize] = true;
            }
        }
        // The broker redelivers everything not acked until it is.
        for seq in 0..MESSAGES {
            let mut worker = seq as usize;
            while !acked[seq as usize] {
                acked[seq as usize] = deliver(worker % WORKERS, seq, Fate::Acked)?;
                worker += 1;
            }
        }
        check_exact::<S::B>(&mut check.borrow_mut(), &run, 0..MESSAGES)
            .map_err(TestCaseError::fail)?;
        Ok(())
    });
    std::panic::set_hook(prev_hook);
    result.map_err(|e| format!("{e}"))?;
    Ok(Outcome::Pass(format!(
        "| {} | randomized schedules (proptest, {} handlers) | {WORKERS} sessions, interleaved | {MESSAGES} per case, {cases} cases, {} deliveries | body errors, panics, crashes after commit, redeliveries in random order | invariant held in every case |",
        S::B::LABEL,
        S::MODE,
        deliveries.get()
    )))
}
