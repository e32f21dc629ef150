/* Kernel dispatch and the scalar references.
 *
 * Each public kernel looks up the table of the ISA in use (core/cpu.h) on
 * every call, so ellm_cpu_set_isa takes effect immediately; entries a table
 * leaves NULL fall back to the scalar reference. The `_ref` functions here
 * define the results the SIMD files are tested against. */
#include "kernels/kernels.h"
#include "core/cpu.h"
#include "kernels/kernels_impl.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* ---- activation preparation ---- */

/* Quantizes `n` floats to int8 against d = max|x| / 127 (0 for an all-zero
 * block), rounding to nearest even like cvtps2dq. Returns d. */
static float act_quantize_block(const float *x, int n, int8_t *q) {
    float amax = 0;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++) {
        long v = lrintf(x[i] * id);
        q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    return d;
}

/* Prepares one ACT_Q8 row (grouped blocks of 32 with offset sums) from `cols`
 * floats; pads with zeros. */
void kern_act_q8_row_ref(const float *x, int64_t cols, int off, void *row) {
    act_row a = act_sections(ACT_Q8, cols, row);
    int64_t nblk = cols / 32, nslot = (nblk + 15) / 16 * 16;
    memset(a.qs, 0, (size_t)(nblk + 3) / 4 * 128);
    for (int64_t k = nblk; k < nslot; k++) {
        a.d[act_q8_slot(k)] = 0;
        a.sa[act_q8_slot(k)] = 0;
    }
    for (int64_t k = 0; k < nblk; k++) {
        int8_t q[32];
        float d = act_quantize_block(x + 32 * k, 32, q);
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            a.qs[act_q8_qs(k, i)] = q[i];
            sum += q[i];
        }
        a.d[act_q8_slot(k)] = d;
        a.sa[act_q8_slot(k)] = off * sum;
    }
}

/* Prepares one ACT_Q8K row (blocks of 256 with sums of 16) from `cols` floats. */
void kern_act_q8k_row_ref(const float *x, int64_t cols, int off, void *row) {
    act_row a = act_sections(ACT_Q8K, cols, row);
    for (int64_t k = 0; k < cols / QK_K; k++) a.d[k] = act_quantize_block(x + QK_K * k, QK_K, a.qs + QK_K * k);
    for (int64_t j = 0; j < cols / 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += a.qs[16 * j + i];
        a.bsums[j] = (int16_t)s;
    }
}

/* Prepares one ACT_Q8G row (groups of 128 in sub-blocks of 32, scales by
 * chunk slot, dequantized group sums) from `cols` floats; pads with zeros. */
void kern_act_q8g_row_ref(const float *x, int64_t cols, int off, void *row) {
    act_row a = act_sections(ACT_Q8G, cols, row);
    int64_t ng = cols / QK_G128;
    size_t nslot = act_q8g_nslot(cols);
    memset(a.d, 0, nslot * 4 * sizeof(float));
    memset(a.gs, 0, nslot * sizeof(float));
    for (int64_t g = 0; g < ng; g++) {
        float *d = a.d + 64 * (g / 16) + g % 16, s = 0;
        for (int k = 0; k < 4; k++) {
            int8_t *q = a.qs + QK_G128 * g + 32 * k;
            d[16 * k] = act_quantize_block(x + QK_G128 * g + 32 * k, 32, q);
            int sum = 0;
            for (int i = 0; i < 32; i++) sum += q[i];
            s = k ? fmaf(d[16 * k], (float)sum, s) : d[0] * (float)sum;
        }
        a.gs[g] = s;
    }
}

/* ---- reference matmuls: Y[b][r] for r in [r0, r1), b < nb ----
 * Integer dot products are exact per block; blocks are summed in float in
 * column order. */

