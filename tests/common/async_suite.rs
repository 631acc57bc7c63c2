//! Async-only tests: what a cancelled handler leaves behind. A future
//! dropped at an `.await` (a caller's `tokio::time::timeout`, a
//! `select!` that took another branch, a task aborted at shutdown) must
//! commit nothing, and the pool must not hand its connection, still inside
//! the transaction, to the next task.
#![cfg(feature = "async")]

use super::backend::{msg, TestBackend};
use super::handlers::asynchronous as handlers;
use super::modes::runtime;
use super::unique_run_id;
use diesel_inbox::Processed;
use std::time::Duration;

/// Where a cancellation lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cancel {
    /// At the handler's first `.await`: the claim never reached the database.
    BeforeTheClaim,
    /// After the claim, before the body's first statement.
    AfterTheClaim,
    /// After the body's write, while it stalls.
    MidBody,
}

/// Cancels a delivery where `at` says, puts the connection back in the
/// pool, and redelivers through the same pool: a stale transaction handed
/// on would show the cancelled claim, and the redelivery would be a wrong
/// `Duplicate`.
fn cancelled_then_redelivered<B: TestBackend>(at: Cancel) {
    let Some(db) = B::prepare("cancel") else {
        return;
    };
    let run = unique_run_id("cancel");
    let key = format!("{run}:1");
    let pool = B::pool(&db);
    runtime().block_on(async {
        let mut conn = B::pooled(&pool).await;
        let first = msg(&run, key.clone(), 1);
        let claimed = std::sync::atomic::AtomicBool::new(false);
        let cancelled = match at {
            Cancel::BeforeTheClaim => {
                let delivery = handlers::write_then_stall::<B>(&mut conn, &first);
                tokio::time::timeout(Duration::ZERO, delivery).await
            }
            Cancel::AfterTheClaim => {
                let delivery = handlers::stall_then_write::<B>(&mut conn, &first, &claimed);
                tokio::time::timeout(Duration::from_millis(300), delivery).await
            }
            Cancel::MidBody => {
                let delivery = handlers::write_then_stall::<B>(&mut conn, &first);
                tokio::time::timeout(Duration::from_millis(300), delivery).await
            }
        };
        assert!(
            cancelled.is_err(),
            "the handler was cancelled: {cancelled:?}"
        );
        assert_eq!(
            claimed.load(std::sync::atomic::Ordering::SeqCst),
            at == Cancel::AfterTheClaim,
            "the cancellation landed {at:?}"
        );
        // Back to the pool, inside the transaction the cancel left open.
        drop(conn);
        // Every connection the pool hands out from now on is outside any
        // transaction, and the cancelled claim is gone: the redelivery
        // applies, once.
        for attempt in 0..3 {
            let mut conn = B::pooled(&pool).await;
            let redelivered = msg(&run, key.clone(), 2);
            let outcome = handlers::write_at_once::<B>(&mut conn, &redelivered).await;
            let expected = if attempt == 0 {
                Processed::Applied(2)
            } else {
                Processed::Duplicate
            };
            assert_eq!(outcome.expect("redelivery"), expected, "attempt {attempt}");
        }
    });
    let mut check = B::open(&db);
    assert_eq!(
        B::effects_of(&mut check, &run),
        vec![(key.clone(), 2)],
        "nothing of the cancelled delivery was committed"
    );
    assert_eq!(B::inbox_rows(&mut check, "stalling", &key), 1);
}

pub fn cancelled_before_the_claim_commits_nothing<B: TestBackend>() {
    cancelled_then_redelivered::<B>(Cancel::BeforeTheClaim);
}

pub fn cancelled_after_the_claim_commits_nothing<B: TestBackend>() {
    cancelled_then_redelivered::<B>(Cancel::AfterTheClaim);
}

pub fn cancelled_mid_body_commits_nothing_and_the_pool_drops_the_connection<B: TestBackend>() {
    cancelled_then_redelivered::<B>(Cancel::MidBody);
}

/// A handler's future can be spawned: it is `Send`, with the connection
/// borrowed from a pooled object the task owns.
pub fn handlers_run_on_spawned_tasks<B: TestBackend>() {
    let Some(db) = B::prepare("spawned") else {
        return;
    };
    let run = unique_run_id("spawned");
    let pool = B::pool(&db);
    let tasks: Vec<_> = (0..4)
        .map(|n| {
            let (pool, m) = (pool.clone(), msg(&run, format!("{run}:{n}"), n));
            runtime().spawn(async move {
                let mut conn = B::pooled(&pool).await;
                handlers::write_at_once::<B>(&mut conn, &m).await
            })
        })
        .collect();
    let outcomes = runtime().block_on(async {
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.expect("no panic").expect("applied"));
        }
        outcomes
    });
    assert_eq!(outcomes, (0..4).map(Processed::Applied).collect::<Vec<_>>());
    assert_eq!(B::effects_of(&mut B::open(&db), &run).len(), 4);
}

/// Stamps out one `#[test]` per async-only test for a backend.
#[macro_export]
macro_rules! async_tests {
    ($B:ty, runs_if = $runs_if:meta, else_ignored = $why:literal) => {
        $crate::async_tests!(@tests $B, $runs_if, $why,
            cancelled_before_the_claim_commits_nothing,
            cancelled_after_the_claim_commits_nothing,
            cancelled_mid_body_commits_nothing_and_the_pool_drops_the_connection,
            handlers_run_on_spawned_tasks,
        );
    };
    (@tests $B:ty, $runs_if:meta, $why:literal, $($test:ident,)*) => {
        $(
            #[test]
            #[cfg_attr(not($runs_if), ignore = $why)]
            fn $test() {
                $crate::common::async_suite::$test::<$B>();
            }
        )*
    };
}
