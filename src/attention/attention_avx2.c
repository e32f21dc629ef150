/* AVX2 + FMA + F16C attention block kernel and F32 -> F16 rows (compiled with
 * the AVX2 flags; only called when ellm_cpu_isa() allows it). Same structure
 * as the AVX-512 kernel with 8-wide vectors and 16 registers: QK^T over the
 * channel-major keys for up to 3 rows x 16 keys, P*V tiles of up to 3 rows x 32
 * dims; K and V read in place when head_dim is a multiple of 8, else through
 * F32 scratch. */
#include "attention/attention_kernel.h"
#include "core/prefetch.h"
#include "core/fp16.h"
#include "kernels/quant.h"

#include "attention/softmax_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))


/* Keys [0, n) of a channel-major block (hd channels of row stride bt, F16 or
 * F32) to F32 channel rows of stride ldd; prefetches the same bytes of `next`. */
static void load_kT(float *dst, int ldd, const void *src, int type, int n, int hd, int bt,
                    const char *next) {
    const size_t row_bytes = (size_t)bt * (type == QTYPE_F16 ? 2 : 4);
    for (int c = 0; c < hd; c++) {
        float *d = dst + (size_t)c * ldd;
        int j = 0;
        if (type == QTYPE_F16) {
            const uint16_t *s = (const uint16_t *)src + (size_t)c * bt;
            for (; j + 8 <= n; j += 8)
                _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j))));
            for (; j < n; j++) d[j] = ellm_f16_to_f32(s[j]);
        } else {
            const float *s = (const float *)src + (size_t)c * bt;
            for (; j < n; j++) d[j] = s[j];
        }
        if (next)
            for (size_t o = (size_t)c * row_bytes & ~(size_t)63; o < (size_t)(c + 1) * row_bytes; o += 64)
                _mm_prefetch(next + o, _MM_HINT_T0);
    }
}

/* Rows [0, n) of a block (row stride hd, F16 or F32) to F32 rows of stride hdp,
 * zero-padding lanes [hd, hdp); prefetches the same bytes of `next`. */
static void load_rows(float *dst, const void *src, int type, int n, int hd, int hdp,
                      const char *next) {
    const int full = hd & ~7;
    const size_t row_bytes = (size_t)hd * (type == QTYPE_F16 ? 2 : 4);
    for (int j = 0; j < n; j++) {
        float *d = dst + (size_t)j * hdp;
        if (type == QTYPE_F16) {
            const uint16_t *s = (const uint16_t *)src + (size_t)j * hd;
            for (int c = 0; c < full; c += 8)
                _mm256_storeu_ps(d + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + c))));
            for (int c = full; c < hd; c++) d[c] = ellm_f16_to_f32(s[c]);
        } else {
            const float *s = (const float *)src + (size_t)j * hd;
            for (int c = 0; c < full; c += 8) _mm256_storeu_ps(d + c, _mm256_loadu_ps(s + c));
            for (int c = full; c < hd; c++) d[c] = s[c];
        }
        for (int c = hd; c < hdp; c++) d[c] = 0.0f;
        if (next)
            for (size_t o = (size_t)j * row_bytes & ~(size_t)63; o < (size_t)(j + 1) * row_bytes;
                 o += 64)
                _mm_prefetch(next + o, _MM_HINT_T0);
    }
}

/* 8 elements of a K or V row from element idx on, F16 (converted) or F32. */
static ALWAYS_INLINE __m256 load8(const void *base, size_t idx, const int F16) {
    if (F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + idx)));
    return _mm256_loadu_ps((const float *)base + idx);
}

/* Elements [idx, idx + n) of a K channel row, n < 8, F16 (converted) or F32;
 * lanes [n, 8) are zero and nothing past idx + n is read. */
static inline __m256 load8_part(const void *base, size_t idx, int n, const int F16) {
    float t[8] = {0};
    for (int i = 0; i < n; i++)
        t[i] = F16 ? ellm_f16_to_f32(((const uint16_t *)base)[idx + i]) : ((const float *)base)[idx + i];
    return _mm256_loadu_ps(t);
}

