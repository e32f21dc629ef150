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
 *   P*V   integer (attention_q8_impl.h): per row, tile and 32-dim group the
 *         weights p x vd quantized to u8; the int8 values of each quad of
 *         keys interleaved by vpermt2b into one dword per dim (once for all
 *         rows), and vpdpbusd adds 4 keys' products per dim and row.
 * A row's arithmetic does not depend on which rows share its call, so a
 * batched pass gives each row the bits of a single-token one. The block ahead
 * is prefetched spread over the computation, as the F16 kernel does.
 * attn_blocks_q8_avx512 (below) takes a decode step's runs of whole blocks
 * several at a time, with the same bits. */
#include "attention/attention_kernel.h"
#include "attention/attention_q8_impl.h"
#include "core/prefetch.h"

#include "attention/softmax_avx512.h"

#include <immintrin.h>

#define Q8_INLINE static inline __attribute__((always_inline))

Q8_INLINE __mmask16 q8_tail(int n) { return (__mmask16)((1u << n) - 1); }

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
    const __m512i perm = _mm512_load_si512((const void *)q8k_quad_perm);
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

/* Integer P*V (attention_q8_impl.h) of NR rows from r0 over the dims
 * [d0, d0 + 16 NV) for the tile's keys [j0, j0 + n): the values of each
 * quad of keys interleaved once for all rows, one vpdpbusd per row and 16
 * dims, the int32 sums scaled into acc at the end of the tile. */
Q8_INLINE void q8pv_chunk(attn_state *st, int r0, const uint8_t *wq, const float *wsc, const int8_t *vt, int hd,
                          int d0, int n, const int NR, const int NV, const char **pf, int pf_lines) {
    const int ng = hd / 32;
    __m512i ia[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) ia[r][i] = _mm512_setzero_si512();
    for (int qi = 0; 4 * qi < n; qi++) {
        if (*pf)
            for (int i = 0; i < 4 * pf_lines; i++, *pf += 64) _mm_prefetch(*pf, _MM_HINT_T1);
        __m512i x[4];
        q8pv_quad_avx512(vt + (size_t)4 * qi * hd, hd, d0, n - 4 * qi, x, NV);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) q8pv_dot_avx512(ia[r], wq + (size_t)r * ng * 16, d0, qi, x, NV);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) q8pv_finish_avx512(st->acc + (size_t)(r0 + r) * st->hdp, ia[r], wsc + (size_t)r * ng, d0, NV);
}

/* NR rows from r0, keys [j0, j0 + n) of the tile (mask m): each row's
 * weights quantized (q8pv_weights_avx512 into wq, wsc: NR x ng), then P*V
 * over all dims. vdt: ng x 16 value scales of the tile's keys as F32. */
Q8_INLINE void q8pv_rows(attn_state *st, int r0, const float *vdt, uint8_t *wq, float *wsc, const int8_t *v, int hd,
                         int j0, int n, __mmask16 m, const int NR, const char **pf, int pf_lines) {
    const int ng = hd / 32;
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        q8pv_weights_avx512(st->s + (size_t)(r0 + r) * st->lds + j0, m, vdt, ng, wq + (size_t)r * ng * 16,
                            wsc + (size_t)r * ng);
    const int8_t *vt = v + (size_t)j0 * hd;
    int d = 0;
    for (; d + 64 <= hd; d += 64) q8pv_chunk(st, r0, wq, wsc, vt, hd, d, n, NR, 4, pf, pf_lines);
    if (d < hd) q8pv_chunk(st, r0, wq, wsc, vt, hd, d, n, NR, 2, pf, pf_lines); /* hd % 64 == 32 */
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
     * stored (vdf, 16 x ng) in kbuf, the u8 weights (4 x ng x 16) and their
     * scales (4 x ng) of 4 rows in vbuf */
    float *vdt = st->kbuf, *vdf = st->kbuf + 16 * ng, *wsc = st->vbuf;
    uint8_t *wq = (uint8_t *)(st->vbuf + 4 * ng);
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
        for (; r + 4 <= R; r += 4, pfv = NULL) q8pv_rows(st, r, vdt, wq, wsc, v, hd, j0, n, m, 4, &pfv, pf_v);
        switch (R - r) {
        case 3: q8pv_rows(st, r, vdt, wq, wsc, v, hd, j0, n, m, 3, &pfv, pf_v); break;
        case 2: q8pv_rows(st, r, vdt, wq, wsc, v, hd, j0, n, m, 2, &pfv, pf_v); break;
        case 1: q8pv_rows(st, r, vdt, wq, wsc, v, hd, j0, n, m, 1, &pfv, pf_v); break;
        default: break;
        }
    }
}

