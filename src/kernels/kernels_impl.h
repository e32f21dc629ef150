/* Private to src/kernels: the layout of prepared activations and the per-ISA
 * function table that kernels.c dispatches to (the weight block layouts are
 * in quant.h).
 *
 * The scalar, AVX2 and AVX-512 files all read these definitions, so the
 * formats here are the single source of truth for every ISA. */
#ifndef ELLM_KERNELS_KERNELS_IMPL_H
#define ELLM_KERNELS_KERNELS_IMPL_H

#include "core/fp16.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- prepared activations ------------------------------------------------
 * kern_act_prepare writes nb rows of act_row_bytes(kind, cols) each. Every
 * section starts on a 64-byte offset from the row start (the base pointer
 * itself may be unaligned; kernels use unaligned loads).
 *
 *   ACT_F32 (F32, F16, BF16 weights): float x[cols].
 *   ACT_Q8  (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL, Q4_K, Q5_K and IQ4_XS weights), nblk = cols/32 blocks of 32:
 *       float d[16 * nchunk]; int32 sa[16 * nchunk]; int8 qs[128 * ngroup]
 *       with nchunk = ceil(nblk / 16), ngroup = ceil(nblk / 4).
 *       Element i of block k is x ~= d * q with q = qs[act_q8_qs(k, i)] in
 *       [-127, 127] (x / d rounded to nearest even, d = max|x| / 127 over the
 *       block), d = d[act_q8_slot(k)] and sa[act_q8_slot(k)] = off * sum_i q
 *       with off = 128 for Q8_0, IQ4_NL and IQ4_XS, 8 for Q4_0, 16 for Q5_0 and 1
 *       for Q4_1, Q5_1, Q4_K and Q5_K weights (act_q8_off; their minimum meets the
 *       plain sum). The sums let SIMD dots treat weights as unsigned (w +
 *       128 for Q8_0 and IQ4_NL's / IQ4_XS's values, the raw nibble w + 8 for Q4_0,
 *       the 5-bit value w + 16 for Q5_0) and take the offset off in
 *       integers.
 *       Slots and bytes past the last block are zero.
 *   ACT_Q8K (Q2_K, Q3_K, Q6_K weights): float d[cols/256]; int16 bsums[cols/16];
 *       int8 qs[cols]. Same rounding over blocks of 256; bsums[j] is the sum
 *       of qs[16j .. 16j + 15] (for the mins / the -32 offset).
 *   ACT_Q8G (INT4_G128 weights), ng = cols/128 groups of 4 sub-blocks of
 *       32, nchunk = ceil(ng / 16):
 *       float d[64 * nchunk]; float gs[16 * nchunk]; int8 qs[cols].
 *       Same rounding over sub-blocks of 32 (as ACT_Q8: a weight group of
 *       128 shares one scale, but SwiGLU outputs are heavy-tailed, and one
 *       activation scale per 128 lost precision the weights cannot recover);
 *       qs in natural column order. d[64c + 16k + j] is the scale of
 *       sub-block k (elements 32k .. 32k + 31) of group 16c + j, so the 16
 *       groups of a chunk have each sub-block's scales in one vector.
 *       gs[g] is the group's dequantized sum, which meets the weight offset
 *       m: with n_k the sum of sub-block k's q and d_k its scale, gs = d_0
 *       n_0, then gs = fma(d_k, n_k, gs) for k = 1..3. Slots past the last
 *       group are zero.
 *
 * The ACT_Q8 order serves the AVX-512 dot products (kernels_avx512.c):
 *   - qs in groups of 4 blocks (128 bytes): the first 16 elements of the
 *     group's 4 blocks, then their last 16, so one 64-byte load meets the
 *     first or last halves of 4 weight blocks and the two products of a
 *     block accumulate into the same 4 int32 lanes;
 *   - d and sa in chunks of 16 blocks, in the lane order in which the
 *     kernels' reduction of those 4-lane sums leaves the 16 block dots
 *     (act_q8_slot), so scales apply without a permute. */
