/* AVX-512 kernels (F/BW/DQ/VL; the integer matmuls also VNNI). This file is
 * compiled with those flags only and reached only through kern_table_avx512
 * when the CPU has them; kernels.c routes the integer matmuls to AVX2 on
 * AVX-512 CPUs without VNNI. Each function computes what its `_ref` in
 * kernels.c or quant.c defines; tests/test_kernels.c holds them to it.
 *
 * Matmul shape: each weight block is decoded once into registers and applied
 * to a tile of activation rows (Q8_0 / Q4_0: up to 2 weight rows x 4
 * activation rows; others: 1 x up to MM_NB); further tiles re-read the
 * weights from L1 or L2, so DRAM sees every weight once per call. Each
 * output's arithmetic is independent of nb and of the tiling, so results are
 * batch-invariant. */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

enum { MM_NB = 8 }; /* activation rows per register tile (32 vector registers) */

INLINE __mmask16 tail16(int64_t n) { return (__mmask16)((1u << n) - 1); }

/* e^x within ~2 ulp of expf for x in [-87.3, 88]; 0 below (where expf is
 * subnormal or 0), e^88 above; NaN stays NaN. x = n ln2 + r, e^r by a
 * degree-7 polynomial, scaled by 2^n with vscalefps. */
INLINE __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.0f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);
    x = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

/* ---- activation preparation (bit-identical to kern_act_q8*_row_ref) ---- */

static void act_q8_row_avx512(const float *x, int64_t cols, void *row) {
    act_row a = act_sections(ACT_Q8, cols, row);
    for (int64_t k = 0; k < cols / 32; k++, x += 32) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        __m512 iv = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, iv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, iv));
        a.d[k] = d;
        a.s[k] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        _mm_storeu_si128((__m128i *)(a.qs + 32 * k), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(a.qs + 32 * k + 16), _mm512_cvtsepi32_epi8(q1));
    }
}

static void act_q8k_row_avx512(const float *x, int64_t cols, void *row) {
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
    for (int64_t r = r0; r < r1; r++) {
        const void *w = (const char *)W + (size_t)r * wrow;
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

/* ---- Q8_0 / Q4_0 weights against ACT_Q8 (VNNI) ----
 * vpdpbusd multiplies unsigned by signed bytes, so weights enter unsigned:
 * Q8_0 as w + 128 (w ^ 0x80), Q4_0 as its raw nibbles w + 8, and the offset
 * comes off in float, off * dw * s[k] with s[k] = da * sum(a); the integer
 * parts are exact (each lane sums 4 products below 2^16).
 *
 * One block per ymm: on Zen 4 a zmm op costs two ymm ops anyway, and 34-byte
 * Q8_0 blocks would need an insert to pair up. Scales dw * da are formed 16
 * blocks at a time (gathered f16 dw times 16 da) into a small stack table
 * that the block loop broadcasts from memory (a load, not a shuffle). */

/* Block k's weights as unsigned bytes (see above). */
INLINE __m256i load_q8_block_u8(int wtype, const void *W, int64_t k) {
    if (wtype == QTYPE_Q8_0) {
        __m256i v = _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)W)[k].qs);
        return _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
    }
    __m128i q = _mm_loadu_si128((const __m128i *)((const block_q4_0 *)W)[k].qs);
    __m128i m4 = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

enum { Q8_R = 2, Q8_NB = 4 }; /* weight rows x activation rows per tile */
enum { Q8_PF = 32 };          /* software prefetch distance in blocks (multi-row tiles) */

/* Block k (entry i of the scale table) of R weight rows against NB
 * activation rows, accumulated into acc[r][b]. */
INLINE void mm_q8_tile_block(int wtype, const char *w, size_t wrow, const act_row *a, int64_t k,
                             float sc[Q8_R][Q8_NB][16], int i, __m256 acc[Q8_R][Q8_NB], const int R,
                             const int NB) {
    const int bsz = wtype == QTYPE_Q8_0 ? (int)sizeof(block_q8_0) : (int)sizeof(block_q4_0);
    __m256i wv[Q8_R];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) {
        /* Several interleaved row streams defeat the hardware prefetcher here;
         * one stream (R = 1) does better without help. */
        if (R > 1) _mm_prefetch(w + r * wrow + (k + Q8_PF) * bsz, _MM_HINT_T0);
        wv[r] = load_q8_block_u8(wtype, w + r * wrow, k);
    }
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) {
        __m256i av = _mm256_loadu_si256((const __m256i *)(a[b].qs + 32 * k));
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wv[r], av);
            acc[r][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(sc[r][b][i]), acc[r][b]);
        }
    }
}

