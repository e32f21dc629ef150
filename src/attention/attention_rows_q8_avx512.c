/* AVX-512 multi-row block kernel for Q8_0 caches (compiled with the AVX-512
 * flags; needs VNNI and VBMI; chosen by the driver for parts of
 * ATTN_ROWS_MIN_Q8 rows or more, see attention_rows.h).
 *
 * A block that every row sees whole (all blocks of a verify pass but the
 * diagonal one), of 16 keys (block_tokens 16) and head_dim 64 or 128, is
 * decoded once for all rows of the part:
 *   K    each quad of channels regrouped into one dword per key, + 128
 *        (vpermb, XOR), HD / 4 registers kept in kbuf; the key scales as F32;
 *   QK   NRK rows per pass over the key quads: one load of a key quad feeds
 *        NRK vpdpbusd, each with the row's 4 query bytes (broadcast);
 *   softmax  the single-row kernel's step (softmax_avx512.h), unchanged;
 *   V    each quad of keys interleaved into one dword per dim (vpermt2b,
 *        q8pv_quad_avx512), 16 x HD bytes kept in vbuf; the value scales
 *        transposed to one row of 16 keys per 32-dim group;
 *   PV   each row's weights quantized (q8pv_weights_avx512's arithmetic,
 *        four (row, group) vectors sharing shuffles and one pack), then NRV rows
 *        per pass over a group's 32 dims: one load of an interleaved value
 *        register feeds NRV vpdpbusd; q8pv_finish_avx512's fma per element.
 * The single-row kernel (attention_q8_avx512.c) redoes the K regrouping and
 * the V interleave for every 4 rows. Per row the arithmetic is the same:
 * the integer sums are exact in any order, and every float operation (the
 * score's per-group fma, the softmax, the weights' quantization, the fma of
 * a tile's integer P*V into acc) takes the same operands in the same order,
 * so the bits are those of attn_block_q8_avx512. Any other block goes to
 * attn_block_q8_avx512. */
#include "attention/attention_q8_impl.h"
#include "attention/attention_rows.h"
#include "core/prefetch.h"

#include "attention/softmax_avx512.h"

#include <immintrin.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Rows per register pass of the scores (2 x NRK accumulators) and of P*V
 * (2 x NRV accumulators, one per 16 dims of a group). */
#define NRK 8
#define NRV 8

/* The block's keys (int8 k[HD][16], then F16 kd[HD / 32][16]) into kq
 * (HD / 4 registers: channels 4i .. 4i + 3 of the 16 keys, one dword per
 * key, each byte + 128) and kdf (HD / 32 rows of 16 F32 scales). This loop
 * and load_v's are unrolled, so q8_pf_spread's bounds are constants: verify
 * passes of 4 and 9 tokens at 16K ran 1.10x and 1.05x faster
 * (bench_attention_rows -t 2 --kv q8_0, ten alternated runs each;
 * bench/SPEC.md). */
static ALWAYS_INLINE void load_k(__m512i *kq, float *kdf, const attn_block *b, const int HD) {
    const int8_t *k = b->k;
    const uint16_t *kd = (const uint16_t *)(k + (size_t)HD * 16);
    const __m512i perm = _mm512_load_si512((const void *)q8k_quad_perm), flip = _mm512_set1_epi8((char)0x80);
    const int lines = (int)((kv_q8_half_bytes(HD, 16) + 63) / 64);
#pragma GCC unroll 32
    for (int i = 0; i < HD / 4; i++) {
        const __m512i x = _mm512_loadu_si512((const void *)(k + (size_t)i * 64));
        _mm512_store_si512((void *)(kq + i), _mm512_xor_si512(_mm512_permutexvar_epi8(perm, x), flip));
        q8_pf_spread(b->ahead_k, i, HD / 4, lines);
    }
    for (int g = 0; g < HD / 32; g++)
        _mm512_store_ps(kdf + 16 * g, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kd + 16 * g))));
}

