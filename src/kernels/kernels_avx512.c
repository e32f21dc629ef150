/* AVX-512 kernels (F/BW/DQ/VL; the integer matmuls also VNNI). This file is
 * compiled with those flags only and reached only through kern_table_avx512
 * when the CPU has them; kernels.c routes the integer matmuls to AVX2 on
 * AVX-512 CPUs without VNNI. Each function computes what its `_ref` in
 * kernels.c or quant.c defines; tests/test_kernels.c holds them to it.
 *
 * Matmul shape: weights are decoded once into registers and applied to a
 * tile of activation rows (Q8_0 / Q4_0: a chunk of 16 blocks against up to
 * Q8_NB rows, or for batches that carry quads -- 3 or more rows, 2 or more
 * of short rows, act_q8_nquads -- 4 weight rows against 4 activation rows
 * per instruction, q8_quads_avx512.c; others: a block
 * against up to MM_NB rows); further tiles re-read the
 * weights from L1 or L2, so DRAM sees every weight once per call, and the
 * stream is prefetched a page ahead (kern_pf_pages). Each output's
 * arithmetic is independent of nb and of the tiling, so results are
 * batch-invariant. */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

enum { MM_NB = 8 }; /* activation rows per register tile (32 vector registers) */

INLINE __mmask16 tail16(int64_t n) { return (__mmask16)((1u << n) - 1); }


/* ---- activation preparation (bit-identical to kern_act_q8*_row_ref) ---- */

static void act_q8_row_avx512(const float *x, int64_t cols, int off, void *row) {
    act_row a = act_sections(ACT_Q8, cols, row);
    int64_t nblk = cols / 32, nslot = (nblk + 15) / 16 * 16;
    for (int64_t k = 0; k < nblk; k++, x += 32) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        __m512 iv = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, iv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, iv));
        a.d[act_q8_slot(k)] = d;
        a.sa[act_q8_slot(k)] = off * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        _mm_storeu_si128((__m128i *)(a.qs + act_q8_qs(k, 0)), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(a.qs + act_q8_qs(k, 16)), _mm512_cvtsepi32_epi8(q1));
    }
    for (int64_t k = nblk; k < (nblk + 3) / 4 * 4; k++) {
        _mm_storeu_si128((__m128i *)(a.qs + act_q8_qs(k, 0)), _mm_setzero_si128());
        _mm_storeu_si128((__m128i *)(a.qs + act_q8_qs(k, 16)), _mm_setzero_si128());
    }
    for (int64_t k = nblk; k < nslot; k++) {
        a.d[act_q8_slot(k)] = 0;
        a.sa[act_q8_slot(k)] = 0;
    }
}

static void act_q8k_row_avx512(const float *x, int64_t cols, int off, void *row) {
    act_row a = act_sections(ACT_Q8K, cols, row);
    for (int64_t k = 0; k < cols / QK_K; k++, x += QK_K) {
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < QK_K; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
        float amax = _mm512_reduce_max_ps(m);
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        a.d[k] = d;
        __m512 iv = _mm512_set1_ps(id);
        for (int i = 0; i < QK_K; i += 16) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), iv));
            a.bsums[16 * k + i / 16] = (int16_t)_mm512_reduce_add_epi32(q);
            _mm_storeu_si128((__m128i *)(a.qs + QK_K * k + i), _mm512_cvtsepi32_epi8(q));
        }
    }
}

/* ---- F32 / F16 / BF16 weights against F32 activations ---- */

INLINE __m512 load16_w(int wtype, const void *w, int64_t c) {
    if (wtype == QTYPE_F32) return _mm512_loadu_ps((const float *)w + c);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + c));
    if (wtype == QTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The first n (< 16) weights from column c, zeros after. */
INLINE __m512 load16_w_tail(int wtype, const void *w, int64_t c, __mmask16 m) {
    if (wtype == QTYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)w + c);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + c);
    if (wtype == QTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* One weight row `w` against NB F32 rows x[b]; writes y[b * ldy]. Two
 * accumulators per row hide the FMA latency when NB is small. */
INLINE void mm_float_row(int wtype, const void *w, int64_t cols, const float *const *x, float *y,
                         int64_t ldy, const int NB) {
    __m512 acc0[MM_NB], acc1[MM_NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) acc0[b] = acc1[b] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) {
        __m512 w0 = load16_w(wtype, w, c), w1 = load16_w(wtype, w, c + 16);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            acc0[b] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[b] + c), acc0[b]);
            acc1[b] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[b] + c + 16), acc1[b]);
        }
    }
    if (c + 16 <= cols) {
        __m512 w0 = load16_w(wtype, w, c);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) acc0[b] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[b] + c), acc0[b]);
        c += 16;
    }
    if (c < cols) {
        __mmask16 m = tail16(cols - c);
        __m512 w0 = load16_w_tail(wtype, w, c, m);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) acc1[b] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x[b] + c), acc1[b]);
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) y[b * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[b], acc1[b]));
}

INLINE void mm_float(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                     int nb, float *Y, int64_t ldy) {
    size_t wrow = (size_t)cols * (wtype == QTYPE_F32 ? 4 : 2);
    kern_pf_start((const char *)W + (size_t)r0 * wrow);
    for (int64_t r = r0; r < r1; r++) {
        const void *w = (const char *)W + (size_t)r * wrow;
        kern_pf_pages(w, wrow);
        for (int b0 = 0; b0 < nb; b0 += MM_NB) {
            const float *x[MM_NB];
            int n = nb - b0 < MM_NB ? nb - b0 : MM_NB;
            for (int b = 0; b < n; b++) x[b] = act_get_row(ACT_F32, act, cols, b0 + b).x;
            float *y = Y + (int64_t)b0 * ldy + r;
            switch (n) {
            case 1: mm_float_row(wtype, w, cols, x, y, ldy, 1); break;
            case 2: mm_float_row(wtype, w, cols, x, y, ldy, 2); break;
            case 3: mm_float_row(wtype, w, cols, x, y, ldy, 3); break;
            case 4: mm_float_row(wtype, w, cols, x, y, ldy, 4); break;
            case 5: mm_float_row(wtype, w, cols, x, y, ldy, 5); break;
            case 6: mm_float_row(wtype, w, cols, x, y, ldy, 6); break;
            case 7: mm_float_row(wtype, w, cols, x, y, ldy, 7); break;
            default: mm_float_row(wtype, w, cols, x, y, ldy, 8); break;
            }
        }
    }
}

