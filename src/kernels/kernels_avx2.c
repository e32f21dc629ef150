/* AVX2 + FMA + F16C kernels. This file is compiled with those flags only and
 * its functions are reached only through kern_table_avx2 when the CPU has
 * them (kernels.c). Each function computes what its `_ref` in kernels.c or
 * quant.c defines; tests/test_kernels.c holds them to it.
 *
 * Matmul shape: for each weight row r, the row is decoded block by block and
 * applied to a chunk of up to MM_NB activation rows held in registers (Q8_0
 * / Q4_0: chunk by chunk of 16 blocks against up to Q8_NB rows); the next
 * chunk re-reads the row from L1, so DRAM sees every weight once per call
 * whatever nb is, and the stream is prefetched a page ahead
 * (kern_pf_pages). */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

enum { MM_NB = 4 }; /* activation rows per register tile (16 ymm registers) */

/* ---- activation preparation (bit-identical to kern_act_q8*_row_ref) ---- */

static void act_q8_row_avx2(const float *x, int64_t cols, int off, void *row) {
    act_row a = act_sections(ACT_Q8, cols, row);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int64_t nblk = cols / 32, nslot = (nblk + 15) / 16 * 16;
    for (int64_t k = 0; k < nblk; k++, x += 32) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                                 _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
        float amax = hmax_ps(m);
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        __m256 iv = _mm256_set1_ps(id);
        __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, iv)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, iv));
        __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, iv)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, iv));
        a.d[act_q8_slot(k)] = d;
        a.sa[act_q8_slot(k)] = off * hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
        __m256i q = pack_epi32_epi8(q0, q1, q2, q3);
        _mm_storeu_si128((__m128i *)(a.qs + act_q8_qs(k, 0)), _mm256_castsi256_si128(q));
        _mm_storeu_si128((__m128i *)(a.qs + act_q8_qs(k, 16)), _mm256_extracti128_si256(q, 1));
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

static void act_q8k_row_avx2(const float *x, int64_t cols, int off, void *row) {
    act_row a = act_sections(ACT_Q8K, cols, row);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t k = 0; k < cols / QK_K; k++, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < QK_K; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
        float amax = hmax_ps(m);
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        a.d[k] = d;
        __m256 iv = _mm256_set1_ps(id);
        for (int i = 0; i < QK_K; i += 32) {
            __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
            __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), iv));
            __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), iv));
            __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), iv));
            a.bsums[16 * k + i / 16] = (int16_t)hsum_epi32(_mm256_add_epi32(q0, q1));
            a.bsums[16 * k + i / 16 + 1] = (int16_t)hsum_epi32(_mm256_add_epi32(q2, q3));
            _mm256_storeu_si256((__m256i *)(a.qs + QK_K * k + i), pack_epi32_epi8(q0, q1, q2, q3));
        }
    }
}

/* ---- F32 / F16 / BF16 weights against F32 activations ---- */

INLINE __m256 load8_w(int wtype, const void *w, int64_t c) {
    if (wtype == QTYPE_F32) return _mm256_loadu_ps((const float *)w + c);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + c));
    if (wtype == QTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE float load1_w(int wtype, const void *w, int64_t c) {
    if (wtype == QTYPE_F32) return ((const float *)w)[c];
    if (wtype == QTYPE_F16) return ellm_f16_to_f32(((const uint16_t *)w)[c]);
    return ellm_bf16_to_f32(((const uint16_t *)w)[c]);
}

/* One weight row `w` against NB F32 rows x[b]; writes y[b * ldy]. Two
 * accumulators per row hide the FMA latency when NB is small. One row
 * (decode) of F16 or BF16 prefetches the weight bytes KERN_PF_LINE_AHEAD_AVX2
 * ahead as it goes, as the block kernels do: 1.17-1.22x faster than none
 * (bench_gemm -n 1, SmolLM2-135M and Llama-3.2-1B layers of F16 from DRAM,
 * Zen 3, 6 alternated rounds), where a burst over the whole row before it
 * read the 1B rows (4-16 KB) 0.89-0.95x as fast as none. F32 rows measured
 * 0.93-0.98x with it, so they go without. */
INLINE void mm_float_row(int wtype, const void *w, int64_t cols, const float *const *x, float *y,
                         int64_t ldy, const int NB) {
    __m256 acc0[MM_NB], acc1[MM_NB];
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) acc0[b] = acc1[b] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        if (NB == 1 && wtype != QTYPE_F32) kern_pf_block((const char *)w + 2 * c, 32, KERN_PF_LINE_AHEAD_AVX2);
        __m256 w0 = load8_w(wtype, w, c), w1 = load8_w(wtype, w, c + 8);
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) {
            acc0[b] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[b] + c), acc0[b]);
            acc1[b] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[b] + c + 8), acc1[b]);
        }
    }
    if (c + 8 <= cols) {
        __m256 w0 = load8_w(wtype, w, c);
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) acc0[b] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[b] + c), acc0[b]);
        c += 8;
    }
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) {
        float s = hsum_ps(_mm256_add_ps(acc0[b], acc1[b]));
        for (int64_t t = c; t < cols; t++) s += load1_w(wtype, w, t) * x[b][t];
        y[b * ldy] = s;
    }
}

INLINE void mm_float(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                     int nb, float *Y, int64_t ldy) {
    size_t wrow = (size_t)cols * (wtype == QTYPE_F32 ? 4 : 2);
    kern_pf_start((const char *)W + (size_t)r0 * wrow);
    for (int64_t r = r0; r < r1; r++) {
        const void *w = (const char *)W + (size_t)r * wrow;
        kern_pf_pages(w, wrow); /* decode: lines ahead too, in mm_float_row */
        for (int b0 = 0; b0 < nb; b0 += MM_NB) {
            const float *x[MM_NB];
            int n = nb - b0 < MM_NB ? nb - b0 : MM_NB;
            for (int b = 0; b < n; b++) x[b] = act_get_row(ACT_F32, act, cols, b0 + b).x;
            float *y = Y + (int64_t)b0 * ldy + r;
            switch (n) {
            case 1: mm_float_row(wtype, w, cols, x, y, ldy, 1); break;
            case 2: mm_float_row(wtype, w, cols, x, y, ldy, 2); break;
            case 3: mm_float_row(wtype, w, cols, x, y, ldy, 3); break;
            default: mm_float_row(wtype, w, cols, x, y, ldy, 4); break;
            }
        }
    }
}

