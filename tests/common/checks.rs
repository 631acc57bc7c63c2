//! The contract of fingerprints and stored results, for sync and async
//! handlers on every backend: generic over a [`Mode`], stamped out by
//! `contract_tests!` with the rest of the contract.

use super::backend::{msg, Msg, TestBackend};
use super::handlers::{AppError, Fail, Receipt};
use super::modes::Mode;
use super::unique_run_id;
use diesel_inbox::{Fingerprint, InboxError, Processed, Stored};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

fn session<M: Mode>(test: &str) -> Option<(M, super::TestDb)> {
    let db = M::B::prepare(test)?;
    Some((M::open(&db), db))
}

fn effects<M: Mode>(session: &mut M, run: &str) -> Vec<(String, i64)> {
    M::B::effects_of(session.check(), run)
}

/// Whether `outcome` is `KeyReused` for exactly this consumer and key.
fn is_key_reused<T: std::fmt::Debug>(
    outcome: &Result<T, AppError>,
    consumer: &str,
    key: &str,
) -> bool {
    matches!(outcome, Err(AppError::Inbox(InboxError::KeyReused { consumer: c, key: k }))
        if c == consumer && k == key)
}

pub fn a_key_reused_for_other_content_is_refused_without_running_the_body<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("fingerprint_reused") else {
        return;
    };
    let run = unique_run_id("fp");
    let m = msg(&run, format!("{run}:1"), 10);
    let changed = msg(&run, m.key.clone(), 11);

    assert!(matches!(s.fingerprinted(&m), Ok(Processed::Applied(10))));
    // The same content again: a plain duplicate.
    assert!(matches!(s.fingerprinted(&m), Ok(Processed::Duplicate)));
    // Other content under the same key: refused, every time, body not run.
    for _ in 0..2 {
        let reused = s.fingerprinted(&changed);
        assert!(
            is_key_reused(&reused, "fingerprinted", &m.key),
            "{}: {reused:?}",
            M::NAME
        );
    }
    assert_eq!(effects(&mut s, &run), vec![(m.key.clone(), 10)]);
    // The row holds the documented fingerprint: SHA-256 of the bytes.
    let (stored, result) = M::B::inbox_extras(s.check(), "fingerprinted", &m.key);
    assert_eq!(
        stored.as_deref(),
        Some(Fingerprint::of_bytes(&10i64.to_be_bytes()).as_bytes())
    );
    assert_eq!(result, None, "nothing stored without store_result");
    // The error says what happened.
    let Err(AppError::Inbox(error)) = s.fingerprinted(&changed) else {
        panic!("expected KeyReused")
    };
    assert!(error.to_string().contains("different content"), "{error}");
}

pub fn rows_without_a_fingerprint_accept_any_content<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("fingerprint_absent") else {
        return;
    };
    let run = unique_run_id("nofp");
    let m = msg(&run, format!("{run}:1"), 5);
    // Applied by a handler without a fingerprint (as before the upgrade).
    assert!(matches!(s.unfingerprinted(&m), Ok(Processed::Applied(5))));
    let (stored, _) = M::B::inbox_extras(s.check(), "fingerprinted", &m.key);
    assert_eq!(stored, None);
    // A fingerprinted redelivery with any content is a duplicate.
    for amount in [5, 6] {
        let again = msg(&run, m.key.clone(), amount);
        assert!(matches!(s.fingerprinted(&again), Ok(Processed::Duplicate)));
    }
    // And a row with a fingerprint accepts a redelivery through a handler
    // that checks none.
    let n = msg(&run, format!("{run}:2"), 7);
    assert!(matches!(s.fingerprinted(&n), Ok(Processed::Applied(7))));
    let other = msg(&run, n.key.clone(), 8);
    assert!(matches!(
        s.unfingerprinted(&other),
        Ok(Processed::Duplicate)
    ));
    assert_eq!(
        effects(&mut s, &run),
        vec![(m.key.clone(), 5), (n.key.clone(), 7)]
    );
}