static void matmul_f32_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                              int nb, float *Y, int64_t ldy) {
    mm_float(QTYPE_F32, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_f16_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                              int nb, float *Y, int64_t ldy) {
    mm_float(QTYPE_F16, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_bf16_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_float(QTYPE_BF16, W, cols, r0, r1, act, nb, Y, ldy);
}

/* ---- Q8_0 / Q4_0 / Q5_0 weights against ACT_Q8 (VNNI) ----
 * vpdpbusd multiplies unsigned by signed bytes, so weights enter unsigned:
 * Q8_0 as w + 128 (w ^ 0x80), Q4_0 as its raw nibbles w + 8, Q5_0 as its
 * nibbles with the high bit set in by a byte mask (w + 16), IQ4_NL as its
 * codes' grid values + 128 (a byte lookup of the nibbles). The offset
 * comes off in integers (sa = off * sum(a), see ACT_Q8), so each block's dot
 * is exact and the float work is one multiply-add per block:
 *
 *   acc[slot(k)] += (float)dot_k * (dw_k * da_k),   then one 16-lane sum,
 *
 * with slot(k) = act_q8_slot(k) and the fixed tree of q8_reduce16. Every
 * output follows exactly these steps whatever nb, the tiling (per-row or
 * batch kernel) and the row range, so batched verification reproduces
 * decode bit for bit; kernels_avx2.c follows them too, so the two ISAs agree
 * bit for bit as well.
 *
 * A row is walked in chunks of 16 blocks (the last one shorter), a chunk in
 * groups of 4 consecutive blocks. On Zen 4 a 64-byte load that crosses a
 * cache line costs about two, so a chunk is read with one load per 64 bytes
 * (Q8_0: 2 x 5 loads for 2 x 272 bytes; Q4_0: 5 loads for 288 bytes) and the
 * blocks are cut out of them by word permutes (vpermt2w): for each group one
 * zmm of the first 16 bytes of its 4 blocks and one of their last 16 (Q4_0:
 * the 4 x 16 nibble bytes, split into low and high nibbles), which meet the
 * grouped activations; two vpdpbusd leave 4 int32 partial sums per block and
 * a 3-step unpack tree turns the 4 groups into the chunk's 16 block dots in
 * slot order. The f16 scales come out of the same loads by masked word
 * permutes, without gathers. A chunk is decoded once into registers and
 * applied to up to Q8_NB activation rows. Loads that would run past the
 * chunk are masked, so nothing is read outside the rows.
 *
 * For SmolLM2-135M (rows of 18 and 48 blocks) on Zen 4 this streams about
 * 30 GB/s (Q8_0) and 20 GB/s (Q4_0) from L2, 45 and 34 GB/s on rows of
 * 4096 columns, against ~23 GB/s that DRAM gives a read loop on 4 KB pages:
 * decode of a whole model then runs at 85-90% of that. (On Zen 4, vpermt2w
 * and other lane-crossing shuffles compete with vpdpbusd and FMA for the
 * same pipes; the 2-3 permutes per 136 bytes are what the load savings
 * cost.) */

enum { Q8_NB = 16 }; /* activation rows per pass of the per-row kernels (accumulators on the stack) */

/* The 16 block dots of a chunk from its 4 groups' partial sums (128-bit lane
 * l of w[g] = 4 partial sums of block 4g + l): slot 4l + g = block 4g + l. */
INLINE __m512i q8_tree(__m512i w0, __m512i w1, __m512i w2, __m512i w3) {
    __m512i x01 = _mm512_add_epi32(_mm512_unpacklo_epi32(w0, w1), _mm512_unpackhi_epi32(w0, w1));
    __m512i x23 = _mm512_add_epi32(_mm512_unpacklo_epi32(w2, w3), _mm512_unpackhi_epi32(w2, w3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(x01, x23), _mm512_unpackhi_epi64(x01, x23));
}

/* Sum of 16 lanes by the fixed tree (j, j+8), (j, j+4), (j, j+2), (0, 1). */
INLINE float q8_reduce16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* Keeps a loaded vector in a register: the compiler would otherwise fold the
 * same (line-crossing, so costly) load into several instructions. */
#define Q8_REG(v) __asm__("" : "+v"(v))

/* Word indices (vpermt2w over 2 x 32 words) of a group's block halves:
 * Q8_0 block j of a group at word 0 has its scale at word 17j, its first 16
 * bytes at words 17j + 1 .. 17j + 8 and its last 16 at 17j + 9 .. 17j + 16
 * (lane 8j + t takes the t-th word of a half); Q4_0 block j has its scale at
 * 9j and its 16 nibble bytes at 9j + 1 .. 9j + 8. */
static const uint16_t q8_idx_lo[32] = {1,  2,  3,  4,  5,  6,  7,  8,  18, 19, 20, 21, 22, 23, 24, 25,
                                       35, 36, 37, 38, 39, 40, 41, 42, 52, 53, 54, 55, 56, 57, 58, 59};
static const uint16_t q8_idx_hi[32] = {9,  10, 11, 12, 13, 14, 15, 16, 26, 27, 28, 29, 30, 31, 32, 33,
                                       43, 44, 45, 46, 47, 48, 49, 50, 60, 61, 62, 63, 64, 65, 66, 67};
static const uint16_t q4_idx[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12, 13, 14, 15, 16, 17,
                                    19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31, 32, 33, 34, 35};

/* Q5_0, Q4_1 and Q5_1 (blocks of W = 11, 10, 12 words) read group g
 * (blocks 4g .. 4g + 3, 4W words from byte 8Wg of the chunk) by two loads,
 * 64 bytes at 8Wg and the group's other 8W - 64 bytes after them (words
 * 0..31 and 32.. of a vpermt2w pair): block j has its scale at word Wj (Q4_1,
 * Q5_1: its minimum at Wj + 1), its 32 high bits (Q5_0, Q5_1) at Wj + W - 10
 * (elements 0-15) and Wj + W - 9 (16-31), its 16 nibble bytes in its last 8
 * words. q8g_idx puts block j's nibble bytes in lane j; q8g_qh_idx puts the
 * 4 blocks' low high-bit words, then their high ones, in words 0..7, so that
 * qword 0 is the byte mask of elements 0-15 of the 4 lanes and qword 1 that
 * of elements 16-31. */
#define Q8G_IDX(W)                                                                                         \
    {W - 8,         W - 7,         W - 6,         W - 5,         W - 4,         W - 3,         W - 2,     \
     W - 1,         2 * W - 8,     2 * W - 7,     2 * W - 6,     2 * W - 5,     2 * W - 4,     2 * W - 3, \
     2 * W - 2,     2 * W - 1,     3 * W - 8,     3 * W - 7,     3 * W - 6,     3 * W - 5,     3 * W - 4, \
     3 * W - 3,     3 * W - 2,     3 * W - 1,     4 * W - 8,     4 * W - 7,     4 * W - 6,     4 * W - 5, \
     4 * W - 4,     4 * W - 3,     4 * W - 2,     4 * W - 1}
#define Q8G_QH_IDX(W) {W - 10, 2 * W - 10, 3 * W - 10, 4 * W - 10, W - 9, 2 * W - 9, 3 * W - 9, 4 * W - 9}
static const uint16_t q8g_idx[3][32] = {Q8G_IDX(11), Q8G_IDX(10), Q8G_IDX(12)};
static const uint16_t q8g_qh_idx[3][32] = {Q8G_QH_IDX(11), {0}, Q8G_QH_IDX(12)};

/* Which of q8g_idx's types: 0 Q5_0, 1 Q4_1, 2 Q5_1, -1 not read by groups. */
INLINE int q8g_kind(int wtype) {
    return wtype == QTYPE_Q5_0 ? 0 : wtype == QTYPE_Q4_1 ? 1 : wtype == QTYPE_Q5_1 ? 2 : -1;
}

/* A decoded chunk: unsigned weight bytes of group g's first halves lo[g]
 * and last halves hi[g], and the chunk's block scales as floats by slot
 * (zero in slots without a block). */
typedef struct {
    __m512i lo[4], hi[4];
    __m512 dw, mw; /* mw: the blocks' minimums by slot (Q4_1, Q5_1) */
} q8_chunk;

/* Word masks of a chunk's loads: all words, or those inside its `bytes`. */
typedef struct {
    __mmask32 m[10];
} q8_lmask;

INLINE __mmask32 q8_words(int64_t words) {
    return words <= 0 ? 0 : words >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << words) - 1);
}

/* Load i of a chunk sits at byte q8_load_off(wtype, i): Q8_0 in two units of
 * 8 blocks (272 bytes), each read by 5 loads 64 bytes apart; Q4_0 by 5
 * loads 64 bytes apart; Q5_0, Q4_1 and Q5_1 by two per group (q8g_idx). */
INLINE int q8_load_off(int wtype, int i) {
    return wtype == QTYPE_Q8_0       ? 272 * (i / 5) + 64 * (i % 5)
           : q8g_kind(wtype) >= 0    ? 4 * q32_block_bytes(wtype) * (i / 2) + 64 * (i % 2)
                                     : 64 * i;
}

INLINE q8_lmask q8_chunk_mask(int wtype, int64_t bytes) {
    q8_lmask m;
    for (int i = 0; i < 10; i++) m.m[i] = q8_words((bytes - q8_load_off(wtype, i)) / 2);
    return m;
}

/* Decodes the NG groups (4 unless this is a row's last, short chunk) of the
 * chunk at p. FULL: a whole chunk, whose loads only need masks lm where they
 * would run past it; otherwise every load takes its mask. */
INLINE q8_chunk q8_decode(int wtype, const char *p, const int NG, const int FULL, const q8_lmask *lm) {
    q8_chunk c;
    __m512i s; /* the scales' source words by slot, replaced group by group (vpermi2w) */
    if (wtype == QTYPE_Q8_0) {
        const __m512i il = _mm512_loadu_si512((const void *)q8_idx_lo);
        const __m512i ih = _mm512_loadu_si512((const void *)q8_idx_hi);
        const __m512i four = _mm512_set1_epi16(4), flip = _mm512_set1_epi8((char)0x80);
        /* slot 4l + g: word 17l of group g's unit, + 4 for the unit's second group */
        s = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 55, 51, 55, 51, 38, 34, 38, 34, 21,
                             17, 21, 17, 4, 0, 4, 0);
#pragma GCC unroll 2
        for (int u = 0; u < (NG + 1) / 2; u++) {
            const char *q = p + 272 * u;
            __m512i z[5];
#pragma GCC unroll 5
            for (int i = 0; i < 5; i++) {
                z[i] = FULL && i < 4 ? _mm512_loadu_si512((const void *)(q + 64 * i))
                                        : _mm512_maskz_loadu_epi16(lm->m[5 * u + i], q + 64 * i);
                Q8_REG(z[i]);
            }
            /* first group: words 0..67 of z0 z1 z2; second: words 4..71 of z2 z3 z4 */
            int g = 2 * u;
            c.lo[g] = _mm512_permutex2var_epi16(z[0], il, z[1]);
            __m512i h = _mm512_permutex2var_epi16(z[0], ih, z[1]);
            c.hi[g] = _mm512_mask_permutexvar_epi16(h, 0xF0000000u, ih, z[2]);
            s = _mm512_mask2_permutex2var_epi16(z[0], s, (__mmask32)(0x1111u << g), z[1]);
            if (g + 1 < NG) {
                __m512i il4 = _mm512_add_epi16(il, four), ih4 = _mm512_add_epi16(ih, four);
                c.lo[g + 1] = _mm512_permutex2var_epi16(z[2], il4, z[3]);
                h = _mm512_permutex2var_epi16(z[2], ih4, z[3]);
                c.hi[g + 1] = _mm512_mask_permutexvar_epi16(h, 0xFF000000u, ih4, z[4]);
                s = _mm512_mask2_permutex2var_epi16(z[2], s, (__mmask32)(0x1111u << (g + 1)), z[3]);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            c.lo[g] = _mm512_xor_si512(c.lo[g], flip);
            c.hi[g] = _mm512_xor_si512(c.hi[g], flip);
        }
    } else if (wtype == QTYPE_Q4_K || wtype == QTYPE_Q5_K) {
        /* Q4_K and Q5_K as 8 blocks of 32 per super-block (with a minimum, as
         * Q4_1 and Q5_1: scale d sc[j] and minimum -(dmin m[j]), both exact
         * in F32), so a chunk is 2 super-blocks. Super-block h (groups 2h, 2h
         * + 1; the chunk's second is absent when NG == 2): group 2h + e is
         * sub-blocks 4e .. 4e + 3, the low / high nibbles of qs[64e ..] and
         * qs[64e + 32 ..]; Q5_K: element i of sub-block j adds 16 where bit j
         * of qh[i] is set */
        const int Q5 = wtype == QTYPE_Q5_K;
        const size_t sbb = Q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
        const size_t qso = Q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
        const __m512i b16 = _mm512_set1_epi8(0x10);
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m512i shv = _mm512_setr_epi64(0, 0, 0x0004000400040004ll, 0x0004000400040004ll, 0, 0,
                                              0x0004000400040004ll, 0x0004000400040004ll);
        __m128i sm[2] = {_mm_setzero_si128(), _mm_setzero_si128()};
        uint32_t dd[2] = {0, 0};
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) c.lo[g] = c.hi[g] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int h = 0; h < NG / 2; h++) {
            const char *sb = p + sbb * (size_t)h;
            sm[h] = q4k_scales_vec((const uint8_t *)sb + offsetof(block_q4_K, scales));
            memcpy(&dd[h], sb, 4);
            __m512i qh0 = _mm512_setzero_si512(), qh1 = _mm512_setzero_si512();
            if (Q5) { /* qh[0 .. 15] (elements 0-15) and qh[16 .. 31] in every lane */
                qh0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(sb + offsetof(block_q5_K, qh))));
                qh1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(sb + offsetof(block_q5_K, qh) + 16)));
            }
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                __m512i z = _mm512_loadu_si512((const void *)(sb + qso + 64 * e));
                c.lo[2 * h + e] = _mm512_and_si512(_mm512_srlv_epi16(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(2, 2, 0, 0)), shv), m4);
                c.hi[2 * h + e] = _mm512_and_si512(_mm512_srlv_epi16(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 3, 1, 1)), shv), m4);
                if (Q5) { /* lane l: sub-block 4e + l, its bit of qh */
                    const __m512i bit = e ? _mm512_set_epi32(0x80808080, 0x80808080, 0x80808080, 0x80808080, 0x40404040,
                                                             0x40404040, 0x40404040, 0x40404040, 0x20202020, 0x20202020,
                                                             0x20202020, 0x20202020, 0x10101010, 0x10101010, 0x10101010,
                                                             0x10101010)
                                          : _mm512_set_epi32(0x08080808, 0x08080808, 0x08080808, 0x08080808, 0x04040404,
                                                             0x04040404, 0x04040404, 0x04040404, 0x02020202, 0x02020202,
                                                             0x02020202, 0x02020202, 0x01010101, 0x01010101, 0x01010101,
                                                             0x01010101);
                    c.lo[2 * h + e] = _mm512_mask_add_epi8(c.lo[2 * h + e], _mm512_test_epi8_mask(qh0, bit), c.lo[2 * h + e], b16);
                    c.hi[2 * h + e] = _mm512_mask_add_epi8(c.hi[2 * h + e], _mm512_test_epi8_mask(qh1, bit), c.hi[2 * h + e], b16);
                }
            }
        }
        /* slot 4l + g: sub-block 4 (g % 2) + l of super-block g / 2 */
        const __m128i tr = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __m128i scs = _mm_shuffle_epi8(_mm_unpacklo_epi64(sm[0], sm[1]), tr);
        const __m128i mns = _mm_shuffle_epi8(_mm_unpackhi_epi64(sm[0], sm[1]), tr);
        /* d (dmin) of super-block g / 2 in lanes with g = lane % 4 */
        const __m128 f = _mm_cvtph_ps(_mm_setr_epi32((int)dd[0], (int)dd[1], 0, 0)); /* dA dminA dB dminB */
        const __m512 dv = _mm512_broadcast_f32x4(_mm_shuffle_ps(f, f, _MM_SHUFFLE(2, 2, 0, 0)));
        const __m512 mv = _mm512_broadcast_f32x4(_mm_shuffle_ps(f, f, _MM_SHUFFLE(3, 3, 1, 1)));
        c.dw = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(scs)), dv);
        c.mw = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mns)), mv));
        return c;
    } else if (wtype == QTYPE_IQ4_XS) {
        /* IQ4_XS as 8 IQ4_NL-like blocks of 32 per super-block (scale d
         * (ls[j] - 32), exact in F32), so a chunk is 2 super-blocks. Group 2h
         * + e (the chunk's second super-block absent when NG == 2) is
         * sub-blocks 4e .. 4e + 3 of super-block h: their code bytes are
         * qs[64e .. 64e + 63] in the order the activations' groups hold their
         * halves, so one load and a lookup decode 4 blocks. */
        const __m512i m4 = _mm512_set1_epi8(0x0F), lut = iq4_lut_u8();
        uint64_t hd[2] = {0, 0}; /* d, scales_h, scales_l of each super-block */
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) c.lo[g] = c.hi[g] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int h = 0; h < NG / 2; h++) {
            const char *sb = p + sizeof(block_iq4_xs) * (size_t)h;
            memcpy(&hd[h], sb, 8);
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                __m512i z = _mm512_loadu_si512((const void *)(sb + offsetof(block_iq4_xs, qs) + 64 * e));
                c.lo[2 * h + e] = _mm512_shuffle_epi8(lut, _mm512_and_si512(z, m4));
                c.hi[2 * h + e] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
            }
        }
        /* slot s = 4l + g: sub-block j = 4 (g % 2) + l of super-block h = g / 2;
         * ls = (scales_l >> 4j) & 15 | ((scales_h >> 2j) & 3) << 4 */
        const __m512i x = _mm512_castsi128_si512(_mm_set_epi64x((long long)hd[1], (long long)hd[0]));
        const __m512i hsel = _mm512_set_epi32(2, 2, 0, 0, 2, 2, 0, 0, 2, 2, 0, 0, 2, 2, 0, 0);
        const __m512i jv = _mm512_set_epi32(7, 3, 7, 3, 6, 2, 6, 2, 5, 1, 5, 1, 4, 0, 4, 0);
        const __m512i dh = _mm512_permutexvar_epi32(hsel, x); /* d | scales_h << 16 */
        const __m512i sl = _mm512_permutexvar_epi32(_mm512_add_epi32(hsel, _mm512_set1_epi32(1)), x);
        const __m512i lo4 = _mm512_and_si512(_mm512_srlv_epi32(sl, _mm512_slli_epi32(jv, 2)), _mm512_set1_epi32(15));
        const __m512i hi2 = _mm512_and_si512(
            _mm512_srlv_epi32(dh, _mm512_add_epi32(_mm512_slli_epi32(jv, 1), _mm512_set1_epi32(16))), _mm512_set1_epi32(3));
        const __m512i ls = _mm512_sub_epi32(_mm512_or_si512(lo4, _mm512_slli_epi32(hi2, 4)), _mm512_set1_epi32(32));
        const __m512 dv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dh)); /* the low words: d */
        const __mmask16 present = (__mmask16)(NG == 4 ? 0xFFFF : 0x3333);
        c.dw = _mm512_maskz_mul_ps(present, _mm512_cvtepi32_ps(ls), dv);
        return c;
    } else if (q8g_kind(wtype) >= 0) {
        const int kind = q8g_kind(wtype), W = q32_block_bytes(wtype) / 2, HB = wtype != QTYPE_Q4_1;
        const __m512i idx = _mm512_loadu_si512((const void *)q8g_idx[kind]);
        const __m512i hidx = _mm512_loadu_si512((const void *)q8g_qh_idx[kind]);
        const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
        /* slot 4l + g: word Wl of group g's loads (the minimum: Wl + 1) */
        s = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3 * W, 3 * W, 3 * W, 3 * W, 2 * W, 2 * W,
                             2 * W, 2 * W, W, W, W, W, 0, 0, 0, 0);
        __m512i sm = _mm512_add_epi16(s, _mm512_set1_epi16(1));
        const __mmask32 z1_words = (__mmask32)((1u << (4 * W - 32)) - 1);
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            const char *q = p + 8 * W * g;
            /* the second load stops at the group's bytes (the chunk's last group ends the chunk) */
            __m512i z0 = FULL ? _mm512_loadu_si512((const void *)q) : _mm512_maskz_loadu_epi16(lm->m[2 * g], q);
            __m512i z1 = _mm512_maskz_loadu_epi16(lm->m[2 * g + 1] & z1_words, q + 64);
            Q8_REG(z0);
            Q8_REG(z1);
            __m512i x = _mm512_permutex2var_epi16(z0, idx, z1);
            c.lo[g] = _mm512_and_si512(x, m4);
            c.hi[g] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
            if (HB) {
                __m128i hb = _mm512_castsi512_si128(_mm512_permutex2var_epi16(z0, hidx, z1));
                __mmask64 mlo = (__mmask64)_mm_cvtsi128_si64(hb), mhi = (__mmask64)_mm_extract_epi64(hb, 1);
                c.lo[g] = _mm512_or_si512(c.lo[g], _mm512_maskz_mov_epi8(mlo, b4));
                c.hi[g] = _mm512_or_si512(c.hi[g], _mm512_maskz_mov_epi8(mhi, b4));
            }
            s = _mm512_mask2_permutex2var_epi16(z0, s, (__mmask32)(0x1111u << g), z1);
            if (q32_has_min(wtype)) sm = _mm512_mask2_permutex2var_epi16(z0, sm, (__mmask32)(0x1111u << g), z1);
        }
        if (q32_has_min(wtype)) {
            __mmask16 present = (__mmask16)(NG == 4 ? 0xFFFF : (0x1111u << NG) - 0x1111u);
            c.mw = _mm512_maskz_cvtph_ps(present, _mm512_castsi512_si256(sm));
        }
    } else {
        /* Q4_0; IQ4_NL: the same nibbles, then their grid values + 128 (a byte lookup) */
        const __m512i idx = _mm512_loadu_si512((const void *)q4_idx);
        const __m512i m4 = _mm512_set1_epi8(0x0F), lut = iq4_lut_u8();
        /* slot 4l + g: word 4g + 9l of loads g, g + 1 */
        s = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 39, 35, 31, 27, 30, 26, 22, 18, 21, 17,
                             13, 9, 12, 8, 4, 0);
        __m512i z[5];
