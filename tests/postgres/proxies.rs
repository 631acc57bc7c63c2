//! The PostgreSQL suite's proxy tests (`tests/postgres.rs`, module
//! `suite::proxies`): every statement that may be named is guarded, and
//! another statement under its name is an error, never a wrong answer.

use crate::suite::{fresh, open};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel_inbox::{ErrorClass, Inbox, InboxError, Processed};

#[derive(QueryableByName)]
struct Named {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    types: String,
}

/// The name and parameter types of the prepared statement of this
/// session whose text starts with `prefix`.
fn prepared(conn: &mut PgConnection, prefix: &str) -> (String, String) {
    let rows: Vec<Named> = diesel::sql_query(
        "SELECT name, array_to_string(parameter_types::text[], ', ') AS types \
         FROM pg_prepared_statements WHERE starts_with(statement, $1)",
    )
    .bind::<Text, _>(prefix)
    .load(conn)
    .expect("pg_prepared_statements");
    assert_eq!(rows.len(), 1, "one prepared statement starts with {prefix}");
    let row = rows.into_iter().next().expect("one row");
    (row.name, row.types)
}

fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    diesel::select(diesel::dsl::sql::<BigInt>(&format!("({sql})")))
        .get_result(conn)
        .expect("count")
}

fn setup(test: &str) -> Option<(crate::common::TestDb, PgConnection)> {
    let db = fresh(test)?;
    let mut conn = open(&db);
    diesel_inbox::migrate(&mut conn).expect("migrate");
    conn.batch_execute("CREATE TABLE proxy_orders (a TEXT, b TEXT)")
        .expect("business table");
    Some((db, conn))
}

/// The body: one business row per applied message.
fn order(conn: &mut PgConnection, key: &str) -> QueryResult<()> {
    diesel::sql_query("INSERT INTO proxy_orders (a, b) VALUES ($1, 'order')")
        .bind::<Text, _>(key)
        .execute(conn)
        .map(drop)
}

fn claim(conn: &mut PgConnection, key: &str) -> QueryResult<Processed<()>> {
    Inbox::consumer("proxy")
        .retries(0)
        .classify(|_: &diesel::result::Error| ErrorClass::permanent())
        .run(conn, key, |conn| order(conn, key))
}

/// What a handler's caller sees of a guard's refusal: the inbox's named
/// error ([`InboxError::StatementsSharedByProxy`], inside diesel's error
/// for a `QueryResult` handler), whose text says what happened and what
/// to do, with what the guard saw (`refusal`).
fn assert_refused(error: &diesel::result::Error, refusal: &str) {
    let diesel::result::Error::QueryBuilderError(inner) = error else {
        panic!("not the inbox's refusal: {error:?}");
    };
    let Some(InboxError::StatementsSharedByProxy { refusal: seen }) =
        inner.downcast_ref::<InboxError>()
    else {
        panic!("not the inbox's refusal: {error:?}");
    };
    assert!(seen.contains(refusal), "{seen:?} does not say {refusal:?}");
    assert_eq!(
        error.to_string(),
        format!(
            "diesel-inbox refused a statement that a connection proxy mixed up with another \
             client's ({seen}); nothing of this call was committed. A proxy in transaction \
             mode (PgBouncer before 1.21) shares prepared statements between clients: use \
             session pooling, PgBouncer 1.21 or later with max_prepared_statements, or disable \
             diesel's statement cache (CacheSize::Disabled); see diesel_inbox::guide::proxies"
        )
    );
}