/* One 16-key tile of scores for NR (<= 3) rows: e0/e1 (o0/o1) accumulate
 * the even (odd) channels of keys [0, 8) and [8, 16). k points at channel 0
 * of the tile's first key, step bytes apart per channel. Per channel pair a
 * prefetch_step_l2 of *pp (PF, pf_lines); *pp moves past what was asked for.
 * A loop per PF with the key pointer stepped keeps it free of branches: with
 * a counted prefetch loop inside, a decode step's score loop ran at the
 * front end's pace instead of the FMA units'. */
static ALWAYS_INLINE void qk_tile16(const float *q, int hdp, const char *k, size_t step, int hd,
                                    __m256 *e0, __m256 *e1, __m256 *o0, __m256 *o1, const int NR,
                                    const int F16, const int PF, const char **pp, int pf_lines) {
    const size_t h = F16 ? 16 : 32; /* bytes of 8 keys */
    const char *p = *pp;
    int d = 0;
    for (; d + 2 <= hd; d += 2, k += 2 * step) {
        p = prefetch_step_l2(p, PF, pf_lines);
        __m256 x0 = load8(k, 0, F16);
        __m256 x1 = load8(k + h, 0, F16);
#pragma GCC unroll 3
        for (int r = 0; r < NR; r++) {
            const __m256 qb = _mm256_broadcast_ss(q + (size_t)r * hdp + d);
            e0[r] = _mm256_fmadd_ps(qb, x0, e0[r]);
            e1[r] = _mm256_fmadd_ps(qb, x1, e1[r]);
        }
        x0 = load8(k + step, 0, F16);
        x1 = load8(k + step + h, 0, F16);
#pragma GCC unroll 3
        for (int r = 0; r < NR; r++) {
            const __m256 qb = _mm256_broadcast_ss(q + (size_t)r * hdp + d + 1);
            o0[r] = _mm256_fmadd_ps(qb, x0, o0[r]);
            o1[r] = _mm256_fmadd_ps(qb, x1, o1[r]);
        }
    }
    if (d < hd) { /* an odd head_dim: the last channel ends the even chain */
        const __m256 x0 = load8(k, 0, F16), x1 = load8(k + h, 0, F16);
#pragma GCC unroll 3
        for (int r = 0; r < NR; r++) {
            const __m256 qb = _mm256_broadcast_ss(q + (size_t)r * hdp + d);
            e0[r] = _mm256_fmadd_ps(qb, x0, e0[r]);
            e1[r] = _mm256_fmadd_ps(qb, x1, e1[r]);
        }
    }
    *pp = p;
}

/* s[r][j] = q[r] . k[j] for NR (<= 3) rows and keys [0, nk), the keys
 * channel-major (channel c of key j at kT[c * ldk + j]): a register holds one
 * channel of 8 keys, so scores accumulate from broadcast q values with no
 * horizontal sum. Every score is two chains of FMAs, over the even channels
 * and over the odd ones, added at the end: twice the independent chains a
 * single one gives (a chain of hd FMAs bound by their latency left half of
 * the FMA units idle at 3 rows). Keys go 16 at a time where they can (each
 * broadcast feeds two FMAs), then 8, then the tail. If pf is not NULL,
 * pf_lines lines of it are prefetched towards L2 per channel pair. */
