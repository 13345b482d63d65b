"""The QEMU guest's test of the Python helper (userlib/python/hrperf.py over libhrperf.so).

Run inside an instructed-mode `hrperf start` session:

    python3 hrperf_py_test.py N      N regions on CPU 0; region i touches 256*i fresh pages

Prints "region <i> pages <pages>" per region (guest.sh checks the exit records'
page-faults against it) and "ok: ..." at the end; raises (exit 1) on a wrong answer.
"""
import errno
import mmap
import os
import sys

import hrperf  # next to this file in the guest

PAGE = 4096


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    os.sched_setaffinity(0, {0})
    hrperf.open()
    assert hrperf.fd() >= 0
    for i in range(1, n + 1):
        pages = 256 * i
        m = mmap.mmap(-1, pages * PAGE)
        with hrperf.region():
            for p in range(0, pages * PAGE, PAGE):
                m[p] = 1  # one page fault each
        m.close()
        print("region %d pages %d" % (i, pages), flush=True)
    with hrperf.paused():
        try:
            hrperf.poll_log()
        except hrperf.HrperfError as e:
            assert e.errno == errno.EINVAL, e
        else:
            raise AssertionError("poll_log while paused succeeded")
    try:
        hrperf.start()
    except hrperf.HrperfError as e:
        assert e.errno == errno.EINVAL, e  # already running again
    else:
        raise AssertionError("start while running succeeded")
    hrperf.close()
    print("ok: python helper: %d regions, pause/start, errors as HrperfError" % n)


main()