typedef enum { ACT_NONE, ACT_F32, ACT_Q8, ACT_Q8K, ACT_Q8G } act_kind;

/* Slot of block k in the d and sa arrays: within a chunk of 16 blocks,
 * block 4m + l (group m, place l in it) sits in slot 4l + m. */
static inline int64_t act_q8_slot(int64_t k) { return (k & ~(int64_t)15) + 4 * (k & 3) + ((k & 15) >> 2); }

/* Byte of element i (0..31) of block k in the qs section. */
static inline int64_t act_q8_qs(int64_t k, int i) {
    return 128 * (k >> 2) + 64 * (i >> 4) + 16 * (k & 3) + (i & 15);
}

/* The weight offset folded into sa for a weight type (see ACT_Q8). For the
 * types with a minimum (q32_has_min) a block's dot is dw * da * sum(q * a)
 * + mw * da * sa: two multiply-adds into the block's slot, the second after
 * the first, in every kernel. */
static inline int act_q8_off(int wtype) {
    switch (wtype) {
    case QTYPE_Q4_0: return 8;
    case QTYPE_Q5_0: return 16;
    case QTYPE_Q4_1:
    case QTYPE_Q4_K:
    case QTYPE_Q5_K:
    case QTYPE_Q5_1: return 1;
    default: return 128; /* Q8_0; IQ4_NL, IQ4_XS (their values + 128) */
    }
}


static inline act_kind act_kind_of(int wtype) {
    switch (wtype) {
    case QTYPE_F32:
    case QTYPE_F16:
    case QTYPE_BF16: return ACT_F32;
    case QTYPE_Q8_0:
    case QTYPE_Q4_0:
    case QTYPE_Q5_0:
    case QTYPE_Q4_1:
    case QTYPE_Q5_1:
    case QTYPE_IQ4_NL:
    case QTYPE_Q4_K:
    case QTYPE_Q5_K:
    case QTYPE_IQ4_XS: return ACT_Q8;
    case QTYPE_Q2_K:
    case QTYPE_Q3_K:
    case QTYPE_Q6_K: return ACT_Q8K;
    case QTYPE_INT4_G128: return ACT_Q8G;
    default: return ACT_NONE;
    }
}

static inline size_t act_pad64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ACT_Q8G: group slots, the groups rounded up to whole chunks of 16. */
static inline size_t act_q8g_nslot(int64_t cols) { return ((size_t)(cols / QK_G128) + 15) / 16 * 16; }

/* Bytes of one prepared row; 0 if cols does not fit the kind's block size. */
static inline size_t act_row_bytes(act_kind kind, int64_t cols) {
    size_t n = (size_t)cols;
    switch (kind) {
    case ACT_F32: return act_pad64(n * sizeof(float));
    case ACT_Q8: {
        if (cols % 32) return 0;
        size_t nblk = n / 32;
        return 2 * act_pad64((nblk + 15) / 16 * 16 * 4) + (nblk + 3) / 4 * 128;
    }
    case ACT_Q8K:
        if (cols % QK_K) return 0;
        return act_pad64(n / QK_K * sizeof(float)) + act_pad64(n / 16 * sizeof(int16_t)) +
               act_pad64(n);
    case ACT_Q8G:
        if (cols % QK_G128) return 0;
        return act_pad64(act_q8g_nslot(cols) * 16) + act_pad64(act_q8g_nslot(cols) * 4) + act_pad64(n);
    default: return 0;
    }
}

/* The sections of one prepared row; pointers a kind does not have are NULL. */
typedef struct {
    float *x;       /* ACT_F32: cols */
    float *d;       /* ACT_Q8: 16 * nchunk block scales, by slot; ACT_Q8K: cols/256; ACT_Q8G: 64 * nchunk */
    int32_t *sa;    /* ACT_Q8: 16 * nchunk offset block sums, by slot */
    float *gs;      /* ACT_Q8G: 16 * nchunk dequantized group sums */
    int16_t *bsums; /* ACT_Q8K: cols/16 */
    int8_t *qs;     /* ACT_Q8: 128 * ngroup (grouped, see above); ACT_Q8K, ACT_Q8G: cols */
} act_row;

