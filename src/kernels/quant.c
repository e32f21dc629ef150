/* Tensor element types: the ggml type table and the reference (scalar)
 * quantizers and dequantizers that define each block format. */
#include "kernels/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Known ggml type ids. Retired ids (4, 5, 31-33, 36-38) stay zeroed and are
 * reported as unknown. Sizes of the unsupported types matter too: a model
 * loader needs them to skip or reject such tensors with a precise message. */
static const qtype_info qtype_table[QTYPE_COUNT] = {
    [QTYPE_F32] = {"f32", 1, 4, 1},
    [QTYPE_F16] = {"f16", 1, 2, 1},
    [QTYPE_Q4_0] = {"q4_0", 32, 18, 1},
    [QTYPE_Q4_1] = {"q4_1", 32, 20, 1},
    [QTYPE_Q5_0] = {"q5_0", 32, 22, 1},
    [QTYPE_Q5_1] = {"q5_1", 32, 24, 1},
    [QTYPE_Q8_0] = {"q8_0", 32, 34, 1},
    [QTYPE_Q8_1] = {"q8_1", 32, 36, 0},
    [QTYPE_Q2_K] = {"q2_K", 256, 84, 1},
    [QTYPE_Q3_K] = {"q3_K", 256, 110, 1},
    [QTYPE_Q4_K] = {"q4_K", 256, 144, 1},
    [QTYPE_Q5_K] = {"q5_K", 256, 176, 1},
    [QTYPE_Q6_K] = {"q6_K", 256, 210, 1},
    [QTYPE_Q8_K] = {"q8_K", 256, 292, 0},
    [16] = {"iq2_xxs", 256, 66, 0},
    [17] = {"iq2_xs", 256, 74, 0},
    [18] = {"iq3_xxs", 256, 98, 0},
    [19] = {"iq1_s", 256, 50, 0},
    [QTYPE_IQ4_NL] = {"iq4_nl", 32, 18, 1},
    [21] = {"iq3_s", 256, 110, 0},
    [22] = {"iq2_s", 256, 82, 0},
    [QTYPE_IQ4_XS] = {"iq4_xs", 256, 136, 1},
    [24] = {"i8", 1, 1, 0},
    [25] = {"i16", 1, 2, 0},
    [26] = {"i32", 1, 4, 0},
    [27] = {"i64", 1, 8, 0},
    [28] = {"f64", 1, 8, 0},
    [29] = {"iq1_m", 256, 56, 0},
    [QTYPE_BF16] = {"bf16", 1, 2, 1},
    [34] = {"tq1_0", 256, 54, 0},
    [35] = {"tq2_0", 256, 66, 0},
    [39] = {"mxfp4", 32, 17, 0},
    [QTYPE_INT4_G128] = {"int4_g128", QK_G128, 68, 1},
};

/* Returns the info for ggml type id `type`, or NULL if unknown or retired. */
const qtype_info *qtype_get(int type) {
    if (type < 0 || type >= QTYPE_COUNT || !qtype_table[type].name) return NULL;
    return &qtype_table[type];
}

/* Returns the bytes of a row of n elements, or 0 if the type is unknown, n is
 * negative or not a multiple of the block size, or the size overflows. */
size_t qtype_row_bytes(int type, int64_t n) {
    const qtype_info *t = qtype_get(type);
    if (!t || n < 0 || n % t->block_elems) return 0;
    uint64_t blocks = (uint64_t)(n / t->block_elems);
    if (blocks > SIZE_MAX / (uint64_t)t->block_bytes) return 0;
    return (size_t)blocks * (size_t)t->block_bytes;
}

/* ---- dequantizers: n elements, n a multiple of the block size ---- */

static void dequant_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

/* F16 and BF16 sources may sit at any byte address (a safetensors file's
 * data offsets need not be even), so their elements are copied out rather
 * than read through a 2-byte-aligned pointer. */
static void dequant_f16(const void *src, float *dst, int64_t n) {
    const unsigned char *s = src;
    for (int64_t i = 0; i < n; i++) {
        ellm_f16 h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = ellm_f16_to_f32(h);
    }
}

static void dequant_bf16(const void *src, float *dst, int64_t n) {
    const unsigned char *s = src;
    for (int64_t i = 0; i < n; i++) {
        ellm_bf16 h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = ellm_bf16_to_f32(h);
    }
}

/* Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1 (q32_value). */
static void dequant_q32(int type, const void *src, float *dst, int64_t n) {
    const size_t bsz = (size_t)q32_block_bytes(type);
    const int has_min = q32_has_min(type);
    for (int64_t k = 0; k < n / 32; k++, dst += 32) {
        const char *blk = (const char *)src + (size_t)k * bsz;
        ellm_f16 dh, mh;
        memcpy(&dh, blk, 2);
        memcpy(&mh, blk + 2, 2);
        const float d = ellm_f16_to_f32(dh), m = has_min ? ellm_f16_to_f32(mh) : 0.0f;
        for (int i = 0; i < 32; i++) {
            const float w = d * (float)q32_value(type, blk, i);
            dst[i] = has_min ? w + m : w;
        }
    }
}