/* Scores s[r][0 .. 16) of NR rows from r0 (q8_qk_tile's arithmetic: per
 * group, the int32 sum from -qsum, then fma(sum, kd x qd, s) in group order). */
static ALWAYS_INLINE void qk_rows(attn_state *st, int r0, const __m512i *kq, const float *kdf, const int HD,
                                  const int NR) {
    const int ng = HD / 32;
    __m512 sc[NRK];
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) sc[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int g = 0; g < ng; g++) {
        __m512i ia[NRK];
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) ia[r] = _mm512_set1_epi32(-st->qsum[(size_t)(r0 + r) * ng + g]);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            const int i = 8 * g + c;
            const __m512i x = _mm512_load_si512((const void *)(kq + i));
#pragma GCC unroll 8
            for (int r = 0; r < NR; r++) {
                int32_t qw;
                __builtin_memcpy(&qw, st->q8 + (size_t)(r0 + r) * HD + 4 * i, 4);
                ia[r] = _mm512_dpbusd_epi32(ia[r], x, _mm512_set1_epi32(qw));
            }
        }
        const __m512 kdv = _mm512_load_ps(kdf + 16 * g);
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const __m512 scale = _mm512_mul_ps(kdv, _mm512_set1_ps(st->qd[(size_t)(r0 + r) * ng + g]));
            sc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r]), scale, sc[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(st->s + (size_t)(r0 + r) * st->lds, sc[r]);
}

static ALWAYS_INLINE void qk_all(attn_state *st, const __m512i *kq, const float *kdf, const int HD) {
    const int R = st->rows;
    int r = 0;
    for (; r + NRK <= R; r += NRK) qk_rows(st, r, kq, kdf, HD, NRK);
    switch (R - r) {
    case 7: qk_rows(st, r, kq, kdf, HD, 7); break;
    case 6: qk_rows(st, r, kq, kdf, HD, 6); break;
    case 5: qk_rows(st, r, kq, kdf, HD, 5); break;
    case 4: qk_rows(st, r, kq, kdf, HD, 4); break;
    case 3: qk_rows(st, r, kq, kdf, HD, 3); break;
    case 2: qk_rows(st, r, kq, kdf, HD, 2); break;
    case 1: qk_rows(st, r, kq, kdf, HD, 1); break;
    default: break;
    }
}

/* The block's values (int8 v[16][HD], then F16 vd[16][HD / 32]) into vq:
 * register (4 g + qi) * 2 + h holds dims 32 g + 16 h .. + 16 of keys
 * 4 qi .. 4 qi + 3, one dword per dim (q8pv_quad_avx512); and vdt: the value
 * scales as F32, HD / 32 rows of 16 keys (vdt[16 g + j] = vd[j][g]). */
static ALWAYS_INLINE void load_v(__m512i *vq, float *vdt, const attn_block *b, const int HD) {
    const int8_t *v = b->v;
    const uint16_t *vd = (const uint16_t *)(v + (size_t)HD * 16);
    const int lines = (int)((kv_q8_half_bytes(HD, 16) + 63) / 64);
#pragma GCC unroll 4
    for (int qi = 0; qi < 4; qi++) {
#pragma GCC unroll 2
        for (int d0 = 0; d0 < HD; d0 += 64) {
            __m512i x[4];
            q8pv_quad_avx512(v + (size_t)4 * qi * HD, HD, d0, 4, x, 4);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int g = d0 / 32 + i / 2;
                _mm512_store_si512((void *)(vq + (4 * g + qi) * 2 + i % 2), x[i]);
            }
        }
        q8_pf_spread(b->ahead_v, qi, 4, lines);
    }
    /* vd is 16 x ng words, key-major: word j * ng + g goes to g * 16 + j */
    __m512 t[4];
    q8pv_value_scales(vd, HD, t);
    for (int g = 0; g < HD / 32; g++) _mm512_store_ps(vdt + 16 * g, t[g]);
}

