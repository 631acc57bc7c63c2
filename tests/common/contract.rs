//! The behavioural contract, the same for sync and async handlers on every
//! backend: each test is a generic function over a [`Mode`]; the backend
//! files stamp out a `#[test]` shim per mode (`contract_tests!`).

use super::backend::{msg, Msg, TestBackend};
use super::handlers::AppError;
use super::modes::{Mode, Outcome};
use super::{unique_int_base, unique_run_id};
use diesel_inbox::{InboxError, InvalidKey, Processed};
use std::sync::atomic::{AtomicU32, Ordering};

// The operations' contract, stamped out with the rest.
#[allow(unused_imports)] // not every test binary stamps the contract out
pub use super::operations::*;
// Fingerprints and stored results, stamped out with the rest too.
#[allow(unused_imports)]
pub use super::checks::*;

/// The session, or `None` (said once) when the backend is not configured.
fn session<M: Mode>(test: &str) -> Option<(M, super::TestDb)> {
    let db = M::B::prepare(test)?;
    Some((M::open(&db), db))
}

fn effects<M: Mode>(session: &mut M, run: &str) -> Vec<(String, i64)> {
    M::B::effects_of(session.check(), run)
}

fn inbox_rows<M: Mode>(session: &mut M, consumer: &str, key: &str) -> i64 {
    M::B::inbox_rows(session.check(), consumer, key)
}

pub fn applies_once_then_reports_duplicate<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("applies_once") else {
        return;
    };
    let run = unique_run_id("apply");
    let m = msg(&run, format!("{run}:1"), 42);

    assert!(
        matches!(s.apply_payment(&m), Ok(Processed::Applied(42))),
        "{}",
        M::NAME
    );
    assert!(matches!(s.apply_payment(&m), Ok(Processed::Duplicate)));
    assert!(matches!(s.apply_payment(&m), Ok(Processed::Duplicate)));

    assert_eq!(effects(&mut s, &run), vec![(m.key.clone(), 42)]);
    assert_eq!(inbox_rows(&mut s, "payments", &m.key), 1);
}

pub fn body_error_rolls_back_business_write_and_inbox_row<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("error_rollback") else {
        return;
    };
    let run = unique_run_id("reject");
    let m = msg(&run, format!("{run}:1"), 5);

    assert!(matches!(s.write_then_reject(&m), Err(AppError::Rejected)));
    assert_eq!(effects(&mut s, &run), vec![]);
    assert_eq!(inbox_rows(&mut s, "rejecting", &m.key), 0);

    // The failed delivery left no trace, so the redelivery applies.
    assert!(matches!(
        s.write_then_accept(&m),
        Ok(Processed::Applied(()))
    ));
    assert_eq!(effects(&mut s, &run), vec![(m.key.clone(), 5)]);
    assert_eq!(inbox_rows(&mut s, "rejecting", &m.key), 1);
}

pub fn panic_rolls_back_and_connection_stays_usable<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("panic_rollback") else {
        return;
    };
    let run = unique_run_id("panic");
    let m = msg(&run, format!("{run}:1"), 9);

    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = s.write_then_panic(&m);
    }));
    let payload = unwound.expect_err("the panic reaches the caller");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"handler bug after a write")
    );

    assert_eq!(effects(&mut s, &run), vec![]);
    assert_eq!(inbox_rows(&mut s, "panicking", &m.key), 0);
    // Same connection, no transaction left open: the redelivery applies and
    // commits (another connection sees it).
    let other = msg(&run, format!("{run}:2"), 1);
    assert!(matches!(s.apply_payment(&other), Ok(Processed::Applied(1))));
    assert_eq!(effects(&mut s, &run), vec![(other.key.clone(), 1)]);
}

