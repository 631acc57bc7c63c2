//! The behaviour tests on embedded SQLite (always run): the contract for sync
//! handlers (and, with the `async` feature, for async ones on
//! `SyncConnectionWrapper<SqliteConnection>` from a deadpool pool), the
//! sync-only tests, and `migrate` against existing tables. Denies warnings
//! and clippy lints: code that uses `#[idempotent]` stays clean under them.
#![cfg(feature = "sqlite")]
#![deny(warnings, clippy::all)]

mod common;
mod support;

use common::backends::sqlite::{fresh, open, Sqlite};

mod sync {
    crate::contract_tests!(
        crate::common::modes::Sync<crate::Sqlite>,
        runs_if = all(),
        else_ignored = "never: SQLite is embedded"
    );
    crate::sync_tests!(
        crate::Sqlite,
        runs_if = all(),
        else_ignored = "never: SQLite is embedded"
    );
}

#[cfg(feature = "async")]
mod asynchronous {
    crate::contract_tests!(
        crate::common::modes::Async<crate::Sqlite>,
        runs_if = all(),
        else_ignored = "never: SQLite is embedded"
    );
    crate::async_tests!(
        crate::Sqlite,
        runs_if = all(),
        else_ignored = "never: SQLite is embedded"
    );
    crate::cancel_tests!(
        crate::Sqlite,
        runs_if = all(),
        else_ignored = "never: SQLite is embedded"
    );
}

mod schema {
    use super::{common, fresh, open};
    use common::schema::WrongShape;
    use diesel::connection::SimpleConnection;

    /// The table of diesel-inbox 0.1, as its `migrate` created it.
    const LEGACY_DDL: &str = "CREATE TABLE IF NOT EXISTS inbox_messages (
        consumer VARCHAR(255) NOT NULL,
        message_id VARCHAR(255) NOT NULL,
        received_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
        PRIMARY KEY (consumer, message_id));
        CREATE INDEX IF NOT EXISTS inbox_messages_received_at ON inbox_messages (received_at);";

    macro_rules! table {
        ($columns:literal, $rest:literal) => {
            concat!(
                "CREATE TABLE inbox_messages (",
                $columns,
                ", received_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP",
                $rest,
                "); CREATE INDEX inbox_messages_received_at ON inbox_messages (received_at);"
            )
        };
    }

    const SHAPES: &[WrongShape] = &[
        WrongShape {
            name: "no_primary_key",
            ddl: table!("consumer VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL", ""),
            problem: "no primary key",
        },
        WrongShape {
            name: "primary_key_on_message_id_only",
            ddl: table!(
                "consumer VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL",
                ", PRIMARY KEY (message_id)"
            ),
            problem: "the primary key is (message_id), not (consumer, message_id): one consumer's message",
        },
        WrongShape {
            name: "nocase",
            ddl: table!(
                "consumer VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL COLLATE NOCASE",
                ", PRIMARY KEY (consumer, message_id)"
            ),
            problem: "`message_id` compares with collation NOCASE",
        },
        WrongShape {
            name: "rtrim",
            ddl: table!(
                "consumer VARCHAR(255) NOT NULL COLLATE RTRIM, message_id VARCHAR(255) NOT NULL",
                ", PRIMARY KEY (consumer, message_id)"
            ),
            problem: "`consumer` compares with collation RTRIM",
        },
        WrongShape {
            name: "integer_affinity",
            ddl: table!(
                "consumer VARCHAR(255) NOT NULL, message_id INTEGER NOT NULL",
                ", PRIMARY KEY (consumer, message_id)"
            ),
            problem: "INTEGER affinity",
        },
        WrongShape {
            name: "extra_unique_index",
            ddl: concat!(
                table!(
                    "consumer VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id)"
                ),
                "CREATE UNIQUE INDEX one_per_key ON inbox_messages (message_id);"
            ),
            problem: "unique index `one_per_key` on (message_id)",
        },
        WrongShape {
            name: "insert_trigger",
            ddl: concat!(
                table!(
                    "consumer VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id)"
                ),
                "CREATE TRIGGER skip_claims BEFORE INSERT ON inbox_messages \
                 WHEN NEW.message_id LIKE 'test%' BEGIN SELECT RAISE(IGNORE); END;"
            ),
            problem: "trigger `skip_claims` runs on INSERT",
        },
        WrongShape {
            name: "foreign_key",
            ddl: concat!(
                "CREATE TABLE known_consumers (name VARCHAR(255) PRIMARY KEY);",
                table!(
                    "consumer VARCHAR(255) NOT NULL REFERENCES known_consumers (name), \
                     message_id VARCHAR(255) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id)"
                )
            ),
            problem: "foreign key `to known_consumers`",
        },
        WrongShape {
            name: "required_extra_column",
            ddl: table!(
                "consumer VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL, tenant TEXT NOT NULL",
                ", PRIMARY KEY (consumer, message_id)"
            ),
            problem: "column `tenant` is NOT NULL without a default",
        },
        WrongShape {
            name: "no_received_at_index",
            ddl: "CREATE TABLE inbox_messages (consumer VARCHAR(255) NOT NULL, \
                  message_id VARCHAR(255) NOT NULL, \
                  received_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \
                  PRIMARY KEY (consumer, message_id))",
            problem: "no index starts with `received_at`",
        },
    ];

    crate::schema_tests!(
        crate::Sqlite,
        runs_if = all(),
        else_ignored = "SQLite always runs",
        newer = |version| {
            format!(
                "DROP VIEW inbox_schema_version; \
                 CREATE VIEW inbox_schema_version AS SELECT {version} AS version;"
            )
        }
    );

    /// A failure that is not about privileges (here a read-only file) is
    /// reported as it is, without the privilege hint.
    #[test]
    fn migration_failures_name_their_real_cause() {
        let db = fresh("readonly").expect("sqlite always runs");
        let mut conn = open(&format!("file:{}?mode=ro", &*db));
        let error = diesel_inbox::migrate(&mut conn).expect_err("a read-only database");
        let message = error.to_string();
        assert!(
            matches!(error, diesel_inbox::InboxError::MigrationFailed(_)),
            "{error:?}"
        );
        assert!(message.contains("readonly database"), "{message}");
        assert!(!message.contains("role"), "{message}");
        // The file is intact and can be migrated read-write.
        let mut conn = open(&db);
        conn.batch_execute("SELECT 1").expect("usable");
        diesel_inbox::migrate(&mut conn).expect("read-write migrate");
    }
}