/* Four (row, group) weight vectors of a tile -- w[0..3], each the 16 keys'
 * p x vd -- quantized as q8pv_weights_avx512 does one row's, into q[0, 64)
 * (16 u8 per vector, in order) and sc[0..3]. The same operations per
 * element: the maximum over the vector's lanes (exact in any order), its
 * exponent (getexp), the powers of two 2^(7 - e) and 2^(e - 7) (scalef), the
 * product w x 2^(7 - e), rounded to an integer by the current (nearest-even)
 * mode and clamped to 255 as an unsigned number, and q = 0, sc = 0 for a
 * vector whose maximum is below ATTN_Q8_PV_MIN. What changes is how the
 * lanes travel: q8pv_quant4 (attention_q8_impl.h) shares the reduction's
 * shuffles, one exponent computation and one pack among the four vectors,
 * and a vpermd puts them in order for one 64-byte store, where the helper
 * takes two vpmovusdb per row and group. */
static ALWAYS_INLINE void quant4(const __m512 w[4], uint8_t *q, float *sc) {
    __m512 sv;
    const __m512i b = q8pv_quant4(w, &sv);
    /* per 128-bit lane l: dword v holds w[v]'s lanes 4l .. 4l + 3 as bytes; dword 4v + l of the result is dword 4l + v */
    const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_storeu_si512((void *)q, _mm512_permutexvar_epi32(idx, b));
    _mm_storeu_ps(sc, _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), sv)));
}

/* The weights of NR rows from r0 (q8pv_weights_avx512's for each row) into
 * wq (NR x ng x 16 u8) and wsc (NR x ng); with head_dim 64 two rows make
 * four vectors, an odd last row is paired with zeros (written past the NR
 * rows' part of wq and wsc, which have room for NRV rows). */
static ALWAYS_INLINE void weights_rows(const attn_state *st, int r0, const float *vdt, uint8_t *wq, float *wsc,
                                       const int HD, const int NR) {
    if (HD == 64) {
        const __m512 v0 = _mm512_load_ps(vdt), v1 = _mm512_load_ps(vdt + 16);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r += 2) {
            __m512 w[4];
            const __m512 p0 = _mm512_loadu_ps(st->s + (size_t)(r0 + r) * st->lds);
            w[0] = _mm512_mul_ps(p0, v0);
            w[1] = _mm512_mul_ps(p0, v1);
            if (r + 1 < NR) {
                const __m512 p1 = _mm512_loadu_ps(st->s + (size_t)(r0 + r + 1) * st->lds);
                w[2] = _mm512_mul_ps(p1, v0);
                w[3] = _mm512_mul_ps(p1, v1);
            } else {
                w[2] = w[3] = _mm512_setzero_ps();
            }
            quant4(w, wq + (size_t)r * 32, wsc + (size_t)r * 2);
        }
    } else {
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            __m512 w[4];
            const __m512 p = _mm512_loadu_ps(st->s + (size_t)(r0 + r) * st->lds);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) w[g] = _mm512_mul_ps(p, _mm512_load_ps(vdt + 16 * g));
            quant4(w, wq + (size_t)r * 64, wsc + (size_t)r * 4);
        }
    }
}

/* P*V of NR rows from r0 over the block's 16 keys (one tile): each row's
 * weights quantized into wq (NR x ng x 16 u8) and wsc (NR x ng), then per
 * 32-dim group the integer sums of all rows, and acc = fma(sc, (float)sum,
 * acc) as q8pv_finish_avx512 does. */
