CREATE TABLE IF NOT EXISTS inbox_positions (
    consumer VARBINARY(255) NOT NULL,
    topic VARBINARY(255) NOT NULL,
    partition_id INT NOT NULL,
    next_offset BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, topic, partition_id)
) ENGINE = InnoDB;