static void dequant_iq4_xs(const void *src, float *dst, int64_t n) {
    const block_iq4_xs *b = src;
    for (int64_t k = 0; k < n / QK_K; k++) {
        float d = ellm_f16_to_f32(b[k].d);
        for (int j = 0; j < 8; j++, dst += 32) {
            float dl = d * (float)iq4xs_scale(&b[k], j);
            const uint8_t *q = b[k].qs + 16 * j;
            for (int i = 0; i < 16; i++) {
                dst[i] = dl * (float)iq4_values[q[i] & 0xF];
                dst[i + 16] = dl * (float)iq4_values[q[i] >> 4];
            }
        }
    }
}

/* Q3_K value of element e: its low 2 bits, - 4 where its hmask bit is clear. */
static int q3k_value(const block_q3_K *b, int e) {
    int hb = (b->hmask[e % 32] >> (4 * (e / 128) + (e % 128) / 32)) & 1;
    return k2_bits(b->qs, e) - (hb ? 0 : 4);
}

static void dequant_q3_K(const void *src, float *dst, int64_t n) {
    const block_q3_K *b = src;
    for (int64_t k = 0; k < n / QK_K; k++) {
        float d = ellm_f16_to_f32(b[k].d);
        for (int e = 0; e < QK_K; e++) *dst++ = d * (float)(q3k_scale(b[k].scales, e / 16) - 32) * (float)q3k_value(&b[k], e);
    }
}

static void dequant_q2_K(const void *src, float *dst, int64_t n) {
    const block_q2_K *b = src;
    for (int64_t k = 0; k < n / QK_K; k++) {
        float d = ellm_f16_to_f32(b[k].d), dmin = ellm_f16_to_f32(b[k].dmin);
        for (int e = 0; e < QK_K; e++) {
            int sc = b[k].scales[e / 16];
            *dst++ = d * (float)(sc & 0xF) * (float)k2_bits(b[k].qs, e) - dmin * (float)(sc >> 4);
        }
    }
}

/* Q4_K and Q5_K (q45k_value): w = d * sc[j] * value - dmin * m[j]. */
static void dequant_q45k(int type, const void *src, float *dst, int64_t n) {
    const size_t bsz = type == QTYPE_Q5_K ? sizeof(block_q5_K) : sizeof(block_q4_K);
    for (int64_t k = 0; k < n / QK_K; k++) {
        const char *blk = (const char *)src + (size_t)k * bsz;
        const block_q4_K *b4 = (const block_q4_K *)blk; /* d, dmin and scales sit alike in both */
        const uint8_t *qs = type == QTYPE_Q5_K ? ((const block_q5_K *)blk)->qs : b4->qs;
        const uint8_t *qh = type == QTYPE_Q5_K ? ((const block_q5_K *)blk)->qh : NULL;
        float d = ellm_f16_to_f32(b4->d), dmin = ellm_f16_to_f32(b4->dmin);
        for (int jb = 0; jb < 8; jb++) {
            int sc, m;
            q4k_scale_min(b4->scales, jb, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *dst++ = d1 * (float)q45k_value(qs, qh, jb, l) - m1;
        }
    }
}

static void dequant_q6_K(const void *src, float *dst, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t k = 0; k < n / QK_K; k++) {
        float d = ellm_f16_to_f32(b[k].d);
        for (int e = 0; e < QK_K; e++) {
            int h = e / 128, kk = (e % 128) / 32, l = e % 32;
            uint8_t lo = b[k].ql[64 * h + l + 32 * (kk & 1)];
            int q = (kk < 2 ? lo & 0xF : lo >> 4) | (((b[k].qh[32 * h + l] >> (2 * kk)) & 3) << 4);
            *dst++ = d * (float)b[k].scales[e / 16] * (float)(q - 32);
        }
    }
}

static void dequant_int4_g128(const void *src, float *dst, int64_t n) {
    const block_int4_g128 *b = src;
    for (int64_t k = 0; k < n / QK_G128; k++, dst += QK_G128) {
        float d = ellm_f16_to_f32(b[k].d), m = ellm_f16_to_f32(b[k].m);
        for (int l = 0; l < QK_G128 / 2; l++) {
            dst[l] = d * (float)(b[k].qs[l] & 0xF) + m;
            dst[l + 64] = d * (float)(b[k].qs[l] >> 4) + m;
        }
    }
}