#pragma GCC unroll 5
        for (int i = 0; i <= NG; i++) {
            z[i] = FULL && i < 4 ? _mm512_loadu_si512((const void *)(p + 64 * i))
                                    : _mm512_maskz_loadu_epi16(lm->m[i], p + 64 * i);
            Q8_REG(z[i]);
        }
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            /* group g: words 4g .. 4g + 35 of loads g, g + 1 */
            __m512i x = _mm512_permutex2var_epi16(z[g], _mm512_add_epi16(idx, _mm512_set1_epi16((short)(4 * g))), z[g + 1]);
            c.lo[g] = _mm512_and_si512(x, m4);
            c.hi[g] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
            if (wtype == QTYPE_IQ4_NL) {
                c.lo[g] = _mm512_shuffle_epi8(lut, c.lo[g]);
                c.hi[g] = _mm512_shuffle_epi8(lut, c.hi[g]);
            }
            s = _mm512_mask2_permutex2var_epi16(z[g], s, (__mmask32)(0x1111u << g), z[g + 1]);
        }
    }
    /* slots of absent groups still hold indices; absent blocks of a present group read 0 */
    __mmask16 present = (__mmask16)(NG == 4 ? 0xFFFF : (0x1111u << NG) - 0x1111u);
    c.dw = _mm512_maskz_cvtph_ps(present, _mm512_castsi512_si256(s));
