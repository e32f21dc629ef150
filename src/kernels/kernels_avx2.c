/* AVX2 + FMA + F16C kernels. This file is compiled with those flags only and
 * its functions are reached only through kern_table_avx2 when the CPU has
 * them (kernels.c). Each function computes what its `_ref` in kernels.c or
 * quant.c defines; tests/test_kernels.c holds them to it.
 *
 * Matmul shape: for each weight row r, the row is decoded block by block and
 * applied to a chunk of up to MM_NB activation rows held in registers; the
 * next chunk re-reads the row from L1, so DRAM sees every weight once per
 * call whatever nb is. */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

enum { MM_NB = 4 }; /* activation rows per register tile (16 ymm registers) */

/* ---- activation preparation (bit-identical to kern_act_q8*_row_ref) ---- */

static void act_q8_row_avx2(const float *x, int64_t cols, void *row) {
    act_row a = act_sections(ACT_Q8, cols, row);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t k = 0; k < cols / 32; k++, x += 32) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                                 _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
        float amax = hmax_ps(m);
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        __m256 iv = _mm256_set1_ps(id);
        __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, iv)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, iv));
        __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, iv)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, iv));
        a.d[k] = d;
        a.s[k] = d * (float)hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
        _mm256_storeu_si256((__m256i *)(a.qs + 32 * k), pack_epi32_epi8(q0, q1, q2, q3));
    }
}

static void act_q8k_row_avx2(const float *x, int64_t cols, void *row) {
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
 * accumulators per row hide the FMA latency when NB is small. */
INLINE void mm_float_row(int wtype, const void *w, int64_t cols, const float *const *x, float *y,
                         int64_t ldy, const int NB) {
    __m256 acc0[MM_NB], acc1[MM_NB];
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) acc0[b] = acc1[b] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
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

/* ---- Q8_0 / Q4_0 weights against ACT_Q8 ----
 * maddubs multiplies unsigned by signed bytes into int16 pairs. Q4_0's raw
 * nibbles q = w + 8 are the unsigned side directly (pairs <= 2 * 15 * 127),
 * and the offset comes off per block in float: dw * da * sum(q a) - 8 * dw *
 * s[k] with s[k] = da * sum(a). Q8_0 would overflow int16 that way, so it
 * multiplies |w| by a * sign(w) (pairs <= 2 * 128 * 127). Scales dw * da
 * are formed 8 blocks at a time (gathered f16 dw times 8 da) into a small
 * stack table that the block loop broadcasts from (a load, not a shuffle). */

/* f16 scales of the n (<= 8) blocks of `bsz` bytes at `w`, the f16 at the
 * start of each block, as floats; zeros past n. */
INLINE __m256 gather_scales8(const void *w, int bsz, int n, __m256i lanes) {
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes);
    __m256i raw = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)w,
                                              _mm256_mullo_epi32(lanes, _mm256_set1_epi32(bsz)), mask, 1);
    raw = _mm256_and_si256(raw, _mm256_set1_epi32(0xFFFF));
    __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(raw), _mm256_extracti128_si256(raw, 1));
    return _mm256_cvtph_ps(h);
}

/* Block k's weights: Q8_0 as signed bytes, Q4_0 as unsigned nibbles (w + 8). */
INLINE __m256i load_q8_block(int wtype, const void *W, int64_t k) {
    if (wtype == QTYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)W)[k].qs);
    __m128i q = _mm_loadu_si128((const __m128i *)((const block_q4_0 *)W)[k].qs);
    __m128i m4 = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

/* int32 partial sums (8 lanes) of block weights times activation bytes `av`. */
INLINE __m256i dot_q8_block(int wtype, __m256i wq, __m256i wabs, __m256i av) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p = wtype == QTYPE_Q8_0 ? _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(av, wq))
                                    : _mm256_maddubs_epi16(wq, av);
    return _mm256_madd_epi16(p, ones);
}

