// SPDX-License-Identifier: GPL-2.0
/*
 * hrperf_test - the QEMU guest's test of /dev/hrperf (hrperf-core.ko + fmt-delta.ko),
 * written against include/hrperf.h only.
 *
 *   hrperf_test info                  INFO + FORMATS list "delta"
 *   hrperf_test overflow [ms]         cpu-clock overflow sampling under a busy load
 *   hrperf_test drops                 full rings: drops counted, never silent
 *   hrperf_test poll [ms] [us]        poll mode: ticks/s and per-CPU own timestamps
 *   hrperf_test instructed [n]        POLL/LOG pairs
 *   hrperf_test mmap                  read-only mapping rules
 *   hrperf_test busy-format           rmmod fmt_delta refused while a session is open
 *   hrperf_test busy-core             rmmod hrperf_core refused while /dev/hrperf is open
 *                                     (run with fmt_delta unloaded, so only the file pins it)
 *   hrperf_test abuse [rounds]        every command with bad arguments; then a session
 *   hrperf_test quick                 one short instructed session (for load cycles)
 *   hrperf_test pebs                  fmt-pebs: listed; CREATE refused with ENODEV (no PMU)
 *   hrperf_test pebs-sim [ms]         fmt-pebs on pebs_sim=adaptive: records in the mapped
 *                                     DS area read in place, RESTART, nothing copied
 *   hrperf_test pebs-busy             pebs_sim_busy=2: EBUSY naming CPU 1; BAD_EVENT
 *   hrperf_test aggregate [ms]        fmt-aggregate: intervals read in place, acked by
 *                                     CONSUME (tail = seq), switched by RESTART; conservation
 *   hrperf_test llc-stack [ms]        fmt-llc-stack: bad arguments refused; cpu-clock
 *                                     overflows over read() and user-recursion workloads
 *                                     record kernel stacks (checked against kallsyms), user
 *                                     frame-pointer stacks and comm; rmmod refused meanwhile
 *
 * Prints measured figures (TCG timing, not hardware timing) and "ok: ..." lines; exits
 * non-zero with "FAIL: ..." on the first failed check.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hrperf.h"

#define MAX_SLOTS 64
#define PERF_COUNT_SW_CPU_CLOCK 0
#define PERF_COUNT_SW_TASK_CLOCK 1
#define PERF_COUNT_SW_PAGE_FAULTS 2
#define PERF_COUNT_SW_CONTEXT_SWITCHES 3

static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("FAIL: ");
	vprintf(fmt, ap);
	printf(" (errno %d %s)\n", errno, strerror(errno));
	va_end(ap);
	fflush(stdout);
	exit(1);
}

#define CHECK(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int dev_open(void)
{
	int fd = open("/dev/hrperf", O_RDWR | O_CLOEXEC);

	CHECK(fd >= 0, "open /dev/hrperf");
	return fd;
}

/* ---- workload: one busy child per CPU ---- */

static pid_t kids[MAX_SLOTS];
static int nkids;

static void load_start(int n)
{
	for (nkids = 0; nkids < n && nkids < MAX_SLOTS; nkids++) {
		pid_t p = fork();

		CHECK(p >= 0, "fork");
		if (p == 0) {
			volatile uint64_t x = 0;
			char *mem = malloc(1 << 20);

			for (;;) {	/* compute plus some page faults */
				for (int i = 0; i < 100000; i++)
					x += i;
				if (mem)
					mem[(x >> 3) % (1 << 20)] = (char)x;
			}
		}
		kids[nkids] = p;
	}
}

static void load_stop(void)
{
	for (int i = 0; i < nkids; i++) {
		kill(kids[i], SIGKILL);
		waitpid(kids[i], NULL, 0);
	}
	nkids = 0;
}

/* ---- sessions ---- */

struct session {
	int fd;
	uint32_t mode;
	uint32_t nr;
	const uint8_t *map;
	size_t map_len;
	uint32_t count;
	uint64_t buf_size;
	struct hrperf_buffer_slot slots[MAX_SLOTS];
};

static void session_create_fmt(struct session *s, const char *format, const void *arg,
			       uint32_t arg_len, uint32_t mode, const uint32_t *sw_events,
			       uint32_t nr, uint64_t period, uint64_t poll_ns, uint64_t data_size)
{
	struct hrperf_session_create c;
	struct hrperf_buffers_arg b;

	memset(s, 0, sizeof(*s));
	s->fd = dev_open();
	s->mode = mode;
	s->nr = nr;
	memset(&c, 0, sizeof(c));
	c.size = sizeof(c);
	strcpy(c.format_name, format);
	c.fmt_arg = (uintptr_t)arg;
	c.fmt_arg_len = arg_len;
	c.mode = mode;
	c.nr_events = nr;
	for (uint32_t i = 0; i < nr; i++) {
		c.events[i].type = HRPERF_EVENT_TYPE_SOFTWARE;
		c.events[i].config = sw_events[i];
	}
	c.sample_period = period;
	c.poll_interval_ns = poll_ns;
	c.data_size = data_size;
	CHECK(ioctl(s->fd, HRPERF_IOC_CREATE, &c) == 0, "CREATE mode %u", mode);

	memset(&b, 0, sizeof(b));
	b.size = sizeof(b);
	b.count = MAX_SLOTS;
	b.entries = (uintptr_t)s->slots;
	CHECK(ioctl(s->fd, HRPERF_IOC_BUFFERS, &b) == 0, "BUFFERS");
	CHECK(b.count > 0 && b.count <= MAX_SLOTS && b.buf_size % 4096 == 0, "BUFFERS answer");
	s->count = b.count;
	s->buf_size = b.buf_size;
	s->map_len = (size_t)b.count * b.buf_size;
	s->map = mmap(NULL, s->map_len, PROT_READ, MAP_SHARED, s->fd, 0);
	CHECK(s->map != MAP_FAILED, "mmap %zu bytes read-only", s->map_len);
}

static void session_create(struct session *s, uint32_t mode, const uint32_t *sw_events,
			   uint32_t nr, uint64_t period, uint64_t poll_ns, uint64_t data_size)
{
	session_create_fmt(s, "delta", NULL, 0, mode, sw_events, nr, period, poll_ns, data_size);
}

static void session_close(struct session *s)
{
	munmap((void *)s->map, s->map_len);
	close(s->fd);
}

static const struct hrperf_buffer_header *hdr_of(const struct session *s, uint32_t i)
{
	return (const struct hrperf_buffer_header *)(s->map + s->slots[i].offset);
}

/* What the records of one CPU added up to. */
struct cpu_tally {
	uint32_t cpu;
	uint64_t records;	/* delta records */
	uint64_t lost;		/* from LOST records */
	uint64_t sum[HRPERF_MAX_COUNTERS];
	uint64_t first_ns, last_ns;
	uint64_t backwards;	/* timestamps not increasing */
	uint64_t bad;		/* malformed or foreign records */
	uint64_t kernel_ip;
	uint64_t misc_seen;
	uint64_t *times;	/* optional: every time_ns */
	size_t ntimes, cap;
};

/* Reads CPU i's ring from tail to head in place, tallies, then CONSUMEs. */
static void drain(struct session *s, uint32_t i, struct cpu_tally *t)
{
	const struct hrperf_buffer_header *h = hdr_of(s, i);
	const uint8_t *data = (const uint8_t *)h + h->data_offset;
	uint64_t head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
	uint64_t tail = h->tail, mask = h->data_size - 1;
	struct hrperf_consume_arg c;

	CHECK(h->magic == HRPERF_BUFFER_MAGIC && h->version == HRPERF_BUFFER_VERSION &&
	      h->header_size == sizeof(*h) && h->cpu == s->slots[i].cpu, "buffer header of slot %u", i);
	CHECK(h->data_size && !(h->data_size & mask) && head - tail <= h->data_size,
	      "ring geometry of cpu %u", h->cpu);
	while (tail != head) {
		const struct hrperf_record_header *r = (const void *)(data + (tail & mask));

		CHECK(r->size >= 8 && r->size % 8 == 0 && r->size <= head - tail, "record size %u",
		      r->size);
		if (r->type == HRPERF_RECORD_LOST) {
			t->lost += ((const struct hrperf_lost_record *)r)->lost;
		} else if (r->type == HRPERF_RECORD_DELTA) {
			const struct hrperf_delta_record *d = (const void *)r;

			if (d->cpu != h->cpu || d->nr != s->nr || r->size != 40 + 8 * d->nr) {
				t->bad++;
			} else {
				if (t->records && d->time_ns <= t->last_ns)
					t->backwards++;
				if (!t->records)
					t->first_ns = d->time_ns;
				t->last_ns = d->time_ns;
				for (int k = 0; k < d->nr; k++)
					t->sum[k] += d->deltas[k];
				if (r->misc & HRPERF_MISC_KERNEL)
					t->kernel_ip++;
				t->misc_seen |= r->misc;
				t->records++;
				if (t->times) {
					if (t->ntimes == t->cap) {
						t->cap = t->cap ? 2 * t->cap : 4096;
						t->times = realloc(t->times, t->cap * 8);
						CHECK(t->times, "realloc");
					}
					t->times[t->ntimes++] = d->time_ns;
				}
			}
		} else if (r->type != HRPERF_RECORD_PAD) {
			t->bad++;
		}
		tail += r->size;
	}
	memset(&c, 0, sizeof(c));
	c.size = sizeof(c);
	c.cpu = h->cpu;
	c.tail = tail;
	CHECK(ioctl(s->fd, HRPERF_IOC_CONSUME, &c) == 0, "CONSUME cpu %u", h->cpu);
	CHECK(h->tail == tail, "tail published");
}

static void drain_all(struct session *s, struct cpu_tally *t)
{
	for (uint32_t i = 0; i < s->count; i++) {
		t[i].cpu = s->slots[i].cpu;
		drain(s, i, &t[i]);
	}
}

static void stats(struct session *s, struct hrperf_cpu_stats *st)
{
	struct hrperf_stats_arg a = { .size = sizeof(a), .count = MAX_SLOTS,
				      .entries = (uintptr_t)st };

	CHECK(ioctl(s->fd, HRPERF_IOC_STATS, &a) == 0 && a.count == s->count, "STATS");
}

