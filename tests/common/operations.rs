//! The operations' contract (`status`, `forget`, `stats`, `purge`), for the
//! sync functions and their async twins on every backend: generic over a
//! [`Mode`], stamped out by `contract_tests!` with the rest of the contract.

use super::backend::{msg, TestBackend};
use super::handlers::Fail;
use super::modes::Mode;
use super::unique_run_id;
use diesel::connection::SimpleConnection;
use diesel::Connection;
use diesel_inbox::{InboxError, InvalidKey, Processed, Purge};
use std::time::{Duration, SystemTime};

const DAY: Duration = Duration::from_secs(24 * 3600);

/// A session on a database of the test's own, with the tables in place.
fn fresh_session<M: Mode>(test: &str) -> Option<(M, super::TestDb)> {
    let db = M::B::fresh(test)?;
    let mut session = M::open(&db);
    session.migrate().expect("migrate");
    session
        .check()
        .batch_execute(super::EFFECTS_DDL)
        .expect("effects table");
    Some((session, db))
}

/// Backdates the inbox rows of `consumer` whose keys start with `prefix` by
/// `age`, with the backend's own clock expression (the claim's default).
fn backdate<M: Mode>(session: &mut M, consumer: &str, prefix: &str, age: Duration) {
    type Backend<M> = <<<M as Mode>::B as TestBackend>::Conn as Connection>::Backend;
    let when = diesel_inbox::__testing::cutoff_sql::<Backend<M>>(age);
    session
        .check()
        .batch_execute(&format!(
            "UPDATE inbox_messages SET received_at = {when} \
             WHERE consumer = '{consumer}' AND message_id LIKE '{prefix}%'"
        ))
        .expect("backdate inbox rows");
}

fn close_to_now(t: SystemTime) -> bool {
    let now = SystemTime::now();
    let gap = now
        .duration_since(t)
        .or_else(|e| Ok::<_, ()>(e.duration()))
        .expect("a duration");
    gap < Duration::from_secs(120)
}

pub fn status_shows_an_applied_message_and_none_for_others<M: Mode>() {
    let Some((mut s, _db)) = fresh_session::<M>("status") else {
        return;
    };
    let run = unique_run_id("status");
    let m = msg(&run, format!("{run}:1"), 3);
    assert!(s.status("payments", &m.key).expect("status").is_none());
    assert!(matches!(s.apply_payment(&m), Ok(Processed::Applied(3))));

    let entry = s
        .status("payments", &m.key)
        .expect("status")
        .expect("an entry");
    assert_eq!(
        (entry.consumer.as_str(), entry.key.as_str()),
        ("payments", m.key.as_str())
    );
    assert!(
        close_to_now(entry.received_at),
        "{}: received_at {:?} is not now",
        M::NAME,
        entry.received_at
    );
    // Another consumer, another key: nothing.
    assert!(s.status("ledger", &m.key).expect("status").is_none());
    assert!(s
        .status("payments", "no-such-key")
        .expect("status")
        .is_none());
    // Invalid names are refused as the handlers refuse them.
    assert!(matches!(
        s.status("payments", ""),
        Err(InboxError::InvalidKey(InvalidKey::Empty))
    ));
    assert!(matches!(
        s.status("", &m.key),
        Err(InboxError::InvalidConsumer(InvalidKey::Empty))
    ));
}

pub fn forget_replays_a_message_deliberately<M: Mode>() {
    let Some((mut s, _db)) = fresh_session::<M>("forget") else {
        return;
    };
    let run = unique_run_id("forget");
    let m = msg(&run, format!("{run}:1"), 4);
    assert!(matches!(s.apply_payment(&m), Ok(Processed::Applied(4))));
    assert!(matches!(s.apply_payment(&m), Ok(Processed::Duplicate)));

    assert!(s.forget("payments", &m.key).expect("forget"));
    assert!(s.status("payments", &m.key).expect("status").is_none());
    // Forgotten: the next delivery is applied again (a deliberate replay).
    assert!(matches!(s.apply_payment(&m), Ok(Processed::Applied(4))));
    assert_eq!(M::B::effects_of(s.check(), &run).len(), 2);
    // Nothing to forget: false, and nothing else touched.
    assert!(!s.forget("payments", "no-such-key").expect("forget"));
    assert!(!s.forget("ledger", &m.key).expect("forget"));
    assert_eq!(M::B::inbox_rows(s.check(), "payments", &m.key), 1);
}