#pragma GCC unroll 4
    for (int g = NG; g < 4; g++) c.lo[g] = c.hi[g] = _mm512_setzero_si512();
    return c;
}

/* The last, short chunk of a row of T (1-4) blocks at p, Q8_0, Q4_0 or
 * IQ4_NL (q8_tail_direct), with the values q8_decode(wtype, p, 1, 0, mask
 * of T blocks) gives: absent blocks' bytes 0 (then flipped, or looked up, as
 * the present ones), their scales 0. It reads each block by 16-byte loads
 * inside it, with no masks and no word permutes: the general path made the
 * 2-block tail of a SmolLM2-135M row (576 columns) cost over half a full
 * chunk. */
INLINE int q8_tail_direct(int wtype, int64_t tail) {
    return tail <= 4 && (wtype == QTYPE_Q8_0 || wtype == QTYPE_Q4_0 || wtype == QTYPE_IQ4_NL);
}
INLINE q8_chunk q8_decode_tail(int wtype, const char *p, const int T) {
    q8_chunk c;
    const int Q8 = wtype == QTYPE_Q8_0, bsz = q32_block_bytes(wtype);
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    __m256i d = _mm256_setzero_si256();
#define Q8_TAIL_BLOCK(J)                                                                                   \
    if (T > (J)) {                                                                                         \
        const char *b_ = p + (J) * bsz;                                                                    \
        int16_t d_;                                                                                        \
        memcpy(&d_, b_, 2);                                                                                \
        lo = _mm512_inserti32x4(lo, _mm_loadu_si128((const __m128i *)(b_ + 2)), (J));                      \
        if (Q8) hi = _mm512_inserti32x4(hi, _mm_loadu_si128((const __m128i *)(b_ + 18)), (J));            \
        d = _mm256_insert_epi16(d, d_, 4 * (J));                                                           \
    }
    Q8_TAIL_BLOCK(0) Q8_TAIL_BLOCK(1) Q8_TAIL_BLOCK(2) Q8_TAIL_BLOCK(3)
#undef Q8_TAIL_BLOCK
    if (Q8) {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        c.lo[0] = _mm512_xor_si512(lo, flip);
        c.hi[0] = _mm512_xor_si512(hi, flip);
    } else {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        c.lo[0] = _mm512_and_si512(lo, m4);
        c.hi[0] = _mm512_and_si512(_mm512_srli_epi16(lo, 4), m4);
        if (wtype == QTYPE_IQ4_NL) {
            const __m512i lut = iq4_lut_u8();
            c.lo[0] = _mm512_shuffle_epi8(lut, c.lo[0]);
            c.hi[0] = _mm512_shuffle_epi8(lut, c.hi[0]);
        }
    }
    c.lo[1] = c.hi[1] = c.lo[2] = c.hi[2] = c.lo[3] = c.hi[3] = _mm512_setzero_si512();
    c.dw = _mm512_cvtph_ps(d);
    c.mw = _mm512_setzero_ps();
    return c;
}

/* Adds decoded chunk `c` (chunk index ci) times activation row a into acc. */
INLINE __m512 q8_apply(const q8_chunk *c, const act_row *a, int64_t ci, const int NG, const int MIN, __m512 acc) {
    const int8_t *q = a->qs + 512 * ci;
    __m512i w[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        if (g < NG) {
            __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c->lo[g], _mm512_loadu_si512((const void *)(q + 128 * g)));
            w[g] = _mm512_dpbusd_epi32(t, c->hi[g], _mm512_loadu_si512((const void *)(q + 128 * g + 64)));
        } else {
            w[g] = _mm512_setzero_si512();
        }
    }
    const __m512i sa = _mm512_loadu_si512((const void *)(a->sa + 16 * ci));
    const __m512 da = _mm512_loadu_ps(a->d + 16 * ci);
    if (MIN) { /* Q4_1, Q5_1: the values' dot, then the minimum times the activations' sum (q32_has_min) */
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q8_tree(w[0], w[1], w[2], w[3])), _mm512_mul_ps(c->dw, da), acc);
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sa), _mm512_mul_ps(c->mw, da), acc);
    }
    __m512i dot = _mm512_sub_epi32(q8_tree(w[0], w[1], w[2], w[3]), sa);
    __m512 sc = _mm512_mul_ps(c->dw, da);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc);
}

/* A row's last chunk at p, of tail blocks (1-15), by q8_decode with masks,
 * times activation rows a[0 .. nb) into acc[0 .. nb) (chunk index ci). */
INLINE void q8_tail_apply(int wtype, const char *p, int64_t tail, const q8_lmask *tail_mask, const act_row *a, int nb,
                          int64_t ci, __m512 *acc) {
    const int MIN = q32_has_min(wtype);
#define Q8_TAIL(NG_)                                                                                  \
    case NG_: {                                                                                       \
        q8_chunk c = q8_decode(wtype, p, NG_, 0, tail_mask);                                          \
        for (int b = 0; b < nb; b++) acc[b] = q8_apply(&c, &a[b], ci, NG_, MIN, acc[b]);              \
        break;                                                                                        \
    }
    switch ((tail + 3) / 4) {
        Q8_TAIL(1) Q8_TAIL(2) Q8_TAIL(3) Q8_TAIL(4)
    }
#undef Q8_TAIL
}

/* A weight row's layout for the row kernels: bytes, whole chunks of 16
 * blocks, blocks in the last short chunk, and the load masks of each. */
typedef struct {
    int bsz;
    size_t wrow;
    int64_t nfull, tail;
    q8_lmask full_mask, tail_mask;
} q8_row_shape;

INLINE q8_row_shape q8_shape(int wtype, int64_t nblk) {
    q8_row_shape sh = {.bsz = q32_block_bytes(wtype), .nfull = nblk / 16, .tail = nblk % 16};
    sh.wrow = (size_t)nblk * (size_t)sh.bsz;
    sh.full_mask = q8_chunk_mask(wtype, 16 * sh.bsz);
    sh.tail_mask = q8_chunk_mask(wtype, sh.tail * sh.bsz);
    return sh;
}

/* Rows [r0, r1) against activation rows a[0 .. nb) (2 <= nb <= Q8_NB);
 * writes y[b * ldy + r]. One activation row: mm_q8_row1. */
INLINE void mm_q8_rows(int wtype, const char *W, int64_t nblk, int64_t r0, int64_t r1, const act_row *a, int nb,
                       float *y, int64_t ldy) {
    const int MIN = q32_has_min(wtype);
    const q8_row_shape sh = q8_shape(wtype, nblk);
    kern_pf_start(W + (size_t)r0 * sh.wrow);
    for (int64_t r = r0; r < r1; r++) {
        const char *p = W + (size_t)r * sh.wrow;
        __m512 acc[Q8_NB];
        for (int b = 0; b < nb; b++) acc[b] = _mm512_setzero_ps();
        for (int64_t ci = 0; ci < sh.nfull; ci++, p += 16 * sh.bsz) {
            kern_pf_pages(p, 16 * (size_t)sh.bsz);
            q8_chunk c = q8_decode(wtype, p, 4, 1, &sh.full_mask);
            for (int b = 0; b < nb; b++) acc[b] = q8_apply(&c, &a[b], ci, 4, MIN, acc[b]);
        }
        if (sh.tail) {
            kern_pf_pages(p, (size_t)(sh.tail * sh.bsz));
            q8_tail_apply(wtype, p, sh.tail, &sh.tail_mask, a, nb, sh.nfull, acc);
        }
        for (int b = 0; b < nb; b++) y[b * ldy + r] = q8_reduce16(acc[b]);
    }
}