/// What the server says (and logs) when a guarded statement runs with
/// another client's parameters: `ERROR:  diesel-inbox: a statement of
/// diesel-inbox ran with another statement's parameters, …` (SQLSTATE
/// P0001, raised by the view and function `migrate` created; the log's
/// `STATEMENT` line names which), with the fix as its hint; and what the
/// inbox makes of that error.
fn assert_server_refused(error: &diesel::result::Error) {
    let diesel::result::Error::DatabaseError(_, info) = error else {
        panic!("not the server's error: {error:?}");
    };
    let refusal = "a statement of diesel-inbox ran with another statement's parameters, \
                   or another statement ran under its prepared name";
    assert_eq!(info.message(), format!("diesel-inbox: {refusal}"));
    assert_eq!(
        info.hint(),
        Some(
            "a connection proxy in transaction mode (PgBouncer before 1.21) shares prepared \
             statements between clients: use session pooling, PgBouncer 1.21 or later with \
             max_prepared_statements, or disable diesel's statement cache (CacheSize::Disabled)"
        )
    );
    assert!(matches!(
        InboxError::from(clone_error(error)),
        InboxError::StatementsSharedByProxy { refusal: seen } if *seen == *refusal
    ));
}

/// A database error's kind and message again (diesel's error is not
/// `Clone`).
fn clone_error(error: &diesel::result::Error) -> diesel::result::Error {
    match error {
        diesel::result::Error::DatabaseError(kind, info) => {
            diesel::result::Error::DatabaseError(*kind, Box::new(info.message().to_owned()))
        }
        other => panic!("not a database error: {other:?}"),
    }
}

/// The refusals' view is optional: a role that may create objects but
/// cannot make the view (its function belongs to another role, as after
/// an operator dropped only the view) still migrates a current database,
/// and handles messages; the owner's `migrate` makes the view again.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn migrate_where_the_view_cannot_be_made_is_no_failure() {
    let Some((db, mut conn)) = setup("proxy_view_elsewhere") else {
        return;
    };
    let role = format!("inbox_view_{}", std::process::id());
    conn.batch_execute(&format!(
        "DROP VIEW diesel_inbox_refused; \
         CREATE ROLE {role} LOGIN PASSWORD '{role}'; \
         DO $grant$ BEGIN EXECUTE format('GRANT USAGE, CREATE ON SCHEMA %I TO {role}; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I TO {role}', \
         current_schema(), current_schema()); END $grant$;"
    ))
    .expect("a role that may create objects");
    let views = |conn: &mut PgConnection| {
        count(
            conn,
            "SELECT count(*) FROM (SELECT to_regclass('diesel_inbox_refused') AS view) v \
             WHERE view IS NOT NULL",
        )
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let url: &str = &db;
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let host = rest.split_once('@').map_or(rest, |(_, host)| host);
        let mut other = open(&format!("{scheme}://{role}:{role}@{host}"));
        diesel_inbox::migrate(&mut other).expect("migrate without the view it cannot make");
        assert_eq!(views(&mut conn), 0, "the view was not made");
        assert_eq!(
            claim(&mut other, "v1").expect("a claim without the view"),
            Processed::Applied(())
        );
        diesel_inbox::migrate(&mut conn).expect("the owner's migrate");
        assert_eq!(views(&mut conn), 1, "the owner's migrate made the view");
    }));
    let _ = conn.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role};"));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// Where `migrate` of this release has not run (the view and function
