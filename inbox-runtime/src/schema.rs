//! The inbox table.

diesel::table! {
    /// One row per message a consumer has applied.
    ///
    /// The primary key `(consumer, message_id)` is what turns a redelivery
    /// into a duplicate: the claim insert of a second delivery finds the row.
    /// `received_at` is the UTC time of the claim, filled in by the database.
    /// `fingerprint` and `result` (schema version 2) are `NULL` unless the
    /// handler asked for them.
    ///
    /// On MySQL/MariaDB `consumer` and `message_id` are `VARBINARY(255)` so
    /// that keys compare byte for byte; diesel binds them as text either way.
    ///
    /// ```
    /// use diesel::prelude::*;
    /// use diesel_inbox::inbox_messages;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = SqliteConnection::establish(":memory:")?;
    /// diesel_inbox::migrate(&mut conn)?;
    /// let applied: i64 = inbox_messages::table
    ///     .filter(inbox_messages::consumer.eq("billing"))
    ///     .count()
    ///     .get_result(&mut conn)?;
    /// assert_eq!(applied, 0);
    /// # Ok(())
    /// # }
    /// ```
    inbox_messages (consumer, message_id) {
        /// The consumer (handler) that applied the message: the scope of deduplication.
        consumer -> Text,
        /// The message's key, as given by `InboxKey`.
        message_id -> Text,
        /// When the message was claimed (UTC).
        received_at -> Timestamp,
        /// The content's [`Fingerprint`](crate::Fingerprint) (format byte
        /// and SHA-256), written by a handler with `fingerprint = "..."`;
        /// `NULL` otherwise (schema version 2).
        fingerprint -> Nullable<Binary>,
        /// The value the body returned, as JSON, written by a handler with
        /// `store_result`; `NULL` otherwise (schema version 2). The SQL
        /// column is `result`.
        #[sql_name = "result"]
        stored_result -> Nullable<Binary>,
    }
}

diesel::table! {
    /// The failure counts of handlers with `max_attempts` (schema version
    /// 2): one row per key whose deliveries failed, written in a short
    /// transaction of its own after each failure, deleted by the first
    /// success (in the success's transaction) and by `forget`.
    inbox_attempts (consumer, message_id) {
        /// The consumer (dedup scope).
        consumer -> Text,
        /// The message's key.
        message_id -> Text,
        /// Failed deliveries so far (body errors and panics).
        failures -> Integer,
        /// The last failure's error, cut to 1,000 bytes.
        last_error -> Text,
        /// When the last failure was counted (UTC).
        updated_at -> Timestamp,
    }
}
