/* AVX-512 attention block kernel and F32 -> F16 rows (compiled with the
 * AVX-512 flags; only called when ellm_cpu_isa() says the CPU has them).
 *
 * Per block, for the part's query rows:
 *   QK^T  keys are stored channel-major, so a register holds one channel of 16
 *         keys: up to 4 rows x 16 scores accumulate from broadcast q values
 *         with no horizontal sum;
 *   softmax  online, with a vectorized exp; the running max is only reduced
 *         when some score exceeds it;
 *   P*V   tiles of up to 4 rows x 64 dims of FMAs.
 * With few rows (decode, small verification batches) K and V are read straight
 * from the cache, F16 converted in registers (vcvtph2ps), so DRAM traffic is
 * the block once and nothing is written back; with many rows they are first
 * converted once into F32 scratch that stays in L1. The next block is
 * prefetched while this one is computed.
 *
 * Decode (1-4 rows of one KV head) over runs of whole blocks goes through
 * attn_blocks_f16_avx512 instead: the same operations with the part's state
 * in registers for the whole run. */
#include "attention/attention_kernel.h"
#include "core/prefetch.h"
#include "kernels/quant.h"

#include "attention/softmax_avx512.h"

#include <immintrin.h>
#include <math.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))


static ALWAYS_INLINE __mmask16 tail_mask(int n) { return (__mmask16)((1u << n) - 1); }

/* Rows [0, n) of a block (row stride hd, F16 or F32) to F32 rows of stride hdp,
 * zero-padding lanes [hd, hdp). Prefetches the same bytes of `next` (the next
 * block's K or V), spreading prefetches over the conversion. */
static void load_rows(float *dst, const void *src, int type, int n, int hd, int hdp,
                      const char *next) {
    const int full = hd & ~15;
    const __mmask16 tm = tail_mask(hd - full);
    const size_t row_bytes = (size_t)hd * (type == QTYPE_F16 ? 2 : 4);
    for (int j = 0; j < n; j++) {
        float *d = dst + (size_t)j * hdp;
        if (type == QTYPE_F16) {
            const uint16_t *s = (const uint16_t *)src + (size_t)j * hd;
            for (int c = 0; c < full; c += 16)
                _mm512_storeu_ps(d + c,
                                 _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + c))));
            if (full < hd)
                _mm512_storeu_ps(d + full, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tm, s + full)));
        } else {
            const float *s = (const float *)src + (size_t)j * hd;
            for (int c = 0; c < full; c += 16) _mm512_storeu_ps(d + c, _mm512_loadu_ps(s + c));
            if (full < hd) _mm512_storeu_ps(d + full, _mm512_maskz_loadu_ps(tm, s + full));
        }
        if (next)
            for (size_t o = (size_t)j * row_bytes & ~(size_t)63; o < (size_t)(j + 1) * row_bytes;
                 o += 64)
                _mm_prefetch(next + o, _MM_HINT_T0);
    }
}

/* Keys [0, n) of a channel-major block (hd channels of row stride bt, F16 or
 * F32) to F32 channel rows of stride ldd; prefetches the same bytes of `next`. */
static void load_kT(float *dst, int ldd, const void *src, int type, int n, int hd, int bt,
                    const char *next) {
    const size_t row_bytes = (size_t)bt * (type == QTYPE_F16 ? 2 : 4);
    for (int c = 0; c < hd; c++) {
        for (int j = 0; j < n; j += 16) {
            const __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : tail_mask(n - j);
            __m512 x = type == QTYPE_F16
                           ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)src + (size_t)c * bt + j))
                           : _mm512_maskz_loadu_ps(m, (const float *)src + (size_t)c * bt + j);
            _mm512_mask_storeu_ps(dst + (size_t)c * ldd + j, m, x);
        }
        if (next)
            for (size_t o = (size_t)c * row_bytes & ~(size_t)63; o < (size_t)(c + 1) * row_bytes; o += 64)
                _mm_prefetch(next + o, _MM_HINT_T0);
    }
}