/// that raise refusals are missing, as on a database of an earlier
/// release), the guard still refuses, with its own text quoted in a
/// failed cast's error, and the inbox names it the same way. `migrate`
/// makes them again; the commit that requires a stored result then
/// refuses with the server's text too.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn a_refusal_without_the_function_says_the_same() {
    let Some((_db, mut conn)) = setup("proxy_refusal_fallback") else {
        return;
    };
    conn.batch_execute("DROP FUNCTION diesel_inbox_refuse() CASCADE")
        .expect("drop the function and its view");
    let (claim_sql, commit_sql) = diesel_inbox::__testing::postgres_guarded_sql();
    let error = conn
        .batch_execute(&format!(
            "PREPARE foreign_claim (text, text, text) AS {claim_sql}; \
             EXECUTE foreign_claim('proxy', 'k1', 'another value')"
        ))
        .expect_err("the claim with another statement's parameters fails");
    let text = error.to_string();
    assert!(
        text.contains(
            "\"diesel-inbox: this prepared statement is the inbox claim, run with the \
             parameters of another statement\""
        ),
        "{text}"
    );
    assert!(matches!(
        InboxError::from(clone_error(&error)),
        InboxError::StatementsSharedByProxy { refusal } if *refusal == *"this prepared statement is the inbox claim, run with the parameters of another statement"
    ));
    // `migrate` makes them again (the tables are current).
    diesel_inbox::migrate(&mut conn).expect("migrate");
    let error = conn
        .batch_execute(&format!("BEGIN; {commit_sql}"))
        .expect_err("a commit without a stored result refuses");
    assert_server_refused(&error);
    conn.batch_execute("ROLLBACK").expect("rollback");
    assert_eq!(count(&mut conn, "SELECT count(*) FROM inbox_messages"), 0);
}

#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn another_statement_under_the_claims_name_is_an_error() {
    let Some((_db, mut conn)) = setup("proxy_foreign_claim") else {
        return;
    };
    assert_eq!(
        claim(&mut conn, "k1").expect("first"),
        Processed::Applied(())
    );
    let (name, types) = prepared(
        &mut conn,
        "INSERT INTO inbox_messages (consumer, message_id) SELECT",
    );
    assert_eq!(types, "text, text, text");
    // A body's insert with the claim's parameter types, where the
    // claim's name was: it inserts, returns no row, affects 1 row.
    conn.batch_execute(&format!(
        "DEALLOCATE {name}; PREPARE {name} (text, text, text) AS \
         INSERT INTO proxy_orders (a, b) SELECT $2, $3"
    ))
    .expect("swap the prepared statement");
    // A new key: the foreign statement's empty answer is not taken
    // for a duplicate (the key has no row).
    let error = claim(&mut conn, "k2").expect_err("a claim that did not run is an error");
    assert_refused(&error, "was another statement under the claim's name");
    // A key that has its row: `Duplicate`, confirmed by a statement
    // of its own, and the foreign statement's write rolled back.
    assert_eq!(
        claim(&mut conn, "k1").expect("a key with its row"),
        Processed::Duplicate
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM inbox_messages WHERE message_id = 'k2'"
        ),
        0
    );
    // Only k1's own row: the foreign insert and k2's body rolled back.
    assert_eq!(count(&mut conn, "SELECT count(*) FROM proxy_orders"), 1);
}

