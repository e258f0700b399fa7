#!/usr/bin/env bash
# Runs the "how cost grows with the work" scenarios of `rota bench` (see
# docs/performance.md) at their points, one process per point, and writes
# each point's JSON record to OUT/<backend>/<scenario>-<point>.json, where
# scripts/plot-bench.py reads them.
#
#   scripts/bench-growth.sh --store sqlite|postgres [--out DIR] [--quick]
#                           [--backlog-max N] [--only "pending future ..."]
#
# --store postgres takes the database from PEERS_PG_URL. --quick runs small
# points (a smoke test of the script, not figures). --backlog-max caps the
# backlog scenarios' largest point. The binary is target/release/rota
# (ROTA_BIN overrides it): build it first with
#   CARGO_INCREMENTAL=0 cargo build --release -p rota --locked
set -euo pipefail

store=sqlite
out=bench-growth
quick=0
backlog_max=1000000
only="pending future paused delayed queues steps input lanes"
while [ $# -gt 0 ]; do
    case "$1" in
        --store) store="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --quick) quick=1; shift ;;
        --backlog-max) backlog_max="$2"; shift 2 ;;
        --only) only="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "bench-growth.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$store" in
    sqlite) backend=sqlite ;;
    postgres)
        backend=postgres
        [ -n "${PEERS_PG_URL:-}" ] || { echo "bench-growth.sh: --store postgres needs PEERS_PG_URL" >&2; exit 2; }
        ;;
    *) echo "bench-growth.sh: --store must be sqlite or postgres, got $store" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${ROTA_BIN:-$root/target/release/rota}
[ -x "$bin" ] || { echo "bench-growth.sh: $bin is missing: build it with cargo build --release -p rota" >&2; exit 2; }
dir=$out/$backend
mkdir -p "$dir"

if [ "$quick" = 1 ]; then
    backlogs="0 1000 5000"
    paused_backlogs="0 1000 5000"
    pendings="500 2000"
    queue_counts="1 10"
    step_counts="1 3 10"
    input_sizes="0 1024 65536"
    lane_counts="1 10 100"
    export PEERS_N=${PEERS_N:-2000} PEERS_TRICKLE_N=${PEERS_TRICKLE_N:-100}
    m_default=200
else
    backlogs="0 10000 100000 1000000"
    paused_backlogs=$backlogs
    pendings="2000 10000 100000 1000000"
    queue_counts="1 10 100 1000"
    step_counts="1 3 10 30 100"
    input_sizes="0 1024 16384 65536 262144"
    lane_counts="1 10 100 1000 10000"
    m_default=2000
fi
capped() { for n in "$@"; do [ "$n" -le "$backlog_max" ] && echo "$n"; done; true; }

# One point: SCENARIO POINT [ENV=VALUE…] -- ROTA BENCH ARGS…
point() {
    local scenario=$1 x=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local record=$dir/$scenario-$x.json
    echo "== $backend $scenario $x: rota bench $* ${envs[*]}" >&2
    local workdir
    workdir=$(mktemp -d "${TMPDIR:-/tmp}/rota-growth.XXXXXX")
    if env PEERS_WORKDIR="$workdir" PEERS_OUT="$record.tmp" PEERS_W_LONE="${PEERS_W_LONE:-20}" "${envs[@]}" \
        "$bin" bench --store "$store" "$@" > "$dir/$scenario-$x.log" 2>&1; then
        # The scenario and its grown quantity, for the plots.
        python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r["growth"]={"scenario":sys.argv[2],"x":int(sys.argv[3])}; json.dump(r,open(sys.argv[4],"w"),indent=1)' \
            "$record.tmp" "$scenario" "$x" "$record"
        rm -f "$record.tmp"
    else
        echo "   failed: see $dir/$scenario-$x.log" >&2
    fi
    rm -rf "$workdir"
}

for scenario in $only; do
    case "$scenario" in
        pending) for n in $(capped $pendings); do point pending "$n" PEERS_M=$m_default -- W --backlog-kind pending --backlog "$n"; done ;;
        future) for n in $(capped $backlogs); do point future "$n" PEERS_M=$m_default -- W --backlog-kind future --backlog "$n"; done ;;
        paused) for n in $(capped $paused_backlogs); do point paused "$n" PEERS_M=$m_default -- W --backlog-kind paused --backlog "$n"; done ;;
        delayed) for n in $(capped $backlogs); do point delayed "$n" -- Q --backlog-kind delayed --backlog "$n"; done ;;
        queues) for q in $queue_counts; do point queues "$q" -- Q --queues "$q"; done ;;
        steps)
            for s in $step_counts; do
                # About the same number of steps at every point.
                m=$(( m_default * 3 / s )); [ "$m" -ge 100 ] || m=100
                point steps "$s" PEERS_M=$m -- W --steps "$s"
            done ;;
        input) for b in $input_sizes; do point input "$b" PEERS_M=$m_default -- W --input-bytes "$b"; done ;;
        lanes)
            for k in $lane_counts; do
                # Enough workflows that every lane runs several.
                m=$(( k * 2 )); [ "$m" -ge "$m_default" ] || m=$m_default
                [ "$k" -gt 1 ] || m=$(( m_default / 4 ))
                point lanes "$k" PEERS_K=$k PEERS_M=$m -- W
            done ;;
        *) echo "bench-growth.sh: unknown scenario $scenario" >&2; exit 2 ;;
    esac
done
echo "records in $dir" >&2
