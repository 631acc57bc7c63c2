// A sync connection given to an async operation: one error, which says
// what the operations take.
use diesel::PgConnection;

async fn migrate_it(conn: &mut PgConnection) {
    let _ = diesel_inbox::migrate_async(conn).await;
}

fn main() {
    let _ = migrate_it;
}
