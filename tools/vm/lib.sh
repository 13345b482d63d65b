# shellcheck shell=bash disable=SC2034
# Sourced by the tools/vm scripts: shared paths and helpers.
# Caches live outside the checkout so a fresh clone reuses a kernel built earlier.
CACHE=${HRPERF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hrperf}
VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$VM_DIR/../.." && pwd)
mkdir -p "$CACHE"

# Progress goes to stderr so scripts can print their result alone on stdout.
log() { echo "[vm] $*" >&2; }
die() { echo "[vm] ERROR: $*" >&2; exit 1; }

# Loads KMAKE_ARGS etc. written by setup.sh.
load_env() {
    [[ -f $CACHE/env.sh ]] || die "$CACHE/env.sh missing: run tools/vm/setup.sh first"
    # shellcheck source=/dev/null
    . "$CACHE/env.sh"
    read -r -a KMAKE <<<"$KMAKE_ARGS"   # the tool paths contain no spaces
}
