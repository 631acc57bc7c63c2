//! A consumer behind a broker that delivers at least once.
//!
//! `cargo run --example quickstart` runs on embedded SQLite (in memory).
//! `DATABASE_URL=postgres://… cargo run --example quickstart --features postgres`
//! (or `mysql://…` with `--features mysql`) runs the same simulation on a server.
//!
//! The simulated broker publishes 1,000 payment messages. It redelivers a
//! third of them (a lost ack), the consumer "crashes" after committing but
//! before acking some (so the broker redelivers those too), and some handlers
//! fail on their first delivery (rolled back, then redelivered). At the end,
//! every account balance must equal exactly one application of each payment.

use diesel::connection::{AnsiTransactionManager, LoadConnection};
use diesel::prelude::*;
use diesel_inbox::{idempotent, InboxBackend, InboxError, Processed};
use std::collections::VecDeque;

const MESSAGES: u64 = 1_000;
const ACCOUNTS: i64 = 10;

diesel::table! {
    quickstart_accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

/// The handler's error type: anything from Diesel or the inbox, or a refusal.
#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Inbox(InboxError),
    /// The handler refused this delivery (here: a simulated transient fault).
    Rejected(&'static str),
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
impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Db(e) => write!(f, "database: {e}"),
            AppError::Inbox(e) => write!(f, "{e}"),
            AppError::Rejected(why) => write!(f, "rejected: {why}"),
        }
    }
}
impl std::error::Error for AppError {}

pub struct Payment {
    pub id: String,
    pub account: i64,
    pub amount: i64,
}

/// What the broker hands the consumer: the message and whether it was
/// delivered before (RabbitMQ's `redelivered` flag, NATS's delivery count).
pub struct Delivery {
    pub payment: Payment,
    pub seq: u64,
    pub redelivered: bool,
}

/// The consumer, stamped out for each connection type (the same code works
/// for any of them).
macro_rules! payment_consumer {
    ($module:ident, $Conn:ty) => {
        mod $module {
            use super::*;

            /// Credits the account. The attribute records `payment.id` in the
            /// inbox in the same transaction; a redelivery returns `Duplicate`.
            /// The name is pinned (it survives renames), and `shared` because
            /// the example builds this one logical consumer once per database
            /// it supports: without it, the handlers of the other modules
            /// would be refused as an accidental shared scope.
            #[idempotent(key = "delivery.payment.id", consumer = "quickstart.payments", shared)]
            pub fn apply_payment(conn: &mut $Conn, delivery: &Delivery) -> Result<i64, AppError> {
                let payment = &delivery.payment;
                diesel::update(quickstart_accounts::table.find(payment.account))
                    .set(
                        quickstart_accounts::balance
                            .eq(quickstart_accounts::balance + payment.amount),
                    )
                    .execute(conn)?;
                // Every 97th message fails on its first delivery, after its
                // write: the rollback must leave no trace.
                if delivery.seq % 97 == 0 && !delivery.redelivered {
                    return Err(AppError::Rejected("transient fault"));
                }
                Ok(payment.amount)
            }

            pub fn balances(conn: &mut $Conn) -> QueryResult<Vec<(i64, i64)>> {
                quickstart_accounts::table
                    .order(quickstart_accounts::id)
                    .select((quickstart_accounts::id, quickstart_accounts::balance))
                    .load(conn)
            }

            pub fn run(
                url: &str,
                label: &str,
                messages: u64,
            ) -> Result<bool, Box<dyn std::error::Error>> {
                let mut conn = <$Conn>::establish(url)?;
                simulate(&mut conn, label, messages, apply_payment, balances)
            }
        }
    };
}

#[cfg(feature = "sqlite")]
payment_consumer!(sqlite, SqliteConnection);
#[cfg(feature = "postgres")]
payment_consumer!(postgres, PgConnection);
#[cfg(feature = "mysql")]
payment_consumer!(mysql, MysqlConnection);

type Handler<C> = fn(&mut C, &Delivery) -> Result<Processed<i64>, AppError>;
type Balances<C> = fn(&mut C) -> QueryResult<Vec<(i64, i64)>>;

