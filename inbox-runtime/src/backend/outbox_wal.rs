//! The WAL outbox's statements (PostgreSQL, `Internals::WAL`): an enqueue
//! that writes its message only to the write-ahead log, with
//! `pg_logical_emit_message` in the caller's transaction, and the relay's
//! reads of the replication slot that decodes them (`pgoutput`, with its
//! `messages` option: PostgreSQL 14 and later).
//!
//! The slot is one per database, named after the database's oid
//! (`diesel_inbox_outbox_<oid>`); the enqueue writes only while such a slot exists and
//! is not lost, so that no message is written where nothing decodes it.
// The relay's side runs only with `async`.
#![cfg_attr(not(feature = "async"), allow(dead_code))]

use super::stmt::{Bind, Stmt};
use super::Internals;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::{Error, QueryResult};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, Binary, Bool, HasSqlType, Nullable, Text, Untyped};
use diesel::QueryableByName;

/// The prefix of the WAL outbox's messages and of its slot's name; the
/// name of its (empty) publication, which `pgoutput` needs.
pub const PREFIX: &str = "diesel_inbox_outbox";

/// The slot of this database, where it exists and is not lost.
const SLOT_OF_THIS_DATABASE: &str = "SELECT slot_name FROM pg_replication_slots \
     WHERE database = current_database() AND plugin = 'pgoutput' \
     AND slot_type = 'logical' AND slot_name LIKE 'diesel\\_inbox\\_outbox\\_%' \
     AND wal_status IS DISTINCT FROM 'lost'";

/// Creates the slot (then the publication), where they do not exist; a
/// slot the server invalidated is an error that says so (its messages are
/// lost: it is not replaced silently). In
/// the simple query protocol, outside a transaction: creating a slot waits
/// for the transactions in progress to end.
pub const CREATE: &str = "DO $$ BEGIN \
     IF EXISTS (SELECT 1 FROM pg_replication_slots WHERE database = current_database() \
         AND slot_name LIKE 'diesel\\_inbox\\_outbox\\_%' AND wal_status = 'lost') THEN \
       RAISE EXCEPTION 'the WAL outbox slot of this database was invalidated by the server \
         (max_slot_wal_keep_size): the messages it held are lost; remove it \
         (diesel-inbox outbox wal remove) and create it again'; \
     END IF; \
     IF NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE database = current_database() \
         AND slot_name LIKE 'diesel\\_inbox\\_outbox\\_%') THEN \
       PERFORM pg_create_logical_replication_slot('diesel_inbox_outbox_' || \
         (SELECT oid FROM pg_database WHERE datname = current_database()), 'pgoutput'); \
     END IF; \
     IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'diesel_inbox_outbox') THEN \
       CREATE PUBLICATION diesel_inbox_outbox; \
     END IF; \
   END $$";

/// Drops this database's slot and the publication (what the WAL holds
/// for the slot and nothing decoded yet is lost).
pub const DROP: &str = "DO $$ DECLARE s text; BEGIN \
     FOR s IN SELECT slot_name FROM pg_replication_slots WHERE database = current_database() \
         AND slot_name LIKE 'diesel\\_inbox\\_outbox\\_%' LOOP \
       PERFORM pg_drop_replication_slot(s); \
     END LOOP; \
     DROP PUBLICATION IF EXISTS diesel_inbox_outbox; \
   END $$";

/// The WAL outbox's operations (the relay's; the enqueue is
/// [`WalEmit`]).
#[derive(Debug, Clone)]
#[doc(hidden)]
pub enum WalOp {
    /// This database's slot's name (none: no usable slot).
    Slot,
    /// This database's slots (lost ones too), each as one text:
    /// its name, whether it is active (1/0), the WAL it keeps and the WAL
    /// past its confirmed position (bytes, -1 when unknown), and whether
    /// the server invalidated it (1/0).
    SlotStatus,
    /// Takes the WAL relay's session lock, without waiting (one relay
    /// reads a slot at a time): `Count(1)` when taken.
    Lock,
    /// Where the WAL is flushed to (`Count`).
    Flushed,
    /// Of `keys`, those with a live row in the outbox table.
    LiveKeys { keys: Vec<String> },
    /// Writes a message into the outbox table (kept aside: its key has
    /// rows there, or its publish failed); `Count(1)` when the table now
    /// holds it (written now, or by an earlier pass over the same WAL),
    /// `Count(0)` when another message holds its id.
    Aside(AsideRow),
}

