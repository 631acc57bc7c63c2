ALTER TABLE outbox_messages ADD COLUMN txid BIGINT;
