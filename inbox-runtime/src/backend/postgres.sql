CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer VARCHAR(255) NOT NULL,
    message_id VARCHAR(255) NOT NULL,
    received_at TIMESTAMP NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),
    fingerprint BYTEA,
    result BYTEA,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_messages_received_at ON inbox_messages (received_at);
COMMENT ON TABLE inbox_messages IS 'diesel-inbox schema 5';
