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

diesel::table! {
    /// The transactional outbox (schema version 3): one row per message
    /// enqueued by [`outbox::enqueue`](crate::outbox::enqueue) and not yet
    /// published, or dead. A relay deletes a row once the broker has
    /// confirmed its message. Times are microseconds since the Unix epoch,
    /// by the database's clock. Schema version 5 added a column this
    /// declaration leaves out, so that loading whole rows works on tables
    /// of either version: `txid`, the enqueuing transaction's id on
    /// PostgreSQL (NULL elsewhere), with which the relay finds rows that
    /// commit late.
    ///
    /// ```
    /// use diesel::prelude::*;
    /// use diesel_inbox::outbox_messages;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = SqliteConnection::establish(":memory:")?;
    /// diesel_inbox::migrate(&mut conn)?;
    /// let dead: i64 = outbox_messages::table
    ///     .filter(outbox_messages::dead_at.is_not_null())
    ///     .count()
    ///     .get_result(&mut conn)?;
    /// assert_eq!(dead, 0);
    /// # Ok(())
    /// # }
    /// ```
    outbox_messages (seq) {
        /// Enqueue order: ascending within a key (see the guide's outbox
        /// chapter for concurrent transactions).
        seq -> BigInt,
        /// The message id the broker sees (AMQP `message_id`, NATS
        /// `Nats-Msg-Id`): a UUIDv7 unless the caller chose one. Unique.
        id -> Text,
        /// The routing key (RabbitMQ) or subject (NATS).
        destination -> Text,
        /// The ordering key: messages of one key are published one at a
        /// time, in `seq` order.
        ordering_key -> Nullable<Text>,
        /// The message body.
        payload -> Binary,
        /// The headers, encoded by the runtime.
        headers -> Nullable<Binary>,
        /// When it was enqueued.
        created_at -> BigInt,
        /// Not published before this time (a failed publish's backoff).
        available_at -> BigInt,
        /// Failed publishes so far (not counting broker outages).
        attempts -> Integer,
        /// The relay pass that holds it, while it is being published.
        locked_by -> Nullable<Text>,
        /// When that relay's hold ends.
        locked_until -> Nullable<BigInt>,
        /// The last failed publish's error.
        last_error -> Nullable<Text>,
        /// When it became dead (`max_attempts` failed publishes); `NULL`
        /// while pending.
        dead_at -> Nullable<BigInt>,
    }
}