pub fn batch_fingerprints_refuse_a_reused_key_and_write_nothing<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("fingerprint_batch") else {
        return;
    };
    let run = unique_run_id("fpb");
    let m = |n: u32, amount: i64| msg(&run, format!("{run}:{n}"), amount);
    let first = s
        .fingerprinted_batch(&[m(1, 1), m(2, 2)])
        .expect("first batch");
    assert_eq!(
        (first.value, first.applied, first.duplicates),
        (Some(2), vec![0, 1], 0)
    );

    // Same content again next to a new key: the new key applies.
    let second = s
        .fingerprinted_batch(&[m(3, 3), m(1, 1)])
        .expect("second batch");
    assert_eq!(
        (second.value, second.applied, second.duplicates),
        (Some(1), vec![0], 1)
    );

    // A reused key refuses the whole batch: the new key 4 is not applied.
    let reused = s.fingerprinted_batch(&[m(4, 4), m(2, 20)]);
    assert!(
        is_key_reused(&reused, "fingerprinted-batch", &format!("{run}:2")),
        "{}: {reused:?}",
        M::NAME
    );
    // Two messages of one batch with one key and different content.
    let inside = s.fingerprinted_batch(&[m(5, 5), m(5, 6)]);
    assert!(
        is_key_reused(&inside, "fingerprinted-batch", &format!("{run}:5")),
        "{inside:?}"
    );
    // Repeated with the same content, it is a duplicate within the batch.
    let repeated = s.fingerprinted_batch(&[m(6, 6), m(6, 6)]).expect("repeat");
    assert_eq!((repeated.applied, repeated.duplicates), (vec![0], 1));

    let keys = |ns: &[(u32, i64)]| -> Vec<(String, i64)> {
        ns.iter().map(|(n, a)| (format!("{run}:{n}"), *a)).collect()
    };
    assert_eq!(
        effects(&mut s, &run),
        keys(&[(1, 1), (2, 2), (3, 3), (6, 6)])
    );
    for refused in [4, 5] {
        assert_eq!(
            M::B::inbox_rows(
                s.check(),
                "fingerprinted-batch",
                &format!("{run}:{refused}")
            ),
            0
        );
    }
}

pub fn a_stored_result_is_returned_for_duplicates<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("stored_result") else {
        return;
    };
    let run = unique_run_id("stored");
    let m = msg(&run, format!("{run}:1"), 30);
    let receipt = Receipt {
        key: m.key.clone(),
        amount: 30,
        note: "paid 30".into(),
    };

    assert_eq!(
        s.receipt(&m).expect("first"),
        Stored::Applied(receipt.clone())
    );
    for _ in 0..2 {
        assert_eq!(
            s.receipt(&m).expect("again"),
            Stored::Duplicate(Some(receipt.clone())),
            "{}",
            M::NAME
        );
    }
    assert_eq!(effects(&mut s, &run), vec![(m.key.clone(), 30)]);
    // Stored as JSON in the row, with the fingerprint.
    let (fingerprint, stored) = M::B::inbox_extras(s.check(), "receipts", &m.key);
    assert_eq!(
        fingerprint.as_deref(),
        Some(Fingerprint::of_bytes(b"30").as_bytes())
    );
    let stored: Receipt = serde_json::from_slice(&stored.expect("a stored result")).expect("JSON");
    assert_eq!(stored, receipt);
    // Validation is not skipped on the way to the stored result.
    let changed = msg(&run, m.key.clone(), 31);
    let reused = s.receipt(&changed);
    assert!(is_key_reused(&reused, "receipts", &m.key), "{reused:?}");
}

