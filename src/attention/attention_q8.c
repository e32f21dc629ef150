/* Attention over a Q8_0 KV cache: the arithmetic every ISA computes, its
 * scalar reference kernel and the query quantizer.
 *
 * A Q8_0 block of block_tokens (bt) tokens and head_dim (hd) dims, hd a
 * multiple of 32, keeps the channel-major key layout of the F16 cache, with
 * one F16 scale per token and group of 32 channels (as GGUF's q8_0 quantizes
 * a row: d = max|x| / 127, q = round(x / d)):
 *     K: int8 k[hd][bt], then F16 kd[hd / 32][bt]
 *     V: int8 v[bt][hd], then F16 vd[bt][hd / 32]
 * 68 bytes per token and head for K (and for V) at hd 64, against 128 in F16.
 *
 * The query row (times the softmax scale) is quantized the same way, per 32
 * channels (ties to even), into q8 with a float scale qd (attn_q8_quantize_query), so a
 * score is integer dot products, which SIMD does with int8 instructions:
 *     s[j] = sum over groups g in order of  (float)I_g[j] * (qd[g] * kd[g][j])
 *     I_g[j] = sum over the group's channels c of q8[c] * k[c][j]   (exact)
 * (each term added with one rounding: a fused multiply-add in the SIMD
 * kernels). P*V is integer too: per tile of 16 keys and 32-dim group the
 * weights p[j] * vd[j][g] (the value's scale folded into the probability)
 * are quantized to u8 against the tile's largest, I[d] = sum_j q[j] * v[j][d]
 * is exact, and acc[d] = fma(2^(e - 7), (float)I[d], acc[d])
 * (attention_q8_impl.h has the details and the helpers SIMD kernels share).
 * The integer sums are exact in any order, so a row's scores and P*V have
 * the same bits on every ISA and in every grouping of rows (only the
 * softmax's exp differs between ISAs); llama.cpp quantizes the query to
 * q8_0 for a q8_0 K cache likewise. */
#include "attention/attention_kernel.h"
#include "attention/attention_q8_impl.h"
#include "core/fp16.h"
#include "core/prefetch.h"

#include <math.h>
#include <string.h>

void attn_q8_quantize_query(const float *x, int hd, int8_t *q, float *d, int32_t *qsum) {
    for (int g = 0; g < hd / 32; g++) {
        const float *xg = x + 32 * g;
        /* 8 running maxima: no branch, no dependency chain */
        float m8[8] = {0};
        for (int i = 0; i < 32; i += 8)
            for (int l = 0; l < 8; l++) {
                const float a = fabsf(xg[i + l]);
                m8[l] = a > m8[l] ? a : m8[l];
            }
        float amax = 0.0f;
        for (int l = 0; l < 8; l++) amax = m8[l] > amax ? m8[l] : amax;
        const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            /* nearest, ties to even (one instruction, where roundf is a call:
             * this runs for every row of every part) */
            long iv = lrintf(xg[i] * id);
            iv = iv > 127 ? 127 : iv < -127 ? -127 : iv;
            q[32 * g + i] = (int8_t)iv;
            sum += (int32_t)iv;
        }
        d[g] = dd;
        qsum[g] = 128 * sum;
    }
}

float attn_q8_score_ref(const int8_t *q8, const float *qd, const int8_t *k, const uint16_t *kd, int hd, int bt,
                        int j) {
    float s = 0.0f;
    for (int g = 0; g < hd / 32; g++) {
        int32_t dot = 0;
        for (int c = 32 * g; c < 32 * g + 32; c++) dot += (int32_t)q8[c] * k[(size_t)c * bt + j];
        s += (float)dot * (qd[g] * ellm_f16_to_f32(kd[(size_t)g * bt + j]));
    }
    return s;
}

/* Row by row: scores of the visible keys, online-softmax update, then P*V,
 * as attn_block_scalar does for an F16 cache. */
void attn_block_q8_scalar(attn_state *st, const attn_block *b) {
    const int G = st->group, R = st->rows, hd = st->head_dim, hdp = st->hdp, bt = st->block_tokens, ng = hd / 32;
    const int r0 = (b->vis0 >= 1 ? 0 : 1 - b->vis0) * G; /* first row that sees a key */
    if (r0 >= R) return;
    int nk = b->vis0 + (R - 1) / G; /* keys the last row sees */
    if (nk > b->n_valid) nk = b->n_valid;
    const int8_t *k = b->k, *v = b->v;
    const uint16_t *kd = (const uint16_t *)(k + (size_t)hd * bt), *vd = (const uint16_t *)(v + (size_t)hd * bt);
    if (b->next_k) prefetch_range_l1(b->next_k, 2 * kv_q8_half_bytes(hd, bt));
    for (int r = r0; r < R; r++) {
        int nv = b->vis0 + r / G;
        if (nv > nk) nv = nk;
        float *s = st->s + (size_t)r * st->lds;
        float mx = -INFINITY;
        for (int j = 0; j < nv; j++) {
            s[j] = attn_q8_score_ref(st->q8 + (size_t)r * hdp, st->qd + (size_t)r * ng, k, kd, hd, bt, j);
            if (s[j] > mx) mx = s[j];
        }
        float *acc = attn_softmax_step_ref(st, r, s, nv, mx);
        attn_q8_pv_ref(acc, s, nv, v, vd, hd);
    }
}

void attn_q8_pv_ref(float *acc, const float *p, int nv, const int8_t *v, const uint16_t *vd, int hd) {
    const int ng = hd / 32;
    for (int j0 = 0; j0 < nv; j0 += ATTN_Q8_PV_TILE) {
        const int n = nv - j0 < ATTN_Q8_PV_TILE ? nv - j0 : ATTN_Q8_PV_TILE;
        for (int g = 0; g < ng; g++) {
            float w[ATTN_Q8_PV_TILE];
            uint8_t q[ATTN_Q8_PV_TILE];
            for (int j = 0; j < n; j++) w[j] = p[j0 + j] * ellm_f16_to_f32(vd[(size_t)(j0 + j) * ng + g]);
            const float sc = attn_q8_pv_quant_ref(w, n, q);
            for (int d = 32 * g; d < 32 * g + 32; d++) {
                int32_t sum = 0;
                for (int j = 0; j < n; j++) sum += (int32_t)q[j] * v[(size_t)(j0 + j) * hd + d];
                acc[d] = fmaf(sc, (float)sum, acc[d]);
            }
        }
    }
}
