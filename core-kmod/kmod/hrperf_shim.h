/* SPDX-License-Identifier: GPL-2.0 */
/*
 * hrperf_shim.h - the interface between hrperf_shim.c and the Rust side of
 * hrperf-core.ko (shim.rs declares the same functions and structs).
 */
#ifndef HRPERF_SHIM_H
#define HRPERF_SHIM_H

#include <linux/mm_types.h>
#include <linux/perf_event.h>
#include <linux/smp.h>
#include <linux/types.h>

struct hrperf_file;
struct hrperf_format_ops;	/* FormatOps of hrperf-abi, opaque to C */

/* What the overflow trampoline hands to Rust (struct OverflowInfo in shim.rs). */
struct hrperf_ovf {
	u64 ip;
	u64 time_ns;
	u32 pid;
	u32 tid;
	u32 kernel;
	u32 reserved;
	struct pt_regs *regs;	/* the interrupted context; valid during the call only */
};

/* The counter description Rust passes (struct CounterAttr in shim.rs). */
struct hrperf_counter_attr {
	u32 type;
	u32 exclude_user;
	u32 exclude_kernel;
	u32 precise_ip;
	u64 config;
	u64 config1;
	u64 config2;
	u64 sample_period;
};

/* What hrperf-core reads about the CPU for PEBS (struct CpuFacts in shim.rs). */
struct hrperf_cpu_facts {
	u32 intel;
	u32 family;
	u32 model;
	u32 ds;
	u32 dtes64;
	u32 pdcm;
	u32 hybrid;
	u32 pti;
	u32 misc_enable_ok;
	u32 perf_caps_ok;
	u64 misc_enable;
	u64 perf_caps;
	u32 cpuid_0a_eax;	/* version [7:0], GP counters [15:8], width [23:16] */
	u32 tsc_khz;
};

/* Implemented in Rust (shim.rs). */
int hrperf_rs_open(struct hrperf_file *hf, void **rs);
void hrperf_rs_release(void *rs);
long hrperf_rs_ioctl(void *rs, unsigned int cmd, unsigned long arg);
int hrperf_rs_mmap(void *rs, struct vm_area_struct *vma, unsigned long start,
		   unsigned long len, unsigned long pgoff);
int hrperf_rs_poll(void *rs);
void hrperf_rs_overflow(void *ctx, const struct hrperf_ovf *o);
int hrperf_rs_pebs_pmi(const struct hrperf_ovf *o);
int hrperf_register_format(const struct hrperf_format_ops *ops);
int hrperf_unregister_format(const struct hrperf_format_ops *ops);

/* Implemented in hrperf_shim.c, called from Rust. */
const char *hrperf_shim_param_mode(void);
u32 hrperf_shim_param_poll_us(void);
int hrperf_shim_dev_register(void);
void hrperf_shim_dev_unregister(void);
void hrperf_shim_notify(struct hrperf_file *hf);
int hrperf_shim_map(struct vm_area_struct *vma, unsigned long uaddr, void *kaddr,
		    unsigned long len);
int hrperf_shim_counter_create(u32 cpu, const struct hrperf_counter_attr *a, void *ctx,
			       struct perf_event **out);
void hrperf_shim_counter_release(struct perf_event *ev);
void hrperf_shim_counter_enable(struct perf_event *ev);
void hrperf_shim_counter_disable(struct perf_event *ev);
int hrperf_shim_hw_pmu_present(void);
u64 hrperf_shim_counter_read_local(struct perf_event *ev);
u32 hrperf_shim_this_cpu(void);
u32 hrperf_shim_nr_cpu_ids(void);
u32 hrperf_shim_num_online_cpus(void);
int hrperf_shim_cpu_online(u32 cpu);
u64 hrperf_shim_clock_ns(void);
int hrperf_shim_on_cpu(u32 cpu, smp_call_func_t fn, void *info);
void hrperf_shim_on_cpus(const u64 *bits, smp_call_func_t fn, void *info);
struct task_struct *hrperf_shim_thread_start(int (*fn)(void *), void *data);
void hrperf_shim_thread_stop(struct task_struct *t);
int hrperf_shim_thread_should_stop(void);
void hrperf_shim_sleep_ns(u64 ns);
void *hrperf_shim_vzalloc(unsigned long size);
void hrperf_shim_vfree(void *p);
int hrperf_shim_module_get(struct module *m);
void hrperf_shim_module_put(struct module *m);
u32 hrperf_shim_kernel_stack(struct pt_regs *regs, u64 *out, u32 max);
int hrperf_shim_user_regs(struct pt_regs *regs, u64 *ip, u64 *bp);
u32 hrperf_shim_comm(char *out, u32 len);
const char *hrperf_shim_param_pebs_sim(void);
u64 hrperf_shim_param_pebs_sim_busy(void);
void hrperf_shim_cpu_facts(struct hrperf_cpu_facts *f);
int hrperf_shim_rdmsr(u32 msr, u64 *val);
int hrperf_shim_wrmsr(u32 msr, u64 val);
u64 hrperf_shim_hw_event_config(u32 id);
int hrperf_shim_pebs_nmi_register(void);
void hrperf_shim_pebs_nmi_unregister(void);
void hrperf_shim_gprs(struct pt_regs *regs, u64 *out);

#endif /* HRPERF_SHIM_H */
