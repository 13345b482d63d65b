// SPDX-License-Identifier: GPL-2.0
/*
 * hrperf_shim.c - the C half of hrperf-core.ko: only what the 6.12 `kernel` crate
 * lacks. Everything with logic in it lives in Rust (hrperf_core.rs and the engine);
 * this file is thin wrappers, each called from one Rust module (shim.rs).
 *
 *   - module parameters (6.12's module! has no params)
 *   - the /dev/hrperf char device: cdev + class + device_type, because only a
 *     device_type's devnode() can give a devtmpfs node a group (dev_gid=), which a
 *     misc device cannot; file_operations incl. mmap, poll, unlocked_ioctl
 *   - reader wakeups: a waitqueue kicked through irq_work (NMI-safe)
 *   - perf kernel counters (perf_event.h is not in the Rust bindings) and the
 *     overflow-handler trampoline
 *   - cross-CPU calls, the poll kthread, local_clock(), vmalloc + vm_insert_page
 *   - try_module_get/module_put on a format's owner, EXPORT_SYMBOL_GPL of the
 *     format registration functions (implemented in Rust)
 *   - stack services for FMT_FL_STACKS formats: the kernel unwinder (x86-64), the user
 *     registers (task_pt_regs, user_mode are arch macros/inlines), current->comm
 *   - zero-copy PEBS (FMT_FL_PEBS formats): CPU facts (boot_cpu_data, cpufeature
 *     macros, CPUID), rdmsrl_safe/wrmsrl_safe, perf's generic-event encodings, and the
 *     PMI: an NMI_LOCAL handler registered first, so it acknowledges its own status bits
 *     before perf's handler runs
 */

#include <linux/cdev.h>
#include <linux/cpumask.h>
#include <linux/device.h>
#include <linux/err.h>
#include <linux/fs.h>
#include <linux/hrtimer.h>
#include <linux/irq_work.h>
#include <linux/kthread.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/perf_event.h>
#include <linux/poll.h>
#include <linux/sched.h>
#include <linux/sched/clock.h>
#include <linux/slab.h>
#include <linux/smp.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>
#include <asm/cpufeature.h>
#include <asm/msr.h>
#include <asm/nmi.h>
#include <asm/processor.h>
#include <asm/tsc.h>
#include <asm/unwind.h>

#include "hrperf_shim.h"

/* ---- module parameters ------------------------------------------------------ */

static ushort dev_mode = 0600;
module_param(dev_mode, ushort, 0444);
MODULE_PARM_DESC(dev_mode, "permissions of /dev/hrperf (default 0600)");

static uint dev_gid;
module_param(dev_gid, uint, 0444);
MODULE_PARM_DESC(dev_gid, "group of /dev/hrperf (default 0, root)");

static char *mode = "overflow";
module_param(mode, charp, 0444);
MODULE_PARM_DESC(mode, "default session mode: overflow|poll|instructed");

static uint poll_us = 1000;
module_param(poll_us, uint, 0444);
MODULE_PARM_DESC(poll_us, "default poll interval in microseconds (poll mode)");

static char *pebs_sim = "";
module_param(pebs_sim, charp, 0444);
MODULE_PARM_DESC(pebs_sim, "simulated PEBS PMU instead of the CPU's: fmt0|fmt1|fmt2|fmt3|adaptive (default: off)");

static ulong pebs_sim_busy;
module_param(pebs_sim_busy, ulong, 0444);
MODULE_PARM_DESC(pebs_sim_busy, "simulated PMU: CPUs (bit mask) where perf has PEBS events");

const char *hrperf_shim_param_mode(void) { return mode ? mode : ""; }
const char *hrperf_shim_param_pebs_sim(void) { return pebs_sim ? pebs_sim : ""; }
u64 hrperf_shim_param_pebs_sim_busy(void) { return pebs_sim_busy; }
u32 hrperf_shim_param_poll_us(void) { return poll_us; }

EXPORT_SYMBOL_GPL(hrperf_register_format);
EXPORT_SYMBOL_GPL(hrperf_unregister_format);

/* ---- one open file ------------------------------------------------------------- */

struct hrperf_file {
	wait_queue_head_t wq;
	struct irq_work work;
	void *rs;
};

static void hrperf_wake(struct irq_work *work)
{
	struct hrperf_file *hf = container_of(work, struct hrperf_file, work);

	wake_up_interruptible_all(&hf->wq);
}