/* Mask of the lanes of the 16-dim chunk starting at dim d that are < hd. */
static ALWAYS_INLINE __mmask16 chunk_mask(int hd, int d) {
    return hd - d >= 16 ? (__mmask16)0xffff : tail_mask(hd - d);
}

/* 16 elements of a K or V row from element idx on, F16 (converted) or F32;
 * lanes outside m read nothing and are zero. */
static ALWAYS_INLINE __m512 load16(const void *base, size_t idx, __mmask16 m, const int F16) {
    if (F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)base + idx));
    return _mm512_maskz_loadu_ps(m, (const float *)base + idx);
}

/* s[r][j] = q[r] . k[j] for NR rows and keys [0, nk), the keys channel-major
 * (channel c of key j at kT[c * ldk + j]): a register holds one channel of 16
 * keys, so a row accumulates 16 scores at once from broadcast q values, with
 * no horizontal sum. Two accumulators per row (even and odd channels) halve
 * the FMA dependency chains. Lanes past nk are neither read nor written.
 * If pf is not NULL, pf_lines cache lines of it are prefetched towards L2 per
 * channel pair (the block ahead, spread over the computation). */
/* The channel pairs of one 16-key tile: c0[r] (c1[r]) accumulate the even
 * (odd) channels of row r. k points at channel 0 of the tile's first key, ldk
 * elements apart per channel. PF: 0 no prefetch, 1 one line of pf per pair, 2
 * pf_lines lines per pair (from line *line on). A separate loop per PF, with
 * the key pointer stepped rather than recomputed, keeps the loop free of
 * branches and spills (the q.k loop is a third of a decode step's work). */
static ALWAYS_INLINE void qk_pairs(const float *q, int hdp, const void *k, int ldk, int hd, __mmask16 m,
                                   __m512 *c0, __m512 *c1, const int NR, const int F16, const int PF,
                                   const char *pf, int pf_lines, size_t *line) {
    const size_t step = (size_t)ldk * (F16 ? 2 : 4); /* bytes per channel */
    const char *kp = k;
    const char *pp = pf ? pf + *line * 64 : NULL;
    int d = 0;
#pragma GCC unroll 4
    for (; d + 2 <= hd; d += 2, kp += 2 * step) {
        pp = prefetch_step_l2(pp, PF, pf_lines);
        const __m512 x0 = load16(kp, 0, m, F16);
        const __m512 x1 = load16(kp + step, 0, m, F16);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const float *qr = q + (size_t)r * hdp + d;
            c0[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[0]), x0, c0[r]);
            c1[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[1]), x1, c1[r]);
        }
    }
    if (d < hd) {
        const __m512 x0 = load16(kp, 0, m, F16);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            c0[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)r * hdp + d]), x0, c0[r]);
    }
    if (pf) *line = (size_t)(pp - pf) / 64;
}

/* s[r][j] = q[r] . k[j] for NR rows and keys [0, nk), the keys channel-major
 * (channel c of key j at kT[c * ldk + j]): a register holds one channel of 16
 * keys, so a row accumulates 16 scores at once from broadcast q values, with
 * no horizontal sum. Two accumulators per row (even and odd channels) halve
 * the FMA dependency chains. Lanes past nk are neither read nor written.
 * If pf is not NULL, pf_lines cache lines of it are prefetched towards L2 per
 * channel pair (the block ahead, spread over the computation). */
static ALWAYS_INLINE void qk_rows(const float *q, int hdp, const void *kT, int ldk, int hd,
                                  float *s, int lds, int nk, const int NR, const int F16,
                                  const char *pf, int pf_lines) {
    size_t line = 0;
    for (int j = 0; j < nk; j += 16) {
        /* a whole tile of 16 keys (nk a multiple of 16 where the caller knows
         * it) loads unmasked: vcvtph2ps straight from memory, one uop fewer
         * per channel */
        const __mmask16 m = nk - j >= 16 ? (__mmask16)0xffff : tail_mask(nk - j);
        __m512 c0[4], c1[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) c0[r] = c1[r] = _mm512_setzero_ps();
        const char *k = (const char *)kT + (size_t)j * (F16 ? 2 : 4);
        if (!pf) qk_pairs(q, hdp, k, ldk, hd, m, c0, c1, NR, F16, 0, pf, pf_lines, &line);
        else if (pf_lines == 1) qk_pairs(q, hdp, k, ldk, hd, m, c0, c1, NR, F16, 1, pf, pf_lines, &line);
        else qk_pairs(q, hdp, k, ldk, hd, m, c0, c1, NR, F16, 2, pf, pf_lines, &line);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            _mm512_mask_storeu_ps(s + (size_t)r * lds + j, m, _mm512_add_ps(c0[r], c1[r]));
    }
}