/* Rows [r0, r1) against one activation row (decode): mm_q8_rows' steps
 * with the shape of a row's last chunk a constant, TT: 0 no tail, 1-4 a
 * tail of TT blocks read by q8_decode_tail, -1 any other (q8_decode with
 * masks). Chosen per row at run time instead (one function for 1-16
 * activation rows, or this one with q8_tail_apply picking the reader), the
 * kernel ran rows of 576 columns 0.91-0.96x as fast from cache (bench_gemm
 * -H -s, one thread, Q8_0, Q4_0, IQ4_NL, 6 alternated rounds). Every line
 * is prefetched ahead (kern_pf_lines): a fixed number of prefetches per
 * chunk (kern_pf_block) with a page touch without a loop read a SmolLM2-135M
 * layer from DRAM 5-10% slower. Measurements: bench/KQUANT.md, 2026-12-06. */
INLINE void mm_q8_row1(int wtype, const char *W, int64_t nblk, int64_t r0, int64_t r1, const act_row *a, float *y,
                       const int TT) {
    const int MIN = q32_has_min(wtype);
    const q8_row_shape sh = q8_shape(wtype, nblk);
    const int bsz = sh.bsz;
    kern_pf_start(W + (size_t)r0 * sh.wrow);
    for (int64_t r = r0; r < r1; r++) {
        const char *p = W + (size_t)r * sh.wrow;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t ci = 0; ci < sh.nfull; ci++, p += 16 * bsz) {
            kern_pf_pages(p, 16 * (size_t)bsz);
            kern_pf_lines(p, 16 * (size_t)bsz);
            q8_chunk c = q8_decode(wtype, p, 4, 1, &sh.full_mask);
            acc = q8_apply(&c, a, ci, 4, MIN, acc);
        }
        if (TT > 0) {
            kern_pf_pages(p, (size_t)(TT * bsz));
            kern_pf_lines(p, (size_t)(TT * bsz));
            q8_chunk c = q8_decode_tail(wtype, p, TT);
            acc = q8_apply(&c, a, sh.nfull, 1, MIN, acc);
        } else if (TT < 0) {
            kern_pf_pages(p, (size_t)(sh.tail * bsz));
            kern_pf_lines(p, (size_t)(sh.tail * bsz));
            q8_tail_apply(wtype, p, sh.tail, &sh.tail_mask, a, 1, sh.nfull, &acc);
        }
        y[r] = q8_reduce16(acc);
    }
}

/* Rows [r0, r1): batches that carry quads (act_q8_nquads) by the quad kernel
 * (q8_quads_avx512.c) in groups of 4 weight rows, the last 0-3 weight rows
 * and smaller batches by the per-row kernels (same arithmetic). */
INLINE void mm_q8(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                  float *Y, int64_t ldy) {
    int64_t nblk = cols / 32;
    if (act_q8_has_quads(wtype) && act_q8_nquads(nb, cols)) {
        int64_t n4 = (r1 - r0) / 4;
        if (n4) kern_matmul_q8_quads_avx512(wtype, W, cols, r0, n4, act, nb, Y, ldy);
        r0 += 4 * n4;
        if (r0 == r1) return;
    }
    for (int b0 = 0; b0 < nb; b0 += Q8_NB) {
        act_row a[Q8_NB];
        int n = nb - b0 < Q8_NB ? nb - b0 : Q8_NB;
        for (int b = 0; b < n; b++) a[b] = act_get_row(ACT_Q8, act, cols, b0 + b);
        float *y = Y + (int64_t)b0 * ldy;
        if (n == 1) {
            const int64_t tail = nblk % 16;
            if (!tail) mm_q8_row1(wtype, W, nblk, r0, r1, a, y, 0);
            else if (!q8_tail_direct(wtype, tail)) mm_q8_row1(wtype, W, nblk, r0, r1, a, y, -1);
            else if (tail == 1) mm_q8_row1(wtype, W, nblk, r0, r1, a, y, 1);
            else if (tail == 2) mm_q8_row1(wtype, W, nblk, r0, r1, a, y, 2);
            else if (tail == 3) mm_q8_row1(wtype, W, nblk, r0, r1, a, y, 3);
            else mm_q8_row1(wtype, W, nblk, r0, r1, a, y, 4);
        } else {
            mm_q8_rows(wtype, W, nblk, r0, r1, a, n, y, ldy);
        }
    }
}

/* ---- Q6_K weights against ACT_Q8K (VNNI) ----
 * Per half h, one 64-byte ql load gives elements 0-63 (low nibbles) and
 * 64-127 (high nibbles) of the half in order; their top 2 bits come from the
 * 32 qh bytes (broadcast to both 256-bit halves). The bits each half needs
 * are kept first (0x33 in the low half: bits 0-1 and 4-5; 0xCC in the high
 * one), so that after the per-half 16-bit shifts bits 6-7 of every byte are
 * zero, and one vpternlog then puts the ql nibble in bits 0-3 and the qh bits
 * in bits 4-5 (3 operations per 64 weights instead of 5). q is unsigned 6-bit,
 * so maddubs then vpdpwssd with the 16-element sub-block scales; the -32
 * offset, -32 * sum_j sc[j] * bsums[j], starts the block's int32 sum as one
 * more vpdpwssd (the scales times -32 are shared by the block's rows). Every
 * lane of the int32 sum holds the same exact value in any order, so the
 * result does not depend on how the work is arranged. Each block's int32
 * lanes then meet in one exact integer isum_k, and the float work is
 * kernels.c's (matmul_q6_K_ref): acc[k % 16] = fma((float)isum_k, d * da,
 * acc[k % 16]), then q8_reduce16. A chunk of 16 blocks keeps its lane sums
 * on the stack and turns them into the 16 block sums with one transpose tree
 * (q6k_tree16), so the reduction costs a few operations per block; the
 * batch kernel (kq16_quads_avx512.c) has each block sum in a lane already and
 * takes the same float steps, so both give the same bits. With one
 * activation row (decode), each block prefetches its bytes KERN_PF_LINE_AHEAD
 * ahead (kern_pf_block; kern_pf_lines over the whole row, before the row,
 * cost about as many operations as the block's arithmetic). */

/* Level 1 of q6k_tree16 for blocks 2i and 2i + 1: lanes of a and b
 * interleaved by dwords and added within 128-bit lanes. */
INLINE __m512i q6k_pair(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}

/* The other levels: u[i] = q6k_pair(v[2i], v[2i + 1]) of 16 vectors v of 16
 * int32 lanes each, to one vector whose lane t is the sum of v[t]'s lanes
 * (qwords of pairs of u interleaved and added within 128-bit lanes, then
 * 128-bit lanes across vectors). */
INLINE __m512i q6k_tree16(const __m512i *u) {
    __m512i w[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++)
        w[t] = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2 * t], u[2 * t + 1]),
                                _mm512_unpackhi_epi64(u[2 * t], u[2 * t + 1]));
    __m512i x = _mm512_add_epi32(_mm512_shuffle_i32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512i y = _mm512_add_epi32(_mm512_shuffle_i32x4(w[2], w[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i32x4(w[2], w[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Block wk's 16 int32 lane sums against NB activation rows (super-block kb
 * of each): the per-row kernel's integer work. */
INLINE void q6k_block_lanes(const block_q6_K *wk, const act_row *a, int64_t kb, __m512i *out, const int NB) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i keep = _mm512_inserti64x4(_mm512_set1_epi8(0x33), _mm256_set1_epi8((char)0xCC), 1);
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    /* int16 lane i of the scale vector for elements 64c .. 64c+63: sc[4c + i / 8] */
    const __m512i sidx0 = _mm512_set_epi64(0x0003000300030003ll, 0x0003000300030003ll, 0x0002000200020002ll,
                                           0x0002000200020002ll, 0x0001000100010001ll, 0x0001000100010001ll, 0, 0);
    const __m512i four = _mm512_set1_epi16(4);
    const __m512i sidx1 = _mm512_add_epi16(sidx0, four), sidx2 = _mm512_add_epi16(sidx1, four),
                  sidx3 = _mm512_add_epi16(sidx2, four);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wk->scales));
    __m512i s512 = _mm512_zextsi256_si512(sc16);
    /* sc * -32 (|sc| <= 128: fits int16), zero beyond the 16 sub-blocks */
    __m512i scn = _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5)));
    __m512i sc[4], v[4];
    sc[0] = _mm512_permutexvar_epi16(sidx0, s512);
    sc[1] = _mm512_permutexvar_epi16(sidx1, s512);
    sc[2] = _mm512_permutexvar_epi16(sidx2, s512);
    sc[3] = _mm512_permutexvar_epi16(sidx3, s512);
    for (int h = 0; h < 2; h++) {
        __m512i ql = _mm512_loadu_si512((const void *)(wk->ql + 64 * h));
        __m512i qh = _mm512_and_si512(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(wk->qh + 32 * h))), keep);
        /* 0xCA: m4 ? ql bits : qh bits */
        v[2 * h] = _mm512_ternarylogic_epi32(m4, ql, _mm512_sllv_epi16(qh, shl), 0xCA);
        v[2 * h + 1] = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi16(ql, 4), _mm512_srlv_epi16(qh, shr), 0xCA);
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        const int8_t *aq = a[b].qs + QK_K * kb;
        /* two chains (integer sums: the order does not matter) */
        __m512i p[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) p[c] = _mm512_maddubs_epi16(v[c], _mm512_loadu_si512((const void *)(aq + 64 * c)));
        __m512i acc0 = _mm512_dpwssd_epi32(
            _mm512_setzero_si512(), _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(a[b].bsums + 16 * kb))),
            scn);
        __m512i acc1 = _mm512_madd_epi16(p[1], sc[1]);
        acc0 = _mm512_dpwssd_epi32(acc0, p[0], sc[0]);
        acc1 = _mm512_dpwssd_epi32(acc1, p[3], sc[3]);
        acc0 = _mm512_dpwssd_epi32(acc0, p[2], sc[2]);
        out[b] = _mm512_add_epi32(acc0, acc1);
    }
}