INLINE void mm_q8_row(int wtype, const void *w, int64_t nblk, const act_row *a, float *y, int64_t ldy,
                      const int NB) {
    const int bsz = wtype == QTYPE_Q8_0 ? (int)sizeof(block_q8_0) : (int)sizeof(block_q4_0);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    float sc[MM_NB][8] __attribute__((aligned(32))); /* dw * da for the current 8 blocks */
    __m256 acc[MM_NB];
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) acc[b] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < nblk; k0 += 8) {
        int n = nblk - k0 < 8 ? (int)(nblk - k0) : 8;
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes);
        __m256 dw = gather_scales8((const char *)w + k0 * bsz, bsz, n, lanes);
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) {
            _mm256_store_ps(sc[b], _mm256_mul_ps(dw, _mm256_maskload_ps(a[b].d + k0, m)));
            if (wtype == QTYPE_Q4_0)
                acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(-8.0f)), _mm256_maskload_ps(a[b].s + k0, m),
                                         acc[b]);
        }
        int i = 0;
        for (; i + 2 <= n; i += 2) {
            int64_t k = k0 + i;
            __m256i w0 = load_q8_block(wtype, w, k), w1 = load_q8_block(wtype, w, k + 1);
            __m256i u0 = _mm256_sign_epi8(w0, w0), u1 = _mm256_sign_epi8(w1, w1);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) {
                const int8_t *q = a[b].qs + 32 * k;
                __m256i d0 = dot_q8_block(wtype, w0, u0, _mm256_loadu_si256((const __m256i *)q));
                __m256i d1 = dot_q8_block(wtype, w1, u1, _mm256_loadu_si256((const __m256i *)(q + 32)));
                /* two products summed first: one add on the accumulator chain per pair */
                __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(d0), _mm256_broadcast_ss(&sc[b][i]));
                t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_broadcast_ss(&sc[b][i + 1]), t);
                acc[b] = _mm256_add_ps(acc[b], t);
            }
        }
        if (i < n) {
            int64_t k = k0 + i;
            __m256i w0 = load_q8_block(wtype, w, k), u0 = _mm256_sign_epi8(w0, w0);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) {
                __m256i d0 = dot_q8_block(wtype, w0, u0, _mm256_loadu_si256((const __m256i *)(a[b].qs + 32 * k)));
                acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_broadcast_ss(&sc[b][i]), acc[b]);
            }
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) y[b * ldy] = hsum_ps(acc[b]);
}

/* ---- Q4_K weights against ACT_Q8K ----
 * qs[32g .. 32g+31] holds sub-block 2g in low nibbles and 2g+1 in high
 * nibbles, matching activations a[64g ..] and a[64g + 32 ..]. maddubs of
 * the 4-bit q (unsigned) with a, then madd with the sub-block scale, gives
 * int32 partial sums of sc * q * a; the mins term uses bsums. */
INLINE void mm_q4k_row(const block_q4_K *w, int64_t nblk, const act_row *a, float *y, int64_t ldy,
                       const int NB) {
    __m256 accf[MM_NB];
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m128i pair_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) accf[b] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nblk; k++) {
        __m128i sm = q4k_scales_vec(w[k].scales); /* sc[0..7], m[0..7] as bytes */
        __m256i smb = _mm256_broadcastsi128_si256(sm);
        /* m[j] twice: madd with bsums[2j], bsums[2j+1] gives m[j] * sum(a_j). */
        __m256i mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, pair_mins));
        __m128 dd = _mm_cvtph_ps(_mm_loadu_si32(&w[k].d)); /* d, dmin */
        __m256i acci[MM_NB];
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) acci[b] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(w[k].qs + 32 * g));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            /* sc[2g], sc[2g + 1] zero-extended into every int16 (pshufb index 0x80 gives 0) */
            __m256i s_lo = _mm256_shuffle_epi8(smb, _mm256_set1_epi16((short)(0x8000 | (2 * g))));
            __m256i s_hi = _mm256_shuffle_epi8(smb, _mm256_set1_epi16((short)(0x8000 | (2 * g + 1))));
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) {
                const int8_t *aq = a[b].qs + QK_K * k + 64 * g;
                __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)aq));
                __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(aq + 32)));
                acci[b] = _mm256_add_epi32(acci[b], _mm256_add_epi32(_mm256_madd_epi16(p0, s_lo),
                                                                     _mm256_madd_epi16(p1, s_hi)));
            }
        }
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) {
            __m256i bs = _mm256_loadu_si256((const __m256i *)(a[b].bsums + 16 * k));
            __m256i mi = _mm256_madd_epi16(bs, mins);
            __m128 ds = _mm_mul_ps(dd, _mm_set1_ps(a[b].d[k])); /* da * d, da * dmin */
            accf[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acci[b]), _mm256_broadcastss_ps(ds), accf[b]);
            accf[b] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mi), _mm256_broadcastss_ps(_mm_movehdup_ps(ds)), accf[b]);
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) y[b * ldy] = hsum_ps(accf[b]);
}

