/* The Q8_0 KV block format, shared by the KV cache (which writes blocks) and
 * attention (which reads them). A block of block_tokens (bt) tokens and
 * head_dim (hd) dims, hd a multiple of 32, keeps the channel-major key layout
 * of the F16 cache, with one F16 scale per token and group of 32 channels:
 *     K: int8 k[hd][bt], then F16 kd[hd / 32][bt]
 *     V: int8 v[bt][hd], then F16 vd[bt][hd / 32] */
#ifndef ELLM_ATTENTION_KV_Q8_H
#define ELLM_ATTENTION_KV_Q8_H

#include <stddef.h>
#include <stdint.h>

/* Largest head_dim x block_tokens of a Q8_0 cache (per-thread F32 scratch). */
#define KV_Q8_MAX_ELEMS 8192

/* Bytes of a Q8_0 block's K (or V): int8 values, then an F16 scale per token
 * and 32 dims. */
static inline size_t kv_q8_half_bytes(int hd, int bt) {
    return (size_t)hd * (size_t)bt + (size_t)(hd / 32) * (size_t)bt * 2;
}

/* Quantizes n floats (n a multiple of 32) as GGUF's q8_0 does a row: per group
 * of 32, d = max|x| / 127, q = round(x / d), d kept as F16. q[i * stride_q]
 * and d[g * stride_d] receive them. */
void kv_q8_quantize_ref(const float *x, int n, int8_t *q, uint16_t *d, int stride_q, int stride_d);

#endif