/// A tiny deterministic generator, so that every run tells the same story.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn simulate<C>(
    conn: &mut C,
    label: &str,
    messages: u64,
    handle: Handler<C>,
    balances: Balances<C>,
) -> Result<bool, Box<dyn std::error::Error>>
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    diesel_inbox::migrate(conn)?;
    conn.batch_execute(
        "CREATE TABLE IF NOT EXISTS quickstart_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
    )?;
    conn.batch_execute("DELETE FROM quickstart_accounts")?;
    let values: Vec<String> = (0..ACCOUNTS).map(|id| format!("({id}, 0)")).collect();
    conn.batch_execute(&format!(
        "INSERT INTO quickstart_accounts (id, balance) VALUES {}",
        values.join(", ")
    ))?;

    // Message ids of this run, so that a server database can be reused.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let mut expected = vec![0_i64; ACCOUNTS as usize];
    let mut queue: VecDeque<(u64, bool)> = (0..messages).map(|seq| (seq, false)).collect();
    let payment = |seq: u64| Payment {
        id: format!("pay-{run}-{seq}"),
        account: (seq % ACCOUNTS as u64) as i64,
        amount: (seq * 37 % 100 + 1) as i64,
    };
    for seq in 0..messages {
        let p = payment(seq);
        expected[p.account as usize] += p.amount;
    }

    let mut rng = Lcg(42);
    let (mut delivered, mut applied, mut duplicates, mut failed, mut crashes) = (0, 0, 0, 0, 0);
    while let Some((seq, redelivered)) = queue.pop_front() {
        delivered += 1;
        let delivery = Delivery {
            payment: payment(seq),
            seq,
            redelivered,
        };
        let acked = match handle(conn, &delivery) {
            Ok(Processed::Applied(_)) => {
                applied += 1;
                // Crash after commit, before the ack: the broker redelivers.
                if !redelivered && seq % 40 == 7 {
                    crashes += 1;
                    false
                } else {
                    true
                }
            }
            Ok(Processed::Duplicate) => {
                duplicates += 1;
                true
            }
            Err(AppError::Rejected(_)) => {
                failed += 1;
                false
            }
            Err(e) => return Err(e.into()),
        };
        if !acked {
            queue.push_back((seq, true));
        } else if !redelivered && seq % 3 == 0 {
            // The ack was lost: the broker redelivers later, somewhere in the queue.
            let at = rng.next() as usize % (queue.len() + 1);
            queue.insert(at, (seq, true));
        }
    }

    let actual = balances(conn)?;
    let exact = actual
        .iter()
        .all(|(id, balance)| expected[*id as usize] == *balance)
        && actual.len() == ACCOUNTS as usize;

    println!("diesel-inbox quickstart on {label}");
    println!("  {:<36}{:>8}", "messages published", messages);
    println!("  {:<36}{:>8}", "deliveries (with redeliveries)", delivered);
    println!("  {:<36}{:>8}", "applied", applied);
    println!("  {:<36}{:>8}", "duplicates skipped", duplicates);
    println!("  {:<36}{:>8}", "  of which crash after commit", crashes);
    println!("  {:<36}{:>8}", "failed, rolled back, redelivered", failed);
    println!(
        "  {:<36}{:>8}",
        "balances exact",
        if exact && applied == messages {
            "yes"
        } else {
            "NO"
        }
    );
    Ok(exact && applied == messages)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").unwrap_or_default();
    if !run_on(&url, MESSAGES)? {
        return Err("the business state does not match one application per message".into());
    }
    Ok(())
}

/// The simulation of `messages` payments on `url` (a PostgreSQL or MySQL
/// URL, an SQLite file, or "" for an in-memory SQLite database); whether
/// every balance came out exact. The benchmark's `--memory` runs it too.
pub fn run_on(url: &str, messages: u64) -> Result<bool, Box<dyn std::error::Error>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        return postgres::run(url, "PostgreSQL", messages);
        #[cfg(not(feature = "postgres"))]
        return Err("DATABASE_URL is a PostgreSQL URL: run with --features postgres".into());
    }
    if url.starts_with("mysql://") {
        #[cfg(feature = "mysql")]
        return mysql::run(url, "MySQL/MariaDB", messages);
        #[cfg(not(feature = "mysql"))]
        return Err("DATABASE_URL is a MySQL URL: run with --features mysql".into());
    }
    #[cfg(feature = "sqlite")]
    {
        let path = if url.is_empty() { ":memory:" } else { url };
        sqlite::run(path, &format!("SQLite ({path})"), messages)
    }
    #[cfg(not(feature = "sqlite"))]
    Err("no DATABASE_URL and the sqlite feature is off".into())
}
