#!/bin/sh
# Runs inside the QEMU guest after guest.sh's kernel checks: the userspace half of the
# kmod path, through the real hrperf CLI, libhrperf.so and the Python helper.
# Files: /usr/bin/{hrperf,hrperf-burn,libhrperf_decode_delta.so,libhrperf_decode_llc_stack.so,hrperf_api_test},
# /usr/lib/libhrperf.so, /usr/bin/python3 + stdlib subset, /py/{hrperf.py,hrperf_py_test.py}.
# Every check prints "ok: ..." or "FAIL: ..." (and exits non-zero).
set -e
step() { echo "== $*"; }
fail() { echo "FAIL: $*"; exit 1; }
ms() { awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime; }

# check_delta CSV TRIGGER MIN_NS MAX_NS [RECORDS_PER_CPU]
# Every record is a delta record of TRIGGER; per CPU: records > 0 (or exactly as given),
# timestamps strictly increasing, summed cpu-clock within [MIN_NS, MAX_NS].
check_delta() {
    awk -F, -v trig="$2" -v lo="$3" -v hi="$4" -v want="${5:-0}" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $1 == "lost" { lost[$2] += $col["lost"]; next }
    $1 != "delta" { printf "FAIL: record kind %s\n", $1; bad = 1; next }
    {
        c = $2; n[c]++
        if ($col["trigger"] != trig) { printf "FAIL: cpu %s: trigger %s, want %s\n", c, $col["trigger"], trig; bad = 1 }
        t = $col["time_ns"] + 0
        if (n[c] > 1 && t <= last[c]) back[c]++
        last[c] = t
        sum[c] += $col["cpu-clock"]
    }
    END {
        cpus = 0
        for (c in n) {
            cpus++
            printf "  cpu %s: %d %s records, cpu-clock %.1f ms, lost %d, timestamps backwards %d\n", c, n[c], trig, sum[c] / 1e6, lost[c], back[c]
            if (want > 0 && n[c] != want) { printf "FAIL: cpu %s: %d records, want %d\n", c, n[c], want; bad = 1 }
            if (back[c] > 0) { printf "FAIL: cpu %s: timestamps not increasing\n", c; bad = 1 }
            if (sum[c] < lo || sum[c] > hi) { printf "FAIL: cpu %s: cpu-clock %d ns outside [%d, %d]\n", c, sum[c], lo, hi; bad = 1 }
        }
        if (cpus == 0) { print "FAIL: no records"; bad = 1 }
        exit bad
    }' "$1"
}

# check_regions PROGRAM_OUTPUT CSV SLACK_PAGES
# The exit record of region i on CPU 0 (its (2i)-th record) counts at least the pages the
# program touched in it, and at most SLACK_PAGES more. If the program timed the region
# (inner_ns: from the entry call's return to the exit call; outer_ns: from the entry
# call to the exit call's return), CPU 0's cpu-clock delta lies between the two (10% and
# 0.5 ms of slack for local_clock vs CLOCK_MONOTONIC).
check_regions() {
    awk -F, -v slack="$3" '
    FNR == NR { if ($0 ~ /^region /) { split($0, w, " "); r = w[2]; pages[r] = w[4]; inner[r] = w[6]; outer[r] = w[8]; nreg++ }; next }
    FNR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $1 == "delta" && $2 == 0 {
        k++
        if (k % 2 == 0) {
            r = k / 2; pf = $col["page-faults"]; cc = $col["cpu-clock"]
            printf "  region %d: %d pages touched, page-faults %d, cpu-clock %.2f ms", r, pages[r], pf, cc / 1e6
            if (outer[r] != "") printf " (program: %.2f..%.2f ms)", inner[r] / 1e6, outer[r] / 1e6
            printf "\n"
            if (pf < pages[r] || pf > pages[r] + slack) { printf "FAIL: region %d: page-faults %d for %d pages\n", r, pf, pages[r]; bad = 1 }
            if (outer[r] != "" && (cc > outer[r] * 1.1 + 500000 || cc < inner[r] * 0.9 - 500000)) { printf "FAIL: region %d: cpu-clock %d outside %d..%d\n", r, cc, inner[r], outer[r]; bad = 1 }
            seen++
        }
    }
    END { if (nreg == 0 || seen < nreg) { printf "FAIL: %d regions printed, %d exit records found\n", nreg, seen; bad = 1 }; exit bad }' "$1" "$2"
}