/* Splits the prepared row at `row` into its sections. */
static inline act_row act_sections(act_kind kind, int64_t cols, void *row) {
    size_t n = (size_t)cols;
    char *p = row;
    act_row r = {0};
    if (kind == ACT_F32) {
        r.x = (float *)p;
    } else if (kind == ACT_Q8) {
        size_t fb = act_pad64((n / 32 + 15) / 16 * 16 * 4);
        r.d = (float *)p;
        r.sa = (int32_t *)(p + fb);
        r.qs = (int8_t *)(p + 2 * fb);
    } else if (kind == ACT_Q8K) {
        size_t off = act_pad64(n / QK_K * sizeof(float));
        r.d = (float *)p;
        r.bsums = (int16_t *)(p + off);
        r.qs = (int8_t *)(p + off + act_pad64(n / 16 * sizeof(int16_t)));
    } else if (kind == ACT_Q8G) {
        size_t db = act_pad64(act_q8g_nslot(cols) * 16);
        r.d = (float *)p;
        r.gs = (float *)(p + db);
        r.qs = (int8_t *)(p + db + act_pad64(act_q8g_nslot(cols) * 4));
    }
    return r;
}

/* Row b of prepared activations `act` (read-only use). */
static inline act_row act_get_row(act_kind kind, const void *act, int64_t cols, int b) {
    return act_sections(kind, cols, (char *)act + (size_t)b * act_row_bytes(kind, cols));
}

/* R16 records (the layouts: r16.c): a record holds one block of 16 rows,
 * 16 times the type's block bytes; the byte offsets of its sections, shared
 * by the packer (r16.c) and the kernels (r16_avx2.c, r16_avx512.c). Every
 * record starts with the rows' f16 scales d[16]. */
enum {
    R16_MINS = 32,                           /* f16 m[16] (Q4_1, Q5_1), dmin[16] (Q4_K, Q5_K) */
    R16_Q32_QS = 32,                         /* Q8_0's, Q4_0's and IQ4_NL's quant dwords */
    R16_Q41_QS = 64,                         /* Q4_1's nibble dwords */
    R16_Q50_H = 32,                          /* Q5_0's regrouped fifth bits, */
    R16_Q51_H = 64,                          /* Q5_1's; */
    R16_Q5_QS_AFTER_H = 64,                  /* their nibble dwords come after */
    R16_KQ_SC = 64,                          /* Q4_K's and Q5_K's scale dwords */
    R16_Q4K_QS = 256,                        /* Q4_K's nibble dwords */
    R16_Q5K_QH = 256,                        /* Q5_K's fifth-bit dwords, */
    R16_Q5K_QS = 768,                        /* then its nibble dwords */
    R16_IQ4XS_SH = 32,                       /* IQ4_XS's scales_h[16], */
    R16_IQ4XS_SL = 64,                       /* scales_l dwords, */
    R16_IQ4XS_QS = 128,                      /* code dwords */
};

/* The R16 kernels' passes (r16_avx2.c, r16_avx512.c): the ACT_Q8 rows
 * [b, b + n) of a pass of at most max rows, n = min(nb - b, max), into a[]
 * and their outputs from column r0 into y[]; returns n. */
static inline int act_pass_rows(const void *act, int64_t cols, int nb, int b, int max, float *Y, int64_t ldy,
                                int64_t r0, act_row *a, float **y) {
    const int n = nb - b < max ? nb - b : max;
    for (int i = 0; i < n; i++) {
        a[i] = act_get_row(ACT_Q8, act, cols, b + i);
        y[i] = Y + (int64_t)(b + i) * ldy + r0;
    }
    return n;
}

