//! Return types, key types, generics, methods and the macro inside macro_rules.
#![deny(warnings)]

use diesel::connection::AnsiTransactionManager;
use diesel::prelude::*;
use diesel_inbox::{idempotent, InboxBackend, InboxError, Processed};

#[derive(Debug)]
pub enum AppError {
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

pub type AppResult<T> = Result<T, AppError>;

pub struct Msg {
    pub id: String,
    pub seq: u64,
    pub header: Header,
}
pub struct Header {
    pub trace: uuid_like::Id,
}
mod uuid_like {
    pub struct Id(pub i64);
}

#[idempotent(key = "msg.id")]
pub fn result_alias(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<usize> {
    diesel::sql_query("SELECT 1").execute(conn)
}

#[idempotent(key = "msg.seq", consumer = "custom")]
fn app_result(conn: &mut SqliteConnection, msg: &Msg) -> AppResult<u64> {
    let _ = conn;
    Ok(msg.seq)
}

#[idempotent(key = "msg.header.trace.0")]
fn nested_field(conn: &mut SqliteConnection, msg: &Msg) -> std::result::Result<(), AppError> {
    let _ = conn;
    Ok(())
}

#[idempotent(key = "msg.id.as_str()")]
fn method_call_key(conn: &mut SqliteConnection, msg: &Msg) -> Result<(), AppError> {
    if msg.id.is_empty() {
        return Err(AppError::Inbox(InboxError::MigrationInTransaction));
    }
    let _ = conn;
    Ok(())
}

#[idempotent(key = "format!(\"{}-{}\", tenant, msg.seq)")]
fn computed_key(conn: &mut SqliteConnection, tenant: &str, msg: &Msg) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(key = "id")]
fn generic_connection<C>(conn: &mut C, id: i64) -> QueryResult<i64>
where
    C: diesel::connection::LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    let _ = conn;
    Ok(id)
}

#[idempotent(key = "item.0", consumer = "generic-items")]
fn generic_item<T: Clone + std::fmt::Debug, K>(
    conn: &mut SqliteConnection,
    item: &(K, T),
) -> QueryResult<T>
where
    K: diesel_inbox::InboxKey,
{
    let _ = conn;
    Ok(item.1.clone())
}

#[idempotent(key = "r#type", consumer = "raw")]
fn r#match(conn: &mut SqliteConnection, r#type: u32) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(key = "msg.id", conn = "db")]
fn named_connection(db: &mut SqliteConnection, msg: &Msg, out: &Vec<u8>) -> QueryResult<usize> {
    let _ = db;
    Ok(out.len())
}