/* Converts n elements of `type` to F32; unsupported types leave dst untouched. */
void qtype_dequantize_ref(int type, const void *src, float *dst, int64_t n) {
    switch (type) {
    case QTYPE_F32: dequant_f32(src, dst, n); break;
    case QTYPE_F16: dequant_f16(src, dst, n); break;
    case QTYPE_BF16: dequant_bf16(src, dst, n); break;
    case QTYPE_Q8_0:
    case QTYPE_Q4_0:
    case QTYPE_Q5_0:
    case QTYPE_Q4_1:
    case QTYPE_Q5_1:
    case QTYPE_IQ4_NL: dequant_q32(type, src, dst, n); break;
    case QTYPE_IQ4_XS: dequant_iq4_xs(src, dst, n); break;
    case QTYPE_Q2_K: dequant_q2_K(src, dst, n); break;
    case QTYPE_Q3_K: dequant_q3_K(src, dst, n); break;
    case QTYPE_Q4_K:
    case QTYPE_Q5_K: dequant_q45k(type, src, dst, n); break;
    case QTYPE_Q6_K: dequant_q6_K(src, dst, n); break;
    case QTYPE_INT4_G128: dequant_int4_g128(src, dst, n); break;
    default: break;
    }
}

/* ---- quantizers: round-to-nearest, n a multiple of the block size ---- */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The value of largest magnitude among x[0 .. n), with its sign (the first
 * such on ties; 0 for all zeros): the quantizers that put it on their grid's
 * end of its sign. */
static float signed_absmax(const float *x, int n) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    return max;
}

static void quant_q8_0(const float *x, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    for (int64_t k = 0; k < n / QK8_0; k++, x += QK8_0) {
        float amax = 0;
        for (int i = 0; i < QK8_0; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        b[k].d = ellm_f32_to_f16(d);
        for (int i = 0; i < QK8_0; i++) b[k].qs[i] = (int8_t)clampi((int)lrintf(x[i] * id), -127, 127);
    }
}

/* Q4_0 (half 8, qh NULL) and Q5_0 (half 16), like ggml: the value of largest
 * magnitude maps to -half, so the full [-half, half - 1] range is used on
 * the side where it matters; q + half stored as nibbles (and fifth bits). */
static void quant_sym32(const float *x, int half, ellm_f16 *d_out, uint8_t *qh, uint8_t *qs) {
    float max = signed_absmax(x, 32);
    float d = max / (float)-half, id = d ? 1.0f / d : 0.0f;
    *d_out = ellm_f32_to_f16(d);
    uint32_t h = 0;
    for (int i = 0; i < 16; i++) {
        int q0 = clampi((int)lrintf(x[i] * id) + half, 0, 2 * half - 1);
        int q1 = clampi((int)lrintf(x[i + 16] * id) + half, 0, 2 * half - 1);
        qs[i] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
        h |= (uint32_t)(q0 >> 4) << i | (uint32_t)(q1 >> 4) << (i + 16);
    }
    if (qh) memcpy(qh, &h, 4);
}

static void quant_q4_0(const float *x, void *dst, int64_t n) {
    block_q4_0 *b = dst;
    for (int64_t k = 0; k < n / QK4_0; k++, x += QK4_0) quant_sym32(x, 8, &b[k].d, NULL, b[k].qs);
}

static void quant_q5_0(const float *x, void *dst, int64_t n) {
    block_q5_0 *b = dst;
    for (int64_t k = 0; k < n / QK5_0; k++, x += QK5_0) quant_sym32(x, 16, &b[k].d, b[k].qh, b[k].qs);
}

/* Q4_1 (qmax 15) and Q5_1 (qmax 31), as ggml: m = min x, d = (max x - m) /
 * qmax, q = x rounded on that grid. qh NULL: Q4_1. */
static void quant_x_1(const float *x, int qmax, ellm_f16 *d_out, ellm_f16 *m_out, uint8_t *qh, uint8_t *qs) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    float d = (hi - lo) / (float)qmax, id = d ? 1.0f / d : 0.0f;
    *d_out = ellm_f32_to_f16(d);
    *m_out = ellm_f32_to_f16(lo);
    uint32_t h = 0;
    for (int i = 0; i < 16; i++) {
        int q0 = clampi((int)lrintf((x[i] - lo) * id), 0, qmax), q1 = clampi((int)lrintf((x[i + 16] - lo) * id), 0, qmax);
        qs[i] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
        h |= (uint32_t)(q0 >> 4) << i | (uint32_t)(q1 >> 4) << (i + 16);
    }
    if (qh) memcpy(qh, &h, 4);
}

static void quant_q4_1(const float *x, void *dst, int64_t n) {
    block_q4_1 *b = dst;
    for (int64_t k = 0; k < n / QK4_0; k++, x += QK4_0) quant_x_1(x, 15, &b[k].d, &b[k].m, NULL, b[k].qs);
}

static void quant_q5_1(const float *x, void *dst, int64_t n) {
    block_q5_1 *b = dst;
    for (int64_t k = 0; k < n / QK5_0; k++, x += QK5_0) quant_x_1(x, 31, &b[k].d, &b[k].m, b[k].qh, b[k].qs);
}

