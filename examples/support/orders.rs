//! What the broker examples share: the orders a producer publishes (some
//! twice), the `#[idempotent]` async handler that credits accounts, and the
//! exact-balance check, on SQLite (a temporary file) or on PostgreSQL
//! (`DATABASE_URL=postgres://…`, feature `postgres`).

use diesel_inbox::InboxError;

pub const ORDERS: u64 = 1_000;
pub const ACCOUNTS: i64 = 10;

diesel::table! {
    broker_accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

/// The handler's error type.
#[derive(Debug)]
#[allow(dead_code)] // printed through Debug
pub enum AppError {
    Db(diesel::result::Error),
    Inbox(InboxError),
    /// A body that is not `account:amount`: permanent, dead-lettered.
    BadPayload,
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

/// Where it holds the inbox's refusals, which the runner dead-letters.
impl diesel_inbox::brokers::HasInboxError for AppError {
    fn inbox_error(&self) -> Option<&InboxError> {
        match self {
            AppError::Inbox(e) => Some(e),
            _ => None,
        }
    }
}

/// The orders `(message id, "account:amount")`, every fifth published
/// twice (a producer retry), and the balances one application of each
/// gives.
pub fn orders(run: &str) -> (Vec<(String, String)>, Vec<i64>) {
    let mut expected = vec![0; ACCOUNTS as usize];
    let mut all: Vec<(String, String)> = (0..ORDERS)
        .map(|n| {
            let (account, amount) = ((n * 7 % ACCOUNTS as u64) as i64, (n % 90 + 10) as i64);
            expected[account as usize] += amount;
            (format!("order-{run}-{n}"), format!("{account}:{amount}"))
        })
        .collect();
    let again: Vec<_> = all.iter().step_by(5).cloned().collect();
    all.extend(again);
    (all, expected)
}

fn parse(body: &[u8]) -> Option<(i64, i64)> {
    let (account, amount) = std::str::from_utf8(body).ok()?.split_once(':')?;
    Some((account.parse().ok()?, amount.parse().ok()?))
}

/// The consumer side, once per connection type.
macro_rules! order_store {
    ($module:ident, $Conn:ty) => {
        pub mod $module {
            use super::*;
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
            use diesel_inbox::idempotent;

            pub type Conn = $Conn;

            /// Credits the order's account, once per message id.
            #[idempotent(key = "id", consumer = "broker-example-credit", shared)]
            pub async fn credit(conn: &mut Conn, id: &str, body: &[u8]) -> Result<(), AppError> {
                let (account, amount) = parse(body).ok_or(AppError::BadPayload)?;
                diesel::update(broker_accounts::table.find(account))
                    .set(broker_accounts::balance.eq(broker_accounts::balance + amount))
                    .execute(conn)
                    .await?;
                Ok(())
            }

            /// A connection with the tables in place and every balance 0.
            pub async fn prepare(
                url: &str,
                setup: &str,
            ) -> Result<Conn, Box<dyn std::error::Error>> {
                let mut conn = Conn::establish(url).await?;
                conn.batch_execute(setup).await?;
                diesel_inbox::migrate_async(&mut conn).await?;
                conn.batch_execute("DROP TABLE IF EXISTS broker_accounts")
                    .await?;
                conn.batch_execute(
                    "CREATE TABLE broker_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
                )
                .await?;
                for id in 0..ACCOUNTS {
                    diesel::insert_into(broker_accounts::table)
                        .values((broker_accounts::id.eq(id), broker_accounts::balance.eq(0)))
                        .execute(&mut conn)
                        .await?;
                }
                Ok(conn)
            }

            pub async fn balances(conn: &mut Conn) -> Result<Vec<i64>, diesel::result::Error> {
                broker_accounts::table
                    .order(broker_accounts::id)
                    .select(broker_accounts::balance)
                    .load(conn)
                    .await
            }
        }
    };
}

order_store!(
    sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
);
#[cfg(feature = "postgres")]
order_store!(postgres, diesel_async::AsyncPgConnection);

/// A run id of letters and digits.
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}x{:x}", std::process::id(), nanos % (1 << 40))
}

/// Prints the check the quickstart prints, and fails unless it holds.
pub fn check(
    label: &str,
    applied: u64,
    duplicates: u64,
    balances: &[i64],
    expected: &[i64],
) -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "{label}: {ORDERS} orders, {} deliveries: {applied} applied, {duplicates} duplicates skipped, each acked after its commit",
        applied + duplicates
    );
    if balances != expected {
        return Err(format!("balances {balances:?} differ from {expected:?}").into());
    }
    println!("balances match: every order was applied exactly once");
    Ok(())
}