/* Runs a started session for `ms`, draining whenever poll() says so. */
static uint64_t run_for(struct session *s, unsigned ms, struct cpu_tally *t, unsigned *wakeups)
{
	uint64_t t0 = now_ns(), end = t0 + (uint64_t)ms * 1000000;

	while (now_ns() < end) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };
		int r = poll(&p, 1, 50);

		CHECK(r >= 0, "poll");
		if (r > 0) {
			(*wakeups)++;
			drain_all(s, t);
		}
	}
	return now_ns() - t0;
}

/* ---- the tests ---- */

static int online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n > 0 ? (int)n : 1;
}

static void test_info(void)
{
	int fd = dev_open();
	struct hrperf_module_info mi = { .size = sizeof(mi) };
	struct hrperf_format_info fi[8];
	struct hrperf_format_list fl = { .size = sizeof(fl), .capacity = 8,
					 .entries = (uintptr_t)fi };
	int found = 0;

	CHECK(ioctl(fd, HRPERF_IOC_INFO, &mi) == 0, "INFO");
	CHECK(mi.size == sizeof(mi) && mi.abi_version == HRPERF_IOCTL_ABI_VERSION, "INFO answer");
	printf("info: abi %u, module %06x, default mode %u, poll_us %u, formats %u, cpus %u\n",
	       mi.abi_version, mi.module_version, mi.default_mode, mi.poll_us, mi.nr_formats,
	       mi.nr_cpus);
	CHECK(ioctl(fd, HRPERF_IOC_FORMATS, &fl) == 0, "FORMATS");
	for (uint32_t i = 0; i < fl.count && i < 8; i++) {
		printf("format: %s version %x flags %x arg_size %u users %u\n", fi[i].name,
		       fi[i].version, fi[i].flags, fi[i].arg_size, fi[i].users);
		found |= !strcmp(fi[i].name, "delta");
	}
	CHECK(found, "format delta not listed");
	close(fd);
	printf("ok: INFO and FORMATS list delta\n");
}

/*
 * Overflow sampling of cpu-clock (plus page-faults and context-switches read at each
 * sample) under a busy load. A 64 KiB ring per CPU fills past half in well under a
 * second, so the reader is woken by the format's NOTIFY and drains while sampling runs.
 */
static void test_overflow(unsigned ms)
{
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK, PERF_COUNT_SW_PAGE_FAULTS,
				       PERF_COUNT_SW_CONTEXT_SWITCHES };
	const uint64_t period = 100000;	/* ns of cpu-clock */
	struct cpu_tally t[MAX_SLOTS] = { 0 };
	struct hrperf_cpu_stats st[MAX_SLOTS];
	struct session s;
	uint64_t total = 0, drops = 0, elapsed, wall, lost = 0;
	unsigned wakeups = 0;

	session_create(&s, HRPERF_MODE_OVERFLOW, ev, 3, period, 0, 64 << 10);
	load_start(online_cpus());
	wall = now_ns();	/* counters count from START to STOP: the upper bound */
	CHECK(ioctl(s.fd, HRPERF_IOC_START) == 0, "START");
	elapsed = run_for(&s, ms, t, &wakeups);
	CHECK(ioctl(s.fd, HRPERF_IOC_STOP) == 0, "STOP");
	wall = now_ns() - wall;
	load_stop();
	drain_all(&s, t);	/* the rest, in place after stop */
	stats(&s, st);
	for (uint32_t i = 0; i < s.count; i++) {
		const struct hrperf_buffer_header *h = hdr_of(&s, i);

		printf("overflow cpu %u: records %llu lost %llu drops %llu overflows %llu masked %llu "
		       "cpu-clock %llu ns in %llu ns, page-faults %llu, ctx-switches %llu, "
		       "kernel-ip %llu\n", t[i].cpu,
		       (unsigned long long)t[i].records, (unsigned long long)t[i].lost,
		       (unsigned long long)h->drops, (unsigned long long)h->overflows,
		       (unsigned long long)st[i].masked, (unsigned long long)t[i].sum[0],
		       (unsigned long long)elapsed, (unsigned long long)t[i].sum[1],
		       (unsigned long long)t[i].sum[2], (unsigned long long)t[i].kernel_ip);
		CHECK(t[i].records > 0, "cpu %u: no records", t[i].cpu);
		CHECK(t[i].backwards == 0, "cpu %u: %llu timestamps not increasing", t[i].cpu,
		      (unsigned long long)t[i].backwards);
		CHECK(t[i].bad == 0, "cpu %u: bad records", t[i].cpu);
		/* LOST records report drops once a record fits again (or at STOP, if room) */
		CHECK(t[i].lost <= h->drops && st[i].drops == h->drops, "cpu %u: drops accounted",
		      t[i].cpu);
		CHECK(st[i].records == h->records && h->records == t[i].records,
		      "cpu %u: STATS records", t[i].cpu);
		/* cpu-clock counts this CPU's time: the deltas add up to (almost) the run time. */
		CHECK(t[i].sum[0] <= wall + 2 * period && t[i].sum[0] >= elapsed / 2,
		      "cpu %u: cpu-clock sum %llu vs elapsed %llu", t[i].cpu,
		      (unsigned long long)t[i].sum[0], (unsigned long long)elapsed);
		/* One record per overflow; perf's cpu-clock hrtimer skips periods it is late
		 * for (TCG), so ask for at least one per 10 periods, and print the ratio. */
		CHECK(h->overflows == t[i].records + h->drops, "cpu %u: overflows == records + drops",
		      t[i].cpu);
		CHECK((t[i].records + h->drops) * period * 10 >= t[i].sum[0],
		      "cpu %u: %llu records for %llu ns", t[i].cpu,
		      (unsigned long long)t[i].records, (unsigned long long)t[i].sum[0]);
		printf("overflow cpu %u: mean sample interval %llu ns for a %llu ns period\n", t[i].cpu,
		       (unsigned long long)(t[i].sum[0] / (t[i].records + h->drops)),
		       (unsigned long long)period);
		total += t[i].records;
		drops += h->drops;
		lost += st[i].masked;
	}
	printf("MEASURED overflow: %llu samples in %llu ms = %llu samples/s handled "
	       "(%u CPUs, period %llu ns cpu-clock), drops %llu, not dispatched %llu, "
	       "reader wakeups %u (TCG timing, not hardware)\n",
	       (unsigned long long)total, (unsigned long long)elapsed / 1000000,
	       (unsigned long long)(total * 1000000000ull / elapsed), s.count,
	       (unsigned long long)period, (unsigned long long)drops, (unsigned long long)lost,
	       wakeups);
	CHECK(wakeups > 0 || ms < 500, "the reader was never woken by NOTIFY");
	CHECK(ioctl(s.fd, HRPERF_IOC_DESTROY) == 0, "DESTROY");
	session_close(&s);
	printf("ok: overflow mode\n");
}

/* A 4 KiB ring nobody reads: it fills, and every later sample is counted as a drop. */
static void test_drops(void)
{
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK };
	struct cpu_tally t[MAX_SLOTS] = { 0 };
	struct hrperf_module_info mi = { .size = sizeof(mi) };
	struct session s;
	uint64_t drops = 0, records = 0;

	session_create(&s, HRPERF_MODE_OVERFLOW, ev, 1, 100000, 0, 4096);
	CHECK(ioctl(s.fd, HRPERF_IOC_START) == 0, "START");
	usleep(300000);
	CHECK(ioctl(s.fd, HRPERF_IOC_STOP) == 0, "STOP");
	drain_all(&s, t);
	for (uint32_t i = 0; i < s.count; i++) {
		const struct hrperf_buffer_header *h = hdr_of(&s, i);

		CHECK(h->drops > 0 && h->overflows == h->records + h->drops && h->records >= t[i].records &&
		      t[i].lost <= h->drops, "cpu %u: drop accounting", t[i].cpu);
		drops += h->drops;
		records += t[i].records;
	}
	session_close(&s);	/* close = destroy: drops go to the module total */
	{
		int fd = dev_open();

		CHECK(ioctl(fd, HRPERF_IOC_INFO, &mi) == 0 && mi.total_drops >= drops, "total_drops");
		close(fd);
	}
	printf("ok: full 4 KiB rings: %llu records kept, %llu drops counted (module total %llu)\n",
	       (unsigned long long)records, (unsigned long long)drops,
	       (unsigned long long)mi.total_drops);
}

