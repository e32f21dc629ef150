/* AVX-512 attention block kernel for a Q8_0 KV cache (the arithmetic is
 * defined in attention_q8.c; needs VNNI and VBMI, see attn_q8_avx512_ok).
 *
 * Per tile of 16 keys of a block, for groups of up to 4 query rows:
 *   Q.K   keys are stored channel-major, 16 int8 keys per channel: 4 channels
 *         of the tile (64 bytes, one load when a block is 16 tokens) are
 *         regrouped by vpermb into one dword per key, XOR 0x80 makes them
 *         unsigned (k + 128), and vpdpbusd adds the 4 products with the row's
 *         4 query bytes (broadcast) for all 16 keys: 8 instructions per row and
 *         32-channel group, the permute shared by the rows. The int32 sum
 *         starts at -128 x (sum of the group's query bytes), so it ends as the
 *         exact dot product of the int8 vectors; it is converted and scaled by
 *         (query scale x the keys' scales) into the scores, group by group.
 *   softmax  online, as the F16 kernel (softmax_avx512.h).
 *   P*V   the value's scale is folded into the probability: per row, 32-dim
 *         group and key a weight p x vd, 16 keys at a time; the int8 values
 *         are converted in registers 16 dims at a time (each once per 4 rows)
 *         and multiplied into the rows' sums by the broadcast weights.
 * A row's arithmetic does not depend on which rows share its call, so a
 * batched pass gives each row the bits of a single-token one. The block ahead
 * is prefetched spread over the computation, as the F16 kernel does. */
#include "attention/attention_kernel.h"
#include "core/prefetch.h"

#include "attention/softmax_avx512.h"

#include <immintrin.h>

#define Q8_INLINE static inline __attribute__((always_inline))

Q8_INLINE __mmask16 q8_tail(int n) { return (__mmask16)((1u << n) - 1); }

/* vpermb indices: byte 4j + i of the result is byte 16i + j of the source
 * (channel i of key j, the source holding 4 rows of 16 keys). */
static const int8_t q8_quad_perm[64] __attribute__((aligned(64))) = {
    0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21,
    37, 53, 6, 22, 38, 54, 7, 23, 39, 55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58,
    11, 27, 43, 59, 12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};

/* Channels c .. c + 3 of keys j0 .. j0 + 16 as one dword per key, each byte
 * + 128 (unsigned). BT16: blocks of 16 keys, the 4 channels adjacent. Keys
 * outside m read nothing (other block sizes) or the block's own bytes past
 * the valid keys (16): their lanes are never stored. */
Q8_INLINE __m512i q8_quad(const int8_t *k, int bt, int j0, int c, __mmask16 m, __m512i perm, const int BT16) {
    __m512i x;
    if (BT16) {
        x = _mm512_loadu_si512((const void *)(k + (size_t)c * 16));
    } else {
        const int8_t *p = k + (size_t)c * bt + j0;
        x = _mm512_castsi128_si512(_mm_maskz_loadu_epi8(m, p));
        x = _mm512_inserti32x4(x, _mm_maskz_loadu_epi8(m, p + bt), 1);
        x = _mm512_inserti32x4(x, _mm_maskz_loadu_epi8(m, p + 2 * (size_t)bt), 2);
        x = _mm512_inserti32x4(x, _mm_maskz_loadu_epi8(m, p + 3 * (size_t)bt), 3);
    }
    return _mm512_xor_si512(_mm512_permutexvar_epi8(perm, x), _mm512_set1_epi8((char)0x80));
}

/* Scores s[r][j0 .. j0 + 16) of NR rows (keys outside m not stored). */
Q8_INLINE void q8_qk_tile(const attn_state *st, int r0, const int8_t *k, const uint16_t *kd, int bt, int hd,
                          int j0, __mmask16 m, const int NR, const int BT16, const char **pf, int pf_lines) {
    const int ng = hd / 32, hdp = st->hdp;
    const __m512i perm = _mm512_load_si512((const void *)q8_quad_perm);
    __m512 sc[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) sc[r] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512i ia[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) ia[r] = _mm512_set1_epi32(-st->qsum[(size_t)(r0 + r) * ng + g]);
#pragma GCC unroll 8
        for (int c = 32 * g; c < 32 * g + 32; c += 4) {
            if (*pf)
                for (int i = 0; i < pf_lines; i++, *pf += 64) _mm_prefetch(*pf, _MM_HINT_T1);
            const __m512i kq = q8_quad(k, bt, j0, c, m, perm, BT16);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                int32_t qw;
                __builtin_memcpy(&qw, st->q8 + (size_t)(r0 + r) * hdp + c, 4);
                ia[r] = _mm512_dpbusd_epi32(ia[r], kq, _mm512_set1_epi32(qw));
            }
        }
        const __m512 kdv = _mm512_cvtph_ps(BT16 ? _mm256_loadu_si256((const __m256i *)(kd + (size_t)g * 16))
                                                : _mm256_maskz_loadu_epi16(m, kd + (size_t)g * bt + j0));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 scale = _mm512_mul_ps(kdv, _mm512_set1_ps(st->qd[(size_t)(r0 + r) * ng + g]));
            sc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r]), scale, sc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) _mm512_mask_storeu_ps(st->s + (size_t)(r0 + r) * st->lds + j0, m, sc[r]);
}

