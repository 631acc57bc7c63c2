//! The Galera cluster scenarios' pieces: hot accounts credited by handlers
//! on every node, and the check that every node holds the exact result.
#![allow(dead_code)] // each binary uses part of it

use crate::common::backends::galera::{nodes, on_node, open_node};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::MysqlConnection;
use diesel_inbox::{idempotent, InboxError, Processed};
use std::sync::{Arc, Barrier};

diesel::table! {
    galera_accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

/// The hot rows every delivery writes to.
pub const ACCOUNTS: i64 = 3;

#[derive(Clone, Debug)]
pub struct Payment {
    pub id: String,
    pub account: i64,
    pub amount: i64,
}

/// `n` payments of run `run`, spread over the hot accounts.
pub fn payments(run: &str, n: usize) -> Vec<Payment> {
    (0..n)
        .map(|i| Payment {
            id: format!("{run}-{i}"),
            account: i as i64 % ACCOUNTS,
            amount: (i as i64 * 7) % 50 + 1,
        })
        .collect()
}

/// Each account's balance after one application of each payment.
pub fn expected(payments: &[Payment]) -> Vec<i64> {
    let mut balances = vec![0; ACCOUNTS as usize];
    for p in payments {
        balances[p.account as usize] += p.amount;
    }
    balances
}

/// A handler error type that knows nothing of retries (no
/// `RetryableError`): the runtime must see a conflict through the
/// statements it observes and through the COMMIT it sends itself. (Its
/// fields are read through `Debug` only.)
#[derive(Debug)]
pub enum HotError {
    Db(diesel::result::Error),
    Inbox(InboxError),
}

impl From<diesel::result::Error> for HotError {
    fn from(e: diesel::result::Error) -> Self {
        HotError::Db(e)
    }
}

impl From<InboxError> for HotError {
    fn from(e: InboxError) -> Self {
        HotError::Inbox(e)
    }
}

fn credit_row(conn: &mut MysqlConnection, payment: &Payment) -> QueryResult<usize> {
    diesel::update(galera_accounts::table.find(payment.account))
        .set(galera_accounts::balance.eq(galera_accounts::balance + payment.amount))
        .execute(conn)
}

#[idempotent(key = "payment.id", consumer = "galera.hot.app", retries = 10)]
pub fn credit_app(conn: &mut MysqlConnection, payment: &Payment) -> Result<(), HotError> {
    credit_row(conn, payment)?;
    Ok(())
}

#[idempotent(key = "payment.id", consumer = "galera.hot.diesel", retries = 10)]
pub fn credit_diesel(conn: &mut MysqlConnection, payment: &Payment) -> QueryResult<()> {
    credit_row(conn, payment).map(drop)
}

/// Which of the two handlers delivers.
#[derive(Clone, Copy, Debug)]
pub enum ErrorType {
    /// `Result<(), HotError>`.
    App,
    /// `QueryResult<()>`.
    Diesel,
}

impl ErrorType {
    /// One delivery: `Ok(true)` applied, `Ok(false)` duplicate, or the error.
    pub fn deliver(self, conn: &mut MysqlConnection, payment: &Payment) -> Result<bool, String> {
        match self {
            ErrorType::App => credit_app(conn, payment)
                .map(|p| matches!(p, Processed::Applied(())))
                .map_err(|e| format!("{e:?}")),
            ErrorType::Diesel => credit_diesel(conn, payment)
                .map(|p| matches!(p, Processed::Applied(())))
                .map_err(|e| format!("{e:?}")),
        }
    }
}

/// The inbox and the hot accounts in `db` (created through node 1).
pub fn set_up(db: &str) {
    let mut conn = open_node(&on_node(db, 0));
    diesel_inbox::migrate(&mut conn).expect("migrate");
    conn.batch_execute(
        "CREATE TABLE galera_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
    )
    .expect("accounts");
    let rows: Vec<String> = (0..ACCOUNTS).map(|id| format!("({id}, 0)")).collect();
    conn.batch_execute(&format!(
        "INSERT INTO galera_accounts (id, balance) VALUES {}",
        rows.join(", ")
    ))
    .expect("accounts' rows");
}

#[derive(Debug, Default)]
pub struct Report {
    pub applied: usize,
    pub duplicates: usize,
    pub errors: Vec<String>,
    /// The balances one application of each payment gives.
    pub expected: Vec<i64>,
}

/// Every one of `n` payments delivered to a consumer on each node, the
/// consumers starting together.
pub fn deliver_everywhere(db: &str, n: usize, error_type: ErrorType) -> Report {
    set_up(db);
    let count = nodes().expect("nodes").len();
    let run = crate::common::unique_run_id("hot");
    let all = Arc::new(payments(&run, n));
    let barrier = Arc::new(Barrier::new(count));
    let handles: Vec<_> = (0..count)
        .map(|i| {
            let (url, barrier, all) = (on_node(db, i), barrier.clone(), all.clone());
            std::thread::spawn(move || {
                let mut conn = open_node(&url);
                let mut report = Report::default();
                barrier.wait();
                for p in all.iter() {
                    match error_type.deliver(&mut conn, p) {
                        Ok(true) => report.applied += 1,
                        Ok(false) => report.duplicates += 1,
                        Err(e) => report.errors.push(format!("node {}: {}: {e}", i + 1, p.id)),
                    }
                }
                report
            })
        })
        .collect();
    let mut total = Report::default();
    for h in handles {
        let r = h.join().expect("a consumer panicked");
        total.applied += r.applied;
        total.duplicates += r.duplicates;
        total.errors.extend(r.errors);
    }
    total.expected = expected(&all);
    total
}

pub fn balances(conn: &mut MysqlConnection) -> Vec<i64> {
    galera_accounts::table
        .order(galera_accounts::id)
        .select(galera_accounts::balance)
        .load(conn)
        .expect("balances")
}

/// On every node: the balances are `expected` and the inbox holds `n` rows.
pub fn assert_state_on_every_node(db: &str, expected_balances: &[i64], n: usize) {
    for i in 0..nodes().expect("nodes").len() {
        let mut conn = open_node(&on_node(db, i));
        assert_eq!(
            balances(&mut conn),
            expected_balances,
            "balances on node {}",
            i + 1
        );
        let rows: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "(SELECT COUNT(*) FROM inbox_messages)",
        ))
        .get_result(&mut conn)
        .expect("inbox rows");
        assert_eq!(rows, n as i64, "inbox rows on node {}", i + 1);
    }
}