/* The code of the IQ4 value nearest v (values in units of the scale). */
static int iq4_code(float v) {
    int best = 0;
    for (int c = 1; c < 16; c++)
        if (fabsf(v - (float)iq4_values[c]) < fabsf(v - (float)iq4_values[best])) best = c;
    return best;
}

/* The scale that puts a block's value of largest magnitude (signed_absmax)
 * on the grid's end of its sign: -127 or 113. */
static float iq4_scale(float max) { return max < 0 ? max / -127.0f : max / 113.0f; }

/* 32 values x as codes against scale d (qs as Q4_0's nibbles). */
static void iq4_codes(const float *x, float d, uint8_t *qs) {
    float id = d ? 1.0f / d : 0.0f;
    for (int i = 0; i < 16; i++) qs[i] = (uint8_t)(iq4_code(x[i] * id) | iq4_code(x[i + 16] * id) << 4);
}

/* Round to nearest on the grid: the value of largest magnitude on the grid's
 * end of its sign (-127 or 113). */
static void quant_iq4_nl(const float *x, void *dst, int64_t n) {
    block_iq4_nl *b = dst;
    for (int64_t k = 0; k < n / 32; k++, x += 32) {
        float max = signed_absmax(x, 32);
        b[k].d = ellm_f32_to_f16(iq4_scale(max));
        iq4_codes(x, ellm_f16_to_f32(b[k].d), b[k].qs);
    }
}

/* Per sub-block the IQ4_NL scale, then d = max |scale| / 31 and each
 * sub-block's 6-bit ls = 32 + its scale / d, rounded. */
static void quant_iq4_xs(const float *x, void *dst, int64_t n) {
    block_iq4_xs *b = dst;
    for (int64_t k = 0; k < n / QK_K; k++, x += QK_K) {
        float sc[8], smax = 0;
        for (int j = 0; j < 8; j++) {
            float max = signed_absmax(x + 32 * j, 32);
            sc[j] = iq4_scale(max);
            smax = fmaxf(smax, sc[j]);
        }
        b[k].d = ellm_f32_to_f16(smax / 31.0f);
        float d = ellm_f16_to_f32(b[k].d);
        b[k].scales_h = 0;
        memset(b[k].scales_l, 0, sizeof b[k].scales_l);
        for (int j = 0; j < 8; j++) {
            int ls = d > 0 ? clampi((int)lrintf(sc[j] / d) + 32, 0, 63) : 32;
            b[k].scales_l[j / 2] |= (uint8_t)((ls & 0xF) << 4 * (j % 2));
            b[k].scales_h |= (uint16_t)((ls >> 4) << 2 * j);
            iq4_codes(x + 32 * j, d * (float)(ls - 32), b[k].qs + 16 * j);
        }
    }
}

/* Sets element e's 2 low bits in a Q2_K / Q3_K qs. */
static void k2_set(uint8_t *qs, int e, int v) { qs[32 * (e / 128) + e % 32] |= (uint8_t)((v & 3) << (2 * ((e % 128) / 32))); }

/* Per sub-block of 16 the scale that puts its value of largest magnitude at
 * -4 (as Q4_0's at -8), then the 6-bit signed sub-block scales against d =
 * max |scale| / 31 and each value rounded on its sub-block's grid. */
static void quant_q3_K(const float *x, void *dst, int64_t n) {
    block_q3_K *b = dst;
    for (int64_t k = 0; k < n / QK_K; k++, x += QK_K) {
        float sc[16], smax = 0;
        for (int j = 0; j < 16; j++) {
            float max = signed_absmax(x + 16 * j, 16);
            sc[j] = max / -4.0f;
            smax = fmaxf(smax, fabsf(sc[j]));
        }
        memset(&b[k], 0, sizeof b[k]);
        b[k].d = ellm_f32_to_f16(smax / 31.0f);
        float d = ellm_f16_to_f32(b[k].d);
        for (int j = 0; j < 16; j++) {
            int us = d > 0 ? clampi((int)lrintf(sc[j] / d) + 32, 0, 63) : 32;
            if (j < 8) b[k].scales[j] |= (uint8_t)(us & 0xF);
            else b[k].scales[j - 8] |= (uint8_t)((us & 0xF) << 4);
            b[k].scales[8 + j % 4] |= (uint8_t)((us >> 4) << (2 * (j / 4)));
            float dl = d * (float)(us - 32);
            for (int i = 0; i < 16; i++) {
                int e = 16 * j + i, v = dl != 0 ? clampi((int)lrintf(x[e] / dl), -4, 3) : 0, u = v + 4;
                k2_set(b[k].qs, e, u & 3);
                b[k].hmask[e % 32] |= (uint8_t)((u >> 2) << (4 * (e / 128) + (e % 128) / 32));
            }
        }
    }
}


