#!/bin/sh
# Runs inside the QEMU guest (tools/vm/initramfs.sh's /init): the hrperf kernel test.
# Files: /hrperf-core.ko /fmt-delta.ko /fmt-pebs.ko /fmt-aggregate.ko /fmt-llc-stack.ko /hrperf_test (and cli.sh's files, see there). Any failed step exits non-zero;
# run-qemu.sh also fails the run on any Oops/BUG/WARNING/Call Trace in the log.
set -e
T=/hrperf_test
step() { echo "== $*"; }
meminfo() { awk '/^(MemFree|Slab|VmallocUsed):/ {printf "%s %s ", $1, $2}' /proc/meminfo; echo; }
kb() { awk -v k="$1:" '$1 == k {print $2}' /proc/meminfo; }

step "load"
insmod /hrperf-core.ko
insmod /fmt-delta.ko
ls -l /dev/hrperf
mode=$(stat -c %a /dev/hrperf)
[ "$mode" = 600 ] || { echo "FAIL: /dev/hrperf mode $mode, want 600"; exit 1; }
dmesg | grep -q 'hrperf_core: format registered: delta'
cat /sys/module/hrperf_core/refcnt /sys/module/fmt_delta/refcnt | tr '\n' ' '; echo "(core, delta refcounts)"

step "info"
$T info

step "overflow mode (cpu-clock, period 100000 ns, busy load)"
$T overflow 1000
$T drops

step "poll mode (1000 us)"
$T poll 1000 1000

step "instructed mode"
$T instructed 100

step "mmap rules"
$T mmap

step "fmt-pebs: registered, refused without a PEBS-capable PMU"
insmod /fmt-pebs.ko
dmesg | grep -q 'hrperf_core: format registered: pebs'
dmesg | grep 'hrperf_core: PEBS: not available: no hardware PMU'
$T pebs
rmmod fmt_pebs

step "fmt-aggregate: intervals in place, CONSUME acks, RESTART switches (overflow, cpu-clock 100 us)"
insmod /fmt-aggregate.ko
dmesg | grep -q 'hrperf_core: format registered: aggregate'
$T aggregate 1000
rmmod fmt_aggregate
echo "ok: fmt_pebs and fmt_aggregate unloaded"

step "fmt-llc-stack: bad arguments, kernel/user stacks and comm on overflow (cpu-clock 200 us)"
insmod /fmt-llc-stack.ko
dmesg | grep -q 'hrperf_core: format registered: llc-stack'
$T llc-stack 1000
rmmod fmt_llc_stack
echo "ok: fmt_llc_stack unloaded"

step "module pinning"
if rmmod hrperf_core 2>/dev/null; then echo "FAIL: rmmod hrperf_core with fmt_delta loaded"; exit 1; fi
echo "ok: rmmod hrperf_core refused while fmt_delta is loaded"
$T busy-format
rmmod fmt_delta
$T busy-core
insmod /fmt-delta.ko

step "ioctl abuse"
$T abuse 20
step "still works after abuse"
$T overflow 300
$T info

step "unload"
rmmod fmt_delta
rmmod hrperf_core
[ ! -e /dev/hrperf ] || { echo "FAIL: /dev/hrperf left behind"; exit 1; }

step "module parameters"
insmod /hrperf-core.ko mode=poll poll_us=500 dev_mode=0640 dev_gid=7
insmod /fmt-delta.ko
ls -ln /dev/hrperf
[ "$(stat -c '%a %g' /dev/hrperf)" = "640 7" ] || { echo "FAIL: dev_mode/dev_gid"; exit 1; }
$T info | grep -q 'default mode 1, poll_us 500'
rmmod fmt_delta; rmmod hrperf_core
if insmod /hrperf-core.ko mode=bogus 2>/dev/null; then echo "FAIL: mode=bogus accepted"; exit 1; fi
echo "ok: dev_mode, dev_gid, mode, poll_us"

step "zero-copy PEBS in the kernel on the simulated PMU (pebs_sim=adaptive)"
insmod /hrperf-core.ko pebs_sim=adaptive
insmod /fmt-pebs.ko
dmesg | grep 'hrperf_core: PEBS: available: simulated PMU'
$T pebs-sim 1000
rmmod fmt_pebs; rmmod hrperf_core
step "PEBS beside perf: perf's PEBS on CPU 1 (pebs_sim_busy=2)"
insmod /hrperf-core.ko pebs_sim=adaptive pebs_sim_busy=2
insmod /fmt-pebs.ko
$T pebs-busy
dmesg | grep 'PEBS session refused on CPU 1'
rmmod fmt_pebs; rmmod hrperf_core
if insmod /hrperf-core.ko pebs_sim=fmt9 2>/dev/null; then echo "FAIL: pebs_sim=fmt9 accepted"; exit 1; fi
echo "ok: pebs_sim, pebs_sim_busy"

step "20 load/use/unload cycles"
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
before_slab=$(kb Slab); before_vm=$(kb VmallocUsed); meminfo
i=0
while [ $i -lt 20 ]; do
    insmod /hrperf-core.ko
    insmod /fmt-delta.ko
    $T quick
    rmmod fmt_delta
    rmmod hrperf_core
    i=$((i + 1))
done
after_slab=$(kb Slab); after_vm=$(kb VmallocUsed); meminfo
echo "cycles: Slab ${before_slab} -> ${after_slab} kB, VmallocUsed ${before_vm} -> ${after_vm} kB"
[ $((after_vm - before_vm)) -le 64 ] || { echo "FAIL: vmalloc grew"; exit 1; }
[ $((after_slab - before_slab)) -le 512 ] || { echo "FAIL: slab grew"; exit 1; }
if grep -q hrperf /proc/vmallocinfo 2>/dev/null; then echo "FAIL: hrperf vmalloc areas left"; exit 1; fi
lsmod | grep -q hrperf && { echo "FAIL: module still loaded"; exit 1; }
echo "ok: 20 cycles, nothing left behind"

step "userspace: hrperf CLI, libhrperf.so, Python helper (cli.sh)"
sh /cli.sh