static void matmul_f32_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                            int nb, float *Y, int64_t ldy) {
    mm_float(QTYPE_F32, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_f16_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                            int nb, float *Y, int64_t ldy) {
    mm_float(QTYPE_F16, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_bf16_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_float(QTYPE_BF16, W, cols, r0, r1, act, nb, Y, ldy);
}

/* ---- Q8_0 / Q4_0 / Q5_0 / Q4_1 / Q5_1 / IQ4_NL / Q4_K / Q5_K / IQ4_XS weights against ACT_Q8 ----
 * (Q4_K and Q5_K as eight blocks of 32 with a minimum per super-block,
 * IQ4_XS as eight IQ4_NL-like blocks of 32 per super-block, as
 * kernels_avx512.c.)
 * The same arithmetic as kernels_avx512.c (exact block dots, then
 * acc[slot(k)] += (float)dot_k * (dw_k * da_k) and the fixed 16-lane sum),
 * with the 16 slots in two ymm, so both ISAs give the same bits. maddubs
 * multiplies unsigned by signed bytes into int16 pairs: Q4_0's raw nibbles
 * q = w + 8 are the unsigned side directly (pairs <= 2 * 15 * 127; the
 * offset comes off as sa), Q5_0's 5-bit q = w + 16 likewise (the high bits
 * set in by q5_bits_avx2; pairs <= 2 * 31 * 127), Q8_0 and IQ4_NL (its
 * codes' values looked up by pshufb) multiplies |w| by a * sign(w) (pairs <=
 * 2 * 128 * 127, no offset). Blocks go in pairs, a ymm holding the first
 * (or last) 16 bytes of two blocks of a group, to meet the grouped
 * activations; each 128-bit lane ends with 4 partial sums of one block. */

/* Q5_0's high bits: byte e of the low lane 0x10 if bit e of `a` is set,
 * of the high lane if bit e of `b` is (e = 0..15). */
INLINE __m256i q5_bits_avx2(uint32_t a, uint32_t b) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1,
                                            1, 1, 1, 1, 1, 1, 1);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i x = _mm256_set_m128i(_mm_set1_epi16((short)b), _mm_set1_epi16((short)a));
    x = _mm256_and_si256(_mm256_shuffle_epi8(x, spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(x, bit), _mm256_set1_epi8(0x10));
}

/* A pair of blocks' weights as q8_wdot takes them: w0 / w1 the bytes that
 * meet the pair's first / last activation halves; the unsigned types'
 * values, or for the signed ones (Q8_0, IQ4_NL, IQ4_XS) the values with
 * u0 / u1 their magnitudes. Unpacked once, they serve every activation row
 * of a batch. */
typedef struct {
    __m256i w0, w1, u0, u1;
} q8_wpair;

INLINE int q8_signed(int wtype) { return wtype == QTYPE_Q8_0 || wtype == QTYPE_IQ4_NL || wtype == QTYPE_IQ4_XS; }

/* Blocks pa and pb (NULL: absent, zeros). IQ4_XS: pa and pb point at the
 * sub-blocks' 16 code bytes. */
INLINE q8_wpair q8_pair_weights(int wtype, const char *pa, const char *pb) {
    q8_wpair w;
    if (wtype == QTYPE_Q8_0) {
        __m128i a0 = _mm_loadu_si128((const __m128i *)(pa + 2)), a1 = _mm_loadu_si128((const __m128i *)(pa + 18));
        __m128i b0 = pb ? _mm_loadu_si128((const __m128i *)(pb + 2)) : _mm_setzero_si128();
        __m128i b1 = pb ? _mm_loadu_si128((const __m128i *)(pb + 18)) : _mm_setzero_si128();
        w.w0 = _mm256_set_m128i(b0, a0);
        w.w1 = _mm256_set_m128i(b1, a1);
    } else {
        const __m256i m4 = _mm256_set1_epi8(0xF);
        const int qoff = wtype == QTYPE_IQ4_XS ? 0 : q32_block_bytes(wtype) - 16; /* the nibbles end every block */
        __m128i qa = _mm_loadu_si128((const __m128i *)(pa + qoff));
        __m128i qb = pb ? _mm_loadu_si128((const __m128i *)(pb + qoff)) : _mm_setzero_si128();
        __m256i x = _mm256_set_m128i(qb, qa);
        w.w0 = _mm256_and_si256(x, m4);
        w.w1 = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
        if (wtype == QTYPE_Q5_0 || wtype == QTYPE_Q5_1) { /* the high bits: the 4 bytes before the nibbles */
            uint32_t ha, hb = 0;
            memcpy(&ha, pa + qoff - 4, 4);
            if (pb) memcpy(&hb, pb + qoff - 4, 4);
            w.w0 = _mm256_or_si256(w.w0, q5_bits_avx2(ha & 0xFFFF, hb & 0xFFFF));
            w.w1 = _mm256_or_si256(w.w1, q5_bits_avx2(ha >> 16, hb >> 16));
        }
        if (wtype == QTYPE_IQ4_NL || wtype == QTYPE_IQ4_XS) {
            /* the codes' signed grid values (an absent block's codes read 0,
             * whose value is not; its activations are zero anyway) */
            const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_values));
            w.w0 = _mm256_shuffle_epi8(lut, w.w0);
            w.w1 = _mm256_shuffle_epi8(lut, w.w1);
        }
    }
    w.u0 = q8_signed(wtype) ? _mm256_sign_epi8(w.w0, w.w0) : w.w0;
    w.u1 = q8_signed(wtype) ? _mm256_sign_epi8(w.w1, w.w1) : w.w1;
    return w;
}

/* 8 int32: 4 partial sums of the pair's first block's dot with activations
 * alo / ahi (its first / last halves), then 4 of the second's. maddubs
 * multiplies unsigned by signed bytes: the unsigned types' values directly,
 * the signed ones' |w| times a * sign(w). */
INLINE __m256i q8_wdot(int wtype, const q8_wpair *w, const int8_t *alo, const int8_t *ahi) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i al = _mm256_loadu_si256((const __m256i *)alo), ah = _mm256_loadu_si256((const __m256i *)ahi);
    if (!q8_signed(wtype))
        return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w->w0, al), _mm256_maddubs_epi16(w->w1, ah)),
                                 ones);
    const __m256i p0 = _mm256_maddubs_epi16(w->u0, _mm256_sign_epi8(al, w->w0));
    const __m256i p1 = _mm256_maddubs_epi16(w->u1, _mm256_sign_epi8(ah, w->w1));
    return _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
}

/* Q4_K's or Q5_K's pair of blocks of 32 (sub-blocks 2i, 2i + 1 of a
 * super-block) whose nibbles share the 32 bytes at qs (Q5_K: their fifth
 * bits are bits 2i, 2i + 1 of the super-block's qh), unsigned. */
