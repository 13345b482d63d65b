// SPDX-License-Identifier: GPL-2.0
/*
 * hrperf_api_test - the QEMU guest's test of the C API (libhrperf.so, include/hrperf_api.h),
 * run under `hrperf record --source kmod --instructed -e cpu-clock,page-faults -- ...`.
 *
 *   hrperf_api_test N       N regions on CPU 0; region i touches 256*i fresh pages
 *   hrperf_api_test bench N N hrperf_poll_log() calls: the cost of marking a point
 *
 * Checks the calls' answers (pause/start states, -EINVAL outside them), marks each
 * region with two instructed reads (entry: hrperf_poll_log(); exit: hrperf_poll_log() or
 * hrperf_poll() + hrperf_log()), and prints one line per region:
 *
 *   region <i> pages <pages> inner_ns <from entry return to exit call>
 *          outer_ns <from entry call to exit return>
 *
 * which guest.sh compares with the decoded records (page-faults and cpu-clock of the
 * exit record on CPU 0). Exits non-zero with "FAIL: ..." on a wrong answer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "hrperf_api.h"

#define PAGE 4096

static int failed;

#define EXPECT(call, want)                                                              \
	do {                                                                            \
		int r_ = (call);                                                        \
		if (r_ != (want)) {                                                     \
			printf("FAIL: %s returned %d (%s), want %d\n", #call, r_,      \
			       r_ < 0 ? strerror(-r_) : "ok", (want));                  \
			failed = 1;                                                     \
		}                                                                       \
	} while (0)

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int bench(int n)
{
	uint64_t t0 = now_ns(), dt;

	for (int i = 0; i < n; i++)
		EXPECT(hrperf_poll_log(), 0);
	dt = now_ns() - t0;
	printf("MEASURED capi: %d hrperf_poll_log() calls in %llu us = %llu ns per call "
	       "(one record per CPU each; TCG timing, not hardware)\n", n,
	       (unsigned long long)dt / 1000, (unsigned long long)(dt / (n ? n : 1)));
	return failed;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 4;
	cpu_set_t set;

	if (argc > 2 && !strcmp(argv[1], "bench"))
		return bench(atoi(argv[2]));

	setvbuf(stdout, NULL, _IOLBF, 0);
	CPU_ZERO(&set);
	CPU_SET(0, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0) {
		printf("FAIL: sched_setaffinity(CPU 0): %s\n", strerror(errno));
		return 1;
	}

	EXPECT(hrperf_open(), 0);
	if (hrperf_fd() < 0) {
		printf("FAIL: hrperf_fd() = %d\n", hrperf_fd());
		return 1;
	}
	/* the recorder started the session: it runs */
	EXPECT(hrperf_start(), -EINVAL);
	EXPECT(hrperf_pause(), 0);
	EXPECT(hrperf_pause(), -EINVAL);
	EXPECT(hrperf_poll(), -EINVAL);
	EXPECT(hrperf_poll_log(), -EINVAL);
	EXPECT(hrperf_start(), 0);

	for (int i = 1; i <= n; i++) {
		size_t pages = 256 * (size_t)i;
		char *mem = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		uint64_t t0, t1, t2, t3;

		if (mem == MAP_FAILED) {
			printf("FAIL: mmap %zu pages\n", pages);
			return 1;
		}
		t0 = now_ns();
		EXPECT(hrperf_poll_log(), 0);
		t1 = now_ns();
		for (size_t p = 0; p < pages; p++)
			mem[p * PAGE] = (char)p;	/* one page fault each */
		t2 = now_ns();
		if (i % 2) {
			EXPECT(hrperf_poll_log(), 0);
		} else {
			EXPECT(hrperf_poll(), 0);
			EXPECT(hrperf_log(), 0);
		}
		t3 = now_ns();
		munmap(mem, pages * PAGE);
		/* CPU 0's two reads happen inside the calls: between them lie at least t2 - t1
		 * and at most t3 - t0 */
		printf("region %d pages %zu inner_ns %llu outer_ns %llu\n", i, pages,
		       (unsigned long long)(t2 - t1), (unsigned long long)(t3 - t0));
	}
	hrperf_close();
	EXPECT(hrperf_open(), 0);	/* attaches again after close */
	if (failed)
		return 1;
	printf("ok: C API: open, start/pause states, %d regions marked\n", n);
	return 0;
}