/// The outbox enqueue, cached on PostgreSQL, checks its own row
/// and its guard parameter as the claim does: another statement
/// under its name is an error (no outbox row, no business row),
/// and the enqueue run with another statement's values fails with
/// the guard's text.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn another_statement_under_the_enqueues_name_is_an_error() {
    use diesel_inbox::outbox::{self, Outgoing};
    let Some((_db, mut conn)) = setup("proxy_foreign_enqueue") else {
        return;
    };
    let enqueue = |conn: &mut PgConnection, key: &str| {
        Inbox::consumer("proxy-outbox")
            .retries(0)
            .max_attempts(1)
            .classify(|_: &diesel::result::Error| ErrorClass::permanent())
            .run(conn, key, |conn| {
                order(conn, key)?;
                outbox::enqueue(conn, Outgoing::new("stock", "x"))
                    .map_err(diesel::result::Error::from)
            })
    };
    assert!(enqueue(&mut conn, "e1").expect("first").is_applied());
    let (name, types) = prepared(&mut conn, "INSERT INTO outbox_messages");
    // id, destination, key, payload, headers, due time, delay,
    // notify, guard.
    assert_eq!(
        types,
        "text, text, text, bytea, bytea, bigint, bigint, boolean, text"
    );
    // The enqueue run with another statement's values.
    let foreign = conn.batch_execute(&format!(
        "EXECUTE {name} ('a', 'b', NULL, '\\x00', NULL, NULL, 0, false, 'not the guard')"
    ));
    assert_server_refused(&foreign.expect_err("refused"));
    assert_eq!(count(&mut conn, "SELECT count(*) FROM outbox_messages"), 1);
    // Another statement under the enqueue's name.
    conn.batch_execute(&format!(
        "DEALLOCATE {name}; PREPARE {name} \
         (text, text, text, bytea, bytea, bigint, bigint, boolean, text) AS \
         INSERT INTO proxy_orders (a, b) SELECT $1, $2"
    ))
    .expect("swap the prepared statement");
    // Refused each time, never counted against `max_attempts` (1): a
    // proxy's mix-up is not the message's failure, and must not
    // dead-letter it.
    for delivery in 0..2 {
        let error = enqueue(&mut conn, "e2").expect_err("an enqueue that did not run");
        assert_refused(
            &error,
            "the outbox enqueue's prepared statement returned no row of its own",
        );
        assert_eq!(
            count(&mut conn, "SELECT count(*) FROM inbox_attempts"),
            0,
            "delivery {delivery} counted"
        );
    }
    // A body that swallows the refusal and returns `Ok`: still refused,
    // nothing of it committed (its business row went without its
    // message), and not counted.
    let swallowed = Inbox::consumer("proxy-outbox")
        .retries(0)
        .max_attempts(1)
        .classify(|_: &diesel::result::Error| ErrorClass::permanent())
        .run(&mut conn, "e3", |conn| {
            order(conn, "e3")?;
            let _ignored = outbox::enqueue(conn, Outgoing::new("stock", "x"));
            Ok(())
        })
        .expect_err("a body that swallowed a refusal is refused");
    assert_refused(
        &swallowed,
        "the outbox enqueue's prepared statement returned no row of its own",
    );
    for (what, sql) in [
        (
            "business rows",
            "SELECT count(*) FROM proxy_orders WHERE a = 'e3'",
        ),
        (
            "inbox rows",
            "SELECT count(*) FROM inbox_messages WHERE message_id = 'e3'",
        ),
        ("failure counts", "SELECT count(*) FROM inbox_attempts"),
    ] {
        assert_eq!(count(&mut conn, sql), 0, "{what} of e3");
    }
    assert_eq!(count(&mut conn, "SELECT count(*) FROM outbox_messages"), 1);
    assert_eq!(count(&mut conn, "SELECT count(*) FROM proxy_orders"), 1);
}

#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn another_statement_under_the_batch_claims_name_is_an_error() {
    let Some((_db, mut conn)) = setup("proxy_foreign_batch") else {
        return;
    };
    let batch = |conn: &mut PgConnection, keys: &[&str]| {
        Inbox::consumer("proxy")
            .retries(0)
            .classify(|_: &diesel::result::Error| ErrorClass::permanent())
            .run_batch(
                conn,
                keys,
                |k| k.to_string(),
                |conn, fresh: Vec<&&str>| {
                    for key in &fresh {
                        order(conn, key)?;
                    }
                    Ok::<_, diesel::result::Error>(fresh.len())
                },
            )
    };
    let first = batch(&mut conn, &["b1", "b2"]).expect("first batch");
    assert_eq!(first.value, Some(2));
    let (name, types) = prepared(
        &mut conn,
        "WITH claim AS (INSERT INTO inbox_messages (consumer, message_id) SELECT $1, k.key",
    );
    assert_eq!(types, "text, text[], text");
    conn.batch_execute(&format!(
        "DEALLOCATE {name}; PREPARE {name} (text, text[], text) AS \
         INSERT INTO proxy_orders (a, b) SELECT $1, $3"
    ))
    .expect("swap the prepared statement");
    for keys in [&["b3"][..], &["b1", "b2"][..]] {
        let error = batch(&mut conn, keys).expect_err("a batch claim that did not run is an error");
        assert_refused(&error, "was another statement under the claim's name");
    }
    assert_eq!(count(&mut conn, "SELECT count(*) FROM inbox_messages"), 2);
    assert_eq!(count(&mut conn, "SELECT count(*) FROM proxy_orders"), 2);
}