INLINE q8_wpair q45k_pair_weights(const char *qs, const uint8_t *qh, int i) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    /* each half of the 32 bytes in both lanes, the high lane shifted down to
     * its high nibbles (a broadcast load and a variable shift, no lane insert) */
    const __m256i nib = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    __m256i w0 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs)), nib), m4);
    __m256i w1 = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(qs + 16))), nib), m4);
    if (qh) { /* elements 0-15 (w0) and 16-31 (w1): bit 2i (low lane) or 2i + 1 (high lane) of qh[element] */
        const __m256i bm = _mm256_set_m128i(_mm_set1_epi8((char)(2 << (2 * i))), _mm_set1_epi8((char)(1 << (2 * i))));
        const __m256i b16 = _mm256_set1_epi8(0x10);
        const __m128i h0 = _mm_loadu_si128((const __m128i *)qh), h1 = _mm_loadu_si128((const __m128i *)(qh + 16));
        const __m256i y0 = _mm256_and_si256(_mm256_set_m128i(h0, h0), bm), y1 = _mm256_and_si256(_mm256_set_m128i(h1, h1), bm);
        w0 = _mm256_or_si256(w0, _mm256_and_si256(_mm256_cmpeq_epi8(y0, bm), b16));
        w1 = _mm256_or_si256(w1, _mm256_and_si256(_mm256_cmpeq_epi8(y1, bm), b16));
    }
    return (q8_wpair){w0, w1, w0, w1};
}

/* Two Q4_K / Q5_K super-blocks' 8 sub-block scales (bytes 0..7 of a lane)
 * and minimums (bytes 8..15) from their 12 packed scale bytes (16 bytes
 * loaded from each, s0 into lane 0, s1 into lane 1): q4k_scale_min's fields,
 * four at a time in 32-bit words, for both at once. */
INLINE __m256i q4k_scales_mins2(__m128i s0, __m128i s1) {
    const __m256i u = _mm256_set_m128i(s1, s0); /* a0 a1 a2 - per lane */
    const __m256i lo6 = _mm256_and_si256(u, _mm256_set1_epi32(0x3f3f3f3f)); /* sc0-3, m0-3 */
    const __m256i top2 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 6), _mm256_set1_epi32(0x03030303)), 4);
    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi32(u, 0xAA), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)),
                                         _mm256_set1_epi32(0x0f0f0f0f));
    return _mm256_unpacklo_epi32(lo6, _mm256_or_si256(nib, top2)); /* sc0-3 sc4-7 m0-3 m4-7 */
}

/* An IQ4_XS super-block's 8 sub-block scales plus 32 (iq4xs_scale + 32,
 * 0..63) as bytes: the 4-bit fields of scales_l and the 2-bit fields of
 * scales_h spread one per byte with shifts and masks in a 64-bit word (a
 * per-scale extraction cost more than the super-block's arithmetic in decode). */
INLINE uint64_t iq4xs_scale_bytes(const block_iq4_xs *b) {
    uint32_t l4;
    memcpy(&l4, b->scales_l, 4);
    uint64_t lo = l4, hi = b->scales_h;
    lo = (lo | lo << 16) & 0x0000FFFF0000FFFFull; /* nibbles j to byte j */
    lo = (lo | lo << 8) & 0x00FF00FF00FF00FFull;
    lo = (lo | lo << 4) & 0x0F0F0F0F0F0F0F0Full;
    hi = (hi | hi << 24) & 0x000000FF000000FFull; /* 2-bit fields j to byte j */
    hi = (hi | hi << 12) & 0x000F000F000F000Full;
    hi = (hi | hi << 6) & 0x0303030303030303ull;
    return lo | hi << 4;
}

/* The super-block types' (Q4_K, Q5_K, IQ4_XS) scales and minimums of the
 * chunk's n (8 or 16) blocks of 32 at p (one or two super-blocks) by slot
 * (as kq_block32 and iq4xs_block32 give them; IQ4_XS has no minimum), zeros
 * past n: the sub-blocks' integer scales in block order, shuffled to slot
 * order (block 4g + l in slot 4l + g), times their super-block's F16 scale. */
INLINE void sb_scales_avx2(int wtype, const char *p, int n, __m256 dw[2], __m256 mw[2]) {
    const size_t sbb = 8 * (size_t)q32_block_bytes(wtype);
    const __m128i order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const int two = n > 8;
    __m128i sc, mn = _mm_setzero_si128();
    __m256 dv, mv = _mm256_setzero_ps();
    /* slots 0..7 hold blocks 0, 4, 8, 12, 1, 5, 9, 13; 8..15 the same plus 2 */
    const __m256i d_slots = _mm256_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2);
    if (wtype == QTYPE_IQ4_XS) {
        const block_iq4_xs *b0 = (const block_iq4_xs *)p, *b1 = (const block_iq4_xs *)(p + sbb);
        /* the biased scales less 32 (an absent second super-block's zeros stay zero) */
        const __m128i bias = _mm_set_epi64x(two ? 0x2020202020202020ll : 0, 0x2020202020202020ll);
        sc = _mm_shuffle_epi8(_mm_sub_epi8(_mm_set_epi64x(two ? (long long)iq4xs_scale_bytes(b1) : 0,
                                                          (long long)iq4xs_scale_bytes(b0)),
                                           bias),
                              order);
        const float d0 = _cvtsh_ss(b0->d), d1 = two ? _cvtsh_ss(b1->d) : 0.0f;
        dv = _mm256_setr_ps(d0, d0, d1, d1, d0, d0, d1, d1);
    } else { /* Q4_K and Q5_K share the header: d, dmin, 12 scale bytes */
        const block_q4_K *b0 = (const block_q4_K *)p, *b1 = (const block_q4_K *)(p + sbb);
        /* both super-blocks' scales and minimums at once, one per lane (16
         * bytes read from each: the 12 scale bytes and 4 of qs) */
        const __m256i x = q4k_scales_mins2(_mm_loadu_si128((const __m128i *)b0->scales),
                                           two ? _mm_loadu_si128((const __m128i *)b1->scales) : _mm_setzero_si128());
        /* [scales of 0, of 1 | minimums of 0, of 1], each half to slot order */
        const __m256i sm = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(x, _MM_SHUFFLE(3, 1, 2, 0)),
                                               _mm256_broadcastsi128_si256(order));
        sc = _mm256_castsi256_si128(sm);
        mn = _mm256_extracti128_si256(sm, 1);
        /* d0, dmin0, d1, dmin1 (zeros without a second super-block) */
        uint32_t h0, h1 = 0;
        memcpy(&h0, b0, 4);
        if (two) memcpy(&h1, b1, 4);
        const __m256 dm = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_setr_epi32((int)h0, (int)h1, 0, 0)));
        dv = _mm256_permutevar8x32_ps(dm, d_slots);
        mv = _mm256_permutevar8x32_ps(dm, _mm256_add_epi32(d_slots, _mm256_set1_epi32(1)));
    }
    for (int h = 0; h < 2; h++) {
        const __m128i sh = h ? _mm_srli_si128(sc, 8) : sc, mh = h ? _mm_srli_si128(mn, 8) : mn;
        const __m256i si = wtype == QTYPE_IQ4_XS ? _mm256_cvtepi8_epi32(sh) : _mm256_cvtepu8_epi32(sh);
        dw[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(si), dv);
        mw[h] = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mh)), mv));
    }
}

