CREATE TABLE IF NOT EXISTS outbox_messages (
    seq BIGINT NOT NULL AUTO_INCREMENT,
    id VARBINARY(255) NOT NULL,
    destination VARBINARY(255) NOT NULL,
    ordering_key VARBINARY(255) NULL,
    payload LONGBLOB NOT NULL,
    headers LONGBLOB NULL,
    created_at BIGINT NOT NULL,
    available_at BIGINT NOT NULL,
    attempts INT NOT NULL DEFAULT 0,
    locked_by VARBINARY(64) NULL,
    locked_until BIGINT NULL,
    last_error TEXT CHARACTER SET utf8mb4 NULL,
    dead_at BIGINT NULL,
    txid BIGINT NULL,
    PRIMARY KEY (seq),
    UNIQUE KEY outbox_messages_id (id),
    INDEX outbox_messages_key (ordering_key, seq)
) ENGINE = InnoDB;
