/* Tensor element types (ggml/GGUF type ids) and their block formats.
 *
 * A quantized row of n elements is n / block_elems blocks of block_bytes each.
 * The reference (de)quantizers here are plain C and define the formats; the
 * SIMD kernels in kernels.h are tested against them. */
#ifndef ELLM_KERNELS_QUANT_H
#define ELLM_KERNELS_QUANT_H

#include "core/fp16.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    QTYPE_F32 = 0,
    QTYPE_F16 = 1,
    QTYPE_Q4_0 = 2,
    QTYPE_Q4_1 = 3,
    QTYPE_Q5_0 = 6,
    QTYPE_Q5_1 = 7,
    QTYPE_Q8_0 = 8,
    QTYPE_Q8_1 = 9,
    QTYPE_Q2_K = 10,
    QTYPE_Q3_K = 11,
    QTYPE_Q4_K = 12,
    QTYPE_Q5_K = 13,
    QTYPE_Q6_K = 14,
    QTYPE_Q8_K = 15,
    QTYPE_IQ4_NL = 20,
    QTYPE_IQ4_XS = 23,
    QTYPE_BF16 = 30,
    /* eLLM's own type (not ggml's; llama.cpp refuses it): 128-weight groups
     * of 4-bit values with an F16 scale and offset. The id sits far above
     * ggml's (0..39) so that new ggml types cannot collide with it; see
     * docs/GGUF.md. */
    QTYPE_INT4_G128 = 128,
    QTYPE_COUNT = 129 /* ids >= this are unknown */
} qtype;

typedef struct {
    const char *name;  /* "q8_0" */
    int block_elems;   /* elements per block (1 for f32/f16/bf16) */
    int block_bytes;   /* bytes per block */
    int supported;     /* 1 if eLLM can compute with it (dequantize + matmul) */
} qtype_info;

/* Info for a ggml type id, or NULL if the id is unknown (incl. ids that ggml
 * has retired). Known-but-unsupported types have supported == 0. */
const qtype_info *qtype_get(int type);

/* Bytes of a row of n elements; 0 if n is not a multiple of the block size or
 * the type is unknown. */
size_t qtype_row_bytes(int type, int64_t n);

/* Reference conversions (scalar). n must be a multiple of the block size.
 * quantize supports F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS (round-to-nearest
 * quantizers compatible with ggml's format, for tests and `ellm synth`) and
 * INT4_G128 (scale and offset fitted per group by least squares). */
void qtype_dequantize_ref(int type, const void *src, float *dst, int64_t n);
void qtype_quantize_ref(int type, const float *src, void *dst, int64_t n);
/* 1 if qtype_quantize_ref has a quantizer for the type (the list above). */
int qtype_has_quantizer(int type);
/* Like qtype_quantize_ref for n / n_per_row rows, minimizing a weighted
 * squared error: element i of a row weighs sqrt(imatrix[i]) * sqrt(sigma2 + x_i^2)
 * (imatrix: the mean squared activation that meets each input column;
 * sigma2: the row's mean square). Q4_0 and INT4_G128 have weighted
 * quantizers, whose block scales end with a gain correction (sum w x xq =
 * sum w x^2 per block); other types (and imatrix NULL) quantize as
 * qtype_quantize_ref. */
void qtype_quantize_weighted(int type, const float *src, void *dst, int64_t n, const float *imatrix,
                             int64_t n_per_row);

/* The weighted quantizers' parts, for rounding schemes built on them
 * (src/convert/gptq.c): the weight of each element of a row in the rounding
 * error (qtype_quantize_weighted's weighting), Q4_0 blocks of a row with
 * those weights, and one INT4_G128 group (refined up to max_iter times). */
void qtype_importance_weights(const float *x, const float *imatrix, int64_t n, float *w);
void qtype_fit_q4_0_weighted(const float *x, void *dst, int64_t n, const float *w);

/* ---- ggml block layouts (little-endian, packed by construction) ---------- */

#define QK4_0 32
#define QK8_0 32
#define QK_K 256

/* 32 weights: w[i] = d * ((qs[i] & 15) - 8), w[i + 16] = d * ((qs[i] >> 4) - 8). */
typedef struct {
    ellm_f16 d;
    uint8_t qs[QK4_0 / 2];
} block_q4_0;

