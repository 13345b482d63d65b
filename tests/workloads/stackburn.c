/*
 * stackburn: a CPU-bound workload with known call stacks, for comparing hrperf's stack
 * profiles with perf's (tools/hrperf/tests/stacks_perf.rs, tools/bench/stacks-vs-perf.sh).
 *
 * Build: cc -O1 -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls \
 *           -o stackburn stackburn.c
 * Run:   ./stackburn [SECONDS]      (default 1; fractions allowed, e.g. 0.5)
 *
 * Call tree, with the loop iterations each function burns per round (n = 20000):
 *
 *   main -> run_rounds -> burn_outer -> burn_middle -> burn_leaf_a   (2n)
 *                                                   \-> burn_leaf_b  (n)
 *                      \-> burn_solo                                 (3n)
 *                      \-> burn_middle -> burn_leaf_a                (4n)
 *                                      \-> burn_leaf_b               (2n)
 *
 * so burn_leaf_a, burn_leaf_b and burn_solo have distinct self shares, burn_middle is
 * reached from two callers, and burn_outer includes a known part of it.
 *
 * Every function has a distinct name and does its own work in a loop that the compiler
 * cannot remove (a volatile sink), and nothing is inlined, so frame-pointer unwinding
 * sees every frame. GCC 12 sets up no frame pointer in a leaf function that needs no
 * stack even with -fno-omit-frame-pointer (-mno-omit-leaf-frame-pointer does not help),
 * and an unwinder then skips the leaf's caller; so the burning functions end with a call
 * (to the tiny spin()), which makes them non-leaf. -fno-optimize-sibling-calls keeps
 * tail calls (burn_middle -> burn_leaf_b) as real frames.
 */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void spin(unsigned long n, unsigned long seed)
{
	(void)n;
	sink += seed;
}

__attribute__((noinline)) void burn_leaf_a(unsigned long n)
{
	unsigned long x = 1;
	for (unsigned long i = 0; i < n; i++)
		x = x * 6364136223846793005UL + 1442695040888963407UL;
	spin(n, x);
}

__attribute__((noinline)) void burn_leaf_b(unsigned long n)
{
	unsigned long x = 7;
	for (unsigned long i = 0; i < n; i++)
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
	spin(n, x);
}

__attribute__((noinline)) void burn_middle(unsigned long n)
{
	burn_leaf_a(2 * n);
	burn_leaf_b(n);
}

__attribute__((noinline)) void burn_solo(unsigned long n)
{
	unsigned long x = 3;
	for (unsigned long i = 0; i < n; i++)
		x = x * 2862933555777941757UL + 3037000493UL;
	spin(n, x);
}

__attribute__((noinline)) void burn_outer(unsigned long n)
{
	burn_middle(n);
}

__attribute__((noinline)) void run_rounds(unsigned long n)
{
	burn_outer(n);
	burn_solo(3 * n);
	burn_middle(2 * n);
	spin(n, n);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 1.0;
	if (!(seconds > 0))
		seconds = 1.0;
	double end = now() + seconds;
	while (now() < end)
		run_rounds(20000);
	return 0;
}