/* Wakes the file's poll() waiters; safe from any context, NMI included. */
void hrperf_shim_notify(struct hrperf_file *hf)
{
	irq_work_queue(&hf->work);
}

static int hrperf_open(struct inode *inode, struct file *file)
{
	struct hrperf_file *hf;
	int ret;

	hf = kzalloc(sizeof(*hf), GFP_KERNEL);
	if (!hf)
		return -ENOMEM;
	init_waitqueue_head(&hf->wq);
	init_irq_work(&hf->work, hrperf_wake);
	ret = hrperf_rs_open(hf, &hf->rs);
	if (ret) {
		kfree(hf);
		return ret;
	}
	file->private_data = hf;
	return nonseekable_open(inode, file);
}

static int hrperf_release(struct inode *inode, struct file *file)
{
	struct hrperf_file *hf = file->private_data;

	hrperf_rs_release(hf->rs);	/* stops the session: nothing queues work now */
	irq_work_sync(&hf->work);
	kfree(hf);
	return 0;
}

static long hrperf_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct hrperf_file *hf = file->private_data;

	return hrperf_rs_ioctl(hf->rs, cmd, arg);
}

static __poll_t hrperf_poll(struct file *file, poll_table *pt)
{
	struct hrperf_file *hf = file->private_data;

	poll_wait(file, &hf->wq, pt);
	return hrperf_rs_poll(hf->rs) ? EPOLLIN | EPOLLRDNORM : 0;
}

/* Buffers are mapped read-only: refuse PROT_WRITE now and mprotect() later. */
static int hrperf_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct hrperf_file *hf = file->private_data;

	if (vma->vm_flags & VM_WRITE)
		return -EPERM;
	vm_flags_clear(vma, VM_MAYWRITE);
	vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
	return hrperf_rs_mmap(hf->rs, vma, vma->vm_start, vma->vm_end - vma->vm_start,
			      vma->vm_pgoff);
}

/* Inserts the vmalloc pages [kaddr, kaddr + len) at uaddr (both page-aligned). */
int hrperf_shim_map(struct vm_area_struct *vma, unsigned long uaddr, void *kaddr,
		    unsigned long len)
{
	unsigned long off;
	int ret;

	for (off = 0; off < len; off += PAGE_SIZE) {
		ret = vm_insert_page(vma, uaddr + off, vmalloc_to_page(kaddr + off));
		if (ret)
			return ret;
	}
	return 0;
}

static const struct file_operations hrperf_fops = {
	.owner = THIS_MODULE,
	.open = hrperf_open,
	.release = hrperf_release,
	.unlocked_ioctl = hrperf_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.poll = hrperf_poll,
	.mmap = hrperf_mmap,
};

/* ---- /dev/hrperf ---------------------------------------------------------------- */

static char *hrperf_devnode(const struct device *dev, umode_t *m, kuid_t *uid, kgid_t *gid)
{
	if (m)
		*m = dev_mode & 0777;
	if (gid)
		*gid = KGIDT_INIT(dev_gid);
	return NULL;
}

static void hrperf_dev_release(struct device *dev) { }

static const struct device_type hrperf_devtype = {
	.name = "hrperf",
	.devnode = hrperf_devnode,
};

static const struct class hrperf_class = { .name = "hrperf" };
static struct device hrperf_dev;
static struct cdev hrperf_cdev;
static dev_t hrperf_devt;

int hrperf_shim_dev_register(void)
{
	int ret;

	ret = alloc_chrdev_region(&hrperf_devt, 0, 1, "hrperf");
	if (ret)
		return ret;
	ret = class_register(&hrperf_class);
	if (ret)
		goto out_region;
	device_initialize(&hrperf_dev);
	hrperf_dev.devt = hrperf_devt;
	hrperf_dev.class = &hrperf_class;
	hrperf_dev.type = &hrperf_devtype;
	hrperf_dev.release = hrperf_dev_release;
	ret = dev_set_name(&hrperf_dev, "hrperf");
	if (ret)
		goto out_put;
	cdev_init(&hrperf_cdev, &hrperf_fops);
	hrperf_cdev.owner = THIS_MODULE;
	ret = cdev_device_add(&hrperf_cdev, &hrperf_dev);
	if (ret)
		goto out_put;
	return 0;
out_put:
	put_device(&hrperf_dev);
	class_unregister(&hrperf_class);
out_region:
	unregister_chrdev_region(hrperf_devt, 1);
	return ret;
}