static ALWAYS_INLINE void qk_all(const float *q, int hdp, const void *kT, int ldk, int hd, float *s,
                                 int lds, int r0, int rows, int nk, const int F16,
                                 const char *pf, int pf_lines) {
    int r = r0;
    for (; r + 4 <= rows; r += 4, pf = NULL)
        qk_rows(q + (size_t)r * hdp, hdp, kT, ldk, hd, s + (size_t)r * lds, lds, nk, 4, F16, pf,
                pf_lines);
    const float *qr = q + (size_t)r * hdp;
    float *sr = s + (size_t)r * lds;
    switch (rows - r) {
    case 3: qk_rows(qr, hdp, kT, ldk, hd, sr, lds, nk, 3, F16, pf, pf_lines); break;
    case 2: qk_rows(qr, hdp, kT, ldk, hd, sr, lds, nk, 2, F16, pf, pf_lines); break;
    case 1: qk_rows(qr, hdp, kT, ldk, hd, sr, lds, nk, 1, F16, pf, pf_lines); break;
    default: break;
    }
}

/* acc[NR rows][dims d0 .. d0 + 16 NV) += p[row][j] * v[j] over keys [0, nk). */
static ALWAYS_INLINE void pv_tile(float *acc, int hdp, const float *p, int lds, const void *v,
                                  int ldv, int hd, int d0, int nk, const int NR, const int NV,
                                  const int F16, const char *pf, int pf_lines) {
    __m512 c[4][4];
    __mmask16 m[4];
#pragma GCC unroll 4
    for (int i = 0; i < NV; i++) m[i] = chunk_mask(hd, d0 + 16 * i);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++)
            c[r][i] = _mm512_loadu_ps(acc + (size_t)r * hdp + d0 + 16 * i);
    for (int j = 0; j < nk; j++) {
        __m512 x[4];
        if (pf)
            for (int i = 0; i < pf_lines; i++)
                _mm_prefetch(pf + ((size_t)j * pf_lines + i) * 64, _MM_HINT_T1);
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) x[i] = load16(v, (size_t)j * ldv + d0 + 16 * i, m[i], F16);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m512 pb = _mm512_set1_ps(p[(size_t)r * lds + j]);
#pragma GCC unroll 4
            for (int i = 0; i < NV; i++) c[r][i] = _mm512_fmadd_ps(pb, x[i], c[r][i]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++)
            _mm512_storeu_ps(acc + (size_t)r * hdp + d0 + 16 * i, c[r][i]);
}

/* NR rows over all dims: 64-dim tiles, then a 16..48-dim tail. */
static ALWAYS_INLINE void pv_rows(float *acc, int hdp, const float *p, int lds, const void *v,
                                  int ldv, int hd, int nk, const int NR, const int F16,
                                  const char *pf, int pf_lines) {
    int d = 0;
    for (; d + 64 <= hdp; d += 64, pf = NULL)
        pv_tile(acc, hdp, p, lds, v, ldv, hd, d, nk, NR, 4, F16, pf, pf_lines);
    switch ((hdp - d) / 16) {
    case 3: pv_tile(acc, hdp, p, lds, v, ldv, hd, d, nk, NR, 3, F16, pf, pf_lines); break;
    case 2: pv_tile(acc, hdp, p, lds, v, ldv, hd, d, nk, NR, 2, F16, pf, pf_lines); break;
    case 1: pv_tile(acc, hdp, p, lds, v, ldv, hd, d, nk, NR, 1, F16, pf, pf_lines); break;
    default: break;
    }
}