/* Lanes 0 .. t + 1 (mask m) of a chunk into its slot accumulators: acc +=
 * isum * (d * da), the chunk's blocks from block k0 (a multiple of 16). */
INLINE __m512 q6k_flush(const __m512i *pairs, __m256i dw, __mmask16 m, const float *da, __m512 acc) {
    return _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(q6k_tree16(pairs)),
                                 _mm512_mul_ps(_mm512_maskz_cvtph_ps(m, dw), _mm512_maskz_loadu_ps(m, da)), acc, m);
}

/* The unpacking of the 2-bit K-quants (Q3_K, Q2_K). Elements 64c .. 64c +
 * 63 (half h = c / 2) have their 2-bit fields k0 = 2 (c % 2) (first 32) and
 * k0 + 1 (last 32) in qs[32h .. 32h + 31]: those 32 bytes in both 256-bit
 * halves, shifted right by 2 k0 or 2 k0 + 2 per half and masked, are the
 * elements in order; Q3_K adds 4 where the hmask bit 4h + k is set, so q =
 * value + 4 in 0..7 (Q2_K: q in 0..3). maddubs (pairs <= 2 * 7 * 127) then
 * vpdpwssd with the 16-element sub-block scales (int16 lane i of vector c:
 * sub-block 4c + i / 8, as Q6_K's).
 *
 * The per-vector constants, built once per call: sidx (vector c's int16 lane
 * i takes sub-block 4c + i / 8's scale), shv (16-bit shift counts of the
 * fields, by c % 2) and hsel (Q3_K's hmask bits 4 (c / 2) + 2 (c % 2) and
 * + 1). Built inside the per-block functions instead, they were rebuilt from
 * immediates in general registers for every block (12% more time per block
 * at 2-3 rows). */
typedef struct {
    __m512i sidx[4], shv[2], hsel[4];
} k2_consts;

INLINE void k2_consts_init(k2_consts *k) {
    k->sidx[0] = _mm512_set_epi64(0x0003000300030003ll, 0x0003000300030003ll, 0x0002000200020002ll,
                                  0x0002000200020002ll, 0x0001000100010001ll, 0x0001000100010001ll, 0, 0);
    for (int c = 1; c < 4; c++) k->sidx[c] = _mm512_add_epi16(k->sidx[c - 1], _mm512_set1_epi16(4));
    for (int c = 0; c < 2; c++)
        k->shv[c] = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * c)), _mm256_set1_epi16((short)(4 * c + 2)), 1);
    for (int c = 0; c < 4; c++) {
        const int b0 = 4 * (c / 2) + 2 * (c % 2);
        k->hsel[c] = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << b0)), _mm256_set1_epi8((char)(1 << (b0 + 1))), 1);
    }
}

/* A block's 256 values (v[c]: elements 64c .. 64c + 63) from its qs bytes,
 * with Q3_K's + 4 where hmask (broadcast to both halves) has the bit, and
 * the 16 int16 scales sc16 spread as the values' pairs need them (sc). */
INLINE void k2_unpack(const uint8_t *qs, const __m512i *hm, __m256i sc16, const k2_consts *K, __m512i v[4],
                      __m512i sc[4]) {
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4), s512 = _mm512_zextsi256_si512(sc16);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 2))));
        v[c] = _mm512_and_si512(_mm512_srlv_epi16(q, K->shv[c % 2]), m3);
        if (hm) v[c] = _mm512_mask_add_epi8(v[c], _mm512_test_epi8_mask(*hm, K->hsel[c]), v[c], four);
        sc[c] = _mm512_permutexvar_epi16(K->sidx[c], s512);
    }
}

/* sum_c dpwssd(maddubs(v[c], a[64c ..]), sc[c]) onto acc: a block's dot per
 * int32 lane. */
INLINE __m512i k2_dot(__m512i acc, const __m512i v[4], const __m512i sc[4], const int8_t *aq) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(v[c], _mm512_loadu_si512((const void *)(aq + 64 * c))),
                                  sc[c]);
    return acc;
}

/* Super-block kb of Q3_K row wk against NB activation rows: each row's 16
 * int32 lanes summing to the exact integer isum_kb of matmul_q3_K_ref (its
 * - 4 as one more product, bsums against -4 x the scales), which
 * mm_kq16_rows turns into floats as it does Q6_K's. */
INLINE void q3k_block_lanes(const block_q3_K *wk, const act_row *a, int64_t kb, __m512i *out, const k2_consts *K,
                            const int NB) {
    const __m256i sc16 = q3k_scales16(wk->scales);
    const __m256i off16 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 2)); /* -4 x the scales */
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)wk->hmask));
    __m512i v[4], sc[4];
    k2_unpack(wk->qs, &hm, sc16, K, v, sc);
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        const __m256i bs = _mm256_loadu_si256((const __m256i *)(a[b].bsums + 16 * kb));
        out[b] = k2_dot(_mm512_zextsi256_si512(_mm256_madd_epi16(bs, off16)), v, sc, a[b].qs + QK_K * kb);
    }
}

/* Blocks k, k + 1 of row w (type T: Q6_K or Q3_K; the second zero past the
 * row's end) against NB activation rows into pairs[b][(k % 16) / 2], their
 * f16 scales into dw. */
INLINE void kq16_block_pair(const void *w, int64_t nblk, int64_t k, const act_row *a, __m512i (*pairs)[8],
                            __m256i *dw, const k2_consts *K, const int NB, const int T) {
    const int two = k + 1 < nblk, t = (int)(k & 15);
    const size_t bsz = kq16_block_bytes(T);
    const char *wk = (const char *)w + (size_t)k * bsz;
    __m512i l0[MM_NB], l1[MM_NB];
    if (NB == 1) kern_pf_block(wk, (int)(2 * bsz), KERN_PF_LINE_AHEAD);
    if (T == QTYPE_Q3_K) {
        q3k_block_lanes((const block_q3_K *)wk, a, k, l0, K, NB);
        if (two) q3k_block_lanes((const block_q3_K *)(wk + bsz), a, k + 1, l1, K, NB);
    } else {
        q6k_block_lanes((const block_q6_K *)wk, a, k, l0, NB);
        if (two) q6k_block_lanes((const block_q6_K *)(wk + bsz), a, k + 1, l1, NB);
    }
    if (!two)
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) l1[b] = _mm512_setzero_si512();
    uint32_t d2 = kq16_d(wk, T) | (two ? (uint32_t)kq16_d(wk + bsz, T) << 16 : 0);
    *dw = _mm256_mask_set1_epi32(*dw, (__mmask8)(1u << (t >> 1)), (int)d2);
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) pairs[b][t >> 1] = q6k_pair(l0[b], l1[b]);
}

/* The mask of a chunk's slots after the pair at block k. */
INLINE __mmask16 q6k_chunk_mask(int64_t nblk, int64_t k) {
    const int t = (int)(k & 15);
    return (__mmask16)((k + 1 < nblk ? 4u << t : 2u << t) - 1);
}

/* Weight rows [r0, r1) against NB activation rows (up to MM_NB), one row at
 * a time, blocks in pairs (k, k + 1), each chunk of 16 blocks reduced into
 * the slot sums (q6k_flush); a row's last chunk is reduced after the next
 * row's first pair of blocks. The reduction is a chain of ~45 cycles (transpose tree,
 * multiply-add, the 16-slot sum); at the end of its row it held up the next
 * row's loads (rows are 8 super-blocks in most Q6_K matrices) and decode ran
 * 15-35% slower than with the per-lane float sums of before; one row later
 * its inputs are ready and it overlaps the next row's work. */
INLINE void mm_kq16_rows(const void *W, int64_t cols, int64_t r0, int64_t r1, const act_row *a, float *Y,
                         int64_t ldy, const int NB, const int T) {
    const int64_t nblk = cols / QK_K;
    const size_t wrow = qtype_row_bytes(T, cols);
    k2_consts K;
    if (T == QTYPE_Q3_K) k2_consts_init(&K);
    __m512i pairs[2][NB][8]; /* by row parity: the row's and the pending row's */
    __m256i pdw = _mm256_setzero_si256();
    __m512 pacc[NB];
    __mmask16 pm = 0;
    const int64_t last = (nblk - 1) & ~(int64_t)15; /* the last chunk's first block */
    kern_pf_start((const char *)W + (size_t)r0 * wrow);
    for (int64_t r = r0; r < r1; r++) {
        const void *w = (const char *)W + (size_t)r * wrow;
        __m512i(*cur)[8] = pairs[(r - r0) & 1];
        __m512i(*prev)[8] = pairs[(r - r0 + 1) & 1];
        __m256i dw = _mm256_setzero_si256();
        __m512 acc[NB];
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) acc[b] = _mm512_setzero_ps();
        kern_pf_pages(w, wrow);
        for (int64_t k = 0; k < nblk; k += 2) {
            kq16_block_pair(w, nblk, k, a, cur, &dw, &K, NB, T);
            if (k == 0 && r > r0) /* the previous row's last chunk */
#pragma GCC unroll 4
                for (int b = 0; b < NB; b++)
                    Y[b * ldy + r - 1] = q8_reduce16(q6k_flush(prev[b], pdw, pm, a[b].d + last, pacc[b]));
            if (k + 2 >= nblk) { /* the row's last chunk: reduced one row later */
                pdw = dw;
                pm = q6k_chunk_mask(nblk, k);
#pragma GCC unroll 4
                for (int b = 0; b < NB; b++) pacc[b] = acc[b];
            } else if ((k & 15) == 14) {
#pragma GCC unroll 4
                for (int b = 0; b < NB; b++)
                    acc[b] = q6k_flush(cur[b], dw, q6k_chunk_mask(nblk, k), a[b].d + (k & ~(int64_t)15), acc[b]);
            }
        }
    }
    if (r1 > r0)
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++)
            Y[b * ldy + r1 - 1] = q8_reduce16(q6k_flush(pairs[(r1 - 1 - r0) & 1][b], pdw, pm, a[b].d + last, pacc[b]));
}

