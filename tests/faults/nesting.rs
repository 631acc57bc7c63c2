//! A handler inside the caller's transaction, and a body that outlasts
//! another delivery's lock wait.

use crate::backend::{short_lock_wait, FaultBackend};
use crate::ensure;
use crate::scenario::{check_exact, setup, text};
use crate::session::sync;
use crate::{fault_run_id, message, Message, Outcome, ScenarioResult, CONSUMER};
use diesel::prelude::*;
use diesel_inbox::idempotent;
use std::sync::mpsc;
use std::time::Duration;

#[idempotent(key = "msg.key", consumer = "fault-long", shared, retries = 0)]
fn long_body<B: FaultBackend>(
    conn: &mut B::Conn,
    msg: &Message,
    claimed: mpsc::Sender<()>,
    hold: Duration,
) -> QueryResult<()> {
    B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
    let _ = claimed.send(());
    std::thread::sleep(hold);
    Ok(())
}

#[idempotent(key = "msg.key", consumer = "fault-long", shared, retries = 30)]
fn patient<B: FaultBackend>(conn: &mut B::Conn, msg: &Message) -> QueryResult<()> {
    B::write_effect(conn, &msg.run, &msg.key, msg.amount).map(drop)
}

/// Sync handlers only: the contract suite nests async handlers in a
/// caller's transaction.
pub fn nested_and_long_transactions<B: FaultBackend>() -> ScenarioResult {
    let (db, mut conn) = setup::<B>("nested_and_long_transactions")?;
    let run = fault_run_id();
    // Inside the caller's transaction, which then rolls back.
    let nested = message(&run, 0);
    let outer: QueryResult<()> = conn.transaction(|c| {
        let out = sync::consume::<B>(c, &nested, None)?;
        assert!(out.is_applied());
        Err(diesel::result::Error::RollbackTransaction)
    });
    ensure!(outer.is_err(), "the outer transaction committed");
    ensure!(
        B::effects_of(&mut conn, &run).is_empty(),
        "the outer rollback left business rows"
    );
    ensure!(
        B::inbox_rows_of_run(&mut conn, CONSUMER, &run) == 0,
        "the outer rollback left the inbox row"
    );
    ensure!(
        text(sync::consume::<B>(&mut conn, &nested, None))?.is_applied(),
        "redelivery not applied"
    );
    check_exact::<B>(&mut conn, &run, 0..1)?;

    // A body that outlasts the waiter's lock wait (2.5 times it, and at
    // least 1.5 s): the waiter's claim times out, is retried, and sees the
    // outcome.
    let lock_wait = B::SHORT_LOCK_WAIT.1;
    let hold = (lock_wait * 5 / 2).max(Duration::from_millis(1500));
    let long = message(&run, 1);
    let (claimed_tx, claimed_rx) = mpsc::channel();
    let first = {
        let (url, run) = (db.url.clone(), run.clone());
        std::thread::spawn(move || {
            let mut conn = B::open(&url);
            text(long_body::<B>(
                &mut conn,
                &message(&run, 1),
                claimed_tx,
                hold,
            ))
        })
    };
    claimed_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the long body never started")?;
    let mut waiter = B::open(&db);
    text(short_lock_wait::<B>(&mut waiter))?;
    let started = std::time::Instant::now();
    let second = patient::<B>(&mut waiter, &long).map_err(|e| format!("waiter: {e}"))?;
    let waited = started.elapsed();
    let first = first.join().map_err(|_| "long body panicked")??;
    ensure!(first.is_applied(), "the long body did not apply");
    ensure!(
        second.is_duplicate(),
        "the waiter applied a message the long body had applied"
    );
    ensure!(waited >= hold / 2, "the waiter did not wait ({waited:?})");
    let rows = B::effects_of(&mut conn, &run);
    ensure!(
        rows.iter().filter(|(k, _)| *k == long.key).count() == 1,
        "long message applied {} times",
        rows.len()
    );
    Ok(Outcome::Pass(format!(
        "| {} | nested and long transactions | 2 sessions | 2 | handler inside a caller's transaction that rolls back; a body held {} ms against a {} ms lock wait | outer rollback removed the inbox row too, redelivery applied; the waiter's claim timed out, was retried and reported `Duplicate` after {} ms |",
        B::LABEL,
        hold.as_millis(),
        lock_wait.as_millis(),
        waited.as_millis()
    )))
}
