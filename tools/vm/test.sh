#!/usr/bin/env bash
# The one VM entry point: setup -> kernel -> modules -> initramfs -> boot.
# Usage: test.sh [FILE[:GUEST_PATH]]...   extra files for the guest
# Env: HRPERF_VM_GUEST_SCRIPT (default: the selftest's guest.sh), VM_TIMEOUT,
#      HRPERF_VM_DISK=<img>: attach a fresh raw disk as the guest's /dev/vda to carry
#      data out (e.g. guest `tar -cf /dev/vda out/`, host `tar -xf <img>`).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
GUEST_SCRIPT=${HRPERF_VM_GUEST_SCRIPT:-$VM_DIR/selftest/guest.sh}
RUN=$CACHE/run
mkdir -p "$RUN"

t=$SECONDS; times=()
lap() { times+=("$1 $((SECONDS - t))s"); t=$SECONDS; }

"$VM_DIR/setup.sh";                                     lap setup
KDIR=$("$VM_DIR/build-kernel.sh" | tail -n1); export KDIR; lap kernel
kos=$("$VM_DIR/build-modules.sh");                      lap modules
mapfile -t KOS <<<"$kos"
"$VM_DIR/initramfs.sh" "$RUN/initramfs.cpio.gz" "$GUEST_SCRIPT" "${KOS[@]}" "$@"; lap initramfs
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
