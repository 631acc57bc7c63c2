CREATE TABLE IF NOT EXISTS outbox_messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id VARCHAR(255) NOT NULL UNIQUE,
    destination VARCHAR(255) NOT NULL,
    ordering_key VARCHAR(255),
    payload BLOB NOT NULL,
    headers BLOB,
    created_at BIGINT NOT NULL,
    available_at BIGINT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    locked_by VARCHAR(64),
    locked_until BIGINT,
    last_error TEXT,
    dead_at BIGINT,
    txid BIGINT
);
CREATE INDEX IF NOT EXISTS outbox_messages_key ON outbox_messages (ordering_key, seq);