static void test_poll(unsigned ms, unsigned us)
{
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK, PERF_COUNT_SW_CONTEXT_SWITCHES,
				       PERF_COUNT_SW_TASK_CLOCK };
	struct cpu_tally t[MAX_SLOTS] = { 0 };
	struct hrperf_cpu_stats st[MAX_SLOTS];
	struct session s;
	uint64_t elapsed, wall, same = 0, compared = 0;
	unsigned wakeups = 0;

	session_create(&s, HRPERF_MODE_POLL, ev, 3, 0, (uint64_t)us * 1000, 1 << 20);
	for (uint32_t i = 0; i < s.count; i++)
		t[i].times = malloc(8), t[i].cap = 1;
	load_start(online_cpus());
	wall = now_ns();
	CHECK(ioctl(s.fd, HRPERF_IOC_START) == 0, "START poll");
	elapsed = run_for(&s, ms, t, &wakeups);
	CHECK(ioctl(s.fd, HRPERF_IOC_STOP) == 0, "STOP poll");
	wall = now_ns() - wall;
	load_stop();
	drain_all(&s, t);
	stats(&s, st);
	for (uint32_t i = 0; i < s.count; i++) {
		uint64_t per_s = t[i].records * 1000000000ull / elapsed;

		printf("poll cpu %u: records %llu (%llu ticks/s), STATS poll_ticks %llu missed %llu "
		       "drops %llu, cpu-clock %llu ns, ctx-switches %llu, task-clock %llu ns\n", t[i].cpu,
		       (unsigned long long)t[i].records, (unsigned long long)per_s,
		       (unsigned long long)st[i].poll_ticks, (unsigned long long)st[i].missed_ticks,
		       (unsigned long long)st[i].drops, (unsigned long long)t[i].sum[0],
		       (unsigned long long)t[i].sum[1], (unsigned long long)t[i].sum[2]);
		CHECK(t[i].records > 0 && t[i].backwards == 0 && t[i].bad == 0,
		      "cpu %u: poll records", t[i].cpu);
		CHECK(st[i].poll_ticks == t[i].records + st[i].drops, "cpu %u: ticks == records",
		      t[i].cpu);
		CHECK(per_s >= 100000 / us, "cpu %u: only %llu ticks/s", t[i].cpu,
		      (unsigned long long)per_s);
		CHECK(t[i].misc_seen == HRPERF_MISC_POLL, "cpu %u: misc %llx", t[i].cpu,
		      (unsigned long long)t[i].misc_seen);
		CHECK(t[i].sum[0] <= wall && t[i].sum[0] >= elapsed / 2,
		      "cpu %u: cpu-clock %llu vs %llu..%llu", t[i].cpu,
		      (unsigned long long)t[i].sum[0], (unsigned long long)elapsed,
		      (unsigned long long)wall);
	}
	/* Each CPU stamps its own read: tick k of two CPUs must not carry one shared time. */
	if (s.count >= 2) {
		size_t n = t[0].ntimes < t[1].ntimes ? t[0].ntimes : t[1].ntimes;

		for (size_t k = 0; k < n; k++, compared++)
			same += t[0].times[k] == t[1].times[k];
		CHECK(compared > 0 && same * 100 <= compared, "%llu of %llu ticks share a timestamp",
		      (unsigned long long)same, (unsigned long long)compared);
		if (n > 2) {
			uint64_t skew = 0;

			for (size_t k = 0; k < n; k++)
				skew += t[0].times[k] > t[1].times[k] ? t[0].times[k] - t[1].times[k]
								      : t[1].times[k] - t[0].times[k];
			printf("poll: cpu %u vs cpu %u own timestamps differ in %llu of %llu ticks, "
			       "mean |skew| %llu ns\n", t[0].cpu, t[1].cpu,
			       (unsigned long long)(compared - same), (unsigned long long)compared,
			       (unsigned long long)(skew / n));
		}
	}
	printf("MEASURED poll: interval %u us, %llu ticks/s per CPU achieved (cpu %u), missed %llu, "
	       "drops %llu, reader wakeups %u (TCG timing, not hardware)\n", us,
	       (unsigned long long)(t[0].records * 1000000000ull / elapsed), t[0].cpu,
	       (unsigned long long)st[0].missed_ticks, (unsigned long long)st[0].drops, wakeups);
	for (uint32_t i = 0; i < s.count; i++)
		free(t[i].times);
	session_close(&s);
	printf("ok: poll mode\n");
}

static void test_instructed(unsigned n)
{
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK };
	struct cpu_tally t[MAX_SLOTS] = { 0 };
	struct session s;
	uint64_t t0, elapsed;
	unsigned readable = 0;

	session_create(&s, HRPERF_MODE_INSTRUCTED, ev, 1, 0, 0, 0);
	CHECK(ioctl(s.fd, HRPERF_IOC_POLL) == -1 && errno == EINVAL, "POLL before START");
	t0 = now_ns();
	CHECK(ioctl(s.fd, HRPERF_IOC_START) == 0, "START instructed");
	for (unsigned k = 0; k < n; k++) {
		struct pollfd p = { .fd = s.fd, .events = POLLIN };

		usleep(2000);
		if (k % 2) {
			CHECK(ioctl(s.fd, HRPERF_IOC_POLL_LOG) == 0, "POLL_LOG");
		} else {
			CHECK(ioctl(s.fd, HRPERF_IOC_POLL) == 0, "POLL");
			CHECK(ioctl(s.fd, HRPERF_IOC_LOG) == 0, "LOG");
		}
		CHECK(poll(&p, 1, 1000) == 1 && (p.revents & POLLIN), "readable after LOG");
		readable++;
		drain_all(&s, t);
		CHECK(poll(&p, 1, 0) == 0, "not readable after CONSUME");
	}
	elapsed = now_ns() - t0;
	CHECK(ioctl(s.fd, HRPERF_IOC_STOP) == 0, "STOP instructed");
	CHECK(ioctl(s.fd, HRPERF_IOC_POLL) == -1 && errno == EINVAL, "POLL after STOP");
	drain_all(&s, t);
	for (uint32_t i = 0; i < s.count; i++) {
		printf("instructed cpu %u: records %llu, cpu-clock %llu ns over %llu ns\n", t[i].cpu,
		       (unsigned long long)t[i].records, (unsigned long long)t[i].sum[0],
		       (unsigned long long)elapsed);
		CHECK(t[i].records == n && t[i].backwards == 0 && t[i].bad == 0 &&
		      t[i].misc_seen == HRPERF_MISC_INSTRUCTED, "cpu %u: %llu instructed records",
		      t[i].cpu, (unsigned long long)t[i].records);
		CHECK(t[i].sum[0] <= elapsed && t[i].sum[0] >= elapsed / 2,
		      "cpu %u: cpu-clock", t[i].cpu);
	}
	session_close(&s);
	printf("ok: instructed mode, %u POLL/LOG pairs, reader woken %u times\n", n, readable);
}

static void test_mmap(void)
{
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK };
	struct session s;
	int fd = dev_open();
	void *p;

	CHECK(mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED, "mmap before CREATE");
	close(fd);
	session_create(&s, HRPERF_MODE_INSTRUCTED, ev, 1, 0, 0, 0);
	p = mmap(NULL, s.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
	CHECK(p == MAP_FAILED && errno == EPERM, "PROT_WRITE mapping refused");
	p = mmap(NULL, s.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE, s.fd, 0);
	CHECK(p == MAP_FAILED, "PROT_WRITE private mapping refused");
	CHECK(mprotect((void *)s.map, 4096, PROT_READ | PROT_WRITE) == -1, "mprotect to write");
	p = mmap(NULL, s.map_len + 4096, PROT_READ, MAP_SHARED, s.fd, 0);
	CHECK(p == MAP_FAILED && errno == EINVAL, "mapping past the buffers");
	p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, s.fd, (off_t)s.buf_size);
	CHECK(p != MAP_FAILED, "mapping one buffer at its offset");
	CHECK(s.count < 2 || ((const struct hrperf_buffer_header *)p)->cpu == s.slots[1].cpu,
	      "second buffer's header");
	munmap(p, 4096);
	/* The buffers outlive DESTROY while mapped (page references). */
	CHECK(ioctl(s.fd, HRPERF_IOC_DESTROY) == 0, "DESTROY while mapped");
	CHECK(hdr_of(&s, 0)->magic == HRPERF_BUFFER_MAGIC, "mapping readable after DESTROY");
	session_close(&s);
	printf("ok: buffers map read-only; PROT_WRITE and mprotect refused\n");
}

static void test_busy_format(void)
{
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK };
	struct session s;
	int r;

	session_create(&s, HRPERF_MODE_INSTRUCTED, ev, 1, 0, 0, 0);
	r = syscall(SYS_delete_module, "fmt_delta", O_NONBLOCK);
	/* 6.12 answers "in use" with EWOULDBLOCK (EAGAIN); older kernels with EBUSY. */
	CHECK(r == -1 && (errno == EBUSY || errno == EWOULDBLOCK),
	      "rmmod fmt_delta with a session open");
	printf("ok: rmmod fmt_delta refused while a session uses it (errno %d %s)\n", errno,
	       strerror(errno));
	session_close(&s);
}

/* With no format module loaded, only the open file can pin the core. */
static void test_busy_core(void)
{
	int fd = dev_open();
	int r = syscall(SYS_delete_module, "hrperf_core", O_NONBLOCK);

	CHECK(r == -1 && (errno == EBUSY || errno == EWOULDBLOCK),
	      "rmmod hrperf_core with /dev/hrperf open");
	printf("ok: rmmod hrperf_core refused while /dev/hrperf is open (errno %d %s)\n", errno,
	       strerror(errno));
	close(fd);
}

/* ---- abuse ---- */

static int allowed_errno(int e)
{
	return e == EINVAL || e == E2BIG || e == EFAULT || e == ENOTTY || e == EBUSY ||
	       e == ENOENT || e == ENOMEM || e == ENODEV || e == EOPNOTSUPP;
}

