//! The server ends a handler's session while its body runs.

use crate::backend::FaultBackend;
use crate::common::backend::TestBackend;
use crate::ensure;
use crate::scenario::{check_exact, setup, text};
use crate::session::Session;
use crate::{fault_run_id, message, Outcome, ScenarioResult, CONSUMER};
use diesel::connection::SimpleConnection;
use std::sync::mpsc;
use std::time::Duration;

pub fn connection_killed_mid_transaction<S: Session + Send + 'static>() -> ScenarioResult {
    if S::B::SESSION_ID_SQL.is_none() {
        return Ok(Outcome::Skip(
            "an embedded database has no session to kill".into(),
        ));
    }
    const ROUNDS: i64 = 5;
    let (db, mut admin) = setup::<S::B>("connection_killed_mid_transaction")?;
    let run = fault_run_id();
    for seq in 0..ROUNDS {
        let mut victim = S::open(&db);
        let id = victim.session_id().ok_or("no session id")?;
        let (started_tx, started_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let run2 = run.clone();
        let handler = std::thread::spawn(move || {
            let result = victim.write_wait_write(&message(&run2, seq), &started_tx);
            let _ = done_tx.send(result.map_err(|e| e.to_string()));
            victim
        });
        started_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the body never started")?;
        text(admin.batch_execute(&S::B::kill_sql(id)))?;
        let result = done_rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "the handler hung after its connection was killed")?;
        let mut victim = handler.join().map_err(|_| "the handler panicked")?;
        ensure!(
            result.is_err(),
            "the handler reported success on a killed connection"
        );
        let key = message(&run, seq).key;
        let second = format!("{key}/second");
        ensure!(
            !S::B::effects_of(&mut admin, &run)
                .iter()
                .any(|(k, _)| *k == key || *k == second),
            "a killed transaction left business rows"
        );
        ensure!(
            S::B::inbox_rows_of_run(&mut admin, CONSUMER, &run) == seq,
            "a killed transaction left its inbox row"
        );
        // The broker redelivers; the session gives its broken connection
        // back and takes another (a pool must discard the broken one).
        victim.reconnect();
        let again = text(victim.consume(&message(&run, seq), None))?;
        ensure!(again.is_applied(), "the redelivery was not applied");
        let once_more = text(victim.consume(&message(&run, seq), None))?;
        ensure!(
            once_more.is_duplicate(),
            "the second redelivery applied again"
        );
        check_exact::<S::B>(&mut admin, &run, 0..=seq)?;
    }
    Ok(Outcome::Pass(format!(
        "| {} | connection killed mid-transaction ({} handlers) | 1 handler + 1 killer session | {ROUNDS} | session killed (`{}`) while the body runs | handler returned an error (no panic, no hang), nothing written; redelivery applied once on a new connection (async: the next one from the same pool) |",
        S::B::LABEL,
        S::MODE,
        S::B::KILL_STATEMENT
    )))
}