#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn the_claim_run_under_another_statements_name_writes_nothing() {
    let Some((_db, mut conn)) = setup("proxy_claim_elsewhere") else {
        return;
    };
    assert_eq!(
        claim(&mut conn, "k1").expect("first"),
        Processed::Applied(())
    );
    let (name, _) = prepared(
        &mut conn,
        "INSERT INTO inbox_messages (consumer, message_id) SELECT",
    );
    // Another client's statement that finds the claim under its own
    // name binds its own values.
    let error = conn
        .batch_execute(&format!(
            "EXECUTE {name}('proxy', 'body-value', 'another value')"
        ))
        .expect_err("the claim with another statement's parameters fails");
    assert_server_refused(&error);
    assert_eq!(count(&mut conn, "SELECT count(*) FROM inbox_messages"), 1);
}

/// The claim's duplicate check is cached too, and guarded as the
/// claim is: another client's statement that finds it under its
/// own name and binds its own values fails, rather than reading
/// the inbox's answer as its own.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn the_duplicate_check_run_under_another_statements_name_fails() {
    let Some((_db, mut conn)) = setup("proxy_present_elsewhere") else {
        return;
    };
    assert_eq!(
        claim(&mut conn, "k1").expect("first"),
        Processed::Applied(())
    );
    assert_eq!(claim(&mut conn, "k1").expect("again"), Processed::Duplicate);
    let (name, types) = prepared(&mut conn, "SELECT 'diesel-inbox claim, present'");
    assert_eq!(types, "text, text, text");
    refused_with_and_without_rows(&mut conn, &name);
}

/// Another client's values run under a guarded read's `name`: refused
/// whether or not a row matches them (a body's insert whose values match
/// no row read nothing before the guard was checked once per statement,
/// and "succeeded"), in the planner's first custom plans and in its
/// generic plan (after five runs).
fn refused_with_and_without_rows(conn: &mut PgConnection, name: &str) {
    for run in 0..7 {
        for values in [
            "'another value', 'proxy', 'k1'",
            "'proxy', 'k-none', 'a body note'",
        ] {
            let error = conn
                .batch_execute(&format!("EXECUTE {name}({values})"))
                .expect_err("a guarded read with another statement's parameters fails");
            let diesel::result::Error::DatabaseError(_, info) = &error else {
                panic!("run {run}, {values}: {error:?}");
            };
            assert!(
                info.message().starts_with("diesel-inbox: "),
                "run {run}, {values}: {error:?}"
            );
        }
    }
}

/// The replay's read before the transaction (`store_result`) is
/// cached and guarded: another client's statement run under its
/// name with its own values fails; another statement run under the
/// read's name (returning rows that look like a stored result) is
/// an error, never a replay.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn another_statement_under_the_replay_reads_name_is_an_error() {
    let Some((_db, mut conn)) = setup("proxy_replay_read") else {
        return;
    };
    let run = |conn: &mut PgConnection, key: &str| {
        Inbox::consumer("proxy")
            .retries(0)
            .classify(|_: &diesel::result::Error| ErrorClass::permanent())
            .store_result()
            .run(conn, key, |conn| order(conn, key).map(|()| 7u32))
    };
    assert!(run(&mut conn, "r1").expect("applied").is_applied());
    assert_eq!(
        run(&mut conn, "r1").expect("replayed"),
        diesel_inbox::Stored::Duplicate(Some(7))
    );
    let (name, types) = prepared(&mut conn, "SELECT 'diesel-inbox replay read'");
    assert_eq!(types, "text, text, text");
    let error = conn
        .batch_execute(&format!("EXECUTE {name}('another value', 'proxy', 'r1')"))
        .expect_err("the replay read with another statement's parameters fails");
    assert_server_refused(&error);
    refused_with_and_without_rows(&mut conn, &name);
    // Another statement under the read's name, answering with a
    // row shaped like a stored result of the key.
    conn.batch_execute(&format!(
        "DEALLOCATE {name}; PREPARE {name} (text, text, text) AS \
         SELECT 'another statement'::text, $3::text, NULL::bytea, '\\x0700'::bytea"
    ))
    .expect("swap the prepared statement");
    let error = run(&mut conn, "r2").expect_err("an answer not the read's is an error");
    assert_refused(
        &error,
        "was another statement under the inbox replay read's name",
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM inbox_messages WHERE message_id = 'r2'"
        ),
        0
    );
}

