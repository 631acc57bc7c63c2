//! The PostgreSQL contract behind PgBouncer in transaction mode (Debian's
//! 1.18, which does not track prepared statements): start it with
//! `bash scripts/pgbouncer.sh start` and set `INBOX_TEST_PGBOUNCER_URL`
//! (`scripts/pgbouncer.sh url`) beside `INBOX_TEST_POSTGRES_URL`; `.ci/run`
//! does both.
//! - With diesel's statement cache disabled (as the guide's proxy section
//!   says), the sync behaviour suite passes as it does on the server.
//! - With the default cache, clients reach each other's prepared
//!   statements; the inbox's answers are then errors, never a wrong
//!   `Applied` or `Duplicate`: `answers_through_shared_prepared_statements_are_right_or_errors`.
#![cfg_attr(not(feature = "postgres"), allow(unused))]

mod common;
mod support;

#[cfg(not(feature = "postgres"))]
#[test]
#[ignore = "the pgbouncer suite needs the `postgres` feature: cargo test --all-features"]
fn pgbouncer_suite_needs_its_feature() {
    common::skipped("the pgbouncer suite needs the `postgres` feature: cargo test --all-features --test pgbouncer");
}

#[cfg(feature = "postgres")]
mod suite {
    use super::common;
    pub use common::backends::pgbouncer::*;

    mod sync {
        crate::contract_tests!(
            crate::common::modes::Sync<crate::suite::PgBouncer>,
            runs_if = inbox_test_pgbouncer,
            else_ignored = "INBOX_TEST_PGBOUNCER_URL was not set when the tests were built: bash scripts/pgbouncer.sh start, then set it to $(bash scripts/pgbouncer.sh url)"
        );
        crate::sync_tests!(
            crate::suite::PgBouncer,
            runs_if = inbox_test_pgbouncer,
            else_ignored = "INBOX_TEST_PGBOUNCER_URL was not set when the tests were built: bash scripts/pgbouncer.sh start, then set it to $(bash scripts/pgbouncer.sh url)"
        );
    }

    /// Eight clients with diesel's default cache share two server
    /// sessions, so each one's `__diesel_stmt_N` names reach the others'
    /// statements: the plain claim, the fingerprinted claim, the batch
    /// claim and a body insert with the claim's parameter types (three
    /// texts), each first prepared in a different order per client. Every
    /// key is delivered by every client, each delivery retried on an error
    /// as a broker redelivers. What a user relies on holds whatever the
    /// errors: no key applied twice, a business row exactly where there is
    /// an inbox row, an inbox row behind every `Applied` and `Duplicate`,
    /// no inbox row that is not a delivered key.
    mod shared_statements {
        use super::{direct_url, fresh, open_cached, with_database};
        use diesel::connection::SimpleConnection;
        use diesel::prelude::*;
        use diesel_inbox::{ErrorClass, Fingerprint, Inbox, Processed};
        use std::collections::{BTreeMap, BTreeSet};
        use std::sync::Mutex;

        diesel::table! {
            proxy_effects (consumer, message_id) {
                consumer -> Text,
                message_id -> Text,
                note -> Text,
            }
        }

        const CLIENTS: usize = 8;
        const KEYS: usize = 60;
        const REDELIVERIES: usize = 10;

        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        enum Answer {
            Applied,
            Duplicate,
        }

        /// The body: one business row, by a cached diesel statement whose
        /// parameters are those of the plain claim's values (three texts).
        fn effect(conn: &mut PgConnection, consumer: &str, key: &str) -> QueryResult<()> {
            diesel::insert_into(proxy_effects::table)
                .values((
                    proxy_effects::consumer.eq(consumer),
                    proxy_effects::message_id.eq(key),
                    proxy_effects::note.eq("applied"),
                ))
                .execute(conn)
                .map(drop)
        }

        fn permanent(_: &diesel::result::Error) -> ErrorClass<diesel::result::Error> {
            ErrorClass::permanent()
        }

        /// One delivery of `key` to consumer `kind` (0 plain, 1
        /// fingerprinted, 2 a batch of one), with each verdict per key.
        fn deliver(
            conn: &mut PgConnection,
            kind: usize,
            key: &str,
        ) -> QueryResult<Vec<(String, String, Answer)>> {
            match kind {
                0 => Inbox::consumer("plain")
                    .retries(0)
                    .classify(permanent)
                    .run(conn, key, |conn| effect(conn, "plain", key))
                    .map(|p| vec![("plain".into(), key.into(), answer(&p))]),
                1 => Inbox::consumer("fingerprinted")
                    .retries(0)
                    .classify(permanent)
                    .fingerprint(Fingerprint::of_bytes(key.as_bytes()))
                    .run(conn, key, |conn| effect(conn, "fingerprinted", key))
                    .map(|p| vec![("fingerprinted".into(), key.into(), answer(&p))]),
                _ => {
                    let keys = [key.to_owned()];
                    let out = Inbox::consumer("batch")
                        .retries(0)
                        .classify(permanent)
                        .run_batch(
                            conn,
                            &keys,
                            |k| k.clone(),
                            |conn, fresh: Vec<&String>| {
                                for key in &fresh {
                                    effect(conn, "batch", key)?;
                                }
                                Ok::<_, diesel::result::Error>(fresh.len())
                            },
                        )?;
                    let answer = match out.value {
                        Some(1) => Answer::Applied,
                        _ => Answer::Duplicate,
                    };
                    Ok(vec![("batch".into(), key.into(), answer)])
                }
            }
        }

