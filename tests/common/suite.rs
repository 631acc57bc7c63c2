//! The behaviour suite, stamped out once per backend:
//! `inbox_suite!(PgConnection, prepare, open, fresh, fail_transiently, deferred_fk)`
//! where `prepare(test_name)` returns the database (a `TestDb`) with the
//! tables in place, or `None` when the backend's server is not configured
//! (the test then says it was skipped); `open(url)` opens one connection;
//! `fresh(test_name)` makes an empty database (or schema) of the test's own,
//! removed when the `TestDb` drops; `fail_transiently(conn)` runs one
//! statement that fails with an error the backend reports for a deadlock or
//! busy database; `deferred_fk` is `Some((per_connection_sql, ddl))` making
//! tables `inbox_test_parent (id)` and `inbox_test_child (parent_id)` with
//! a foreign key checked at COMMIT, or `None` where the backend has none;
//! `runs_if = <cfg>` says when the server is configured (the build script
//! sets `inbox_test_postgres` / `inbox_test_mysql`): otherwise every test is
//! reported as ignored with `else_ignored`, not as passed.
//! Being a `macro_rules!` it also proves `#[idempotent]` works when generated
//! inside one.

macro_rules! inbox_suite {
    (
        $Conn:ty, $prepare:path, $open:path, $fresh:path, $fail_transiently:path, $deferred_fk:expr,
        runs_if = $runs_if:meta, else_ignored = $why:literal
    ) => {
        use diesel::prelude::*;
        use diesel_inbox::{idempotent, inbox_messages, InboxError, InvalidKey, Processed, RetryableError};
        use std::sync::atomic::{AtomicU32, Ordering};
        use $crate::common::{inbox_test_effects as effects, unique_int_base};

        #[derive(Debug)]
        enum AppError {
            Db(diesel::result::Error),
            Inbox(InboxError),
            Rejected,
        }
        impl From<diesel::result::Error> for AppError {
            fn from(e: diesel::result::Error) -> Self {
                AppError::Db(e)
            }
        }
        impl From<InboxError> for AppError {
            fn from(e: InboxError) -> Self {
                AppError::Inbox(e)
            }
        }

        struct Msg {
            key: String,
            amount: i64,
            run: String,
        }

        fn msg(run: &str, key: impl Into<String>, amount: i64) -> Msg {
            Msg { key: key.into(), amount, run: run.to_string() }
        }

        fn write_effect(conn: &mut $Conn, run: &str, key: &str, amount: i64) -> QueryResult<usize> {
            diesel::insert_into(effects::table)
                .values((effects::run_id.eq(run), effects::message_key.eq(key), effects::amount.eq(amount)))
                .execute(conn)
        }

        /// Business rows of a run, as (key, amount), sorted.
        fn effects_of(conn: &mut $Conn, run: &str) -> Vec<(String, i64)> {
            let mut rows: Vec<(String, i64)> = effects::table
                .filter(effects::run_id.eq(run))
                .select((effects::message_key, effects::amount))
                .load(conn)
                .expect("load effects");
            rows.sort();
            rows
        }

        fn inbox_rows(conn: &mut $Conn, consumer: &str, key: &str) -> i64 {
            inbox_messages::table
                .filter(inbox_messages::consumer.eq(consumer))
                .filter(inbox_messages::message_id.eq(key))
                .count()
                .get_result(conn)
                .expect("count inbox rows")
        }

        #[idempotent(key = "msg.key")]
        fn apply_payment(conn: &mut $Conn, msg: &Msg) -> Result<i64, AppError> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            Ok(msg.amount)
        }

        #[idempotent(key = "msg.key", consumer = "rejecting", shared)]
        fn write_then_reject(conn: &mut $Conn, msg: &Msg) -> Result<(), AppError> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            Err(AppError::Rejected)
        }

        #[idempotent(key = "msg.key", consumer = "rejecting", shared)]
        fn write_then_accept(conn: &mut $Conn, msg: &Msg) -> Result<(), AppError> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            Ok(())
        }

        #[idempotent(key = "msg.key", consumer = "panicking", shared)]
        fn write_then_panic(conn: &mut $Conn, msg: &Msg) -> Result<(), AppError> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            panic!("handler bug after a write");
        }

        #[idempotent(key = "msg.key", consumer = "panicking", shared)]
        fn write_after_panic(conn: &mut $Conn, msg: &Msg) -> Result<(), AppError> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            Ok(())
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn applies_once_then_reports_duplicate() {
            let Some(db) = $prepare("applies_once") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("apply");
            let m = msg(&run, format!("{run}:1"), 42);

            assert!(matches!(apply_payment(&mut conn, &m), Ok(Processed::Applied(42))));
            assert!(matches!(apply_payment(&mut conn, &m), Ok(Processed::Duplicate)));
            assert!(matches!(apply_payment(&mut conn, &m), Ok(Processed::Duplicate)));

            assert_eq!(effects_of(&mut conn, &run), vec![(m.key.clone(), 42)]);
            assert_eq!(inbox_rows(&mut conn, "apply_payment", &m.key), 1);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn body_error_rolls_back_business_write_and_inbox_row() {
            let Some(db) = $prepare("error_rollback") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("reject");
            let m = msg(&run, format!("{run}:1"), 5);

            assert!(matches!(write_then_reject(&mut conn, &m), Err(AppError::Rejected)));
            assert_eq!(effects_of(&mut conn, &run), vec![]);
            assert_eq!(inbox_rows(&mut conn, "rejecting", &m.key), 0);

            // The failed delivery left no trace, so the redelivery applies.
            assert!(matches!(write_then_accept(&mut conn, &m), Ok(Processed::Applied(()))));
            assert_eq!(effects_of(&mut conn, &run), vec![(m.key.clone(), 5)]);
            assert_eq!(inbox_rows(&mut conn, "rejecting", &m.key), 1);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn panic_rolls_back_and_connection_stays_usable() {
            let Some(db) = $prepare("panic_rollback") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("panic");
            let m = msg(&run, format!("{run}:1"), 9);

            let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = write_then_panic(&mut conn, &m);
            }));
            let payload = unwound.expect_err("the panic reaches the caller");
            assert_eq!(payload.downcast_ref::<&str>(), Some(&"handler bug after a write"));

            assert_eq!(effects_of(&mut conn, &run), vec![]);
            assert_eq!(inbox_rows(&mut conn, "panicking", &m.key), 0);
            // Same connection, no transaction left open: the redelivery applies and commits.
            assert!(matches!(write_after_panic(&mut conn, &m), Ok(Processed::Applied(()))));
            let mut other = $open(&db);
            assert_eq!(effects_of(&mut other, &run), vec![(m.key.clone(), 9)]);
            assert_eq!(inbox_rows(&mut other, "panicking", &m.key), 1);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn outer_transaction_rollback_removes_inbox_row_too() {
            let Some(db) = $prepare("outer_rollback") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("outer");
            let m = msg(&run, format!("{run}:1"), 3);

            let outer: Result<(), AppError> = conn.transaction(|conn| {
                assert!(matches!(apply_payment(conn, &m), Ok(Processed::Applied(3))));
                assert!(matches!(apply_payment(conn, &m), Ok(Processed::Duplicate)));
                Err(AppError::Rejected)
            });
            assert!(matches!(outer, Err(AppError::Rejected)));
            assert_eq!(effects_of(&mut conn, &run), vec![]);
            assert_eq!(inbox_rows(&mut conn, "apply_payment", &m.key), 0);

            // Committed by the caller: both rows stay.
            conn.transaction(|conn| apply_payment(conn, &m).map(|p| assert!(p.is_applied())))
                .expect("outer commit");
            assert_eq!(effects_of(&mut conn, &run), vec![(m.key.clone(), 3)]);
            assert_eq!(inbox_rows(&mut conn, "apply_payment", &m.key), 1);
        }

        /// Writes, then runs a failing statement and ignores its error.
        #[idempotent(key = "msg.key", consumer = "swallowing")]
        fn swallow_a_failed_statement(conn: &mut $Conn, msg: &Msg) -> Result<(), AppError> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            let ignored = diesel::sql_query("INSERT INTO inbox_no_such_table VALUES (1)").execute(conn);
            assert!(ignored.is_err());
            Ok(())
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn the_reported_outcome_matches_what_was_committed_when_the_body_swallows_an_error() {
            let Some(db) = $prepare("swallow") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("swallow");
            let m = msg(&run, format!("{run}:1"), 4);
            match swallow_a_failed_statement(&mut conn, &m) {
                // MySQL and SQLite undo only the failed statement: the rest commits.
                Ok(Processed::Applied(())) => {
                    assert_eq!(effects_of(&mut conn, &run), vec![(m.key.clone(), 4)]);
                    assert_eq!(inbox_rows(&mut conn, "swallowing", &m.key), 1);
                    assert!(swallow_a_failed_statement(&mut conn, &m).expect("again").is_duplicate());
                }
                // PostgreSQL aborted the whole transaction: nothing was kept,
                // and the handler must not say Applied.
                Err(AppError::Inbox(InboxError::BodyIgnoredError(_))) => {
                    assert_eq!(effects_of(&mut conn, &run), vec![]);
                    assert_eq!(inbox_rows(&mut conn, "swallowing", &m.key), 0);
                    // The connection is usable and the message can still be applied.
                    assert!(apply_payment(&mut conn, &m).expect("after the abort").is_applied());
                }
                other => panic!("unexpected outcome {other:?}"),
            }
        }

        #[idempotent(key = "msg.key", consumer = "ledger")]
        fn ledger(conn: &mut $Conn, msg: &Msg) -> Result<i64, AppError> {
            write_effect(conn, &msg.run, &format!("ledger/{}", msg.key), msg.amount)?;
            Ok(msg.amount)
        }

        #[idempotent(key = "msg.key", consumer = "mailer")]
        fn mailer(conn: &mut $Conn, msg: &Msg) -> Result<i64, AppError> {
            write_effect(conn, &msg.run, &format!("mailer/{}", msg.key), msg.amount)?;
            Ok(msg.amount)
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn consumers_scope_deduplication() {
            let Some(db) = $prepare("consumers") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("scoped");
            let m = msg(&run, format!("{run}:1"), 1);

            assert!(ledger(&mut conn, &m).expect("ledger").is_applied());
            assert!(mailer(&mut conn, &m).expect("mailer").is_applied());
            assert!(ledger(&mut conn, &m).expect("ledger again").is_duplicate());
            assert!(mailer(&mut conn, &m).expect("mailer again").is_duplicate());
            assert_eq!(
                effects_of(&mut conn, &run),
                vec![(format!("ledger/{}", m.key), 1), (format!("mailer/{}", m.key), 1)]
            );
        }

        #[idempotent(key = "id", consumer = "int-keys")]
        fn by_int(conn: &mut $Conn, run: &str, id: i64) -> QueryResult<i64> {
            write_effect(conn, run, &id.to_string(), id)?;
            Ok(id)
        }

        #[idempotent(key = "id", consumer = "u32-keys")]
        fn by_u32(conn: &mut $Conn, run: &str, id: u32) -> QueryResult<()> {
            write_effect(conn, run, &format!("u32/{id}"), 0).map(drop)
        }

        #[idempotent(key = "id", consumer = "str-keys")]
        fn by_str(conn: &mut $Conn, run: &str, id: &str) -> QueryResult<()> {
            write_effect(conn, run, id, 0).map(drop)
        }

        #[idempotent(key = "id", consumer = "uuid-keys")]
        fn by_uuid(conn: &mut $Conn, run: &str, id: uuid::Uuid) -> QueryResult<()> {
            write_effect(conn, run, &id.to_string(), 0).map(drop)
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn integer_string_and_uuid_keys() {
            let Some(db) = $prepare("key_types") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("keys");
            let base = unique_int_base();
            let small = u32::try_from(base % 4_000_000_000).expect("fits");

            assert_eq!(by_int(&mut conn, &run, base).expect("int"), Processed::Applied(base));
            assert_eq!(by_int(&mut conn, &run, base).expect("int again"), Processed::Duplicate);
            assert_eq!(by_int(&mut conn, &run, base + 1).expect("next int"), Processed::Applied(base + 1));
            assert!(by_u32(&mut conn, &run, small).expect("u32").is_applied());
            assert!(by_u32(&mut conn, &run, small).expect("u32 again").is_duplicate());
            let key = format!("{run}:str");
            assert!(by_str(&mut conn, &run, &key).expect("str").is_applied());
            assert!(by_str(&mut conn, &run, &key).expect("str again").is_duplicate());
            let id = uuid::Uuid::new_v4();
            assert!(by_uuid(&mut conn, &run, id).expect("uuid").is_applied());
            assert!(by_uuid(&mut conn, &run, id).expect("uuid again").is_duplicate());

            assert_eq!(inbox_rows(&mut conn, "int-keys", &base.to_string()), 1);
            assert_eq!(inbox_rows(&mut conn, "uuid-keys", &id.hyphenated().to_string()), 1);
            assert_eq!(effects_of(&mut conn, &run).len(), 5);
        }

        struct Projector {
            consumer_label: &'static str,
            seen: u32,
        }

        impl Projector {
            #[idempotent(key = "msg.key", consumer = "projector")]
            fn project(&self, conn: &mut $Conn, msg: &Msg) -> Result<&'static str, AppError> {
                write_effect(conn, &msg.run, &msg.key, msg.amount)?;
                Ok(self.consumer_label)
            }

            #[idempotent(key = "msg.key", consumer = "counting-projector", conn = "db")]
            fn count(&mut self, db: &mut $Conn, msg: &Msg) -> Result<u32, AppError> {
                write_effect(db, &msg.run, &msg.key, msg.amount)?;
                self.seen += 1;
                Ok(self.seen)
            }
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn methods_with_shared_and_mutable_receivers() {
            let Some(db) = $prepare("methods") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("methods");
            let mut projector = Projector { consumer_label: "p", seen: 0 };
            let a = msg(&run, format!("{run}:a"), 1);
            let b = msg(&run, format!("{run}:b"), 2);

            assert_eq!(projector.project(&mut conn, &a).expect("project"), Processed::Applied("p"));
            assert_eq!(projector.project(&mut conn, &a).expect("again"), Processed::Duplicate);
            assert_eq!(projector.count(&mut conn, &b).expect("count"), Processed::Applied(1));
            assert_eq!(projector.count(&mut conn, &b).expect("count again"), Processed::Duplicate);
            assert_eq!(projector.seen, 1);
            assert_eq!(effects_of(&mut conn, &run), vec![(a.key.clone(), 1), (b.key.clone(), 2)]);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn hostile_keys_are_stored_verbatim_and_compared_byte_for_byte() {
            let Some(db) = $prepare("hostile") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("hostile");
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
                assert!(apply_payment(&mut conn, &m).expect("first delivery").is_applied(), "{suffix:?}");
                assert!(apply_payment(&mut conn, &m).expect("redelivery").is_duplicate(), "{suffix:?}");
                assert_eq!(inbox_rows(&mut conn, "apply_payment", &m.key), 1, "{suffix:?}");
            }
            let stored: Vec<String> = inbox_messages::table
                .filter(inbox_messages::consumer.eq("apply_payment"))
                .select(inbox_messages::message_id)
                .load::<String>(&mut conn)
                .expect("load keys")
                .into_iter()
                .filter(|k| k.starts_with(&run))
                .collect();
            let mut expected: Vec<String> = suffixes.iter().map(|s| format!("{run}{s}")).collect();
            let mut stored = stored;
            stored.sort();
            expected.sort();
            assert_eq!(stored, expected);
            assert_eq!(effects_of(&mut conn, &run).len(), suffixes.len());
            // The inbox table survived the first key.
            assert!(inbox_rows(&mut conn, "apply_payment", &format!("{run}key")) == 1);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn invalid_keys_are_refused_before_anything_runs() {
            let Some(db) = $prepare("invalid") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("invalid");
            let too_long = format!("{run}{}", "é".repeat(128));
            let cases = [
                (String::new(), InvalidKey::Empty),
                (format!("{run}\0nul"), InvalidKey::ContainsNul),
                (too_long.clone(), InvalidKey::TooLong { len: too_long.len() }),
            ];
            for (key, reason) in cases {
                let m = msg(&run, key, 1);
                match apply_payment(&mut conn, &m) {
                    Err(AppError::Inbox(InboxError::InvalidKey(got))) => assert_eq!(got, reason),
                    other => panic!("expected InvalidKey({reason:?}), got {other:?}"),
                }
            }
            // A key of exactly 255 bytes is fine and is not truncated.
            let exact = format!("{run}{}", "x".repeat(255 - run.len()));
            assert_eq!(exact.len(), 255);
            let m = msg(&run, exact.clone(), 1);
            assert!(apply_payment(&mut conn, &m).expect("255 bytes").is_applied());
            assert_eq!(inbox_rows(&mut conn, "apply_payment", &exact), 1);
            assert_eq!(effects_of(&mut conn, &run), vec![(exact, 1)]);
        }

        #[idempotent(key = "key", consumer = "query-result")]
        fn query_result_handler(conn: &mut $Conn, run: &str, key: &str) -> QueryResult<usize> {
            write_effect(conn, run, key, 0)
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn query_result_handlers_get_inbox_errors_as_diesel_errors() {
            let Some(db) = $prepare("query_result") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("qr");
            let key = format!("{run}:1");
            assert_eq!(query_result_handler(&mut conn, &run, &key).expect("apply"), Processed::Applied(1));
            assert_eq!(query_result_handler(&mut conn, &run, &key).expect("again"), Processed::Duplicate);
            match query_result_handler(&mut conn, &run, "") {
                Err(diesel::result::Error::QueryBuilderError(inner)) => {
                    let inbox = inner.downcast_ref::<InboxError>().expect("an InboxError inside");
                    assert!(matches!(inbox, InboxError::InvalidKey(InvalidKey::Empty)));
                }
                other => panic!("expected a QueryBuilderError, got {other:?}"),
            }
        }

        static TRANSIENT_ATTEMPTS: AtomicU32 = AtomicU32::new(0);

        #[derive(Debug)]
        struct RetryingError(diesel::result::Error);
        impl From<diesel::result::Error> for RetryingError {
            fn from(e: diesel::result::Error) -> Self {
                RetryingError(e)
            }
        }
        impl From<InboxError> for RetryingError {
            fn from(e: InboxError) -> Self {
                RetryingError(e.into())
            }
        }
        impl RetryableError for RetryingError {
            fn is_retryable(&self) -> bool {
                self.0.is_retryable()
            }

            fn retries_exhausted(self, attempts: u32) -> Self {
                RetryingError(self.0.retries_exhausted(attempts))
            }
        }

        fn serialization_failure() -> diesel::result::Error {
            diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::SerializationFailure,
                Box::new("could not serialize access due to concurrent update".to_string()),
            )
        }

        /// Writes, then fails with a serialization failure on its first
        /// `fail_times` attempts (as a conflicting writer would make it).
        #[idempotent(key = "msg.key", consumer = "retrying", retries = 2)]
        fn flaky(conn: &mut $Conn, msg: &Msg, fail_times: u32) -> Result<u32, RetryingError> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            let attempt = TRANSIENT_ATTEMPTS.fetch_add(1, Ordering::SeqCst) + 1;
            if attempt <= fail_times {
                return Err(serialization_failure().into());
            }
            Ok(attempt)
        }

        #[idempotent(key = "msg.key", consumer = "not-retrying")]
        fn opaque_error(conn: &mut $Conn, msg: &Msg, attempts: &AtomicU32) -> Result<(), AppError> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            attempts.fetch_add(1, Ordering::SeqCst);
            Err(AppError::Db(serialization_failure()))
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn retryable_body_errors_rerun_the_transaction_up_to_retries() {
            let Some(db) = $prepare("retries") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("retry");

            // Fails twice, succeeds on the third and last allowed attempt.
            TRANSIENT_ATTEMPTS.store(0, Ordering::SeqCst);
            let ok = msg(&run, format!("{run}:ok"), 1);
            assert_eq!(flaky(&mut conn, &ok, 2).expect("third attempt"), Processed::Applied(3));
            assert_eq!(effects_of(&mut conn, &run), vec![(ok.key.clone(), 1)]);

            // Fails three times: 1 + retries = 3 attempts, then the error.
            TRANSIENT_ATTEMPTS.store(0, Ordering::SeqCst);
            let bad = msg(&run, format!("{run}:bad"), 2);
            let err = flaky(&mut conn, &bad, 100).expect_err("retries exhausted");
            match &err.0 {
                diesel::result::Error::QueryBuilderError(inner) => {
                    let inbox = inner.downcast_ref::<InboxError>().expect("an InboxError inside");
                    assert!(
                        matches!(inbox, InboxError::RetriesExhausted { attempts: 3, source } if source.is_retryable()),
                        "{inbox:?}"
                    );
                }
                other => panic!("expected RetriesExhausted, got {other:?}"),
            }
            assert_eq!(TRANSIENT_ATTEMPTS.load(Ordering::SeqCst), 3);
            assert_eq!(inbox_rows(&mut conn, "retrying", &bad.key), 0);

            // Without RetryableError, an error the body made up (no
            // statement failed) is returned at once.
            let attempts = AtomicU32::new(0);
            let once = msg(&run, format!("{run}:once"), 3);
            assert!(matches!(opaque_error(&mut conn, &once, &attempts), Err(AppError::Db(e)) if e.is_retryable()));
            assert_eq!(attempts.load(Ordering::SeqCst), 1);
            assert_eq!(effects_of(&mut conn, &run), vec![(ok.key.clone(), 1)]);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn migrate_creates_the_table_on_an_empty_database_from_several_connections_at_once() {
            let Some(db) = $fresh("fresh_migrate") else { return };
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let (db, barrier) = (db.to_string(), barrier.clone());
                    std::thread::spawn(move || {
                        let mut conn = $open(&db);
                        barrier.wait();
                        diesel_inbox::migrate(&mut conn)
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("no panic").expect("concurrent migrate");
            }
            let mut conn = $open(&db);
            diesel_inbox::migrate(&mut conn).expect("migrate again");
            let claim = |conn: &mut $Conn| -> QueryResult<Processed<()>> {
                diesel_inbox::run(conn, "fresh", "m-1", 0, |_| Ok(()), diesel_inbox::ErrorClass::of)
            };
            assert_eq!(claim(&mut conn).expect("first"), Processed::Applied(()));
            assert_eq!(claim(&mut conn).expect("second"), Processed::Duplicate);
            assert_eq!(inbox_rows(&mut conn, "fresh", "m-1"), 1);
        }

        /// Claims, tells the test, holds the transaction open, then commits or fails.
        #[idempotent(key = "msg.key", consumer = "slow")]
        fn slow(
            conn: &mut $Conn,
            msg: &Msg,
            claimed: &std::sync::mpsc::Sender<()>,
            fail: bool,
        ) -> Result<(), AppError> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            let _ = claimed.send(());
            std::thread::sleep(std::time::Duration::from_millis(300));
            if fail {
                return Err(AppError::Rejected);
            }
            Ok(())
        }

        /// A second delivery arriving while the first holds its claim waits
        /// for it: `Duplicate` if the first commits, `Applied` if it rolls back.
        type Outcome = Result<Processed<()>, AppError>;

        fn second_delivery_during_first(db: &str, fail_first: bool) -> (Outcome, Outcome, Vec<(String, i64)>) {
            let run = $crate::common::unique_run_id("waiter");
            let (tx, rx) = std::sync::mpsc::channel();
            let first = {
                let (url, run) = (db.to_string(), run.clone());
                std::thread::spawn(move || {
                    let mut conn = $open(&url);
                    slow(&mut conn, &msg(&run, format!("{run}:1"), 1), &tx, fail_first)
                })
            };
            rx.recv().expect("the first delivery claimed the key");
            let (idle, _) = std::sync::mpsc::channel();
            let mut conn = $open(db);
            let second = slow(&mut conn, &msg(&run, format!("{run}:1"), 2), &idle, false);
            let first = first.join().expect("first delivery thread");
            (first, second, effects_of(&mut conn, &run))
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn a_waiting_redelivery_is_a_duplicate_once_the_first_commits() {
            let Some(db) = $prepare("waiter") else { return };
            let (first, second, effects) = second_delivery_during_first(&db, false);
            assert!(matches!(first, Ok(Processed::Applied(()))), "{first:?}");
            assert!(matches!(second, Ok(Processed::Duplicate)), "{second:?}");
            assert_eq!(effects.len(), 1);
            assert_eq!(effects[0].1, 1);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn a_waiting_redelivery_applies_when_the_first_rolls_back() {
            let Some(db) = $prepare("waiter") else { return };
            let (first, second, effects) = second_delivery_during_first(&db, true);
            assert!(matches!(first, Err(AppError::Rejected)), "{first:?}");
            assert!(matches!(second, Ok(Processed::Applied(()))), "{second:?}");
            assert_eq!(effects.len(), 1);
            assert_eq!(effects[0].1, 2, "only the second delivery's write remains");
        }

        #[idempotent(batch = "msgs", key = "|m| m.key.as_str()", consumer = "batch-payments", shared)]
        fn apply_batch(conn: &mut $Conn, msgs: &[Msg]) -> Result<usize, AppError> {
            let rows: Vec<_> = msgs
                .iter()
                .map(|m| (effects::run_id.eq(&m.run), effects::message_key.eq(&m.key), effects::amount.eq(m.amount)))
                .collect();
            Ok(diesel::insert_into(effects::table).values(&rows).execute(conn)?)
        }

        #[idempotent(batch = "msgs", key = "|m| m.key.as_str()", consumer = "batch-payments", shared)]
        fn apply_batch_then_reject(conn: &mut $Conn, msgs: &[Msg]) -> Result<(), AppError> {
            for m in &msgs {
                write_effect(conn, &m.run, &m.key, m.amount)?;
            }
            Err(AppError::Rejected)
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn batches_apply_only_first_deliveries_in_one_transaction() {
            let Some(db) = $prepare("batch") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("batch");
            let batch = |keys: &[u32]| -> Vec<Msg> { keys.iter().map(|k| msg(&run, format!("{run}:{k}"), *k as i64)).collect() };

            let first = apply_batch(&mut conn, &batch(&[1, 2, 3])).expect("first batch");
            assert_eq!((first.value, first.applied.clone(), first.duplicates), (Some(3), vec![0, 1, 2], 0));
            // Overlapping redelivery with a key repeated inside the batch.
            let second = apply_batch(&mut conn, &batch(&[3, 4, 2, 4, 5])).expect("second batch");
            assert_eq!((second.value, second.applied.clone(), second.duplicates), (Some(2), vec![1, 4], 3));
            // All duplicates: the body does not run.
            let third = apply_batch(&mut conn, &batch(&[5, 1])).expect("third batch");
            assert_eq!((third.value, third.applied.len(), third.duplicates), (None, 0, 2));

            let expected: Vec<(String, i64)> = {
                let mut rows: Vec<_> = (1..=5).map(|k| (format!("{run}:{k}"), k as i64)).collect();
                rows.sort();
                rows
            };
            assert_eq!(effects_of(&mut conn, &run), expected);
            for k in 1..=5 {
                assert_eq!(inbox_rows(&mut conn, "batch-payments", &format!("{run}:{k}")), 1);
            }

            // A failing body rolls back every claim of its batch.
            let failed = apply_batch_then_reject(&mut conn, &batch(&[5, 6, 7]));
            assert!(matches!(failed, Err(AppError::Rejected)), "{failed:?}");
            assert_eq!(inbox_rows(&mut conn, "batch-payments", &format!("{run}:6")), 0);
            assert_eq!(effects_of(&mut conn, &run), expected);

            // One invalid key refuses the whole batch before anything runs.
            let mut bad = batch(&[8, 9]);
            bad.push(msg(&run, String::new(), 0));
            match apply_batch(&mut conn, &bad) {
                Err(AppError::Inbox(InboxError::InvalidKey(InvalidKey::Empty))) => {}
                other => panic!("expected InvalidKey, got {other:?}"),
            }
            assert_eq!(inbox_rows(&mut conn, "batch-payments", &format!("{run}:8")), 0);
            assert_eq!(effects_of(&mut conn, &run), expected);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn overlapping_batches_from_several_threads_apply_each_key_once() {
            const THREADS: usize = 4;
            const KEYS: usize = 200;
            const BATCH: usize = 20;
            let Some(db) = $prepare("batch_race") else { return };
            let run = $crate::common::unique_run_id("batchrace");
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (db, run, barrier) = (db.to_string(), run.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let mut conn = $open(&db);
                        // Each thread starts at its own offset and its batches straddle the others'.
                        let order: Vec<usize> = (0..KEYS).map(|n| (n + t * 7 + t * KEYS / THREADS) % KEYS).collect();
                        barrier.wait();
                        let mut applied = 0;
                        for chunk in order.chunks(BATCH) {
                            let msgs: Vec<Msg> = chunk.iter().map(|k| msg(&run, format!("{run}:{k}"), *k as i64)).collect();
                            match apply_batch(&mut conn, &msgs) {
                                Ok(outcome) => applied += outcome.applied.len(),
                                Err(e) => panic!("batch failed: {e:?}"),
                            }
                        }
                        applied
                    })
                })
                .collect();
            let applied: usize = workers.into_iter().map(|w| w.join().expect("worker")).sum();
            assert_eq!(applied, KEYS);
            let mut conn = $open(&db);
            let mut expected: Vec<(String, i64)> = (0..KEYS).map(|k| (format!("{run}:{k}"), k as i64)).collect();
            expected.sort();
            assert_eq!(effects_of(&mut conn, &run), expected, "every key applied exactly once");
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn concurrent_deliveries_apply_each_key_exactly_once() {
            const THREADS: usize = 8;
            const KEYS: usize = 500;
            let Some(db) = $prepare("concurrent") else { return };
            let run = $crate::common::unique_run_id("race");
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (db, run, barrier) = (db.to_string(), run.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let mut conn = $open(&db);
                        let (mut applied, mut duplicates) = (0usize, 0usize);
                        barrier.wait();
                        for n in 0..KEYS {
                            // Each thread walks the keys from a different offset.
                            let k = (n + t * KEYS / THREADS) % KEYS;
                            let m = msg(&run, format!("{run}:{k}"), k as i64);
                            match apply_payment(&mut conn, &m) {
                                Ok(Processed::Applied(_)) => applied += 1,
                                Ok(Processed::Duplicate) => duplicates += 1,
                                Err(e) => panic!("delivery of {} failed: {e:?}", m.key),
                            }
                        }
                        (applied, duplicates)
                    })
                })
                .collect();
            let (mut applied, mut duplicates) = (0, 0);
            for w in workers {
                let (a, d) = w.join().expect("worker");
                applied += a;
                duplicates += d;
            }
            assert_eq!(applied, KEYS);
            assert_eq!(duplicates, KEYS * (THREADS - 1));
            let mut conn = $open(&db);
            let rows = effects_of(&mut conn, &run);
            let mut expected: Vec<(String, i64)> =
                (0..KEYS).map(|k| (format!("{run}:{k}"), k as i64)).collect();
            expected.sort();
            assert_eq!(rows, expected, "every key applied exactly once");
        }

        // ---- transient errors raised by a body statement, whatever `E` is ----

        #[derive(Debug, thiserror::Error)]
        enum ThisError {
            #[error("database: {0}")]
            Db(#[from] diesel::result::Error),
            #[error("inbox: {0}")]
            Inbox(#[from] InboxError),
        }

        /// Writes, then on its first run executes a statement that fails
        /// transiently; `?` turns that into whatever `E` is.
        fn write_then_fail_once<E: From<diesel::result::Error>>(
            conn: &mut $Conn,
            msg: &Msg,
            runs: &AtomicU32,
        ) -> Result<(), E> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                $fail_transiently(conn)?;
            }
            Ok(())
        }

        #[idempotent(key = "msg.key", consumer = "transient-plain-enum")]
        fn transient_plain_enum(conn: &mut $Conn, msg: &Msg, runs: &AtomicU32) -> Result<(), AppError> {
            write_then_fail_once(conn, msg, runs)
        }

        #[idempotent(key = "msg.key", consumer = "transient-thiserror")]
        fn transient_thiserror(conn: &mut $Conn, msg: &Msg, runs: &AtomicU32) -> Result<(), ThisError> {
            write_then_fail_once(conn, msg, runs)
        }

        #[idempotent(key = "msg.key", consumer = "transient-anyhow")]
        fn transient_anyhow(conn: &mut $Conn, msg: &Msg, runs: &AtomicU32) -> anyhow::Result<()> {
            write_then_fail_once::<diesel::result::Error>(conn, msg, runs)?;
            Ok(())
        }

        #[idempotent(key = "msg.key", consumer = "transient-boxed")]
        fn transient_boxed(
            conn: &mut $Conn,
            msg: &Msg,
            runs: &AtomicU32,
        ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            write_then_fail_once::<diesel::result::Error>(conn, msg, runs)?;
            Ok(())
        }

        #[idempotent(key = "msg.key", consumer = "transient-query-result")]
        fn transient_query_result(conn: &mut $Conn, msg: &Msg, runs: &AtomicU32) -> QueryResult<()> {
            write_then_fail_once(conn, msg, runs)
        }

        #[idempotent(key = "msg.key", consumer = "transient-generic")]
        fn transient_generic<E>(conn: &mut $Conn, msg: &Msg, runs: &AtomicU32) -> Result<(), E>
        where
            E: From<diesel::result::Error> + From<InboxError>,
        {
            write_then_fail_once(conn, msg, runs)
        }

        /// An error type that overrides the runtime: database errors are permanent.
        #[derive(Debug)]
        struct NeverRetry(diesel::result::Error);
        impl From<diesel::result::Error> for NeverRetry {
            fn from(e: diesel::result::Error) -> Self {
                NeverRetry(e)
            }
        }
        impl From<InboxError> for NeverRetry {
            fn from(e: InboxError) -> Self {
                NeverRetry(e.into())
            }
        }
        impl RetryableError for NeverRetry {
            fn is_retryable(&self) -> bool {
                false
            }
        }

        #[idempotent(key = "msg.key", consumer = "transient-never-retry")]
        fn transient_never_retry(conn: &mut $Conn, msg: &Msg, runs: &AtomicU32) -> Result<(), NeverRetry> {
            write_then_fail_once(conn, msg, runs)
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn a_transient_error_of_a_body_statement_is_retried_whatever_the_error_type() {
            let Some(db) = $prepare("transient_any_e") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("transient");
            type Handler = fn(&mut $Conn, &Msg, &AtomicU32) -> Result<Processed<()>, String>;
            let handlers: [(&str, &str, Handler); 6] = [
                ("plain enum with only Debug", "transient-plain-enum", |c, m, r| transient_plain_enum(c, m, r).map_err(|e| format!("{e:?}"))),
                ("thiserror enum", "transient-thiserror", |c, m, r| transient_thiserror(c, m, r).map_err(|e| e.to_string())),
                ("anyhow::Error", "transient-anyhow", |c, m, r| transient_anyhow(c, m, r).map_err(|e| e.to_string())),
                ("Box<dyn Error + Send + Sync>", "transient-boxed", |c, m, r| transient_boxed(c, m, r).map_err(|e| e.to_string())),
                ("QueryResult", "transient-query-result", |c, m, r| transient_query_result(c, m, r).map_err(|e| e.to_string())),
                ("generic E", "transient-generic", |c, m, r| transient_generic::<AppError>(c, m, r).map_err(|e| format!("{e:?}"))),
            ];
            for (n, (what, consumer, handler)) in handlers.into_iter().enumerate() {
                let m = msg(&run, format!("{run}:{n}"), n as i64);
                let runs = AtomicU32::new(0);
                assert_eq!(handler(&mut conn, &m, &runs), Ok(Processed::Applied(())), "{what}");
                assert_eq!(runs.load(Ordering::SeqCst), 2, "{what}: one failed run, one retry");
                assert_eq!(inbox_rows(&mut conn, consumer, &m.key), 1, "{what}");
                // The redelivery is a duplicate.
                assert_eq!(handler(&mut conn, &m, &runs), Ok(Processed::Duplicate), "{what}");
            }
            // Each message written exactly once: the failed run rolled back.
            let expected: Vec<(String, i64)> = (0..6).map(|n| (format!("{run}:{n}"), n)).collect();
            assert_eq!(effects_of(&mut conn, &run), expected);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn retryable_error_overrides_the_observed_statement() {
            let Some(db) = $prepare("transient_override") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("never");
            let m = msg(&run, format!("{run}:1"), 1);
            let runs = AtomicU32::new(0);
            match transient_never_retry(&mut conn, &m, &runs) {
                Err(NeverRetry(e)) => assert!(e.is_retryable(), "a transient error, kept permanent: {e}"),
                other => panic!("expected the error at once, got {other:?}"),
            }
            assert_eq!(runs.load(Ordering::SeqCst), 1, "not retried");
            assert_eq!(effects_of(&mut conn, &run), vec![]);
            assert_eq!(inbox_rows(&mut conn, "transient-never-retry", &m.key), 0);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn inside_a_callers_transaction_a_transient_body_error_is_returned_at_once() {
            let Some(db) = $prepare("transient_nested") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("nested");
            let m = msg(&run, format!("{run}:1"), 1);
            let runs = AtomicU32::new(0);
            let outer: Result<(), AppError> = conn.transaction(|conn| {
                transient_plain_enum(conn, &m, &runs).map(drop)
            });
            assert!(matches!(outer, Err(AppError::Db(_))), "{outer:?}");
            assert_eq!(runs.load(Ordering::SeqCst), 1, "the caller owns the transaction");
            assert_eq!(effects_of(&mut conn, &run), vec![]);
        }

        // ---- a commit that fails because of the body ----

        #[idempotent(key = "msg.key", consumer = "deferred-fk")]
        fn orphan_child(conn: &mut $Conn, msg: &Msg, parent: i64) -> Result<(), AppError> {
            write_effect(conn, &msg.run, &msg.key, msg.amount)?;
            diesel::sql_query(format!("INSERT INTO inbox_test_child (parent_id) VALUES ({parent})"))
                .execute(conn)?;
            Ok(())
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn a_commit_failure_the_body_caused_is_the_bodys_database_error() {
            let Some((per_connection, ddl)) = $deferred_fk else {
                $crate::common::skipped("this backend checks no constraint at COMMIT");
                return;
            };
            let Some(db) = $fresh("deferred_fk") else { return };
            let mut conn = $open(&db);
            diesel_inbox::migrate(&mut conn).expect("migrate");
            conn.batch_execute(&format!("{}; {ddl}", $crate::common::EFFECTS_DDL)).expect("tables");
            conn.batch_execute(per_connection).expect("connection setup");
            let run = $crate::common::unique_run_id("deferred");
            let m = msg(&run, format!("{run}:1"), 1);
            let (outcome, warnings) = $crate::common::warnings_during(|| orphan_child(&mut conn, &m, 7));
            match outcome {
                Err(AppError::Db(diesel::result::Error::DatabaseError(kind, info))) => {
                    assert!(
                        matches!(kind, diesel::result::DatabaseErrorKind::ForeignKeyViolation)
                            || info.message().contains("FOREIGN KEY"),
                        "{kind:?}: {}",
                        info.message()
                    );
                }
                other => panic!("expected the body's own database error, got {other:?}"),
            }
            assert_eq!(warnings, Vec::<String>::new(), "no rollback warning");
            let ((), probe) = $crate::common::warnings_during(|| tracing::warn!("probe"));
            assert_eq!(probe.len(), 1, "the collector sees warnings");
            assert_eq!(effects_of(&mut conn, &run), vec![]);
            assert_eq!(inbox_rows(&mut conn, "deferred-fk", &m.key), 0);
            // Nothing half-written: once the parent exists the redelivery applies.
            conn.batch_execute("INSERT INTO inbox_test_parent (id) VALUES (7)").expect("parent");
            assert!(matches!(orphan_child(&mut conn, &m, 7), Ok(Processed::Applied(()))));
            assert_eq!(effects_of(&mut conn, &run), vec![(m.key.clone(), 1)]);
        }

        // ---- small integer keys ----

        #[idempotent(key = "id", consumer = "u8-keys")]
        fn by_u8(conn: &mut $Conn, run: &str, id: u8) -> QueryResult<()> {
            write_effect(conn, run, &format!("u8/{id}"), i64::from(id)).map(drop)
        }

        #[idempotent(key = "id", consumer = "i8-keys")]
        fn by_i8(conn: &mut $Conn, run: &str, id: i8) -> QueryResult<()> {
            write_effect(conn, run, &format!("i8/{id}"), i64::from(id)).map(drop)
        }

        // ---- a key read from a destructured parameter ----

        #[idempotent(key = "id", consumer = "destructured")]
        fn destructured(conn: &mut $Conn, run: &str, (id, amount): (String, i64)) -> QueryResult<i64> {
            write_effect(conn, run, &id, amount)?;
            Ok(amount)
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn u8_i8_and_destructured_keys() {
            let Some(db) = $prepare("small_keys") else { return };
            let mut conn = $open(&db);
            let run = $crate::common::unique_run_id("small");
            // Consumers are shared by every run: clear this test's keys first.
            for consumer in ["u8-keys", "i8-keys"] {
                diesel::delete(inbox_messages::table.filter(inbox_messages::consumer.eq(consumer)))
                    .execute(&mut conn)
                    .expect("clear");
            }
            assert!(by_u8(&mut conn, &run, 255).expect("u8").is_applied());
            assert!(by_u8(&mut conn, &run, 255).expect("u8 again").is_duplicate());
            assert!(by_i8(&mut conn, &run, -128).expect("i8").is_applied());
            assert!(by_i8(&mut conn, &run, -128).expect("i8 again").is_duplicate());
            assert_eq!(inbox_rows(&mut conn, "u8-keys", "255"), 1);
            assert_eq!(inbox_rows(&mut conn, "i8-keys", "-128"), 1);
            let key = format!("{run}:destructured");
            assert_eq!(destructured(&mut conn, &run, (key.clone(), 5)).expect("first"), Processed::Applied(5));
            assert_eq!(destructured(&mut conn, &run, (key.clone(), 5)).expect("again"), Processed::Duplicate);
            assert_eq!(inbox_rows(&mut conn, "destructured", &key), 1);
            assert_eq!(effects_of(&mut conn, &run).len(), 3);
        }
    };
}