/* The f16 scales of the chunk's n blocks at p as floats by slot (block
 * 4g + l in slot 4l + g; zeros for blocks past n): slots 0..7 in dw[0],
 * 8..15 in dw[1]. Scalar loads inserted into vectors (no store to reload):
 * once per chunk and row. */
INLINE uint16_t q8_scale_at(const char *p, int bsz, int n, int s) {
    const int k = 4 * (s & 3) + (s >> 2);
    uint16_t h = 0;
    if (k < n) memcpy(&h, p + k * bsz, 2);
    return h;
}

INLINE void q8_scales_avx2(const char *p, int bsz, int n, __m256 dw[2]) {
#define S_(s) (short)q8_scale_at(p, bsz, n, s)
    dw[0] = _mm256_cvtph_ps(_mm_setr_epi16(S_(0), S_(1), S_(2), S_(3), S_(4), S_(5), S_(6), S_(7)));
    dw[1] = _mm256_cvtph_ps(_mm_setr_epi16(S_(8), S_(9), S_(10), S_(11), S_(12), S_(13), S_(14), S_(15)));
#undef S_
}

/* The scales (and minimums) by slot of the chunk's n blocks at p, for any
 * type of the blocks of 32 (zeros past n; mw zero for types without one). */
INLINE void chunk_scales_avx2(int wtype, const char *p, int n, __m256 dw[2], __m256 mw[2]) {
    const int bsz = q32_block_bytes(wtype);
    mw[0] = mw[1] = _mm256_setzero_ps();
    if (wtype == QTYPE_Q4_K || wtype == QTYPE_Q5_K || wtype == QTYPE_IQ4_XS) {
        sb_scales_avx2(wtype, p, n, dw, mw);
        return;
    }
    q8_scales_avx2(p, bsz, n, dw);
    if (q32_has_min(wtype)) q8_scales_avx2(p + 2, bsz, n, mw);
}

/* Group g (blocks 4g .. 4g + 3) of the chunk's n blocks at p against the
 * activations q[r] (the chunk's 512) of NR rows, its weights unpacked once:
 * ab[r] holds blocks 4g and 4g + 1 (4 partial sums each), cd[r] blocks
 * 4g + 2 and 4g + 3. */
INLINE void q8_group_dots(int wtype, const char *p, int n, int g, const int8_t *const *q, const int NR, __m256i *ab,
                          __m256i *cd) {
    const int bsz = q32_block_bytes(wtype);
    const char *pg = p + 4 * g * bsz;
    const int m = n - 4 * g; /* blocks present in this group */
    const __m256i z = _mm256_setzero_si256();
    q8_wpair x, y;
    int hx, hy; /* whether the pairs hold any block */
    if (wtype == QTYPE_Q4_K || wtype == QTYPE_Q5_K) { /* group g: sub-blocks 4 (g % 2) .. + 3 of super-block g / 2 */
        const int Q5 = wtype == QTYPE_Q5_K;
        const char *sb = p + (size_t)(g / 2) * 8 * (size_t)bsz;
        const char *qs = sb + (Q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs)) + 64 * (g % 2);
        const uint8_t *qh = Q5 ? (const uint8_t *)sb + offsetof(block_q5_K, qh) : NULL;
        hx = hy = m >= 4;
        if (hx) {
            x = q45k_pair_weights(qs, qh, 2 * (g % 2));
            y = q45k_pair_weights(qs + 32, qh, 2 * (g % 2) + 1);
        }
    } else if (wtype == QTYPE_IQ4_XS) { /* group g: sub-blocks 4 (g % 2) .. + 3 of super-block g / 2, 16 code bytes each */
        const char *qs = p + (size_t)(g / 2) * sizeof(block_iq4_xs) + offsetof(block_iq4_xs, qs) + 64 * (g % 2);
        hx = hy = m >= 4;
        if (hx) {
            x = q8_pair_weights(wtype, qs, qs + 16);
            y = q8_pair_weights(wtype, qs + 32, qs + 48);
        }
    } else {
        hx = m >= 1;
        hy = m >= 3;
        if (hx) x = q8_pair_weights(wtype, pg, m >= 2 ? pg + bsz : NULL);
        if (hy) y = q8_pair_weights(wtype, pg + 2 * bsz, m >= 4 ? pg + 3 * bsz : NULL);
    }
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++) {
        const int8_t *qg = q[r] + 128 * g;
        ab[r] = hx ? q8_wdot(wtype, &x, qg, qg + 64) : z;
        cd[r] = hy ? q8_wdot(wtype, &y, qg + 32, qg + 96) : z;
    }
}

/* The first level of kernels_avx512.c's q8_tree: two groups' pair sums into
 * one vector (4 blocks, 2 partial sums each). */
INLINE __m256i q8_tree2(__m256i w0, __m256i w1) {
    return _mm256_add_epi32(_mm256_unpacklo_epi32(w0, w1), _mm256_unpackhi_epi32(w0, w1));
}

/* Adds the n (1..16) blocks of chunk ci at p (scales dw) times activation
 * rows a[0 .. NR) into slots acc[2r] (0..7) and acc[2r + 1] (8..15). The
 * tree of kernels_avx512.c q8_tree on each half (slots 0..7 from the first
 * pairs, 8..15 from the second), its first level taken as soon as two groups
 * are done, so that few sums are live at once. Rows of a batch go two at a
 * time (NR 2), sharing the unpacked weights; each row's steps are the same
 * as alone. */