static ALWAYS_INLINE void pv_all(float *acc, int hdp, const float *p, int lds, const void *v,
                                 int ldv, int hd, int r0, int rows, int nk, const int F16,
                                 const char *pf, int pf_lines) {
    int r = r0;
    for (; r + 4 <= rows; r += 4, pf = NULL)
        pv_rows(acc + (size_t)r * hdp, hdp, p + (size_t)r * lds, lds, v, ldv, hd, nk, 4, F16, pf, pf_lines);
    float *a = acc + (size_t)r * hdp;
    const float *pr = p + (size_t)r * lds;
    switch (rows - r) {
    case 3: pv_rows(a, hdp, pr, lds, v, ldv, hd, nk, 3, F16, pf, pf_lines); break;
    case 2: pv_rows(a, hdp, pr, lds, v, ldv, hd, nk, 2, F16, pf, pf_lines); break;
    case 1: pv_rows(a, hdp, pr, lds, v, ldv, hd, nk, 1, F16, pf, pf_lines); break;
    default: break;
    }
}

static void prefetch_block(const char *k, const char *v, size_t bytes) {
    prefetch_range_l1(k, bytes);
    prefetch_range_l1(v, bytes);
}

/* Rows of a part above which K and V are converted once into F32 scratch
 * instead of on the fly for every group of 4 rows. */
#define FUSE_ROWS 8

/* The block step, specialised by the compiler for a constant head_dim HD (64,
 * 128: loops unrolled, masks constant) or generic (HD 0), and for blocks of
 * NK keys all seen by every row (NK = block_tokens 16: full masks, the
 * prefetch spread below constant) or any (NK 0). */
static ALWAYS_INLINE void block_step(attn_state *st, const attn_block *b, const int HD, const int NK) {
    const int G = st->group, R = st->rows, hd = HD ? HD : st->head_dim,
              hdp = HD ? HD : st->hdp, lds = st->lds;
    const int r0 = (b->vis0 >= 1 ? 0 : 1 - b->vis0) * G; /* first row that sees a key */
    if (r0 >= R) return;
    int nk = b->vis0 + (R - 1) / G; /* keys the last row sees */
    if (nk > b->n_valid) nk = b->n_valid;
    if (NK) nk = NK;
    const int bt = NK ? NK : st->block_tokens;

    /* In place: K and V are read straight from the cache (F16 converted on
     * the fly), so each byte is loaded once per group of 4 rows. Otherwise
     * (many rows) K and V are converted once into L1-resident F32 scratch. */
    const int f16 = b->type == QTYPE_F16;
    const int in_place = !f16 || R - r0 <= FUSE_ROWS;
    const size_t elt = f16 ? 2 : 4;
    /* Lines of the block ahead's K (V) to prefetch per channel pair (per key),
     * so that all of it is asked for over this block's computation. */
    const size_t half_lines = ((size_t)bt * hd * elt + 63) / 64;
    const size_t k_steps = (size_t)((nk + 15) / 16) * (size_t)(hd / 2 > 0 ? hd / 2 : 1);
    const int pf_k = (int)((half_lines + k_steps - 1) / k_steps);
    const int pf_v = (int)((half_lines + (size_t)nk - 1) / (size_t)nk);
    /* In place, the spread prefetch of the block ahead (when given) replaces
     * a burst for the next block: the burst filled the line-fill buffers just
     * when this block's own loads needed them. */
    if (in_place && b->next_k && !b->ahead_k) prefetch_block(b->next_k, b->next_v, (size_t)bt * hd * elt);
    if (in_place) {
        if (f16) qk_all(st->q, hdp, b->k, bt, hd, st->s, lds, r0, R, nk, 1, b->ahead_k, pf_k);
        else qk_all(st->q, hdp, b->k, bt, hd, st->s, lds, r0, R, nk, 0, b->ahead_k, pf_k);
    } else {
        load_kT(st->kbuf, lds, b->k, b->type, nk, hd, bt, b->next_k);
        qk_all(st->q, hdp, st->kbuf, lds, hd, st->s, lds, r0, R, nk, 0, b->ahead_k, pf_k);
    }
    attn_softmax_block_avx512(st, b, r0, nk, hdp, NK);
    if (in_place) {
        if (f16) pv_all(st->acc, hdp, st->s, lds, b->v, hd, hd, r0, R, nk, 1, b->ahead_v, pf_v);
        else pv_all(st->acc, hdp, st->s, lds, b->v, hd, hd, r0, R, nk, 0, b->ahead_v, pf_v);
    } else {
        load_rows(st->vbuf, b->v, b->type, nk, hd, hdp, b->next_v);
        pv_all(st->acc, hdp, st->s, lds, st->vbuf, hdp, hdp, r0, R, nk, 0, b->ahead_v, pf_v);
    }
}