pub fn outer_transaction_rollback_removes_inbox_row_too<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("outer_rollback") else {
        return;
    };
    let run = unique_run_id("outer");
    let m = msg(&run, format!("{run}:1"), 3);

    let [first, again] = s.twice_in_transaction(&m, false);
    assert!(matches!(first, Ok(Processed::Applied(3))), "{first:?}");
    assert!(matches!(again, Ok(Processed::Duplicate)), "{again:?}");
    assert_eq!(effects(&mut s, &run), vec![]);
    assert_eq!(inbox_rows(&mut s, "payments", &m.key), 0);

    // Committed by the caller: both rows stay.
    let [first, again] = s.twice_in_transaction(&m, true);
    assert!(matches!(first, Ok(Processed::Applied(3))), "{first:?}");
    assert!(matches!(again, Ok(Processed::Duplicate)), "{again:?}");
    assert_eq!(effects(&mut s, &run), vec![(m.key.clone(), 3)]);
    assert_eq!(inbox_rows(&mut s, "payments", &m.key), 1);
}

pub fn consumers_scope_deduplication<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("consumers") else {
        return;
    };
    let run = unique_run_id("scoped");
    let m = msg(&run, format!("{run}:1"), 1);

    assert!(s.ledger(&m).expect("ledger").is_applied());
    assert!(s.mailer(&m).expect("mailer").is_applied());
    assert!(s.ledger(&m).expect("ledger again").is_duplicate());
    assert!(s.mailer(&m).expect("mailer again").is_duplicate());
    assert_eq!(
        effects(&mut s, &run),
        vec![
            (format!("ledger/{}", m.key), 1),
            (format!("mailer/{}", m.key), 1)
        ]
    );
}

pub fn integer_string_and_uuid_keys<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("key_types") else {
        return;
    };
    let run = unique_run_id("keys");
    let base = unique_int_base();

    assert_eq!(s.by_int(&run, base).expect("int"), Processed::Applied(base));
    assert_eq!(
        s.by_int(&run, base).expect("int again"),
        Processed::Duplicate
    );
    assert_eq!(
        s.by_int(&run, base + 1).expect("next int"),
        Processed::Applied(base + 1)
    );
    let key = format!("{run}:str");
    assert!(s.by_str(&run, &key).expect("str").is_applied());
    assert!(s.by_str(&run, &key).expect("str again").is_duplicate());
    let id = uuid::Uuid::new_v4();
    assert!(s.by_uuid(&run, id).expect("uuid").is_applied());
    assert!(s.by_uuid(&run, id).expect("uuid again").is_duplicate());

    assert_eq!(inbox_rows(&mut s, "int-keys", &base.to_string()), 1);
    assert_eq!(
        inbox_rows(&mut s, "uuid-keys", &id.hyphenated().to_string()),
        1
    );
    assert_eq!(effects(&mut s, &run).len(), 4);
}

pub fn hostile_keys_are_stored_verbatim_and_compared_byte_for_byte<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("hostile") else {
        return;
    };
    let run = unique_run_id("hostile");
    let suffixes = [
        "'; DROP TABLE inbox_messages; --",
        "\"quoted\" and 'single'",
        "back\\slash %_ wildcards",
        "key",
        "KEY",
        "key ",
        "kéy",
        "ke\u{301}y",
        "日本語-🦀",
        "tab\there\nnewline",
    ];
    for (n, suffix) in suffixes.iter().enumerate() {
        let m = msg(&run, format!("{run}{suffix}"), n as i64);
        assert!(
            s.apply_payment(&m).expect("first delivery").is_applied(),
            "{suffix:?}"
        );
        assert!(
            s.apply_payment(&m).expect("redelivery").is_duplicate(),
            "{suffix:?}"
        );
        assert_eq!(inbox_rows(&mut s, "payments", &m.key), 1, "{suffix:?}");
    }
    let mut expected: Vec<String> = suffixes.iter().map(|s| format!("{run}{s}")).collect();
    expected.sort();
    let stored: Vec<String> = effects(&mut s, &run)
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(stored, expected);
}