INLINE void q8_chunk_avx2(int wtype, const char *p, int n, const __m256 dw[2], const __m256 mw[2], const act_row *a,
                          const int NR, int64_t ci, __m256 *acc) {
    const int8_t *q[2];
    __m256i x[2][2][2]; /* [row][half][groups 0-1 / 2-3] */
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++) q[r] = a[r].qs + 512 * ci;
#pragma GCC unroll 2
    for (int gp = 0; gp < 2; gp++) {
        __m256i ab0[2], cd0[2], ab1[2], cd1[2];
        q8_group_dots(wtype, p, n, 2 * gp, q, NR, ab0, cd0);
        q8_group_dots(wtype, p, n, 2 * gp + 1, q, NR, ab1, cd1);
#pragma GCC unroll 2
        for (int r = 0; r < NR; r++) {
            x[r][0][gp] = q8_tree2(ab0[r], ab1[r]);
            x[r][1][gp] = q8_tree2(cd0[r], cd1[r]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i t = _mm256_add_epi32(_mm256_unpacklo_epi64(x[r][h][0], x[r][h][1]),
                                         _mm256_unpackhi_epi64(x[r][h][0], x[r][h][1]));
            const __m256i sa = _mm256_loadu_si256((const __m256i *)(a[r].sa + 16 * ci + 8 * h));
            const __m256 da = _mm256_loadu_ps(a[r].d + 16 * ci + 8 * h);
            __m256 *c = &acc[2 * r + h];
            if (q32_has_min(wtype)) { /* the values' dot, then the minimum times the activations' sum */
                *c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw[h], da), *c);
                *c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_mul_ps(mw[h], da), *c);
                continue;
            }
            if (!q8_signed(wtype)) t = _mm256_sub_epi32(t, sa);
            *c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw[h], da), *c);
        }
}

enum { Q8_NB = 16 }; /* activation rows per pass over a weight row (accumulators on the stack) */

/* q8_chunk_avx2 for activation rows a[0 .. n), two at a time. */
INLINE void q8_chunk_rows(int wtype, const char *p, int m, const __m256 dw[2], const __m256 mw[2], const act_row *a,
                          int n, int64_t ci, __m256 (*acc)[2]) {
    int b = 0;
    for (; b + 2 <= n; b += 2) q8_chunk_avx2(wtype, p, m, dw, mw, &a[b], 2, ci, acc[b]);
    if (b < n) q8_chunk_avx2(wtype, p, m, dw, mw, &a[b], 1, ci, acc[b]);
}

/* Weight row w (nblk blocks) against activation rows a[0 .. n), 2 <= n <=
 * Q8_NB; writes y[b * ldy]. One row: mm_q8_row1. */
INLINE void mm_q8_row(int wtype, const char *w, int64_t nblk, const act_row *a, int n, float *y, int64_t ldy) {
    const int bsz = q32_block_bytes(wtype);
    __m256 acc[Q8_NB][2];
    for (int b = 0; b < n; b++) acc[b][0] = acc[b][1] = _mm256_setzero_ps();
    for (int64_t ci = 0; ci * 16 < nblk; ci++) {
        const char *p = w + 16 * ci * bsz;
        const int m = nblk - 16 * ci < 16 ? (int)(nblk - 16 * ci) : 16;
        __m256 dw[2], mw[2];
        chunk_scales_avx2(wtype, p, m, dw, mw);
        if (m == 16) q8_chunk_rows(wtype, p, 16, dw, mw, a, n, ci, acc);
        else q8_chunk_rows(wtype, p, m, dw, mw, a, n, ci, acc);
    }
    for (int b = 0; b < n; b++) y[(int64_t)b * ldy] = hsum_ps(_mm256_add_ps(acc[b][0], acc[b][1]));
}

/* mm_q8_row for one activation row (decode): the same steps, with the two
 * accumulators and the chunk's scales in registers instead of the batch's
 * stack arrays. */
INLINE void mm_q8_row1(int wtype, const char *w, int64_t nblk, const act_row *a, float *y) {
    const int bsz = q32_block_bytes(wtype);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t ci = 0; ci * 16 < nblk; ci++) {
        const char *p = w + 16 * ci * bsz;
        const int m = nblk - 16 * ci < 16 ? (int)(nblk - 16 * ci) : 16;
        kern_pf_block(p, 16 * bsz, KERN_PF_LINE_AHEAD_AVX2); /* the lines ahead, a chunk's worth per chunk */
        __m256 dw[2], mw[2];
        chunk_scales_avx2(wtype, p, m, dw, mw);
        if (m == 16) q8_chunk_avx2(wtype, p, 16, dw, mw, a, 1, ci, acc);
        else q8_chunk_avx2(wtype, p, m, dw, mw, a, 1, ci, acc);
    }
    *y = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
}

/* Rows [r0, r1); each weight row, chunk by chunk, against up to Q8_NB
 * activation rows at a time (the row stays in L1; its scales are decoded
 * once per chunk). The 16 slots sum as (j, j+8), (j, j+4), (j, j+2), (0, 1),
 * the tree of kernels_avx512.c. */
INLINE void mm_q8(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                  float *Y, int64_t ldy) {
    size_t wrow = qtype_row_bytes(wtype, cols);
    int64_t nblk = cols / 32;
    kern_pf_start((const char *)W + (size_t)r0 * wrow);
    for (int64_t r = r0; r < r1; r++) {
        const char *w = (const char *)W + (size_t)r * wrow;
        kern_pf_pages(w, wrow); /* decode: lines ahead too, in mm_q8_row1 (kernels_x86.h) */
        for (int b0 = 0; b0 < nb; b0 += Q8_NB) {
            int n = nb - b0 < Q8_NB ? nb - b0 : Q8_NB;
            act_row a[Q8_NB];
            for (int b = 0; b < n; b++) a[b] = act_get_row(ACT_Q8, act, cols, b0 + b);
            if (n == 1) mm_q8_row1(wtype, w, nblk, a, Y + (int64_t)b0 * ldy + r);
            else mm_q8_row(wtype, w, nblk, a, n, Y + (int64_t)b0 * ldy + r, ldy);
        }
    }
}

/* A vpshufb control that, applied to 8 int16 repeated in both 128-bit lanes
 * (a half super-block's sub-block scales), gives int16 2f in every int16 of
 * the low lane and 2f + 1 in the high lane: the scales of the two 16-element
 * sub-blocks that 32 elements in order span. */
INLINE __m256i pick_sub_pair16(int f) {
    const __m128i lo = _mm_set1_epi16((short)(4 * f | (4 * f + 1) << 8));
    const __m128i hi = _mm_set1_epi16((short)((4 * f + 2) | (4 * f + 3) << 8));
    return _mm256_set_m128i(hi, lo);
}

/* ---- Q6_K weights against ACT_Q8K ----
 * Per half h and quarter kk, 32 6-bit q in natural order are rebuilt from
 * ql nibbles and qh bit pairs (16-bit shifts; the bits that leak across
 * bytes are masked off). q is unsigned, so maddubs(q, a) then madd with the
 * two sub-block scales; the -32 offset is 32 * sum_j sc[j] * bsums[j]. */