/* ---- Q2_K weights against ACT_Q8K (VNNI) ----
 * One weight row at a time, its values and scales as Q3_K's (k2_unpack);
 * the minimums as -dmin x sum_j m_j sum(a_j) in floats, as Q4_K's, on 16
 * float lanes per activation row summed at the row's end. */
INLINE void mm_q2k_row(const void *W, int64_t nblk, const act_row *a, float *y, int64_t ldy, const k2_consts *K,
                       const int NB) {
    __m512 accf[MM_NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) accf[b] = _mm512_setzero_ps();
    for (int64_t k = 0; k < nblk; k++) {
        const block_q2_K *b2 = (const block_q2_K *)W + k;
        if (NB == 1) kern_pf_block(b2, (int)sizeof *b2, KERN_PF_LINE_AHEAD);
        const __m128i sb = _mm_loadu_si128((const __m128i *)b2->scales);
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sb, _mm_set1_epi8(0xF)));
        const __m256i min16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0xF)));
        const float d = f16_to_f32(b2->d), dmin = f16_to_f32(b2->dmin);
        __m512i v[4], sc[4];
        k2_unpack(b2->qs, NULL, sc16, K, v, sc);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            const __m256i bs = _mm256_loadu_si256((const __m256i *)(a[b].bsums + 16 * k));
            const __m512i acci = k2_dot(_mm512_setzero_si512(), v, sc, a[b].qs + QK_K * k);
            accf[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci), _mm512_set1_ps(a[b].d[k] * d), accf[b]);
            accf[b] = _mm512_fnmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, min16))),
                                       _mm512_set1_ps(a[b].d[k] * dmin), accf[b]);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) y[b * ldy] = _mm512_reduce_add_ps(accf[b]);
}

/* Q2_K rows [r0, r1), one weight row at a time against tiles of up to MM_NB
 * activation rows (their per-row integer work, not activation loads, bounds
 * them, so tiling weight rows as mm_q8 does buys little). */
INLINE void mm_q2k(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb, float *Y,
                   int64_t ldy) {
    const size_t wrow = qtype_row_bytes(QTYPE_Q2_K, cols);
    k2_consts K;
    k2_consts_init(&K);
    kern_pf_start((const char *)W + (size_t)r0 * wrow);
    for (int64_t r = r0; r < r1; r++) {
        const void *w = (const char *)W + (size_t)r * wrow;
        kern_pf_pages(w, wrow);
        /* decode: the row kernel prefetches each block KERN_PF_LINE_AHEAD ahead
         * (kern_pf_block), as kern_pf_lines does per row in mm_q8_rows */
        for (int b0 = 0; b0 < nb; b0 += MM_NB) {
            act_row a[MM_NB];
            int n = act_tile_rows(ACT_Q8K, act, cols, nb, b0, MM_NB, a);
            float *y = Y + (int64_t)b0 * ldy + r;
            switch (n) {
            case 1: mm_q2k_row(w, cols / QK_K, a, y, ldy, &K, 1); break;
            case 2: mm_q2k_row(w, cols / QK_K, a, y, ldy, &K, 2); break;
            case 3: mm_q2k_row(w, cols / QK_K, a, y, ldy, &K, 3); break;
            case 4: mm_q2k_row(w, cols / QK_K, a, y, ldy, &K, 4); break;
            case 5: mm_q2k_row(w, cols / QK_K, a, y, ldy, &K, 5); break;
            case 6: mm_q2k_row(w, cols / QK_K, a, y, ldy, &K, 6); break;
            case 7: mm_q2k_row(w, cols / QK_K, a, y, ldy, &K, 7); break;
            default: mm_q2k_row(w, cols / QK_K, a, y, ldy, &K, 8); break;
            }
        }
    }
}

static void matmul_q8_0_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q8_0, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q4_0_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q4_0, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q5_0_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q5_0, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_iq4_nl_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                                 int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_IQ4_NL, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q4_1_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q4_1, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q5_1_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q5_1, W, cols, r0, r1, act, nb, Y, ldy);
}
/* Q4_K, Q5_K: as eight blocks of 32 with a minimum per super-block (kq_block32);
 * IQ4_XS: as eight IQ4_NL-like blocks of 32 per super-block (iq4xs_block32). */
static void matmul_q4_K_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q4_K, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q5_K_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q5_K, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q2_K_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_q2k(W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_iq4_xs_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                                 int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_IQ4_XS, W, cols, r0, r1, act, nb, Y, ldy);
}
/* Q6_K and Q3_K (type T): batches that carry quads (act_q8k_nquads: Q6_K
 * from 4 rows, Q3_K from 8) by the quad kernel (kq16_quads_avx512.c) in
 * groups of 4 weight rows, the last 0-3 weight rows and smaller batches by
 * mm_kq16_rows (same arithmetic), in tiles of MM_NB activation rows. */
INLINE void mm_kq16(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb, float *Y,
                    int64_t ldy, const int T) {
    if (act_q8k_nquads(T, nb)) {
        int64_t n4 = (r1 - r0) / 4;
        if (n4) kern_matmul_kq16_quads_avx512(T, W, cols, r0, n4, act, nb, Y, ldy);
        r0 += 4 * n4;
        if (r0 == r1) return;
    }
    for (int b0 = 0; b0 < nb; b0 += MM_NB) {
        act_row a[MM_NB];
        int n = act_tile_rows(ACT_Q8K, act, cols, nb, b0, MM_NB, a);
        float *y = Y + (int64_t)b0 * ldy;
        switch (n) {
        case 1: mm_kq16_rows(W, cols, r0, r1, a, y, ldy, 1, T); break;
        case 2: mm_kq16_rows(W, cols, r0, r1, a, y, ldy, 2, T); break;
        case 3: mm_kq16_rows(W, cols, r0, r1, a, y, ldy, 3, T); break;
        case 4: mm_kq16_rows(W, cols, r0, r1, a, y, ldy, 4, T); break;
        case 5: mm_kq16_rows(W, cols, r0, r1, a, y, ldy, 5, T); break;
        case 6: mm_kq16_rows(W, cols, r0, r1, a, y, ldy, 6, T); break;
        case 7: mm_kq16_rows(W, cols, r0, r1, a, y, ldy, 7, T); break;
        default: mm_kq16_rows(W, cols, r0, r1, a, y, ldy, 8, T); break;
        }
    }
}

static void matmul_q6_K_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_kq16(W, cols, r0, r1, act, nb, Y, ldy, QTYPE_Q6_K);
}
static void matmul_q3_K_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_kq16(W, cols, r0, r1, act, nb, Y, ldy, QTYPE_Q3_K);
}

/* ---- dequantization (same arithmetic as quant.c, so results are equal) ---- */

static void dequant_f16_avx512(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    if (i < n) {
        __mmask16 m = tail16(n - i);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
    }
}

static void dequant_bf16_avx512(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    if (i < n) {
        __mmask16 m = tail16(n - i);
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
}

/* Stores 16 int8 times `scale`. */
INLINE void store16_scaled(float *dst, __m128i v, __m512 scale) {
    _mm512_storeu_ps(dst, _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))));
}

static void dequant_q8_0_avx512(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t k = 0; k < n / QK8_0; k++, dst += 32) {
        __m512 d = _mm512_set1_ps(f16_to_f32(b[k].d));
        store16_scaled(dst, _mm_loadu_si128((const __m128i *)b[k].qs), d);
        store16_scaled(dst + 16, _mm_loadu_si128((const __m128i *)(b[k].qs + 16)), d);
    }
}

static void dequant_q4_0_avx512(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    const __m128i m4 = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8);
    for (int64_t k = 0; k < n / QK4_0; k++, dst += 32) {
        __m512 d = _mm512_set1_ps(f16_to_f32(b[k].d));
        __m128i q = _mm_loadu_si128((const __m128i *)b[k].qs);
        store16_scaled(dst, _mm_sub_epi8(_mm_and_si128(q, m4), eight), d);
        store16_scaled(dst + 16, _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), eight), d);
    }
}