pub fn stats_count_rows_per_consumer<M: Mode>() {
    let Some((mut s, _db)) = fresh_session::<M>("stats") else {
        return;
    };
    assert!(s.stats().expect("stats").is_empty());
    let run = unique_run_id("stats");
    for n in 0..3 {
        let m = msg(&run, format!("{run}:{n}"), n);
        assert!(s.apply_payment(&m).expect("apply").is_applied());
    }
    let m = msg(&run, format!("{run}:x"), 1);
    assert!(s.ledger(&m).expect("apply").is_applied());
    backdate(&mut s, "payments", &format!("{run}:0"), 2 * DAY);

    let stats = s.stats().expect("stats");
    let per: Vec<(&str, u64)> = stats
        .iter()
        .map(|c| (c.consumer.as_str(), c.rows))
        .collect();
    assert_eq!(per, vec![("ledger", 1), ("payments", 3)], "{}", M::NAME);
    let payments = &stats[1];
    let age = payments
        .newest
        .duration_since(payments.oldest)
        .expect("oldest before newest");
    assert!(
        age > DAY && age < 3 * DAY,
        "{}: oldest and newest {age:?} apart",
        M::NAME
    );
    assert!(close_to_now(payments.newest));
}

/// The overview counts at most `RATE_CAP` rows of a minute: a minute with
/// three times as many is a lower bound, and says so; a minute of exactly
/// the cap, a quiet one, and rows at second :00 of their minutes (each in
/// its own minute) are exact.
pub fn the_overview_counts_a_bounded_share_of_a_busy_minute<M: Mode>() {
    type Backend<M> = <<<M as Mode>::B as TestBackend>::Conn as Connection>::Backend;
    let Some((mut s, _db)) = fresh_session::<M>("overview_rates") else {
        return;
    };
    let cap = diesel_inbox::RATE_CAP;
    // Minutes on this machine's clock (the database's), counted back from
    // the one that began `ago` minutes before the current one.
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970");
    let current = now.as_secs() / 60 * 60;
    let at = |ago: u64, offset: Duration| {
        let when = Duration::from_secs(current - 60 * ago) + offset;
        diesel_inbox::__testing::cutoff_sql::<Backend<M>>(now - when)
    };
    let spread = |i: u64, of: u64| Duration::from_secs(1) + Duration::from_millis(58_000 * i / of);
    let mut rows: Vec<String> = Vec::new();
    for i in 0..3 * cap {
        rows.push(format!("('busy', 'b-{i}', {})", at(3, spread(i, 3 * cap))));
    }
    for i in 0..cap {
        rows.push(format!("('exact', 'e-{i}', {})", at(5, spread(i, cap))));
    }
    for ago in 7..13 {
        rows.push(format!("('cron', 'c-{ago}', {})", at(ago, Duration::ZERO)));
    }
    for i in 0..7 {
        rows.push(format!(
            "('quiet', 'q-{i}', {})",
            at(2, Duration::from_secs(30))
        ));
    }
    s.check()
        .batch_execute(&format!(
            "INSERT INTO inbox_messages (consumer, message_id, received_at) VALUES {}",
            rows.join(", ")
        ))
        .expect("rows");
    let overview = diesel_inbox::overview(s.check(), None).expect("overview");
    let of = |name: &str| {
        overview
            .consumers
            .iter()
            .find(|c| c.consumer == name)
            .unwrap_or_else(|| panic!("{}: no {name} in {overview:?}", M::NAME))
    };
    // (count, at least) of each minute a consumer has rows in.
    let minutes = |name: &str| {
        let c = of(name);
        c.per_minute
            .iter()
            .zip(&c.at_least)
            .filter(|(n, _)| **n > 0)
            .map(|(n, at_least)| (*n, *at_least))
            .collect::<Vec<_>>()
    };
    assert_eq!(minutes("busy"), [(cap + 1, true)], "{}", M::NAME);
    assert_eq!(minutes("exact"), [(cap, false)], "{}", M::NAME);
    assert_eq!(minutes("cron"), [(1, false); 6], "{}", M::NAME);
    assert_eq!(minutes("quiet"), [(7, false)], "{}", M::NAME);
    let cron = of("cron");
    let first = cron
        .per_minute
        .iter()
        .position(|n| *n > 0)
        .expect("a cron minute");
    assert_eq!(
        cron.per_minute[first..first + 6],
        [1; 6],
        "{}: {cron:?}",
        M::NAME
    );
}