INLINE void mm_q6k_row(const block_q6_K *w, int64_t nblk, const act_row *a, float *y, int64_t ldy,
                       const int NB) {
    __m256 accf[MM_NB];
    __m256i pick[4];
#pragma GCC unroll 4
    for (int kk = 0; kk < 4; kk++) pick[kk] = pick_sub_pair16(kk);
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) accf[b] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nblk; k++) {
        if (NB == 1) kern_pf_block(&w[k], (int)sizeof(block_q6_K), KERN_PF_LINE_AHEAD_AVX2);
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[k].scales));
        __m256i acci[MM_NB];
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) acci[b] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            /* half h's 8 scales in both lanes: one shuffle per quarter below */
            const __m256i sch = _mm256_broadcastsi128_si256(h ? _mm256_extracti128_si256(sc16, 1)
                                                              : _mm256_castsi256_si128(sc16));
#pragma GCC unroll 4
            for (int kk = 0; kk < 4; kk++) {
                __m256i q = q6k_quarter(w[k].ql + 64 * h, w[k].qh + 32 * h, kk);
                /* scales of sub-blocks 8h + 2kk (low lane) and 8h + 2kk + 1 (high) */
                __m256i s = _mm256_shuffle_epi8(sch, pick[kk]);
#pragma GCC unroll 4
                for (int b = 0; b < NB; b++) {
                    const int8_t *aq = a[b].qs + QK_K * k + 128 * h + 32 * kk;
                    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)aq));
                    acci[b] = _mm256_add_epi32(acci[b], _mm256_madd_epi16(p, s));
                }
            }
        }
        float d = f16_to_f32(w[k].d);
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) {
            __m256i bs = _mm256_loadu_si256((const __m256i *)(a[b].bsums + 16 * k));
            __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
            __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acci[b], off));
            accf[b] = _mm256_fmadd_ps(v, _mm256_set1_ps(a[b].d[k] * d), accf[b]);
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) y[b * ldy] = hsum_ps(accf[b]);
}

/* ---- Q3_K / Q2_K weights against ACT_Q8K ----
 * Field k of half h (elements 128h + 32k .. + 31: sub-blocks 8h + 2k and
 * 8h + 2k + 1) is bits 2k of qs[32h .. 32h + 31]: one shift and mask; Q3_K
 * adds 4 where hmask bit 4h + k is set (q = value + 4 in 0..7). maddubs
 * (unsigned q), then madd with the two sub-blocks' scales; Q3_K's - 4 comes
 * off as bsums x -4 x the scales, Q2_K's mins as -dmin x sum_j m_j sum(a_j)
 * in floats. */
/* The 16 signed scales (6-bit, - 32) of a Q3_K block as int16 lanes, by
 * vector shifts (kernels_x86.h's AVX-512 q3k_scales16 with 32-bit shifts). */
INLINE __m256i q3k_scales16(const uint8_t *s) {
    uint32_t hi4;
    memcpy(&hi4, s + 8, 4);
    const __m256i lo = q3k_scales_lo16(s);
    const __m256i h = _mm256_cvtepu8_epi32(_mm_set1_epi32((int)hi4)), m3 = _mm256_set1_epi32(3);
    const __m256i ha = _mm256_and_si256(_mm256_srlv_epi32(h, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)), m3);
    const __m256i hb = _mm256_and_si256(_mm256_srlv_epi32(h, _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6)), m3);
    const __m256i hi = _mm256_permute4x64_epi64(_mm256_packus_epi32(ha, hb), _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_sub_epi16(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi16(32));
}

INLINE void mm_q23k_row(int wtype, const void *W, int64_t nblk, const act_row *a, float *y, int64_t ldy,
                        const int NB) {
    const int Q3 = wtype == QTYPE_Q3_K;
    const size_t bsz = Q3 ? sizeof(block_q3_K) : sizeof(block_q2_K);
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    __m256i pick[4];
#pragma GCC unroll 4
    for (int f = 0; f < 4; f++) pick[f] = pick_sub_pair16(f);
    __m256 accf[MM_NB];
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) accf[b] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nblk; k++) {
        const char *blk = (const char *)W + (size_t)k * bsz;
        if (NB == 1) kern_pf_block(blk, Q3 ? (int)sizeof(block_q3_K) : (int)sizeof(block_q2_K), KERN_PF_LINE_AHEAD_AVX2);
        /* the 16 sub-block scales as int16 (Q3_K signed, Q2_K 0..15), and
         * what multiplies bsums: Q3_K's -4 x scale, Q2_K's mins */
        __m256i sc16, off16, hm = _mm256_setzero_si256();
        const uint8_t *qs;
        float d, dmin = 0;
        if (Q3) {
            const block_q3_K *b3 = (const block_q3_K *)blk;
            sc16 = q3k_scales16(b3->scales);
            off16 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 2));
            qs = b3->qs;
            hm = _mm256_loadu_si256((const __m256i *)b3->hmask);
            d = f16_to_f32(b3->d);
        } else {
            const block_q2_K *b2 = (const block_q2_K *)blk;
            const __m128i x = _mm_loadu_si128((const __m128i *)b2->scales), m4 = _mm_set1_epi8(0xF);
            sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(x, m4));
            off16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(x, 4), m4));
            qs = b2->qs;
            d = f16_to_f32(b2->d);
            dmin = f16_to_f32(b2->dmin);
        }
        __m256i acci[MM_NB];
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++)
            acci[b] = Q3 ? _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a[b].bsums + 16 * k)), off16)
                         : _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            /* half h's 8 scales in both lanes: one shuffle per field below */
            const __m256i sch = _mm256_broadcastsi128_si256(h ? _mm256_extracti128_si256(sc16, 1) : _mm256_castsi256_si128(sc16));