static ALWAYS_INLINE void pv_rows(attn_state *st, int r0, const __m512i *vq, const float *vdt, uint8_t *wq,
                                  float *wsc, const int HD, const int NR) {
    const int ng = HD / 32;
    weights_rows(st, r0, vdt, wq, wsc, HD, NR);
#pragma GCC unroll 4
    for (int g = 0; g < ng; g++) {
        __m512i ia[NRV][2];
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) ia[r][0] = ia[r][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int qi = 0; qi < 4; qi++) {
            const __m512i x0 = _mm512_load_si512((const void *)(vq + (4 * g + qi) * 2));
            const __m512i x1 = _mm512_load_si512((const void *)(vq + (4 * g + qi) * 2 + 1));
#pragma GCC unroll 8
            for (int r = 0; r < NR; r++) {
                int32_t w;
                __builtin_memcpy(&w, wq + (size_t)r * ng * 16 + 16 * g + 4 * qi, 4);
                const __m512i wb = _mm512_set1_epi32(w);
                ia[r][0] = _mm512_dpbusd_epi32(ia[r][0], wb, x0);
                ia[r][1] = _mm512_dpbusd_epi32(ia[r][1], wb, x1);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            float *a = st->acc + (size_t)(r0 + r) * HD + 32 * g;
            const __m512 s = _mm512_set1_ps(wsc[(size_t)r * ng + g]);
            _mm512_storeu_ps(a, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(ia[r][0]), _mm512_loadu_ps(a)));
            _mm512_storeu_ps(a + 16, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(ia[r][1]), _mm512_loadu_ps(a + 16)));
        }
    }
}

static ALWAYS_INLINE void pv_all(attn_state *st, const __m512i *vq, const float *vdt, uint8_t *wq, float *wsc,
                                 const int HD) {
    const int R = st->rows;
    int r = 0;
    for (; r + NRV <= R; r += NRV) pv_rows(st, r, vq, vdt, wq, wsc, HD, NRV);
    switch (R - r) {
    case 7: pv_rows(st, r, vq, vdt, wq, wsc, HD, 7); break;
    case 6: pv_rows(st, r, vq, vdt, wq, wsc, HD, 6); break;
    case 5: pv_rows(st, r, vq, vdt, wq, wsc, HD, 5); break;
    case 4: pv_rows(st, r, vq, vdt, wq, wsc, HD, 4); break;
    case 3: pv_rows(st, r, vq, vdt, wq, wsc, HD, 3); break;
    case 2: pv_rows(st, r, vq, vdt, wq, wsc, HD, 2); break;
    case 1: pv_rows(st, r, vq, vdt, wq, wsc, HD, 1); break;
    default: break;
    }
}

/* A full block of 16 keys, head_dim HD (64 or 128). Scratch: kbuf holds the
 * key quads (16 HD bytes), then the key scales and the value scales (HD / 32
 * x 16 floats each); vbuf the interleaved values (16 HD bytes), then the
 * weights of NRV rows (NRV x HD / 2 bytes) and their scales (NRV x HD / 32
 * floats). Both are 16 x HD floats, 64-byte aligned. */
static ALWAYS_INLINE void block_full(attn_state *st, const attn_block *b, const int HD) {
    __m512i *kq = (__m512i *)st->kbuf, *vq = (__m512i *)st->vbuf;
    float *kdf = st->kbuf + 4 * HD, *vdt = kdf + HD / 2;
    uint8_t *wq = (uint8_t *)(st->vbuf + 4 * HD);
    float *wsc = st->vbuf + 4 * HD + NRV * HD / 8;
    if (b->next_k && !b->ahead_k) {
        prefetch_range_l1(b->next_k, kv_q8_half_bytes(HD, 16));
        prefetch_range_l1(b->next_v, kv_q8_half_bytes(HD, 16));
    }
    load_k(kq, kdf, b, HD);
    qk_all(st, kq, kdf, HD);
    attn_softmax_block_avx512(st, b, 0, 16, HD, 16);
    load_v(vq, vdt, b, HD);
    pv_all(st, vq, vdt, wq, wsc, HD);
}

void attn_block_rows_q8_avx512(attn_state *st, const attn_block *b) {
    const int full = attn_block_whole16(st, b);
    if (full && st->head_dim == 64 && st->hdp == 64) block_full(st, b, 64);
    else if (full && st->head_dim == 128 && st->hdp == 128) block_full(st, b, 128);
    else attn_block_q8_avx512(st, b);
}
