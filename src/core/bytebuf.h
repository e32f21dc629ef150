/* Growable byte buffers for writing and bounds-checked reading of binary
 * files (state files). Values are copied in memory order: x86 is
 * little-endian, the files' order.
 *
 * A writer that fails to grow sets `oom` and ignores further writes; a reader
 * that would read past its end sets `bad`, yields zeros and reads nothing
 * more. Callers check the flag once at the end instead of after every value. */
#ifndef ELLM_CORE_BYTEBUF_H
#define ELLM_CORE_BYTEBUF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned char *p; /* malloc'ed; the caller frees it */
    size_t n, cap;
    int oom;
} bb_writer;

static inline void bb_put(bb_writer *w, const void *data, size_t n) {
    if (w->oom) return;
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 256;
        while (cap < w->n + n) cap *= 2;
        unsigned char *p = realloc(w->p, cap);
        if (!p) {
            w->oom = 1;
            return;
        }
        w->p = p;
        w->cap = cap;
    }
    memcpy(w->p + w->n, data, n);
    w->n += n;
}
static inline void bb_put_u32(bb_writer *w, uint32_t x) { bb_put(w, &x, 4); }
static inline void bb_put_u64(bb_writer *w, uint64_t x) { bb_put(w, &x, 8); }
static inline void bb_put_i64(bb_writer *w, int64_t x) { bb_put(w, &x, 8); }
static inline void bb_put_f32(bb_writer *w, float x) { bb_put(w, &x, 4); }
static inline void bb_put_f64(bb_writer *w, double x) { bb_put(w, &x, 8); }

typedef struct {
    const unsigned char *p;
    size_t n, off;
    int bad; /* a read went past the end */
} bb_reader;

static inline void bb_get(bb_reader *r, void *out, size_t n) {
    if (r->bad || n > r->n - r->off) {
        r->bad = 1;
        memset(out, 0, n);
        return;
    }
    memcpy(out, r->p + r->off, n);
    r->off += n;
}
static inline uint32_t bb_get_u32(bb_reader *r) {
    uint32_t x;
    bb_get(r, &x, 4);
    return x;
}
static inline uint64_t bb_get_u64(bb_reader *r) {
    uint64_t x;
    bb_get(r, &x, 8);
    return x;
}
static inline int64_t bb_get_i64(bb_reader *r) {
    int64_t x;
    bb_get(r, &x, 8);
    return x;
}
static inline float bb_get_f32(bb_reader *r) {
    float x;
    bb_get(r, &x, 4);
    return x;
}
static inline double bb_get_f64(bb_reader *r) {
    double x;
    bb_get(r, &x, 8);
    return x;
}

#endif
