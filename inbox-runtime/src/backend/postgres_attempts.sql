CREATE TABLE IF NOT EXISTS inbox_attempts (
    consumer VARCHAR(255) NOT NULL,
    message_id VARCHAR(255) NOT NULL,
    failures INTEGER NOT NULL,
    last_error TEXT NOT NULL,
    updated_at TIMESTAMP NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),
    PRIMARY KEY (consumer, message_id)
);