/* The scale-and-minimum grid of one 256-element super-block in nsub
 * sub-blocks: per sub-block the min m = max(0, -min x) and the scale
 * (max x + m) / qmax, both quantized to `levels` (63: 6 bits, Q4_K/Q5_K; 15:
 * 4 bits, Q2_K) against d = max scale / levels and dmin = max m / levels;
 * mins are rounded up and scales recomputed from the quantized min, so the
 * range covers the sub-block (rather than clipping its top). Writes d, dmin,
 * each sub-block's sq and mq, and each element's value q in 0..qmax. */
static void kquant_grid(const float *x, int nsub, int qmax, int levels, ellm_f16 *d_out, ellm_f16 *dmin_out, int *sq,
                        int *mq, int q[QK_K]) {
    const int len = QK_K / nsub;
    float mins[16], maxs[16], m1[16], want[16], mmax = 0, smax = 0;
    for (int j = 0; j < nsub; j++) {
        float lo = 0, hi = 0;
        for (int l = 0; l < len; l++) {
            lo = fminf(lo, x[len * j + l]);
            hi = fmaxf(hi, x[len * j + l]);
        }
        mins[j] = -lo;
        maxs[j] = hi;
        mmax = fmaxf(mmax, mins[j]);
    }
    *dmin_out = ellm_f32_to_f16(mmax / (float)levels);
    float dmin = ellm_f16_to_f32(*dmin_out);
    for (int j = 0; j < nsub; j++) {
        mq[j] = dmin > 0 ? clampi((int)ceilf(mins[j] / dmin), 0, levels) : 0;
        m1[j] = dmin * (float)mq[j];
        want[j] = (maxs[j] + m1[j]) / (float)qmax;
        smax = fmaxf(smax, want[j]);
    }
    *d_out = ellm_f32_to_f16(smax / (float)levels);
    float d = ellm_f16_to_f32(*d_out);
    for (int j = 0; j < nsub; j++) sq[j] = d > 0 ? clampi((int)ceilf(want[j] / d), 0, levels) : 0;
    for (int e = 0; e < QK_K; e++) {
        int jb = e / len;
        float d1 = d * (float)sq[jb];
        q[e] = d1 > 0 ? clampi((int)lrintf((x[e] + m1[jb]) / d1), 0, qmax) : 0;
    }
}

/* Q4_K (qmax 15) or Q5_K (qmax 31): kquant_grid over 8 sub-blocks of 32,
 * the 6-bit scales and mins packed as q4k_scale_min reads them. */
static void kquant_fit(const float *x, int qmax, ellm_f16 *d_out, ellm_f16 *dmin_out, uint8_t scales[12], int q[QK_K]) {
    int sq[8], mq[8];
    kquant_grid(x, 8, qmax, 63, d_out, dmin_out, sq, mq, q);
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)((sq[j] & 63) | ((sq[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)((mq[j] & 63) | ((mq[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sq[j + 4] & 0xF) | ((mq[j + 4] & 0xF) << 4));
    }
}

/* kquant_grid over 16 sub-blocks of 16 with 4-bit scales and mins, q in 0..3. */
static void quant_q2_K(const float *x, void *dst, int64_t n) {
    block_q2_K *b = dst;
    for (int64_t k = 0; k < n / QK_K; k++, x += QK_K) {
        int sq[16], mq[16], q[QK_K];
        memset(&b[k], 0, sizeof b[k]);
        kquant_grid(x, 16, 3, 15, &b[k].d, &b[k].dmin, sq, mq, q);
        for (int j = 0; j < 16; j++) b[k].scales[j] = (uint8_t)(sq[j] | mq[j] << 4);
        for (int e = 0; e < QK_K; e++) k2_set(b[k].qs, e, q[e]);
    }
}

/* kquant_fit's grid, the values as q4k layouts them (Q5_K: fifth bits in qh). */
static void quant_q4_K(const float *x, void *dst, int64_t n) {
    block_q4_K *b = dst;
    for (int64_t k = 0; k < n / QK_K; k++, x += QK_K) {
        int q[QK_K];
        kquant_fit(x, 15, &b[k].d, &b[k].dmin, b[k].scales, q);
        memset(b[k].qs, 0, sizeof b[k].qs);
        for (int e = 0; e < QK_K; e++) {
            int g = e / 64, h = (e / 32) & 1, l = e % 32;
            b[k].qs[32 * g + l] |= (uint8_t)(h ? q[e] << 4 : q[e]);
        }
    }
}

static void quant_q5_K(const float *x, void *dst, int64_t n) {
    block_q5_K *b = dst;
    for (int64_t k = 0; k < n / QK_K; k++, x += QK_K) {
        int q[QK_K];
        kquant_fit(x, 31, &b[k].d, &b[k].dmin, b[k].scales, q);
        memset(b[k].qs, 0, sizeof b[k].qs);
        memset(b[k].qh, 0, sizeof b[k].qh);
        for (int e = 0; e < QK_K; e++) {
            int j = e / 32, g = e / 64, l = e % 32;
            b[k].qs[32 * g + l] |= (uint8_t)((j & 1) ? (q[e] & 0xF) << 4 : q[e] & 0xF);
            b[k].qh[l] |= (uint8_t)((q[e] >> 4) << j);
        }
    }
}

/* Per sub-block of 16: scale = max|x| / 31; the 16 scales are quantized to
 * signed 8 bits against d (rounded up so no value clips), q in [-32, 31]. */
static void quant_q6_K(const float *x, void *dst, int64_t n) {
    block_q6_K *b = dst;
    for (int64_t k = 0; k < n / QK_K; k++, x += QK_K) {
        float want[16], smax = 0;
        for (int j = 0; j < 16; j++) {
            float amax = 0;
            for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * j + l]));
            want[j] = amax / 31.0f;
            smax = fmaxf(smax, want[j]);
        }
        ellm_f16 d16 = ellm_f32_to_f16(smax / 127.0f);
        float d = ellm_f16_to_f32(d16);
        b[k].d = d16;
        for (int j = 0; j < 16; j++)
            b[k].scales[j] = (int8_t)(d > 0 ? clampi((int)ceilf(want[j] / d), 0, 127) : 0);
        memset(b[k].ql, 0, sizeof b[k].ql);
        memset(b[k].qh, 0, sizeof b[k].qh);
        for (int e = 0; e < QK_K; e++) {
            float s = d * (float)b[k].scales[e / 16];
            int q = (s > 0 ? clampi((int)lrintf(x[e] / s), -32, 31) : 0) + 32;
            int h = e / 128, kk = (e % 128) / 32, l = e % 32;
            b[k].ql[64 * h + l + 32 * (kk & 1)] |= (uint8_t)(kk < 2 ? q & 0xF : (q & 0xF) << 4);
            b[k].qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * kk));
        }
    }
}

