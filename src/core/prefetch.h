/* Software prefetch of a byte range, one request per 64-byte cache line. For
 * reads the hardware prefetchers do not anticipate (scattered KV blocks and
 * index tiles); never faults, whatever the address. */
#ifndef ELLM_CORE_PREFETCH_H
#define ELLM_CORE_PREFETCH_H

#include <stddef.h>

/* Into L1 (and the outer levels). */
static inline void prefetch_range_l1(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 3);
}

/* Towards L2 (not L1): for data needed a little later. */
static inline void prefetch_range_l2(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
}

/* One step of a prefetch spread over a kernel's loop: PF 0 nothing, 1 one
 * line of p, 2 `lines` lines, towards L2; returns p past what was asked for.
 * With PF a compile-time constant the loop carries no branch for it (a
 * counted loop of prefetches beside a dozen FMAs cost more instructions than
 * the FMAs). */
static inline __attribute__((always_inline)) const char *prefetch_step_l2(const char *p, const int PF, int lines) {
    if (PF == 1) {
        __builtin_prefetch(p, 0, 2);
        return p + 64;
    }
    if (PF == 2)
        for (int i = 0; i < lines; i++, p += 64) __builtin_prefetch(p, 0, 2);
    return p;
}

#endif
