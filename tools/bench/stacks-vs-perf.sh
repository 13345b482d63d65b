#!/usr/bin/env bash
# Stack profiles of one perf.data: perf's text pipeline against hrperf's import + report.
#
#   perf script -i X | stackcollapse (inferno-collapse-perf if installed, else awk)
#   hrperf import X -o X.data && hrperf report X.data --folded
#   hrperf report X.data --folded              (the report alone, on the imported capture)
#
# The perf.data is a real run with callchains: `perf record -e cpu-clock -g -F 999` of
# tests/workloads/stackburn.c for SECONDS (default 5). Prints stacks/s for each and the
# ratios (goal: hrperf >= 20x the perf script pipeline). Needs cc and perf; builds
# hrperf in release mode if target/release/hrperf is missing.
#
# Usage: tools/bench/stacks-vs-perf.sh [SECONDS] [FREQ]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
freq=${2:-999}
command -v perf >/dev/null || { echo "stacks-vs-perf: perf is not installed (apt-get install linux-perf)"; exit 1; }
command -v cc >/dev/null || { echo "stacks-vs-perf: no C compiler (cc)"; exit 1; }
hrperf=target/release/hrperf
[ -x "$hrperf" ] || cargo build --release -p hrperf-cli --quiet
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O1 -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls \
    -o "$tmp/stackburn" tests/workloads/stackburn.c
perf record -q -e cpu-clock -g -F "$freq" -o "$tmp/X.perf.data" -- "$tmp/stackburn" "$secs" 2>/dev/null
# Warm the page cache and perf's symbol caches so no side pays for the first read.
perf script -i "$tmp/X.perf.data" >/dev/null 2>&1

if command -v inferno-collapse-perf >/dev/null; then
    collapse="inferno-collapse-perf"
    collapse_cmd() { inferno-collapse-perf; }
else
    collapse="awk (stackcollapse-perf equivalent)"
    # perf script's default output: a header line per sample, then one frame per line
    # ("\t addr sym+off (dso)"), then a blank line. Fold leaf-last, ';'-joined, counted.
    collapse_cmd() {
        awk '
            /^[^ \t]/ { comm = $1; n = 0; next }
            /^[ \t]+[0-9a-f]+ / { sym = $2; sub(/\+0x[0-9a-f]+$/, "", sym); f[++n] = sym; next }
            /^$/ { if (n) { s = comm; for (i = n; i >= 1; i--) s = s ";" f[i]; c[s]++ } n = 0 }
            END { if (n) { s = comm; for (i = n; i >= 1; i--) s = s ";" f[i]; c[s]++ }
                  for (k in c) print k, c[k] }'
    }
fi

now() { date +%s.%N; }
t0=$(now)
perf script -i "$tmp/X.perf.data" 2>/dev/null | collapse_cmd > "$tmp/perf.folded"
t1=$(now)
"$hrperf" import -q "$tmp/X.perf.data" -o "$tmp/X.data" 2>"$tmp/import.log"
"$hrperf" report "$tmp/X.data" --folded > "$tmp/hrperf.folded"
t2=$(now)
"$hrperf" report "$tmp/X.data" --folded > /dev/null
t3=$(now)

stacks=$(grep -o '[0-9]* samples' "$tmp/import.log" | head -1 | cut -d' ' -f1)
awk -v n="$stacks" -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v col="$collapse" \
    -v pf="$(wc -l < "$tmp/perf.folded")" -v hf="$(wc -l < "$tmp/hrperf.folded")" 'BEGIN {
    p = b - a; h = c - b; r = d - c
    printf "perf.data: %d stacks (stackburn, cpu-clock -g); folded lines: perf %d, hrperf %d\n", n, pf, hf
    printf "%-48s %8.3f s %12.0f stacks/s\n", "perf script | " col, p, n / p
    printf "%-48s %8.3f s %12.0f stacks/s  (%.1fx)\n", "hrperf import + hrperf report --folded", h, n / h, p / h
    printf "%-48s %8.3f s %12.0f stacks/s  (%.1fx)\n", "hrperf report --folded (imported capture)", r, n / r, p / r
}'