/// On the async path the stored result's write is cached, and the
/// commit after it requires it: if another statement answers under
/// the write's name, the call is an error and nothing commits, so
/// neither the body nor the key is committed.
#[cfg(feature = "async")]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn another_statement_under_the_stored_results_name_commits_nothing() {
    use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
    let Some((db, mut sync)) = setup("proxy_store_commit") else {
        return;
    };
    crate::common::modes::runtime().block_on(async {
        let mut conn = AsyncPgConnection::establish(&db).await.expect("connect");
        let run = async |conn: &mut AsyncPgConnection, key: &str| {
            let key = key.to_owned();
            Inbox::consumer("proxy")
                .retries(0)
                .classify(|_: &diesel::result::Error| ErrorClass::permanent())
                .store_result()
                .run_async(conn, key.as_str(), async |conn| {
                    let insert =
                        diesel::sql_query("INSERT INTO proxy_orders (a, b) VALUES ($1, 'order')")
                            .bind::<Text, _>(key.as_str());
                    diesel_async::RunQueryDsl::execute(insert, conn)
                        .await
                        .map(|_| 7u32)
                })
                .await
        };
        // The first write is prepared and cached, the second runs
        // the cached one.
        for key in ["s1", "s2"] {
            assert!(run(&mut conn, key).await.expect("applied").is_applied());
        }
        let query = diesel::sql_query(
            "SELECT name, array_to_string(parameter_types::text[], ', ') AS types \
             FROM pg_prepared_statements WHERE starts_with(statement, 'WITH stored AS')",
        );
        let rows: Vec<Named> = diesel_async::RunQueryDsl::load(query, &mut conn)
            .await
            .expect("pg_prepared_statements");
        assert_eq!(rows.len(), 1, "the stored result's write is cached");
        let name = &rows[0].name;
        conn.batch_execute(&format!(
            "DEALLOCATE {name}; PREPARE {name} (bytea, text, text, text) AS \
             SELECT $4::text"
        ))
        .await
        .expect("swap the prepared statement");
        let error = run(&mut conn, "s3")
            .await
            .expect_err("another statement's answer is an error");
        assert_refused(
            &error,
            "was another statement under the inbox result store's name",
        );
    });
    for table in ["inbox_messages WHERE message_id", "proxy_orders WHERE a"] {
        assert_eq!(
            count(&mut sync, &format!("SELECT count(*) FROM {table} = 's3'")),
            0,
            "{table}"
        );
    }
    assert_eq!(
        count(&mut sync, "SELECT count(*) FROM proxy_orders"),
        2,
        "s1 and s2 applied"
    );
}