pub fn invalid_keys_are_refused_before_anything_runs<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("invalid") else {
        return;
    };
    let run = unique_run_id("invalid");
    let too_long = format!("{run}{}", "é".repeat(128));
    let cases = [
        (String::new(), InvalidKey::Empty),
        (format!("{run}\0nul"), InvalidKey::ContainsNul),
        (
            too_long.clone(),
            InvalidKey::TooLong {
                len: too_long.len(),
            },
        ),
    ];
    for (key, reason) in cases {
        match s.apply_payment(&msg(&run, key, 1)) {
            Err(AppError::Inbox(InboxError::InvalidKey(got))) => assert_eq!(got, reason),
            other => panic!("expected InvalidKey({reason:?}), got {other:?}"),
        }
    }
    // A key of exactly 255 bytes is fine and is not truncated.
    let exact = format!("{run}{}", "x".repeat(255 - run.len()));
    assert_eq!(exact.len(), 255);
    assert!(s
        .apply_payment(&msg(&run, exact.clone(), 1))
        .expect("255 bytes")
        .is_applied());
    assert_eq!(inbox_rows(&mut s, "payments", &exact), 1);
    assert_eq!(effects(&mut s, &run), vec![(exact, 1)]);
}

pub fn a_transient_body_error_is_retried<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("transient") else {
        return;
    };
    let run = unique_run_id("transient");
    let m = msg(&run, format!("{run}:1"), 7);
    let runs = AtomicU32::new(0);
    assert!(matches!(
        s.transient_once(&m, &runs),
        Ok(Processed::Applied(()))
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one failed run, one retry");
    assert_eq!(effects(&mut s, &run), vec![(m.key.clone(), 7)]);
    assert!(matches!(
        s.transient_once(&m, &runs),
        Ok(Processed::Duplicate)
    ));
}

pub fn migrate_creates_the_table_from_several_connections_at_once<M: Mode>() {
    let Some(db) = M::B::fresh("fresh_migrate") else {
        return;
    };
    for result in M::migrate_concurrently(&db, 4) {
        result.expect("concurrent migrate");
    }
    let mut s = M::open(&db);
    s.migrate().expect("migrate again");
    let mut check = M::B::open(&db);
    let claim = |conn: &mut <M::B as TestBackend>::Conn| -> diesel::QueryResult<Processed<()>> {
        diesel_inbox::Inbox::consumer("fresh")
            .retries(0)
            .run(conn, "m-1", |_| Ok(()))
    };
    assert_eq!(claim(&mut check).expect("first"), Processed::Applied(()));
    assert_eq!(claim(&mut check).expect("second"), Processed::Duplicate);
}

/// The outcomes of a first delivery and its redelivery, and the business
/// rows they left.
type Redelivery = ([Outcome<()>; 2], Vec<(String, i64)>);

/// A second delivery arriving while the first holds its claim waits for it
/// (on one server; see `TestBackend::MULTI_MASTER`).
fn redelivery<M: Mode>(fail_first: bool) -> Option<Redelivery> {
    let db = M::B::prepare("waiter")?;
    let run = unique_run_id("waiter");
    let key = format!("{run}:1");
    let outcomes = M::redelivery_during_first(
        &db,
        msg(&run, key.clone(), 1),
        msg(&run, key, 2),
        fail_first,
    );
    let effects = M::B::effects_of(&mut M::B::open(&db), &run);
    Some((outcomes, effects))
}

pub fn a_waiting_redelivery_is_a_duplicate_once_the_first_commits<M: Mode>() {
    let Some(([first, second], effects)) = redelivery::<M>(false) else {
        return;
    };
    if M::B::MULTI_MASTER {
        // The second delivery, on another node, does not wait for the
        // first's claim: whichever COMMIT certifies first wins, and the
        // other is rerun and finds the claim.
        let applied = [&first, &second]
            .iter()
            .filter(|o| matches!(o, Ok(Processed::Applied(()))))
            .count();
        let duplicates = [&first, &second]
            .iter()
            .filter(|o| matches!(o, Ok(Processed::Duplicate)))
            .count();
        assert_eq!((applied, duplicates), (1, 1), "{first:?} / {second:?}");
        assert_eq!(effects.len(), 1);
        return;
    }
    assert!(matches!(first, Ok(Processed::Applied(()))), "{first:?}");
    assert!(matches!(second, Ok(Processed::Duplicate)), "{second:?}");
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].1, 1);
}