void attn_block_q8_avx512(attn_state *st, const attn_block *b) {
    const int full = attn_block_whole16(st, b);
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

/* ---- several whole blocks per step (decode: a few rows, 16-key blocks) ----
 *
 * A block's chain of dependent steps -- scores, softmax, the weights'
 * per-tile maximum and rounding, then their integer P*V -- is longer than the
 * out-of-order window reaches past, so block after block ran at its latency.
 * attn_blocks_q8_avx512 runs each phase for all n blocks before the next one
 * (scores of every block, then the softmax block by block, then every
 * block's weights, then P*V), so the blocks' chains overlap. Per row each
 * float operation takes the same operands in the same order as n calls of
 * attn_block_q8_avx512 (the acc rescale of block b's max growth comes right
 * before block b's P*V; an integer sum is exact in any order), so the state
 * has the same bits. The weights of four (row, group) vectors share one
 * reduction and one pack, as the multi-row kernel's quant4; the packed bytes
 * are read where the pack leaves them (dword 4 qi + v: vector v's keys
 * 4 qi .. 4 qi + 3), without a permute. */

#define QN_INLINE static inline __attribute__((always_inline))

/* Scores of NR rows over a whole block (q8_qk_tile's arithmetic) into s
 * (NR x 16); the K half of the block ahead prefetched along. */
QN_INLINE void qn_qk(const attn_state *st, const attn_block *b, float *s, const int HD, const int NR, const int NTA) {
    const int ng = HD / 32, lines = (int)((kv_q8_half_bytes(HD, 16) + 63) / 64);
    const int8_t *k = b->k;
    const uint16_t *kd = (const uint16_t *)(k + (size_t)HD * 16);
    const __m512i perm = _mm512_load_si512((const void *)q8k_quad_perm), flip = _mm512_set1_epi8((char)0x80);
    __m512 sc[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) sc[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int g = 0; g < ng; g++) {
        __m512i ia[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) ia[r] = _mm512_set1_epi32(-st->qsum[(size_t)r * ng + g]);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            const int i = 8 * g + c;
            q8_pf_spread_ahead(b->ahead_k, i, HD / 4, lines, NTA);
            const __m512i x = _mm512_xor_si512(
                _mm512_permutexvar_epi8(perm, _mm512_loadu_si512((const void *)(k + (size_t)i * 64))), flip);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                int32_t qw;
                __builtin_memcpy(&qw, st->q8 + (size_t)r * HD + 4 * i, 4);
                ia[r] = _mm512_dpbusd_epi32(ia[r], x, _mm512_set1_epi32(qw));
            }
        }
        const __m512 kdv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kd + (size_t)g * 16)));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 scale = _mm512_mul_ps(kdv, _mm512_set1_ps(st->qd[(size_t)r * ng + g]));
            sc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r]), scale, sc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(s + 16 * r, sc[r]);
}

/* Four weight vectors (16 keys' p x vd each) quantized by q8pv_quant4: 64
 * bytes into q (dword 4 qi + v: vector v's keys 4 qi .. 4 qi + 3) and the
 * scales into sv (lane 4 v). */
QN_INLINE void qn_quant4(__m512 w0, __m512 w1, __m512 w2, __m512 w3, uint8_t *q, float *sv) {
    const __m512 w[4] = {w0, w1, w2, w3};
    __m512 s;
    _mm512_storeu_si512((void *)q, q8pv_quant4(w, &s));
    _mm512_storeu_ps(sv, s);
}