step "hrperf CLI: errors before the module is loaded"
if out=$(hrperf status 2>&1); then fail "hrperf status without the module succeeded"; fi
echo "$out"
echo "$out" | grep -q 'insmod hrperf-core.ko' || fail "no insmod hint"
[ "$(echo "$out" | wc -l)" = 1 ] || fail "error is not one line"

insmod /hrperf-core.ko
insmod /fmt-delta.ko

step "hrperf status"
hrperf status | tee /tmp/status
grep -q '^  delta ' /tmp/status || fail "hrperf status does not list delta"
grep -q '^default mode:  overflow' /tmp/status || fail "default mode"
if out=$(hrperf record --source kmod --format nope -a --duration 10ms -o /tmp/x.data 2>&1); then fail "unknown format accepted"; fi
echo "$out"
echo "$out" | grep -q 'insmod fmt-nope.ko (registered formats: delta)' || fail "format hint"
echo "ok: status lists delta; one-line errors name the module to load"

step "hrperf record --source kmod --format pebs -- true (no PEBS-capable PMU)"
insmod /fmt-pebs.ko
rc=0; out=$(hrperf record --source kmod --format pebs -o /tmp/pebs.data -- true 2>&1) || rc=$?
echo "$out"
[ "$rc" = 2 ] || fail "pebs record exit status $rc, want 2"
[ "$(echo "$out" | wc -l)" = 1 ] || fail "pebs error is not one line"
echo "$out" | grep -q 'refused zero-copy PEBS: no hardware PMU' || fail "pebs error does not say why"
rmmod fmt_pebs
echo "ok: --format pebs: one line, exit 2, module unloads"

step "hrperf record --source kmod -e cpu-clock,page-faults -c 100000 -- hrperf-burn (overflow)"
t0=$(ms)
hrperf record --source kmod -e cpu-clock,page-faults -c 100000 -o /tmp/ovf.data -- \
    hrperf-burn --ms 1000 --threads 2 --touch-mb 8
t1=$(ms)
hrperf info -i /tmp/ovf.data
hrperf info -i /tmp/ovf.data | grep -q '^source: *kmod' || fail "capture source is not kmod"
hrperf decode -i /tmp/ovf.data --output csv > /tmp/ovf.csv
head -3 /tmp/ovf.csv
# cpu-clock counts each CPU's time from START to STOP: at most the wall time around the
# command (+20 ms), at least half the 1000 ms the workload spins.
check_delta /tmp/ovf.csv overflow 500000000 $(( (t1 - t0 + 20) * 1000000 )) || fail "overflow capture"
recs=$(($(grep -c '^delta,' /tmp/ovf.csv)))
echo "MEASURED cli overflow: $recs records decoded from a $((t1 - t0)) ms run = $((recs * 1000 / (t1 - t0))) records/s recorded through hrperf record --source kmod (2 CPUs, period 100000 ns cpu-clock; TCG timing, not hardware)"
echo "ok: overflow recording decodes: records per CPU, increasing timestamps, cpu-clock vs elapsed"

step "hrperf record --source kmod --format llc-stack -e cpu-clock -c 200000 -- dd (call stacks, hrperf report)"
insmod /fmt-llc-stack.ko
hrperf status | grep -q '^  llc-stack ' || fail "hrperf status does not list llc-stack"
hrperf formats | tee /tmp/formats
grep -q 'llc-stack' /tmp/formats || fail "hrperf formats does not list the llc-stack decoder"
hrperf record --source kmod --format llc-stack -e cpu-clock -c 200000 -o /tmp/stk.data -- \
    dd if=/dev/zero of=/dev/null bs=64k count=20000
