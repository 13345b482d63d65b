#!/usr/bin/env bash
# The test command (README, .ci/run): build everything, including the decoder plugins the
# end-to-end tests load from next to the hrperf binary, then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --all-targets --locked
cargo test --workspace --locked
