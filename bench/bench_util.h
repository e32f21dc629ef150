/* What the kernel benchmarks share: pseudo-random data from one fixed seed
 * (xorshift64), so every run of a benchmark times the same numbers; the
 * calling thread's CPU time; the median of a sample of timings. */
#ifndef ELLM_BENCH_UTIL_H
#define ELLM_BENCH_UTIL_H

#include "core/median.h"

#include <stdint.h>
#include <time.h>

static uint64_t bench_rng_state = 88172645463325252ull;

/* The next 64 pseudo-random bits. */
static inline uint64_t bench_rand(void) {
    uint64_t x = bench_rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return bench_rng_state = x;
}

/* CPU time of the calling thread in ms: on a shared machine it tracks our
 * own work. */
static inline double bench_thread_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Sorts v (n >= 1 values) ascending in place and returns the median, the
 * mean of the two middle values for even n. */
static inline double bench_median(double *v, int n) {
    median_sort(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