void hrperf_shim_dev_unregister(void)
{
	cdev_device_del(&hrperf_cdev, &hrperf_dev);
	put_device(&hrperf_dev);
	class_unregister(&hrperf_class);
	unregister_chrdev_region(hrperf_devt, 1);
}

/* ---- perf kernel counters ---------------------------------------------------------- */

/* perf's overflow callback: NMI or IRQ context (or wherever a software event fires). */
static void hrperf_overflow(struct perf_event *event, struct perf_sample_data *data,
			    struct pt_regs *regs)
{
	struct hrperf_ovf o = {
		.ip = regs ? instruction_pointer(regs) : 0,
		.time_ns = local_clock(),
		.pid = current->tgid,
		.tid = current->pid,
		.kernel = regs ? !user_mode(regs) : 1,
		.regs = regs,
	};

	hrperf_rs_overflow(event->overflow_handler_context, &o);
}

/*
 * A pinned per-CPU counter, created disabled. With a sample period, overflows go to
 * hrperf_rs_overflow(ctx, ...) on that CPU; without one it only counts.
 */
int hrperf_shim_counter_create(u32 cpu, const struct hrperf_counter_attr *a, void *ctx,
			       struct perf_event **out)
{
	struct perf_event_attr attr = {
		.type = a->type,
		.size = sizeof(attr),
		.config = a->config,
		.config1 = a->config1,
		.config2 = a->config2,
		.sample_period = a->sample_period,
		.pinned = 1,
		.disabled = 1,
		.exclude_user = !!a->exclude_user,
		.exclude_kernel = !!a->exclude_kernel,
		.precise_ip = a->precise_ip & 3,
	};
	struct perf_event *ev;

	ev = perf_event_create_kernel_counter(&attr, cpu, NULL,
					      a->sample_period ? hrperf_overflow : NULL,
					      a->sample_period ? ctx : NULL);
	if (IS_ERR(ev))
		return PTR_ERR(ev);
	*out = ev;
	return 0;
}

void hrperf_shim_counter_release(struct perf_event *ev) { perf_event_release_kernel(ev); }
void hrperf_shim_counter_enable(struct perf_event *ev) { perf_event_enable(ev); }
void hrperf_shim_counter_disable(struct perf_event *ev) { perf_event_disable(ev); }

/*
 * Whether a hardware PMU is registered: a disabled PERF_TYPE_HARDWARE cycles counter
 * can be created on this CPU (fails with -ENOENT when only software events exist).
 */
int hrperf_shim_hw_pmu_present(void)
{
	struct perf_event_attr attr = {
		.type = PERF_TYPE_HARDWARE,
		.size = sizeof(attr),
		.config = PERF_COUNT_HW_CPU_CYCLES,
		.disabled = 1,
	};
	struct perf_event *ev;

	ev = perf_event_create_kernel_counter(&attr, raw_smp_processor_id(), NULL, NULL, NULL);
	if (IS_ERR(ev))
		return 0;
	perf_event_release_kernel(ev);
	return 1;
}

/*
 * The counter's 64-bit count, read on its own CPU: what perf_event_read_local() does
 * (not exported in 6.12) for a per-CPU, non-inherited event. IRQ and NMI safe.
 */
u64 hrperf_shim_counter_read_local(struct perf_event *ev)
{
	unsigned long flags;
	u64 v;

	local_irq_save(flags);
	if (READ_ONCE(ev->oncpu) == smp_processor_id() &&
	    READ_ONCE(ev->state) == PERF_EVENT_STATE_ACTIVE)
		ev->pmu->read(ev);
	v = local64_read(&ev->count);
	local_irq_restore(flags);
	return v;
}

/* ---- CPUs, clock, cross calls -------------------------------------------------------- */

u32 hrperf_shim_this_cpu(void) { return raw_smp_processor_id(); }
u32 hrperf_shim_nr_cpu_ids(void) { return nr_cpu_ids; }
u32 hrperf_shim_num_online_cpus(void) { return num_online_cpus(); }
int hrperf_shim_cpu_online(u32 cpu) { return cpu < nr_cpu_ids && cpu_online(cpu); }
u64 hrperf_shim_clock_ns(void) { return local_clock(); }

