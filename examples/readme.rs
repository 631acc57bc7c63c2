use diesel::prelude::*;
use diesel_inbox::{idempotent, InboxError, Processed};

diesel::table! {
    orders (id) {
        id -> Text,
        total -> BigInt,
    }
}

/// The message a broker delivers (RabbitMQ, NATS, Kafka, SQS, ...).
struct OrderPlaced {
    id: String,
    total: i64,
}

#[derive(Debug)]
enum AppError {
    Db(diesel::result::Error),
    Inbox(InboxError),
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

#[idempotent(key = "msg.id")]
fn on_order_placed(conn: &mut SqliteConnection, msg: &OrderPlaced) -> Result<i64, AppError> {
    diesel::insert_into(orders::table)
        .values((orders::id.eq(&msg.id), orders::total.eq(msg.total)))
        .execute(conn)?;
    Ok(msg.total)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut conn = SqliteConnection::establish(":memory:")?;
    diesel::sql_query("CREATE TABLE orders (id TEXT PRIMARY KEY, total BIGINT NOT NULL)")
        .execute(&mut conn)?;
    // Creates the inbox table, or verifies it; safe at every start.
    diesel_inbox::migrate(&mut conn)?;

    let msg = OrderPlaced {
        id: "order-1".into(),
        total: 42,
    };
    // The broker delivers it twice. The handler now returns
    // Result<Processed<i64>, AppError>; acknowledge after it returns.
    for delivery in 1..=2 {
        match on_order_placed(&mut conn, &msg) {
            Ok(Processed::Applied(total)) => println!("delivery {delivery}: applied {total}, ack"),
            Ok(Processed::Duplicate) => println!("delivery {delivery}: duplicate, skipped, ack"),
            Err(AppError::Db(e)) => println!("delivery {delivery}: rolled back ({e}), nack"),
            Err(AppError::Inbox(e)) => println!("delivery {delivery}: refused ({e}), nack"),
        }
    }
    Ok(())
}
