CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer VARBINARY(255) NOT NULL,
    message_id VARBINARY(255) NOT NULL,
    received_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    fingerprint VARBINARY(64) NULL,
    result LONGBLOB NULL,
    PRIMARY KEY (consumer, message_id),
    INDEX inbox_messages_received_at (received_at)
) ENGINE = InnoDB COMMENT = 'diesel-inbox schema 5';