/* 32 weights: w[i] = d * qs[i]. */
typedef struct {
    ellm_f16 d;
    int8_t qs[QK8_0];
} block_q8_0;
#define QK5_0 32
/* 32 weights with 5-bit values: w[i] = d * (q[i] - 16), q[i] = (qs[i] & 15)
 * | (bit i of qh) << 4 and q[i + 16] = (qs[i] >> 4) | (bit i + 16 of qh) << 4
 * (i = 0..15; qh little-endian). llama-quantize writes it for the matrices
 * whose rows are not a multiple of 256 in Q4_K_M files (SmolLM2's 576,
 * Qwen2.5-0.5B's 896 columns). */
typedef struct {
    ellm_f16 d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0;

/* Q4_0 and Q5_0 with a minimum: w[i] = d * q[i] + m, q[i] in 0..15 (Q4_1:
 * nibbles as Q4_0's) or 0..31 (Q5_1: as Q5_0's). llama-quantize writes Q5_1
 * for the Q5_K matrices of a Q5_K_M file whose rows are not a multiple of
 * 256. */
typedef struct {
    ellm_f16 d;
    ellm_f16 m;
    uint8_t qs[QK4_0 / 2];
} block_q4_1;
typedef struct {
    ellm_f16 d;
    ellm_f16 m;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_1;
/* 256 weights in 8 sub-blocks of 32. Sub-block j has a 6-bit scale sc[j] and
 * 6-bit min m[j] packed into `scales` (see q4k_scale_min); w = d*sc[j]*q -
 * dmin*m[j]. qs[32g + l] holds element 64g + l in its low nibble and element
 * 64g + 32 + l in its high nibble (g = 0..3). */
typedef struct {
    ellm_f16 d;    /* scale of the sub-block scales */
    ellm_f16 dmin; /* scale of the sub-block mins */
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
} block_q4_K;

/* Q4_K with a fifth bit: element 32j + l (sub-block j) has q = its nibble
 * (qs as Q4_K's) | (bit j of qh[l]) << 4, in 0..31; w = d*sc[j]*q -
 * dmin*m[j]. Q5_K_M files (and Q4_K_S's first FFN down matrices) use it. */
typedef struct {
    ellm_f16 d;
    ellm_f16 dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
/* 256 weights in 16 sub-blocks of 16 (element e in sub-block e / 16): for
 * half h (elements 128h ..), k = 0..3 and l = 0..31, element 128h + 32k + l
 * has its low 2 bits at bits 2k of qs[32h + l] and its third bit at bit
 * 4h + k of hmask[l]; its value is low - 4 where that bit is clear, low where
 * it is set (-4..3), w = d * (sc[e / 16] - 32) * value with the 6-bit sc of
 * q3k_scale. Q3_K_M and Q2_K files use it. */
typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    ellm_f16 d;
} block_q3_K;
/* 256 weights in 16 sub-blocks of 16: the 2-bit q of element 128h + 32k + l
 * (as Q3_K's low bits) and the byte scales[e / 16] (a 4-bit scale in its low
 * nibble, a 4-bit min in its high one): w = d * (sc & 15) * q - dmin * (sc >> 4). */
typedef struct {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    ellm_f16 d;
    ellm_f16 dmin;
} block_q2_K;
/* Sub-block is's 6-bit scale (0..63) of a Q3_K block's 12 scale bytes: low
 * 4 bits in the low (is < 8) or high nibble of byte is % 8, high 2 bits in
 * bits 2 (is / 4) of byte 8 + is % 4. */
static inline int q3k_scale(const uint8_t *s, int is) {
    int lo = is < 8 ? s[is] & 0xF : s[is - 8] >> 4;
    return lo | ((s[8 + is % 4] >> (2 * (is / 4))) & 3) << 4;
}
/* Value (0..31) of element 32j + l (sub-block j) of a Q4_K (qh NULL: 0..15)
 * or Q5_K block's qs and qh. */
static inline int q45k_value(const uint8_t *qs, const uint8_t *qh, int j, int l) {
    int v = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0xF;
    return qh ? v | ((qh[l] >> j) & 1) << 4 : v;
}
/* The 2-bit field of element e (0..255) of a Q2_K / Q3_K qs (its low bits). */
static inline int k2_bits(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

/* The 16 values of the IQ4 types' 4-bit codes (ggml's non-linear grid). */
static const int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* 32 weights: w[i] = d * iq4_values[code i], the codes as Q4_0's nibbles. */
typedef struct {
    ellm_f16 d;
    uint8_t qs[16];
} block_iq4_nl;
/* 256 weights in 8 sub-blocks of 32: w = d * (ls[j] - 32) * iq4_values[code]
 * with the 6-bit ls[j] = its nibble of scales_l[j / 2] (low for even j) | its
 * 2 bits of scales_h (bits 2j, 2j + 1) << 4; sub-block j's codes are
 * qs[16j .. 16j + 15] as a Q4_0 block's nibbles. Written by llama-quantize's
 * IQ4_XS (IQ4_NL where a row is not a multiple of 256). */
typedef struct {
    ellm_f16 d;
    uint16_t scales_h;
    uint8_t scales_l[4];
    uint8_t qs[QK_K / 2];
} block_iq4_xs;
/* Value of element i (0..31) of 32 IQ4 codes laid out as a Q4_0 block's 16
 * nibble bytes (an IQ4_NL block's, an IQ4_XS sub-block's). */
static inline int iq4_code_value(const uint8_t *qs, int i) {
    return iq4_values[i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4];
}
/* Sub-block j's signed scale ls[j] - 32 of an IQ4_XS block. */
static inline int iq4xs_scale(const block_iq4_xs *b, int j) {
    return (((b->scales_l[j / 2] >> 4 * (j % 2)) & 0xF) | ((b->scales_h >> 2 * j) & 3) << 4) - 32;
}

/* ---- the blocks of 32: Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1 ---------------
 * Each starts with its f16 scale d (Q4_1, Q5_1: then their f16 minimum m),
 * and each but Q8_0 ends with the 16 nibble bytes of Q4_0 (element i in the
 * low nibble of byte i, element 16 + i in the high one), Q5_0 and Q5_1 with
 * their 32 fifth bits (little-endian, bit i for element i) just before.
 * Q4_K's, Q5_K's and IQ4_XS's sub-blocks are computed as blocks of 32 too,
 * but lie inside their super-block: kq_block32, q45k_value and
 * iq4xs_block32 read them, q32_value does not. */
static inline int q32_block_bytes(int type) {
    switch (type) {
    case QTYPE_Q8_0: return (int)sizeof(block_q8_0);
    case QTYPE_Q5_0: return (int)sizeof(block_q5_0);
    case QTYPE_Q4_1: return (int)sizeof(block_q4_1);
    case QTYPE_Q5_1: return (int)sizeof(block_q5_1);
    case QTYPE_Q4_K: return (int)sizeof(block_q4_K) / 8; /* a sub-block's share of its super-block */
    case QTYPE_Q5_K: return (int)sizeof(block_q5_K) / 8; /* the same */
    case QTYPE_IQ4_XS: return (int)sizeof(block_iq4_xs) / 8; /* the same */
    default: return (int)sizeof(block_q4_0); /* Q4_0, IQ4_NL */
    }
}
/* Whether the type adds a per-block minimum: w = d * value + m (Q4_K, Q5_K:
 * each sub-block of 32, with d = d sc[j] and m = -dmin m[j], as kernels
 * compute it). */
static inline int q32_has_min(int type) {
    return type == QTYPE_Q4_1 || type == QTYPE_Q5_1 || type == QTYPE_Q4_K || type == QTYPE_Q5_K;
}
/* Element i (0..31) of a block as an integer: w = d * value (Q8_0's byte,
 * Q4_0's nibble - 8, Q5_0's 5 bits - 16, IQ4_NL's grid value) or w = d *
 * value + m (Q4_1's nibble, Q5_1's 5 bits). The reference every kernel of
 * these types is tested against. */
static inline int q32_value(int type, const void *blk, int i) {
    if (type == QTYPE_Q8_0) return ((const block_q8_0 *)blk)->qs[i];
    const uint8_t *qs = (const uint8_t *)blk + q32_block_bytes(type) - 16;
    int v = i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4;
    if (type == QTYPE_Q5_0 || type == QTYPE_Q5_1) {
        uint32_t h;
        memcpy(&h, qs - 4, 4);
        v |= (int)((h >> i) & 1) << 4;
    }
    switch (type) {
    case QTYPE_Q4_0: return v - 8;
    case QTYPE_Q5_0: return v - 16;
    case QTYPE_IQ4_NL: return iq4_values[v];
    default: return v; /* Q4_1, Q5_1 */
    }
}
/* 256 weights in 16 sub-blocks of 16 with signed 8-bit scales; w = d *
 * scales[e / 16] * (q - 32) with a 6-bit q. For half h (elements 128h ..
 * 128h + 127) and l = 0..31, element 128h + 32k + l (k = 0..3) has its low 4
 * bits in ql[64h + l + 32(k & 1)] (low nibble for k < 2, high for k >= 2) and
 * its high 2 bits in bits 2k..2k+1 of qh[32h + l]. */
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    ellm_f16 d;
} block_q6_K;

#define QK_G128 128

/* INT4_G128 (eLLM's own): 128 weights w[i] = d * q[i] + m with q[i] in
 * 0..15; qs[l] holds q[l] in its low nibble and q[l + 64] in its high nibble
 * (l = 0..63), so one 64-byte load meets the first half of the group in low
 * nibbles and the second half in high nibbles. 68 bytes: 4.25 bits per weight. */
typedef struct {
    ellm_f16 d;
    ellm_f16 m;
    uint8_t qs[QK_G128 / 2];
} block_int4_g128;

/* ggml's 8-bit intermediate for k-quant dot products (listed for its size). */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;

static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");

static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");
static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");
static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");
static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");
static_assert(sizeof(block_int4_g128) == 68, "block_int4_g128 size");

/* One INT4_G128 group of x with element weights w, refined up to max_iter
 * times (qtype_quantize_weighted's group quantizer; src/convert/gptq.c
 * builds on it). */
void qtype_fit_int4_g128_group(const float *x, const float *w, int max_iter, block_int4_g128 *b);

/* Decodes sub-block j's 6-bit scale and min from a Q4_K `scales` array: bytes
 * 0..3 hold sc[0..3] (low 6 bits) and the top 2 bits of sc[4..7]; bytes 4..7
 * hold m[0..3] and the top 2 bits of m[4..7]; bytes 8..11 hold the low
 * nibbles of sc[4..7] (low) and m[4..7] (high). */
static inline void q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K's or Q5_K's sub-block j (elements 32j .. 32j + 31) of the
 * super-block at b as the block of 32 with a minimum that every matmul of
 * these types computes (as Q4_1's and Q5_1's, w = dw * q + mw): dw = d sc[j]
 * and mw = -(dmin m[j]), both exact in F32 (an F16 times a 6-bit integer).
 * The two types share the header: d, dmin, then the 12 scale bytes. */
static_assert(offsetof(block_q4_K, scales) == offsetof(block_q5_K, scales), "Q4_K / Q5_K headers");
static inline void kq_block32(const void *b, int j, float *dw, float *mw) {
    const block_q4_K *h = (const block_q4_K *)b;
    int sc, m;
    q4k_scale_min(h->scales, j, &sc, &m);
    *dw = (float)sc * ellm_f16_to_f32(h->d);
    *mw = 0.0f - (float)m * ellm_f16_to_f32(h->dmin);
}

/* IQ4_XS's sub-block j (elements 32j .. 32j + 31) as the block of 32 that
 * every IQ4_XS matmul computes (as IQ4_NL's, w = dw * iq4_values[code]): dw
 * = d (ls[j] - 32), exact in F32 (an F16 times a 6-bit integer); its codes
 * are qs[16j .. 16j + 15], laid out as an IQ4_NL block's. */
static inline float iq4xs_block32(const block_iq4_xs *b, int j) {
    return (float)iq4xs_scale(b, j) * ellm_f16_to_f32(b->d);
}

/* Unpacks all 8 scales and 8 mins of a Q4_K `scales` array at once, as bytes
 * out[0..7] = sc[0..7] and out[8..15] = m[0..7] (same result as
 * q4k_scale_min, with 32-bit word operations for the SIMD kernels). */
static inline void q4k_unpack_scales(const uint8_t *s, uint8_t out[16]) {
    uint32_t u[3], o[4];
    memcpy(u, s, 12);
    o[0] = u[0] & 0x3f3f3f3fu;
    o[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    o[2] = u[1] & 0x3f3f3f3fu;
    o[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    memcpy(out, o, 16);
}

#endif
