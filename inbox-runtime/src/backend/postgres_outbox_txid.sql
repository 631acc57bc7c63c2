ALTER TABLE outbox_messages ADD COLUMN txid BIGINT;
ALTER TABLE outbox_messages ALTER COLUMN txid SET DEFAULT txid_current();
CREATE INDEX IF NOT EXISTS outbox_messages_txid ON outbox_messages (txid);