static void abuse(unsigned rounds)
{
	static const unsigned long cmds[] = {
		HRPERF_IOC_INFO, HRPERF_IOC_FORMATS, HRPERF_IOC_CREATE, HRPERF_IOC_START,
		HRPERF_IOC_STOP, HRPERF_IOC_RESTART, HRPERF_IOC_DESTROY, HRPERF_IOC_STATS,
		HRPERF_IOC_BUFFERS, HRPERF_IOC_CONSUME, HRPERF_IOC_POLL, HRPERF_IOC_LOG,
		HRPERF_IOC_POLL_LOG,
		/* unknown: other numbers, directions, sizes and types */
		_IO('H', 0x13), _IO('H', 0xff), _IOWR('H', 0x0a, uint64_t), _IOR('H', 0x00, int),
		_IOW('H', 0x02, uint32_t), _IO('X', 0x03), _IOWR('H', 0x07, char[4096]), 0, ~0ul,
		0x5401 /* TCGETS */,
	};
	const size_t ncmds = sizeof(cmds) / sizeof(cmds[0]);
	long page = sysconf(_SC_PAGESIZE);
	uint8_t *guard, *garbage;
	uint64_t calls = 0, ok = 0, errs[8] = { 0 };
	unsigned seed = 12345;
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK };
	struct session live;

	/* a page followed by an unmapped one, for structs running off the end */
	guard = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(guard != MAP_FAILED, "guard mmap");
	munmap(guard + page, page);
	garbage = malloc(8192);
	CHECK(garbage, "malloc");

	/* one session that stays alive and running through the abuse */
	session_create(&live, HRPERF_MODE_INSTRUCTED, ev, 1, 0, 0, 0);
	CHECK(ioctl(live.fd, HRPERF_IOC_START) == 0, "START live");

	for (unsigned round = 0; round < rounds; round++) {
		int fds[2] = { dev_open(), live.fd };

		for (size_t ci = 0; ci < ncmds; ci++) {
			for (int kind = 0; kind < 14; kind++) {
				unsigned long arg;
				uint32_t *w = (uint32_t *)garbage;

				for (int k = 0; k < 2048; k++)
					w[k] = rand_r(&seed);
				switch (kind) {
				case 0: arg = 0; break;				/* NULL */
				case 1: arg = 1; break;				/* tiny */
				case 2: arg = (uintptr_t)garbage + 3; break;	/* unaligned garbage */
				case 3: arg = (uintptr_t)garbage; break;	/* garbage */
				case 4: w[0] = 4; arg = (uintptr_t)garbage; break;	/* short */
				case 5: w[0] = 7; arg = (uintptr_t)garbage + 1; break;
				case 6: w[0] = 1 << 20; arg = (uintptr_t)garbage; break; /* huge */
				case 7: /* oversized with a zero tail, garbage body */
					w[0] = 1024; memset(garbage + 512, 0, 512);
					arg = (uintptr_t)garbage; break;
				case 8: /* oversized with a non-zero tail */
					w[0] = 1024; arg = (uintptr_t)garbage; break;
				case 9: arg = 0xffffffff81000000ul; break;	/* kernel text */
				case 10: arg = 0xffff888000000000ul; break;	/* direct map */
				case 11: arg = ~0ul - 3; break;
				case 12: /* valid size at the end of a page: runs into the hole */
					arg = (uintptr_t)guard + page - 8;
					((uint32_t *)arg)[0] = 424; ((uint32_t *)arg)[1] = 0;
					break;
				default: /* plausible struct, garbage pointers inside */
					w[0] = 24 + (rand_r(&seed) % 3) * 8;
					w[1] = 1000; w[2] = 0; w[3] = 0;
					((uint64_t *)garbage)[2] = 0xffffffff81000000ul;
					arg = (uintptr_t)garbage; break;
				}
				for (int f = 0; f < 2; f++) {
					int r = ioctl(fds[f], cmds[ci], arg);

					calls++;
					if (r >= 0) {
						ok++;
						continue;
					}
					CHECK(allowed_errno(errno), "cmd %#lx arg kind %d: errno %d",
					      cmds[ci], kind, errno);
					errs[errno == EINVAL ? 0 : errno == E2BIG ? 1 :
					     errno == EFAULT ? 2 : errno == ENOTTY ? 3 : 4]++;
				}
			}
		}
		/* the live session may have been stopped or destroyed: bring it back */
		if (ioctl(live.fd, HRPERF_IOC_START) != 0 && errno != EINVAL)
			fail("restart live session");
		close(fds[0]);
	}
	printf("MEASURED abuse: %llu ioctls, %llu succeeded, EINVAL %llu E2BIG %llu EFAULT %llu "
	       "ENOTTY %llu other %llu\n", (unsigned long long)calls, (unsigned long long)ok,
	       (unsigned long long)errs[0], (unsigned long long)errs[1],
	       (unsigned long long)errs[2], (unsigned long long)errs[3],
	       (unsigned long long)errs[4]);
	CHECK(errs[0] && errs[1] && errs[2] && errs[3], "every error class seen");
	/* Specific answers the ABI promises. */
	{
		int fd = dev_open();
		struct hrperf_session_create c;
		uint8_t big[sizeof(c) + 8];

		CHECK(ioctl(fd, _IO('H', 0x42)) == -1 && errno == ENOTTY, "unknown cmd: ENOTTY");
		CHECK(ioctl(fd, HRPERF_IOC_INFO, NULL) == -1 && errno == EFAULT, "NULL: EFAULT");
		memset(&c, 0, sizeof(c));
		c.size = sizeof(c) - 8;
		CHECK(ioctl(fd, HRPERF_IOC_CREATE, &c) == -1 && errno == EINVAL, "short: EINVAL");
		memset(big, 0, sizeof(big));
		c.size = sizeof(big);
		strcpy(c.format_name, "delta");
		c.mode = HRPERF_MODE_INSTRUCTED;
		c.nr_events = 1;
		c.events[0].type = HRPERF_EVENT_TYPE_SOFTWARE;
		memcpy(big, &c, sizeof(c));
		big[sizeof(c) + 3] = 1;
		CHECK(ioctl(fd, HRPERF_IOC_CREATE, big) == -1 && errno == E2BIG, "tail: E2BIG");
		big[sizeof(c) + 3] = 0;
		((struct hrperf_session_create *)big)->reserved[2] = 1;
		CHECK(ioctl(fd, HRPERF_IOC_CREATE, big) == -1 && errno == EINVAL, "reserved: EINVAL");
		((struct hrperf_session_create *)big)->reserved[2] = 0;
		CHECK(ioctl(fd, HRPERF_IOC_CREATE, big) == 0, "oversized with zero tail: accepted");
		strcpy(((struct hrperf_session_create *)big)->format_name, "nope");
		CHECK(ioctl(fd, HRPERF_IOC_CREATE, big) == -1 && errno == EBUSY, "second CREATE");
		CHECK(ioctl(fd, HRPERF_IOC_DESTROY) == 0, "DESTROY");
		CHECK(ioctl(fd, HRPERF_IOC_CREATE, big) == -1 && errno == ENOENT, "unknown format");
		close(fd);
	}
	session_close(&live);
	munmap(guard, page);
	free(garbage);
	printf("ok: abuse pass, no oops; module answers as the ABI says\n");
}

static void quick(void)
{
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK, PERF_COUNT_SW_PAGE_FAULTS };
	struct cpu_tally t[MAX_SLOTS] = { 0 };
	struct session s;

	session_create(&s, HRPERF_MODE_INSTRUCTED, ev, 2, 0, 0, 0);
	CHECK(ioctl(s.fd, HRPERF_IOC_START) == 0 && ioctl(s.fd, HRPERF_IOC_POLL_LOG) == 0 &&
	      ioctl(s.fd, HRPERF_IOC_STOP) == 0, "quick session");
	drain_all(&s, t);
	CHECK(t[0].records == 1, "quick: one record");
	session_close(&s);
}

/* Whether FORMATS lists `name`. */
static int format_listed(int fd, const char *name)
{
	struct hrperf_format_info fi[16];
	struct hrperf_format_list fl = { .size = sizeof(fl), .capacity = 16,
					 .entries = (uintptr_t)fi };
	int found = 0;

	CHECK(ioctl(fd, HRPERF_IOC_FORMATS, &fl) == 0, "FORMATS");
	for (uint32_t i = 0; i < fl.count && i < 16; i++)
		found |= !strcmp(fi[i].name, name);
	return found;
}

static uint64_t ld64(const uint8_t *p, uint64_t off)
{
	return __atomic_load_n((const uint64_t *)(p + off), __ATOMIC_ACQUIRE);
}

static struct hrperf_module_info module_info(void)
{
	int fd = dev_open();
	struct hrperf_module_info mi = { .size = sizeof(mi) };

	CHECK(ioctl(fd, HRPERF_IOC_INFO, &mi) == 0 && mi.size == sizeof(mi), "INFO");
	close(fd);
	return mi;
}

/* CREATE of a pebs session: cpu-clock every 100 us, all CPUs, no argument. */
static struct hrperf_session_create pebs_create_request(void)
{
	struct hrperf_session_create c;

	memset(&c, 0, sizeof(c));
	c.size = sizeof(c);
	strcpy(c.format_name, "pebs");
	c.mode = HRPERF_MODE_OVERFLOW;
	c.nr_events = 1;
	c.events[0].type = HRPERF_EVENT_TYPE_SOFTWARE;
	c.events[0].config = PERF_COUNT_SW_CPU_CLOCK;
	c.sample_period = 100000;
	return c;
}

/*
 * fmt-pebs on the CPU's own PMU: listed; CREATE is refused with ENODEV because the
 * kernel detects no PEBS-capable PMU here (INFO says why: no hardware PMU), even when
 * the argument (wrongly) claims one: the core overwrites the argument's PMU fields with
 * what it detected.
 */
static void test_pebs(void)
{
	int fd = dev_open();
	struct hrperf_session_create c;
	struct hrperf_module_info mi = module_info();
	uint32_t arg[36];	/* PebsArg, 144 bytes */
	int r;

	printf("pebs: state %u, format %#x, last refusal %u\n", mi.pebs_state, mi.pebs_format,
	       mi.pebs_refusal);
	CHECK(mi.pebs_state == HRPERF_PEBS_NO_PMU && mi.pebs_format == 0,
	      "INFO pebs_state %u, want %u (no hardware PMU under TCG)", mi.pebs_state,
	      HRPERF_PEBS_NO_PMU);
	CHECK(format_listed(fd, "pebs"), "format pebs not listed");
	c = pebs_create_request();
	r = ioctl(fd, HRPERF_IOC_CREATE, &c);
	CHECK(r == -1 && errno == ENODEV, "CREATE pebs (no argument): %d, want ENODEV", r);
	memset(arg, 0, sizeof(arg));
	arg[0] = sizeof(arg);	/* size */
	arg[1] = 1;		/* ARG_FL_PMU_PRESENT: a lie the kernel must not believe */
	arg[2] = 4;		/* pebs_format: adaptive */
	c.fmt_arg = (uintptr_t)arg;
	c.fmt_arg_len = sizeof(arg);
	r = ioctl(fd, HRPERF_IOC_CREATE, &c);
	CHECK(r == -1 && errno == ENODEV, "CREATE pebs (argument claims a PMU): %d, want ENODEV", r);
	CHECK(ioctl(fd, HRPERF_IOC_START) == -1 && errno == EINVAL, "no session after refusal");
	mi = module_info();
	CHECK(mi.pebs_refusal == HRPERF_PEBS_NO_PMU && mi.pebs_refusal_cpu == UINT32_MAX,
	      "INFO pebs_refusal %u cpu %u", mi.pebs_refusal, mi.pebs_refusal_cpu);
	close(fd);
	printf("ok: pebs listed; CREATE refused with ENODEV (INFO: no hardware PMU), also when the argument claims one\n");
}