#pragma GCC unroll 4
            for (int f = 0; f < 4; f++) {
                __m256i u = _mm256_and_si256(f ? _mm256_srli_epi16(q, 2 * f) : q, m3);
                if (Q3) { /* hmask bit n = 4h + f moved to bit 2 (16-bit shifts of at most 5 keep within bytes) */
                    const int n = 4 * h + f;
                    const __m256i hb = n >= 2 ? _mm256_srli_epi16(hm, n - 2) : _mm256_slli_epi16(hm, 2 - n);
                    u = _mm256_or_si256(u, _mm256_and_si256(hb, four));
                }
                /* sub-blocks j = 8h + 2f (first 16 elements) and j + 1 */
                const __m256i s2 = _mm256_shuffle_epi8(sch, pick[f]);
#pragma GCC unroll 4
                for (int b = 0; b < NB; b++) {
                    const __m256i av = _mm256_loadu_si256((const __m256i *)(a[b].qs + QK_K * k + 128 * h + 32 * f));
                    /* in order (acc_add_epi32): 4 rows 1.17-1.20x, 16 rows 1.18-1.21x against
                     * gcc's tree of sums through the stack (Q6_K's alike measured 0.92-1.04x) */
                    acc_add_epi32(&acci[b], _mm256_madd_epi16(_mm256_maddubs_epi16(u, av), s2));
                }
            }
        }
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) {
            accf[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acci[b]), _mm256_set1_ps(a[b].d[k] * d), accf[b]);
            if (!Q3) {
                __m256i mi = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a[b].bsums + 16 * k)), off16);
                accf[b] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mi), _mm256_set1_ps(a[b].d[k] * dmin), accf[b]);
            }
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) y[b * ldy] = hsum_ps(accf[b]);
}

INLINE void mm_quant_row(int wtype, const void *w, int64_t cols, const act_row *a, float *y,
                         int64_t ldy, const int NB) {
    if (wtype == QTYPE_Q3_K || wtype == QTYPE_Q2_K) mm_q23k_row(wtype, w, cols / QK_K, a, y, ldy, NB);
    else mm_q6k_row(w, cols / QK_K, a, y, ldy, NB);
}

INLINE void mm_quant(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                     int nb, float *Y, int64_t ldy) {
    act_kind kind = act_kind_of(wtype);
    size_t wrow = qtype_row_bytes(wtype, cols);
    kern_pf_start((const char *)W + (size_t)r0 * wrow);
    for (int64_t r = r0; r < r1; r++) {
        const void *w = (const char *)W + (size_t)r * wrow;
        kern_pf_pages(w, wrow); /* decode: lines ahead too, per block in the row kernels */
        for (int b0 = 0; b0 < nb; b0 += MM_NB) {
            act_row a[MM_NB];
            int n = nb - b0 < MM_NB ? nb - b0 : MM_NB;
            for (int b = 0; b < n; b++) a[b] = act_get_row(kind, act, cols, b0 + b);
            float *y = Y + (int64_t)b0 * ldy + r;
            switch (n) {
            case 1: mm_quant_row(wtype, w, cols, a, y, ldy, 1); break;
            case 2: mm_quant_row(wtype, w, cols, a, y, ldy, 2); break;
            case 3: mm_quant_row(wtype, w, cols, a, y, ldy, 3); break;
            default: mm_quant_row(wtype, w, cols, a, y, ldy, 4); break;
            }
        }
    }
}

static void matmul_q8_0_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q8_0, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_iq4_nl_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_IQ4_NL, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q4_1_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q4_1, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q5_1_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q5_1, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q5_0_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q5_0, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q4_0_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q4_0, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q5_K_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q5_K, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q3_K_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_quant(QTYPE_Q3_K, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q2_K_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_quant(QTYPE_Q2_K, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_iq4_xs_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_IQ4_XS, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q4_K_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_q8(QTYPE_Q4_K, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q6_K_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_quant(QTYPE_Q6_K, W, cols, r0, r1, act, nb, Y, ldy);
}

/* ---- dequantization (same arithmetic as quant.c, so results are equal) ---- */

static void dequant_f16_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    /* the last elements by the reference, which reads any byte address */
    if (i < n) qtype_dequantize_ref(QTYPE_F16, (const char *)src + 2 * i, dst + i, n - i);
}

static void dequant_bf16_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    if (i < n) qtype_dequantize_ref(QTYPE_BF16, (const char *)src + 2 * i, dst + i, n - i);
}

/* Stores 8 int8 (low 8 bytes of v) times `scale`. */
INLINE void store8_scaled(float *dst, __m128i v, __m256 scale) {
    _mm256_storeu_ps(dst, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
}

static void dequant_q8_0_avx2(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t k = 0; k < n / QK8_0; k++, dst += 32) {
        __m256 d = _mm256_set1_ps(f16_to_f32(b[k].d));
        for (int i = 0; i < 32; i += 8) store8_scaled(dst + i, _mm_loadl_epi64((const __m128i *)(b[k].qs + i)), d);
    }
}

static void dequant_q4_0_avx2(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    const __m128i m4 = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8);
    for (int64_t k = 0; k < n / QK4_0; k++, dst += 32) {
        __m256 d = _mm256_set1_ps(f16_to_f32(b[k].d));
        __m128i q = _mm_loadu_si128((const __m128i *)b[k].qs);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), eight);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), eight);
        store8_scaled(dst, lo, d);
        store8_scaled(dst + 8, _mm_srli_si128(lo, 8), d);
        store8_scaled(dst + 16, hi, d);
        store8_scaled(dst + 24, _mm_srli_si128(hi, 8), d);
    }
}

static void dequant_q4_K_avx2(const void *src, float *dst, int64_t n) {
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
                __m256 d1 = _mm256_set1_ps(d * (float)sm[j]), m1 = _mm256_set1_ps(dmin * (float)sm[8 + j]);
                __m128i v[2] = {_mm256_castsi256_si128(nib[h]), _mm256_extracti128_si256(nib[h], 1)};
                for (int i = 0; i < 4; i++) {
                    __m128i bytes = i & 1 ? _mm_srli_si128(v[i / 2], 8) : v[i / 2];
                    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                    _mm256_storeu_ps(dst + 8 * i, _mm256_sub_ps(_mm256_mul_ps(d1, f), m1));
                }
            }
        }
    }
}

static void dequant_q6_K_avx2(const void *src, float *dst, int64_t n) {
    const block_q6_K *b = src;
    const __m256i off = _mm256_set1_epi8(32);
    for (int64_t k = 0; k < n / QK_K; k++) {
        float d = f16_to_f32(b[k].d);
        for (int h = 0; h < 2; h++) {
            for (int kk = 0; kk < 4; kk++, dst += 32) {
                __m256i q = _mm256_sub_epi8(q6k_quarter(b[k].ql + 64 * h, b[k].qh + 32 * h, kk), off);
                int j = 8 * h + 2 * kk;
                __m256 s0 = _mm256_set1_ps(d * (float)b[k].scales[j]);
                __m256 s1 = _mm256_set1_ps(d * (float)b[k].scales[j + 1]);
                __m128i v0 = _mm256_castsi256_si128(q), v1 = _mm256_extracti128_si256(q, 1);
                store8_scaled(dst, v0, s0);
                store8_scaled(dst + 8, _mm_srli_si128(v0, 8), s0);
                store8_scaled(dst + 16, v1, s1);
                store8_scaled(dst + 24, _mm_srli_si128(v1, 8), s1);
            }
        }
    }
}