pub fn a_waiting_redelivery_applies_when_the_first_rolls_back<M: Mode>() {
    let Some(([first, second], effects)) = redelivery::<M>(true) else {
        return;
    };
    assert!(matches!(first, Err(AppError::Rejected)), "{first:?}");
    assert!(matches!(second, Ok(Processed::Applied(()))), "{second:?}");
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].1, 2, "only the second delivery's write remains");
}

pub fn batches_apply_only_first_deliveries_in_one_transaction<M: Mode>() {
    let Some((mut s, _db)) = session::<M>("batch") else {
        return;
    };
    let run = unique_run_id("batch");
    let batch = |keys: &[u32]| -> Vec<Msg> {
        keys.iter()
            .map(|k| msg(&run, format!("{run}:{k}"), i64::from(*k)))
            .collect()
    };

    let first = s.apply_batch(&batch(&[1, 2, 3])).expect("first batch");
    assert_eq!(
        (first.value, first.applied, first.duplicates),
        (Some(3), vec![0, 1, 2], 0)
    );
    // Overlapping redelivery with a key repeated inside the batch.
    let second = s
        .apply_batch(&batch(&[3, 4, 2, 4, 5]))
        .expect("second batch");
    assert_eq!(
        (second.value, second.applied, second.duplicates),
        (Some(2), vec![1, 4], 3)
    );
    // All duplicates: the body does not run.
    let third = s.apply_batch(&batch(&[5, 1])).expect("third batch");
    assert_eq!(
        (third.value, third.applied.len(), third.duplicates),
        (None, 0, 2)
    );

    let mut expected: Vec<(String, i64)> = (1..=5).map(|k| (format!("{run}:{k}"), k)).collect();
    expected.sort();
    assert_eq!(effects(&mut s, &run), expected);
    for k in 1..=5 {
        assert_eq!(
            inbox_rows(&mut s, "batch-payments", &format!("{run}:{k}")),
            1
        );
    }

    // A failing body rolls back every claim of its batch.
    let failed = s.apply_batch_then_reject(&batch(&[5, 6, 7]));
    assert!(matches!(failed, Err(AppError::Rejected)), "{failed:?}");
    assert_eq!(inbox_rows(&mut s, "batch-payments", &format!("{run}:6")), 0);
    assert_eq!(effects(&mut s, &run), expected);

    // One invalid key refuses the whole batch before anything runs.
    let mut bad = batch(&[8, 9]);
    bad.push(msg(&run, String::new(), 0));
    match s.apply_batch(&bad) {
        Err(AppError::Inbox(InboxError::InvalidKey(InvalidKey::Empty))) => {}
        other => panic!("expected InvalidKey, got {other:?}"),
    }
    assert_eq!(inbox_rows(&mut s, "batch-payments", &format!("{run}:8")), 0);
    assert_eq!(effects(&mut s, &run), expected);
}

pub fn overlapping_batches_at_once_apply_each_key_once<M: Mode>() {
    const WORKERS: usize = 4;
    const KEYS: usize = 200;
    const BATCH: usize = 20;
    let Some(db) = M::B::prepare("batch_race") else {
        return;
    };
    let run = unique_run_id("batchrace");
    let workers: Vec<Vec<Vec<Msg>>> = (0..WORKERS)
        .map(|t| {
            // Each worker starts at its own offset; its batches straddle the others'.
            let order: Vec<usize> = (0..KEYS)
                .map(|n| (n + t * 7 + t * KEYS / WORKERS) % KEYS)
                .collect();
            order
                .chunks(BATCH)
                .map(|chunk| {
                    chunk
                        .iter()
                        .map(|k| msg(&run, format!("{run}:{k}"), *k as i64))
                        .collect()
                })
                .collect()
        })
        .collect();
    let mut applied = 0;
    for worker in M::batches_concurrently(&db, workers) {
        for outcome in worker {
            applied += outcome.expect("a batch failed").applied.len();
        }
    }
    assert_eq!(applied, KEYS);
    let mut expected: Vec<(String, i64)> = (0..KEYS)
        .map(|k| (format!("{run}:{k}"), k as i64))
        .collect();
    expected.sort();
    assert_eq!(
        M::B::effects_of(&mut M::B::open(&db), &run),
        expected,
        "every key applied exactly once"
    );
}