/* One block's weights from its probabilities s (NR x 16): vector v = r ng + g
 * is row r's p x the values' scales of group g, quantized four at a time
 * into wq (16 bytes per vector) and wsv (4 floats per vector). */
QN_INLINE void qn_weights(const float *s, const attn_block *b, uint8_t *wq, float *wsv, const int HD, const int NR) {
    const int ng = HD / 32, nvec = NR * ng;
    const uint16_t *vd = (const uint16_t *)((const int8_t *)b->v + (size_t)HD * 16); /* 16 x ng words */
    __m512 vdt[4]; /* vdt[g] lane j: vd[j][g] */
    q8pv_value_scales(vd, HD, vdt);
    __m512 w[16];
#pragma GCC unroll 16
    for (int v = 0; v < nvec; v++) w[v] = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * (v / ng)), vdt[v % ng]);
#pragma GCC unroll 4
    for (int v = nvec; v % 4; v++) w[v] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int v = 0; v < nvec; v += 4) qn_quant4(w[v], w[v + 1], w[v + 2], w[v + 3], wq + 16 * v, wsv + 4 * v);
}

/* One block's P*V over dims [d0, d0 + 64) into the NR rows' accumulators
 * (registers): the block's integer sums, then per row acc *= alpha when
 * its max grew at this block (the softmax step's rescale), and
 * acc = fma(scale, (float)sum, acc) (q8pv_finish_avx512). The V half of
 * the block ahead is prefetched along. */
QN_INLINE void qn_pv(__m512 acc[4][4], const attn_block *b, const uint8_t *wq, const float *wsv, const float *alpha,
                     int d0, const int HD, const int NR, const int NTA) {
    const int ng = HD / 32, lines = (int)((kv_q8_half_bytes(HD, 16) + 63) / 64);
    const int8_t *v = b->v;
    __m512i ia[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) ia[r][i] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int qi = 0; qi < 4; qi++) {
        q8_pf_spread_ahead(b->ahead_v, d0 / 16 + qi, HD / 16, lines, NTA);
        __m512i x[4];
        q8pv_quad_avx512(v + (size_t)4 * qi * HD, HD, d0, 4, x, 4);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int vv = r * ng + (d0 + 16 * i) / 32;
                int32_t wd;
                __builtin_memcpy(&wd, wq + 16 * (vv & ~3) + 16 * qi + 4 * (vv & 3), 4);
                ia[r][i] = _mm512_dpbusd_epi32(ia[r][i], _mm512_set1_epi32(wd), x[i]);
            }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        if (alpha[r] != 1.0f) {
            const __m512 va = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) acc[r][i] = _mm512_mul_ps(va, acc[r][i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const int vv = r * ng + (d0 + 16 * i) / 32;
            acc[r][i] = _mm512_fmadd_ps(_mm512_set1_ps(wsv[4 * vv]), _mm512_cvtepi32_ps(ia[r][i]), acc[r][i]);
        }
    }
}

/* n whole blocks, NR rows, head_dim HD (64 or 128). Scratch: kbuf holds the
 * scores (n x NR x 16 floats); vbuf the max-growth factors (n x 4), then the
 * weights' scales (n x 16 x 4 floats) and the weights (n x 16 x 16 bytes). */
