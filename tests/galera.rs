//! The behaviour suite and the cluster scenarios on a MariaDB Galera
//! cluster (multi-master). Set `INBOX_TEST_GALERA_URLS` to one URL per
//! node, comma-separated (`scripts/galera-cluster.sh start` starts a 3-node
//! cluster on loopback, `scripts/galera-cluster.sh urls` prints them), and
//! build with `--all-features`; otherwise the tests are reported as ignored.
//! The node-kill scenario is in `galera_failover.rs`, a binary of its own,
//! so that no other test runs while a node is down.
#![cfg_attr(not(feature = "mysql"), allow(unused))]

mod common;
mod support;
#[cfg(feature = "mysql")]
use common::galera_hot as hot;

#[cfg(not(feature = "mysql"))]
#[test]
#[ignore = "the Galera suite needs the `mysql` feature: cargo test --all-features"]
fn galera_suite_needs_its_feature() {
    common::skipped("the Galera suite needs the `mysql` feature: cargo test --all-features");
}

#[cfg(feature = "mysql")]
mod suite {
    pub use super::common::backends::galera::*;

    mod sync {
        crate::contract_tests!(
            crate::common::modes::Sync<crate::suite::Galera>,
            runs_if = inbox_test_galera,
            else_ignored = "INBOX_TEST_GALERA_URLS was not set when the tests were built: start a cluster with scripts/galera-cluster.sh start, set INBOX_TEST_GALERA_URLS=$(scripts/galera-cluster.sh urls) and run cargo test --all-features"
        );
    }

    #[cfg(feature = "async")]
    mod asynchronous {
        crate::contract_tests!(
            crate::common::modes::Async<crate::suite::Galera>,
            runs_if = inbox_test_galera,
            else_ignored = "INBOX_TEST_GALERA_URLS was not set when the tests were built: start a cluster with scripts/galera-cluster.sh start, set INBOX_TEST_GALERA_URLS=$(scripts/galera-cluster.sh urls) and run cargo test --all-features"
        );
    }

    #[cfg_attr(not(inbox_test_galera), allow(dead_code))]
    mod cluster {
        use super::{fresh, nodes, on_node, open_node};
        use crate::hot::{self, ErrorType};
        use diesel::prelude::*;
        use std::sync::{Arc, Barrier};

        /// `migrate` from every node at the same moment, on a database
        /// without the table, five times: `GET_LOCK` is node-local on
        /// Galera, so the nodes do not wait for each other; the DDL
        /// replicates in total order (TOI), and a node whose
        /// `CREATE TABLE IF NOT EXISTS` comes second finds the table.
        /// Every call succeeds, and every node then has one table of the
        /// right shape that dedupes.
        #[test]
        #[cfg_attr(
            not(inbox_test_galera),
            ignore = "INBOX_TEST_GALERA_URLS was not set when the tests were built"
        )]
        fn migrate_from_every_node_at_once() {
            let Some(nodes) = nodes() else { return };
            for round in 0..5 {
                let db = fresh(&format!("galera_migrate_{round}")).expect("a database");
                let barrier = Arc::new(Barrier::new(nodes.len()));
                let results: Vec<_> = (0..nodes.len())
                    .map(|i| {
                        let (url, barrier) = (on_node(&db, i), barrier.clone());
                        std::thread::spawn(move || {
                            let mut conn = open_node(&url);
                            barrier.wait();
                            diesel_inbox::migrate(&mut conn)
                        })
                    })
                    .collect::<Vec<_>>()
                    .into_iter()
                    .map(|h| h.join().expect("no panic"))
                    .collect();
                for (i, result) in results.into_iter().enumerate() {
                    result.unwrap_or_else(|e| panic!("round {round}, node {}: {e}", i + 1));
                }
                for i in 0..nodes.len() {
                    let mut conn = open_node(&on_node(&db, i));
                    diesel_inbox::migrate(&mut conn).expect("migrate again: the shape is right");
                    let tables: i64 =
                        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                            "(SELECT COUNT(*) FROM information_schema.TABLES \
                         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_messages')",
                        ))
                        .get_result(&mut conn)
                        .expect("catalog");
                    assert_eq!(tables, 1, "node {}", i + 1);
                    let first = diesel_inbox::Inbox::consumer("galera-migrate")
                        .retries(0)
                        .run(&mut conn, &format!("m-{round}-{i}"), |_| {
                            Ok::<_, diesel::result::Error>(())
                        });
                    assert_eq!(first.expect("claim"), diesel_inbox::Processed::Applied(()));
                }
                // Every node sees the claims made on the others.
                let mut last = open_node(&on_node(&db, nodes.len() - 1));
                let rows: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                    "(SELECT COUNT(*) FROM inbox_messages WHERE consumer = 'galera-migrate')",
                ))
                .get_result(&mut last)
                .expect("count");
                assert_eq!(rows, nodes.len() as i64);
            }
        }

        /// Every message delivered to a consumer on each node at the same
        /// moment; each delivery credits one of three hot accounts. Galera
        /// settles the races at certification (error 1213 at any statement
        /// or at COMMIT) and the runtime reruns the loser, which then finds
        /// the claim: exact balances on every node, one inbox row per
        /// message, and no error reaching any caller, with a handler error
        /// type that knows nothing of retries and with `QueryResult`.
        #[test]
        #[cfg_attr(
            not(inbox_test_galera),
            ignore = "INBOX_TEST_GALERA_URLS was not set when the tests were built"
        )]
        fn every_node_delivers_every_message_at_once() {
            let Some(_) = nodes() else { return };
            for error_type in [ErrorType::App, ErrorType::Diesel] {
                let db = fresh("galera_hot").expect("a database");
                let report = hot::deliver_everywhere(&db, 120, error_type);
                assert_eq!(report.errors, Vec::<String>::new(), "{error_type:?}");
                assert_eq!(
                    report.applied, 120,
                    "{error_type:?}: each message applied once"
                );
                assert_eq!(report.applied + report.duplicates, 3 * 120);
                hot::assert_state_on_every_node(&db, &report.expected, 120);
            }
        }
    }
}