/* Weighted sums over one group for an assignment q: with sw = sum w,
 * sx = sum w x, swxx = sum w x^2 (fixed per group) and these three, the
 * weighted least-squares fit of x ~= d q + m and its error need no further
 * pass over the group. */
typedef struct {
    double sq, sqq, sxq; /* sum w q, sum w q^2, sum w q x */
} g128_sums;

/* Rounds q_i = clamp(round((x_i - m) / d), 0, 15) into q and sums; returns
 * whether any q_i changed. */
static int g128_assign(const float *x, const float *w, float d, float m, uint8_t *q, g128_sums *S) {
    float id = 1.0f / d;
    double sq = 0, sqq = 0, sxq = 0;
    int changed = 0;
    for (int i = 0; i < QK_G128; i++) {
        int v = clampi((int)lrintf((x[i] - m) * id), 0, 15);
        changed |= v != q[i];
        q[i] = (uint8_t)v;
        double wv = (double)w[i] * v;
        sq += wv;
        sqq += wv * v;
        sxq += wv * x[i];
    }
    S->sq = sq;
    S->sqq = sqq;
    S->sxq = sxq;
    return changed;
}

/* The factor that makes a block's weighted projection on its quantized
 * values xq equal its weighted square: a = sum w x^2 / sum w x xq. A least-
 * squares fit leaves the residual orthogonal to xq, so sum w x xq = sum w xq^2
 * < sum w x^2: the fitted block is shrunk, and so is every output it feeds,
 * by the same sign in every block of every matrix. Scaling the block's scale
 * (and offset) by a removes that bias at a second-order cost in squared
 * error. On the evaluation model it lowered the KL divergence from F32 and
 * the perplexity of every weighting measured (bench/CONVERT.md). Returns 1
 * when there is nothing to correct. */
static float gain_factor(const float *x, const float *xq, const float *w, int n) {
    double sxx = 0, sxq = 0;
    for (int i = 0; i < n; i++) {
        sxx += (double)w[i] * x[i] * x[i];
        sxq += (double)w[i] * x[i] * xq[i];
    }
    return sxq > 0 && sxx > 0 ? (float)(sxx / sxq) : 1.0f;
}

/* One INT4_G128 group, x ~= d * q + m with q in [0, 15]: candidate grids
 * with 15 + 0.25 k steps (k = -4..4) over [min, max] give starting q; each
 * is refined by alternating a weighted least-squares fit of (d, m) for fixed
 * q (rounded to F16, what the file holds) with re-rounding q against it, up
 * to max_iter times; the (d, m) of smallest weighted error wins. A
 * refinement that leaves q as it was would only repeat its fit, and ends the
 * candidate. The levels are then assigned against the winner and (d, m)
 * scaled by the gain correction (gain_factor). */