/// A handler called inside the caller's own transaction, on a WAL file
/// with `busy_timeout`, by 9 tasks at once, each on a fresh connection (its
/// first claim, so the shape check runs): the claim waits its turn for the
/// write lock as a claim in the library's own transaction does. Before the
/// check ran after the claim's write, its catalog read took a snapshot
/// inside the caller's deferred transaction that SQLite could not upgrade
/// while another connection wrote: `database is locked`, at once.
mod caller_transaction {
    use super::{common, fresh, open};
    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use diesel_inbox::{idempotent, Processed};

    const TASKS: usize = 9;
    const ROUNDS: usize = 20;

    diesel::table! { caller_tx_effects (id) { id -> Text } }

    const EFFECTS_DDL: &str = "CREATE TABLE caller_tx_effects (id TEXT PRIMARY KEY)";

    #[idempotent(key = "id", consumer = "caller-tx-sync")]
    fn apply(conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
        diesel::insert_into(caller_tx_effects::table)
            .values(caller_tx_effects::id.eq(id))
            .execute(conn)?;
        Ok(())
    }

    /// Each round's message of each task, delivered in its round and again
    /// (a redelivery) in the next.
    fn message(round: usize, task: usize) -> String {
        format!("r{round}-t{task}")
    }

    /// What a task's delivery must report: its own message applied, the
    /// previous round's a duplicate.
    fn expected(delivery: usize) -> Processed<()> {
        match delivery {
            0 => Processed::Applied(()),
            _ => Processed::Duplicate,
        }
    }

    fn check_effects(db: &str) {
        let mut conn = open(db);
        let rows: i64 = caller_tx_effects::table
            .count()
            .get_result(&mut conn)
            .expect("count effects");
        assert_eq!(rows, (TASKS * ROUNDS) as i64, "each message applied once");
        let inbox: i64 = diesel_inbox::inbox_messages::table
            .count()
            .get_result(&mut conn)
            .expect("count inbox rows");
        assert_eq!(inbox, (TASKS * ROUNDS) as i64);
    }

    fn prepare(test: &str) -> common::TestDb {
        let db = fresh(test).expect("sqlite is embedded");
        let mut conn = open(&db);
        diesel_inbox::migrate(&mut conn).expect("migrate");
        conn.batch_execute(EFFECTS_DDL).expect("effects table");
        db
    }

    #[test]
    fn sync_claims_in_the_callers_transaction_wait_for_the_write_lock() {
        let db = prepare("caller_tx_sync");
        for round in 0..ROUNDS {
            std::thread::scope(|scope| {
                for task in 0..TASKS {
                    let db = &*db;
                    scope.spawn(move || {
                        let mut conn = open(db);
                        let mut deliveries = vec![message(round, task)];
                        deliveries.extend(round.checked_sub(1).map(|r| message(r, task)));
                        for (delivery, id) in deliveries.iter().enumerate() {
                            let got = conn.transaction(|conn| apply(conn, id));
                            assert_eq!(got, Ok(expected(delivery)), "round {round}, {id}");
                        }
                    });
                }
            });
        }
        check_effects(&db);
    }

    #[cfg(feature = "async")]
    mod asynchronous {
        use super::{caller_tx_effects, check_effects, expected, message, prepare, ROUNDS, TASKS};
        use crate::common::backend::TestBackend;
        use crate::Sqlite;
        use diesel::prelude::*;
        use diesel::result::Error;
        use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
        use diesel_async::{AsyncConnection, RunQueryDsl};
        use diesel_inbox::idempotent;

        type AsyncSqlite = SyncConnectionWrapper<SqliteConnection>;

        #[idempotent(key = "id", consumer = "caller-tx-async")]
        async fn apply(conn: &mut AsyncSqlite, id: &str) -> QueryResult<()> {
            diesel::insert_into(caller_tx_effects::table)
                .values(caller_tx_effects::id.eq(id))
                .execute(conn)
                .await?;
            Ok(())
        }

        #[test]
        fn async_claims_in_the_callers_transaction_wait_for_the_write_lock() {
            let db = prepare("caller_tx_async");
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                for round in 0..ROUNDS {
                    // A pool per round: each task's connection is new.
                    let pool = Sqlite::pool(&db);
                    let mut tasks = Vec::new();
                    for task in 0..TASKS {
                        let pool = pool.clone();
                        tasks.push(tokio::spawn(async move {
                            let mut conn = Sqlite::pooled(&pool).await;
                            let mut deliveries = vec![message(round, task)];
                            deliveries.extend(round.checked_sub(1).map(|r| message(r, task)));
                            for (delivery, id) in deliveries.iter().enumerate() {
                                let got = conn
                                    .transaction(async |conn| -> Result<_, Error> {
                                        apply(conn, id).await
                                    })
                                    .await;
                                assert_eq!(got, Ok(expected(delivery)), "round {round}, {id}");
                            }
                        }));
                    }
                    for task in tasks {
                        task.await.expect("a task");
                    }
                }
            });
            check_effects(&db);
        }
    }
}
