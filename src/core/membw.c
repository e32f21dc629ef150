/* Read-bandwidth self-test. The read loop is compiled for AVX-512 and AVX2 with
 * per-function target attributes and chosen at run time, so it measures what
 * the fastest kernels can pull, not what a scalar loop can. */
#include "core/membw.h"
#include "core/cpu.h"
#include "core/timer.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
    const char *buf;
    size_t bytes;
    double sink[64];
} membw_job;

__attribute__((target("avx512f"))) static double read_avx512(const char *p, size_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512((const void *)(p + i + 64)));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512((const void *)(p + i + 128)));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512((const void *)(p + i + 192)));
    }
    a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return (double)_mm512_reduce_add_epi64(a0);
}

__attribute__((target("avx2"))) static double read_avx2(const char *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (double)_mm256_extract_epi64(a0, 0);
}

static double read_scalar(const char *p, size_t n) {
    uint64_t a = 0;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        a ^= v;
    }
    return (double)a;
}

static void membw_task(void *arg, int ith, int nth) {
    membw_job *j = arg;
    long b, e;
    threadpool_split((long)j->bytes, ith, nth, 4096, &b, &e);
    const char *p = j->buf + b;
    size_t n = (size_t)(e - b);
    double s;
    switch (ellm_cpu()->best) {
    case ELLM_ISA_AVX512: s = read_avx512(p, n); break;
    case ELLM_ISA_AVX2: s = read_avx2(p, n); break;
    default: s = read_scalar(p, n); break;
    }
    j->sink[ith % 64] += s;
}

void *membw_buffer_alloc(size_t *bytes) {
    *bytes &= ~(size_t)4095;
    void *buf = NULL;
    if (!*bytes || posix_memalign(&buf, 1 << 21, *bytes)) return NULL;
    madvise(buf, *bytes, MADV_HUGEPAGE);
    memset(buf, 1, *bytes); /* commit the pages */
    return buf;
}

double membw_read_gbps(threadpool *pool, size_t bytes, int reps) {
    void *buf = membw_buffer_alloc(&bytes);
    if (!buf) return 0;
    double best = membw_read_buffer_gbps(pool, buf, bytes, reps);
    free(buf);
    return best;
}

double membw_read_buffer_gbps(threadpool *pool, const void *buf, size_t bytes, int reps) {
    membw_job job = {.buf = buf, .bytes = bytes};
    threadpool_run(pool, membw_task, &job); /* warm-up */
    double best = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = ellm_time_ns();
        threadpool_run(pool, membw_task, &job);
        double s = (double)(ellm_time_ns() - t0) / 1e9;
        double gbps = (double)bytes / s / 1e9;
        if (gbps > best) best = gbps;
    }
    return best;
}