static ALWAYS_INLINE void qk_rows(const float *q, int hdp, const void *kT, int ldk, int hd,
                                  float *s, int lds, int nk, const int NR, const int F16,
                                  const char *pf, int pf_lines) {
    const size_t step = (size_t)ldk * (F16 ? 2 : 4);
    const char *pp = pf;
    int j = 0;
    for (; j + 16 <= nk; j += 16) {
        __m256 e0[3], e1[3], o0[3], o1[3];
#pragma GCC unroll 3
        for (int r = 0; r < NR; r++) e0[r] = e1[r] = o0[r] = o1[r] = _mm256_setzero_ps();
        const char *k = (const char *)kT + (size_t)j * (F16 ? 2 : 4);
        if (!pf) qk_tile16(q, hdp, k, step, hd, e0, e1, o0, o1, NR, F16, 0, &pp, pf_lines);
        else if (pf_lines == 1) qk_tile16(q, hdp, k, step, hd, e0, e1, o0, o1, NR, F16, 1, &pp, 1);
        else qk_tile16(q, hdp, k, step, hd, e0, e1, o0, o1, NR, F16, 2, &pp, pf_lines);
#pragma GCC unroll 3
        for (int r = 0; r < NR; r++) {
            _mm256_storeu_ps(s + (size_t)r * lds + j, _mm256_add_ps(e0[r], o0[r]));
            _mm256_storeu_ps(s + (size_t)r * lds + j + 8, _mm256_add_ps(e1[r], o1[r]));
        }
    }
    /* The last keys, 8 (or fewer) at a time, with the same two chains per
     * key as above: a key's score is the same FMAs whichever loop takes it,
     * so it does not depend on how many keys the block has for the tile's
     * last row (a batch row gets the bits of a single-token step). */
    for (; j < nk; j += 8) {
        const int n = nk - j < 8 ? nk - j : 8;
        __m256 e0[3], o0[3];
#pragma GCC unroll 3
        for (int r = 0; r < NR; r++) e0[r] = o0[r] = _mm256_setzero_ps();
        for (int d = 0; d < hd; d++) {
            if (pp && !(d & 1))
                for (int i = 0; i < pf_lines; i++, pp += 64) _mm_prefetch(pp, _MM_HINT_T1);
            const __m256 x0 = n == 8 ? load8(kT, (size_t)d * ldk + j, F16)
                                     : load8_part(kT, (size_t)d * ldk + j, n, F16);
#pragma GCC unroll 3
            for (int r = 0; r < NR; r++) {
                const __m256 qb = _mm256_broadcast_ss(q + (size_t)r * hdp + d);
                if (d & 1) o0[r] = _mm256_fmadd_ps(qb, x0, o0[r]);
                else e0[r] = _mm256_fmadd_ps(qb, x0, e0[r]);
            }
        }
#pragma GCC unroll 3
        for (int r = 0; r < NR; r++) {
            const __m256 sc = _mm256_add_ps(e0[r], o0[r]);
            if (n == 8) {
                _mm256_storeu_ps(s + (size_t)r * lds + j, sc);
            } else {
                float t[8];
                _mm256_storeu_ps(t, sc);
                memcpy(s + (size_t)r * lds + j, t, (size_t)n * sizeof(float));
            }
        }
    }
}

/* Rows [r0, rows) in tiles of 3 (the 12 accumulators of qk_rows), then 2 or 1. */
static ALWAYS_INLINE void qk_all(const float *q, int hdp, const void *kT, int ldk, int hd,
                                 float *s, int lds, int r0, int rows, int nk, const int F16,
                                 const char *pf, int pf_lines) {
    int r = r0;
    for (; r + 3 <= rows; r += 3, pf = NULL)
        qk_rows(q + (size_t)r * hdp, hdp, kT, ldk, hd, s + (size_t)r * lds, lds, nk, 3, F16, pf,
                pf_lines);
    const float *qr = q + (size_t)r * hdp;
    float *sr = s + (size_t)r * lds;
    switch (rows - r) {
    case 2: qk_rows(qr, hdp, kT, ldk, hd, sr, lds, nk, 2, F16, pf, pf_lines); break;
    case 1: qk_rows(qr, hdp, kT, ldk, hd, sr, lds, nk, 1, F16, pf, pf_lines); break;
    default: break;
    }
}

/* acc[NR rows][dims d0 .. d0 + 8 NV) += p[row][j] * v[j] over keys [0, nk),
 * NR <= 3: each converted value vector feeds the tile's rows (12
 * independent accumulators at 3 rows x 32 dims), the rows' probabilities
 * broadcast once per key. A prefetch_step_l2 of *pp (PF, pf_lines) per key. */
static ALWAYS_INLINE void pv_tile(float *acc, int hdp, const float *p, int lds, const void *v,
                                  int ldv, int d0, int nk, const int NR, const int NV,
                                  const int F16, const int PF, const char **pp, int pf_lines) {
    const char *pf = *pp;
    __m256 c[3][4];
#pragma GCC unroll 3
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++)
            c[r][i] = _mm256_loadu_ps(acc + (size_t)r * hdp + d0 + 8 * i);
    for (int j = 0; j < nk; j++) {
        pf = prefetch_step_l2(pf, PF, pf_lines);
        __m256 pb[3];
#pragma GCC unroll 3
        for (int r = 0; r < NR; r++) pb[r] = _mm256_broadcast_ss(p + (size_t)r * lds + j);
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) {
            const __m256 x = load8(v, (size_t)j * ldv + d0 + 8 * i, F16);
#pragma GCC unroll 3
            for (int r = 0; r < NR; r++) c[r][i] = _mm256_fmadd_ps(pb[r], x, c[r][i]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++)
            _mm256_storeu_ps(acc + (size_t)r * hdp + d0 + 8 * i, c[r][i]);
    *pp = pf;
}

