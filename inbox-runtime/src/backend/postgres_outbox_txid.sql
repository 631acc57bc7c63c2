ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS txid BIGINT;
ALTER TABLE outbox_messages ALTER COLUMN txid SET DEFAULT txid_current();
CREATE INDEX IF NOT EXISTS outbox_messages_txid ON outbox_messages (txid);
