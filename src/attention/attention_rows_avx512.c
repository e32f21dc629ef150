/* AVX-512 multi-row block kernel for F16/F32 caches (compiled with the
 * AVX-512 flags; chosen by the driver for parts of ATTN_ROWS_MIN rows or
 * more, see attention_rows.h).
 *
 * A block that every row sees whole (all blocks of a verify pass but the
 * diagonal one), of 16 keys (block_tokens 16) and head_dim 64 or 128:
 *   K    converted once to F32 channel rows (kbuf, 16 keys a channel);
 *   QK   6 rows per pass over the channels (4 when two blocks go together):
 *        per channel pair, two key registers feed 12 FMAs, each row keeping
 *        the single-row kernel's two chains (even and odd channels, summed
 *        at the end);
 *   softmax  the single-row kernel's step (attn_softmax16_avx512) on each
 *        row's scores while they are still in registers; the factor that
 *        rescales the row's old acc kept in st->alpha;
 *   V    converted once to F32 rows (vbuf);
 *   PV   6 rows x 64 dims per pass over the keys (24 accumulators), each
 *        row's acc rescaled by its factor first, keys in order, one FMA per
 *        key and element as the single-row kernel does; two blocks in one
 *        pass with the accumulators in registers between them.
 * Per row this is exactly the single-row kernel's arithmetic (attention_avx512.c),
 * so the bits are the same; what changes is that one load of a key or value
 * register now feeds 6 rows' FMAs instead of up to 4, and nothing is
 * converted twice. Any other block goes to attn_block_avx512. */
#include "attention/attention_rows.h"
#include "kernels/quant.h"

#include "attention/softmax_avx512.h"

#include <immintrin.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Rows per register pass: of P*V (24 accumulators for 64 dims) and of the
 * scores of one block. */
#define NRQ 6

/* Row `row`'s softmax step on its scores s of one whole block (its lane
 * sums in st->lv): the probabilities go to sb, the factor for its old acc to
 * alpha[2 row + slot]. */
static ALWAYS_INLINE void row_softmax(attn_state *st, int row, __m512 s, float *sb, int slot) {
    float *lvp = st->lv + 16 * (size_t)row;
    __m512 lv = _mm512_loadu_ps(lvp);
    _mm512_storeu_ps(sb + (size_t)row * st->lds,
                     attn_softmax16_avx512(s, st->m + row, &lv, st->alpha + 2 * (size_t)row + slot, 1));
    _mm512_storeu_ps(lvp, lv);
}

/* One block's scores for rows [r0, r0 + NR), each followed by its online
 * softmax step while the scores are still in registers: kT holds channel c
 * of the 16 keys at kT + 16 c (F32). c0 sums the even channels, c1 the odd
 * ones, in channel order, then s = c0 + c1 (attention_avx512.c's
 * qk_pairs/qk_rows); the probabilities go to the row's scores in st->s, the
 * factor for its old acc to alpha[2 r + slot]. */
static ALWAYS_INLINE void qk16(attn_state *st, int r0, const float *kT, float *sb, int slot, const int HD,
                               const int NR) {
    const float *q = st->q + (size_t)r0 * HD;
    __m512 c0[NRQ], c1[NRQ];
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) c0[r] = c1[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int d = 0; d < HD; d += 2) {
        const __m512 x0 = _mm512_load_ps(kT + 16 * d);
        const __m512 x1 = _mm512_load_ps(kT + 16 * (d + 1));
#pragma GCC unroll 6
        for (int r = 0; r < NR; r++) {
            const float *qr = q + (size_t)r * HD + d;
            c0[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[0]), x0, c0[r]);
            c1[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[1]), x1, c1[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) row_softmax(st, r0 + r, _mm512_add_ps(c0[r], c1[r]), sb, slot);
}

