//! Bad input and a least-privileged role.

use crate::backend::FaultBackend;
use crate::ensure;
use crate::scenario::{check_exact, setup};
use crate::session::sync;
use crate::{fault_run_id, message, Outcome, ScenarioResult};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_inbox::{ErrorClass, InboxError, InvalidKey, Processed};

pub fn bad_input<B: FaultBackend>() -> ScenarioResult {
    let (_db, mut conn) = setup::<B>("bad_input")?;
    let run = fault_run_id();
    let claim = |conn: &mut B::Conn, consumer: &str, key: &str| -> QueryResult<Processed<()>> {
        diesel_inbox::Inbox::consumer(consumer)
            .retries(0)
            .classify(ErrorClass::of)
            .run(conn, key, |conn| {
                B::write_effect(conn, &run, key, 1).map(drop)
            })
    };
    let long = |n: usize| format!("{run}:{}", "k".repeat(n));
    let multibyte = format!("{run}:{}", "é".repeat((256 - run.len()) / 2));
    let cases: Vec<(String, String, InboxError)> = vec![
        (
            "fault-bad".into(),
            String::new(),
            InboxError::InvalidKey(InvalidKey::Empty),
        ),
        (
            "fault-bad".into(),
            long(256 - run.len()),
            InboxError::InvalidKey(InvalidKey::TooLong { len: 257 }),
        ),
        (
            "fault-bad".into(),
            multibyte.clone(),
            InboxError::InvalidKey(InvalidKey::TooLong {
                len: multibyte.len(),
            }),
        ),
        (
            "fault-bad".into(),
            format!("{run}:a\0b"),
            InboxError::InvalidKey(InvalidKey::ContainsNul),
        ),
        (
            String::new(),
            format!("{run}:k"),
            InboxError::InvalidConsumer(InvalidKey::Empty),
        ),
        (
            "c".repeat(300),
            format!("{run}:k"),
            InboxError::InvalidConsumer(InvalidKey::TooLong { len: 300 }),
        ),
        (
            "con\0sumer".into(),
            format!("{run}:k"),
            InboxError::InvalidConsumer(InvalidKey::ContainsNul),
        ),
    ];
    ensure!(multibyte.len() > 255, "test key too short");
    for (consumer, key, expected) in &cases {
        match claim(&mut conn, consumer, key) {
            Err(diesel::result::Error::QueryBuilderError(inner)) => {
                let got = inner
                    .downcast_ref::<InboxError>()
                    .ok_or("not an InboxError")?;
                ensure!(
                    got.to_string() == expected.to_string(),
                    "{key:?}: got {got}, expected {expected}"
                );
            }
            other => {
                return Err(format!(
                    "{consumer:?}/{key:?}: expected {expected}, got {other:?}"
                ))
            }
        }
    }
    ensure!(
        B::effects_of(&mut conn, &run).is_empty(),
        "a refused key ran its body"
    );
    ensure!(
        B::inbox_rows_of_run(&mut conn, "fault-bad", &run) == 0,
        "a refused key was stored"
    );
    // Two keys equal in their first 255 bytes: both refused, never truncated into one.
    let a = format!("{}A", long(255 - run.len()));
    let b = format!("{}B", long(255 - run.len()));
    ensure!(
        claim(&mut conn, "fault-bad", &a).is_err() && claim(&mut conn, "fault-bad", &b).is_err(),
        "an over-long key was accepted"
    );
    // Hostile but valid names and keys are stored verbatim; the connection still works.
    let hostile_consumer = "'; DROP TABLE inbox_messages; --";
    let exact = long(255 - run.len() - 1);
    for key in [
        format!("{run}:'); DELETE FROM inbox_messages; --"),
        format!("{run}:%_\\ \"q\" ünï"),
        exact.clone(),
    ] {
        ensure!(
            claim(&mut conn, hostile_consumer, &key)
                .map_err(|e| e.to_string())?
                .is_applied(),
            "{key:?} not applied"
        );
        ensure!(
            claim(&mut conn, hostile_consumer, &key)
                .map_err(|e| e.to_string())?
                .is_duplicate(),
            "{key:?} applied twice"
        );
    }
    ensure!(exact.len() == 255, "exact key is {} bytes", exact.len());
    ensure!(
        B::inbox_rows(&mut conn, hostile_consumer, &exact) == 1,
        "the 255-byte key was not stored whole"
    );
    Ok(Outcome::Pass(format!(
        "| {} | bad input | 1 session | {} refused + 3 hostile | empty, 256-byte, multi-byte over 255, NUL keys and consumer names; keys equal in their first 255 bytes; SQL metacharacters | each refused with its `InboxError`, nothing written; hostile values stored verbatim; connection usable |",
        B::LABEL,
    cases.len() + 2
    )))
}

