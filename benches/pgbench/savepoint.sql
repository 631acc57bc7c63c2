-- A piece of the sync claim for benches/pgbench/pieces.sh (see there).
\set k random(1, 9000000000000000000)
BEGIN;
INSERT INTO inbox_messages (consumer, message_id) VALUES ('savepoint', 'k' || :k) ON CONFLICT (consumer, message_id) DO NOTHING;
INSERT INTO bench_orders (id, amount) VALUES ('savepoint' || :k, 1);
\startpipeline
SAVEPOINT diesel_inbox_guard;
COMMIT;
\endpipeline