pub fn a_stored_result_that_no_longer_reads_is_a_clear_error<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("stored_unreadable") else {
        return;
    };
    let run = unique_run_id("unread");
    let m = msg(&run, format!("{run}:1"), 40);
    assert!(matches!(s.receipt(&m), Ok(Stored::Applied(_))));
    // The success type changed: the stored JSON lacks `currency`.
    match s.receipt_v2(&m) {
        Err(AppError::Inbox(e @ InboxError::StoredResultUnreadable { .. })) => {
            let InboxError::StoredResultUnreadable {
                consumer,
                key,
                reason,
            } = &e
            else {
                unreachable!()
            };
            assert_eq!((&**consumer, &**key), ("receipts", m.key.as_str()));
            assert!(reason.contains("currency"), "{reason}");
            assert!(e.to_string().contains(&m.key), "{e}");
        }
        other => panic!(
            "{}: expected StoredResultUnreadable, got {other:?}",
            M::NAME
        ),
    }
    assert_eq!(effects(&mut s, &run), vec![(m.key.clone(), 40)]);

    // A row written without a stored result: a duplicate with none.
    let n = msg(&run, format!("{run}:2"), 41);
    assert!(matches!(s.receipt_unstored(&n), Ok(Processed::Applied(41))));
    assert_eq!(s.receipt(&n).expect("duplicate"), Stored::Duplicate(None));
    // And a handler without store_result ignores a stored one.
    assert!(matches!(s.receipt_unstored(&m), Ok(Processed::Duplicate)));
}

/// Fingerprinted deliveries of one key from several sessions at once, half
/// with other content: exactly one applies; the others are duplicates
/// (same content) or `KeyReused` (other content), none both.
pub fn concurrent_redeliveries_with_other_content_are_refused<M: Mode>() {
    let Some((mut s, db)) = session::<M>("fingerprint_concurrent") else {
        return;
    };
    let run = unique_run_id("fpc");
    let key = format!("{run}:1");
    let workers: Vec<Vec<Msg>> = (0..4)
        .map(|w| vec![msg(&run, key.clone(), 100 + (w % 2))])
        .collect();
    let outcomes = M::fingerprinted_concurrently(&db, workers);
    let flat: Vec<_> = outcomes.into_iter().flatten().collect();
    let applied: Vec<i64> = flat
        .iter()
        .filter_map(|o| match o {
            Ok(Processed::Applied(v)) => Some(*v),
            _ => None,
        })
        .collect();
    assert_eq!(applied.len(), 1, "{flat:?}");
    let winner = applied[0];
    for outcome in &flat {
        match outcome {
            Ok(Processed::Applied(_)) => {}
            Ok(Processed::Duplicate) => {}
            other => assert!(is_key_reused(other, "fingerprinted", &key), "{other:?}"),
        }
    }
    // The two with the winner's amount: one applied, one duplicate; the
    // other two: refused.
    let refused = flat.iter().filter(|o| o.is_err()).count();
    assert_eq!(refused, 2, "{flat:?}");
    assert_eq!(effects(&mut s, &run), vec![(key, winner)]);
}

/// Whether `outcome` is `AttemptsExhausted` after `failures` failures.
fn is_given_up<T: std::fmt::Debug>(outcome: &Result<T, AppError>, failures: u32) -> bool {
    matches!(outcome, Err(AppError::Inbox(InboxError::AttemptsExhausted { failures: f, .. })) if *f == failures)
}