/* acc[r][d0 .. d0 + 64) of rows [r0, r0 + NR): rescaled by the first
 * block's alpha where it is not 1, then += p0[r][j] * v0[j][d0 ..] over its
 * 16 keys in order; with NB = 2 the same again for the second block (p1,
 * v1), the row kept in registers between the two. v0, v1: F32 rows of
 * stride HD. Per element the single-row kernel's operations: the rescale in
 * the softmax step, then one FMA per key. */
static ALWAYS_INLINE void pv16(attn_state *st, int r0, const float *p0, const float *v0, const float *p1,
                               const float *v1, int d0, const int HD, const int NR, const int NB) {
    const int lds = st->lds;
    float *acc = st->acc + (size_t)r0 * HD;
    __m512 c[NRQ][4];
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) c[r][i] = _mm512_loadu_ps(acc + (size_t)r * HD + d0 + 16 * i);
#pragma GCC unroll 2
    for (int b = 0; b < NB; b++) {
        const float *p = (b ? p1 : p0) + (size_t)r0 * lds, *v = b ? v1 : v0;
#pragma GCC unroll 6
        for (int r = 0; r < NR; r++) {
            const float a = st->alpha[2 * (size_t)(r0 + r) + b];
            if (a != 1.0f) {
                const __m512 va = _mm512_set1_ps(a);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) c[r][i] = _mm512_mul_ps(va, c[r][i]);
            }
        }
#pragma GCC unroll 2
        for (int j = 0; j < 16; j++) {
            __m512 x[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) x[i] = _mm512_load_ps(v + (size_t)j * HD + d0 + 16 * i);
#pragma GCC unroll 6
            for (int r = 0; r < NR; r++) {
                const __m512 pb = _mm512_set1_ps(p[(size_t)r * lds + j]);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) c[r][i] = _mm512_fmadd_ps(pb, x[i], c[r][i]);
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) _mm512_storeu_ps(acc + (size_t)r * HD + d0 + 16 * i, c[r][i]);
}

/* All rows [0, R) in passes of NRQ, the last pass taking what is left. */
static ALWAYS_INLINE void qk_all(attn_state *st, const float *kT, const int HD) {
    const int R = st->rows;
    int r = 0;
    for (; r + NRQ <= R; r += NRQ) qk16(st, r, kT, st->s, 0, HD, NRQ);
    switch (R - r) {
    case 5: qk16(st, r, kT, st->s, 0, HD, 5); break;
    case 4: qk16(st, r, kT, st->s, 0, HD, 4); break;
    case 3: qk16(st, r, kT, st->s, 0, HD, 3); break;
    case 2: qk16(st, r, kT, st->s, 0, HD, 2); break;
    case 1: qk16(st, r, kT, st->s, 0, HD, 1); break;
    default: break;
    }
}

/* P*V of every row for one block (NB = 1: p0, v0) or two (NB = 2). */
static ALWAYS_INLINE void pv_all(attn_state *st, const float *p0, const float *v0, const float *p1, const float *v1,
                                 const int HD, const int NB) {
    const int R = st->rows;
    for (int d0 = 0; d0 < HD; d0 += 64) {
        int r = 0;
        for (; r + NRQ <= R; r += NRQ) pv16(st, r, p0, v0, p1, v1, d0, HD, NRQ, NB);
        switch (R - r) {
        case 5: pv16(st, r, p0, v0, p1, v1, d0, HD, 5, NB); break;
        case 4: pv16(st, r, p0, v0, p1, v1, d0, HD, 4, NB); break;
        case 3: pv16(st, r, p0, v0, p1, v1, d0, HD, 3, NB); break;
        case 2: pv16(st, r, p0, v0, p1, v1, d0, HD, 2, NB); break;
        case 1: pv16(st, r, p0, v0, p1, v1, d0, HD, 1, NB); break;
        default: break;
        }
    }
}

/* Lines of `pf` (the block DENSE/SPARSE ahead's K or V half, `lines` of them)
 * prefetched towards L2 as channel or key i of `n` is converted. */