#[idempotent(key = "msg.id", crate = "::diesel_inbox")]
fn explicit_crate(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

use diesel_inbox as inbox;
#[idempotent(key = "msg.id", crate = "inbox")]
fn renamed_crate(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(key = "msg.id", retries = 0)]
fn moves_its_message(conn: &mut SqliteConnection, msg: Msg) -> QueryResult<String> {
    let _ = conn;
    Ok(msg.id)
}

struct Service {
    calls: u32,
}

impl Service {
    #[idempotent(key = "msg.id")]
    fn by_ref(&self, conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<u32> {
        let _ = conn;
        Ok(self.calls)
    }

    #[idempotent(key = "msg.id")]
    fn by_mut(&mut self, conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<u32> {
        let _ = conn;
        self.calls += 1;
        Ok(self.calls)
    }

    #[idempotent(key = "self.calls", consumer = "self-key")]
    fn key_from_self(&self, conn: &mut SqliteConnection) -> QueryResult<()> {
        let _ = conn;
        Ok(())
    }
}

#[idempotent(batch = "msgs", key = "|m| m.id.as_str()", consumer = "batch")]
fn batch_of_messages(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<usize> {
    let _ = conn;
    Ok(msgs.iter().map(|m| m.seq as usize).sum())
}

#[idempotent(
    batch = "msgs",
    key = "|m: &Msg| m.seq",
    consumer = "batch-vec",
    retries = 0
)]
fn batch_of_vec(conn: &mut SqliteConnection, msgs: &Vec<Msg>) -> AppResult<Vec<u64>> {
    let _ = conn;
    Ok(msgs.iter().map(|m| m.seq).collect())
}

#[idempotent(key = "id")]
fn destructured_key(conn: &mut SqliteConnection, (id, amount): (String, i64)) -> QueryResult<i64> {
    let _ = conn;
    Ok(amount)
}

#[idempotent(key = "id")]
fn struct_pattern_key(conn: &mut SqliteConnection, Order { id, .. }: &Order) -> QueryResult<()> {
    let _ = (conn, id);
    Ok(())
}

pub struct Order {
    pub id: String,
    pub total: i64,
}

#[idempotent(key = "id")]
fn u8_key(conn: &mut SqliteConnection, id: u8) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(key = "msg.id", consumer = "shared-scope", shared)]
fn shares_a_scope(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(key = "msg.id", consumer = "shared-scope", shared)]
fn shares_it_too(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

macro_rules! handler {
    ($name:ident, $conn:ty) => {
        #[idempotent(key = "msg.id")]
        fn $name(conn: &mut $conn, msg: &Msg) -> QueryResult<()> {
            let _ = conn;
            Ok(())
        }
    };
}
handler!(from_macro_rules, SqliteConnection);

pub fn main() -> Result<(), AppError> {
    let mut conn = SqliteConnection::establish(":memory:")
        .map_err(|e| AppError::Db(diesel::result::Error::QueryBuilderError(e.into())))?;
    diesel_inbox::migrate(&mut conn)?;
    let msg = Msg {
        id: "m-1".into(),
        seq: 1,
        header: Header {
            trace: uuid_like::Id(5),
        },
    };
    assert!(result_alias(&mut conn, &msg)?.is_applied());
    assert!(app_result(&mut conn, &msg)?.is_applied());
    assert!(nested_field(&mut conn, &msg)?.is_applied());
    assert!(method_call_key(&mut conn, &msg)?.is_applied());
    assert!(computed_key(&mut conn, "tenant", &msg)?.is_applied());
    assert!(generic_connection(&mut conn, 9)?.is_applied());
    assert!(generic_item(&mut conn, &(1_u32, "x"))?.is_applied());
    assert!(r#match(&mut conn, 3)?.is_applied());
    assert!(named_connection(&mut conn, &msg, &vec![1])?.is_applied());
    assert!(explicit_crate(&mut conn, &msg)?.is_applied());
    assert!(renamed_crate(&mut conn, &msg)?.is_applied());
    assert!(from_macro_rules(&mut conn, &msg)?.is_applied());
    let mut service = Service { calls: 0 };
    assert!(service.by_ref(&mut conn, &msg)?.is_applied());
    assert!(service.by_mut(&mut conn, &msg)?.is_applied());
    assert!(service.key_from_self(&mut conn)?.is_applied());
    let batch = vec![
        Msg {
            id: "b-1".into(),
            seq: 1,
            header: Header {
                trace: uuid_like::Id(1),
            },
        },
        Msg {
            id: "b-2".into(),
            seq: 2,
            header: Header {
                trace: uuid_like::Id(2),
            },
        },
    ];
    let out: diesel_inbox::Batch<usize> = batch_of_messages(&mut conn, &batch)?;
    assert_eq!(
        (out.value, out.applied, out.duplicates),
        (Some(3), vec![0, 1], 0)
    );
    assert_eq!(batch_of_vec(&mut conn, &batch)?.value, Some(vec![1, 2]));
    assert_eq!(batch_of_messages(&mut conn, &batch)?.duplicates, 2);
    assert_eq!(
        destructured_key(&mut conn, ("d-1".into(), 4))?,
        Processed::Applied(4)
    );
    let order = Order {
        id: "o-1".into(),
        total: 3,
    };
    assert!(struct_pattern_key(&mut conn, &order)?.is_applied() && order.total == 3);
    assert!(u8_key(&mut conn, 200)?.is_applied());
    assert!(shares_a_scope(&mut conn, &msg)?.is_applied());
    assert!(shares_it_too(&mut conn, &msg)?.is_duplicate());
    let moved = Msg {
        id: "m-2".into(),
        seq: 2,
        header: Header {
            trace: uuid_like::Id(6),
        },
    };
    assert_eq!(
        moves_its_message(&mut conn, moved)?,
        Processed::Applied("m-2".to_string())
    );
    Ok(())
}