/* ---- row kernels ---- */

static void rmsnorm_avx2(float *out, const float *x, const float *w, int64_t n, float eps) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    float ss = hsum_ps(_mm256_add_ps(a0, a1));
    for (; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    __m256 sv = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void rope_avx2(float *x, int n_heads, int head_dim, int n_rot, const float *cos_sin, int neox) {
    int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_dim;
        int i = 0;
        if (!neox) {
            /* 4 interleaved pairs: even lanes x0 c - x1 s, odd lanes x1 c + x0 s */
            for (; i + 4 <= half; i += 4) {
                __m256 cs = _mm256_loadu_ps(cos_sin + 2 * i);
                __m256 xv = _mm256_loadu_ps(v + 2 * i);
                __m256 xs = _mm256_permute_ps(xv, 0xB1);
                __m256 r = _mm256_addsub_ps(_mm256_mul_ps(xv, _mm256_moveldup_ps(cs)),
                                            _mm256_mul_ps(xs, _mm256_movehdup_ps(cs)));
                _mm256_storeu_ps(v + 2 * i, r);
            }
        } else {
            for (; i + 8 <= half; i += 8) {
                __m256 A = _mm256_loadu_ps(cos_sin + 2 * i), B = _mm256_loadu_ps(cos_sin + 2 * i + 8);
                __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(
                    _mm256_castps_pd(_mm256_shuffle_ps(A, B, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
                __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(
                    _mm256_castps_pd(_mm256_shuffle_ps(A, B, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
                __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
                _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
                _mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
            }
        }
        for (; i < half; i++) {
            float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
            float *p0 = neox ? v + i : v + 2 * i;
            float *p1 = neox ? v + i + half : v + 2 * i + 1;
            float x0 = *p0, x1 = *p1;
            *p0 = x0 * c - x1 * s;
            *p1 = x0 * s + x1 * c;
        }
    }
}

static void swiglu_avx2(float *out, const float *gate, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp_ps(_mm256_xor_ps(g, neg));
        __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* As logsumexp_avx512: 8 lanes, float sums over runs of at most 128 vectors, then double. */
static double logsumexp_avx2(const float *x, int64_t n) {
    int64_t i = 0;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float max = hmax_ps(mv);
    for (; i < n; i++) max = fmaxf(max, x[i]);
    if (max == -INFINITY) return -INFINITY;
    const __m256 mb = _mm256_set1_ps(max);
    __m256d d0 = _mm256_setzero_pd(), d1 = _mm256_setzero_pd();
    for (i = 0; i + 8 <= n;) {
        __m256 sv = _mm256_setzero_ps();
        for (int64_t end = i + 1024 < n ? i + 1024 : n; i + 8 <= end; i += 8)
            sv = _mm256_add_ps(sv, exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mb)));
        d0 = _mm256_add_pd(d0, _mm256_cvtps_pd(_mm256_castps256_ps128(sv)));
        d1 = _mm256_add_pd(d1, _mm256_cvtps_pd(_mm256_extractf128_ps(sv, 1)));
    }
    double sum[4];
    _mm256_storeu_pd(sum, _mm256_add_pd(d0, d1));
    double total = sum[0] + sum[1] + sum[2] + sum[3];
    for (; i < n; i++) total += expf(x[i] - max);
    return (double)max + log(total);
}

static void softmax_avx2(float *x, int64_t n) {
    if (n <= 0) return;
    int64_t i = 0;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float max = hmax_ps(mv);
    for (; i < n; i++) max = fmaxf(max, x[i]);
    __m256 mb = _mm256_set1_ps(max), sv = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mb));
        _mm256_storeu_ps(x + i, e);
        sv = _mm256_add_ps(sv, e);
    }
    float sum = hsum_ps(sv);
    for (; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    __m256 iv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
    for (; i < n; i++) x[i] *= inv;
}

static void add_avx2(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

static float dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void f32_to_f16_avx2(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = ellm_f32_to_f16(src[i]);
}

static void f16_to_f32_avx2(const uint16_t *src, float *dst, int64_t n) { dequant_f16_avx2(src, dst, n); }

/* F16 output through the row converter (see quantize_f16_avx512). */
static void quantize_f16_avx2(const float *x, void *dst, int64_t n) { f32_to_f16_avx2(x, dst, n); }

const kern_table kern_table_avx2 = {
    .quantize = {[QTYPE_F16] = quantize_f16_avx2},
    .matmul =
        {
            [QTYPE_F32] = matmul_f32_avx2,
            [QTYPE_F16] = matmul_f16_avx2,
            [QTYPE_BF16] = matmul_bf16_avx2,
            [QTYPE_Q8_0] = matmul_q8_0_avx2,
            [QTYPE_Q4_0] = matmul_q4_0_avx2,
            [QTYPE_Q5_0] = matmul_q5_0_avx2,
            [QTYPE_Q4_1] = matmul_q4_1_avx2,
            [QTYPE_IQ4_NL] = matmul_iq4_nl_avx2,
            [QTYPE_Q5_1] = matmul_q5_1_avx2,
            [QTYPE_Q4_K] = matmul_q4_K_avx2,
            [QTYPE_Q5_K] = matmul_q5_K_avx2,
            [QTYPE_IQ4_XS] = matmul_iq4_xs_avx2,
            [QTYPE_Q3_K] = matmul_q3_K_avx2,
            [QTYPE_Q2_K] = matmul_q2_K_avx2,
            [QTYPE_Q6_K] = matmul_q6_K_avx2,
            [QTYPE_INT4_G128] = kern_matmul_int4_g128_avx2,
        },
    .dequantize =
        {
            [QTYPE_F16] = dequant_f16_avx2,
            [QTYPE_BF16] = dequant_bf16_avx2,
            [QTYPE_Q8_0] = dequant_q8_0_avx2,
            [QTYPE_Q4_0] = dequant_q4_0_avx2,
            [QTYPE_Q4_K] = dequant_q4_K_avx2,
            [QTYPE_Q6_K] = dequant_q6_K_avx2,
        },
    .act_q8 = act_q8_row_avx2,
    .act_q8k = act_q8k_row_avx2,
    .rmsnorm = rmsnorm_avx2,
    .rope = rope_avx2,
    .swiglu = swiglu_avx2,
    .softmax = softmax_avx2,
    .logsumexp = logsumexp_avx2,
    .add = add_avx2,
    .dot_f32 = dot_f32_avx2,
    .f32_to_f16 = f32_to_f16_avx2,
    .f16_to_f32 = f16_to_f32_avx2,
};