/* The PEBS format's buffer (formats/pebs/src/format.rs) and adaptive records. */
#define PEBS_HDR 192
#define PEBS_H_PEBS_FORMAT 8
#define PEBS_H_RECORD_SIZE 24
#define PEBS_H_AREA_SIZE 48
#define PEBS_H_CAPACITY 56
#define PEBS_H_OVERFLOWS 64
#define PEBS_H_THRESHOLD_HITS 72
#define PEBS_H_RESTARTS 88
#define PEBS_H_COPIED 96
#define PEBS_H_LOST 104
#define PEBS_DS 320
#define PEBS_DS_BASE 0x20
#define PEBS_DS_INDEX 0x28
#define PEBS_DS_THRESHOLD 0x38
#define PEBS_AREA 768
#define PEBS_REC_SIZE 208	/* adaptive: basic 32 + meminfo 32 + GPRs 144 */
#define PEBS_AREA_BYTES 16384

struct pebs_arg {		/* PebsArg, 144 bytes */
	uint32_t size, flags, pebs_format, policy;
	uint64_t data_cfg;
	uint32_t ld_lat_threshold, counter_width;
	uint64_t area_size;
	uint64_t reset[12];
	uint32_t dsrc_kind, reserved;
};

struct pebs_tally {
	uint64_t records, drains, full_drains, last_tsc, counter_bit;
};

/*
 * Reads CPU i's records in place, [base, index) of the DS area in the mapping, and
 * checks each one field by field against what the simulated assist writes from the
 * interrupted context: record size and groups in the basic header, one applicable
 * counter (the one hrperf-core took), the eventing IP equal to the GPR group's IP, the
 * data address equal to the GPR group's stack pointer, an L1 hit of latency 5, TSCs
 * (local_clock ns) that never go back. Returns the number of records.
 */
static uint64_t pebs_read(struct session *s, uint32_t i, struct pebs_tally *t)
{
	const uint8_t *b = (const uint8_t *)hdr_of(s, i);
	const uint8_t *ds = b + PEBS_DS;
	uint64_t base = ld64(ds, PEBS_DS_BASE), index = ld64(ds, PEBS_DS_INDEX);
	uint64_t n, k;

	CHECK(index >= base && (index - base) % PEBS_REC_SIZE == 0 &&
	      index - base <= PEBS_AREA_BYTES, "cpu slot %u: DS index %#llx base %#llx", i,
	      (unsigned long long)index, (unsigned long long)base);
	n = (index - base) / PEBS_REC_SIZE;
	for (k = 0; k < n; k++) {
		const uint8_t *r = b + PEBS_AREA + k * PEBS_REC_SIZE;
		uint64_t w0 = ld64(r, 0), ip = ld64(r, 8), app = ld64(r, 16), tsc = ld64(r, 24);

		CHECK((w0 >> 48) == PEBS_REC_SIZE && (uint32_t)w0 == 3,
		      "record %llu: basic header %#llx", (unsigned long long)k,
		      (unsigned long long)w0);
		CHECK(app && !(app & (app - 1)), "record %llu: applicable counters %#llx",
		      (unsigned long long)k, (unsigned long long)app);
		if (!t->counter_bit)
			t->counter_bit = app;
		CHECK(app == t->counter_bit, "applicable counter changed");
		CHECK(ip && ip == ld64(r, 72), "record %llu: ip %#llx, GPR ip %#llx",
		      (unsigned long long)k, (unsigned long long)ip,
		      (unsigned long long)ld64(r, 72));
		CHECK(ld64(r, 32) == ld64(r, 112), "record %llu: data address %#llx != sp %#llx",
		      (unsigned long long)k, (unsigned long long)ld64(r, 32),
		      (unsigned long long)ld64(r, 112));
		CHECK(ld64(r, 40) == 1 && ld64(r, 48) == 5, "record %llu: dse %#llx lat %llu",
		      (unsigned long long)k, (unsigned long long)ld64(r, 40),
		      (unsigned long long)ld64(r, 48));
		CHECK(tsc >= t->last_tsc, "record %llu: tsc went back", (unsigned long long)k);
		t->last_tsc = tsc;
	}
	t->records += n;
	return n;
}

/*
 * Zero-copy PEBS in the kernel on the simulated PMU (hrperf-core loaded with
 * pebs_sim=adaptive): cpu-clock overflows every 100 us stand in for the PEBS counter's;
 * the simulated assist writes adaptive records (basic + meminfo + GPRs) straight into
 * the DS-managed area of the buffer this process maps read-only; at the threshold the
 * PMI goes through the format's handler (count, NOTIFY, MASK). The reader reads each
 * full area in place and RESTARTs. Every full drain holds exactly the threshold's
 * records; the handler copied nothing; interrupts == threshold hits; restarts == drains.
 */
static void test_pebs_sim(unsigned ms)
{
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK };
	struct hrperf_module_info mi = module_info();
	struct pebs_arg arg = { .size = sizeof(arg), .data_cfg = 3 /* meminfo + GPRs */,
				.ld_lat_threshold = 3, .area_size = PEBS_AREA_BYTES };
	struct pebs_tally t[MAX_SLOTS] = { 0 };
	struct hrperf_cpu_stats st[MAX_SLOTS];
	struct session s;
	uint64_t end, thr_records = 0, all = 0, hits = 0;
	unsigned wakeups = 0;

	CHECK(mi.pebs_state == HRPERF_PEBS_SIMULATED && (mi.pebs_format & 0xf) == 4 &&
	      (mi.pebs_format & (1u << 16)) && mi.tsc_khz == 1000000,
	      "INFO pebs state %u format %#x tsc_khz %u", mi.pebs_state, mi.pebs_format,
	      mi.tsc_khz);
	_Static_assert(sizeof(struct pebs_arg) == 144, "PebsArg");
	session_create_fmt(&s, "pebs", &arg, sizeof(arg), HRPERF_MODE_OVERFLOW, ev, 1, 100000,
			   0, 0);
	for (uint32_t i = 0; i < s.count; i++) {
		const uint8_t *b = (const uint8_t *)hdr_of(&s, i);
		const uint8_t *h = b + PEBS_HDR, *ds = b + PEBS_DS;
		struct hrperf_cpu_arg a = { .size = sizeof(a), .cpu = s.slots[i].cpu };

		CHECK(*(const uint32_t *)(h + PEBS_H_PEBS_FORMAT) == mi.pebs_format,
		      "header format word");
		CHECK(*(const uint32_t *)(h + PEBS_H_RECORD_SIZE) == PEBS_REC_SIZE, "record size");
		CHECK(ld64(h, PEBS_H_CAPACITY) == PEBS_AREA_BYTES / PEBS_REC_SIZE, "capacity");
		thr_records = (ld64(ds, PEBS_DS_THRESHOLD) - ld64(ds, PEBS_DS_BASE)) / PEBS_REC_SIZE;
		CHECK(thr_records == ld64(h, PEBS_H_CAPACITY) - 1, "large PEBS threshold %llu",
		      (unsigned long long)thr_records);
		/* RESTART while the CPU is not masked would throw records away: refused. */
		CHECK(ioctl(s.fd, HRPERF_IOC_RESTART, &a) == -1 && errno == EINVAL,
		      "RESTART of an unmasked PEBS CPU");
	}
	load_start(online_cpus());
	CHECK(ioctl(s.fd, HRPERF_IOC_START) == 0, "START pebs");
	end = now_ns() + (uint64_t)ms * 1000000;
	while (now_ns() < end) {
		struct pollfd p = { .fd = s.fd, .events = POLLIN };
		int r = poll(&p, 1, 20);

		CHECK(r >= 0, "poll");
		wakeups += r > 0;
		for (uint32_t i = 0; i < s.count; i++) {
			const uint8_t *h = (const uint8_t *)hdr_of(&s, i) + PEBS_HDR;
			struct hrperf_cpu_arg a = { .size = sizeof(a), .cpu = s.slots[i].cpu };

			if (ld64(h, PEBS_H_THRESHOLD_HITS) == ld64(h, PEBS_H_RESTARTS))
				continue;	/* still counting: its records are not complete */
			CHECK(pebs_read(&s, i, &t[i]) == thr_records,
			      "cpu %u: a full area holds %llu records", a.cpu,
			      (unsigned long long)thr_records);
			t[i].drains++;
			t[i].full_drains++;
			CHECK(ioctl(s.fd, HRPERF_IOC_RESTART, &a) == 0, "RESTART cpu %u", a.cpu);
			/* The assist may write again at once: the index went back, not to base. */
			CHECK(ld64(h, PEBS_H_RESTARTS) == t[i].full_drains &&
			      ld64((const uint8_t *)hdr_of(&s, i) + PEBS_DS, PEBS_DS_INDEX) <
			      ld64((const uint8_t *)hdr_of(&s, i) + PEBS_DS, PEBS_DS_THRESHOLD),
			      "RESTART reset the DS index");
		}
	}
	CHECK(ioctl(s.fd, HRPERF_IOC_STOP) == 0, "STOP");
	load_stop();
	stats(&s, st);
	for (uint32_t i = 0; i < s.count; i++) {
		const uint8_t *h = (const uint8_t *)hdr_of(&s, i) + PEBS_HDR;
		uint64_t rest = pebs_read(&s, i, &t[i]);
		uint64_t th = ld64(h, PEBS_H_THRESHOLD_HITS), rs = ld64(h, PEBS_H_RESTARTS);

		printf("pebs-sim cpu %u: %llu records read in place (%llu full areas + %llu at stop), %llu threshold PMIs, %llu restarts, %llu copied, %llu lost, STATS overflows %llu masked %llu, counter bit %#llx\n",
		       s.slots[i].cpu, (unsigned long long)t[i].records,
		       (unsigned long long)t[i].full_drains, (unsigned long long)rest,
		       (unsigned long long)th, (unsigned long long)rs,
		       (unsigned long long)ld64(h, PEBS_H_COPIED),
		       (unsigned long long)ld64(h, PEBS_H_LOST),
		       (unsigned long long)st[i].overflows, (unsigned long long)st[i].masked,
		       (unsigned long long)t[i].counter_bit);
		CHECK(ld64(h, PEBS_H_COPIED) == 0, "the handler copied records");
		CHECK(ld64(h, PEBS_H_LOST) == 0, "records lost");
		CHECK(rs == t[i].full_drains && (th == rs || th == rs + 1), "threshold hits %llu, restarts %llu, drains %llu",
		      (unsigned long long)th, (unsigned long long)rs,
		      (unsigned long long)t[i].full_drains);
		CHECK(st[i].overflows == ld64(h, PEBS_H_OVERFLOWS) && st[i].overflows == th,
		      "PMIs dispatched %llu, handler calls %llu, threshold hits %llu",
		      (unsigned long long)st[i].overflows,
		      (unsigned long long)ld64(h, PEBS_H_OVERFLOWS), (unsigned long long)th);
		CHECK(t[i].records == t[i].full_drains * thr_records + rest, "record accounting");
		CHECK(t[i].full_drains >= 2, "cpu %u: too few threshold interrupts", s.slots[i].cpu);
		CHECK(t[i].counter_bit == 1u << 3, "the highest free counter (GP3) was taken");
		all += t[i].records;
		hits += th;
	}
	session_close(&s);
	printf("MEASURED pebs-sim: %llu adaptive records read in place over %u CPUs in %u ms (cpu-clock 100 us as the PEBS counter), %llu threshold PMIs, %u poll wakeups, 0 copied (TCG timing)\n",
	       (unsigned long long)all, s.count, ms, (unsigned long long)hits, wakeups);
	printf("ok: kernel zero-copy PEBS on the simulated PMU: records written into the mapped DS area, read in place, RESTART recycles, nothing copied or lost\n");
}

