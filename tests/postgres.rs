//! The behaviour suite on PostgreSQL. Set `INBOX_TEST_POSTGRES_URL` (e.g.
//! `postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test`, a database that exists) and
//! build with `--all-features` to run it; otherwise its tests are reported
//! as ignored.
#![cfg_attr(not(feature = "postgres"), allow(unused))]

mod common;
mod support;

#[cfg(not(feature = "postgres"))]
#[test]
#[ignore = "the postgres suite needs the `postgres` feature: cargo test --all-features"]
fn postgres_suite_needs_its_feature() {
    common::skipped(common::POSTGRES_HINT);
}

#[cfg(feature = "postgres")]
/// What a connection proxy that shares prepared statements between
/// clients (PgBouncer before 1.21 in transaction mode) does, done on
/// one session: another statement under the claim's prepared name, and
/// the claim run under another statement's name. Each is an error,
/// never `Applied`, and a `Duplicate` only for a key whose row the
/// claim's transaction holds (confirmed by a statement of its own);
/// none writes anything.
#[path = "postgres/proxies.rs"]
mod proxies;

#[cfg(all(feature = "postgres", feature = "async"))]
#[path = "postgres/wakeups.rs"]
mod wakeups;

#[cfg(all(feature = "postgres", feature = "async"))]
#[path = "postgres/stored_commit.rs"]
mod stored_commit;

#[cfg(feature = "postgres")]
mod suite {
    use super::common;
    pub use common::backends::postgres::*;