/* ACT_Q8 quads, the batch layout. For nb >= ACT_Q8_QUAD_MIN rows (rows of
 * at most ACT_Q8_SHORT_COLS columns: ACT_Q8_QUAD_MIN_SHORT) the nb rows are
 * followed by act_q8_quad_count(nb) quads of 4 rows each, the last padded
 * with zero rows; smaller batches are left to the per-row kernels. Block k
 * of quad q takes ACT_Q8_QUAD_BLOCK bytes at
 * (k * nquads + q) * ACT_Q8_QUAD_BLOCK (a block's quads side by side, so
 * the quad kernel reaches them at fixed offsets from one pointer):
 *   int8 q[8][4][4]: q[j][b] = elements 4j .. 4j+3 of block k of row 4q + b
 *   float d[4]: row 4q + b's d of block k
 *   int32 nsa[4]: minus row 4q + b's sa of block k
 * so one 16-byte load, broadcast to the four 128-bit lanes, meets dword j of
 * 4 weight rows (one per lane) for 4 activation rows at once: a vpdpbusd
 * then makes 16 (weight row, activation row) dots and each of them collects
 * a whole block in one lane, with no reduction across lanes (the AVX-512
 * quad kernel, q8_quads_avx512.c). Quads repeat what the rows hold; the
 * rows stay complete for kernels that do not use quads.
 *
 * Where the quad kernel takes over, measured with bench_gemm on 2 threads
 * (bench/SPEC.md, 2026-12-06), a quad pass with 2 or 3 of its 4 rows real
 * against the per-row kernel:
 *   3 rows: faster or as fast everywhere. SmolLM2-135M layer 1.57-1.80x;
 *     Llama-3.2-1B layer q8_0 1.34x, q4_0 1.25x, q4_K 1.12x, q5_K 1.06x,
 *     iq4_xs 1.02x; 8,192-column rows 1.9-2.3x; 1,536 columns 0.95-1.0x.
 *   2 rows: faster on short rows, where the per-row kernel's fixed cost per
 *     output (its lane reduction, its setup) weighs on a short dot product:
 *     576 columns 1.2-1.8x (the 135M output matrix 1.76x). Slower on long
 *     ones: 1,536 columns 0.86-0.94x, 2,048 columns 0.82-0.87x. */
enum { ACT_Q8_QUAD = 4, ACT_Q8_QUAD_MIN = 3, ACT_Q8_QUAD_BLOCK = 8 * 16 + 16 + 16 };
enum { ACT_Q8_SHORT_COLS = 1024, ACT_Q8_QUAD_MIN_SHORT = 2 };
/* Q6_K batches (ACT_Q8K quads, below) carry quads from this many rows. */
enum { ACT_Q8K_Q6K_QUAD_MIN = 4 };

/* Quads of nb rows, once a batch carries them. */
static inline int act_q8_quad_count(int nb) { return (nb + ACT_Q8_QUAD - 1) / ACT_Q8_QUAD; }
/* The ACT_Q8 quads a batch of nb rows of `cols` carries (0: none). */
static inline int act_q8_nquads(int nb, int64_t cols) {
    return nb >= (cols <= ACT_Q8_SHORT_COLS ? ACT_Q8_QUAD_MIN_SHORT : ACT_Q8_QUAD_MIN) ? act_q8_quad_count(nb) : 0;
}

/* Rows b0 .. b0 + max - 1 of nb prepared rows of `kind` into a (those past
 * nb left out: the batch's last tile or quad); returns how many there are. */
static inline int act_tile_rows(act_kind kind, const void *act, int64_t cols, int nb, int b0, int max, act_row *a) {
    int n = nb - b0 < max ? nb - b0 : max;
    for (int i = 0; i < n; i++) a[i] = act_get_row(kind, act, cols, b0 + i);
    return n;
}

/* Whether batches of wtype carry quads: the types the quad kernel reads
 * (every ACT_Q8 type). */
static inline int act_q8_has_quads(int wtype) { return act_kind_of(wtype) == ACT_Q8; }

