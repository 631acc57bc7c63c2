-- A piece of the sync claim for benches/pgbench/pieces.sh (see there).
\set k random(1, 9000000000000000000)
BEGIN;
INSERT INTO inbox_messages (consumer, message_id) VALUES ('raw', 'k' || :k) ON CONFLICT (consumer, message_id) DO NOTHING;
INSERT INTO bench_orders (id, amount) VALUES ('raw' || :k, 1);
COMMIT;