void qtype_fit_int4_g128_group(const float *x, const float *w, int max_iter, block_int4_g128 *b) {
    enum { N = QK_G128 };
    float lo = x[0], hi = x[0];
    double sw = 0, sx = 0, swxx = 0;
    for (int i = 0; i < N; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
        sw += w[i];
        sx += (double)w[i] * x[i];
        swxx += (double)w[i] * x[i] * x[i];
    }
    float best_d = 0, best_m = lo;
    if (hi > lo) {
        uint8_t q[N];
        g128_sums S;
        double best = INFINITY;
        for (int step = -4; step <= 4; step++) {
            float iscale = (15.0f + 0.25f * (float)step) / (hi - lo);
            g128_assign(x, w, 1.0f / iscale, lo, q, &S);
            for (int iter = 0; iter < max_iter; iter++) {
                double det = sw * S.sqq - S.sq * S.sq;
                if (!(det > 1e-30 * sw * S.sqq)) break;
                float d = ellm_f16_to_f32(ellm_f32_to_f16((float)((sw * S.sxq - sx * S.sq) / det)));
                float m = ellm_f16_to_f32(ellm_f32_to_f16((float)((S.sqq * sx - S.sq * S.sxq) / det)));
                if (!(d > 0)) break;
                int changed = g128_assign(x, w, d, m, q, &S);
                double e = swxx + (double)d * d * S.sqq + 2.0 * d * m * S.sq + (double)m * m * sw -
                           2.0 * d * S.sxq - 2.0 * m * sx;
                if (e < best) {
                    best = e;
                    best_d = d;
                    best_m = m;
                }
                if (!changed) break;
            }
        }
    }
    b->d = ellm_f32_to_f16(best_d);
    b->m = ellm_f32_to_f16(best_m);
    float d = ellm_f16_to_f32(b->d), m = ellm_f16_to_f32(b->m), id = d > 0 ? 1.0f / d : 0.0f;
    float xq[N];
    for (int l = 0; l < N / 2; l++) {
        int q0 = id > 0 ? clampi((int)lrintf((x[l] - m) * id), 0, 15) : 0;
        int q1 = id > 0 ? clampi((int)lrintf((x[l + 64] - m) * id), 0, 15) : 0;
        b->qs[l] = (uint8_t)(q0 | (q1 << 4));
        xq[l] = d * (float)q0 + m;
        xq[l + 64] = d * (float)q1 + m;
    }
    /* the levels stay; scale and offset take the gain correction */
    float a = gain_factor(x, xq, w, N);
    ellm_f16 d2 = ellm_f32_to_f16(a * d), m2 = ellm_f32_to_f16(a * m);
    if (isfinite(ellm_f16_to_f32(d2)) && isfinite(ellm_f16_to_f32(m2))) { /* not past the F16 range */
        b->d = d2;
        b->m = m2;
    }
}

/* With importance weights the refinement runs until the levels settle (at
 * most 10 rounds; most groups settle sooner): on the evaluation model that
 * lowered the KL divergence from F32 and the perplexity of the int4-g128
 * + imatrix file against 3 rounds (bench/CONVERT.md). Without weights the
 * same change measured worse by both, so plain groups keep 3 rounds. */
static void quant_int4_g128(const float *x, void *dst, int64_t n, const float *w) {
    block_int4_g128 *b = dst;
    float ones[QK_G128];
    for (int i = 0; i < QK_G128; i++) ones[i] = 1.0f;
    for (int64_t k = 0; k < n / QK_G128; k++, x += QK_G128)
        qtype_fit_int4_g128_group(x, w ? w + k * QK_G128 : ones, w ? 10 : 3, &b[k]);
}

/* Q4_0 with per-element weights w (n of them): scales around the one that
 * maps the largest magnitude to -8 are tried; for each, q is rounded, the
 * scale refitted by weighted least squares and rounded to F16, q re-rounded
 * against it, and the scale with the smallest weighted error is kept, then
 * scaled by the gain correction (gain_factor) with the levels unchanged. */
void qtype_fit_q4_0_weighted(const float *x, void *dst, int64_t n, const float *w_all) {
    block_q4_0 *b = dst;
    for (int64_t k = 0; k < n / QK4_0; k++, x += QK4_0) {
        const float *w = w_all + k * QK4_0;
        float max = signed_absmax(x, QK4_0);
        float best_d = max / -8.0f;
        double best = INFINITY;
        for (int step = -9; step <= 9 && max != 0; step++) {
            float d = max / (-8.0f + 0.1f * (float)step), id = 1.0f / d;
            double sxq = 0, sqq = 0;
            for (int i = 0; i < QK4_0; i++) {
                int q = clampi((int)lrintf(x[i] * id), -8, 7);
                sxq += (double)w[i] * x[i] * q;
                sqq += (double)w[i] * q * q;
            }
            if (sqq > 0 && sxq != 0) d = (float)(sxq / sqq);
            float d16 = ellm_f16_to_f32(ellm_f32_to_f16(d));
            double e = 0;
            for (int i = 0; i < QK4_0; i++) {
                int qq = d16 != 0 ? clampi((int)lrintf(x[i] / d16), -8, 7) : 0;
                double r = (double)d16 * qq - x[i];
                e += w[i] * r * r;
            }
            if (e < best) {
                best = e;
                best_d = d;
            }
        }
        b[k].d = ellm_f32_to_f16(best_d);
        float d = ellm_f16_to_f32(b[k].d), id = d != 0 ? 1.0f / d : 0.0f, xq[QK4_0];
        for (int i = 0; i < QK4_0 / 2; i++) {
            int q0 = clampi((int)lrintf(x[i] * id) + 8, 0, 15);
            int q1 = clampi((int)lrintf(x[i + 16] * id) + 8, 0, 15);
            b[k].qs[i] = (uint8_t)(q0 | (q1 << 4));
            xq[i] = d * (float)(q0 - 8);
            xq[i + 16] = d * (float)(q1 - 8);
        }
        ellm_f16 d2 = ellm_f32_to_f16(gain_factor(x, xq, w, QK4_0) * d);
        if (isfinite(ellm_f16_to_f32(d2))) b[k].d = d2;
    }
}