/* NR rows over dims [0, hd8): 32-dim tiles, then an 8..24-dim tail; the
 * prefetches of pf spread over all of them. */
static ALWAYS_INLINE void pv_tiles(float *acc, int hdp, const float *p, int lds, const void *v,
                                   int ldv, int hd8, int nk, const int NR, const int F16,
                                   const int PF, const char *pf, int pf_lines) {
    int d = 0;
    for (; d + 32 <= hd8; d += 32)
        pv_tile(acc, hdp, p, lds, v, ldv, d, nk, NR, 4, F16, PF, &pf, pf_lines);
    switch ((hd8 - d) / 8) {
    case 3: pv_tile(acc, hdp, p, lds, v, ldv, d, nk, NR, 3, F16, PF, &pf, pf_lines); break;
    case 2: pv_tile(acc, hdp, p, lds, v, ldv, d, nk, NR, 2, F16, PF, &pf, pf_lines); break;
    case 1: pv_tile(acc, hdp, p, lds, v, ldv, d, nk, NR, 1, F16, PF, &pf, pf_lines); break;
    default: break;
    }
}

/* pf_lines lines of pf (if not NULL) per key of each dim tile. */
static ALWAYS_INLINE void pv_rows(float *acc, int hdp, const float *p, int lds, const void *v,
                                  int ldv, int hd8, int nk, const int NR, const int F16,
                                  const char *pf, int pf_lines) {
    if (!pf) pv_tiles(acc, hdp, p, lds, v, ldv, hd8, nk, NR, F16, 0, pf, pf_lines);
    else if (pf_lines == 1) pv_tiles(acc, hdp, p, lds, v, ldv, hd8, nk, NR, F16, 1, pf, 1);
    else pv_tiles(acc, hdp, p, lds, v, ldv, hd8, nk, NR, F16, 2, pf, pf_lines);
}

static ALWAYS_INLINE void pv_all(float *acc, int hdp, const float *p, int lds, const void *v,
                                 int ldv, int hd8, int r0, int rows, int nk, const int F16,
                                 const char *pf, int pf_lines) {
    int r = r0;
    for (; r + 3 <= rows; r += 3, pf = NULL)
        pv_rows(acc + (size_t)r * hdp, hdp, p + (size_t)r * lds, lds, v, ldv, hd8, nk, 3, F16, pf,
                pf_lines);
    if (rows - r == 2)
        pv_rows(acc + (size_t)r * hdp, hdp, p + (size_t)r * lds, lds, v, ldv, hd8, nk, 2, F16, pf,
                pf_lines);
    else if (rows - r == 1)
        pv_rows(acc + (size_t)r * hdp, hdp, p + (size_t)r * lds, lds, v, ldv, hd8, nk, 1, F16, pf,
                pf_lines);
}

static void prefetch_block(const char *k, const char *v, size_t bytes) {
    prefetch_range_l1(k, bytes);
    prefetch_range_l1(v, bytes);
}

/* The block step, specialised by the compiler for a constant head_dim HD (64,
 * 128) or generic (HD 0). */