/* R weight rows from `w` (rows `wrow` bytes apart) against NB activation
 * rows; writes y[b * ldy + r]. Each activation block is loaded once for the
 * R rows. Every output takes the same sequence of operations whatever R, NB
 * and its place in the tile (even blocks into acc, odd blocks and the offset
 * corrections into acc2, then one final sum), so a row's result does not
 * depend on the batch it came in: batched verification reproduces decode
 * bit for bit. */
INLINE void mm_q8_tile(int wtype, const char *w, size_t wrow, int64_t nblk, const act_row *a, float *y,
                       int64_t ldy, const int R, const int NB) {
    const int bsz = wtype == QTYPE_Q8_0 ? (int)sizeof(block_q8_0) : (int)sizeof(block_q4_0);
    const __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(bsz));
    const __m512 off = _mm512_set1_ps(wtype == QTYPE_Q8_0 ? -128.0f : -8.0f);
    float sc[Q8_R][Q8_NB][16] __attribute__((aligned(64))); /* dw * da for the current 16 blocks */
    __m256 acc[Q8_R][Q8_NB], acc2[Q8_R][Q8_NB];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) acc[r][b] = acc2[r][b] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < nblk; k0 += 16) {
        int n = nblk - k0 < 16 ? (int)(nblk - k0) : 16;
        __mmask16 m = n == 16 ? 0xFFFF : tail16(n);
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            __m512i raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, offs, w + r * wrow + k0 * bsz, 1);
            __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
            __m512 dwo = _mm512_mul_ps(dw, off);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) {
                _mm512_store_ps(sc[r][b], _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(m, a[b].d + k0)));
                __m512 corr = _mm512_mul_ps(dwo, _mm512_maskz_loadu_ps(m, a[b].s + k0));
                acc2[r][b] = _mm256_add_ps(acc2[r][b], _mm256_add_ps(_mm512_castps512_ps256(corr),
                                                                     _mm512_extractf32x8_ps(corr, 1)));
            }
        }
        int i = 0;
        for (; i + 2 <= n; i += 2) {
            mm_q8_tile_block(wtype, w, wrow, a, k0 + i, sc, i, acc, R, NB);
            mm_q8_tile_block(wtype, w, wrow, a, k0 + i + 1, sc, i + 1, acc2, R, NB);
        }
        if (i < n) mm_q8_tile_block(wtype, w, wrow, a, k0 + i, sc, i, acc, R, NB);
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) y[b * ldy + r] = hsum_ps(_mm256_add_ps(acc[r][b], acc2[r][b]));
}

/* Rows [r0, r1) in tiles of up to Q8_R weight rows x Q8_NB activation rows. */
INLINE void mm_q8(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                  float *Y, int64_t ldy) {
    size_t wrow = qtype_row_bytes(wtype, cols);
    int64_t nblk = cols / 32;
    /* Decode (nb <= 2) is bound by DRAM: one weight row at a time keeps a
     * single sequential stream. Larger batches are bound by compute and L2
     * and gain from sharing each activation load across Q8_R rows. */
    int rt = nb <= 2 ? 1 : Q8_R;
    for (int64_t r = r0; r < r1; r += rt) {
        int R = r1 - r < rt ? (int)(r1 - r) : rt;
        const char *w = (const char *)W + (size_t)r * wrow;
        for (int b0 = 0; b0 < nb; b0 += Q8_NB) {
            act_row a[Q8_NB];
            int n = nb - b0 < Q8_NB ? nb - b0 : Q8_NB;
            for (int b = 0; b < n; b++) a[b] = act_get_row(ACT_Q8, act, cols, b0 + b);
            float *y = Y + (int64_t)b0 * ldy + r;
#define MM_Q8_CASE(R_, N_) \
    case (R_)*8 + (N_): mm_q8_tile(wtype, w, wrow, nblk, a, y, ldy, R_, N_); break
            switch (R * 8 + n) {
                MM_Q8_CASE(1, 1); MM_Q8_CASE(1, 2); MM_Q8_CASE(1, 3); MM_Q8_CASE(1, 4);
                MM_Q8_CASE(2, 1); MM_Q8_CASE(2, 2); MM_Q8_CASE(2, 3); MM_Q8_CASE(2, 4);
            }
#undef MM_Q8_CASE
        }
    }
}