/* Scores of NR rows against two whole 16-key blocks at once, K read in
 * place (F16 converted in registers). Per block and row the accumulators
 * and their order are qk_pairs' (even channels, odd channels, then their
 * sum), so every score has the bits of qk_rows on that block alone; the
 * second block only doubles the independent FMA chains (a single block's
 * 2 x NR chains leave the FMA units waiting on latency). pf0/pf1 (or
 * NULL): the blocks ahead of b0/b1, pf_lines lines of each per channel pair. */
static ALWAYS_INLINE void qk_rows2(const float *q, int hdp, const void *k0, const void *k1, int hd,
                                   float *s0, float *s1, int lds, const int NR, const int F16,
                                   const char *pf0, const char *pf1, int pf_lines) {
    const size_t step = (size_t)16 * (F16 ? 2 : 4); /* bytes per channel of a 16-key block */
    const __mmask16 m = (__mmask16)0xffff;
    __m512 a0[4], a1[4], c0[4], c1[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) a0[r] = a1[r] = c0[r] = c1[r] = _mm512_setzero_ps();
    const char *p0 = k0, *p1 = k1;
    int d = 0;
#pragma GCC unroll 2
    for (; d + 2 <= hd; d += 2, p0 += 2 * step, p1 += 2 * step) {
        if (pf0)
            for (int i = 0; i < pf_lines; i++, pf0 += 64) _mm_prefetch(pf0, _MM_HINT_T1);
        if (pf1)
            for (int i = 0; i < pf_lines; i++, pf1 += 64) _mm_prefetch(pf1, _MM_HINT_T1);
        const __m512 x0 = load16(p0, 0, m, F16), x1 = load16(p0 + step, 0, m, F16);
        const __m512 y0 = load16(p1, 0, m, F16), y1 = load16(p1 + step, 0, m, F16);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const float *qr = q + (size_t)r * hdp + d;
            const __m512 q0 = _mm512_set1_ps(qr[0]), q1 = _mm512_set1_ps(qr[1]);
            a0[r] = _mm512_fmadd_ps(q0, x0, a0[r]);
            a1[r] = _mm512_fmadd_ps(q1, x1, a1[r]);
            c0[r] = _mm512_fmadd_ps(q0, y0, c0[r]);
            c1[r] = _mm512_fmadd_ps(q1, y1, c1[r]);
        }
    }
    if (d < hd) {
        const __m512 x0 = load16(p0, 0, m, F16), y0 = load16(p1, 0, m, F16);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 q0 = _mm512_set1_ps(q[(size_t)r * hdp + d]);
            a0[r] = _mm512_fmadd_ps(q0, x0, a0[r]);
            c0[r] = _mm512_fmadd_ps(q0, y0, c0[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        _mm512_storeu_ps(s0 + (size_t)r * lds, _mm512_add_ps(a0[r], a1[r]));
        _mm512_storeu_ps(s1 + (size_t)r * lds, _mm512_add_ps(c0[r], c1[r]));
    }
}

/* Two whole 16-key blocks, every row seeing all their keys, K and V read in
 * place: both blocks' scores in one pass (qk_rows2), then softmax and P*V
 * of b0, then of b1 -- the operations of block_step(b0), block_step(b1) in
 * the same order, so the state ends with the same bits. The scores of b1
 * wait in kbuf, which the in-place path does not use. */
static ALWAYS_INLINE void pair_step(attn_state *st, const attn_block *b0, const attn_block *b1, const int HD,
                                    const int F16) {
    const int R = st->rows, hdp = HD, lds = st->lds;
    const size_t elt = F16 ? 2 : 4;
    const int half_lines = (int)((16 * (size_t)HD * elt + 63) / 64);
    const int k_steps = HD / 2;
    const int pf_k = (half_lines + k_steps - 1) / k_steps, pf_v = (half_lines + 15) / 16;
    if (b1->next_k && !b1->ahead_k) prefetch_block(b1->next_k, b1->next_v, 16 * (size_t)HD * elt);
    float *s0 = st->s, *s1 = st->kbuf;
    const char *pa = b0->ahead_k, *pb = b1->ahead_k;
    int r = 0;
    for (; r + 4 <= R; r += 4, pa = pb = NULL)
        qk_rows2(st->q + (size_t)r * hdp, hdp, b0->k, b1->k, HD, s0 + (size_t)r * lds, s1 + (size_t)r * lds, lds,
                 4, F16, pa, pb, pf_k);
    const float *qr = st->q + (size_t)r * hdp;
    float *t0 = s0 + (size_t)r * lds, *t1 = s1 + (size_t)r * lds;
    switch (R - r) {
    case 3: qk_rows2(qr, hdp, b0->k, b1->k, HD, t0, t1, lds, 3, F16, pa, pb, pf_k); break;
    case 2: qk_rows2(qr, hdp, b0->k, b1->k, HD, t0, t1, lds, 2, F16, pa, pb, pf_k); break;
    case 1: qk_rows2(qr, hdp, b0->k, b1->k, HD, t0, t1, lds, 1, F16, pa, pb, pf_k); break;
    default: break;
    }
    attn_softmax_block_avx512(st, b0, 0, 16, hdp, 16);
    pv_all(st->acc, hdp, s0, lds, b0->v, HD, HD, 0, R, 16, F16, b0->ahead_v, pf_v);
    st->s = s1;
    attn_softmax_block_avx512(st, b1, 0, 16, hdp, 16);
    st->s = s0;
    pv_all(st->acc, hdp, s1, lds, b1->v, HD, HD, 0, R, 16, F16, b1->ahead_v, pf_v);
}

/* A line of a block ahead, non-temporally (NTA) or towards L2 (see
 * attention_prefetch_nta). */
static ALWAYS_INLINE void prefetch_ahead(const char *p, const int NTA) {
    if (NTA) _mm_prefetch(p, _MM_HINT_NTA);
    else _mm_prefetch(p, _MM_HINT_T1);
}

/* Scores of NR rows against NB (1 or 2) whole 16-key F16 blocks k[0..NB)
 * at once, as qk_pairs computes them for each block (even and odd channel
 * chains, then their sum); a second block only doubles the independent FMA
 * chains. pf[b] (or NULL): the block ahead of k[b], one line of it asked
 * for per channel pair. */
static ALWAYS_INLINE void run_qk(const float *q, const char *const *k, const char *const *pf, __m512 (*sc)[4],
                                 const int HD, const int NR, const int NB, const int NTA) {
    const size_t step = 16 * sizeof(uint16_t); /* bytes per channel of a block's keys */
    __m512 c0[2][4], c1[2][4];
    const char *pp[2] = {pf[0], NB > 1 ? pf[1] : NULL};
#pragma GCC unroll 2
    for (int b = 0; b < NB; b++)
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) c0[b][r] = c1[b][r] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int d = 0; d < HD; d += 2) {
        __m512 x0[2], x1[2];
#pragma GCC unroll 2
        for (int b = 0; b < NB; b++) {
            if (pp[b]) {
                prefetch_ahead(pp[b], NTA);
                pp[b] += 64;
            }
            const char *kp = k[b] + (size_t)d * step;
            x0[b] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)kp));
            x1[b] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kp + step)));
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 q0 = _mm512_set1_ps(q[(size_t)r * HD + d]), q1 = _mm512_set1_ps(q[(size_t)r * HD + d + 1]);
#pragma GCC unroll 2
            for (int b = 0; b < NB; b++) {
                c0[b][r] = _mm512_fmadd_ps(q0, x0[b], c0[b][r]);
                c1[b][r] = _mm512_fmadd_ps(q1, x1[b], c1[b][r]);
            }
        }
    }
