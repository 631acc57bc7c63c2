// The broker glue takes any handler's outcome: `Processed<T>` and a
// `store_result` handler's `Stored<T>`.
use diesel::QueryResult;
use diesel_async::AsyncPgConnection;
use diesel_inbox::brokers::{Handled, Policy};
use diesel_inbox::{idempotent, Processed, Stored};

#[idempotent(key = "id")]
async fn plain(conn: &mut AsyncPgConnection, id: &str) -> QueryResult<u32> {
    let _ = conn;
    Ok(1)
}

#[idempotent(key = "id", store_result)]
async fn stored(conn: &mut AsyncPgConnection, id: &str) -> QueryResult<u32> {
    let _ = conn;
    Ok(2)
}

async fn consume(
    conn: &mut AsyncPgConnection,
    delivery: lapin::message::Delivery,
    message: async_nats::jetstream::Message,
) -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::new(|_: &diesel::result::Error| false);
    let a: Handled<Processed<u32>, _> =
        diesel_inbox::lapin::handle(delivery, &policy, async |id, _| plain(conn, id).await).await?;
    let b: Handled<Stored<u32>, _> =
        diesel_inbox::nats::handle(message, &policy, async |id, _| stored(conn, id).await).await?;
    let _ = (a, b);
    Ok(())
}

pub fn main() {
    let _ = consume;
}
