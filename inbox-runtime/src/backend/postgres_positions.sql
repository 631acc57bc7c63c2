CREATE TABLE IF NOT EXISTS inbox_positions (
    consumer VARCHAR(255) NOT NULL,
    topic VARCHAR(255) NOT NULL,
    partition_id INTEGER NOT NULL,
    next_offset BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, topic, partition_id)
);
