use super::{InboxBackend, Sealed};
use crate::error::InboxError;
use crate::schema::inbox_messages::dsl::*;
use crate::transaction::in_transaction;
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection};
use diesel::prelude::*;
use diesel::sqlite::Sqlite;

impl Sealed for Sqlite {}

impl InboxBackend for Sqlite {
    const DDL: &'static str = super::ddl::SQLITE;
    // A deferred BEGIN that later writes fails at once with "database is
    // locked", whatever the busy timeout: take the write lock up front.
    const BEGIN: &'static str = "BEGIN IMMEDIATE";

    fn claim<C>(conn: &mut C, consumer_name: &str, key: &str) -> QueryResult<bool>
    where
        C: Connection<Backend = Self>,
    {
        diesel::insert_into(inbox_messages)
            .values((consumer.eq(consumer_name), message_id.eq(key)))
            .on_conflict((consumer, message_id))
            .do_nothing()
            .execute(conn)
            .map(|inserted| inserted == 1)
    }

    fn claim_batch<C>(conn: &mut C, consumer_name: &str, keys: &[&str]) -> QueryResult<Vec<String>>
    where
        C: LoadConnection<Backend = Self>,
    {
        claim_batch_by_lookup!(conn, consumer_name, keys)
    }

    fn migrate<C>(conn: &mut C) -> Result<(), InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        // The immediate transaction serializes concurrent runs.
        in_transaction(conn, |conn| conn.batch_execute(Self::DDL))
            .map_err(InboxError::MigrationFailed)
    }
}