pub fn failures_are_counted_until_max_attempts_then_the_body_stops<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("max_attempts") else {
        return;
    };
    let run = unique_run_id("poison");
    let m = msg(&run, format!("{run}:1"), 3);
    let runs = AtomicU32::new(0);

    // Two errors and a panic: each rolled back, each counted.
    for (n, fail) in [Fail::Error, Fail::Error, Fail::Panic]
        .into_iter()
        .enumerate()
    {
        let outcome = s.flaky(&m, &runs, fail);
        match fail {
            Fail::Panic => assert!(outcome.is_none(), "the panic reaches the caller"),
            _ => assert!(
                matches!(outcome, Some(Err(AppError::Rejected))),
                "{outcome:?}"
            ),
        }
        let count = s
            .attempts("flaky", &m.key)
            .expect("attempts")
            .expect("a count");
        assert_eq!(count.failures, n as u32 + 1, "{}", M::NAME);
    }
    let count = s
        .attempts("flaky", &m.key)
        .expect("attempts")
        .expect("a count");
    assert_eq!(count.last_error, "the body panicked: poison message");
    assert_eq!(effects(&mut s, &run), vec![], "every failure rolled back");
    assert_eq!(M::B::inbox_rows(s.check(), "flaky", &m.key), 0);

    // The third failure reached max_attempts = 3: the body no longer runs,
    // even for a delivery that would succeed.
    for _ in 0..2 {
        let outcome = s.flaky(&m, &runs, Fail::No).expect("no panic");
        assert!(is_given_up(&outcome, 3), "{}: {outcome:?}", M::NAME);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let Some(Err(AppError::Inbox(error))) = s.flaky(&m, &runs, Fail::No) else {
        panic!("expected AttemptsExhausted")
    };
    assert!(error.to_string().contains("dead-letter"), "{error}");
    assert_eq!(M::B::inbox_rows(s.check(), "flaky", &m.key), 0);

    // `forget` resets the count: a deliberate retry runs the body again.
    assert!(s.forget("flaky", &m.key).expect("forget"));
    assert_eq!(s.attempts("flaky", &m.key).expect("attempts"), None);
    assert!(matches!(
        s.flaky(&m, &runs, Fail::No),
        Some(Ok(Processed::Applied(3)))
    ));
    assert_eq!(effects(&mut s, &run), vec![(m.key.clone(), 3)]);
}

pub fn a_success_clears_the_failure_count<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("attempts_cleared") else {
        return;
    };
    let run = unique_run_id("recover");
    let m = msg(&run, format!("{run}:1"), 4);
    let runs = AtomicU32::new(0);
    for _ in 0..2 {
        assert!(matches!(
            s.flaky(&m, &runs, Fail::Error),
            Some(Err(AppError::Rejected))
        ));
    }
    assert_eq!(
        s.attempts("flaky", &m.key)
            .expect("attempts")
            .map(|a| a.failures),
        Some(2)
    );
    assert!(matches!(
        s.flaky(&m, &runs, Fail::No),
        Some(Ok(Processed::Applied(4)))
    ));
    assert_eq!(
        s.attempts("flaky", &m.key).expect("attempts"),
        None,
        "{}",
        M::NAME
    );
    assert!(matches!(
        s.flaky(&m, &runs, Fail::Error),
        Some(Ok(Processed::Duplicate))
    ));
    // A key that never failed has no count, and costs no row.
    let n = msg(&run, format!("{run}:2"), 5);
    assert!(matches!(
        s.flaky(&n, &runs, Fail::No),
        Some(Ok(Processed::Applied(5)))
    ));
    assert_eq!(s.attempts("flaky", &n.key).expect("attempts"), None);
    assert_eq!(
        effects(&mut s, &run),
        vec![(m.key.clone(), 4), (n.key.clone(), 5)]
    );
}