/* Runs fn(info) on `cpu` with IRQs off and waits; 0 or -ENXIO (offline). */
int hrperf_shim_on_cpu(u32 cpu, smp_call_func_t fn, void *info)
{
	return smp_call_function_single(cpu, fn, info, 1);
}

/* Runs fn(info) on every online CPU in `bits` (256 bits, CPU 0 in bit 0) and waits. */
void hrperf_shim_on_cpus(const u64 *bits, smp_call_func_t fn, void *info)
{
	struct cpumask mask;
	unsigned int cpu;

	cpumask_clear(&mask);
	for (cpu = 0; cpu < nr_cpu_ids && cpu < 256; cpu++)
		if (bits[cpu / 64] & (1ULL << (cpu % 64)))
			cpumask_set_cpu(cpu, &mask);
	on_each_cpu_mask(&mask, fn, info, true);
}

/* ---- the poll thread -------------------------------------------------------------------- */

struct task_struct *hrperf_shim_thread_start(int (*fn)(void *), void *data)
{
	struct task_struct *t = kthread_run(fn, data, "hrperf-poll");

	return IS_ERR(t) ? NULL : t;
}

void hrperf_shim_thread_stop(struct task_struct *t) { kthread_stop(t); }
int hrperf_shim_thread_should_stop(void) { return kthread_should_stop(); }

/* Sleeps about `ns` (hrtimer, 5% or at least 1 us of slack); kthread_stop() wakes it. */
void hrperf_shim_sleep_ns(u64 ns)
{
	ktime_t t = ns_to_ktime(ns);

	set_current_state(TASK_INTERRUPTIBLE);
	schedule_hrtimeout_range(&t, max_t(u64, ns / 20, 1000), HRTIMER_MODE_REL);
}

/* ---- memory, modules ---------------------------------------------------------------------- */

/* Zeroed, page-aligned vmalloc memory; NULL (quietly) if there is none. */
void *hrperf_shim_vzalloc(unsigned long size)
{
	return __vmalloc(size, GFP_KERNEL | __GFP_ZERO | __GFP_NOWARN);
}

void hrperf_shim_vfree(void *p) { vfree(p); }

int hrperf_shim_module_get(struct module *m) { return try_module_get(m); }
void hrperf_shim_module_put(struct module *m) { module_put(m); }

/* ---- stacks (FMT_FL_STACKS formats; overflow handler context) ------------------------------- */

/*
 * The kernel stack of a kernel-mode sample into out[0..max], innermost first (0 frames
 * for a user-mode one). stack_trace_save_regs() is not exported in 6.12, so this is its
 * loop (arch_stack_walk) on the exported unwinder, started like perf_callchain_kernel():
 * at the regs of a real interrupt, else (a software event's caller regs) at their sp.
 */
u32 hrperf_shim_kernel_stack(struct pt_regs *regs, u64 *out, u32 max)
{
	struct unwind_state state;
	unsigned long addr;
	u32 n = 0;

	if (!regs || user_mode(regs) || !max)
		return 0;
	out[n++] = regs->ip;
	if (regs->flags & X86_EFLAGS_FIXED)
		unwind_start(&state, current, regs, NULL);
	else
		unwind_start(&state, current, NULL, (unsigned long *)regs->sp);
	for (; n < max && !unwind_done(&state); unwind_next_frame(&state)) {
		addr = unwind_get_return_address(&state);
		if (!addr)
			break;
		out[n++] = addr;
	}
	return n;
}

/*
 * The interrupted task's user ip and frame pointer, found as perf's callchain code does:
 * the sampled regs, or for a kernel-mode sample the task's saved user regs. 0 for
 * kernel threads and user workers (no user stack); *bp = 0 for a 32-bit task (its
 * frames are 4-byte: only the ip is given).
 */
int hrperf_shim_user_regs(struct pt_regs *regs, u64 *ip, u64 *bp)
{
	if (!regs || !is_user_task(current))
		return 0;
	if (!user_mode(regs))
		regs = task_pt_regs(current);
	*ip = regs->ip;
	*bp = user_64bit_mode(regs) ? regs->bp : 0;
	return 1;
}

