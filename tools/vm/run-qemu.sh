#!/usr/bin/env bash
# Boots the test kernel under QEMU TCG and judges the serial log.
# Usage: run-qemu.sh BZIMAGE INITRAMFS SERIAL_LOG [extra qemu args, e.g. -drive ...]
# Env: VM_TIMEOUT (seconds, default 300).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
(($# >= 3)) || die "usage: run-qemu.sh BZIMAGE INITRAMFS SERIAL_LOG [qemu args]..."
kernel=$1 initrd=$2 serial=$3; shift 3
limit=${VM_TIMEOUT:-300}

# TCG only: /dev/kvm here is a nested software hypervisor that never boots a kernel.
log "qemu: booting (TCG, limit ${limit}s), serial log $serial"
start=$SECONDS rc=0
timeout -k 10 "$limit" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -machine q35 -smp 2 -m 512M \
    -kernel "$kernel" -initrd "$initrd" \
    -append "console=ttyS0 panic=-1 oops=panic loglevel=7" \
    -nographic -no-reboot -serial mon:stdio -display none "$@" \
    </dev/null >"$serial" 2>&1 || rc=$?
log "qemu: exited $rc after $((SECONDS - start)) s"

# Kernel lines only (PRINTK_TIME stamp), so test output may say "WARNING:" or panic
# in userspace; not bare 'panic'/'oops': the echoed command line has both.
bad=$(grep -naE '\[ *[0-9]+\.[0-9]+\] .*(Oops|BUG:|kernel BUG|WARNING:|Call Trace|Kernel panic|panicked)' \
      "$serial" || true)
why=
if ((rc == 124 || rc == 137)); then why="timed out after ${limit}s"
elif ((rc != 0)); then why="qemu exited $rc"
elif [[ -n $bad ]]; then why="kernel trouble in log:"$'\n'"$bad"
elif ! grep -qa '^HRPERF-VM-TEST: PASS' "$serial"; then
    why=$(grep -m1 -a '^HRPERF-VM-TEST:' "$serial" || echo "no verdict line")
fi
if [[ -n $why ]]; then
    log "---- last 80 lines of $serial ----"
    tail -n 80 "$serial" >&2
    log "FAIL: $why"
    exit 1
fi
log "PASS"