pub fn concurrent_deliveries_apply_each_key_exactly_once<M: Mode>() {
    const WORKERS: usize = 8;
    const KEYS: usize = 500;
    let Some(db) = M::B::prepare("concurrent") else {
        return;
    };
    let run = unique_run_id("race");
    let workers: Vec<Vec<Msg>> = (0..WORKERS)
        .map(|t| {
            // Each worker walks the keys from a different offset.
            (0..KEYS)
                .map(|n| {
                    let k = (n + t * KEYS / WORKERS) % KEYS;
                    msg(&run, format!("{run}:{k}"), k as i64)
                })
                .collect()
        })
        .collect();
    let (mut applied, mut duplicates) = (0, 0);
    for worker in M::deliver_concurrently(&db, workers) {
        for outcome in worker {
            match outcome {
                Ok(Processed::Applied(_)) => applied += 1,
                Ok(Processed::Duplicate) => duplicates += 1,
                Err(e) => panic!("a delivery failed: {e:?}"),
            }
        }
    }
    assert_eq!(applied, KEYS);
    assert_eq!(duplicates, KEYS * (WORKERS - 1));
    let mut expected: Vec<(String, i64)> = (0..KEYS)
        .map(|k| (format!("{run}:{k}"), k as i64))
        .collect();
    expected.sort();
    assert_eq!(
        M::B::effects_of(&mut M::B::open(&db), &run),
        expected,
        "every key applied exactly once"
    );
}

/// Stamps out one `#[test]` per contract test for a mode:
/// `contract_tests!(Sync<Sqlite>, runs_if = all(), else_ignored = "..")`.
#[macro_export]
macro_rules! contract_tests {
    ($Mode:ty, runs_if = $runs_if:meta, else_ignored = $why:literal) => {
        $crate::contract_tests!(@tests $Mode, $runs_if, $why,
            applies_once_then_reports_duplicate,
            body_error_rolls_back_business_write_and_inbox_row,
            panic_rolls_back_and_connection_stays_usable,
            outer_transaction_rollback_removes_inbox_row_too,
            consumers_scope_deduplication,
            integer_string_and_uuid_keys,
            hostile_keys_are_stored_verbatim_and_compared_byte_for_byte,
            invalid_keys_are_refused_before_anything_runs,
            a_transient_body_error_is_retried,
            migrate_creates_the_table_from_several_connections_at_once,
            a_waiting_redelivery_is_a_duplicate_once_the_first_commits,
            a_waiting_redelivery_applies_when_the_first_rolls_back,
            batches_apply_only_first_deliveries_in_one_transaction,
            overlapping_batches_at_once_apply_each_key_once,
            concurrent_deliveries_apply_each_key_exactly_once,
            status_shows_an_applied_message_and_none_for_others,
            forget_replays_a_message_deliberately,
            stats_count_rows_per_consumer,
            the_overview_counts_a_bounded_share_of_a_busy_minute,
            purge_deletes_old_rows_in_batches_and_keeps_new_ones,
            purge_refuses_bad_arguments,
            purge_also_deletes_old_failure_counts,
            operations_without_the_table_say_so,
            concurrent_purges_share_the_work_while_handlers_claim,
            a_key_reused_for_other_content_is_refused_without_running_the_body,
            rows_without_a_fingerprint_accept_any_content,
            batch_fingerprints_refuse_a_reused_key_and_write_nothing,
            a_stored_result_is_returned_for_duplicates,
            a_stored_result_that_no_longer_reads_is_a_clear_error,
            concurrent_redeliveries_with_other_content_are_refused,
            failures_are_counted_until_max_attempts_then_the_body_stops,
            a_success_clears_the_failure_count,
            concurrent_failures_of_one_key_are_each_counted,
            the_failing_keys_are_listed_latest_first,
        );
    };
    (@tests $Mode:ty, $runs_if:meta, $why:literal, $($test:ident,)*) => {
        $(
            #[test]
            #[cfg_attr(not($runs_if), ignore = $why)]
            fn $test() {
                $crate::common::contract::$test::<$Mode>();
            }
        )*
    };
}