#pragma GCC unroll 2
    for (int b = 0; b < NB; b++)
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) sc[b][r] = _mm512_add_ps(c0[b][r], c1[b][r]);
}

/* The softmax step (attn_softmax16_avx512) and P*V of one
 * block for NR rows whose scores are sc, on the state in registers (m, lane
 * sums lv, accumulators acc); P*V broadcasts each probability from a copy
 * on the stack (a load, where vpermps took a slot of the ports the FMAs use:
 * bench_attention_rows -t 2, one token, 7 alternated runs, 16K 7.84 -> 7.63 ms
 * with every run faster, 32K 16.14 -> 15.49). pf (or NULL): the block ahead's
 * V half, spread over the keys. */
static ALWAYS_INLINE void run_softmax_pv(const __m512 *sc, const uint16_t *v, const char *pf, float *m, __m512 *lv,
                                         __m512 (*acc)[8], const int HD, const int NR, const int NTA) {
    const int NV = HD / 16;
    const int pf_v = (16 * HD * 2 / 64 + 15) / 16; /* lines of the V half per key */
    __m512 p[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        float alpha;
        p[r] = attn_softmax16_avx512(sc[r], &m[r], &lv[r], &alpha, 0);
        if (alpha != 1.0f) {
            const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
            for (int i = 0; i < NV; i++) acc[r][i] = _mm512_mul_ps(va, acc[r][i]);
        }
    }
    /* the probabilities through memory: a broadcast load per row and key
     * instead of a permute on the FMA units' ports */
    _Alignas(64) float pm[4][16];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) _mm512_store_ps(pm[r], p[r]);
