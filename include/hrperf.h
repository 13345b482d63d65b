/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * hrperf.h - the /dev/hrperf ABI for C: ioctl numbers, argument structs, the per-CPU
 * buffer header, record headers and the delta format's record layout.
 *
 * Mirrors the Rust crate hrperf-abi (core-kmod/abi/src/{ioctl,buffer,record,event,
 * format}.rs) and formats/delta/src/record.rs; every struct's size is asserted below,
 * so a drift between the two fails the C build.
 *
 * ABI rules (hrperf-abi's crate docs): every argument struct starts with `size`, the
 * bytes the caller filled; fields are append-only; zero means the old behaviour; an
 * unknown non-zero tail is rejected with E2BIG, a too-small `size` or a non-zero
 * reserved field with EINVAL; records start with {type, misc, size} and readers skip
 * types they do not know.
 *
 * Use:
 *
 *     int fd = open("/dev/hrperf", O_RDWR);
 *     struct hrperf_session_create c = { .size = sizeof(c), .mode = HRPERF_MODE_OVERFLOW,
 *             .nr_events = 1, .sample_period = 100000 };
 *     strcpy(c.format_name, "delta");
 *     c.events[0] = (struct hrperf_event_desc){ .type = HRPERF_EVENT_TYPE_SOFTWARE,
 *             .config = 0 };                                      // cpu-clock
 *     ioctl(fd, HRPERF_IOC_CREATE, &c);
 *     struct hrperf_buffer_slot slots[64];
 *     struct hrperf_buffers_arg b = { .size = sizeof(b), .count = 64,
 *             .entries = (uintptr_t)slots };
 *     ioctl(fd, HRPERF_IOC_BUFFERS, &b);
 *     void *base = mmap(NULL, b.count * b.buf_size, PROT_READ, MAP_SHARED, fd, 0);
 *     ioctl(fd, HRPERF_IOC_START); ... poll(fd) ... ioctl(fd, HRPERF_IOC_STOP);
 */
#ifndef HRPERF_H
#define HRPERF_H

#include <stdint.h>
#include <linux/ioctl.h>

#define HRPERF_MAX_COUNTERS 8
#define HRPERF_MAX_CPUS 256
#define HRPERF_NAME_LEN 32

/* ---- events (event.rs) ---- */

#define HRPERF_EVENT_TYPE_HARDWARE 0
#define HRPERF_EVENT_TYPE_SOFTWARE 1
#define HRPERF_EVENT_TYPE_HW_CACHE 3
#define HRPERF_EVENT_TYPE_RAW 4
#define HRPERF_EVENT_TYPE_SIM 0x4853494du	/* userspace simulator only */

#define HRPERF_EVENT_FL_USER_ONLY (1u << 0)
#define HRPERF_EVENT_FL_KERNEL_ONLY (1u << 1)
#define HRPERF_EVENT_FL_PRECISE (1u << 2)	/* precise_ip in bits 8..9 */

struct hrperf_event_desc {
	uint32_t type;		/* PERF_TYPE_* */
	uint32_t flags;		/* HRPERF_EVENT_FL_* */
	uint64_t config;
	uint64_t config1;
	uint64_t config2;
};

struct hrperf_cpu_mask {
	uint64_t bits[HRPERF_MAX_CPUS / 64];	/* CPU 0 in bit 0 of word 0 */
};

struct hrperf_uuid {
	uint8_t b[16];
};

/* ---- session modes and format-ops constants (format.rs) ---- */

#define HRPERF_MODE_OVERFLOW 0u
#define HRPERF_MODE_POLL 1u
#define HRPERF_MODE_INSTRUCTED 2u
#define HRPERF_MODE_DEFAULT 0xffffffffu	/* the module's mode= */

#define HRPERF_FMT_FL_PEBS (1u << 0)
#define HRPERF_FMT_FL_RING (1u << 1)
#define HRPERF_FMT_FL_STACKS (1u << 2)
#define HRPERF_FMT_FL_INTERVALS (1u << 3)

/* ---- ioctl arguments (ioctl.rs) ---- */

#define HRPERF_IOCTL_ABI_VERSION 1

struct hrperf_module_info {
	uint32_t size;
	uint32_t abi_version;
	uint32_t module_version;	/* major << 16 | minor << 8 | patch */
	uint32_t default_mode;
	uint32_t poll_us;
	uint32_t nr_formats;
	uint32_t nr_sessions;
	uint32_t nr_cpus;
	uint64_t total_drops;
	uint32_t pebs_state;		/* HRPERF_PEBS_* */
	uint32_t pebs_format;		/* the detected PebsFormat word */
	uint32_t pebs_refusal;		/* HRPERF_PEBS_* of the last refused PEBS session */
	uint32_t pebs_refusal_cpu;	/* the CPU it names, UINT32_MAX: none */
	uint64_t pebs_refusal_value;	/* the MSR value behind it */
	uint32_t tsc_khz;
	uint32_t reserved;
};

/* hrperf_module_info.pebs_state / pebs_refusal (hrperf_abi::ioctl::pebs_state) */
#define HRPERF_PEBS_UNKNOWN		0
#define HRPERF_PEBS_HARDWARE		1
#define HRPERF_PEBS_SIMULATED		2
#define HRPERF_PEBS_NO_PMU		10
#define HRPERF_PEBS_NOT_INTEL		11
#define HRPERF_PEBS_NO_DEBUG_STORE	12
#define HRPERF_PEBS_NO_DTES64		13
#define HRPERF_PEBS_UNAVAILABLE		14
#define HRPERF_PEBS_UNKNOWN_FORMAT	15
#define HRPERF_PEBS_NO_ARCH_PERFMON	16
#define HRPERF_PEBS_HYBRID		17
#define HRPERF_PEBS_KPTI		18
#define HRPERF_PEBS_MSR_UNREADABLE	19
#define HRPERF_PEBS_IN_USE		20
#define HRPERF_PEBS_NO_FREE_COUNTER	21
#define HRPERF_PEBS_CONFLICT		22
#define HRPERF_PEBS_BAD_EVENT		23

struct hrperf_format_info {
	char name[HRPERF_NAME_LEN];
	struct hrperf_uuid uuid;
	uint32_t version;
	uint32_t flags;
	uint32_t arg_size;
	uint32_t users;
};

struct hrperf_format_list {
	uint32_t size;
	uint32_t capacity;	/* in: room in entries */
	uint32_t count;		/* out: formats registered */
	uint32_t reserved;
	uint64_t entries;	/* struct hrperf_format_info * */
};

struct hrperf_session_create {
	uint32_t size;
	uint32_t flags;		/* zero */
	char format_name[HRPERF_NAME_LEN];	/* or all zero: by format_uuid */
	struct hrperf_uuid format_uuid;
	uint32_t mode;		/* HRPERF_MODE_* */
	uint32_t nr_events;	/* 1..8, leader first */
	struct hrperf_event_desc events[HRPERF_MAX_COUNTERS];
	uint64_t sample_period;	/* overflow mode */
	uint64_t poll_interval_ns;	/* poll mode; 0: poll_us= */
	struct hrperf_cpu_mask cpus;	/* empty: all online CPUs */
	uint64_t data_size;	/* per-CPU data area hint; 0: the format's default */
	uint32_t fmt_arg_len;
	uint32_t reserved0;
	uint64_t fmt_arg;	/* const void * */
	uint64_t reserved[4];
};

struct hrperf_cpu_arg {
	uint32_t size;
	uint32_t cpu;		/* 0xffffffff: all CPUs of the session */
};

struct hrperf_cpu_stats {
	uint32_t cpu;
	uint32_t masked_now;
	uint64_t records;
	uint64_t drops;
	uint64_t overflows;
	uint64_t masked;
	uint64_t multi_wraps;
	uint64_t poll_ticks;
	uint64_t missed_ticks;
};

struct hrperf_stats_arg {
	uint32_t size;
	uint32_t count;		/* in: room; out: CPUs in the session */
	uint64_t entries;	/* struct hrperf_cpu_stats * */
};

struct hrperf_buffer_slot {
	uint32_t cpu;
	uint32_t reserved;
	uint64_t offset;	/* of its struct hrperf_buffer_header in the mapping */
};

struct hrperf_buffers_arg {
	uint32_t size;
	uint32_t count;		/* in: room; out: buffers */
	uint64_t buf_size;	/* out: bytes per buffer (page multiple) */
	uint64_t entries;	/* struct hrperf_buffer_slot * */
};

struct hrperf_consume_arg {
	uint32_t size;
	uint32_t cpu;
	uint64_t tail;		/* new consumer position, <= the buffer's head */
};

#define HRPERF_IOC_MAGIC 'H'
#define HRPERF_IOC_INFO _IOWR(HRPERF_IOC_MAGIC, 0x00, struct hrperf_module_info)
#define HRPERF_IOC_FORMATS _IOWR(HRPERF_IOC_MAGIC, 0x01, struct hrperf_format_list)
#define HRPERF_IOC_CREATE _IOW(HRPERF_IOC_MAGIC, 0x02, struct hrperf_session_create)
#define HRPERF_IOC_START _IO(HRPERF_IOC_MAGIC, 0x03)
#define HRPERF_IOC_STOP _IO(HRPERF_IOC_MAGIC, 0x04)
#define HRPERF_IOC_RESTART _IOW(HRPERF_IOC_MAGIC, 0x05, struct hrperf_cpu_arg)
#define HRPERF_IOC_DESTROY _IO(HRPERF_IOC_MAGIC, 0x06)
#define HRPERF_IOC_STATS _IOWR(HRPERF_IOC_MAGIC, 0x07, struct hrperf_stats_arg)
#define HRPERF_IOC_BUFFERS _IOWR(HRPERF_IOC_MAGIC, 0x08, struct hrperf_buffers_arg)
#define HRPERF_IOC_CONSUME _IOW(HRPERF_IOC_MAGIC, 0x09, struct hrperf_consume_arg)
#define HRPERF_IOC_POLL _IO(HRPERF_IOC_MAGIC, 0x10)
#define HRPERF_IOC_LOG _IO(HRPERF_IOC_MAGIC, 0x11)
#define HRPERF_IOC_POLL_LOG _IO(HRPERF_IOC_MAGIC, 0x12)

/* ---- the per-CPU buffer (buffer.rs) ---- */

#define HRPERF_BUFFER_MAGIC 0x42505248u	/* "HRPB" */
#define HRPERF_BUFFER_VERSION 1

struct hrperf_buffer_header {
	uint32_t magic;
	uint32_t version;
	uint32_t header_size;
	uint32_t cpu;
	struct hrperf_uuid format_uuid;
	uint64_t buf_size;
	uint64_t data_offset;
	uint64_t data_size;	/* a power of two for ring formats */
	uint64_t head;		/* producer, monotonic bytes: load with acquire */
	uint64_t tail;		/* consumer (set through HRPERF_IOC_CONSUME) */
	uint64_t records;
	uint64_t drops;
	uint64_t overflows;
	uint64_t masked;
	uint64_t multi_wraps;
	uint64_t notify_seq;
	uint64_t reserved[1];
};

/* ---- records (record.rs) ---- */

struct hrperf_record_header {
	uint32_t type;		/* HRPERF_RECORD_* ; skip unknown types */
	uint16_t misc;		/* HRPERF_MISC_* */
	uint16_t size;		/* header included, a multiple of 8 */
};

#define HRPERF_RECORD_PAD 0u
#define HRPERF_RECORD_LOST 1u
#define HRPERF_RECORD_DELTA 0x1000u

#define HRPERF_MISC_OVERFLOW (1u << 0)
#define HRPERF_MISC_POLL (1u << 1)
#define HRPERF_MISC_INSTRUCTED (1u << 2)
#define HRPERF_MISC_KERNEL (1u << 3)
#define HRPERF_MISC_MULTI_WRAP (1u << 4)
#define HRPERF_MISC_TRUNCATED (1u << 5)

struct hrperf_lost_record {
	struct hrperf_record_header header;
	uint64_t lost;
};

/* ---- the delta format (formats/delta/src/record.rs, lib.rs) ---- */

struct hrperf_delta_record {
	struct hrperf_record_header header;	/* size = 40 + 8 * nr */
	uint32_t cpu;
	uint32_t pid;
	uint32_t tid;
	uint8_t nr;
	uint8_t ovfl_counter;	/* 0xff for poll/instructed */
	uint8_t multi_wrap;
	uint8_t reserved;
	uint64_t time_ns;	/* this CPU's own read time */
	uint64_t ip;
	uint64_t deltas[];	/* nr of them */
};

struct hrperf_delta_arg {
	uint32_t size;		/* 16 */
	uint32_t flags;		/* 0 */
	uint64_t data_size;	/* ring bytes; 0: default (256 KiB) */
};

#define HRPERF_ASSERT_SIZE(t, n) _Static_assert(sizeof(t) == (n), "sizeof(" #t ") != " #n)
HRPERF_ASSERT_SIZE(struct hrperf_event_desc, 32);
HRPERF_ASSERT_SIZE(struct hrperf_cpu_mask, 32);
HRPERF_ASSERT_SIZE(struct hrperf_uuid, 16);
HRPERF_ASSERT_SIZE(struct hrperf_module_info, 72);
HRPERF_ASSERT_SIZE(struct hrperf_format_info, 64);
HRPERF_ASSERT_SIZE(struct hrperf_format_list, 24);
HRPERF_ASSERT_SIZE(struct hrperf_session_create, 424);
HRPERF_ASSERT_SIZE(struct hrperf_cpu_arg, 8);
HRPERF_ASSERT_SIZE(struct hrperf_cpu_stats, 64);
HRPERF_ASSERT_SIZE(struct hrperf_stats_arg, 16);
HRPERF_ASSERT_SIZE(struct hrperf_buffer_slot, 16);
HRPERF_ASSERT_SIZE(struct hrperf_buffers_arg, 24);
HRPERF_ASSERT_SIZE(struct hrperf_consume_arg, 16);
HRPERF_ASSERT_SIZE(struct hrperf_buffer_header, 128);
HRPERF_ASSERT_SIZE(struct hrperf_record_header, 8);
HRPERF_ASSERT_SIZE(struct hrperf_lost_record, 16);
HRPERF_ASSERT_SIZE(struct hrperf_delta_record, 40);
HRPERF_ASSERT_SIZE(struct hrperf_delta_arg, 16);
_Static_assert(__builtin_offsetof(struct hrperf_buffer_header, head) == 56, "head offset");
_Static_assert(__builtin_offsetof(struct hrperf_session_create, events) == 64, "events offset");
_Static_assert(__builtin_offsetof(struct hrperf_delta_record, time_ns) == 24, "time_ns offset");
_Static_assert(HRPERF_IOC_START == 0x4803, "_IO('H', 3)");
_Static_assert(HRPERF_IOC_RESTART == 0x40084805, "_IOW('H', 5, 8 bytes)");
#undef HRPERF_ASSERT_SIZE

#endif /* HRPERF_H */
