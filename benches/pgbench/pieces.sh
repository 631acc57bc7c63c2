#!/usr/bin/env bash
# The server's cost of each piece of the sync PostgreSQL claim, measured
# with pgbench (4 clients, prepared statements, interleaved rounds), apart
# from the library's Rust code:
#   raw        BEGIN; INSERT .. ON CONFLICT DO NOTHING; the business row; COMMIT
#              (the benchmark's hand-written `raw_sql`)
#   guarded    raw with the library's claim: INSERT .. SELECT .. WHERE
#              <proxy guard> .. RETURNING '<marker>'
#   savepoint  raw with the library's commit: SAVEPOINT and COMMIT in one
#              round trip (a pipeline)
#   library    both, as a sync `#[idempotent]` call sends them
# The guard compares an integer parameter where the library's compares a
# text one. Prints each round's transactions per second, then each piece's
# ratio to raw per round and its median.
#   bash benches/pgbench/pieces.sh [rounds] [seconds per variant]
# As a role that may create databases, or as root (through the postgres
# user): PGBENCH_AS=postgres by default when root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rounds=${1:-5} secs=${2:-10}
db=diesel_inbox_pieces
pgbench=$(ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | tail -n1)
pgbench=${pgbench:-pgbench}
as=()
[ "$(id -u)" -eq 0 ] && as=(runuser -u "${PGBENCH_AS:-postgres}" --)
"${as[@]}" psql -qX -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null 2>&1
cat "$here/../../inbox-runtime/src/backend/postgres.sql" \
  "$here/../../inbox-runtime/src/backend/postgres_refuse.sql" \
  <(echo "CREATE TABLE bench_orders (id VARCHAR(255) NOT NULL PRIMARY KEY, amount BIGINT NOT NULL);") \
  | "${as[@]}" psql -qX -v ON_ERROR_STOP=1 "$db" >/dev/null
out=$(mktemp)
for round in $(seq 1 "$rounds"); do
  for variant in raw guarded savepoint library; do
    tps=$("${as[@]}" "$pgbench" -n -M prepared -c 4 -j 2 -T "$secs" -f "$here/$variant.sql" "$db" 2>&1 \
      | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    echo "$round $variant $tps" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import statistics, sys
tps = {}
for line in open(sys.argv[1]):
    r, v, t = line.split()
    tps.setdefault(r, {})[v] = float(t)
for v in ["guarded", "savepoint", "library"]:
    ratios = [tps[r][v] / tps[r]["raw"] for r in tps]
    print(f"{v}/raw: " + ", ".join(f"{x:.3f}" for x in ratios) + f"; median {statistics.median(ratios):.3f}")
PY
rm -f "$out"
"${as[@]}" psql -qX -c "DROP DATABASE $db" >/dev/null
