/* libFuzzer target: the safetensors reader (st_open_memory): u64 header
 * length, JSON header, data section. What must hold for any file it accepts,
 * checked here independently of the reader: every tensor's bytes lie inside
 * the buffer, after the header; shape x dtype size equals the byte count; no
 * two tensors share a byte; names are unique, sorted and found by st_find;
 * the data byte total adds up. A refusal must leave a message and no set.
 * Seeds: fuzz/make_convert_seeds. */
#include "fuzz_common.h"

#include "convert/safetensors.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int cmp_ptr(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    const uint8_t *p = x->data, *q = y->data;
    return p < q ? -1 : p > q;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    st_set *s = (st_set *)1;
    ellm_error err = {0};
    if (st_open_memory(buf, size, "fuzz.safetensors", &s, &err) != ELLM_OK) {
        FUZZ_CHECK(s == NULL && err.msg[0] != 0, "a refusal leaves a message and no set");
        free(buf);
        return 0;
    }
    FUZZ_CHECK(size >= 8, "a %zu-byte file was accepted", size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    FUZZ_CHECK(hlen <= size - 8, "header length %llu past the end", (unsigned long long)hlen);
    const uint8_t *lo = buf + 8 + hlen, *hi = buf + size;
    int64_t n = st_n_tensors(s);
    uint64_t total = 0;
    const st_tensor **by_addr = malloc((size_t)(n ? n : 1) * sizeof *by_addr);
    int64_t n_nonempty = 0;
    for (int64_t i = 0; i < n; i++) {
        const st_tensor *t = st_tensor_at(s, i);
        FUZZ_CHECK(t && t->name && *t->name, "tensor %lld has no name", (long long)i);
        FUZZ_CHECK(i == 0 || strcmp(st_tensor_at(s, i - 1)->name, t->name) < 0, "names not sorted and unique at %lld",
                   (long long)i);
        FUZZ_CHECK(st_find(s, t->name) == t, "st_find misses '%s'", t->name);
        FUZZ_CHECK(t->dtype < ST_DTYPE_COUNT && t->n_dims >= 0 && t->n_dims <= ST_MAX_DIMS, "dtype/dims of '%s'",
                   t->name);
        const uint8_t *p = t->data;
        FUZZ_CHECK(p >= lo && t->n_bytes <= (size_t)(hi - p), "'%s' lies outside the data section", t->name);
        uint64_t count = 1;
        for (int d = 0; d < t->n_dims; d++) {
            FUZZ_CHECK(t->shape[d] >= 0, "negative dim in '%s'", t->name);
            count *= (uint64_t)t->shape[d];
        }
        FUZZ_CHECK(count * st_dtype_size(t->dtype) == t->n_bytes, "'%s': %llu elements x %zu != %zu bytes", t->name,
                   (unsigned long long)count, st_dtype_size(t->dtype), t->n_bytes);
        /* Touch the first and last byte (ASan checks the reads). */
        if (t->n_bytes) {
            volatile uint8_t x = p[0] ^ p[t->n_bytes - 1];
            (void)x;
            by_addr[n_nonempty++] = t;
        }
        total += t->n_bytes;
    }
    FUZZ_CHECK(total == st_data_bytes(s), "data bytes %llu != %llu", (unsigned long long)total,
               (unsigned long long)st_data_bytes(s));
    qsort(by_addr, (size_t)n_nonempty, sizeof *by_addr, cmp_ptr);
    for (int64_t i = 1; i < n_nonempty; i++) {
        const uint8_t *prev = by_addr[i - 1]->data, *cur = by_addr[i]->data;
        FUZZ_CHECK(prev + by_addr[i - 1]->n_bytes <= cur, "'%s' and '%s' overlap", by_addr[i - 1]->name,
                   by_addr[i]->name);
    }
    FUZZ_CHECK(st_tensor_at(s, n) == NULL && st_tensor_at(s, -1) == NULL, "st_tensor_at out of range");
    free(by_addr);
    st_close(s);
    free(buf);
    return 0;
}