static ALWAYS_INLINE void pf_spread(const char *pf, int i, int n, int lines) {
    if (!pf) return;
    for (int l = i * lines / n; l < (i + 1) * lines / n; l++) _mm_prefetch(pf + (size_t)l * 64, _MM_HINT_T1);
}

/* A block's K (channel-major in the cache: HD rows of 16 keys) into kT, 16
 * floats a channel, and its V (token-major: 16 rows of HD) into vb. Both
 * loops unrolled, so pf_spread's bounds are constants: verify passes of 4
 * and 9 tokens at 16K ran 1.04x faster (bench_attention_rows -t 2, F16, six
 * alternated runs each; bench/SPEC.md), prefill at 2K ~1%; the object file
 * grows from 88 to 134 KB. */
static ALWAYS_INLINE void load_k(float *kT, const attn_block *b, const int HD, const int F16) {
    const int lines = (16 * HD * (F16 ? 2 : 4) + 63) / 64;
#pragma GCC unroll 64
    for (int c = 0; c < HD; c++) {
        const __m512 x = F16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)b->k + 16 * c)))
                             : _mm512_loadu_ps((const float *)b->k + 16 * c);
        _mm512_store_ps(kT + 16 * c, x);
        pf_spread(b->ahead_k, c, HD, lines);
    }
}

static ALWAYS_INLINE void load_v(float *vb, const attn_block *b, const int HD, const int F16) {
    const int lines = (16 * HD * (F16 ? 2 : 4) + 63) / 64;
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
#pragma GCC unroll 8
        for (int d = 0; d < HD; d += 16) {
            const __m512 x = F16 ? _mm512_cvtph_ps(
                                       _mm256_loadu_si256((const __m256i *)((const uint16_t *)b->v + (size_t)j * HD + d)))
                                 : _mm512_loadu_ps((const float *)b->v + (size_t)j * HD + d);
            _mm512_store_ps(vb + (size_t)j * HD + d, x);
        }
        pf_spread(b->ahead_v, j, 16, lines);
    }
}

/* A full block of 16 keys, head_dim HD (64 or 128), F16 or F32 (F16 const). */
static ALWAYS_INLINE void block_full(attn_state *st, const attn_block *b, const int HD, const int F16) {
    load_k(st->kbuf, b, HD, F16);
    qk_all(st, st->kbuf, HD);
    load_v(st->vbuf, b, HD, F16);
    pv_all(st, st->s, st->vbuf, NULL, NULL, HD, 1);
}

/* The scores of two blocks in one pass over the channels for rows [r0, r0 +
 * NR): kT0's keys then kT1's, each broadcast query value feeding one FMA
 * per block, the same chains per score as qk16; then each row's softmax
 * step for the first block and for the second (probabilities into s0 and
 * s1, factors into alpha[2 r] and alpha[2 r + 1]). */