/// `attempts_list`: the failing keys with their count and last error, the
/// latest failure first; `min_failures` = `max_attempts` lists the keys
/// given up on; a success or `forget` takes a key off; bad arguments are
/// refused. Other tests of the binary share the consumer, so only this
/// test's keys are compared.
pub fn the_failing_keys_are_listed_latest_first<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("attempts_list") else {
        return;
    };
    let run = unique_run_id("listed");
    let (a, b, c) = (
        msg(&run, format!("{run}:a"), 1),
        msg(&run, format!("{run}:b"), 2),
        msg(&run, format!("{run}:c"), 3),
    );
    let runs = AtomicU32::new(0);
    // a: given up on (3 failures); b: 1 failure; c: failed, then applied.
    for (m, pause) in [(&a, 0), (&a, 0), (&a, 1_100), (&c, 0), (&b, 0)] {
        assert!(matches!(
            s.flaky(m, &runs, Fail::Error),
            Some(Err(AppError::Rejected))
        ));
        // SQLite's CURRENT_TIMESTAMP has whole seconds: b fails later.
        std::thread::sleep(std::time::Duration::from_millis(pause));
    }
    assert!(matches!(
        s.flaky(&c, &runs, Fail::No),
        Some(Ok(Processed::Applied(3)))
    ));
    let ours = |list: Vec<diesel_inbox::Attempts>| -> Vec<(String, u32)> {
        list.into_iter()
            .filter(|x| x.key.starts_with(&run))
            .map(|x| (x.key, x.failures))
            .collect()
    };
    let all = s
        .attempts_list(Some("flaky"), 1, diesel_inbox::MAX_PURGE_BATCH)
        .expect("attempts_list");
    assert_eq!(
        ours(all.clone()),
        vec![(b.key.clone(), 1), (a.key.clone(), 3)],
        "{}: the latest failure first, an applied key off the list",
        M::NAME
    );
    let listed = all.iter().find(|x| x.key == a.key).expect("a is listed");
    assert_eq!(
        (listed.consumer.as_str(), listed.last_error.as_str()),
        ("flaky", "Rejected")
    );
    let exhausted = s
        .attempts_list(Some("flaky"), 3, diesel_inbox::MAX_PURGE_BATCH)
        .expect("attempts_list");
    assert_eq!(ours(exhausted), vec![(a.key.clone(), 3)]);
    let everyone = s
        .attempts_list(None, 1, diesel_inbox::MAX_PURGE_BATCH)
        .expect("attempts_list");
    assert_eq!(ours(everyone).len(), 2);
    assert!(s.forget("flaky", &a.key).expect("forget"));
    let after = s
        .attempts_list(Some("flaky"), 1, diesel_inbox::MAX_PURGE_BATCH)
        .expect("attempts_list");
    assert_eq!(ours(after), vec![(b.key.clone(), 1)]);
    assert!(matches!(
        s.attempts_list(Some("flaky"), 1, 0),
        Err(InboxError::InvalidArgument(_))
    ));
    assert!(matches!(
        s.attempts_list(Some(""), 1, 10),
        Err(InboxError::InvalidConsumer(_))
    ));
}

/// 4 sessions redeliver one failing key at once until each is told it was
/// given up on: no failure is lost from the count (every failure returned
/// is one counted), and the body stops near `max_attempts` (a delivery
/// that claimed after a rollback and before that failure's count
/// committed still runs: at most `max_attempts` + 3 runs with 4 sessions).
pub fn concurrent_failures_of_one_key_are_each_counted<M: Mode>() {
    let Some((mut s, db)) = session::<M>("attempts_concurrent") else {
        return;
    };
    let run = unique_run_id("herd");
    let m = msg(&run, format!("{run}:1"), 6);
    let runs = Arc::new(AtomicU32::new(0));
    let outcomes = M::flaky_concurrently(&db, 4, m.clone(), 20, runs.clone());
    let flat: Vec<_> = outcomes.iter().flatten().collect();
    let rejected = flat
        .iter()
        .filter(|o| matches!(o, Err(AppError::Rejected)))
        .count() as u32;
    for worker in &outcomes {
        let last = worker.last().expect("a delivery");
        assert!(
            matches!(
                last,
                Err(AppError::Inbox(InboxError::AttemptsExhausted { .. }))
            ),
            "{}: every worker ends given up on: {worker:?}",
            M::NAME
        );
    }
    // A run can also end in a transient conflict and be rerun by the
    // engine (a multi-master cluster aborts one of two concurrent writers of
    // the count's row): not a failure of the message, not counted.
    let ran = runs.load(Ordering::SeqCst);
    assert!(ran >= rejected, "{ran} runs, {rejected} failures: {flat:?}");
    let counted = s
        .attempts("flaky", &m.key)
        .expect("attempts")
        .expect("a count")
        .failures;
    assert_eq!(
        counted,
        rejected,
        "{}: no failure lost from the count",
        M::NAME
    );
    assert!((3..=6).contains(&counted), "{counted} runs: {flat:?}");
    assert_eq!(effects(&mut s, &run), vec![]);
}
