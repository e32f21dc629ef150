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

#endif