/*
 * The simulated perf has PEBS events on CPU 1 (pebs_sim_busy=2): a session on every CPU
 * is refused with EBUSY and INFO names CPU 1 and IA32_PEBS_ENABLE's value; a session on
 * CPU 0 alone is fine. Two events are refused with EINVAL (BAD_EVENT).
 */
static void test_pebs_busy(void)
{
	struct hrperf_session_create c;
	struct hrperf_module_info mi;
	int fd = dev_open(), r;

	c = pebs_create_request();
	r = ioctl(fd, HRPERF_IOC_CREATE, &c);
	CHECK(r == -1 && errno == EBUSY, "CREATE pebs with perf's PEBS on CPU 1: %d errno %d", r,
	      errno);
	mi = module_info();
	CHECK(mi.pebs_refusal == HRPERF_PEBS_IN_USE && mi.pebs_refusal_cpu == 1 &&
	      mi.pebs_refusal_value == 1, "INFO refusal %u cpu %u value %#llx", mi.pebs_refusal,
	      mi.pebs_refusal_cpu, (unsigned long long)mi.pebs_refusal_value);
	c.cpus.bits[0] = 1;
	CHECK(ioctl(fd, HRPERF_IOC_CREATE, &c) == 0, "CREATE pebs on CPU 0 only");
	CHECK(ioctl(fd, HRPERF_IOC_DESTROY) == 0, "DESTROY");
	c.nr_events = 2;
	c.events[1] = c.events[0];
	r = ioctl(fd, HRPERF_IOC_CREATE, &c);
	CHECK(r == -1 && errno == EINVAL, "CREATE pebs with two events: %d errno %d", r, errno);
	CHECK(module_info().pebs_refusal == HRPERF_PEBS_BAD_EVENT, "INFO refusal BAD_EVENT");
	close(fd);
	printf("ok: pebs EBUSY where perf uses PEBS (INFO names CPU 1, IA32_PEBS_ENABLE 0x1), fine on CPU 0 alone; two events EINVAL\n");
}

/* The aggregate format's layout (formats/aggregate/src/layout.rs). */
#define AGG_C_MAGIC 0
#define AGG_C_TABLE_BYTES 32
#define AGG_C_PUBLISHED 40
#define AGG_U_ACK 64
#define AGG_TABLES_OFFSET 128
#define AGG_T_SEQ 0
#define AGG_T_SAMPLES 24
#define AGG_T_OTHER_COUNT 32
#define AGG_T_USED 56
#define AGG_TABLE_HEADER 128
#define AGG_SLOT 32
#define AGG_CONTROL_MAGIC 0x3152474741505248ull	/* "HRPAGGR1" little endian */

struct agg_tally {
	uint64_t intervals, samples, other, keys, restarts;
	uint64_t last_seq;
};

/*
 * Reads CPU i's published, unacknowledged interval in place (if any), checks
 * samples == sum of slot counts + other, then acknowledges it with CONSUME (tail = seq).
 * Returns 1 if an interval was consumed.
 */
static int agg_consume(struct session *s, uint32_t i, struct agg_tally *t, unsigned slots)
{
	const struct hrperf_buffer_header *h = hdr_of(s, i);
	const uint8_t *d = (const uint8_t *)h + h->data_offset;
	uint64_t seq = ld64(d, AGG_C_PUBLISHED), tb = ld64(d, AGG_C_TABLE_BYTES);
	const uint8_t *tab;
	uint64_t sum = 0, used = 0, samples, other;
	uint32_t gen;
	struct hrperf_consume_arg c = { .size = sizeof(c), .cpu = h->cpu };

	CHECK(ld64(d, AGG_C_MAGIC) == AGG_CONTROL_MAGIC, "aggregate control block of cpu %u", h->cpu);
	if (seq == 0 || seq == ld64(d, AGG_U_ACK))
		return 0;
	CHECK(seq == t->last_seq + 1, "cpu %u: interval %llu after %llu", h->cpu,
	      (unsigned long long)seq, (unsigned long long)t->last_seq);
	tab = d + AGG_TABLES_OFFSET + (seq & 1) * tb;
	CHECK(ld64(tab, AGG_T_SEQ) == seq, "table seq");
	gen = (uint32_t)(seq % 0xffffffffull) + 1;
	samples = ld64(tab, AGG_T_SAMPLES);
	other = ld64(tab, AGG_T_OTHER_COUNT);
	for (unsigned k = 0; k < slots; k++) {
		const uint8_t *sl = tab + AGG_TABLE_HEADER + (uint64_t)k * AGG_SLOT;

		if ((uint32_t)ld64(sl, 8) != gen)
			continue;
		sum += ld64(sl, 16);
		used++;
	}
	CHECK(used == ld64(tab, AGG_T_USED), "cpu %u interval %llu: %llu slots used, header says %llu",
	      h->cpu, (unsigned long long)seq, (unsigned long long)used,
	      (unsigned long long)ld64(tab, AGG_T_USED));
	CHECK(samples == sum + other, "cpu %u interval %llu: samples %llu != counts %llu + other %llu",
	      h->cpu, (unsigned long long)seq, (unsigned long long)samples,
	      (unsigned long long)sum, (unsigned long long)other);
	/* A wrong sequence number is refused. */
	c.tail = seq + 1;
	CHECK(ioctl(s->fd, HRPERF_IOC_CONSUME, &c) == -1 && errno == EINVAL, "CONSUME wrong seq");
	c.tail = seq;
	CHECK(ioctl(s->fd, HRPERF_IOC_CONSUME, &c) == 0, "CONSUME cpu %u seq %llu", h->cpu,
	      (unsigned long long)seq);
	CHECK(ld64(d, AGG_U_ACK) == seq, "ack visible in the mapping");
	t->intervals++;
	t->samples += samples;
	t->other += other;
	t->keys += used;
	t->last_seq = seq;
	return 1;
}

/* RESTART on CPU i: switches at once once the published interval is acknowledged. */
static void agg_switch(struct session *s, uint32_t i, struct agg_tally *t, unsigned slots)
{
	struct hrperf_cpu_arg a = { .size = sizeof(a), .cpu = s->slots[i].cpu };

	for (int tries = 0; ioctl(s->fd, HRPERF_IOC_RESTART, &a) != 0; tries++) {
		/* EBUSY: the handler published an interval since we looked: consume it. */
		CHECK(errno == EBUSY && tries < 100, "RESTART cpu %u", a.cpu);
		agg_consume(s, i, t, slots);
	}
	t->restarts++;
}

/*
 * fmt-aggregate in overflow mode (cpu-clock, 100 us) under a busy load: a small table
 * (32 slots, probe 2, switch at half full) so the handler also switches by itself (CTRL_SWITCH
 * wakes poll()); the reader consumes published intervals in place and switches with
 * RESTART every 100 ms. Per interval: samples == sum of counts + other. Per CPU: the
 * intervals' samples add up to the overflows in the buffer header and in STATS.
 */