/* acc[r][d0 .. d0 + 16 NV) += w[r][g][j] * v[j][d] over keys j of [j0, j0 + nk)
 * of the tile, g = d / 32; w holds per row ng x 16 weights (its tile's keys). */
Q8_INLINE void q8_pv_tile(float *acc, int hdp, const float *w, int ng, const int8_t *v, int hd, int d0, int j0,
                          int nk, const int NR, const int NV, const char **pf, int pf_lines) {
    __m512 c[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) c[r][i] = _mm512_loadu_ps(acc + (size_t)r * hdp + d0 + 16 * i);
    for (int j = 0; j < nk; j++) {
        if (*pf)
            for (int i = 0; i < pf_lines; i++, *pf += 64) _mm_prefetch(*pf, _MM_HINT_T1);
        __m512 x[4];
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++)
            x[i] = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(v + (size_t)(j0 + j) * hd + d0 + 16 * i))));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (int i = 0; i < NV; i++) {
                const int g = (d0 + 16 * i) / 32;
                c[r][i] = _mm512_fmadd_ps(_mm512_set1_ps(w[((size_t)r * ng + g) * 16 + j]), x[i], c[r][i]);
            }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) _mm512_storeu_ps(acc + (size_t)r * hdp + d0 + 16 * i, c[r][i]);
}

/* NR rows from r0, keys [j0, j0 + nk) of the tile: weights p x vd into w (a
 * scratch of NR x ng x 16), then P*V over all dims. vdt: ng x 16 value
 * scales of the tile's keys as F32. */
Q8_INLINE void q8_pv_rows(attn_state *st, int r0, const float *vdt, float *w, const int8_t *v, int hd, int j0,
                          int nk, const int NR, const char **pf, int pf_lines) {
    const int ng = hd / 32, hdp = st->hdp;
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        const __m512 p = _mm512_loadu_ps(st->s + (size_t)(r0 + r) * st->lds + j0);
        for (int g = 0; g < ng; g++)
            _mm512_storeu_ps(w + ((size_t)r * ng + g) * 16, _mm512_mul_ps(p, _mm512_loadu_ps(vdt + (size_t)g * 16)));
    }
    float *acc = st->acc + (size_t)r0 * hdp;
    int d = 0;
    for (; d + 64 <= hd; d += 64) q8_pv_tile(acc, hdp, w, ng, v, hd, d, j0, nk, NR, 4, pf, pf_lines);
    if (d < hd) q8_pv_tile(acc, hdp, w, ng, v, hd, d, j0, nk, NR, 2, pf, pf_lines); /* hd % 64 == 32 */
}

