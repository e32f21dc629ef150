/* A KV cache filled for attention benchmarks: n_layer layers of depth tokens
 * of pseudo-random keys (values = -keys / 2), written in 512-token chunks as
 * a prefill would, in pages of page_blocks blocks (0: KV_PAGE_BLOCKS). */
#ifndef ELLM_BENCH_KV_H
#define ELLM_BENCH_KV_H

#include "attention/kv_cache.h"
#include "ellm.h"

#include <stdio.h>
#include <stdlib.h>

static inline kv_cache *bench_kv_filled(int type, int n_layer, int n_kv, int head_dim, int block, int depth,
                                         int page_blocks) {
    kv_cache_params kp = {n_layer, n_kv, head_dim, depth, block, type, page_blocks};
    kv_cache *kv;
    ellm_error err;
    if (kv_cache_init(&kp, &kv, &err) != ELLM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    const int chunk = 512;
    size_t row = (size_t)n_kv * head_dim;
    float *k = malloc(chunk * row * sizeof(float)), *v = malloc(chunk * row * sizeof(float));
    unsigned seed = 1;
    for (size_t i = 0; i < chunk * row; i++) {
        seed = seed * 1103515245u + 12345u;
        k[i] = (float)((seed >> 9) & 0xffff) / 32768.0f - 1.0f;
        v[i] = -k[i] * 0.5f;
    }
    for (int l = 0; l < n_layer; l++)
        for (int pos = 0; pos < depth; pos += chunk) {
            int n = depth - pos < chunk ? depth - pos : chunk;
            kv_cache_store(kv, l, pos, n, k, v);
        }
    kv_cache_set_len(kv, depth);
    free(k);
    free(v);
    return kv;
}

#endif