static void test_aggregate(unsigned ms)
{
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK };
	uint32_t arg[12] = { 0 };	/* AggregateArg, 48 bytes */
	const unsigned slots = 32;
	struct agg_tally t[MAX_SLOTS] = { 0 };
	struct hrperf_cpu_stats st[MAX_SLOTS];
	struct session s;
	unsigned wakeups = 0, restarts = 0;
	uint64_t t0, end, next_switch, all = 0, ivs = 0;

	arg[0] = sizeof(arg);
	arg[3] = slots;		/* slots */
	arg[4] = 2;		/* probe: collisions go to "other" */
	arg[6] = 500;		/* switch_permille */
	session_create_fmt(&s, "aggregate", arg, sizeof(arg), HRPERF_MODE_OVERFLOW, ev, 1, 100000,
			   0, 0);
	load_start(online_cpus());
	CHECK(ioctl(s.fd, HRPERF_IOC_START) == 0, "START");
	t0 = now_ns();
	end = t0 + (uint64_t)ms * 1000000;
	next_switch = t0 + 100000000;
	while (now_ns() < end) {
		struct pollfd p = { .fd = s.fd, .events = POLLIN };
		int r = poll(&p, 1, 20);

		CHECK(r >= 0, "poll");
		if (r > 0)
			wakeups++;
		for (uint32_t i = 0; i < s.count; i++)
			agg_consume(&s, i, &t[i], slots);
		if (now_ns() >= next_switch) {
			for (uint32_t i = 0; i < s.count; i++) {
				agg_consume(&s, i, &t[i], slots);
				agg_switch(&s, i, &t[i], slots);
			}
			next_switch += 100000000;
		}
	}
	CHECK(ioctl(s.fd, HRPERF_IOC_STOP) == 0, "STOP");
	load_stop();
	/* Close the last interval of each CPU: consume what is published, switch, consume. */
	for (uint32_t i = 0; i < s.count; i++) {
		agg_consume(&s, i, &t[i], slots);
		agg_switch(&s, i, &t[i], slots);
		CHECK(agg_consume(&s, i, &t[i], slots) == 1, "final interval of slot %u", i);
	}
	stats(&s, st);
	for (uint32_t i = 0; i < s.count; i++) {
		const struct hrperf_buffer_header *h = hdr_of(&s, i);

		restarts += t[i].restarts;
		printf("aggregate cpu %u: %llu intervals (%llu closed by RESTART, %llu by the handler: CTRL_SWITCH), %llu samples (%llu in other, %llu keys summed over intervals), header overflows %llu, STATS overflows %llu, masked %llu\n",
		       h->cpu, (unsigned long long)t[i].intervals, (unsigned long long)t[i].restarts,
		       (unsigned long long)(t[i].intervals - t[i].restarts),
		       (unsigned long long)t[i].samples,
		       (unsigned long long)t[i].other, (unsigned long long)t[i].keys,
		       (unsigned long long)h->overflows, (unsigned long long)st[i].overflows,
		       (unsigned long long)st[i].masked);
		CHECK(t[i].samples == h->overflows && h->overflows == st[i].overflows,
		      "cpu %u: intervals hold %llu samples, header %llu, STATS %llu", h->cpu,
		      (unsigned long long)t[i].samples, (unsigned long long)h->overflows,
		      (unsigned long long)st[i].overflows);
		CHECK(t[i].intervals >= 3 && t[i].samples > 0, "cpu %u: too few intervals/samples",
		      h->cpu);
		all += t[i].samples;
		ivs += t[i].intervals;
	}
	session_close(&s);
	printf("MEASURED aggregate: %llu samples in %llu intervals over %u CPUs in %u ms (cpu-clock 100 us), %u poll wakeups, %u RESTART switches; every interval samples == counts + other, per-CPU sum == overflows (TCG timing)\n",
	       (unsigned long long)all, (unsigned long long)ivs, s.count, ms, wakeups, restarts);
	printf("ok: aggregate intervals read in place, acknowledged by CONSUME, switched by RESTART; nothing lost\n");
}

/* ---- fmt-llc-stack (formats/llc-stack/src/{lib,record}.rs) ---- */

#define STK_RECORD 0x1200u
#define STK_FIXED 80
#define STK_KERNEL_IP (1u << 4)
#define STK_KERNEL_TRUNCATED (1u << 0)
#define KERNEL_BASE 0xffff800000000000ull

struct stk_arg {		/* LlcStackArg, 24 bytes */
	uint32_t size, flags;
	uint64_t data_size;
	uint16_t max_kernel, max_user;
	uint32_t reserved;
};

struct stk_record {
	struct hrperf_record_header header;
	uint64_t time_ns, ip, addr, weight;
	uint32_t cpu, pid, tid, flags;
	uint16_t nr_kernel, nr_user;
	uint32_t reserved;
	char comm[16];
	uint64_t frames[];
};

/* Kernel text symbols from /proc/kallsyms, sorted by address. */
struct ksym {
	uint64_t addr;
	char name[48];
};
static struct ksym *ksyms;
static size_t nksyms;

static int ksym_cmp(const void *a, const void *b)
{
	const struct ksym *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static void ksyms_load(void)
{
	FILE *f = fopen("/proc/kallsyms", "r");
	char line[256], type, name[128];
	unsigned long long a;
	size_t cap = 0;

	CHECK(f, "open /proc/kallsyms");
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx %c %127s", &a, &type, name) != 3 || (type != 't' && type != 'T'))
			continue;
		if (nksyms == cap) {
			cap = cap ? 2 * cap : 16384;
			ksyms = realloc(ksyms, cap * sizeof(*ksyms));
			CHECK(ksyms, "realloc");
		}
		ksyms[nksyms].addr = a;
		snprintf(ksyms[nksyms].name, sizeof(ksyms[nksyms].name), "%.47s", name);
		nksyms++;
	}
	fclose(f);
	CHECK(nksyms > 1000 && ksyms[0].addr, "kallsyms: %zu text symbols (addresses hidden?)", nksyms);
	qsort(ksyms, nksyms, sizeof(*ksyms), ksym_cmp);
}

/* The kernel function containing addr ("?" if none). */
static const char *ksym_name(uint64_t addr)
{
	size_t lo = 0, hi = nksyms;

	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;

		if (ksyms[mid].addr <= addr)
			lo = mid;
		else
			hi = mid;
	}
	return nksyms && ksyms[lo].addr <= addr ? ksyms[lo].name : "?";
}

/* User-mode recursion with frame pointers (hrperf_test is built -fno-omit-frame-pointer). */
static volatile uint64_t sink;
static volatile int spin_forever = 1;
__attribute__((noinline)) static void spin_leaf(void)
{
	while (spin_forever)
		for (int i = 0; i < 100000; i++)
			sink += i;
}
__attribute__((noinline)) static void spin_depth(int n)
{
	if (n > 0)
		spin_depth(n - 1);
	else
		spin_leaf();
	sink++;		/* no tail call */
}

extern char __executable_start[], etext[];
#define IN_TEXT(a) ((a) >= (uint64_t)(uintptr_t)__executable_start && (a) < (uint64_t)(uintptr_t)etext)

struct stk_tally {
	uint64_t records, lost, bad, kernel_recs, kernel_frames, max_kernel, truncated;
	uint64_t sys_kernel, sys_read_path, sys_user_ok, usr_recs, usr_deep, comm_ok;
	char example[512];
};

static void stk_bad(struct stk_tally *t, const struct stk_record *k, const char *why)
{
	if (t->bad++ < 3)
		printf("llc-stack: bad record (%s): size %u misc %#x cpu %u pid %u comm %.16s flags %#x ip %#llx nk %u nu %u\n",
		       why, k->header.size, k->header.misc, k->cpu, k->pid, k->comm, k->flags,
		       (unsigned long long)k->ip, k->nr_kernel, k->nr_user);
}

static void stk_drain(struct session *s, uint32_t i, struct stk_tally *t, pid_t sys, pid_t usr)
{
	const struct hrperf_buffer_header *h = hdr_of(s, i);
	const uint8_t *data = (const uint8_t *)h + h->data_offset;
	uint64_t head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
	uint64_t tail = h->tail, mask = h->data_size - 1;
	struct hrperf_consume_arg c = { .size = sizeof(c), .cpu = h->cpu };

	CHECK(h->magic == HRPERF_BUFFER_MAGIC && h->cpu == s->slots[i].cpu, "llc-stack buffer %u", i);
	while (tail != head) {
		const struct hrperf_record_header *r = (const void *)(data + (tail & mask));
		const struct stk_record *k = (const void *)r;

		CHECK(r->size >= 8 && r->size % 8 == 0 && r->size <= head - tail, "record size %u", r->size);
		tail += r->size;
		if (r->type == HRPERF_RECORD_LOST) {
			t->lost += ((const struct hrperf_lost_record *)r)->lost;
			continue;
		}
		if (r->type == HRPERF_RECORD_PAD)
			continue;
		if (r->type != STK_RECORD || r->size != STK_FIXED + 8u * (k->nr_kernel + k->nr_user) ||
		    k->cpu != h->cpu || k->nr_kernel > 64 || k->nr_user > 127) {
			stk_bad(t, k, "layout");
			continue;
		}
		t->records++;
		if (k->flags & STK_KERNEL_TRUNCATED)
			t->truncated++;
		if ((pid_t)k->pid == sys || (pid_t)k->pid == usr) {
			if (strncmp(k->comm, "hrperf_test", 16)) {
				stk_bad(t, k, "comm of our child");
				continue;
			}
			t->comm_ok++;
		}
		if (!k->pid && k->nr_user) {
			stk_bad(t, k, "idle task with a user stack");
			continue;
		}
		if (k->nr_kernel) {
			int ok = (k->flags & STK_KERNEL_IP) && (r->misc & HRPERF_MISC_KERNEL) &&
				 k->frames[0] == k->ip;

			for (int f = 0; f < k->nr_kernel; f++)
				ok &= k->frames[f] >= KERNEL_BASE;
			if (!ok) {
				stk_bad(t, k, "kernel frames");
				continue;
			}
			t->kernel_recs++;
			t->kernel_frames += k->nr_kernel;
			if (k->nr_kernel > t->max_kernel)
				t->max_kernel = k->nr_kernel;
		} else if (k->flags & STK_KERNEL_IP) {
			stk_bad(t, k, "kernel ip, no kernel stack");
			continue;
		}
		if ((pid_t)k->pid == sys && k->nr_kernel) {
			int read_path = 0;

			t->sys_kernel++;
			for (int f = 0; f < k->nr_kernel; f++)
				read_path |= strstr(ksym_name(k->frames[f]), "read") != NULL;
			t->sys_read_path += read_path;
			/* The user stack of a syscall starts at the libc read() return site. */
			t->sys_user_ok += k->nr_user >= 1 && IN_TEXT(k->frames[k->nr_kernel]);
			if (read_path && !t->example[0]) {
				int n = snprintf(t->example, sizeof(t->example), "pid %u comm %s kernel:",
						 k->pid, k->comm);

				for (int f = 0; f < k->nr_kernel && n < 400; f++)
					n += snprintf(t->example + n, sizeof(t->example) - n, " %s",
						      ksym_name(k->frames[f]));
				n += snprintf(t->example + n, sizeof(t->example) - n, " | user:");
				for (int f = k->nr_kernel; f < k->nr_kernel + k->nr_user && n < 480; f++)
					n += snprintf(t->example + n, sizeof(t->example) - n, " %#llx",
						      (unsigned long long)k->frames[f]);
			}
		}
		if ((pid_t)k->pid == usr && !k->nr_kernel && k->nr_user) {
			int ok = k->frames[0] == k->ip;

			t->usr_recs++;
			/* spin_leaf <- spin_depth x9 <- main ...: all in our text */
			for (int f = 0; f < k->nr_user && f < 10; f++)
				ok &= IN_TEXT(k->frames[f]);
			t->usr_deep += ok && k->nr_user >= 10;
		}
	}
	c.tail = tail;
	CHECK(ioctl(s->fd, HRPERF_IOC_CONSUME, &c) == 0, "CONSUME cpu %u", h->cpu);
}

