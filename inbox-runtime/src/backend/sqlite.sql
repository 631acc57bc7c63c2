CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer VARCHAR(255) NOT NULL,
    message_id VARCHAR(255) NOT NULL,
    received_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    fingerprint BLOB,
    result BLOB,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_messages_received_at ON inbox_messages (received_at);
CREATE VIEW IF NOT EXISTS inbox_schema_version AS SELECT 5 AS version;
