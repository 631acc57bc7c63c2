//! The behaviour suite on MySQL/MariaDB. Set `INBOX_TEST_MYSQL_URL` (e.g.
//! `mysql://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test`, a database that exists) and
//! build with `--all-features` to run it; otherwise its tests are reported
//! as ignored.
#![cfg_attr(not(feature = "mysql"), allow(unused))]

mod common;
mod support;

#[cfg(not(feature = "mysql"))]
#[test]
#[ignore = "the mysql suite needs the `mysql` feature: cargo test --all-features"]
fn mysql_suite_needs_its_feature() {
    common::skipped(common::MYSQL_HINT);
}

#[cfg(feature = "mysql")]
mod suite {
    use super::common;
    pub use common::backends::mysql::*;
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, MysqlConnection};

    mod sync {
        crate::contract_tests!(
            crate::common::modes::Sync<crate::suite::Mysql>,
            runs_if = inbox_test_mysql,
            else_ignored = "INBOX_TEST_MYSQL_URL was not set when the tests were built: set it to a MySQL/MariaDB database that exists (e.g. mysql://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test) and run cargo test --all-features"
        );
        crate::sync_tests!(
            crate::suite::Mysql,
            runs_if = inbox_test_mysql,
            else_ignored = "INBOX_TEST_MYSQL_URL was not set when the tests were built: set it to a MySQL/MariaDB database that exists (e.g. mysql://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test) and run cargo test --all-features"
        );
    }

    #[cfg(feature = "async")]
    mod asynchronous {
        crate::contract_tests!(
            crate::common::modes::Async<crate::suite::Mysql>,
            runs_if = inbox_test_mysql,
            else_ignored = "INBOX_TEST_MYSQL_URL was not set when the tests were built: set it to a MySQL/MariaDB database that exists (e.g. mysql://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test) and run cargo test --all-features"
        );
        crate::async_tests!(
            crate::suite::Mysql,
            runs_if = inbox_test_mysql,
            else_ignored = "INBOX_TEST_MYSQL_URL was not set when the tests were built: set it to a MySQL/MariaDB database that exists (e.g. mysql://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test) and run cargo test --all-features"
        );
        crate::cancel_tests!(
            crate::suite::Mysql,
            runs_if = inbox_test_mysql,
            else_ignored = "INBOX_TEST_MYSQL_URL was not set when the tests were built: set it to a MySQL/MariaDB database that exists (e.g. mysql://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test) and run cargo test --all-features"
        );
    }

    mod schema {
        use super::{fresh, open};
        use crate::common::schema::WrongShape;

        /// The table of diesel-inbox 0.1, as its `migrate` created it.
        const LEGACY_DDL: &str = "CREATE TABLE IF NOT EXISTS inbox_messages (
            consumer VARBINARY(255) NOT NULL,
            message_id VARBINARY(255) NOT NULL,
            received_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            PRIMARY KEY (consumer, message_id),
            INDEX inbox_messages_received_at (received_at)
        ) ENGINE = InnoDB;";

        macro_rules! table {
            ($columns:literal, $rest:literal) => {
                table!($columns, $rest, "InnoDB")
            };
            ($columns:literal, $rest:literal, $engine:literal) => {
                concat!(
                    "CREATE TABLE inbox_messages (",
                    $columns,
                    ", received_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), ",
                    "INDEX inbox_messages_received_at (received_at)",
                    $rest,
                    ") ENGINE = ",
                    $engine
                )
            };
        }

        const SHAPES: &[WrongShape] = &[
            WrongShape {
                name: "no_primary_key",
                ddl: table!("consumer VARBINARY(255) NOT NULL, message_id VARBINARY(255) NOT NULL", ""),
                problem: "no primary key",
            },
            WrongShape {
                name: "primary_key_on_message_id_only",
                ddl: table!(
                    "consumer VARBINARY(255) NOT NULL, message_id VARBINARY(255) NOT NULL",
                    ", PRIMARY KEY (message_id)"
                ),
                problem: "the primary key is (message_id), not (consumer, message_id): one consumer's message",
            },
            WrongShape {
                name: "varbinary_36",
                ddl: table!(
                    "consumer VARBINARY(255) NOT NULL, message_id VARBINARY(36) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id)"
                ),
                problem: "`message_id` holds at most 36 bytes",
            },
            WrongShape {
                name: "general_ci",
                ddl: table!(
                    "consumer VARBINARY(255) NOT NULL, \
                     message_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL",
                    ", PRIMARY KEY (consumer, message_id)"
                ),
                problem: "collation utf8mb4_general_ci, which ignores case",
            },
            WrongShape {
                name: "bin_pads",
                ddl: table!(
                    "consumer VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
                     message_id VARBINARY(255) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id)"
                ),
                problem: "`consumer` uses collation utf8mb4_bin, which pads",
            },
            WrongShape {
                name: "latin1",
                ddl: table!(
                    "consumer VARBINARY(255) NOT NULL, \
                     message_id VARCHAR(255) CHARACTER SET latin1 COLLATE latin1_bin NOT NULL",
                    ", PRIMARY KEY (consumer, message_id)"
                ),
                problem: "cannot store every UTF-8 key",
            },
            WrongShape {
                name: "prefix_primary_key",
                ddl: table!(
                    "consumer VARBINARY(255) NOT NULL, message_id VARBINARY(255) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id(20))"
                ),
                problem: "covers only a prefix",
            },
            WrongShape {
                name: "foreign_key",
                ddl: concat!(
                    "CREATE TABLE known_consumers (name VARBINARY(255) PRIMARY KEY) ENGINE = InnoDB;",
                    table!(
                        "consumer VARBINARY(255) NOT NULL, message_id VARBINARY(255) NOT NULL",
                        ", PRIMARY KEY (consumer, message_id), \
                         CONSTRAINT known FOREIGN KEY (consumer) REFERENCES known_consumers (name)"
                    )
                ),
                problem: "foreign key `known`",
            },
            WrongShape {
                name: "check_constraint",
                ddl: table!(
                    "consumer VARBINARY(255) NOT NULL, message_id VARBINARY(255) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id), CONSTRAINT short_keys CHECK (length(message_id) < 40)"
                ),
                problem: "check constraint `short_keys`",
            },
            WrongShape {
                name: "insert_trigger",
                ddl: concat!(
                    table!(
                        "consumer VARBINARY(255) NOT NULL, message_id VARBINARY(255) NOT NULL",
                        ", PRIMARY KEY (consumer, message_id)"
                    ),
                    ";CREATE TRIGGER lower_keys BEFORE INSERT ON inbox_messages \
                     FOR EACH ROW SET NEW.message_id = LOWER(NEW.message_id)"
                ),
                problem: "trigger `lower_keys` runs on INSERT",
            },
            WrongShape {
                name: "myisam",
                ddl: table!(
                    "consumer VARBINARY(255) NOT NULL, message_id VARBINARY(255) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id)",
                    "MyISAM"
                ),
                problem: "MyISAM engine, which has no transactions",
            },
            WrongShape {
                name: "no_received_at_index",
                ddl: "CREATE TABLE inbox_messages (consumer VARBINARY(255) NOT NULL, \
                      message_id VARBINARY(255) NOT NULL, \
                      received_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
                      PRIMARY KEY (consumer, message_id)) ENGINE = InnoDB",
                problem: "no index starts with `received_at`",
            },
        ];

        crate::schema_tests!(
            crate::suite::Mysql,
            runs_if = inbox_test_mysql,
            else_ignored = "INBOX_TEST_MYSQL_URL was not set when the tests were built",
            newer = |version| {
                format!("ALTER TABLE inbox_messages COMMENT = 'diesel-inbox schema {version}'")
            }
        );
    }

    diesel::table! {
        inbox_test_locks (name) {
            name -> Text,
            value -> BigInt,
        }
    }

    /// Locks `first`, meets the other handler, then locks `second` and
    /// swallows the error of that statement (a deadlock for one of the two).
    #[diesel_inbox::idempotent(key = "key", consumer = "swallowed-deadlock", retries = 0)]
    fn lock_two_swallowing(
        conn: &mut MysqlConnection,
        key: &str,
        first: &str,
        second: &str,
        meet: &std::sync::Barrier,
    ) -> diesel::QueryResult<()> {
        use diesel::prelude::*;
        let add = |conn: &mut MysqlConnection, name: &str| {
            diesel::update(inbox_test_locks::table.find(name))
                .set(inbox_test_locks::value.eq(inbox_test_locks::value + 1))
                .execute(conn)
        };
        add(conn, first)?;
        meet.wait();
        let _swallowed = add(conn, second);
        Ok(())
    }

    /// InnoDB rolls back the whole transaction of a deadlock victim (the
    /// inbox row with it). A body that swallows the error and returns `Ok`
    /// must not be reported `Applied`: the runtime saw the failed statement.
    #[test]
    #[cfg_attr(
        not(inbox_test_mysql),
        ignore = "INBOX_TEST_MYSQL_URL was not set when the tests were built"
    )]
    fn a_swallowed_deadlock_is_not_reported_as_applied() {
        use diesel::prelude::*;
        let Some(url) = prepare("swallowed_deadlock") else {
            return;
        };
        let mut conn = open(&url);
        conn.batch_execute(
            "CREATE TABLE IF NOT EXISTS inbox_test_locks \
             (name VARCHAR(64) PRIMARY KEY, value BIGINT NOT NULL) ENGINE = InnoDB",
        )
        .expect("locks table");
        let run = common::unique_run_id("swallow");
        let (x, y) = (format!("{run}:x"), format!("{run}:y"));
        conn.batch_execute(&format!(
            "INSERT INTO inbox_test_locks VALUES ('{x}', 0), ('{y}', 0)"
        ))
        .expect("rows");
        let meet = std::sync::Arc::new(std::sync::Barrier::new(2));
        let handlers: Vec<_> = [(x.clone(), y.clone()), (y.clone(), x.clone())]
            .into_iter()
            .enumerate()
            .map(|(n, (first, second))| {
                let (url, key, meet) = (url.to_string(), format!("{run}:{n}"), meet.clone());
                std::thread::spawn(move || {
                    let mut conn = open(&url);
                    lock_two_swallowing(&mut conn, &key, &first, &second, &meet).map_err(
                        |e| match e {
                            diesel::result::Error::QueryBuilderError(inner) => inner
                                .downcast::<diesel_inbox::InboxError>()
                                .map(|e| *e)
                                .map_err(|e| e.to_string()),
                            other => Err(other.to_string()),
                        },
                    )
                })
            })
            .collect();
        let outcomes: Vec<_> = handlers
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect();
        let applied = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(p) if p.is_applied()))
            .count();
        let ignored = outcomes
            .iter()
            .filter(|o| matches!(o, Err(Ok(diesel_inbox::InboxError::BodyIgnoredError(_)))))
            .count();
        assert_eq!((applied, ignored), (1, 1), "{outcomes:?}");
        // The victim's claim went with its transaction: a redelivery applies.
        let claimed: i64 = diesel_inbox::inbox_messages::table
            .filter(diesel_inbox::inbox_messages::consumer.eq("swallowed-deadlock"))
            .filter(diesel_inbox::inbox_messages::message_id.like(format!("{run}:%")))
            .count()
            .get_result(&mut conn)
            .expect("count");
        assert_eq!(claimed, 1);
    }

    /// The async handler of the swallowed deadlock, on sessions whose
    /// server messages are German.
    #[cfg(feature = "async")]
    #[diesel_inbox::idempotent(key = "key", consumer = "swallowed-deadlock-de", retries = 0)]
    async fn lock_two_swallowing_async(
        conn: &mut diesel_async::AsyncMysqlConnection,
        key: &str,
        first: &str,
        second: &str,
        meet: &tokio::sync::Barrier,
        said: &std::sync::Mutex<Vec<String>>,
    ) -> diesel::QueryResult<()> {
        use diesel::prelude::*;
        use diesel_async::RunQueryDsl;
        diesel::update(inbox_test_locks::table.find(first))
            .set(inbox_test_locks::value.eq(inbox_test_locks::value + 1))
            .execute(conn)
            .await?;
        meet.wait().await;
        let swallowed = diesel::update(inbox_test_locks::table.find(second))
            .set(inbox_test_locks::value.eq(inbox_test_locks::value + 1))
            .execute(conn)
            .await;
        if let Err(diesel::result::Error::DatabaseError(_, info)) = swallowed {
            said.lock().unwrap().push(info.message().to_string());
        }
        // Another statement on a table: without autocommit it opens a new
        // transaction after the victim's rollback.
        inbox_test_locks::table
            .count()
            .get_result::<i64>(conn)
            .await?;
        Ok(())
    }

    /// The same on diesel-async, whose MySQL errors keep no error number,
    /// on sessions whose server messages are German: the runtime asks the
    /// server whether the transaction is still open (`@@in_transaction`),
    /// so the victim is not reported `Applied`, whatever the message says.
    #[cfg(feature = "async")]
    #[test]
    #[cfg_attr(
        not(inbox_test_mysql),
        ignore = "INBOX_TEST_MYSQL_URL was not set when the tests were built"
    )]
    fn a_swallowed_deadlock_in_german_is_not_reported_as_applied_async() {
        swallowed_deadlock_async("SET lc_messages = 'de_DE'");
    }

    /// On sessions without autocommit, the statement after the victim's
    /// rollback opens a new transaction (`@@in_transaction` is 1 again):
    /// the victim is still not reported `Applied`.
    #[cfg(feature = "async")]
    #[test]
    #[cfg_attr(
        not(inbox_test_mysql),
        ignore = "INBOX_TEST_MYSQL_URL was not set when the tests were built"
    )]
    fn a_swallowed_deadlock_without_autocommit_is_not_reported_as_applied_async() {
        swallowed_deadlock_async("SET lc_messages = 'de_DE', autocommit = 0");
    }

    /// Writes a row, then raises MySQL's deadlock error without a deadlock
    /// (`SIGNAL`: the transaction stays open) and swallows it.
    #[cfg(feature = "async")]
    #[diesel_inbox::idempotent(key = "key", consumer = "raised-deadlock", retries = 0)]
    async fn raise_a_deadlock_error(
        conn: &mut diesel_async::AsyncMysqlConnection,
        key: &str,
    ) -> diesel::QueryResult<()> {
        use diesel::ExpressionMethods;
        use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
        diesel::insert_into(inbox_test_locks::table)
            .values((
                inbox_test_locks::name.eq(key),
                inbox_test_locks::value.eq(1),
            ))
            .execute(conn)
            .await?;
        let raised = conn
            .batch_execute(
                "SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, \
                 MESSAGE_TEXT = 'Deadlock found when trying to get lock; try restarting transaction'",
            )
            .await;
        assert!(raised.is_err(), "SIGNAL raised nothing");
        Ok(())
    }

    /// The server's state decides, not the message: an error worded as a
    /// deadlock that left the transaction open (MariaDB's
    /// `@@in_transaction` is 1) commits, and the call is `Applied` with its
    /// row. Judged by the words alone it would be rolled back and reported
    /// `BodyIgnoredError` (the engine's tests show both).
    #[cfg(feature = "async")]
    #[test]
    #[cfg_attr(
        not(inbox_test_mysql),
        ignore = "INBOX_TEST_MYSQL_URL was not set when the tests were built"
    )]
    fn an_error_worded_as_a_deadlock_that_ended_nothing_commits_async() {
        use diesel::prelude::*;
        use diesel_async::AsyncConnection;
        let Some(url) = prepare("raised_deadlock") else {
            return;
        };
        let mut conn = open(&url);
        conn.batch_execute(
            "CREATE TABLE IF NOT EXISTS inbox_test_locks \
             (name VARCHAR(64) PRIMARY KEY, value BIGINT NOT NULL) ENGINE = InnoDB",
        )
        .expect("locks table");
        let key = common::unique_run_id("raised");
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let processed = runtime.block_on(async {
            let mut conn = diesel_async::AsyncMysqlConnection::establish(&url)
                .await
                .expect("connect");
            raise_a_deadlock_error(&mut conn, &key).await
        });
        assert!(
            matches!(&processed, Ok(p) if p.is_applied()),
            "{processed:?}"
        );
        let rows: i64 = inbox_test_locks::table
            .filter(inbox_test_locks::name.eq(&key))
            .count()
            .get_result(&mut conn)
            .expect("count");
        assert_eq!(rows, 1, "the body's row");
    }

    /// Two handlers deadlock on sessions set up by `session`; the victim
    /// swallows its error and returns `Ok`.
    #[cfg(feature = "async")]
    fn swallowed_deadlock_async(session: &'static str) {
        use diesel::prelude::*;
        use diesel_async::{AsyncConnection, SimpleAsyncConnection};
        let Some(url) = prepare("swallowed_deadlock_de") else {
            return;
        };
        let mut conn = open(&url);
        conn.batch_execute(
            "CREATE TABLE IF NOT EXISTS inbox_test_locks \
             (name VARCHAR(64) PRIMARY KEY, value BIGINT NOT NULL) ENGINE = InnoDB",
        )
        .expect("locks table");
        let run = common::unique_run_id("swallow-de");
        let (x, y) = (format!("{run}:x"), format!("{run}:y"));
        conn.batch_execute(&format!(
            "INSERT INTO inbox_test_locks VALUES ('{x}', 0), ('{y}', 0)"
        ))
        .expect("rows");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let outcomes = runtime.block_on(async {
            let meet = std::sync::Arc::new(tokio::sync::Barrier::new(2));
            let handlers: Vec<_> = [(x.clone(), y.clone()), (y.clone(), x.clone())]
                .into_iter()
                .enumerate()
                .map(|(n, (first, second))| {
                    let (url, key) = (url.to_string(), format!("{run}:{n}"));
                    let (meet, said) = (meet.clone(), said.clone());
                    tokio::spawn(async move {
                        let mut conn = diesel_async::AsyncMysqlConnection::establish(&url)
                            .await
                            .expect("connect");
                        conn.batch_execute(session).await.expect("the session");
                        lock_two_swallowing_async(&mut conn, &key, &first, &second, &meet, &said)
                            .await
                            .map_err(|e| match e {
                                diesel::result::Error::QueryBuilderError(inner) => inner
                                    .downcast::<diesel_inbox::InboxError>()
                                    .map(|e| *e)
                                    .map_err(|e| e.to_string()),
                                other => Err(other.to_string()),
                            })
                    })
                })
                .collect();
            let mut outcomes = Vec::new();
            for handler in handlers {
                outcomes.push(handler.await.expect("no panic"));
            }
            outcomes
        });
        // One victim. MariaDB words a deadlock in English in every language
        // (MySQL translates it); its other messages are German here, as a
        // missing table shows. The engine's own tests show that the state
        // read decides over any message (`engine::tests`).
        let said = said.lock().unwrap().clone();
        assert_eq!(said.len(), 1, "one deadlock victim: {said:?}, {outcomes:?}");
        let german = runtime.block_on(async {
            let mut conn = diesel_async::AsyncMysqlConnection::establish(&url)
                .await
                .expect("connect");
            conn.batch_execute("SET lc_messages = 'de_DE'")
                .await
                .expect("German messages");
            match conn.batch_execute("SELECT * FROM no_such_table").await {
                Err(diesel::result::Error::DatabaseError(_, info)) => info.message().to_string(),
                other => panic!("a missing table: {other:?}"),
            }
        });
        assert!(german.contains("existiert nicht"), "not German: {german:?}");
        let applied = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(p) if p.is_applied()))
            .count();
        let ignored = outcomes
            .iter()
            .filter(|o| matches!(o, Err(Ok(diesel_inbox::InboxError::BodyIgnoredError(_)))))
            .count();
        assert_eq!((applied, ignored), (1, 1), "{outcomes:?}");
        let claimed: i64 = diesel_inbox::inbox_messages::table
            .filter(diesel_inbox::inbox_messages::consumer.eq("swallowed-deadlock-de"))
            .filter(diesel_inbox::inbox_messages::message_id.like(format!("{run}:%")))
            .count()
            .get_result(&mut conn)
            .expect("count");
        assert_eq!(claimed, 1);
    }

    #[test]
    #[cfg_attr(
        not(inbox_test_mysql),
        ignore = "INBOX_TEST_MYSQL_URL was not set when the tests were built"
    )]
    fn migrate_refuses_to_run_inside_a_transaction() {
        let Some(url) = prepare("migrate_in_tx") else {
            return;
        };
        let mut conn = open(&url);
        let result =
            conn.transaction(|conn| Ok::<_, diesel::result::Error>(diesel_inbox::migrate(conn)));
        assert!(matches!(
            result,
            Ok(Err(diesel_inbox::InboxError::MigrationInTransaction))
        ));
        // Outside a transaction it runs.
        diesel_inbox::migrate(&mut conn).expect("migrate outside a transaction");
    }
}