static void stk_create_refused(int fd, uint32_t mode, const void *arg, uint32_t len, int want,
			       const char *what)
{
	struct hrperf_session_create c;
	int r;

	memset(&c, 0, sizeof(c));
	c.size = sizeof(c);
	strcpy(c.format_name, "llc-stack");
	c.mode = mode;
	c.nr_events = 1;
	c.events[0].type = HRPERF_EVENT_TYPE_SOFTWARE;
	c.events[0].config = PERF_COUNT_SW_CPU_CLOCK;
	c.sample_period = mode == HRPERF_MODE_OVERFLOW ? 100000 : 0;
	c.poll_interval_ns = mode == HRPERF_MODE_POLL ? 1000000 : 0;
	c.fmt_arg = (uintptr_t)arg;
	c.fmt_arg_len = len;
	r = ioctl(fd, HRPERF_IOC_CREATE, &c);
	CHECK(r == -1 && errno == want, "CREATE llc-stack with %s: %d, want errno %d", what, r, want);
	CHECK(ioctl(fd, HRPERF_IOC_START) == -1 && errno == EINVAL, "no session after refusal");
}

/*
 * fmt-llc-stack: bad arguments are refused, never an oops. Then cpu-clock overflows
 * every 200 us for `ms` while one child loops on read(/dev/zero, 64 KiB) (kernel time)
 * and one spins at the bottom of a 10-deep user recursion: kernel stacks start with the
 * ip and are all kernel addresses, the read() child's go through a *read* function of
 * kallsyms and its user stack starts in our text; the spinning child's user stacks
 * have >= 10 frames in our text; comm is the task's.
 */
static void test_llc_stack(unsigned ms)
{
	static const uint32_t ev[] = { PERF_COUNT_SW_CPU_CLOCK };
	struct stk_arg a = { .size = sizeof(a) };
	uint8_t big[32] = { 0 };
	struct stk_tally t = { 0 };
	struct hrperf_cpu_stats st[MAX_SLOTS];
	struct session s;
	pid_t sys, usr;
	uint64_t end, overflows = 0;
	int fd = dev_open(), r;

	CHECK(format_listed(fd, "llc-stack"), "format llc-stack not listed");
	a.max_kernel = 1025;
	stk_create_refused(fd, HRPERF_MODE_OVERFLOW, &a, sizeof(a), EINVAL, "max_kernel 1025");
	a.max_kernel = 0;
	a.max_user = 60000;
	stk_create_refused(fd, HRPERF_MODE_OVERFLOW, &a, sizeof(a), EINVAL, "max_user 60000");
	a.max_user = 0;
	a.flags = 1u << 7;
	stk_create_refused(fd, HRPERF_MODE_OVERFLOW, &a, sizeof(a), EINVAL, "unknown flag");
	a.flags = 0;
	a.data_size = 1ull << 40;
	stk_create_refused(fd, HRPERF_MODE_OVERFLOW, &a, sizeof(a), EINVAL, "data_size 1 TiB");
	a.data_size = 0;
	stk_create_refused(fd, HRPERF_MODE_OVERFLOW, &a, 20, EINVAL, "a 20-byte argument");
	a.size = 12;
	stk_create_refused(fd, HRPERF_MODE_OVERFLOW, &a, sizeof(a), EINVAL, "size != length");
	a.size = sizeof(a);
	memcpy(big, &a, sizeof(a));
	big[0] = sizeof(big);
	big[28] = 1;
	stk_create_refused(fd, HRPERF_MODE_OVERFLOW, big, sizeof(big), E2BIG, "a non-zero tail");
	stk_create_refused(fd, HRPERF_MODE_POLL, &a, sizeof(a), EINVAL, "poll mode");
	stk_create_refused(fd, HRPERF_MODE_INSTRUCTED, &a, sizeof(a), EINVAL, "instructed mode");
	close(fd);
	printf("ok: llc-stack listed; CREATE refused: max_kernel/max_user > 1024, unknown flag, 1 TiB ring, short/mis-sized argument (EINVAL), non-zero tail (E2BIG), poll and instructed mode (EINVAL)\n");

	ksyms_load();
	session_create_fmt(&s, "llc-stack", &a, sizeof(a), HRPERF_MODE_OVERFLOW, ev, 1, 200000, 0, 0);
	r = syscall(SYS_delete_module, "fmt_llc_stack", O_NONBLOCK);
	CHECK(r == -1 && (errno == EBUSY || errno == EWOULDBLOCK), "rmmod fmt_llc_stack with a session open");
	printf("ok: rmmod fmt_llc_stack refused while a session uses it (errno %d %s)\n", errno,
	       strerror(errno));

	sys = fork();
	CHECK(sys >= 0, "fork");
	if (sys == 0) {
		static char buf[65536];
		int z = open("/dev/zero", O_RDONLY);

		for (;;)
			if (read(z, buf, sizeof(buf)) < 0)
				_exit(1);
	}
	usr = fork();
	CHECK(usr >= 0, "fork");
	if (usr == 0)
		spin_depth(9);
	CHECK(ioctl(s.fd, HRPERF_IOC_START) == 0, "START");
	end = now_ns() + (uint64_t)ms * 1000000;
	while (now_ns() < end) {
		struct pollfd p = { .fd = s.fd, .events = POLLIN };

		CHECK(poll(&p, 1, 50) >= 0, "poll");
		for (uint32_t i = 0; i < s.count; i++)
			stk_drain(&s, i, &t, sys, usr);
	}
	CHECK(ioctl(s.fd, HRPERF_IOC_STOP) == 0, "STOP");
	kill(sys, SIGKILL);
	kill(usr, SIGKILL);
	waitpid(sys, NULL, 0);
	waitpid(usr, NULL, 0);
	for (uint32_t i = 0; i < s.count; i++)
		stk_drain(&s, i, &t, sys, usr);
	stats(&s, st);
	for (uint32_t i = 0; i < s.count; i++)
		overflows += st[i].overflows;
	session_close(&s);

	printf("llc-stack: %llu records (%llu overflows, %llu lost, %llu bad); %llu with kernel stacks (%llu frames, deepest %llu, %llu cut); read() child: %llu kernel samples, %llu through a *read* function, %llu with its user stack in our text; user-recursion child: %llu user samples, %llu with >= 10 frames in our text; comm right in %llu\n",
	       (unsigned long long)t.records, (unsigned long long)overflows,
	       (unsigned long long)t.lost, (unsigned long long)t.bad,
	       (unsigned long long)t.kernel_recs, (unsigned long long)t.kernel_frames,
	       (unsigned long long)t.max_kernel, (unsigned long long)t.truncated,
	       (unsigned long long)t.sys_kernel, (unsigned long long)t.sys_read_path,
	       (unsigned long long)t.sys_user_ok, (unsigned long long)t.usr_recs,
	       (unsigned long long)t.usr_deep, (unsigned long long)t.comm_ok);
	printf("llc-stack example: %s\n", t.example);
	CHECK(t.records > 0 && t.bad == 0, "llc-stack records");
	CHECK(t.records + t.lost == overflows, "records + lost != overflows");
	CHECK(t.kernel_recs > 0 && t.kernel_frames > t.kernel_recs, "no kernel stacks deeper than the ip");
	CHECK(t.sys_kernel >= 10 && t.sys_read_path * 4 >= t.sys_kernel * 3,
	      "read() child: kernel stacks not through a read function");
	CHECK(t.sys_user_ok * 10 >= t.sys_kernel * 9, "read() child: user stacks");
	CHECK(t.usr_recs >= 10 && t.usr_deep * 10 >= t.usr_recs * 9, "user recursion stacks");
	printf("ok: llc-stack records carry kernel stacks (via kallsyms: the read path), user frame-pointer stacks and comm\n");
}

int main(int argc, char **argv)
{
	const char *what = argc > 1 ? argv[1] : "";
	unsigned a1 = argc > 2 ? (unsigned)atoi(argv[2]) : 0;
	unsigned a2 = argc > 3 ? (unsigned)atoi(argv[3]) : 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(what, "info"))
		test_info();
	else if (!strcmp(what, "overflow"))
		test_overflow(a1 ? a1 : 1000);
	else if (!strcmp(what, "drops"))
		test_drops();
	else if (!strcmp(what, "poll"))
		test_poll(a1 ? a1 : 1000, a2 ? a2 : 1000);
	else if (!strcmp(what, "instructed"))
		test_instructed(a1 ? a1 : 100);
	else if (!strcmp(what, "mmap"))
		test_mmap();
	else if (!strcmp(what, "busy-format"))
		test_busy_format();
	else if (!strcmp(what, "busy-core"))
		test_busy_core();
	else if (!strcmp(what, "abuse"))
		abuse(a1 ? a1 : 10);
	else if (!strcmp(what, "quick"))
		quick();
	else if (!strcmp(what, "pebs"))
		test_pebs();
	else if (!strcmp(what, "pebs-sim"))
		test_pebs_sim(a1 ? a1 : 1000);
	else if (!strcmp(what, "pebs-busy"))
		test_pebs_busy();
	else if (!strcmp(what, "aggregate"))
		test_aggregate(a1 ? a1 : 1000);
	else if (!strcmp(what, "llc-stack"))
		test_llc_stack(a1 ? a1 : 1000);
	else
		fail("usage: hrperf_test info|overflow|poll|instructed|mmap|busy-format|busy-core|abuse|quick|pebs|pebs-sim|pebs-busy|aggregate|llc-stack");
	return 0;
}