/// diesel-async's cached statements have tokio-postgres' names
/// (`sN`, per process): the same check on the async path.
#[cfg(feature = "async")]
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn another_statement_under_the_async_claims_name_is_an_error() {
    use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
    let Some((db, mut sync)) = setup("proxy_foreign_async") else {
        return;
    };
    crate::common::modes::runtime().block_on(async {
        let mut conn = AsyncPgConnection::establish(&db).await.expect("connect");
        let claim =
            async |conn: &mut AsyncPgConnection, key: &str| -> QueryResult<Processed<()>> {
                let key = key.to_owned();
                Inbox::consumer("proxy")
                    .retries(0)
                    .classify(|_: &diesel::result::Error| ErrorClass::permanent())
                    .run_async(conn, key.as_str(), async |conn| {
                        let insert = diesel::sql_query(
                            "INSERT INTO proxy_orders (a, b) VALUES ($1, 'order')",
                        )
                        .bind::<Text, _>(key.as_str());
                        diesel_async::RunQueryDsl::execute(insert, conn)
                            .await
                            .map(drop)
                    })
                    .await
            };
        assert_eq!(
            claim(&mut conn, "a1").await.expect("first"),
            Processed::Applied(())
        );
        let query = diesel::sql_query(
            "SELECT name, array_to_string(parameter_types::text[], ', ') AS types \
             FROM pg_prepared_statements \
             WHERE starts_with(statement, 'INSERT INTO inbox_messages (consumer, message_id) SELECT')",
        );
        let rows: Vec<Named> = diesel_async::RunQueryDsl::load(query, &mut conn)
            .await
            .expect("pg_prepared_statements");
        assert_eq!(rows.len(), 1);
        let name = &rows[0].name;
        conn.batch_execute(&format!(
            "DEALLOCATE {name}; PREPARE {name} (text, text, text) AS \
             INSERT INTO proxy_orders (a, b) SELECT $2, $3"
        ))
        .await
        .expect("swap the prepared statement");
        let error = claim(&mut conn, "a2")
            .await
            .expect_err("a claim that did not run is an error");
        assert_refused(&error, "was another statement under the claim's name");
        assert_eq!(
            claim(&mut conn, "a1").await.expect("a key with its row"),
            Processed::Duplicate
        );
    });
    assert_eq!(count(&mut sync, "SELECT count(*) FROM inbox_messages"), 1);
    assert_eq!(count(&mut sync, "SELECT count(*) FROM proxy_orders"), 1);
}

/// The statements of a call other than its claim, the claim's
/// guarded duplicate check and the guarded replay read (a
/// duplicate's stored row, the stored
/// result, the failure counts) are never prepared under a name that
/// another client could reach.
#[test]
#[cfg_attr(
    not(inbox_test_postgres),
    ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
)]
fn only_the_claims_are_named_prepared_statements() {
    let Some((_db, mut conn)) = setup("proxy_side_statements") else {
        return;
    };
    let run = |conn: &mut PgConnection, key: &str, fail: bool| {
        Inbox::consumer("proxy")
            .retries(0)
            .classify(|_: &diesel::result::Error| ErrorClass::permanent())
            .fingerprint(diesel_inbox::Fingerprint::of_bytes(b"body"))
            .store_result()
            .max_attempts(3)
            .run(conn, key, |conn| {
                order(conn, key)?;
                if fail {
                    return Err(diesel::result::Error::RollbackTransaction);
                }
                Ok(7u32)
            })
    };
    run(&mut conn, "s1", true).expect_err("a failure is counted");
    assert!(run(&mut conn, "s1", false).expect("applied").is_applied());
    assert_eq!(
        run(&mut conn, "s1", false).expect("duplicate"),
        diesel_inbox::Stored::Duplicate(Some(7))
    );
    let named = count(
        &mut conn,
        "SELECT count(*) FROM pg_prepared_statements \
         WHERE statement LIKE '%inbox_%' AND NOT starts_with(statement, 'WITH claim AS') \
         AND NOT starts_with(statement, 'INSERT INTO inbox_messages') \
         AND NOT starts_with(statement, 'SELECT ''diesel-inbox claim, present''') \
         AND NOT starts_with(statement, 'SELECT ''diesel-inbox replay read''')",
    );
    assert_eq!(named, 0);
}