/* ACT_Q8K quads, for Q6_K and Q3_K weights (the AVX-512 batch kernel of
 * kq16_quads_avx512.c), in the same place and with the same count as ACT_Q8's
 * (after the nb rows, act_q8_quad_count(nb) of them, the last padded with zero
 * rows). Super-block k of quad q takes ACT_Q8K_QUAD_SB bytes at
 * (k * nquads + q) * ACT_Q8K_QUAD_SB:
 *   int8 q[64][4][4]: q[m][b] = elements 4m .. 4m+3 of super-block k of row 4q + b
 *   int32 off[16][4]: off[j][b] = -32 * bsums[16k + j] of row 4q + b (Q6_K's
 *     offset; Q3_K's, -4 * bsums, is off / 8, exact)
 *   float d[4]: row 4q + b's d of super-block k */
enum { ACT_Q8K_QUAD_SB = 64 * 16 + 16 * 16 + 16 };

/* Q3_K batches carry quads from this many rows: below it the per-row
 * kernel was as fast (bench_gemm, Llama-3.2-1B layer, 2 threads, 4 and 6
 * rows) or faster (5 rows: 1.64 against 1.93 ms, the second quad 3/4
 * padding). */
enum { ACT_Q8K_Q3K_QUAD_MIN = 8 };

/* The ACT_Q8K quads a batch of nb rows of wtype carries: Q6_K's from
 * ACT_Q8K_Q6K_QUAD_MIN rows, Q3_K's from ACT_Q8K_Q3K_QUAD_MIN, no other type's. */
static inline int act_q8k_nquads(int wtype, int nb) {
    if ((wtype == QTYPE_Q6_K && nb >= ACT_Q8K_Q6K_QUAD_MIN) || (wtype == QTYPE_Q3_K && nb >= ACT_Q8K_Q3K_QUAD_MIN))
        return act_q8_quad_count(nb);
    return 0;
}

/* Super-block k of quad q of ACT_Q8K activations `act` prepared for nb rows. */
static inline const int8_t *act_q8k_quad(const void *act, int64_t cols, int nb, int q, int64_t k) {
    size_t rows = (size_t)nb * act_row_bytes(ACT_Q8K, cols);
    return (const int8_t *)act + rows + ((size_t)k * (size_t)act_q8_quad_count(nb) + (size_t)q) * ACT_Q8K_QUAD_SB;
}

/* Block k of quad q of ACT_Q8 activations `act` prepared for nb rows. */
static inline const int8_t *act_q8_quad(const void *act, int64_t cols, int nb, int q, int64_t k) {
    size_t rows = (size_t)nb * act_row_bytes(ACT_Q8, cols);
    return (const int8_t *)act + rows + ((size_t)k * (size_t)act_q8_quad_count(nb) + (size_t)q) * ACT_Q8_QUAD_BLOCK;
}

/* ---- per-ISA table ----------------------------------------------------------
 * NULL entries fall back to the scalar table. Matmul entries compute rows
 * [r0, r1) of W against nb prepared rows (see kern_matmul). */
typedef void (*kern_matmul_fn)(const void *W, int64_t cols, int64_t r0, int64_t r1,
                               const void *act, int nb, float *Y, int64_t ldy);
typedef void (*kern_convert_fn)(const void *src, float *dst, int64_t n);
/* Prepares one activation row of `cols` floats into `row` (act_kind layout);
 * `off` is act_q8_off of the weight type (ACT_Q8 only). */
typedef void (*kern_act_row_fn)(const float *x, int64_t cols, int off, void *row);
/* Quantizes n floats to one type, writing what qtype_quantize_ref writes. */
typedef void (*kern_quantize_fn)(const float *src, void *dst, int64_t n);