/* ---- Q4_K weights against ACT_Q8K (VNNI) ----
 * qs[32g .. 32g+31] holds sub-block 2g in its low nibbles and 2g+1 in its
 * high nibbles, matching activations a[64g ..] and a[64g + 32 ..]. maddubs
 * (4-bit q unsigned; pairs far from int16 overflow) then vpdpwssd with the
 * sub-block scale accumulates sc * q * a exactly in int32; the mins term
 * uses bsums. ymm rather than zmm: the nibble halves then line up with
 * contiguous activations without cross-lane shuffles, which on Zen 4 makes
 * the per-block decode cheaper for the same per-row work. */
INLINE void mm_q4k_row(const block_q4_K *w, int64_t nblk, const act_row *a, float *y, int64_t ldy,
                       const int NB) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m128i pair_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    __m256 accf[MM_NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) accf[b] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nblk; k++) {
        __m128i sm = q4k_scales_vec(w[k].scales); /* sc[0..7], m[0..7] as bytes */
        __m256i smb = _mm256_broadcastsi128_si256(sm);
        /* m[j] twice: madd with bsums[2j], bsums[2j+1] gives m[j] * sum(a_j) */
        __m256i mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, pair_mins));
        __m128 dd = _mm_cvtph_ps(_mm_loadu_si32(&w[k].d)); /* d, dmin */
        __m256i acci[MM_NB];
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) acci[b] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(w[k].qs + 32 * g));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            /* sc[2g], sc[2g + 1] zero-extended into every int16 (pshufb index 0x80 gives 0) */
            __m256i s_lo = _mm256_shuffle_epi8(smb, _mm256_set1_epi16((short)(0x8000 | (2 * g))));
            __m256i s_hi = _mm256_shuffle_epi8(smb, _mm256_set1_epi16((short)(0x8000 | (2 * g + 1))));
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++) {
                const int8_t *aq = a[b].qs + QK_K * k + 64 * g;
                __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)aq));
                __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(aq + 32)));
                acci[b] = _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(acci[b], p0, s_lo), p1, s_hi);
            }
        }
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            __m256i mi = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a[b].bsums + 16 * k)), mins);
            __m128 ds = _mm_mul_ps(dd, _mm_set1_ps(a[b].d[k])); /* da * d, da * dmin */
            accf[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acci[b]), _mm256_broadcastss_ps(ds), accf[b]);
            accf[b] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mi), _mm256_broadcastss_ps(_mm_movehdup_ps(ds)), accf[b]);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        y[b * ldy] = hsum_ps(accf[b]);
    }
}

/* ---- Q6_K weights against ACT_Q8K (VNNI) ----
 * Per half h, one 64-byte ql load gives elements 0-63 (low nibbles) and
 * 64-127 (high nibbles) of the half in order; their top 2 bits come from the
 * 32 qh bytes (broadcast to both 256-bit halves) by per-half 16-bit shifts,
 * the bits leaking across bytes masked off. q is unsigned 6-bit, so maddubs
 * then vpdpwssd with the 16-element sub-block scales; the -32 offset is
 * 32 * sum_j sc[j] * bsums[j]. */