#pragma GCC unroll 2
    for (int j = 0; j < 16; j++, v += HD) {
        if (pf)
            for (int i = 0; i < pf_v; i++, pf += 64) prefetch_ahead(pf, NTA);
        __m512 x[8];
#pragma GCC unroll 8
        for (int i = 0; i < NV; i++) x[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * i)));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 pb = _mm512_set1_ps(pm[r][j]);
#pragma GCC unroll 8
            for (int i = 0; i < NV; i++) acc[r][i] = _mm512_fmadd_ps(pb, x[i], acc[r][i]);
        }
    }
}

/* A run of whole 16-key F16 blocks for NR rows (a decode step's query heads
 * of one KV head) of HD dims, with the part's state in registers for the
 * whole run: each row's scores, probabilities, lane sums and accumulator
 * stay in zmm registers from the q.k FMAs through the softmax to the P*V
 * FMAs. The operations and their order are block_step's on each block, so
 * the state has the same bits as n calls of attn_block_avx512. Blocks go
 * in pairs whose scores are computed together (twice the FMA chains in
 * flight); an odd last block alone. Eight blocks in L1, one thread, 3 rows
 * of 64 dims: ~295 cycles per block, against ~365 for attn_block2_avx512
 * and ~335 for this kernel one block at a time (the q.k FMA chains of one
 * block wait on latency). At 4 rows of 64 dims the pairs' registers spill
 * and still measured faster: 389-406 against 441-448 cycles.
 * Prefetches of the blocks ahead are non-temporal on AMD: bench_attention at
 * 16K on one thread (Zen 4) read the cache 4-12% faster with them than with
 * prefetches towards L2 (T1) in four alternated rounds; on two threads
 * faster in three rounds of four. On a Xeon non-temporal ones were no better
 * than none and towards L2 was 1.3-1.45x faster (attention_prefetch_nta). */
