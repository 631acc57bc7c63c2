// The backend's steps and the async connection's are the runtime's: a user
// crate can name `InboxBackend` and `AsyncInboxConnection` in bounds but
// cannot call a step.
use diesel::pg::{Pg, PgConnection};
use diesel_async::AsyncPgConnection;
use diesel_inbox::{AsyncInboxConnection, InboxBackend};

async fn forget_by_hand<C: AsyncInboxConnection>(conn: &mut C) {
    let _ = conn.inbox_forget("billing", "m-1").await;
}

fn main() {
    let mut conn = <PgConnection as diesel::Connection>::establish("postgres://").unwrap();
    let _ = <Pg as InboxBackend>::forget(&mut conn, "billing", "m-1");
    let _ = forget_by_hand::<AsyncPgConnection>;
}
