use super::{InboxBackend, Sealed};
use crate::error::InboxError;
use crate::schema::inbox_messages::dsl::*;
use crate::transaction::begin;
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection, TransactionManager};
use diesel::mysql::Mysql;
use diesel::prelude::*;

impl Sealed for Mysql {}

impl InboxBackend for Mysql {
    const DDL: &'static str = super::ddl::MYSQL;
    const BEGIN: &'static str = "BEGIN";

    fn claim<C>(conn: &mut C, consumer_name: &str, key: &str) -> QueryResult<bool>
    where
        C: Connection<Backend = Self>,
    {
        // Not `ON DUPLICATE KEY UPDATE`: diesel connects with
        // CLIENT_FOUND_ROWS, so that form reports 1 for a duplicate too.
        // INSERT IGNORE would truncate an over-long key, which the runtime
        // has refused before we get here.
        diesel::insert_or_ignore_into(inbox_messages)
            .values((consumer.eq(consumer_name), message_id.eq(key)))
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
        // DDL commits implicitly: refuse inside the caller's transaction
        // rather than commit it behind their back.
        match begin(conn).map_err(|(_, e)| e)? {
            crate::transaction::Scope::TopLevel => {
                AnsiTransactionManager::rollback_transaction(conn)?;
            }
            crate::transaction::Scope::Savepoint => {
                AnsiTransactionManager::rollback_transaction(conn)?;
                return Err(InboxError::MigrationInTransaction);
            }
        }
        conn.batch_execute("DO GET_LOCK('diesel_inbox_migrate', 60)")?;
        let created = conn.batch_execute(Self::DDL);
        let released = conn.batch_execute("DO RELEASE_LOCK('diesel_inbox_migrate')");
        created.map_err(InboxError::MigrationFailed)?;
        released?;
        Ok(())
    }
}