INLINE void mm_q6k_row(const block_q6_K *w, int64_t nblk, const act_row *a, float *y, int64_t ldy,
                       const int NB) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    /* int16 lane i of the scale vector for elements 64c .. 64c+63: sc[4c + i / 8] */
    const __m512i sidx0 = _mm512_set_epi64(0x0003000300030003ll, 0x0003000300030003ll, 0x0002000200020002ll,
                                           0x0002000200020002ll, 0x0001000100010001ll, 0x0001000100010001ll, 0, 0);
    __m512 accf[MM_NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) accf[b] = _mm512_setzero_ps();
    for (int64_t k = 0; k < nblk; k++) {
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[k].scales));
        __m512i s512 = _mm512_zextsi256_si512(sc16);
        __m512i sc[4], v[4];
        for (int c = 0; c < 4; c++)
            sc[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(sidx0, _mm512_set1_epi16((short)(4 * c))), s512);
        for (int h = 0; h < 2; h++) {
            __m512i ql = _mm512_loadu_si512((const void *)(w[k].ql + 64 * h));
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w[k].qh + 32 * h)));
            v[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
            v[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                           _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
        }
        float d = f16_to_f32(w[k].d);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            const int8_t *aq = a[b].qs + QK_K * k;
            __m512i acci = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m512i p = _mm512_maddubs_epi16(v[c], _mm512_loadu_si512((const void *)(aq + 64 * c)));
                acci = _mm512_dpwssd_epi32(acci, p, sc[c]);
            }
            __m256i off = _mm256_slli_epi32(
                _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a[b].bsums + 16 * k)), sc16), 5);
            acci = _mm512_sub_epi32(acci, _mm512_zextsi256_si512(off));
            accf[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci), _mm512_set1_ps(a[b].d[k] * d), accf[b]);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) y[b * ldy] = _mm512_reduce_add_ps(accf[b]);
}

INLINE void mm_quant_row(int wtype, const void *w, int64_t cols, const act_row *a, float *y,
                         int64_t ldy, const int NB) {
    if (wtype == QTYPE_Q4_K) mm_q4k_row(w, cols / QK_K, a, y, ldy, NB);
    else mm_q6k_row(w, cols / QK_K, a, y, ldy, NB);
}

/* K-quant rows [r0, r1), one weight row at a time against tiles of up to
 * MM_NB activation rows (their per-row integer work, not activation loads,
 * bounds them, so tiling weight rows as mm_q8 does buys little). */
INLINE void mm_quant(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                     int nb, float *Y, int64_t ldy) {
    act_kind kind = act_kind_of(wtype);
    size_t wrow = qtype_row_bytes(wtype, cols);
    for (int64_t r = r0; r < r1; r++) {
        const void *w = (const char *)W + (size_t)r * wrow;
        for (int b0 = 0; b0 < nb; b0 += MM_NB) {
            act_row a[MM_NB];
            int n = nb - b0 < MM_NB ? nb - b0 : MM_NB;
            for (int b = 0; b < n; b++) a[b] = act_get_row(kind, act, cols, b0 + b);
            float *y = Y + (int64_t)b0 * ldy + r;
            switch (n) {
            case 1: mm_quant_row(wtype, w, cols, a, y, ldy, 1); break;
            case 2: mm_quant_row(wtype, w, cols, a, y, ldy, 2); break;
            case 3: mm_quant_row(wtype, w, cols, a, y, ldy, 3); break;
            case 4: mm_quant_row(wtype, w, cols, a, y, ldy, 4); break;
            case 5: mm_quant_row(wtype, w, cols, a, y, ldy, 5); break;
            case 6: mm_quant_row(wtype, w, cols, a, y, ldy, 6); break;
            case 7: mm_quant_row(wtype, w, cols, a, y, ldy, 7); break;
            default: mm_quant_row(wtype, w, cols, a, y, ldy, 8); break;
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
static void matmul_q4_K_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_quant(QTYPE_Q4_K, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q6_K_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                               int nb, float *Y, int64_t ldy) {
    mm_quant(QTYPE_Q6_K, W, cols, r0, r1, act, nb, Y, ldy);
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

const kern_table kern_table_avx512 = {
    .matmul =
        {
            [QTYPE_F32] = matmul_f32_avx512,
            [QTYPE_F16] = matmul_f16_avx512,
            [QTYPE_BF16] = matmul_bf16_avx512,
            [QTYPE_Q8_0] = matmul_q8_0_avx512,
            [QTYPE_Q4_0] = matmul_q4_0_avx512,
            [QTYPE_Q4_K] = matmul_q4_K_avx512,
            [QTYPE_Q6_K] = matmul_q6_K_avx512,
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
    .rmsnorm = rmsnorm_avx512,
    .rope = rope_avx512,
    .swiglu = swiglu_avx512,
    .softmax = softmax_avx512,
    .add = add_avx512,
    .dot_f32 = dot_f32_avx512,
    .f32_to_f16 = f32_to_f16_avx512,
    .f16_to_f32 = f16_to_f32_avx512,
};