/* ---- Q6_K weights against ACT_Q8K ----
 * Per half h and quarter kk, 32 6-bit q in natural order are rebuilt from
 * ql nibbles and qh bit pairs (16-bit shifts; the bits that leak across
 * bytes are masked off). q is unsigned, so maddubs(q, a) then madd with the
 * two sub-block scales; the -32 offset is 32 * sum_j sc[j] * bsums[j]. */
INLINE void mm_q6k_row(const block_q6_K *w, int64_t nblk, const act_row *a, float *y, int64_t ldy,
                       const int NB) {
    __m256 accf[MM_NB];
    /* Low 128-bit lane: int16 0 of a dword repeated; high lane: int16 1. */
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2,
                                          3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) accf[b] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nblk; k++) {
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[k].scales));
        __m256i acci[MM_NB];
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) acci[b] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
            for (int kk = 0; kk < 4; kk++) {
                __m256i q = q6k_quarter(w[k].ql + 64 * h, w[k].qh + 32 * h, kk);
                /* scales of sub-blocks 8h + 2kk and 8h + 2kk + 1 = dword 4h + kk */
                __m256i s = _mm256_shuffle_epi8(
                    _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(4 * h + kk)), pick);
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

INLINE void mm_quant_row(int wtype, const void *w, int64_t cols, const act_row *a, float *y,
                         int64_t ldy, const int NB) {
    if (wtype == QTYPE_Q4_K) mm_q4k_row(w, cols / QK_K, a, y, ldy, NB);
    else if (wtype == QTYPE_Q6_K) mm_q6k_row(w, cols / QK_K, a, y, ldy, NB);
    else mm_q8_row(wtype, w, cols / 32, a, y, ldy, NB);
}

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
            default: mm_quant_row(wtype, w, cols, a, y, ldy, 4); break;
            }
        }
    }
}

static void matmul_q8_0_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_quant(QTYPE_Q8_0, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q4_0_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_quant(QTYPE_Q4_0, W, cols, r0, r1, act, nb, Y, ldy);
}
static void matmul_q4_K_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act,
                             int nb, float *Y, int64_t ldy) {
    mm_quant(QTYPE_Q4_K, W, cols, r0, r1, act, nb, Y, ldy);
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
    for (; i < n; i++) dst[i] = ellm_f16_to_f32(s[i]);
}

static void dequant_bf16_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) dst[i] = ellm_bf16_to_f32(s[i]);
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

const kern_table kern_table_avx2 = {
    .matmul =
        {
            [QTYPE_F32] = matmul_f32_avx2,
            [QTYPE_F16] = matmul_f16_avx2,
            [QTYPE_BF16] = matmul_bf16_avx2,
            [QTYPE_Q8_0] = matmul_q8_0_avx2,
            [QTYPE_Q4_0] = matmul_q4_0_avx2,
            [QTYPE_Q4_K] = matmul_q4_K_avx2,
            [QTYPE_Q6_K] = matmul_q6_K_avx2,
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
    .add = add_avx2,
    .dot_f32 = dot_f32_avx2,
    .f32_to_f16 = f32_to_f16_avx2,
    .f16_to_f32 = f16_to_f32_avx2,
};
