//! The fault cases under another server language: on a PostgreSQL database
//! whose `lc_messages` is German, a deadlock and a serialization failure
//! are retried and a swallowed statement error is reported, as on the
//! default database. The runtime reads what the server does not translate
//! (diesel's kind, the lock modes of a deadlock's detail, the state of the
//! transaction), never the English words.

use crate::backend::FaultBackend;
use crate::common::backend::TestBackend;
use crate::conflicts::{lock_order_deadlock, serialization_failure_on};
use crate::ensure;
use crate::scenario::setup_on;
use crate::session::Session;
use crate::{fault_run_id, message, Outcome, ScenarioResult};
use diesel::connection::SimpleConnection;
use diesel_inbox::InboxError;

/// A locale of Debian's `locales` package with PostgreSQL's translations.
const LOCALE: &str = "de_DE.UTF-8";

pub fn fault_cases_in_another_language<S: Session>() -> ScenarioResult {
    let db = match S::B::in_language("language", LOCALE) {
        None => {
            return Ok(Outcome::Skip(
                "no per-database message language here".into(),
            ))
        }
        Some(Err(why)) => return Ok(Outcome::Skip(why)),
        Some(Ok(db)) => db,
    };
    let (db, mut conn) = setup_on::<S::B>(db)?;
    // Not vacuous: the server's own words are no longer English.
    let said = match conn.batch_execute("SELECT 1/0") {
        Err(diesel::result::Error::DatabaseError(_, info)) => info.message().to_string(),
        other => return Err(format!("SELECT 1/0 gave {other:?}")),
    };
    ensure!(
        said != "division by zero",
        "lc_messages = {LOCALE} did not change the server's language: {said:?}"
    );

    let deadlock =
        lock_order_deadlock::<S>(&db, &mut conn).map_err(|e| format!("deadlock: {e}"))?;
    let serialization =
        serialization_failure_on::<S>(&db, &mut conn).map_err(|e| format!("serialization: {e}"))?;
    for outcome in [deadlock, serialization] {
        if let Outcome::Skip(why) = outcome {
            return Err(format!("a fault case did not run: {why}"));
        }
    }

    // A statement fails and the body returns Ok: PostgreSQL aborted the
    // transaction, so nothing is committed and the handler is told.
    let run = fault_run_id();
    let m = message(&run, 1);
    let swallowed = S::open(&db).swallow(&m);
    let inbox = match &swallowed {
        Err(diesel::result::Error::QueryBuilderError(e)) => e.downcast_ref::<InboxError>(),
        _ => None,
    };
    ensure!(
        matches!(inbox, Some(InboxError::BodyIgnoredError(_))),
        "a swallowed error: expected BodyIgnoredError, got {swallowed:?}"
    );
    ensure!(
        S::B::effects_of(&mut conn, &run).is_empty()
            && S::B::inbox_rows_of_run(&mut conn, "fault-swallow", &run) == 0,
        "the aborted transaction left rows"
    );
    Ok(Outcome::Pass(format!(
        "| {} | fault cases under `lc_messages = {LOCALE}` ({}) | 2 sessions | 9 | a lock-order deadlock, serialization failures, a swallowed statement error, with the server's messages in German (\"{said}\") | deadlocks and serialization failures retried, exhaustion and the swallowed error reported as on the default database |",
        S::B::LABEL,
        S::MODE,
    )))
}