/* The weight of each element of one row (n values) in the rounding error:
 * sqrt(importance) * sqrt(sigma2 + x^2), importance the column's mean
 * squared activation and sigma2 the row's mean square. An error on a column
 * that sees large activations costs more, and so does one on a large
 * weight (llama.cpp's sqrt(sigma2 + x^2) factor). The importance enters
 * through its square root: the raw mean square treats columns as
 * independent and overstates how much one column matters against another;
 * on the evaluation model the raw weighting raised perplexity and its
 * square root lowered it (bench/CONVERT.md). */
void qtype_importance_weights(const float *x, const float *imatrix, int64_t n, float *w) {
    double s2 = 0;
    for (int64_t i = 0; i < n; i++) s2 += (double)x[i] * x[i];
    float sigma2 = (float)(s2 / (double)n);
    for (int64_t i = 0; i < n; i++) w[i] = sqrtf(imatrix[i]) * sqrtf(sigma2 + x[i] * x[i]);
}

void qtype_quantize_weighted(int type, const float *src, void *dst, int64_t n, const float *imatrix,
                             int64_t n_per_row) {
    int block = type == QTYPE_Q4_0 ? QK4_0 : type == QTYPE_INT4_G128 ? QK_G128 : 0;
    float *w = imatrix && n_per_row > 0 && block && n_per_row % block == 0 && n % n_per_row == 0
                   ? malloc((size_t)n_per_row * sizeof *w)
                   : NULL;
    if (!w) {
        qtype_quantize_ref(type, src, dst, n);
        return;
    }
    size_t row_bytes = qtype_row_bytes(type, n_per_row);
    for (int64_t r = 0; r < n / n_per_row; r++) {
        const float *x = src + r * n_per_row;
        uint8_t *out = (uint8_t *)dst + (size_t)r * row_bytes;
        qtype_importance_weights(x, imatrix, n_per_row, w);
        if (type == QTYPE_Q4_0)
            qtype_fit_q4_0_weighted(x, out, n_per_row, w);
        else
            quant_int4_g128(x, out, n_per_row, w);
    }
    free(w);
}

/* Converts n floats to `type`; types without a quantizer leave dst untouched. */
static void quant_f32(const float *x, void *dst, int64_t n) { memcpy(dst, x, (size_t)n * sizeof(float)); }
static void quant_f16(const float *x, void *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) ((ellm_f16 *)dst)[i] = ellm_f32_to_f16(x[i]);
}
static void quant_bf16(const float *x, void *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) ((ellm_bf16 *)dst)[i] = ellm_f32_to_bf16(x[i]);
}
static void quant_int4_g128_plain(const float *x, void *dst, int64_t n) { quant_int4_g128(x, dst, n, NULL); }

/* The reference quantizer of each type that has one. */
static void (*const quantizers[QTYPE_COUNT])(const float *, void *, int64_t) = {
    [QTYPE_F32] = quant_f32,       [QTYPE_F16] = quant_f16,     [QTYPE_BF16] = quant_bf16,
    [QTYPE_Q8_0] = quant_q8_0,     [QTYPE_Q4_0] = quant_q4_0,   [QTYPE_Q5_0] = quant_q5_0,
    [QTYPE_Q4_1] = quant_q4_1,     [QTYPE_Q5_1] = quant_q5_1,   [QTYPE_IQ4_NL] = quant_iq4_nl,
    [QTYPE_IQ4_XS] = quant_iq4_xs, [QTYPE_Q2_K] = quant_q2_K,   [QTYPE_Q3_K] = quant_q3_K,
    [QTYPE_Q4_K] = quant_q4_K,     [QTYPE_Q5_K] = quant_q5_K,   [QTYPE_Q6_K] = quant_q6_K,
    [QTYPE_INT4_G128] = quant_int4_g128_plain,
};

int qtype_has_quantizer(int type) { return type >= 0 && type < QTYPE_COUNT && quantizers[type]; }

void qtype_quantize_ref(int type, const float *src, void *dst, int64_t n) {
    if (qtype_has_quantizer(type)) quantizers[type](src, dst, n);
}