hrperf info -i /tmp/stk.data | tee /tmp/stk.info
grep -q 'kallsyms' /tmp/stk.info || fail "no kallsyms snapshot in the llc-stack capture"
hrperf decode -i /tmp/stk.data --output jsonl > /tmp/stk.jsonl
head -n 2 /tmp/stk.jsonl
total=$(grep -c '"kind":"stack"' /tmp/stk.jsonl) || true
# dd's kernel-mode samples: the ip plus at least one caller, all kernel addresses
dd_k=$(grep '"comm":"dd"' /tmp/stk.jsonl | grep -c '"mode":"kernel".*"kernel_stack":\["0xffff[0-9a-f]*","0xffff') || true
dd_u=$(grep '"comm":"dd"' /tmp/stk.jsonl | grep -c '"user_stack":\["0x') || true
echo "llc-stack capture: $total stack records; dd: $dd_k kernel samples with >= 2 kernel frames, $dd_u with a user stack"
grep '"comm":"dd"' /tmp/stk.jsonl | grep -m1 '"mode":"kernel"' || true
! grep -qE '"user_stack":\[[^]]*"0x[0-9a-f]{15,}"' /tmp/stk.jsonl || fail "a user stack holds a non-user address"
[ "$dd_k" -ge 10 ] || fail "too few kernel stacks of dd"
[ "$dd_u" -ge 10 ] || fail "too few user stacks of dd"
rc=0; hrperf report -i /tmp/stk.data > /tmp/stk.report 2>&1 || rc=$?
if [ "$rc" != 0 ] && grep -q 'no report for format' /tmp/stk.report; then
    echo "SKIP: hrperf report has no llc-stack support yet"
else
    head -n 30 /tmp/stk.report
    [ "$rc" = 0 ] || fail "hrperf report exited $rc"
    grep -qE '\[k\] (ksys_read|vfs_read|__x64_sys_read|read_zero|iov_iter_zero)' /tmp/stk.report \
        || fail "hrperf report names no kernel function of the read path"
    echo "ok: hrperf report symbolizes dd's kernel frames with the guest's kallsyms"
fi
rmmod fmt_llc_stack
echo "ok: llc-stack recording through the CLI: kernel and user stacks, comm, kallsyms snapshot"

step "hrperf record --source kmod --format aggregate --agg-key pid-ip --agg-interval-ms 50 -- hrperf-burn (intervals read in place)"
insmod /fmt-aggregate.ko
hrperf record --source kmod --format aggregate --agg-key pid-ip -e cpu-clock -c 200000 \
    --agg-interval-ms 50 -o /tmp/agg.data -- hrperf-burn --ms 1000 --threads 2 > /tmp/agg.rec 2>&1 \
    || { cat /tmp/agg.rec; fail "aggregate record"; }
cat /tmp/agg.rec
# [hrperf] aggregate: S samples in N intervals, K key rows, O in other (M table misses), W postponed switches
rec_samples=$(sed -n 's/^\[hrperf\] aggregate: \([0-9]*\) samples in \([0-9]*\) intervals.*/\1/p' /tmp/agg.rec)
rec_ivs=$(sed -n 's/^\[hrperf\] aggregate: \([0-9]*\) samples in \([0-9]*\) intervals.*/\2/p' /tmp/agg.rec)
[ -n "$rec_samples" ] && [ -n "$rec_ivs" ] || fail "no aggregate summary from hrperf record"
hrperf info -i /tmp/agg.data > /tmp/agg.info
tail -n 4 /tmp/agg.info
dispatched=$(awk '/^per CPU:/ { p = 1; next } p && $1 ~ /^[0-9]+$/ { s += $5 } END { print s + 0 }' /tmp/agg.info)
hrperf report -i /tmp/agg.data --time-series > /tmp/agg.report || fail "hrperf report on the aggregate capture"
head -n 12 /tmp/agg.report
rep_samples=$(sed -n 's/^  \([0-9]*\) samples in \([0-9]*\) intervals on.*/\1/p' /tmp/agg.report)
rep_ivs=$(sed -n 's/^  \([0-9]*\) samples in \([0-9]*\) intervals on.*/\2/p' /tmp/agg.report)
! grep -q 'WARNING: .*inconsistent' /tmp/agg.report || fail "hrperf report found inconsistent intervals"
# Per interval (report --time-series rows: cpu seq start end samples keys other misses sum).
awk '/^Time series/ { p = 1; getline; next } p && NF == 9 { n++; s += $5 } END { print n + 0, s + 0 }' \
    /tmp/agg.report > /tmp/agg.ts