static ALWAYS_INLINE void run_f16(attn_state *st, const attn_block *bs, int n, const int HD, const int NR,
                                   const int NTA) {
    const int NV = HD / 16;
    __m512 acc[4][8], lv[4];
    float m[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        m[r] = st->m[r];
        lv[r] = _mm512_loadu_ps(st->lv + 16 * r);
#pragma GCC unroll 8
        for (int i = 0; i < NV; i++) acc[r][i] = _mm512_loadu_ps(st->acc + (size_t)r * HD + 16 * i);
    }
    int k = 0;
    for (; k + 2 <= n; k += 2) {
        const char *kb[2] = {bs[k].k, bs[k + 1].k}, *pf[2] = {bs[k].ahead_k, bs[k + 1].ahead_k};
        __m512 sc[2][4];
        run_qk(st->q, kb, pf, sc, HD, NR, 2, NTA);
        run_softmax_pv(sc[0], bs[k].v, bs[k].ahead_v, m, lv, acc, HD, NR, NTA);
        run_softmax_pv(sc[1], bs[k + 1].v, bs[k + 1].ahead_v, m, lv, acc, HD, NR, NTA);
    }
    if (k < n) {
        const char *kb[2] = {bs[k].k, NULL}, *pf[2] = {bs[k].ahead_k, NULL};
        __m512 sc[2][4];
        run_qk(st->q, kb, pf, sc, HD, NR, 1, NTA);
        run_softmax_pv(sc[0], bs[k].v, bs[k].ahead_v, m, lv, acc, HD, NR, NTA);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        st->m[r] = m[r];
        _mm512_storeu_ps(st->lv + 16 * r, lv[r]);
#pragma GCC unroll 8
        for (int i = 0; i < NV; i++) _mm512_storeu_ps(st->acc + (size_t)r * HD + 16 * i, acc[r][i]);
    }
}

/* attn_blocks_f16_avx512 for one prefetch kind; 0 if the shape has no
 * register-resident run. */
static ALWAYS_INLINE int blocks_f16(attn_state *st, const attn_block *b, int n, const int NTA) {
    if (st->head_dim == 64) {
        switch (st->rows) {
        case 1: run_f16(st, b, n, 64, 1, NTA); return 1;
        case 2: run_f16(st, b, n, 64, 2, NTA); return 1;
        case 3: run_f16(st, b, n, 64, 3, NTA); return 1;
        case 4: run_f16(st, b, n, 64, 4, NTA); return 1;
        default: break;
        }
    } else if (st->head_dim == 128) {
        switch (st->rows) {
        case 1: run_f16(st, b, n, 128, 1, NTA); return 1;
        case 2: run_f16(st, b, n, 128, 2, NTA); return 1;
        default: break;
        }
    }
    return 0;
}

void attn_blocks_f16_avx512(attn_state *st, const attn_block *b, int n) {
    if (st->ahead_nta ? blocks_f16(st, b, n, 1) : blocks_f16(st, b, n, 0)) return;
    for (int k = 0; k < n; k++) attn_block_avx512(st, &b[k]);
}

void attn_block2_avx512(attn_state *st, const attn_block *b0, const attn_block *b1) {
    const int f16 = b0->type == QTYPE_F16;
    if (attn_block_whole16(st, b0) && attn_block_whole16(st, b1) && b0->type == b1->type && st->hdp == st->head_dim &&
        (!f16 || st->rows <= FUSE_ROWS) && st->rows * st->lds <= 16 * st->hdp) {
        if (st->head_dim == 64) {
            if (f16) pair_step(st, b0, b1, 64, 1);
            else pair_step(st, b0, b1, 64, 0);
            return;
        }
        if (st->head_dim == 128) {
            if (f16) pair_step(st, b0, b1, 128, 1);
            else pair_step(st, b0, b1, 128, 0);
            return;
        }
    }
    attn_block_avx512(st, b0);
    attn_block_avx512(st, b1);
}

void attn_block_avx512(attn_state *st, const attn_block *b) {
    const int full = attn_block_whole16(st, b);
    switch (st->head_dim) {
    case 64:
        if (full) block_step(st, b, 64, 16);
        else block_step(st, b, 64, 0);
        break;
    case 128:
        if (full) block_step(st, b, 128, 16);
        else block_step(st, b, 128, 0);
        break;
    default: block_step(st, b, 0, 0); break;
    }
}

/* Same rounding as ellm_f32_to_f16 (nearest even). */
void attn_f32_to_f16_avx512(const float *src, uint16_t *dst, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm256_mask_storeu_epi16(dst + i, m,
                                 _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}
