-- A piece of the sync claim for benches/pgbench/pieces.sh (see there).
\set k random(1, 9000000000000000000)
\set g 7
BEGIN;
INSERT INTO inbox_messages (consumer, message_id) SELECT 'library', 'k' || :k WHERE CAST(CASE WHEN :g = 7 THEN '1' ELSE COALESCE(table_to_xml(to_regclass('diesel_inbox_refused'), false, false, '')::text, 'diesel-inbox: ' || 'x') END AS integer) = 1 ON CONFLICT (consumer, message_id) DO NOTHING RETURNING 'diesel-inbox claim'::text;
INSERT INTO bench_orders (id, amount) VALUES ('library' || :k, 1);
\startpipeline
SAVEPOINT diesel_inbox_guard;
COMMIT;
\endpipeline