read ts_ivs ts_samples < /tmp/agg.ts
rc=0; hrperf decode -i /tmp/agg.data --output csv > /tmp/agg.csv 2> /tmp/agg.decode.err || rc=$?
if [ "$rc" != 0 ] && grep -q 'no decoder plugin for format' /tmp/agg.decode.err; then
    cat /tmp/agg.decode.err
    echo "SKIP: no aggregate decoder plugin in the guest (libhrperf_decode_aggregate.so): per-interval entry sums checked through hrperf report's inconsistent-interval count only"
    dec_ivs=$ts_ivs; dec_samples=$ts_samples
else
    [ "$rc" = 0 ] || { cat /tmp/agg.decode.err; fail "hrperf decode of the aggregate capture exited $rc"; }
    grep -m 2 '^aggregate_entry,' /tmp/agg.csv || true
    # Per interval: Σ entry count + other == samples; totals over the intervals.
    awk -F, '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        $1 == "aggregate_interval" { k = $2 "/" $3; iv[k] = $col["samples"]; other[k] = $col["other_count"]; n++; s += $col["samples"]; next }
        $1 == "aggregate_entry" { k = $2 "/" $3; cnt[k] += $col["count"]; e++; if ($col["pid"] > 0) pe++ }
        END {
            for (k in iv) if (cnt[k] + other[k] != iv[k]) { printf "FAIL: interval cpu/seq %s: count %d + other %d != samples %d\n", k, cnt[k], other[k], iv[k]; bad = 1 }
            printf "decode: %d intervals, %d samples, %d entry rows (%d with a pid)\n", n, s, e, pe
            if (e == 0 || pe == 0) { print "FAIL: no entry rows with a pid"; bad = 1 }
            print n, s > "/tmp/agg.dec"
            exit bad
        }' /tmp/agg.csv || fail "aggregate conservation per interval"
    read dec_ivs dec_samples < /tmp/agg.dec
    echo "ok: hrperf decode: entry rows; per interval Σ count + other == samples"
fi
echo "aggregate: record $rec_samples samples in $rec_ivs intervals; report $rep_samples in $rep_ivs (time series $ts_samples in $ts_ivs); decode $dec_samples in $dec_ivs; kernel dispatched $dispatched"
[ "$rec_ivs" -ge 10 ] || fail "only $rec_ivs intervals in ~1 s at 50 ms"
[ "$rec_samples" -gt 0 ] || fail "no samples"
[ "$rep_samples" = "$rec_samples" ] && [ "$dec_samples" = "$rec_samples" ] || fail "sample totals differ"
[ "$ts_samples" = "$rec_samples" ] && [ "$ts_ivs" = "$rec_ivs" ] || fail "time series totals differ"
[ "$rep_ivs" = "$rec_ivs" ] && [ "$dec_ivs" = "$rec_ivs" ] || fail "interval counts differ"
[ "$dispatched" = "$rec_samples" ] || fail "the kernel dispatched $dispatched samples, the intervals hold $rec_samples"
echo "ok: aggregate over /dev/hrperf: $rec_ivs intervals, every dispatched sample in exactly one (Σ count + other == samples)"

step "hrperf record --source kmod --format aggregate --agg-key stack -- dd; hrperf report --folded"
hrperf record --source kmod --format aggregate --agg-key stack -e cpu-clock -c 200000 \
    --agg-interval-ms 50 -o /tmp/aggs.data -- dd if=/dev/zero of=/dev/null bs=64k count=20000 \
    > /tmp/aggs.rec 2>&1 || { cat /tmp/aggs.rec; fail "aggregate stack record"; }