        fn answer<T>(processed: &Processed<T>) -> Answer {
            match processed {
                Processed::Applied(_) => Answer::Applied,
                Processed::Duplicate => Answer::Duplicate,
            }
        }

        #[test]
        #[cfg_attr(
            not(inbox_test_pgbouncer),
            ignore = "INBOX_TEST_PGBOUNCER_URL was not set when the tests were built"
        )]
        fn answers_through_shared_prepared_statements_are_right_or_errors() {
            let Some(db) = fresh("pgbouncer_shared") else {
                return;
            };
            let direct = with_database(
                &direct_url().expect("the server's URL"),
                db.rsplit('/').next().unwrap(),
            );
            let mut setup = super::super::common::backends::postgres::open(&direct);
            diesel_inbox::migrate(&mut setup).expect("migrate");
            setup
                .batch_execute(
                    "CREATE TABLE proxy_effects (consumer TEXT NOT NULL, message_id TEXT NOT NULL, \
                     note TEXT NOT NULL)",
                )
                .expect("business table");
            let answers = Mutex::new(Vec::<(String, String, Answer)>::new());
            let errors = Mutex::new(BTreeMap::<String, usize>::new());
            std::thread::scope(|scope| {
                for client in 0..CLIENTS {
                    let (url, answers, errors) = (&*db, &answers, &errors);
                    scope.spawn(move || {
                        let mut conn = open_cached(url);
                        for i in 0..KEYS * 3 {
                            // Each client meets the three consumers (their
                            // statements) in its own order.
                            let kind = (i + client) % 3;
                            let key = format!("k{}", (i * 7 + client * 13) % KEYS);
                            for _ in 0..REDELIVERIES {
                                match deliver(&mut conn, kind, &key) {
                                    Ok(verdicts) => {
                                        answers.lock().unwrap().extend(verdicts);
                                        break;
                                    }
                                    Err(error) => {
                                        let text = error.to_string();
                                        let text: String = text.chars().take(90).collect();
                                        *errors.lock().unwrap().entry(text).or_default() += 1;
                                    }
                                }
                            }
                        }
                    });
                }
            });
            let answers = answers.into_inner().unwrap();
            let errors = errors.into_inner().unwrap();
            let inbox: BTreeSet<(String, String)> = {
                use diesel_inbox::inbox_messages::dsl::*;
                inbox_messages
                    .select((consumer, message_id))
                    .load::<(String, String)>(&mut setup)
                    .expect("inbox rows")
                    .into_iter()
                    .collect()
            };
            let effects: Vec<(String, String)> = proxy_effects::table
                .select((proxy_effects::consumer, proxy_effects::message_id))
                .load(&mut setup)
                .expect("business rows");
            eprintln!(
                "{} answers ({} applied), {} inbox rows, {} business rows; errors: {errors:#?}",
                answers.len(),
                answers.iter().filter(|a| a.2 == Answer::Applied).count(),
                inbox.len(),
                effects.len()
            );
            let mut applied = BTreeMap::<(String, String), usize>::new();
            for (consumer, key, answer) in &answers {
                let pair = (consumer.clone(), key.clone());
                assert!(
                    inbox.contains(&pair),
                    "{answer:?} for {pair:?} without an inbox row"
                );
                if *answer == Answer::Applied {
                    *applied.entry(pair).or_default() += 1;
                }
            }
            for (pair, n) in &applied {
                assert_eq!(*n, 1, "{pair:?} reported Applied {n} times");
            }
            let mut per_pair = BTreeMap::<(String, String), usize>::new();
            for pair in effects {
                *per_pair.entry(pair).or_default() += 1;
            }
            for pair in &inbox {
                assert!(
                    ["plain", "fingerprinted", "batch"].contains(&pair.0.as_str())
                        && pair.1.starts_with('k'),
                    "an inbox row that no delivery claimed: {pair:?}"
                );
                assert_eq!(per_pair.get(pair), Some(&1), "business rows of {pair:?}");
            }
            for (pair, n) in &per_pair {
                assert!(
                    inbox.contains(pair),
                    "{n} business rows of {pair:?} without an inbox row"
                );
            }
            assert!(
                errors.values().sum::<usize>() > 0,
                "no client reached another's prepared statement: the proxy is not sharing them, and this test proves nothing"
            );
        }
    }

    /// A relay run through the proxy (its `LISTEN` connection and probe,
    /// its passes, its polls and in-process wake-ups) changes no setting
    /// of the proxy's server sessions: afterwards every other client of
    /// the pool (two clients in open transactions hold both server
    /// connections) still sees the server's `synchronous_commit` (commits
    /// wait for the WAL flush) and `lock_timeout`.
    #[cfg(feature = "relay")]
    mod session_state {
        use super::{direct_url, fresh, open, with_database};
        use crate::common::backend::TestBackend;
        use crate::support::relay::Calls;
        use diesel::connection::SimpleConnection;
        use diesel::prelude::*;
        use diesel_inbox::outbox::{self, Outgoing, Relay};
        use std::time::{Duration, Instant};

        /// A session's server process and the two settings a relay must
        /// not leave behind.
        #[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
        struct Seen {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            pid: i32,
            #[diesel(sql_type = diesel::sql_types::Text)]
            synchronous_commit: String,
            #[diesel(sql_type = diesel::sql_types::Text)]
            lock_timeout: String,
        }

        const SEEN: &str = "SELECT pg_backend_pid() AS pid, \
             current_setting('synchronous_commit') AS synchronous_commit, \
             current_setting('lock_timeout') AS lock_timeout";

        fn seen(conn: &mut PgConnection) -> Seen {
            diesel::sql_query(SEEN).get_result(conn).expect("settings")
        }

        fn enqueue(conn: &mut PgConnection, body: &str) {
            conn.transaction(|conn| {
                outbox::enqueue(conn, Outgoing::new("session_state", body))
                    .map_err(diesel::result::Error::from)
            })
            .expect("enqueue");
        }

        #[test]
        #[cfg_attr(
            not(inbox_test_pgbouncer),
            ignore = "INBOX_TEST_PGBOUNCER_URL was not set when the tests were built"
        )]
        fn a_relay_through_the_proxy_leaves_other_clients_settings_alone() {
            let Some(db) = fresh("pgbouncer_session") else {
                return;
            };
            let direct = with_database(
                &direct_url().expect("the server's URL"),
                db.rsplit('/').next().unwrap(),
            );
            // The server's own values for this database and role.
            let defaults = seen(&mut crate::common::backends::postgres::open(&direct));
            assert_eq!(
                (
                    defaults.synchronous_commit.as_str(),
                    defaults.lock_timeout.as_str()
                ),
                ("on", "0"),
                "the server's defaults are what a relay's settings would change"
            );
            let mut conn = open(&db);
            diesel_inbox::migrate(&mut conn).expect("migrate");
            let pool = super::PgBouncer::pool(&db);
            let publisher = Calls::default();
            let probed = |e: &crate::common::LoggedEvent| {
                e.level == tracing::Level::WARN && e.fields.contains("LISTEN")
            };
            let poll = Duration::from_millis(200);
            let (report, _) = crate::common::events_watched(|watched| {
                crate::common::modes::runtime().block_on(async {
                    let relay = Relay::new(pool.clone(), publisher.clone()).poll_interval(poll);
                    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                    let running = relay.run(async {
                        let _ = stopped.await;
                    });
                    let published = |n: usize| {
                        publisher.calls.lock().expect("not poisoned").concat().len() >= n
                    };
                    let test = async {
                        enqueue(&mut conn, "before the probe");
                        // Past the relay's check of its LISTEN connection
                        // (its opening, bounded by 10 s, and its probe's
                        // 2 s wait), which finds the proxy.
                        let started = Instant::now();
                        while !(watched.events().iter().any(probed) && published(1))
                            && started.elapsed() < Duration::from_secs(30)
                        {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        // Woken by a commit in this process, then polls
                        // that find nothing.
                        enqueue(&mut conn, "after the probe");
                        while !published(2) && started.elapsed() < Duration::from_secs(40) {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        tokio::time::sleep(poll * 5).await;
                        let _ = stop.send(());
                    };
                    let (report, ()) = tokio::join!(running, test);
                    report
                })
            });
            let report = report.expect("the relay");
            assert_eq!(report.published, 2, "{report:?}");
            drop(pool);
            // Two clients, each inside a transaction, hold the proxy's two
            // server connections: between them they see every session the
            // relay's statements ran on.
            let mut clients = [open(&db), open(&db)];
            let mut sessions = Vec::new();
            for client in &mut clients {
                client.batch_execute("BEGIN").expect("begin");
                sessions.push(seen(client));
            }
            assert_ne!(
                sessions[0].pid, sessions[1].pid,
                "the two clients share a server session: {sessions:?}"
            );
            for session in &sessions {
                assert_eq!(
                    (
                        session.synchronous_commit.as_str(),
                        session.lock_timeout.as_str()
                    ),
                    (
                        defaults.synchronous_commit.as_str(),
                        defaults.lock_timeout.as_str()
                    ),
                    "a server session of the proxy kept a relay's setting: {sessions:?}"
                );
            }
            for client in &mut clients {
                client.batch_execute("ROLLBACK").expect("rollback");
            }
        }
    }
}