pub fn purge_deletes_old_rows_in_batches_and_keeps_new_ones<M: Mode>() {
    let Some((mut s, _db)) = fresh_session::<M>("purge") else {
        return;
    };
    let run = unique_run_id("purge");
    let (old, new) = (format!("{run}:old"), format!("{run}:new"));
    for n in 0..25 {
        assert!(s
            .apply_payment(&msg(&run, format!("{old}{n:02}"), 1))
            .expect("apply")
            .is_applied());
    }
    for n in 0..5 {
        assert!(s
            .apply_payment(&msg(&run, format!("{new}{n}"), 1))
            .expect("apply")
            .is_applied());
        assert!(s
            .ledger(&msg(&run, format!("{old}{n}"), 1))
            .expect("apply")
            .is_applied());
    }
    backdate(&mut s, "payments", &old, 2 * DAY);
    backdate(&mut s, "ledger", &old, 2 * DAY);

    // A dry run counts, deletes nothing.
    assert_eq!(s.count_purge(Purge::new(DAY)).expect("count"), 30);
    assert_eq!(
        s.count_purge(Purge::new(DAY).consumer("ledger"))
            .expect("count"),
        5
    );
    assert_eq!(s.count_purge(Purge::new(3 * DAY)).expect("count"), 0);

    // Scoped to one consumer.
    let mut progress = Vec::new();
    let report = s
        .run_purge(
            Purge::new(DAY)
                .consumer("ledger")
                .batch_size(2)
                .pause(Duration::from_millis(1))
                .on_batch(|so_far| progress.push(so_far.rows)),
        )
        .expect("purge ledger");
    assert_eq!((report.rows, report.batches), (5, 3), "{}", M::NAME);
    assert_eq!(progress, vec![2, 4, 5]);
    assert_eq!(s.stats().expect("stats")[0].consumer, "payments");

    // The rest, with the plain function: 25 old rows in batches of 7.
    let report = s.purge(DAY, 7).expect("purge");
    assert_eq!((report.rows, report.batches), (25, 4), "{}", M::NAME);
    assert!(report.elapsed > Duration::ZERO);
    assert!(s
        .status("payments", &format!("{old}00"))
        .expect("status")
        .is_none());
    for n in 0..5 {
        assert!(s
            .status("payments", &format!("{new}{n}"))
            .expect("status")
            .is_some());
    }
    assert_eq!(s.purge(DAY, 7).expect("purge again").rows, 0);

    // The retention rule: a message redelivered after its row was purged
    // is applied again.
    assert!(s
        .apply_payment(&msg(&run, format!("{old}00"), 1))
        .expect("apply")
        .is_applied());
}

/// A purge also deletes the failure counts (`max_attempts`) last updated
/// before its cutoff, of its consumer only, and says how many; newer
/// counts stay.
pub fn purge_also_deletes_old_failure_counts<M: Mode>() {
    let Some((mut s, _db)) = fresh_session::<M>("purge_attempts") else {
        return;
    };
    let run = unique_run_id("counts");
    let (old, new) = (
        msg(&run, format!("{run}:old"), 1),
        msg(&run, format!("{run}:new"), 2),
    );
    let runs = std::sync::atomic::AtomicU32::new(0);
    for m in [&old, &new] {
        assert!(s.flaky(m, &runs, Fail::Error).is_some_and(|o| o.is_err()));
    }
    type Backend<M> = <<<M as Mode>::B as TestBackend>::Conn as Connection>::Backend;
    let when = diesel_inbox::__testing::cutoff_sql::<Backend<M>>(2 * DAY);
    s.check()
        .batch_execute(&format!(
            "UPDATE inbox_attempts SET updated_at = {when} WHERE message_id = '{}'",
            old.key
        ))
        .expect("backdate the count");
    // Another consumer's purge leaves them.
    let report = s
        .run_purge(Purge::new(DAY).consumer("payments"))
        .expect("purge");
    assert_eq!(report.attempts, 0, "{}", M::NAME);
    // On a Galera cluster the backdating above was written through
    // another node, whose change this node applies a moment later (reads
    // do not wait for it by default): purge until it is seen.
    let mut report = s.purge(DAY, 100).expect("purge");
    for _ in 0..50 {
        if report.attempts > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        report = s.purge(DAY, 100).expect("purge");
    }
    assert_eq!((report.rows, report.attempts), (0, 1), "{}", M::NAME);
    assert_eq!(s.attempts("flaky", &old.key).expect("attempts"), None);
    assert_eq!(
        s.attempts("flaky", &new.key)
            .expect("attempts")
            .map(|a| a.failures),
        Some(1)
    );
}