cat /tmp/aggs.rec
hrperf report -i /tmp/aggs.data > /tmp/aggs.report || fail "hrperf report on the stack-keyed capture"
head -n 8 /tmp/aggs.report
grep -qE '^  [1-9][0-9]* samples in [1-9][0-9]* intervals' /tmp/aggs.report || fail "no samples in the stack-keyed capture"
! grep -q 'WARNING: .*inconsistent' /tmp/aggs.report || fail "inconsistent stack-keyed intervals"
if hrperf decode -i /tmp/aggs.data --output csv > /tmp/aggs.csv 2> /dev/null; then
    nstk=$(grep -c '^aggregate_stack,' /tmp/aggs.csv) || true
    nent=$(grep -c '^aggregate_entry,' /tmp/aggs.csv) || true
    echo "stack-keyed capture: $nstk stack rows, $nent entry rows"
    [ "$nent" -gt 0 ] || fail "no entry rows in the stack-keyed capture"
fi
rc=0; hrperf report -i /tmp/aggs.data --folded > /tmp/aggs.folded 2>&1 || rc=$?
if [ "$rc" != 0 ] && grep -q -- '--folded' /tmp/aggs.folded; then
    head -n 3 /tmp/aggs.folded
    echo "SKIP: aggregate --folded not available"
else
    head -n 5 /tmp/aggs.folded
    [ "$rc" = 0 ] || fail "hrperf report --folded exited $rc"
    lines=$(grep -cE ' [0-9]+$' /tmp/aggs.folded) || true
    [ "$lines" -gt 0 ] || fail "hrperf report --folded printed no stacks"
    echo "ok: hrperf report --folded: $lines folded stacks"
fi
rmmod fmt_aggregate
echo "ok: aggregate stack-keyed recording through the CLI"

step "hrperf record (auto source = kmod) --poll-us 1000 -a --duration 500ms (poll)"
t0=$(ms)
hrperf record -e cpu-clock,context-switches --poll-us 1000 -a --duration 500ms -o /tmp/poll.data
t1=$(ms)
hrperf info -i /tmp/poll.data | grep -q '^source: *kmod' || fail "auto did not pick kmod"
hrperf decode -i /tmp/poll.data --output csv > /tmp/poll.csv
check_delta /tmp/poll.csv poll 250000000 $(( (t1 - t0 + 20) * 1000000 )) || fail "poll capture"
ticks=$(($(grep -c '^delta,0,' /tmp/poll.csv)))
echo "MEASURED cli poll: $ticks records on cpu 0 in 500 ms = $((ticks * 2)) ticks/s per CPU at 1000 us (TCG timing, not hardware)"
echo "ok: poll recording decodes"

step "C API: hrperf record --instructed -- hrperf_api_test (libhrperf.so regions)"
hrperf record --source kmod --instructed -e cpu-clock,page-faults -o /tmp/capi.data -- \
    hrperf_api_test 4 | tee /tmp/capi.out
grep -q '^ok: C API' /tmp/capi.out || fail "C API test"
hrperf decode -i /tmp/capi.data --output csv > /tmp/capi.csv
check_delta /tmp/capi.csv instructed 0 100000000000 8 || fail "C API capture: 8 instructed records per CPU"
check_regions /tmp/capi.out /tmp/capi.csv 64 || fail "C API regions"
hrperf record --source kmod --instructed -q -e cpu-clock -o /tmp/bench.data -- \
    hrperf_api_test bench 2000
hrperf decode -i /tmp/bench.data --output csv > /tmp/bench.csv
check_delta /tmp/bench.csv instructed 0 100000000000 2000 || fail "C API bench capture"
echo "ok: C API regions decode with the right counts; 2000 marks, 2000 records per CPU"

