#!/usr/bin/env bash
# Writes the upgrade fixtures that crates/cli/tests/upgrade.rs opens with the
# current code: a store written by an OLDER build of rota, with tasks in
# every state, queues with messages (one leased, one dead-lettered) and
# schedules. One SQLite file per schema version
# (crates/store-sqlite/tests/fixtures/vN.db) and, when
# ROTA_FIXTURE_POSTGRES_URL is set, one PostgreSQL dump
# (crates/store-postgres/tests/fixtures/vN.sql, the schema named
# rota_fixture_schema, which the test replaces by its own).
#
# Usage, from the repository root, for the last commit of schema version N:
#   git worktree add /work/wt/old COMMIT
#   cp -a target /work/wt/old/target    # reuse the build
#   (cd /work/wt/old && CARGO_INCREMENTAL=0 cargo build -p rota --locked)
#   ROTA_FIXTURE_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
#     scripts/store-fixtures.sh /work/wt/old/target/debug/rota
#   git worktree remove --force /work/wt/old
# The commits where the schema version changed:
#   git log --format='%h %s' -- crates/store-sqlite/src/schema.rs
# A fixture, once committed, is never rewritten: it stands for the stores
# that version left behind.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rota_bin="$(realpath "${1:?usage: scripts/store-fixtures.sh OLD_ROTA_BINARY}")"
workflows="$PWD/crates/store-sqlite/tests/fixtures/workflows"
work="$(mktemp -d "${TMPDIR:-/tmp}/rota-fixtures.XXXXXX")"
serve_pid=""
cleanup() {
  if [ -n "$serve_pid" ]; then kill -KILL "$serve_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# The same scenario on one store URL.
scenario() {
  local store="$1"
  r() { "$rota_bin" --store "$store" "$@"; }
  step_state() {
    r status "$1" --json | python3 -c 'import json, sys; print(next(s["state"] for s in json.load(sys.stdin)["steps"] if s["name"] == sys.argv[1]))' "$2"
  }
  r migrate >/dev/null

  # A process with every role that the script SIGKILLs mid-step.
  RUST_LOG=info "$rota_bin" --store "$store" serve --workflows "$workflows" --instance-id fixture-old \
    --supervisor-interval 200ms --listen none >"$work/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 600); do
    grep -q 'rota serve started' "$work/serve.log" && break
    sleep 0.1
  done
  grep -q 'rota serve started' "$work/serve.log" || { cat "$work/serve.log"; exit 1; }

  # Processed (one with its status events in a response queue), Error.
  r submit quick --id done-1 --input '{"n": 1}' --wait >/dev/null 2>&1
  r submit quick --id done-2 --input '{"n": 2}' --reply-queue fixture.replies --wait >/dev/null 2>&1
  r submit broken --id failed-1 --wait >/dev/null 2>&1 || true
  # Processing, waiting for a signal.
  r submit approval --id waiting-1 --input '{"order": 7}' >/dev/null
  # Processing, its second step cut by the kill below.
  r submit chain --id cut-1 --input '{"n": 3}' >/dev/null
  for _ in $(seq 300); do
    [ "$(step_state cut-1 second)" = running ] && break
    sleep 0.1
  done
  [ "$(step_state waiting-1 approve)" = running ] || { echo "waiting-1 is not waiting"; r status waiting-1; exit 1; }
  [ "$(step_state cut-1 second)" = running ] || { echo "cut-1's second step is not running"; r status cut-1; exit 1; }
  kill -KILL "$serve_pid"
  wait "$serve_pid" 2>/dev/null || true
  serve_pid=""

  # Pending (nobody runs them), Cancelled.
  r submit quick --id pending-1 --input '{"n": 4}' >/dev/null
  r submit quick --id pending-2 --input '{"n": 5}' --delay 1s >/dev/null
  r submit quick --id cancelled-1 >/dev/null
  r cancel cancelled-1 >/dev/null

  # A queue: two ready messages (one with an ordering key, one with a reply
  # address), one leased by a consumer that never settles it, one dead letter.
  r queue send fixture.work --body '{"k": "ready-1"}' --id m-ready-1 --key order-7 >/dev/null
  r queue send fixture.work --body '{"k": "ready-2"}' --id m-ready-2 --reply-to fixture.answers --correlation-id c-2 >/dev/null
  r queue send fixture.work --body '{"k": "leased"}' --id m-leased >/dev/null
  r queue send fixture.work --body '{"k": "poison"}' --id m-poison >/dev/null
  local id token
  r queue receive fixture.work --max 4 --lease 30s --json \
    | python3 -c 'import json, sys; [print(m["id"], m["lease_token"]) for m in json.load(sys.stdin)]' >"$work/leases"
  [ "$(wc -l <"$work/leases")" = 4 ] || { echo "expected 4 leases:"; cat "$work/leases"; exit 1; }
  while read -r id token; do
    case "$id" in
      m-poison) r queue dead-letter fixture.work "$token" --reason "poison: cannot decode" >/dev/null ;;
      m-leased) ;; # its consumer is gone: the lease runs out
      *) r queue abandon fixture.work "$token" >/dev/null ;;
    esac
  done <"$work/leases"

  # A schedule from the API (the file declares `nightly`), paused.
  r schedules create hourly --workflow quick --cron "0 0 * * * *" --input '{"from": "hourly"}' --catch-up none >/dev/null
  r schedules pause hourly >/dev/null
}

# SQLite: the file alone, its WAL checkpointed into it by the last command.
scenario "sqlite://$work/store.db"
version="$(sqlite3 "$work/store.db" 'PRAGMA user_version')"
[ ! -e "$work/store.db-wal" ] || [ ! -s "$work/store.db-wal" ] || sqlite3 "$work/store.db" 'PRAGMA wal_checkpoint(TRUNCATE)' >/dev/null
sqlite3 "$work/store.db" 'PRAGMA integrity_check' | grep -qx ok
mkdir -p crates/store-sqlite/tests/fixtures
cp "$work/store.db" "crates/store-sqlite/tests/fixtures/v$version.db"
echo "wrote crates/store-sqlite/tests/fixtures/v$version.db ($(stat -c %s "$work/store.db") bytes)"

# PostgreSQL: a plain dump of one schema, as INSERTs (no COPY blocks) and
# without psql's meta-commands, so that the test can run it as one
# multi-statement string.
if [ -n "${ROTA_FIXTURE_POSTGRES_URL:-}" ]; then
  schema=rota_fixture_schema
  psql -q "$ROTA_FIXTURE_POSTGRES_URL" -c "DROP SCHEMA IF EXISTS $schema CASCADE"
  scenario "$ROTA_FIXTURE_POSTGRES_URL?schema=$schema"
  # Its own schema version: a migration may change one backend only.
  pg_version="$(psql -qtA "$ROTA_FIXTURE_POSTGRES_URL" -c "SELECT max(version) FROM $schema.migrations")"
  mkdir -p crates/store-postgres/tests/fixtures
  pg_dump --schema="$schema" --inserts --no-owner --no-privileges --no-comments "$ROTA_FIXTURE_POSTGRES_URL" \
    | grep -v -e '^SET transaction_timeout' -e '^\\restrict ' -e '^\\unrestrict ' >"crates/store-postgres/tests/fixtures/v$pg_version.sql"
  psql -q "$ROTA_FIXTURE_POSTGRES_URL" -c "DROP SCHEMA $schema CASCADE"
  echo "wrote crates/store-postgres/tests/fixtures/v$pg_version.sql"
fi