pub fn purge_refuses_bad_arguments<M: Mode>() {
    let Some((mut s, _db)) = fresh_session::<M>("purge_args") else {
        return;
    };
    for batch in [0, diesel_inbox::MAX_PURGE_BATCH + 1] {
        assert!(matches!(
            s.purge(DAY, batch),
            Err(InboxError::InvalidArgument(_))
        ));
    }
    assert!(matches!(
        s.run_purge(Purge::new(DAY).consumer("")),
        Err(InboxError::InvalidConsumer(InvalidKey::Empty))
    ));
    for coef in [-1.0, f64::NAN, 101.0] {
        assert!(matches!(
            s.run_purge(Purge::new(DAY).sleep_coef(coef)),
            Err(InboxError::InvalidArgument(_))
        ));
    }
    assert!(matches!(
        s.purge(Duration::from_secs(200 * 366 * 24 * 3600), 10),
        Err(InboxError::InvalidArgument(_))
    ));
}

pub fn operations_without_the_table_say_so<M: Mode>() {
    let Some(db) = M::B::fresh("no_table") else {
        return;
    };
    let mut s = M::open(&db);
    let errors = [
        s.status("payments", "k").err(),
        s.forget("payments", "k").err(),
        s.stats().err(),
        s.purge(DAY, 10).err(),
        s.count_purge(Purge::new(DAY)).err(),
    ];
    for error in errors {
        let error = error.expect("an error without the table");
        assert!(
            matches!(error, InboxError::NoTable(_)),
            "{}: {error:?}",
            M::NAME
        );
        assert!(error.to_string().contains("run migrate()"));
    }
}

pub fn concurrent_purges_share_the_work_while_handlers_claim<M: Mode>() {
    let Some((mut s, db)) = fresh_session::<M>("purge_concurrent") else {
        return;
    };
    let run = unique_run_id("purgec");
    let old = format!("{run}:old");
    const OLD: usize = 300;
    for n in 0..OLD {
        assert!(s
            .apply_payment(&msg(&run, format!("{old}{n:04}"), 1))
            .expect("apply")
            .is_applied());
    }
    backdate(&mut s, "payments", &old, 2 * DAY);
    // The purges' deletes may run on other nodes, and a write there does
    // not wait for this node's backdating to be applied as a read does.
    M::B::settle(&db);
    let fresh: Vec<_> = (0..60)
        .map(|n| msg(&run, format!("{run}:new{n}"), 1))
        .collect();

    let (purges, delivered) = M::purge_during_deliveries(&db, 3, DAY, 20, fresh.clone());
    let mut rows = 0;
    for report in purges {
        rows += report.expect("a purge failed").rows;
    }
    if rows != OLD as u64 {
        panic!(
            "{}: the purges deleted {rows} of {OLD} rows; the table holds {:?}",
            M::NAME,
            s.stats()
        );
    }
    assert!(
        delivered
            .iter()
            .all(|o| matches!(o, Ok(Processed::Applied(1)))),
        "{}: {delivered:?}",
        M::NAME
    );
    let stats = s.stats().expect("stats");
    assert_eq!(stats.len(), 1);
    assert_eq!(stats[0].rows, fresh.len() as u64);
}