step "hrperf start/poll-log/pause/stop daemon + Python helper"
export HRPERF_SOCKET=/tmp/hrperf-ctl/ctl.sock
hrperf start --instructed --paused -e cpu-clock,page-faults -o /tmp/py.data
hrperf status | tee /tmp/status2 | grep 'hrperf start:  pid=.* state=paused' || fail "status does not show the paused session"
grep -q '^  delta .* 1$' /tmp/status2 || fail "status does not count the session as a user of delta"
grep -q '^sessions:      1 open' /tmp/status2 || fail "status does not count the session"
if hrperf poll-log 2>/dev/null; then fail "poll-log on a paused session succeeded"; fi
if hrperf start --instructed 2>/dev/null; then fail "second session accepted"; fi
hrperf start
hrperf poll-log
python3 /py/hrperf_py_test.py 3 | tee /tmp/py.out
grep -q '^ok: python helper' /tmp/py.out || fail "python helper test"
hrperf poll
hrperf log
hrperf pause
if out=$(hrperf poll-log 2>&1); then fail "poll-log while paused succeeded"; fi
echo "$out"
echo "$out" | grep -q 'not in instructed mode, or it is paused' || fail "paused poll-log error"
hrperf start
hrperf status | grep -q 'state=running' || fail "not running after start"
hrperf stop
if hrperf status | grep -q 'hrperf start:  pid='; then fail "session still there after stop"; fi
cat /tmp/hrperf-ctl/ctl.sock.log
hrperf decode -i /tmp/py.data --output csv > /tmp/py.csv
# poll-log + 3 regions x 2 + poll/log: 8 instructed records per CPU
check_delta /tmp/py.csv instructed 0 100000000000 8 || fail "Python capture"
# region i is records 2i+1 and 2i+2 on CPU 0 (after the CLI's poll-log): shift by one
awk -F, 'NR == 1 || !($1 == "delta" && $2 == 0 && ++k == 1)' /tmp/py.csv > /tmp/py0.csv
check_regions /tmp/py.out /tmp/py0.csv 256 || fail "Python regions"
echo "ok: daemon session (start, poll-log, poll, log, pause, start, stop) and Python regions"

step "nothing left behind"
hrperf status | grep '^sessions:' 
hrperf status | grep -q '^sessions:      0 open' || fail "sessions left open"
rmmod fmt_delta
rmmod hrperf_core
echo "ok: userspace half"

step "hrperf record --source kmod --format pebs on the kernel's simulated PMU (pebs_sim=adaptive)"
insmod /hrperf-core.ko pebs_sim=adaptive
insmod /fmt-pebs.ko
hrperf status | tee /tmp/status3
grep -q '^PEBS:          available: simulated PMU' /tmp/status3 || fail "status does not show the simulated PEBS PMU"
hrperf record --source kmod --format pebs --pebs-data-cfg meminfo+gpr -o /tmp/kpebs.data -- \
    hrperf-burn --ms 1000 --threads 2 --touch-mb 8 2>&1 | tee /tmp/kpebs.out
hrperf info -i /tmp/kpebs.data | tee /tmp/kpebs.info
hrperf decode -i /tmp/kpebs.data --output csv > /tmp/kpebs.csv
hrperf report --format pebs -i /tmp/kpebs.data | tee /tmp/kpebs.rep
read_in_place=$(sed -n 's/^\[hrperf\] PEBS: \([0-9]*\) records read in place, .*, 0 records copied by the handler$/\1/p' /tmp/kpebs.out)
[ -n "$read_in_place" ] || fail "no PEBS summary with 0 records copied"
decoded=$(grep -c '^pebs_adaptive,' /tmp/kpebs.csv)
simulated=$(grep -c '^pebs_adaptive,.*,adaptive,0x18314,sim,' /tmp/kpebs.csv)
[ "$decoded" = "$read_in_place" ] || fail "decoded $decoded PEBS records, $read_in_place were read in place"
[ "$simulated" = "$decoded" ] || fail "$simulated of $decoded records marked simulated"
[ "$decoded" -gt 1000 ] || fail "too few PEBS records: $decoded"
grep -q "^  $decoded records, $decoded with a data address" /tmp/kpebs.rep || fail "report does not count every record"
echo "MEASURED cli kmod pebs (simulated PMU): $decoded records read in place from the mapped DS areas and decoded (TCG timing)"
rmmod fmt_pebs
rmmod hrperf_core
echo "ok: kmod zero-copy PEBS recording on the simulated PMU decodes and reports every record"