    mod sync {
        crate::contract_tests!(
            crate::common::modes::Sync<crate::suite::Postgres>,
            runs_if = inbox_test_postgres,
            else_ignored = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test) and run cargo test --all-features"
        );
        crate::sync_tests!(
            crate::suite::Postgres,
            runs_if = inbox_test_postgres,
            else_ignored = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test) and run cargo test --all-features"
        );
    }

    #[cfg(feature = "async")]
    mod asynchronous {
        crate::contract_tests!(
            crate::common::modes::Async<crate::suite::Postgres>,
            runs_if = inbox_test_postgres,
            else_ignored = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test) and run cargo test --all-features"
        );
        crate::async_tests!(
            crate::suite::Postgres,
            runs_if = inbox_test_postgres,
            else_ignored = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test) and run cargo test --all-features"
        );
        crate::cancel_tests!(
            crate::suite::Postgres,
            runs_if = inbox_test_postgres,
            else_ignored = "INBOX_TEST_POSTGRES_URL was not set when the tests were built: set it to a PostgreSQL database that exists (e.g. postgres://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test) and run cargo test --all-features"
        );
    }

    /// Batch claims of any size are one statement, prepared once per
    /// connection and cached by diesel: after batches of 3, 7 and 1 keys,
    /// the connection holds one prepared batch claim, not three.
    mod statements {
        use super::{fresh, open};
        use diesel::prelude::*;

        #[test]
        #[cfg_attr(
            not(inbox_test_postgres),
            ignore = "INBOX_TEST_POSTGRES_URL was not set when the tests were built"
        )]
        fn batch_claims_of_every_size_share_one_prepared_statement() {
            let Some(db) = fresh("batch_statement") else {
                return;
            };
            let mut conn = open(&db);
            diesel_inbox::migrate(&mut conn).expect("migrate");
            for (round, size) in [3u32, 7, 1].into_iter().enumerate() {
                let keys: Vec<String> = (0..size).map(|k| format!("r{round}-{k}")).collect();
                let out = diesel_inbox::Inbox::consumer("prepared")
                    .retries(0)
                    .classify(|_: &diesel::result::Error| diesel_inbox::ErrorClass::permanent())
                    .run_batch(
                        &mut conn,
                        &keys,
                        |k| k.clone(),
                        |_, fresh: Vec<&String>| -> QueryResult<usize> { Ok(fresh.len()) },
                    )
                    .expect("batch");
                assert_eq!(out.value, Some(size as usize));
            }
            let prepared: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                "(SELECT COUNT(*) FROM pg_prepared_statements \
                 WHERE statement LIKE '%INSERT INTO inbox_messages (consumer, message_id) SELECT % unnest(%')",
            ))
            .get_result(&mut conn)
            .expect("pg_prepared_statements");
            assert_eq!(prepared, 1);
        }
    }

    mod schema {
        use super::{fresh, open};
        use crate::common::schema::WrongShape;

        /// The table of diesel-inbox 0.1, as its `migrate` created it.
        const LEGACY_DDL: &str = "CREATE TABLE IF NOT EXISTS inbox_messages (
            consumer VARCHAR(255) NOT NULL,
            message_id VARCHAR(255) NOT NULL,
            received_at TIMESTAMP NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),
            PRIMARY KEY (consumer, message_id));
            CREATE INDEX IF NOT EXISTS inbox_messages_received_at ON inbox_messages (received_at);";

        macro_rules! table {
            ($columns:literal, $rest:literal) => {
                concat!(
                    "CREATE TABLE inbox_messages (",
                    $columns,
                    ", received_at TIMESTAMP NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')",
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
                problem: "the primary key is (message_id), not (consumer, message_id)",
            },
            WrongShape {
                name: "varchar_36",
                ddl: table!(
                    "consumer VARCHAR(255) NOT NULL, message_id VARCHAR(36) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id)"
                ),
                problem: "`message_id` holds at most 36 characters",
            },
            WrongShape {
                name: "char_255",
                ddl: table!(
                    "consumer VARCHAR(255) NOT NULL, message_id CHAR(255) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id)"
                ),
                problem: "ignores trailing spaces",
            },
            WrongShape {
                name: "nondeterministic_collation",
                ddl: concat!(
                    "CREATE COLLATION case_insensitive \
                     (provider = icu, locale = 'und-u-ks-level2', deterministic = false);",
                    table!(
                        "consumer VARCHAR(255) NOT NULL, \
                         message_id VARCHAR(255) COLLATE case_insensitive NOT NULL",
                        ", PRIMARY KEY (consumer, message_id)"
                    )
                ),
                problem: "non-deterministic collation case_insensitive",
            },
            WrongShape {
                name: "unlogged",
                ddl: "CREATE UNLOGGED TABLE inbox_messages (consumer VARCHAR(255) NOT NULL, \
                      message_id VARCHAR(255) NOT NULL, \
                      received_at TIMESTAMP NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'), \
                      PRIMARY KEY (consumer, message_id)); \
                      CREATE INDEX inbox_messages_received_at ON inbox_messages (received_at);",
                problem: "UNLOGGED",
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
                name: "trigger_skipping_inserts",
                ddl: concat!(
                    table!(
                        "consumer VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL",
                        ", PRIMARY KEY (consumer, message_id)"
                    ),
                    "CREATE FUNCTION skip_claim() RETURNS trigger LANGUAGE plpgsql \
                     AS $$ BEGIN RETURN NULL; END $$; \
                     CREATE TRIGGER skip_claims BEFORE INSERT ON inbox_messages \
                     FOR EACH ROW EXECUTE FUNCTION skip_claim();"
                ),
                problem: "trigger `skip_claims` runs on INSERT",
            },
            WrongShape {
                name: "rule_instead_of_insert",
                ddl: concat!(
                    table!(
                        "consumer VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL",
                        ", PRIMARY KEY (consumer, message_id)"
                    ),
                    "CREATE RULE drop_claims AS ON INSERT TO inbox_messages DO INSTEAD NOTHING;"
                ),
                problem: "rule `drop_claims` runs on INSERT",
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
                problem: "foreign key",
            },
            WrongShape {
                name: "check_constraint",
                ddl: table!(
                    "consumer VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL",
                    ", PRIMARY KEY (consumer, message_id), CONSTRAINT short_keys CHECK (length(message_id) < 40)"
                ),
                problem: "check constraint `short_keys`",
            },
            WrongShape {
                name: "no_received_at_index",
                ddl: "CREATE TABLE inbox_messages (consumer VARCHAR(255) NOT NULL, \
                      message_id VARCHAR(255) NOT NULL, \
                      received_at TIMESTAMP NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'), \
                      PRIMARY KEY (consumer, message_id))",
                problem: "no index starts with `received_at`",
            },
        ];

        crate::schema_tests!(
            crate::suite::Postgres,
            runs_if = inbox_test_postgres,
            else_ignored = "INBOX_TEST_POSTGRES_URL was not set when the tests were built",
            newer = |version| {
                format!("COMMENT ON TABLE inbox_messages IS 'diesel-inbox schema {version}'")
            }
        );
    }
}