static ALWAYS_INLINE void block_step(attn_state *st, const attn_block *b, const int HD) {
    const int G = st->group, R = st->rows, hd = HD ? HD : st->head_dim,
              hdp = HD ? HD : st->hdp, lds = st->lds;
    const int r0 = (b->vis0 >= 1 ? 0 : 1 - b->vis0) * G; /* first row that sees a key */
    if (r0 >= R) return;
    int nk = b->vis0 + (R - 1) / G; /* keys the last row sees */
    if (nk > b->n_valid) nk = b->n_valid;
    const int bt = st->block_tokens;

    /* In place when V rows are 8-float aligned, however many rows share the
     * block: every tile of 3 rows converts the F16 keys and values it reads
     * again. Converting them once into F32 scratch for more than 4 rows, and
     * reading that back, was slower at every row count measured
     * (bench_attention_rows -t 2 at 16K, 4 alternated rounds: 2, 3, 4, 9 and
     * 16 query tokens 1.80x, 1.54x, 1.42-1.50x, 1.21x and 1.16x faster in
     * place). Else (an odd head_dim) F32 scratch. */
    const int f16 = b->type == QTYPE_F16;
    const int in_place = hd % 8 == 0;
    /* The block ahead's K (V) lines to prefetch per channel pair of a 16-key
     * group (per key of a dim tile): one with F16 K and V. */
    const size_t half_lines = ((size_t)bt * hd * (f16 ? 2 : 4) + 63) / 64;
    const size_t k_steps = (size_t)((nk + 15) / 16) * (size_t)((hd + 1) / 2);
    const int pf_k = (int)((half_lines + k_steps - 1) / k_steps);
    const int hd8 = in_place ? hd : hdp;
    const size_t v_steps = (size_t)((hd8 + 31) / 32) * (size_t)nk;
    const int pf_v = (int)((half_lines + v_steps - 1) / v_steps);
    if (in_place && b->next_k && !b->ahead_k) /* as in the AVX-512 kernel */
        prefetch_block(b->next_k, b->next_v, (size_t)bt * hd * (f16 ? 2 : 4));
    if (in_place) {
        if (f16) qk_all(st->q, hdp, b->k, bt, hd, st->s, lds, r0, R, nk, 1, b->ahead_k, pf_k);
        else qk_all(st->q, hdp, b->k, bt, hd, st->s, lds, r0, R, nk, 0, b->ahead_k, pf_k);
    } else {
        load_kT(st->kbuf, lds, b->k, b->type, nk, hd, bt, b->next_k);
        qk_all(st->q, hdp, st->kbuf, lds, hd, st->s, lds, r0, R, nk, 0, b->ahead_k, pf_k);
    }
    for (int r = r0; r < R;) {
        /* rows that see all 16 keys of a full block go up to 4 at a time */
        const int n = nk != 16 || b->vis0 + r / G < 16 ? 1 : R - r < 4 ? R - r : 4;
        float alpha[4];
        float *s = st->s + (size_t)r * lds;
        switch (n) {
        case 4: attn_softmax_rows16_avx2(s, lds, 4, st->m + r, st->l + r, alpha); break;
        case 3: attn_softmax_rows16_avx2(s, lds, 3, st->m + r, st->l + r, alpha); break;
        case 2: attn_softmax_rows16_avx2(s, lds, 2, st->m + r, st->l + r, alpha); break;
        default: {
            int nv = b->vis0 + r / G;
            if (nv > nk) nv = nk;
            alpha[0] = attn_softmax_row_avx2(s, nv, nk, &st->m[r], &st->l[r]);
        }
        }
        for (int i = 0; i < n; i++, r++) attn_rescale_avx2(st->acc + (size_t)r * hdp, hdp, alpha[i]);
    }
    if (in_place) {
        if (f16) pv_all(st->acc, hdp, st->s, lds, b->v, hd, hd8, r0, R, nk, 1, b->ahead_v, pf_v);
        else pv_all(st->acc, hdp, st->s, lds, b->v, hd, hd8, r0, R, nk, 0, b->ahead_v, pf_v);
    } else {
        load_rows(st->vbuf, b->v, b->type, nk, hd, hdp, b->next_v);
        pv_all(st->acc, hdp, st->s, lds, st->vbuf, hdp, hd8, r0, R, nk, 0, b->ahead_v, pf_v);
    }
}

void attn_block_avx2(attn_state *st, const attn_block *b) {
    switch (st->head_dim) {
    case 64: block_step(st, b, 64); break;
    case 128: block_step(st, b, 128); break;
    default: block_step(st, b, 0); break;
    }
}

/* Same rounding as ellm_f32_to_f16 (nearest even). */
void attn_f32_to_f16_avx2(const float *src, uint16_t *dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) dst[i] = ellm_f32_to_f16(src[i]);
}
