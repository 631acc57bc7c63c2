    PRIMARY KEY (seq),
    UNIQUE KEY outbox_messages_id (id),
    INDEX outbox_messages_key (ordering_key, seq)
) ENGINE = InnoDB;