/*
 * current->comm, NUL-padded to len bytes; returns the name's length. No task_lock (as
 * __get_task_comm takes): not IRQ/NMI safe. bpf_get_current_comm() reads it like this;
 * a racing rename may mix two names, still NUL-terminated. (Not read from Rust: the
 * bindgen layout of task_struct gave garbage here.)
 */
u32 hrperf_shim_comm(char *out, u32 len)
{
	ssize_t n;

	if (!len)
		return 0;
	n = strscpy_pad(out, current->comm, len);
	return n < 0 ? len - 1 : n;
}

/* ---- zero-copy PEBS (FMT_FL_PEBS formats) -------------------------------------------------- */

/* What PEBS detection needs; the decisions are Rust's (hrperf_fmt_pebs::coexist). */
void hrperf_shim_cpu_facts(struct hrperf_cpu_facts *f)
{
	struct cpuinfo_x86 *c = &boot_cpu_data;
	unsigned int eax = 0, ebx, ecx, edx;

	memset(f, 0, sizeof(*f));
	f->intel = c->x86_vendor == X86_VENDOR_INTEL;
	f->family = c->x86;
	f->model = c->x86_model;
	f->ds = boot_cpu_has(X86_FEATURE_DS);
	f->dtes64 = boot_cpu_has(X86_FEATURE_DTES64);
	f->pdcm = boot_cpu_has(X86_FEATURE_PDCM);
	f->hybrid = boot_cpu_has(X86_FEATURE_HYBRID_CPU);
	f->pti = boot_cpu_has(X86_FEATURE_PTI);
	if (f->intel && f->ds) {
		f->misc_enable_ok = !rdmsrl_safe(MSR_IA32_MISC_ENABLE, &f->misc_enable);
		if (f->pdcm)
			f->perf_caps_ok = !rdmsrl_safe(MSR_IA32_PERF_CAPABILITIES, &f->perf_caps);
	}
	if (boot_cpu_has(X86_FEATURE_ARCH_PERFMON) && c->cpuid_level >= 0xa)
		cpuid(0xa, &eax, &ebx, &ecx, &edx);
	f->cpuid_0a_eax = eax;
	f->tsc_khz = tsc_khz;
}

/* MSR access on this CPU that a missing MSR cannot oops: 0 or -EIO. */
int hrperf_shim_rdmsr(u32 msr, u64 *val) { return rdmsrl_safe(msr, val); }
int hrperf_shim_wrmsr(u32 msr, u64 val) { return wrmsrl_safe(msr, val); }

/* perf's raw encoding of generic hardware event `id` (PERF_COUNT_HW_*), 0 if none. */
u64 hrperf_shim_hw_event_config(u32 id) { return perf_get_hw_event_config(id); }

/*
 * The threshold PMI arrives as an NMI (perf programs LVTPC to deliver NMIs, and unmasks
 * it in its own handler, which runs after this one). NMI_FLAG_FIRST: acknowledge our
 * status bits before perf's handler reads and acknowledges everything it sees.
 */
static int hrperf_pebs_nmi(unsigned int cmd, struct pt_regs *regs)
{
	struct hrperf_ovf o = {
		.ip = instruction_pointer(regs),
		.time_ns = local_clock(),
		.pid = current->tgid,
		.tid = current->pid,
		.kernel = !user_mode(regs),
		.regs = regs,
	};

	return hrperf_rs_pebs_pmi(&o) ? NMI_HANDLED : NMI_DONE;
}

int hrperf_shim_pebs_nmi_register(void)
{
	return register_nmi_handler(NMI_LOCAL, hrperf_pebs_nmi, NMI_FLAG_FIRST, "hrperf_pebs");
}

/* Returns once no CPU runs the handler any more (synchronize_rcu inside). */
void hrperf_shim_pebs_nmi_unregister(void) { unregister_nmi_handler(NMI_LOCAL, "hrperf_pebs"); }

/* flags, ip, ax, cx, dx, bx, sp, bp, si, di, r8..r15: the PEBS GPR group's order. */
void hrperf_shim_gprs(struct pt_regs *regs, u64 *out)
{
	const u64 w[18] = {
		regs->flags, regs->ip, regs->ax, regs->cx, regs->dx, regs->bx, regs->sp,
		regs->bp, regs->si, regs->di, regs->r8, regs->r9, regs->r10, regs->r11,
		regs->r12, regs->r13, regs->r14, regs->r15,
	};

	memcpy(out, w, sizeof(w));
}
