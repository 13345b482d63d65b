#!/usr/bin/env bash
# The main job, end to end on this machine: build hrperf, record a small CPU-bound
# workload with the perf source (1 ms counter time series per CPU), show the capture and
# its decoded records.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --locked
bin=target/release
out=${HRPERF_DEMO_OUT:-/tmp/hrperf-demo.data}
echo "== hrperf record (perf source, poll mode, 1 ms) of hrperf-burn 300ms"
"$bin/hrperf" record --source perf -e cpu-clock,task-clock,page-faults,context-switches \
    --poll-us 1000 -o "$out" -- "$bin/hrperf-burn" --ms 300 --touch-mb 16
echo
echo "== hrperf info"
"$bin/hrperf" info -i "$out"
echo
echo "== hrperf decode (first 15 records)"
"$bin/hrperf" decode -i "$out" | head -n 16
echo
echo "== hrperf decode --output jsonl (first 3)"
"$bin/hrperf" decode -i "$out" --output jsonl | head -n 3