QN_INLINE void qn_run(attn_state *st, const attn_block *bs, int n, const int HD, const int NR, const int NTA) {
    const int nvp = (NR * HD / 32 + 3) & ~3; /* vectors per block, padded to fours */
    float *S = st->kbuf, *alpha = st->vbuf, *wsv = alpha + 4 * ATTN_Q8_STEP_BLOCKS;
    uint8_t *wq = (uint8_t *)(wsv + 64 * ATTN_Q8_STEP_BLOCKS);
    const attn_block *last = &bs[n - 1];
    if (last->next_k && !last->ahead_k) {
        prefetch_range_l1(last->next_k, kv_q8_half_bytes(HD, 16));
        prefetch_range_l1(last->next_v, kv_q8_half_bytes(HD, 16));
    }
    for (int b = 0; b < n; b++) qn_qk(st, &bs[b], S + (size_t)b * NR * 16, HD, NR, NTA);
    for (int b = 0; b < n; b++)
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            alpha[4 * b + r] =
                attn_softmax_row_avx512(S + (size_t)(b * NR + r) * 16, 16, 16, &st->m[r], st->lv + 16 * r);
    for (int b = 0; b < n; b++)
        qn_weights(S + (size_t)b * NR * 16, &bs[b], wq + (size_t)b * nvp * 16, wsv + (size_t)b * nvp * 4, HD, NR);
    for (int d0 = 0; d0 < HD; d0 += 64) {
        __m512 acc[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) acc[r][i] = _mm512_loadu_ps(st->acc + (size_t)r * HD + d0 + 16 * i);
        for (int b = 0; b < n; b++)
            qn_pv(acc, &bs[b], wq + (size_t)b * nvp * 16, wsv + (size_t)b * nvp * 4, alpha + 4 * b, d0, HD, NR, NTA);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) _mm512_storeu_ps(st->acc + (size_t)r * HD + d0 + 16 * i, acc[r][i]);
    }
}

/* attn_blocks_q8_avx512 for one prefetch kind. */
QN_INLINE void blocks_q8(attn_state *st, const attn_block *b, int n, const int NTA) {
    if (st->head_dim == 64) {
        switch (st->rows) {
        case 1: qn_run(st, b, n, 64, 1, NTA); break;
        case 2: qn_run(st, b, n, 64, 2, NTA); break;
        case 3: qn_run(st, b, n, 64, 3, NTA); break;
        default: qn_run(st, b, n, 64, 4, NTA); break;
        }
    } else {
        switch (st->rows) {
        case 1: qn_run(st, b, n, 128, 1, NTA); break;
        case 2: qn_run(st, b, n, 128, 2, NTA); break;
        case 3: qn_run(st, b, n, 128, 3, NTA); break;
        default: qn_run(st, b, n, 128, 4, NTA); break;
        }
    }
}

void attn_blocks_q8_avx512(attn_state *st, const attn_block *b, int n) {
    if (st->ahead_nta) blocks_q8(st, b, n, 1);
    else blocks_q8(st, b, n, 0);
}

void attn_q8_pv_avx512(float *acc, const float *p, int nv, const int8_t *v, const uint16_t *vd, int hd) {
    const int ng = hd / 32;
    float vdt[16 * 128], sc[128];
    uint8_t q[16 * 128];
    for (int j0 = 0; j0 < nv; j0 += ATTN_Q8_PV_TILE) {
        const int n = nv - j0 < ATTN_Q8_PV_TILE ? nv - j0 : ATTN_Q8_PV_TILE;
        for (int g = 0; g < ng; g++)
            for (int j = 0; j < 16; j++)
                vdt[g * 16 + j] = j < n ? _cvtsh_ss(vd[(size_t)(j0 + j) * ng + g]) : 0.0f;
        q8pv_weights_avx512(p + j0, q8_tail(n), vdt, ng, q, sc);
        const int8_t *vt = v + (size_t)j0 * hd;
        int d = 0;
        for (; d + 64 <= hd; d += 64) {
            __m512i ia[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                             _mm512_setzero_si512()};
            for (int qi = 0; 4 * qi < n; qi++) {
                __m512i x[4];
                q8pv_quad_avx512(vt + (size_t)4 * qi * hd, hd, d, n - 4 * qi, x, 4);
                q8pv_dot_avx512(ia, q, d, qi, x, 4);
            }
            q8pv_finish_avx512(acc, ia, sc, d, 4);
        }
        if (d < hd) {
            __m512i ia[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                             _mm512_setzero_si512()};
            for (int qi = 0; 4 * qi < n; qi++) {
                __m512i x[4];
                q8pv_quad_avx512(vt + (size_t)4 * qi * hd, hd, d, n - 4 * qi, x, 2);
                q8pv_dot_avx512(ia, q, d, qi, x, 2);
            }
            q8pv_finish_avx512(acc, ia, sc, d, 2);
        }
    }
}