typedef struct {
    kern_matmul_fn matmul[QTYPE_COUNT];
    kern_convert_fn dequantize[QTYPE_COUNT];
    kern_quantize_fn quantize[QTYPE_COUNT]; /* NULL: qtype_quantize_ref */
    int64_t (*first_out_of_range)(const float *x, int64_t n, float lim);
    int matmul_int_needs_vnni; /* integer matmuls use AVX-512 VNNI */
    kern_act_row_fn act_q8, act_q8k, act_q8g;
    /* Writes quads [q0, q1) of the ACT_Q8 quads of nb prepared rows (kern_act_q8_quads_ref). */
    void (*act_q8_quads)(void *act, int64_t cols, int nb, int q0, int q1);
    /* The same for ACT_Q8K quads (kern_act_q8k_quads_ref). */
    void (*act_q8k_quads)(void *act, int64_t cols, int nb, int q0, int q1);
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps);
    void (*rope)(float *x, int n_heads, int head_dim, int n_rot, const float *cos_sin, int neox);
    void (*swiglu)(float *out, const float *gate, const float *up, int64_t n);
    void (*softmax)(float *x, int64_t n);
    double (*logsumexp)(const float *x, int64_t n);
    void (*add)(float *y, const float *x, int64_t n);
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*f32_to_f16)(const float *src, uint16_t *dst, int64_t n);
    void (*f16_to_f32)(const uint16_t *src, float *dst, int64_t n);
} kern_table;

extern const kern_table kern_table_scalar;
extern const kern_table kern_table_avx2;
extern const kern_table kern_table_avx512;

/* Scalar preparers, shared by the reference and as SIMD fallbacks. */
void kern_act_q8_row_ref(const float *x, int64_t cols, int off, void *row);
void kern_act_q8k_row_ref(const float *x, int64_t cols, int off, void *row);
void kern_act_q8g_row_ref(const float *x, int64_t cols, int off, void *row);
void kern_act_q8_quads_ref(void *act, int64_t cols, int nb, int q0, int q1);
void kern_act_q8k_quads_ref(void *act, int64_t cols, int nb, int q0, int q1);

/* AVX-512 quantizers (quantize_avx512.c), bit-identical to quant.c's. */
void kern_quantize_q8_0_avx512(const float *x, void *dst, int64_t n);
void kern_quantize_q4_0_avx512(const float *x, void *dst, int64_t n);
void kern_quantize_bf16_avx512(const float *x, void *dst, int64_t n);
void kern_quantize_q6_K_avx512(const float *x, void *dst, int64_t n);
int64_t kern_first_out_of_range_avx512(const float *x, int64_t n, float lim);
void kern_act_q8_quads_avx512(void *act, int64_t cols, int nb, int q0, int q1);
void kern_act_q8k_quads_avx512(void *act, int64_t cols, int nb, int q0, int q1);

/* Q8_0 / Q4_0 rows [r0, r0 + 4 * n4) against all nb rows of ACT_Q8
 * activations prepared with quads (q8_quads_avx512.c). */
void kern_matmul_q8_quads_avx512(int wtype, const void *W, int64_t cols, int64_t r0, int64_t n4, const void *act,
                                 int nb, float *Y, int64_t ldy);

/* Q8_0 or Q4_0 (wtype) R16 rows [r0, r1) (multiples of 16) against nb rows
 * of ACT_Q8 activations prepared for wtype (r16_avx512.c; AVX-512 VNNI). */
void kern_matmul_r16_avx512(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                            float *Y, int64_t ldy);
/* The same with AVX2 integer dots (r16_avx2.c; AVX2, or AVX-512 without VNNI). */
void kern_matmul_r16_avx2(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                          float *Y, int64_t ldy);

/* Q6_K or Q3_K (wtype) rows [r0, r0 + 4 * n4) against all nb rows of
 * ACT_Q8K activations prepared with quads (kq16_quads_avx512.c). */
void kern_matmul_kq16_quads_avx512(int wtype, const void *W, int64_t cols, int64_t r0, int64_t n4, const void *act,
                                   int nb, float *Y, int64_t ldy);

/* INT4_G128 matmuls (int4_g128_avx2.c, int4_g128_avx512.c). */
void kern_matmul_int4_g128_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                                float *Y, int64_t ldy);
void kern_matmul_int4_g128_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                                  float *Y, int64_t ldy);

#endif
