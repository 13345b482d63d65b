#!/usr/bin/env bash
# The test command (README, .ci/run): build everything, including the decoder plugins the
# end-to-end tests load from next to the hrperf binary, then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# DuckDB (PyPI) lets the CSV test check read_csv_auto for real; without it that check
# is skipped with a printed reason.
python3 -c 'import duckdb' 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore duckdb ||
    echo "tools/test.sh: duckdb not installable; the DuckDB CSV check will be skipped"
# perf (Debian's linux-perf) lets the stack comparison test (tools/hrperf/tests/stacks_perf.rs)
# check hrperf's profiles against perf report; without it that test is skipped with a reason.
if ! command -v perf >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf; } >/dev/null 2>&1 ||
        echo "tools/test.sh: linux-perf not installable; the perf comparison test will be skipped"
fi
cargo build --workspace --all-targets --locked
cargo test --workspace --locked