Q8_INLINE void q8_step(attn_state *st, const attn_block *b, const int HD, const int NK) {
    const int G = st->group, R = st->rows, hd = HD ? HD : st->head_dim, hdp = HD ? HD : st->hdp;
    const int r0 = (b->vis0 >= 1 ? 0 : 1 - b->vis0) * G; /* first row that sees a key */
    if (r0 >= R) return;
    int nk = b->vis0 + (R - 1) / G; /* keys the last row sees */
    if (nk > b->n_valid) nk = b->n_valid;
    if (NK) nk = NK;
    const int bt = NK ? NK : st->block_tokens, ng = hd / 32;
    const int BT16 = NK == 16;
    const int8_t *k = b->k, *v = b->v;
    const uint16_t *kd = (const uint16_t *)(k + (size_t)hd * bt), *vd = (const uint16_t *)(v + (size_t)hd * bt);
    /* the block ahead spread over this one's work (lines per quad of
     * channels, then per key); else the next one at once */
    const int half_lines = (int)((kv_q8_half_bytes(hd, bt) + 63) / 64);
    const int k_steps = (nk + 15) / 16 * (hd / 4);
    const int pf_k = (half_lines + k_steps - 1) / k_steps, pf_v = (half_lines + nk - 1) / nk;
    if (b->next_k && !b->ahead_k) {
        prefetch_range_l1(b->next_k, kv_q8_half_bytes(hd, bt));
        prefetch_range_l1(b->next_v, kv_q8_half_bytes(hd, bt));
    }
    const char *pfk = b->ahead_k, *pfv = b->ahead_v;
    for (int j0 = 0; j0 < nk; j0 += 16) {
        const __mmask16 m = nk - j0 >= 16 ? (__mmask16)0xffff : q8_tail(nk - j0);
        int r = r0;
        for (; r + 4 <= R; r += 4, pfk = NULL) q8_qk_tile(st, r, k, kd, bt, hd, j0, m, 4, BT16, &pfk, pf_k);
        switch (R - r) {
        case 3: q8_qk_tile(st, r, k, kd, bt, hd, j0, m, 3, BT16, &pfk, pf_k); break;
        case 2: q8_qk_tile(st, r, k, kd, bt, hd, j0, m, 2, BT16, &pfk, pf_k); break;
        case 1: q8_qk_tile(st, r, k, kd, bt, hd, j0, m, 1, BT16, &pfk, pf_k); break;
        default: break;
        }
    }
    attn_softmax_block_avx512(st, b, r0, nk, hdp, NK);
    /* scratch: the tile's value scales transposed (vdt, ng x 16) and as
     * stored (vdf, 16 x ng) in kbuf, the weights of 4 rows in vbuf */
    float *vdt = st->kbuf, *vdf = st->kbuf + 16 * ng, *w = st->vbuf;
    for (int j0 = 0; j0 < nk; j0 += 16) {
        const int n = nk - j0 < 16 ? nk - j0 : 16;
        const __mmask16 m = q8_tail(n);
        const uint16_t *vt = vd + (size_t)j0 * ng; /* vd[j][g] of the tile's keys: n x ng */
        if (ng == 2) {
            /* keys 0-7 and 8-15, groups interleaved; split into the even and odd lanes */
            const __mmask32 m2 = (__mmask32)(((uint64_t)1 << (2 * n)) - 1);
            const __m512i both = _mm512_maskz_loadu_epi16(m2, vt);
            const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(both));
            const __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(both, 1));
            const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            _mm512_storeu_ps(vdt, _mm512_permutex2var_ps(lo, even, hi));
            _mm512_storeu_ps(vdt + 16, _mm512_permutex2var_ps(lo, _mm512_add_epi32(even, _mm512_set1_epi32(1)), hi));
        } else {
            for (int i = 0; i < n * ng; i += 16) {
                const int c = n * ng - i < 16 ? n * ng - i : 16;
                _mm512_storeu_ps(vdf + i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(q8_tail(c), vt + i)));
            }
            const __m512i idx = _mm512_mullo_epi32(
                _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(ng));
            for (int g = 0; g < ng; g++)
                _mm512_storeu_ps(vdt + (size_t)g * 16,
                                 _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m,
                                                          _mm512_add_epi32(idx, _mm512_set1_epi32(g)), vdf, 4));
        }
        int r = r0;
        for (; r + 4 <= R; r += 4, pfv = NULL) q8_pv_rows(st, r, vdt, w, v, hd, j0, n, 4, &pfv, pf_v);
        switch (R - r) {
        case 3: q8_pv_rows(st, r, vdt, w, v, hd, j0, n, 3, &pfv, pf_v); break;
        case 2: q8_pv_rows(st, r, vdt, w, v, hd, j0, n, 2, &pfv, pf_v); break;
        case 1: q8_pv_rows(st, r, vdt, w, v, hd, j0, n, 1, &pfv, pf_v); break;
        default: break;
        }
    }
}

void attn_block_q8_avx512(attn_state *st, const attn_block *b) {
    /* every row sees all 16 keys: a block before the first row's position */
    const int full = st->block_tokens == 16 && b->n_valid == 16 && b->vis0 >= 16;
    switch (st->head_dim) {
    case 64:
        if (full) q8_step(st, b, 64, 16);
        else q8_step(st, b, 64, 0);
        break;
    case 128:
        if (full) q8_step(st, b, 128, 16);
        else q8_step(st, b, 128, 0);
        break;
    default: q8_step(st, b, 0, 0); break;
    }
}
