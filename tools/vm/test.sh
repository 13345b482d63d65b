#!/usr/bin/env bash
# The one VM entry point: setup -> kernel -> modules -> initramfs -> boot.
# Usage: test.sh [FILE[:GUEST_PATH]]...   extra files for the guest
# Default: hrperf-core.ko + fmt-delta.ko, fmt-pebs.ko, fmt-aggregate.ko, fmt-llc-stack.ko and the guest
# test (guest/guest.sh running guest/hrperf_test.c, built here against include/hrperf.h),
# then the userspace half: the hrperf CLI (record --source kmod, status, start/pause/poll-log/stop, decode),
# libhrperf.so with guest/hrperf_api_test.c, and python3 with userlib/python/hrperf.py.
# Env: HRPERF_VM_SELFTEST=1: only the toolchain self-test module (selftest/),
#      HRPERF_VM_GUEST_SCRIPT (default: guest/guest.sh, or selftest/guest.sh), VM_TIMEOUT,
#      HRPERF_VM_DISK=<img>: attach a fresh raw disk as the guest's /dev/vda to carry
#      data out (e.g. guest `tar -cf /dev/vda out/`, host `tar -xf <img>`).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
RUN=$CACHE/run
mkdir -p "$RUN"
if [[ -n ${HRPERF_VM_SELFTEST:-} ]]; then
    GUEST_SCRIPT=${HRPERF_VM_GUEST_SCRIPT:-$VM_DIR/selftest/guest.sh}
    MODULES=(tools/vm/selftest) GUEST_FILES=()
else
    GUEST_SCRIPT=${HRPERF_VM_GUEST_SCRIPT:-$VM_DIR/guest/guest.sh}
    MODULES=()   # build-modules.sh's default list: the core, then the formats
    # Static, so the guest needs no libraries; warnings are errors here too.
    gcc -O2 -fno-omit-frame-pointer -Wall -Wextra -Werror -static -I"$REPO/include" \
        -o "$RUN/hrperf_test" "$VM_DIR/guest/hrperf_test.c"
    GUEST_FILES=("$RUN/hrperf_test")
fi

# The userspace half (default test only): the hrperf CLI, every decoder plugin and
# libhrperf.so (C API), release builds stripped for the initramfs; the C API test
# program; python3 with the few stdlib modules the Python helper's test imports.
userspace_files() {
    local target=${CARGO_TARGET_DIR:-$REPO/target}/release bin=$RUN/bin f
    local plugins=(delta llc_stack aggregate pebs) p
    log "cargo: hrperf CLI, decoder plugins (${plugins[*]}), libhrperf.so (release)"
    (cd "$REPO" && cargo build --release -q -p hrperf-cli -p hrperf-decode-delta \
        -p hrperf-decode-llc-stack -p hrperf-decode-aggregate -p hrperf-decode-pebs -p hrperf-capi) >&2
    mkdir -p "$bin"
    local files=(hrperf hrperf-burn libhrperf.so)
    for p in "${plugins[@]}"; do files+=("libhrperf_decode_$p.so"); done
    for f in "${files[@]}"; do
        strip -o "$bin/$f" "$target/$f"
    done
    gcc -O2 -Wall -Wextra -Werror -I"$REPO/include" -o "$bin/hrperf_api_test" \
        "$VM_DIR/guest/hrperf_api_test.c" -L"$bin" -lhrperf
    # libhrperf.so first: initramfs.sh then skips it among the test program's ldd deps.
    USER_FILES=("$bin/libhrperf.so:/usr/lib/libhrperf.so" "$bin/hrperf:/usr/bin/hrperf"
        "$bin/hrperf-burn:/usr/bin/hrperf-burn"
        "$bin/libhrperf_decode_delta.so:/usr/bin/libhrperf_decode_delta.so"
        "$bin/libhrperf_decode_llc_stack.so:/usr/bin/libhrperf_decode_llc_stack.so"
        "$bin/libhrperf_decode_aggregate.so:/usr/bin/libhrperf_decode_aggregate.so"
        "$bin/libhrperf_decode_pebs.so:/usr/bin/libhrperf_decode_pebs.so"
        "$bin/hrperf_api_test:/usr/bin/hrperf_api_test"
        "$REPO/userlib/python/hrperf.py:/py/hrperf.py"
        "$VM_DIR/guest/hrperf_py_test.py:/py/hrperf_py_test.py" "$VM_DIR/guest/cli.sh:/cli.sh")
    local py; py=$(readlink -f /usr/bin/python3) || die "python3 not found (setup.sh installs it)"
    USER_FILES+=("$py:/usr/bin/python3")
    # What the helper's test imports, collected by running the same interpreter with the
    # guest's (empty) environment: sources and their cached bytecode, stdlib only.
    while read -r f; do USER_FILES+=("$f:$f"); done < <(env -i PATH=/usr/bin:/bin "$py" - "$REPO/userlib/python" <<'PY'
import sys, os, importlib.util
sys.path.insert(0, sys.argv[1])
import hrperf, mmap, errno, ctypes, contextlib  # noqa: F401 (what hrperf_py_test.py uses)
lib = os.path.dirname(os.__file__)
files = set()
for m in list(sys.modules.values()):
    f = getattr(m, "__file__", None)
    if f and f.startswith(lib + "/"):
        files.add(f)
        if f.endswith(".py") and os.path.exists(importlib.util.cache_from_source(f)):
            files.add(importlib.util.cache_from_source(f))
print("\n".join(sorted(files)))
PY
    )
}
USER_FILES=()

t=$SECONDS; times=()
lap() { times+=("$1 $((SECONDS - t))s"); t=$SECONDS; }

"$VM_DIR/setup.sh";                                     lap setup
KDIR=$("$VM_DIR/build-kernel.sh" | tail -n1); export KDIR; lap kernel
kos=$("$VM_DIR/build-modules.sh" "${MODULES[@]}");     lap modules
mapfile -t KOS <<<"$kos"
[[ -n ${HRPERF_VM_SELFTEST:-} ]] || userspace_files;    lap userspace
LD_LIBRARY_PATH=$RUN/bin "$VM_DIR/initramfs.sh" "$RUN/initramfs.cpio.gz" "$GUEST_SCRIPT" \
    "${KOS[@]}" "${GUEST_FILES[@]}" "${USER_FILES[@]}" "$@"; lap initramfs
qemu_args=()
if [[ -n ${HRPERF_VM_DISK:-} ]]; then
    rm -f "$HRPERF_VM_DISK"; truncate -s 64M "$HRPERF_VM_DISK"
    qemu_args=(-drive "file=$HRPERF_VM_DISK,format=raw,if=virtio")
fi
status=0
"$VM_DIR/run-qemu.sh" "$KDIR/arch/x86/boot/bzImage" "$RUN/initramfs.cpio.gz" \
    "$RUN/serial.log" "${qemu_args[@]}" || status=$?;  lap boot
log "timings: ${times[*]}"
exit "$status"
