#!/usr/bin/env bash
# The one VM entry point: setup -> kernel -> modules -> initramfs -> boot.
# Usage: test.sh [FILE[:GUEST_PATH]]...   extra files for the guest
# Default: hrperf-core.ko + fmt-delta.ko and the guest test (guest/guest.sh running
# guest/hrperf_test.c, built here against include/hrperf.h).
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
    gcc -O2 -Wall -Wextra -Werror -static -I"$REPO/include" \
        -o "$RUN/hrperf_test" "$VM_DIR/guest/hrperf_test.c"
    GUEST_FILES=("$RUN/hrperf_test")
fi

t=$SECONDS; times=()
lap() { times+=("$1 $((SECONDS - t))s"); t=$SECONDS; }

"$VM_DIR/setup.sh";                                     lap setup
KDIR=$("$VM_DIR/build-kernel.sh" | tail -n1); export KDIR; lap kernel
kos=$("$VM_DIR/build-modules.sh" "${MODULES[@]}");     lap modules
mapfile -t KOS <<<"$kos"
"$VM_DIR/initramfs.sh" "$RUN/initramfs.cpio.gz" "$GUEST_SCRIPT" "${KOS[@]}" \
    "${GUEST_FILES[@]}" "$@";                           lap initramfs
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