/// A message the WAL relay writes into the outbox table.
#[derive(Debug, Clone)]
#[doc(hidden)]
pub struct AsideRow {
    pub id: String,
    pub destination: String,
    pub key: Option<String>,
    pub payload: Vec<u8>,
    pub headers: Option<Vec<u8>>,
    /// Its commit's time (microseconds since 1970).
    pub created_at: i64,
    /// Due this many microseconds from now.
    pub delay: i64,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// Dead at once (its publish failed as often as the relay allows).
    pub dead: bool,
}

/// A text, or NULL.
#[derive(Debug, Clone, QueryableByName)]
#[doc(hidden)]
pub struct TextRow {
    #[diesel(sql_type = Nullable<Text>)]
    pub text: Option<String>,
}

/// A count.
#[derive(Debug, Clone, QueryableByName)]
#[doc(hidden)]
pub struct CountRow {
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// How a [`WalOp`] runs.
pub(crate) enum WalPlan {
    Texts(Stmt),
    Count(Stmt),
    /// A WAL operation where the backend has no WAL outbox.
    Refused,
}

/// The statements of a WAL operation on backend `B`, or its refusal where
/// the backend has no WAL outbox.
pub(crate) fn plan<B: Internals>(op: WalOp) -> WalPlan {
    if !B::WAL {
        return WalPlan::Refused;
    }
    match op {
        WalOp::Slot => WalPlan::Texts(
            Stmt::new()
                .sql("SELECT slot_name::text AS text FROM (")
                .sql(SLOT_OF_THIS_DATABASE)
                .sql(") s"),
        ),
        WalOp::SlotStatus => WalPlan::Texts(Stmt::new().sql(
            "SELECT slot_name || ' ' || CASE WHEN active THEN 1 ELSE 0 END \
             || ' ' || COALESCE((w.at - restart_lsn)::bigint, -1) \
             || ' ' || COALESCE((w.at - confirmed_flush_lsn)::bigint, -1) \
             || ' ' || CASE WHEN wal_status = 'lost' THEN 1 ELSE 0 END AS text \
             FROM pg_replication_slots, (SELECT CASE WHEN pg_is_in_recovery() \
             THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS at) w \
             WHERE database = current_database() \
             AND slot_name LIKE 'diesel\\_inbox\\_outbox\\_%' ORDER BY slot_name",
        )),
        WalOp::Lock => WalPlan::Count(
            Stmt::new()
                .sql("SELECT CASE WHEN pg_try_advisory_lock(")
                .sql(WAL_LOCK)
                .sql(") THEN 1 ELSE 0 END::bigint AS n"),
        ),
        WalOp::Flushed => WalPlan::Count(
            Stmt::new().sql("SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint AS n"),
        ),
        WalOp::LiveKeys { keys } => {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            WalPlan::Texts(
                Stmt::new()
                    .sql(
                        "SELECT DISTINCT ordering_key AS text FROM outbox_messages \
                         WHERE dead_at IS NULL AND ordering_key IN ",
                    )
                    .text_list(&keys),
            )
        }
        WalOp::Aside(row) => {
            let now = B::NOW_MICROS;
            WalPlan::Count(
                Stmt::new()
                    .sql(
                        "WITH kept AS (INSERT INTO outbox_messages (id, destination, ordering_key, \
                         payload, headers, created_at, available_at, attempts, last_error, dead_at) \
                         VALUES (",
                    )
                    .bind(Bind::Text(row.id.clone()))
                    .sql(", ")
                    .bind(Bind::Text(row.destination.clone()))
                    .sql(", ")
                    .bind(Bind::MaybeText(row.key.clone()))
                    .sql(", ")
                    .bind(Bind::Bytes(row.payload.clone()))
                    .sql(", ")
                    .bind(Bind::MaybeBytes(row.headers))
                    .sql(", ")
                    .bind(Bind::Big(row.created_at))
                    .sql(", ")
                    .sql(now)
                    .sql(" + ")
                    .bind(Bind::Big(row.delay))
                    .sql(", ")
                    .bind(Bind::Int(row.attempts))
                    .sql(", ")
                    .bind(Bind::MaybeText(row.last_error))
                    .sql(", CASE WHEN ")
                    .bind(Bind::Bool(row.dead))
                    .sql(" THEN ")
                    .sql(now)
                    .sql(
                        " END) ON CONFLICT (id) DO NOTHING RETURNING 1) \
                         SELECT (SELECT COUNT(*) FROM kept) + (SELECT COUNT(*) FROM outbox_messages \
                         WHERE id = ",
                    )
                    .bind(Bind::Text(row.id))
                    .sql(" AND destination = ")
                    .bind(Bind::Text(row.destination))
                    .sql(" AND ordering_key IS NOT DISTINCT FROM ")
                    .bind(Bind::MaybeText(row.key))
                    .sql(" AND payload = ")
                    .bind(Bind::Bytes(row.payload))
                    .sql(") AS n"),
            )
        }
    }
}

/// The statement that streams `slot` on a replication connection, from
/// its confirmed position: `pgoutput` with the outbox's messages (and no
/// table: the publication is empty).
pub(crate) fn start_replication(slot: &str) -> String {
    format!(
        "START_REPLICATION SLOT \"{}\" LOGICAL 0/0 (proto_version '1', \
         publication_names '{PREFIX}', messages 'true')",
        slot.replace('"', "\"\"")
    )
}

/// The WAL relay's session lock (its key: "diesel-inbox WAL" in hex).
const WAL_LOCK: &str = "7061592046750711";

/// The answer of a [`WalPlan`] that refused.
pub(crate) fn refused() -> Error {
    Error::QueryBuilderError(
        "the WAL outbox is PostgreSQL's (logical decoding): this database has none".into(),
    )
}

/// Reads a [`WalPlan::Count`]'s single row.
pub(crate) fn count(rows: &[CountRow]) -> QueryResult<usize> {
    match rows {
        [row] => Ok(row.n.max(0) as usize),
        _ => Err(Error::QueryBuilderError(
            "a WAL outbox statement returned other than one count".into(),
        )),
    }
}

/// The WAL outbox's enqueue (where [`Internals::WAL`]): writes the
/// message's record (encoded by the caller) to the WAL in the
/// caller's transaction, only if this database has a usable slot, and
/// wakes sleeping relays as the table's enqueue does. Its row's `text` is
/// the message's position, NULL when there is no slot (nothing written).
#[derive(Debug, Clone)]
pub(crate) struct WalEmit {
    pub(crate) record: Vec<u8>,
    pub(crate) notify: bool,
}

impl<B> QueryFragment<B> for WalEmit
where
    B: Internals + HasSqlType<Binary> + HasSqlType<Bool>,
    Vec<u8>: ToSql<Binary, B>,
    bool: ToSql<Bool, B>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, B>) -> QueryResult<()> {
        out.unsafe_to_cache_prepared();
        out.push_sql("SELECT CASE WHEN EXISTS (");
        out.push_sql(SLOT_OF_THIS_DATABASE);
        out.push_sql(") THEN pg_logical_emit_message(true, '");
        out.push_sql(PREFIX);
        out.push_sql("', ");
        out.push_bind_param::<Binary, Vec<u8>>(&self.record)?;
        out.push_sql(")::text END AS text");
        B::push_enqueue_notify(&mut out, &self.notify)
    }
}

impl QueryId for WalEmit {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for WalEmit {
    type SqlType = Untyped;
}

impl<Conn> diesel::RunQueryDsl<Conn> for WalEmit {}

/// The emit wrote its message when it returned its position (1); 0: no
/// usable slot, nothing written.
pub(crate) fn emitted(rows: &[TextRow]) -> QueryResult<usize> {
    match rows {
        [TextRow { text: Some(_) }] => Ok(1),
        [TextRow { text: None }] => Ok(0),
        _ => Err(Error::QueryBuilderError(
            "the WAL outbox's enqueue returned other than one row".into(),
        )),
    }
}
