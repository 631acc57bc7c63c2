CREATE TABLE IF NOT EXISTS inbox_attempts (
    consumer VARBINARY(255) NOT NULL,
    message_id VARBINARY(255) NOT NULL,
    failures INT NOT NULL,
    last_error TEXT CHARACTER SET utf8mb4 NOT NULL,
    updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (consumer, message_id)
) ENGINE = InnoDB;