/* Element i of a float-typed weight row as float. */
static inline float float_weight(int type, const void *w, int64_t i) {
    switch (type) {
    case QTYPE_F16: return ellm_f16_to_f32(((const ellm_f16 *)w)[i]);
    case QTYPE_BF16: return ellm_bf16_to_f32(((const ellm_bf16 *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

/* Float weights (F32, F16, BF16): one sequential float sum per output. */
static inline void matmul_float_ref(int type, const void *W, int64_t cols, int64_t r0, int64_t r1,
                                    const void *act, int nb, float *Y, int64_t ldy) {
    const size_t row_bytes = (size_t)cols * (type == QTYPE_F32 ? 4 : 2);
    for (int64_t r = r0; r < r1; r++) {
        const void *w = (const char *)W + (size_t)r * row_bytes;
        for (int b = 0; b < nb; b++) {
            const float *x = act_get_row(ACT_F32, act, cols, b).x;
            float s = 0;
            for (int64_t c = 0; c < cols; c++) s += float_weight(type, w, c) * x[c];
            Y[b * ldy + r] = s;
        }
    }
}

static void matmul_f32_ref(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                           int nb, float *Y, int64_t ldy) {
    matmul_float_ref(QTYPE_F32, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_f16_ref(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                           int nb, float *Y, int64_t ldy) {
    matmul_float_ref(QTYPE_F16, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_bf16_ref(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                            int nb, float *Y, int64_t ldy) {
    matmul_float_ref(QTYPE_BF16, W, cols, r0, r1, act, nb, Y, ldy);
}

/* The blocks of 32 (q32_value; Q4_K's, Q5_K's and IQ4_XS's sub-blocks,
 * kq_block32 and iq4xs_block32): the exact
 * int dot per block, scaled by dw * da; with a minimum, then the block's
 * activation sum sa (act_q8_off 1) scaled by mw * da. */
static void matmul_q32_ref(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                           float *Y, int64_t ldy) {
    const int64_t nblk = cols / 32;
    const size_t row_bytes = qtype_row_bytes(wtype, cols), bsz = (size_t)q32_block_bytes(wtype);
    const int has_min = q32_has_min(wtype);
    for (int64_t r = r0; r < r1; r++)
        for (int b = 0; b < nb; b++) {
            const char *row = (const char *)W + (size_t)r * row_bytes;
            act_row a = act_get_row(ACT_Q8, act, cols, b);
            float s = 0;
            for (int64_t k = 0; k < nblk; k++) {
                float dw, mw;
                int isum = 0;
                if (wtype == QTYPE_Q4_K || wtype == QTYPE_Q5_K) {
                    const int Q5 = wtype == QTYPE_Q5_K;
                    const char *sb = row + (size_t)(k / 8) * 8 * bsz;
                    const uint8_t *qs = (const uint8_t *)sb + (Q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs));
                    const uint8_t *qh = Q5 ? ((const block_q5_K *)sb)->qh : NULL;
                    kq_block32(sb, (int)(k % 8), &dw, &mw);
                    for (int i = 0; i < 32; i++) isum += q45k_value(qs, qh, (int)(k % 8), i) * a.qs[act_q8_qs(k, i)];
                } else if (wtype == QTYPE_IQ4_XS) {
                    const block_iq4_xs *sb = (const block_iq4_xs *)row + k / 8;
                    const uint8_t *qs = sb->qs + 16 * (k % 8);
                    dw = iq4xs_block32(sb, (int)(k % 8));
                    mw = 0;
                    for (int i = 0; i < 32; i++)
                        isum += iq4_code_value(qs, i) * a.qs[act_q8_qs(k, i)];
                } else {
                    const char *blk = row + (size_t)k * bsz;
                    ellm_f16 d, m;
                    memcpy(&d, blk, 2);
                    memcpy(&m, blk + 2, 2);
                    dw = ellm_f16_to_f32(d);
                    mw = ellm_f16_to_f32(m);
                    for (int i = 0; i < 32; i++) isum += q32_value(wtype, blk, i) * a.qs[act_q8_qs(k, i)];
                }
                float da = a.d[act_q8_slot(k)];
                s += (dw * da) * (float)isum;
                if (has_min) s += (mw * da) * (float)a.sa[act_q8_slot(k)];
            }
            Y[b * ldy + r] = s;
        }
}
#define MATMUL_Q32_REF(name, type)                                                                          \
    static void name(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb, float *Y, \
                     int64_t ldy) {                                                                         \
        matmul_q32_ref(type, W, cols, r0, r1, act, nb, Y, ldy);                                             \
    }
MATMUL_Q32_REF(matmul_q8_0_ref, QTYPE_Q8_0)
MATMUL_Q32_REF(matmul_q4_0_ref, QTYPE_Q4_0)
MATMUL_Q32_REF(matmul_q5_0_ref, QTYPE_Q5_0)
MATMUL_Q32_REF(matmul_q4_1_ref, QTYPE_Q4_1)
MATMUL_Q32_REF(matmul_q5_1_ref, QTYPE_Q5_1)
MATMUL_Q32_REF(matmul_iq4_nl_ref, QTYPE_IQ4_NL)
MATMUL_Q32_REF(matmul_q4_K_ref, QTYPE_Q4_K)
MATMUL_Q32_REF(matmul_q5_K_ref, QTYPE_Q5_K)
MATMUL_Q32_REF(matmul_iq4_xs_ref, QTYPE_IQ4_XS)

/* Sum of 16 lanes by the fixed tree (j, j+8), (j, j+4), (j, j+2), (0, 1):
 * the SIMD kernels' one reduction (kernels_avx512.c's q8_reduce16). */
static float sum16_ref(const float acc[16]) {
    float t[8];
    for (int j = 0; j < 8; j++) t[j] = acc[j] + acc[j + 8];
    for (int j = 0; j < 4; j++) t[j] = t[j] + t[j + 4];
    for (int j = 0; j < 2; j++) t[j] = t[j] + t[j + 2];
    return t[0] + t[1];
}

/* Q3_K: per super-block k the exact integer
 *
 *   isum_k = sum_j (sc_j - 32) * dot(values_j, a_j)
 *
 * over its 16 sub-blocks of 16 (values q - 4 in -4..3), then Q6_K's float
 * steps (matmul_q6_K_ref): acc[k % 16] = fma((float)isum_k, d * da, acc),
 * one fixed 16-slot sum. The AVX-512 kernels (per row, and the batch kernel
 * of kq16_quads_avx512.c) follow these steps, so both give these bits. */
static void matmul_q3_K_ref(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                            int nb, float *Y, int64_t ldy) {
    int64_t nblk = cols / QK_K;
    for (int64_t r = r0; r < r1; r++) {
        const block_q3_K *w = (const block_q3_K *)W + r * nblk;
        for (int b = 0; b < nb; b++) {
            act_row a = act_get_row(ACT_Q8K, act, cols, b);
            float acc[16] = {0};
            for (int64_t k = 0; k < nblk; k++) {
                const int8_t *q = a.qs + QK_K * k;
                int isum = 0;
                for (int j = 0; j < 16; j++) {
                    int dot = 0;
                    for (int i = 0; i < 16; i++) {
                        int e = 16 * j + i, hb = (w[k].hmask[e % 32] >> (4 * (e / 128) + (e % 128) / 32)) & 1;
                        dot += (k2_bits(w[k].qs, e) - (hb ? 0 : 4)) * q[e];
                    }
                    isum += (q3k_scale(w[k].scales, j) - 32) * dot;
                }
                acc[k % 16] = fmaf((float)isum, ellm_f16_to_f32(w[k].d) * a.d[k], acc[k % 16]);
            }
            Y[b * ldy + r] = sum16_ref(acc);
        }
    }
}

/* Q2_K: per super-block sum_j (sc_j & 15) * dot(q_j, a_j) scaled by d, minus
 * sum_j (sc_j >> 4) * sum(a_j) (bsums) scaled by dmin. */
static void matmul_q2_K_ref(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                            int nb, float *Y, int64_t ldy) {
    int64_t nblk = cols / QK_K;
    for (int64_t r = r0; r < r1; r++) {
        const block_q2_K *w = (const block_q2_K *)W + r * nblk;
        for (int b = 0; b < nb; b++) {
            act_row a = act_get_row(ACT_Q8K, act, cols, b);
            float s = 0;
            for (int64_t k = 0; k < nblk; k++) {
                const int8_t *q = a.qs + QK_K * k;
                int isum_q = 0, isum_m = 0;
                for (int j = 0; j < 16; j++) {
                    int dot = 0;
                    for (int i = 0; i < 16; i++) dot += k2_bits(w[k].qs, 16 * j + i) * q[16 * j + i];
                    isum_q += (w[k].scales[j] & 0xF) * dot;
                    isum_m += (w[k].scales[j] >> 4) * a.bsums[16 * k + j];
                }
                float da = a.d[k];
                s += (da * ellm_f16_to_f32(w[k].d)) * (float)isum_q;
                s -= (da * ellm_f16_to_f32(w[k].dmin)) * (float)isum_m;
            }
            Y[b * ldy + r] = s;
        }
    }
}

/* Q6_K: per super-block k the exact integer
 *
 *   isum_k = sum_j scales[j] * (dot(q_j, a_j) - 32 * sum(a_j))
 *
 * (q the unsigned 6-bit values, j the 16 sub-blocks of 16), then one
 * multiply-add into slot k % 16, acc = fma((float)isum_k, d * da, acc), and
 * one fixed 16-lane sum. The AVX-512 kernels (the per-row one and the batch
 * kernel of kq16_quads_avx512.c) follow exactly these steps, so both give
 * this function's bits whatever the batch size. */
static void matmul_q6_K_ref(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                            int nb, float *Y, int64_t ldy) {
    int64_t nblk = cols / QK_K;
    for (int64_t r = r0; r < r1; r++) {
        const block_q6_K *w = (const block_q6_K *)W + r * nblk;
        for (int b = 0; b < nb; b++) {
            act_row a = act_get_row(ACT_Q8K, act, cols, b);
            float acc[16] = {0};
            for (int64_t k = 0; k < nblk; k++) {
                const int8_t *q = a.qs + QK_K * k;
                const int16_t *bs = a.bsums + 16 * k;
                int dot[16] = {0}; /* sum of q * a per 16-element sub-block */
                for (int h = 0; h < 2; h++)
                    for (int kk = 0; kk < 4; kk++)
                        for (int l = 0; l < 32; l++) {
                            int e = 128 * h + 32 * kk + l;
                            uint8_t lo = w[k].ql[64 * h + l + 32 * (kk & 1)];
                            int wq = (kk < 2 ? lo & 0xF : lo >> 4) |
                                     (((w[k].qh[32 * h + l] >> (2 * kk)) & 3) << 4);
                            dot[e / 16] += wq * q[e];
                        }
                int isum = 0;
                for (int j = 0; j < 16; j++) isum += w[k].scales[j] * (dot[j] - 32 * bs[j]);
                acc[k % 16] = fmaf((float)isum, ellm_f16_to_f32(w[k].d) * a.d[k], acc[k % 16]);
            }
            Y[b * ldy + r] = sum16_ref(acc);
        }
    }
}

/* INT4_G128: per group g, the exact integer dots p_k of the 4-bit values
 * with the 8-bit activations of sub-block k (elements 32k .. 32k + 31), each
 * with its activation scale a_k, into the group's activation-weighted dot
 *
 *   s = p_0 * a_0;  s = fma(p_k, a_k, s) for k = 1, 2, 3
 *
 * then, in lane g % 16 of 16 float accumulators,
 *
 *   acc = fma(s, d, acc);   acc = fma(gs, m, acc)
 *
 * (d, m the group's scale and offset, gs the group's dequantized activation
 * sum), and one sum of the 16 lanes by the fixed tree (j, j+8), (j, j+4),
 * (j, j+2), (0, 1). The SIMD kernels (int4_g128_avx512.c: 16 lanes at once,
 * int4_g128_avx2.c: two vectors of 8) follow exactly these steps, so every
 * ISA and batch size gives the same bits, and they reduce once per output
 * rather than once per group. */

static void matmul_int4_g128_ref(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                                 float *Y, int64_t ldy) {
    int64_t ng = cols / QK_G128;
    for (int64_t r = r0; r < r1; r++) {
        const block_int4_g128 *w = (const block_int4_g128 *)W + r * ng;
        for (int b = 0; b < nb; b++) {
            act_row a = act_get_row(ACT_Q8G, act, cols, b);
            float acc[16] = {0};
            for (int64_t g = 0; g < ng; g++) {
                const int8_t *q = a.qs + QK_G128 * g;
                const float *da = a.d + 64 * (g / 16) + g % 16;
                float s = 0;
                for (int k = 0; k < 4; k++) {
                    int dot = 0; /* sub-blocks 0, 1 in the low nibbles, 2, 3 in the high ones */
                    for (int i = 0; i < 32; i++) {
                        int l = 32 * (k & 1) + i;
                        dot += (k < 2 ? w[g].qs[l] & 0xF : w[g].qs[l] >> 4) * q[32 * k + i];
                    }
                    s = k ? fmaf((float)dot, da[16 * k], s) : (float)dot * da[0];
                }
                float *acc_g = &acc[g % 16];
                *acc_g = fmaf(s, ellm_f16_to_f32(w[g].d), *acc_g);
                *acc_g = fmaf(a.gs[g], ellm_f16_to_f32(w[g].m), *acc_g);
            }
            Y[b * ldy + r] = sum16_ref(acc);
        }
    }
}

/* ---- reference row kernels ---- */

/* Defines kern_rmsnorm: the mean square is summed in double. */
void kern_rmsnorm_ref(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* Defines kern_rope: x0 c - x1 s and x0 s + x1 c per rotated pair. */
void kern_rope_ref(float *x, int n_heads, int head_dim, int n_rot, const float *cos_sin, int neox) {
    int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
            float *p0 = neox ? v + i : v + 2 * i;
            float *p1 = neox ? v + i + half : v + 2 * i + 1;
            float x0 = *p0, x1 = *p1;
            *p0 = x0 * c - x1 * s;
            *p1 = x0 * s + x1 * c;
        }
    }
}

/* Defines kern_swiglu with libm expf. */
void kern_swiglu_ref(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* Defines kern_softmax: max-subtracted expf, sum in double, one reciprocal. */
void kern_softmax_ref(float *x, int64_t n) {
    if (n <= 0) return;
    float max = x[0];
    for (int64_t i = 1; i < n; i++) max = fmaxf(max, x[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

/* Defines kern_logsumexp. */
double kern_logsumexp_ref(const float *x, int64_t n) {
    float max = x[0];
    for (int64_t i = 1; i < n; i++) max = fmaxf(max, x[i]);
    if (max == -INFINITY) return -INFINITY;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += expf(x[i] - max);
    return (double)max + log(sum);
}

/* Defines kern_add. */
void kern_add_ref(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* Defines kern_dot_f32, summed in double. */
float kern_dot_f32_ref(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return (float)s;
}

/* Define kern_f32_to_f16 / kern_f16_to_f32 (core/fp16.h conversions). */
void kern_f32_to_f16_ref(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = ellm_f32_to_f16(src[i]);
}

void kern_f16_to_f32_ref(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = ellm_f16_to_f32(src[i]);
}

/* Scalar table entries for kern_dequantize: quant.c's references. */
#define DEQUANT_REF(name, type)                                                                             \
    static void name(const void *src, float *dst, int64_t n) { qtype_dequantize_ref(type, src, dst, n); }
DEQUANT_REF(dequant_ref_f32, QTYPE_F32)
DEQUANT_REF(dequant_ref_f16, QTYPE_F16)
DEQUANT_REF(dequant_ref_bf16, QTYPE_BF16)
DEQUANT_REF(dequant_ref_q8_0, QTYPE_Q8_0)
DEQUANT_REF(dequant_ref_q4_0, QTYPE_Q4_0)
DEQUANT_REF(dequant_ref_q5_0, QTYPE_Q5_0)
DEQUANT_REF(dequant_ref_q2_K, QTYPE_Q2_K)
DEQUANT_REF(dequant_ref_q3_K, QTYPE_Q3_K)
DEQUANT_REF(dequant_ref_iq4_nl, QTYPE_IQ4_NL)
DEQUANT_REF(dequant_ref_iq4_xs, QTYPE_IQ4_XS)
DEQUANT_REF(dequant_ref_q4_1, QTYPE_Q4_1)
DEQUANT_REF(dequant_ref_q5_1, QTYPE_Q5_1)
DEQUANT_REF(dequant_ref_q4_K, QTYPE_Q4_K)
DEQUANT_REF(dequant_ref_q5_K, QTYPE_Q5_K)
DEQUANT_REF(dequant_ref_q6_K, QTYPE_Q6_K)
DEQUANT_REF(dequant_ref_int4_g128, QTYPE_INT4_G128)

int64_t kern_first_out_of_range_ref(const float *x, int64_t n, float lim) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(x[i]) <= lim)) return i;
    return -1;
}

const kern_table kern_table_scalar = {
    .first_out_of_range = kern_first_out_of_range_ref,
    .matmul =
        {
            [QTYPE_F32] = matmul_f32_ref,
            [QTYPE_F16] = matmul_f16_ref,
            [QTYPE_BF16] = matmul_bf16_ref,
            [QTYPE_Q8_0] = matmul_q8_0_ref,
            [QTYPE_Q4_0] = matmul_q4_0_ref,
            [QTYPE_Q5_0] = matmul_q5_0_ref,
            [QTYPE_Q4_1] = matmul_q4_1_ref,
            [QTYPE_IQ4_NL] = matmul_iq4_nl_ref,
            [QTYPE_Q2_K] = matmul_q2_K_ref,
            [QTYPE_Q3_K] = matmul_q3_K_ref,
            [QTYPE_IQ4_XS] = matmul_iq4_xs_ref,
            [QTYPE_Q5_1] = matmul_q5_1_ref,
            [QTYPE_Q4_K] = matmul_q4_K_ref,
            [QTYPE_Q5_K] = matmul_q5_K_ref,
            [QTYPE_Q6_K] = matmul_q6_K_ref,
            [QTYPE_INT4_G128] = matmul_int4_g128_ref,
        },
    .dequantize =
        {
            [QTYPE_F32] = dequant_ref_f32,
            [QTYPE_F16] = dequant_ref_f16,
            [QTYPE_BF16] = dequant_ref_bf16,
            [QTYPE_Q8_0] = dequant_ref_q8_0,
            [QTYPE_Q4_0] = dequant_ref_q4_0,
            [QTYPE_Q5_0] = dequant_ref_q5_0,
            [QTYPE_Q4_1] = dequant_ref_q4_1,
            [QTYPE_IQ4_NL] = dequant_ref_iq4_nl,
            [QTYPE_Q2_K] = dequant_ref_q2_K,
            [QTYPE_Q3_K] = dequant_ref_q3_K,
            [QTYPE_IQ4_XS] = dequant_ref_iq4_xs,
            [QTYPE_Q5_1] = dequant_ref_q5_1,
            [QTYPE_Q4_K] = dequant_ref_q4_K,
            [QTYPE_Q5_K] = dequant_ref_q5_K,
            [QTYPE_Q6_K] = dequant_ref_q6_K,
            [QTYPE_INT4_G128] = dequant_ref_int4_g128,
        },
    .act_q8 = kern_act_q8_row_ref,
    .act_q8k = kern_act_q8k_row_ref,
    .act_q8g = kern_act_q8g_row_ref,
    .act_q8_quads = kern_act_q8_quads_ref,
    .act_q8k_quads = kern_act_q8k_quads_ref,
    .rmsnorm = kern_rmsnorm_ref,
    .rope = kern_rope_ref,
    .swiglu = kern_swiglu_ref,
    .softmax = kern_softmax_ref,
    .logsumexp = kern_logsumexp_ref,
    .add = kern_add_ref,
    .dot_f32 = kern_dot_f32_ref,
    .f32_to_f16 = kern_f32_to_f16_ref,
    .f16_to_f32 = kern_f16_to_f32_ref,
};

/* ---- dispatch ---- */

/* The table of the ISA in use right now. */
static const kern_table *kern_active(void) {
    switch (ellm_cpu_isa()) {
    case ELLM_ISA_AVX512: return &kern_table_avx512;
    case ELLM_ISA_AVX2: return &kern_table_avx2;
    default: return &kern_table_scalar;
    }
}

/* The active table's entry `field`, or the scalar one if it has none. */
#define KERN_PICK(field)                                                                \
    (kern_active()->field ? kern_active()->field : kern_table_scalar.field)

static int wtype_ok(int wtype) {
    return wtype >= 0 && wtype < QTYPE_COUNT && act_kind_of(wtype) != ACT_NONE;
}

/* Returns nb prepared rows' bytes, or 0 for a weight type kern_matmul does not
 * support or a `cols` that is not a multiple of its block size. */
size_t kern_act_bytes(int wtype, int64_t cols, int nb) {
    if (!wtype_ok(wtype) || cols <= 0 || nb <= 0) return 0;
    const qtype_info *t = qtype_get(wtype);
    if (cols % t->block_elems) return 0;
    act_kind kind = act_kind_of(wtype);
    size_t quads = act_q8_has_quads(wtype)    ? (size_t)act_q8_nquads(nb, cols) * (size_t)(cols / 32) * ACT_Q8_QUAD_BLOCK
                   : act_q8k_nquads(wtype, nb) ? (size_t)act_q8_quad_count(nb) * (size_t)(cols / QK_K) * ACT_Q8K_QUAD_SB
                                              : 0;
    return (size_t)nb * act_row_bytes(kind, cols) + quads;
}

/* Writes quads [q0, q1) of the ACT_Q8 quads of nb prepared rows (see
 * kernels_impl.h); each quad reads its own 4 rows only. */
void kern_act_q8_quads_ref(void *act, int64_t cols, int nb, int q0, int q1) {
    int64_t nblk = cols / 32;
    for (int q = q0; q < q1; q++) {
        act_row a[ACT_Q8_QUAD];
        int n = act_tile_rows(ACT_Q8, act, cols, nb, ACT_Q8_QUAD * q, ACT_Q8_QUAD, a);
        for (int64_t k = 0; k < nblk; k++) {
            int8_t *p = (int8_t *)act_q8_quad(act, cols, nb, q, k);
            float *d = (float *)(p + 8 * 16);
            int32_t *nsa = (int32_t *)(p + 8 * 16 + 16);
            memset(p, 0, ACT_Q8_QUAD_BLOCK);
            for (int i = 0; i < n; i++) {
                for (int j = 0; j < 8; j++) memcpy(p + 16 * j + 4 * i, a[i].qs + act_q8_qs(k, 4 * j), 4);
                d[i] = a[i].d[act_q8_slot(k)];
                nsa[i] = -a[i].sa[act_q8_slot(k)];
            }
        }
    }
}

/* Writes quads [q0, q1) of the ACT_Q8K quads of nb prepared rows (see
 * kernels_impl.h); each quad reads its own 4 rows only. */
void kern_act_q8k_quads_ref(void *act, int64_t cols, int nb, int q0, int q1) {
    int64_t nblk = cols / QK_K;
    for (int q = q0; q < q1; q++) {
        act_row a[ACT_Q8_QUAD];
        int n = act_tile_rows(ACT_Q8K, act, cols, nb, ACT_Q8_QUAD * q, ACT_Q8_QUAD, a);
        for (int64_t k = 0; k < nblk; k++) {
            int8_t *p = (int8_t *)act_q8k_quad(act, cols, nb, q, k);
            int32_t *off = (int32_t *)(p + 64 * 16);
            float *d = (float *)(p + 64 * 16 + 16 * 16);
            memset(p, 0, ACT_Q8K_QUAD_SB);
            for (int i = 0; i < n; i++) {
                for (int m = 0; m < 64; m++) memcpy(p + 16 * m + 4 * i, a[i].qs + QK_K * k + 4 * m, 4);
                for (int j = 0; j < 16; j++) off[4 * j + i] = -32 * a[i].bsums[16 * k + j];
                d[i] = a[i].d[k];
            }
        }
    }
}

/* Fills `act` (kern_act_bytes(wtype, cols, nb) bytes) from nb rows of X. */
void kern_act_prepare(int wtype, const float *X, int64_t cols, int nb, void *act) {
    kern_act_prepare_rows(wtype, X, cols, nb, 0, nb, act);
}

/* Rows [r0, r1) of what kern_act_prepare writes; with quads 0 without the
 * copy interleaved by 4 rows that the quad kernels read. */
static void act_prepare_rows(int wtype, const float *X, int64_t cols, int nb, int r0, int r1, void *act, int quads) {
    assert(kern_act_bytes(wtype, cols, 1) > 0);
    if (kern_act_bytes(wtype, cols, 1) == 0 || r0 >= r1) return;
    assert(r0 >= 0 && r0 % ACT_Q8_QUAD == 0 && r1 <= nb && (r1 % ACT_Q8_QUAD == 0 || r1 == nb));
    act_kind kind = act_kind_of(wtype);
    size_t row_bytes = act_row_bytes(kind, cols);
    kern_act_row_fn fn = kind == ACT_Q8 ? KERN_PICK(act_q8) : kind == ACT_Q8G ? KERN_PICK(act_q8g) : KERN_PICK(act_q8k);
    for (int b = r0; b < r1; b++) {
        char *row = (char *)act + (size_t)b * row_bytes;
        if (kind == ACT_F32) memcpy(row, X + (int64_t)b * cols, (size_t)cols * sizeof(float));
        else fn(X + (int64_t)b * cols, cols, act_q8_off(wtype), row);
    }
    /* the quads of rows [r0, r1): quad q holds rows 4q .. 4q + 3 */
    if (!quads) return;
    if (act_q8_has_quads(wtype) && act_q8_nquads(nb, cols))
        KERN_PICK(act_q8_quads)(act, cols, nb, r0 / ACT_Q8_QUAD, (r1 + ACT_Q8_QUAD - 1) / ACT_Q8_QUAD);
    if (act_q8k_nquads(wtype, nb))
        KERN_PICK(act_q8k_quads)(act, cols, nb, r0 / ACT_Q8_QUAD, (r1 + ACT_Q8_QUAD - 1) / ACT_Q8_QUAD);
}

void kern_act_prepare_rows(int wtype, const float *X, int64_t cols, int nb, int r0, int r1, void *act) {
    act_prepare_rows(wtype, X, cols, nb, r0, r1, act, 1);
}

size_t kern_act_bytes_r16(int64_t cols, int nb) {
    return cols > 0 && cols % 32 == 0 && nb > 0 ? (size_t)nb * act_row_bytes(ACT_Q8, cols) : 0;
}

void kern_act_prepare_rows_r16(int wtype, const float *X, int64_t cols, int nb, int r0, int r1, void *act) {
    act_prepare_rows(wtype, X, cols, nb, r0, r1, act, 0);
}

/* Computes rows [r0, r1) of Y = W * X^T with the active ISA. */
void kern_matmul(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                 int nb, float *Y, int64_t ldy) {
    assert(wtype_ok(wtype));
    if (!wtype_ok(wtype) || r1 <= r0 || nb <= 0) return;
    const kern_table *t = kern_active();
    /* AVX-512 without VNNI (Skylake-X): the AVX2 integer dots are the better fit. */
    if (t->matmul_int_needs_vnni && act_kind_of(wtype) != ACT_F32 && !ellm_cpu()->avx512vnni)
        t = &kern_table_avx2;
    kern_matmul_fn fn = t->matmul[wtype] ? t->matmul[wtype] : kern_table_scalar.matmul[wtype];
    fn(W, cols, r0, r1, act, nb, Y, ldy);
}

/* Computes rows [r0, r1) of Y = W * X^T with the scalar reference. */
void kern_matmul_ref(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1,
                     const void *act, int nb, float *Y, int64_t ldy) {
    assert(wtype_ok(wtype));
    if (!wtype_ok(wtype) || r1 <= r0 || nb <= 0) return;
    kern_table_scalar.matmul[wtype](W, cols, r0, r1, act, nb, Y, ldy);
}

/* Dequantizes n elements of a supported type; other types leave dst untouched. */
void kern_dequantize(int type, const void *src, float *dst, int64_t n) {
    if (type < 0 || type >= QTYPE_COUNT) return;
    kern_convert_fn fn = KERN_PICK(dequantize[type]);
    if (fn) fn(src, dst, n);
}

void kern_quantize(int type, const float *src, void *dst, int64_t n) {
    if (type < 0 || type >= QTYPE_COUNT) return;
    kern_quantize_fn fn = kern_active()->quantize[type];
    if (fn)
        fn(src, dst, n);
    else
        qtype_quantize_ref(type, src, dst, n);
}

int64_t kern_first_out_of_range(const float *x, int64_t n, float lim) {
    return KERN_PICK(first_out_of_range)(x, n, lim);
}

/* The row kernels below run the active ISA's version of their `_ref`. */
void kern_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    KERN_PICK(rmsnorm)(out, x, w, n, eps);
}

void kern_rope(float *x, int n_heads, int head_dim, int n_rot, const float *cos_sin, int neox) {
    KERN_PICK(rope)(x, n_heads, head_dim, n_rot, cos_sin, neox);
}

void kern_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    KERN_PICK(swiglu)(out, gate, up, n);
}

void kern_softmax(float *x, int64_t n) { KERN_PICK(softmax)(x, n); }

double kern_logsumexp(const float *x, int64_t n) { return KERN_PICK(logsumexp)(x, n); }

void kern_add(float *y, const float *x, int64_t n) { KERN_PICK(add)(y, x, n); }

float kern_dot_f32(const float *a, const float *b, int64_t n) { return KERN_PICK(dot_f32)(a, b, n); }

void kern_f32_to_f16(const float *src, uint16_t *dst, int64_t n) { KERN_PICK(f32_to_f16)(src, dst, n); }

void kern_f16_to_f32(const uint16_t *src, float *dst, int64_t n) { KERN_PICK(f16_to_f32)(src, dst, n); }
