// The backend's steps are the runtime's: a user crate names `InboxBackend`
// in bounds and reads its `DDL`, but cannot call a step (a forget without
// the key checks, a claim outside the engine).
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel_inbox::InboxBackend;

fn claim_by_hand<B, C>(conn: &mut C)
where
    B: InboxBackend,
    C: diesel::connection::LoadConnection<Backend = B>,
{
    let _ = B::claim(conn, "billing", "m-1", None);
}

fn main() {
    let mut conn = <SqliteConnection as diesel::Connection>::establish(":memory:").unwrap();
    let _ddl: &str = <Sqlite as InboxBackend>::DDL;
    let _ = <Sqlite as InboxBackend>::forget(&mut conn, "billing", "m-1");
    claim_by_hand(&mut conn);
}