static void dequant_q4_K_avx512(const void *src, float *dst, int64_t n) {
    const block_q4_K *b = src;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int64_t k = 0; k < n / QK_K; k++) {
        uint8_t sm[16];
        q4k_unpack_scales(b[k].scales, sm);
        float d = f16_to_f32(b[k].d), dmin = f16_to_f32(b[k].dmin);
        for (int g = 0; g < 4; g++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b[k].qs + 32 * g));
            __m256i nib[2] = {_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)};
            for (int h = 0; h < 2; h++, dst += 32) {
                int j = 2 * g + h;
                __m512 d1 = _mm512_set1_ps(d * (float)sm[j]), m1 = _mm512_set1_ps(dmin * (float)sm[8 + j]);
                __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(nib[h])));
                __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(nib[h], 1)));
                _mm512_storeu_ps(dst, _mm512_sub_ps(_mm512_mul_ps(d1, f0), m1));
                _mm512_storeu_ps(dst + 16, _mm512_sub_ps(_mm512_mul_ps(d1, f1), m1));
            }
        }
    }
}

static void dequant_q6_K_avx512(const void *src, float *dst, int64_t n) {
    const block_q6_K *b = src;
    const __m256i off = _mm256_set1_epi8(32);
    for (int64_t k = 0; k < n / QK_K; k++) {
        float d = f16_to_f32(b[k].d);
        for (int e = 0; e < QK_K; e += 32, dst += 32) {
            int h = e / 128, kk = (e % 128) / 32;
            __m256i q = _mm256_sub_epi8(q6k_quarter(b[k].ql + 64 * h, b[k].qh + 32 * h, kk), off);
            store16_scaled(dst, _mm256_castsi256_si128(q), _mm512_set1_ps(d * (float)b[k].scales[e / 16]));
            store16_scaled(dst + 16, _mm256_extracti128_si256(q, 1), _mm512_set1_ps(d * (float)b[k].scales[e / 16 + 1]));
        }
    }
}

/* ---- row kernels ---- */

static void rmsnorm_avx512(float *out, const float *x, const float *w, int64_t n, float eps) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
        a0 = _mm512_fmadd_ps(v0, v0, a0);
        a1 = _mm512_fmadd_ps(v1, v1, a1);
    }
    for (; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(n - i >= 16 ? 0xFFFF : tail16(n - i), x + i);
        a0 = _mm512_fmadd_ps(v, v, a0);
    }
    float ss = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    __m512 sv = _mm512_set1_ps(scale);
    for (i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : tail16(n - i);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sv), _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

static void rope_avx512(float *x, int n_heads, int head_dim, int n_rot, const float *cos_sin, int neox) {
    int half = n_rot / 2;
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_dim;
        if (!neox) {
            /* 8 interleaved pairs per step: even lanes x0 c - x1 s, odd lanes x1 c + x0 s */
            for (int i = 0; i < half; i += 8) {
                int np = half - i < 8 ? half - i : 8;
                __mmask16 m = tail16(2 * np);
                __m512 cs = _mm512_maskz_loadu_ps(m, cos_sin + 2 * i);
                __m512 xv = _mm512_maskz_loadu_ps(m, v + 2 * i);
                __m512 t1 = _mm512_mul_ps(xv, _mm512_moveldup_ps(cs));
                __m512 t2 = _mm512_mul_ps(_mm512_permute_ps(xv, 0xB1), _mm512_movehdup_ps(cs));
                __m512 r = _mm512_mask_add_ps(_mm512_sub_ps(t1, t2), 0xAAAA, t1, t2);
                _mm512_mask_storeu_ps(v + 2 * i, m, r);
            }
        } else {
            for (int i = 0; i < half; i += 16) {
                int nf = half - i < 16 ? half - i : 16;
                __mmask16 m = tail16(nf);
                __mmask16 ma = tail16(2 * nf > 16 ? 16 : 2 * nf), mb = tail16(2 * nf > 16 ? 2 * nf - 16 : 0);
                __m512 A = _mm512_maskz_loadu_ps(ma, cos_sin + 2 * i);
                __m512 B = _mm512_maskz_loadu_ps(mb, cos_sin + 2 * i + 16);
                __m512 c = _mm512_permutex2var_ps(A, even, B), s = _mm512_permutex2var_ps(A, odd, B);
                __m512 x0 = _mm512_maskz_loadu_ps(m, v + i), x1 = _mm512_maskz_loadu_ps(m, v + i + half);
                _mm512_mask_storeu_ps(v + i, m, _mm512_sub_ps(_mm512_mul_ps(x0, c), _mm512_mul_ps(x1, s)));
                _mm512_mask_storeu_ps(v + i + half, m, _mm512_add_ps(_mm512_mul_ps(x0, s), _mm512_mul_ps(x1, c)));
            }
        }
    }
}

static void swiglu_avx512(float *out, const float *gate, const float *up, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : tail16(n - i);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
    }
}

static void softmax_avx512(float *x, int64_t n) {
    if (n <= 0) return;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : tail16(n - i);
        mv = _mm512_mask_max_ps(mv, m, mv, _mm512_maskz_loadu_ps(m, x + i));
    }
    __m512 mb = _mm512_set1_ps(_mm512_reduce_max_ps(mv)), sv = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : tail16(n - i);
        __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mb)));
        _mm512_mask_storeu_ps(x + i, m, e);
        sv = _mm512_add_ps(sv, e);
    }
    __m512 iv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sv));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : tail16(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), iv));
    }
}

/* exp512 of 16 lanes at a time, summed in float over runs of at most 64
 * vectors and then in double, so the sum of a vocabulary's 50-150K terms
 * keeps the reference's precision. */
static double logsumexp_avx512(const float *x, int64_t n) {
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : tail16(n - i);
        mv = _mm512_mask_max_ps(mv, m, mv, _mm512_maskz_loadu_ps(m, x + i));
    }
    const float max = _mm512_reduce_max_ps(mv);
    if (max == -INFINITY) return -INFINITY;
    const __m512 mb = _mm512_set1_ps(max);
    __m512d d0 = _mm512_setzero_pd(), d1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n;) {
        __m512 sv = _mm512_setzero_ps();
        for (int64_t end = i + 1024 < n ? i + 1024 : n; i < end; i += 16) {
            __mmask16 m = n - i >= 16 ? 0xFFFF : tail16(n - i);
            sv = _mm512_add_ps(sv, _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mb))));
        }
        d0 = _mm512_add_pd(d0, _mm512_cvtps_pd(_mm512_castps512_ps256(sv)));
        d1 = _mm512_add_pd(d1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(sv, 1)));
    }
    return (double)max + log(_mm512_reduce_add_pd(_mm512_add_pd(d0, d1)));
}

static void add_avx512(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : tail16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
    }
}

static float dot_f32_avx512(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : tail16(n - i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static void f32_to_f16_avx512(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : tail16(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

static void f16_to_f32_avx512(const uint16_t *src, float *dst, int64_t n) { dequant_f16_avx512(src, dst, n); }

/* F16 output through the row converter: the reference's bits for every
 * value but NaN, which a quantizer's caller refuses. */
static void quantize_f16_avx512(const float *x, void *dst, int64_t n) { f32_to_f16_avx512(x, dst, n); }

const kern_table kern_table_avx512 = {
    .quantize =
        {
            [QTYPE_F16] = quantize_f16_avx512,
            [QTYPE_BF16] = kern_quantize_bf16_avx512,
            [QTYPE_Q8_0] = kern_quantize_q8_0_avx512,
            [QTYPE_Q4_0] = kern_quantize_q4_0_avx512,
            [QTYPE_Q6_K] = kern_quantize_q6_K_avx512,
        },
    .first_out_of_range = kern_first_out_of_range_avx512,
    .matmul =
        {
            [QTYPE_F32] = matmul_f32_avx512,
            [QTYPE_F16] = matmul_f16_avx512,
            [QTYPE_BF16] = matmul_bf16_avx512,
            [QTYPE_Q8_0] = matmul_q8_0_avx512,
            [QTYPE_Q4_0] = matmul_q4_0_avx512,
            [QTYPE_Q5_0] = matmul_q5_0_avx512,
            [QTYPE_Q4_1] = matmul_q4_1_avx512,
            [QTYPE_IQ4_NL] = matmul_iq4_nl_avx512,
            [QTYPE_Q5_1] = matmul_q5_1_avx512,
            [QTYPE_Q4_K] = matmul_q4_K_avx512,
            [QTYPE_Q5_K] = matmul_q5_K_avx512,
            [QTYPE_IQ4_XS] = matmul_iq4_xs_avx512,
            [QTYPE_Q3_K] = matmul_q3_K_avx512,
            [QTYPE_Q2_K] = matmul_q2_K_avx512,
            [QTYPE_Q6_K] = matmul_q6_K_avx512,
            [QTYPE_INT4_G128] = kern_matmul_int4_g128_avx512,
        },
    .dequantize =
        {
            [QTYPE_F16] = dequant_f16_avx512,
            [QTYPE_BF16] = dequant_bf16_avx512,
            [QTYPE_Q8_0] = dequant_q8_0_avx512,
            [QTYPE_Q4_0] = dequant_q4_0_avx512,
            [QTYPE_Q4_K] = dequant_q4_K_avx512,
            [QTYPE_Q6_K] = dequant_q6_K_avx512,
        },
    .matmul_int_needs_vnni = 1,
    .act_q8 = act_q8_row_avx512,
    .act_q8k = act_q8k_row_avx512,
    .act_q8_quads = kern_act_q8_quads_avx512,
    .act_q8k_quads = kern_act_q8k_quads_avx512,
    .rmsnorm = rmsnorm_avx512,
    .rope = rope_avx512,
    .swiglu = swiglu_avx512,
    .softmax = softmax_avx512,
    .logsumexp = logsumexp_avx512,
    .add = add_avx512,
    .dot_f32 = dot_f32_avx512,
    .f32_to_f16 = f32_to_f16_avx512,
    .f16_to_f32 = f16_to_f32_avx512,
};