pub fn least_privilege<B: FaultBackend>() -> ScenarioResult {
    if !B::ROLES {
        return Ok(Outcome::Skip(
            "roles and grants are checked on PostgreSQL".into(),
        ));
    }
    let (db, mut admin) = setup::<B>("least_privilege")?;
    let url = db.url.clone();
    let run = fault_run_id();
    let role = format!("inbox_limited_{run}");
    let schema = format!("inbox_empty_{run}");
    admin
        .batch_execute(&format!(
            // As a database of the release before the refusals' view:
            // `migrate` by a role that may not create it changes nothing.
            "DROP FUNCTION diesel_inbox_refuse() CASCADE; \
             CREATE ROLE {role} LOGIN PASSWORD '{role}'; \
             GRANT USAGE ON SCHEMA public TO {role}; \
             REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             GRANT SELECT, INSERT, DELETE ON inbox_messages, inbox_test_effects TO {role}; \
             CREATE SCHEMA {schema}; GRANT USAGE ON SCHEMA {schema} TO {role};"
        ))
        .map_err(|e| format!("create role: {e}"))?;
    let result = (|| -> Result<String, String> {
        let (scheme, rest) = url.split_once("://").ok_or("a URL")?;
        let host = rest.split_once('@').map_or(rest, |(_, host)| host);
        // Its password is its name: the server may require one over TCP.
        let limited_url = format!("{scheme}://{role}:{role}@{host}");
        let mut limited = B::open(&limited_url);
        diesel_inbox::migrate(&mut limited)
            .map_err(|e| format!("migrate with the table present: {e}"))?;
        for seq in 0..3 {
            let out = sync::consume::<B>(&mut limited, &message(&run, seq), None)
                .map_err(|e| format!("handler: {e}"))?;
            ensure!(out.is_applied(), "not applied");
            ensure!(
                sync::consume::<B>(&mut limited, &message(&run, seq), None)
                    .map_err(|e| e.to_string())?
                    .is_duplicate(),
                "applied twice"
            );
        }
        check_exact::<B>(&mut admin, &run, 0..3)?;
        let separator = if limited_url.contains('?') { '&' } else { '?' };
        let mut empty = B::open(&format!(
            "{limited_url}{separator}options=-c%20search_path%3D{schema}"
        ));
        match diesel_inbox::migrate(&mut empty) {
            Err(e @ InboxError::MigrationFailed(_)) => Ok(e.to_string()),
            other => Err(format!(
                "migrate without the table and without CREATE: {other:?}"
            )),
        }
    })();
    let _ = admin.batch_execute(&format!(
        "DROP SCHEMA {schema} CASCADE; DROP OWNED BY {role}; DROP ROLE {role};"
    ));
    let message = result?;
    Ok(Outcome::Pass(format!(
        "| {} | least privilege | 1 role with SELECT/INSERT/DELETE only | 3 | no DDL privilege | handlers work; `migrate` is a no-op with the table present and fails clearly without it: \"{}\" |",
        B::LABEL,
        message.replace('|', "/")
    )))
}