static ALWAYS_INLINE void qk32(attn_state *st, int r0, const float *kT0, const float *kT1, float *s0, float *s1,
                               const int HD, const int NR) {
    const float *q = st->q + (size_t)r0 * HD;
    __m512 a0[NRQ], a1[NRQ], b0[NRQ], b1[NRQ];
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) a0[r] = a1[r] = b0[r] = b1[r] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int d = 0; d < HD; d += 2) {
        const __m512 x0 = _mm512_load_ps(kT0 + 16 * d), x1 = _mm512_load_ps(kT0 + 16 * (d + 1));
        const __m512 y0 = _mm512_load_ps(kT1 + 16 * d), y1 = _mm512_load_ps(kT1 + 16 * (d + 1));
#pragma GCC unroll 6
        for (int r = 0; r < NR; r++) {
            const float *qr = q + (size_t)r * HD + d;
            const __m512 e = _mm512_set1_ps(qr[0]), o = _mm512_set1_ps(qr[1]);
            a0[r] = _mm512_fmadd_ps(e, x0, a0[r]);
            b0[r] = _mm512_fmadd_ps(e, y0, b0[r]);
            a1[r] = _mm512_fmadd_ps(o, x1, a1[r]);
            b1[r] = _mm512_fmadd_ps(o, y1, b1[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) {
        row_softmax(st, r0 + r, _mm512_add_ps(a0[r], a1[r]), s0, 0);
        row_softmax(st, r0 + r, _mm512_add_ps(b0[r], b1[r]), s1, 1);
    }
}

/* NRQ = 6 rows need 24 accumulators and 4 key registers: 4 rows a pass here
 * keep the compiler clear of spills (16 + 4 + 2 broadcasts). */
#define NRP 4

static ALWAYS_INLINE void qk32_all(attn_state *st, const float *kT0, const float *kT1, float *s1, const int HD) {
    const int R = st->rows;
    int r = 0;
    for (; r + NRP <= R; r += NRP) qk32(st, r, kT0, kT1, st->s, s1, HD, NRP);
    switch (R - r) {
    case 3: qk32(st, r, kT0, kT1, st->s, s1, HD, 3); break;
    case 2: qk32(st, r, kT0, kT1, st->s, s1, HD, 2); break;
    case 1: qk32(st, r, kT0, kT1, st->s, s1, HD, 1); break;
    default: break;
    }
}

/* Two full blocks: K of b0 into kbuf and of b1 into vbuf; the scores and
 * softmax steps of both (b1's probabilities into the q8 scratch, which
 * F16/F32 caches do not use: the segment's head has round4(rows) x hdp / 4
 * >= rows x 16 floats of it for hdp >= 64); then V of b0 into kbuf and of b1
 * into vbuf and P*V of both, each row's acc rescaled for b0, summed over
 * b0's keys, rescaled for b1 and summed over b1's: per row the operations
 * of two single-block steps, in their order. */
static ALWAYS_INLINE void pair_full(attn_state *st, const attn_block *b0, const attn_block *b1, const int HD,
                                    const int F16) {
    float *s1 = (float *)st->q8;
    load_k(st->kbuf, b0, HD, F16);
    load_k(st->vbuf, b1, HD, F16);
    qk32_all(st, st->kbuf, st->vbuf, s1, HD);
    load_v(st->kbuf, b0, HD, F16);
    load_v(st->vbuf, b1, HD, F16);
    pv_all(st, st->s, st->kbuf, s1, st->vbuf, HD, 2);
}

void attn_block2_rows_avx512(attn_state *st, const attn_block *b0, const attn_block *b1) {
    if (attn_block_whole16(st, b0) && attn_block_whole16(st, b1) && b0->type == b1->type && st->head_dim == st->hdp &&
        (st->head_dim == 64 || st->head_dim == 128)) {
        const int f16 = b0->type == QTYPE_F16;
        if (st->head_dim == 64) {
            if (f16) pair_full(st, b0, b1, 64, 1);
            else pair_full(st, b0, b1, 64, 0);
        } else {
            if (f16) pair_full(st, b0, b1, 128, 1);
            else pair_full(st, b0, b1, 128, 0);
        }
        return;
    }
    attn_block_rows_avx512(st, b0);
    attn_block_rows_avx512(st, b1);
}

void attn_block_rows_avx512(attn_state *st, const attn_block *b) {
    const int full = attn_block_whole16(st, b);
    /* kbuf and vbuf are 64-byte aligned with rows of hdp floats (a multiple of 16) */
    if (full && st->head_dim == 64 && st->hdp == 64) {
        if (b->type == QTYPE_F16) block_full(st, b, 64, 1);
        else block_full(st, b, 64, 0);
    } else if (full && st->head_dim == 128 && st->hdp == 128) {
        if (b->type == QTYPE_F16) block_full(st, b, 128, 1);
        else block_full(st, b, 128, 0);
    } else {
        attn_block_avx512(st, b);
    }
}
