/* AVX-512 attention block kernel and F32 -> F16 rows (compiled with the
 * AVX-512 flags; only called when ellm_cpu_isa() says the CPU has them).
 *
 * Per block: keys and values are converted once to F32 scratch (vcvtph2ps)
 * while the next block is prefetched; QK^T is a register-tiled 4 rows x 4 keys
 * micro-kernel with a transposing horizontal reduction; softmax uses a
 * vectorized exp; P*V is a 4 rows x 64 dims FMA tile. Scratch stays in L1/L2,
 * so DRAM traffic is exactly the block's K and V once per part. */
#include "attention/attention_internal.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <math.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* e^x for x <= 0 (Cephes polynomial, ~1 ulp); underflows to 0 below ~-104. */
static ALWAYS_INLINE __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

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

/* Per 128-bit lane L: [sum_L(a), sum_L(b), sum_L(c), sum_L(d)]. */
static ALWAYS_INLINE __m512 hsum4x4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));
}

/* Combines four hsum4x4 results: lane 4k + i = full sum of input i of z_k. */
static ALWAYS_INLINE __m512 hsum16(__m512 z0, __m512 z1, __m512 z2, __m512 z3) {
    __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(z2, z3, _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(z2, z3, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* s[r][j] = q[r] . k[j] for rows [r_begin, rows) in groups of 4 (pad rows of q
 * are zero) and keys [0, nk) in groups of 4 (k has that many rows). */
static void qk(const float *q, const float *k, int ldk, float *s, int lds, int r_begin, int rows,
               int nk, int hdp) {
    for (int r = r_begin; r < rows; r += 4) {
        const float *q0 = q + (size_t)r * hdp, *q1 = q0 + hdp, *q2 = q1 + hdp, *q3 = q2 + hdp;
        for (int j = 0; j < nk; j += 4) {
            const float *k0 = k + (size_t)j * ldk, *k1 = k0 + ldk, *k2 = k1 + ldk, *k3 = k2 + ldk;
            __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
            __m512 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
            __m512 c20 = c00, c21 = c00, c22 = c00, c23 = c00;
            __m512 c30 = c00, c31 = c00, c32 = c00, c33 = c00;
            for (int d = 0; d < hdp; d += 16) {
                __m512 x0 = _mm512_loadu_ps(k0 + d), x1 = _mm512_loadu_ps(k1 + d);
                __m512 x2 = _mm512_loadu_ps(k2 + d), x3 = _mm512_loadu_ps(k3 + d);
                __m512 y = _mm512_loadu_ps(q0 + d);
                c00 = _mm512_fmadd_ps(y, x0, c00);
                c01 = _mm512_fmadd_ps(y, x1, c01);
                c02 = _mm512_fmadd_ps(y, x2, c02);
                c03 = _mm512_fmadd_ps(y, x3, c03);
                y = _mm512_loadu_ps(q1 + d);
                c10 = _mm512_fmadd_ps(y, x0, c10);
                c11 = _mm512_fmadd_ps(y, x1, c11);
                c12 = _mm512_fmadd_ps(y, x2, c12);
                c13 = _mm512_fmadd_ps(y, x3, c13);
                y = _mm512_loadu_ps(q2 + d);
                c20 = _mm512_fmadd_ps(y, x0, c20);
                c21 = _mm512_fmadd_ps(y, x1, c21);
                c22 = _mm512_fmadd_ps(y, x2, c22);
                c23 = _mm512_fmadd_ps(y, x3, c23);
                y = _mm512_loadu_ps(q3 + d);
                c30 = _mm512_fmadd_ps(y, x0, c30);
                c31 = _mm512_fmadd_ps(y, x1, c31);
                c32 = _mm512_fmadd_ps(y, x2, c32);
                c33 = _mm512_fmadd_ps(y, x3, c33);
            }
            __m512 sum = hsum16(hsum4x4(c00, c01, c02, c03), hsum4x4(c10, c11, c12, c13),
                                hsum4x4(c20, c21, c22, c23), hsum4x4(c30, c31, c32, c33));
            float *srow = s + (size_t)r * lds + j;
            _mm_storeu_ps(srow, _mm512_castps512_ps128(sum));
            _mm_storeu_ps(srow + lds, _mm512_extractf32x4_ps(sum, 1));
            _mm_storeu_ps(srow + 2 * lds, _mm512_extractf32x4_ps(sum, 2));
            _mm_storeu_ps(srow + 3 * lds, _mm512_extractf32x4_ps(sum, 3));
        }
    }
}

/* acc[NR rows][NV * 16 dims] += p[row][j] * v[j] over keys [0, nk). */
static ALWAYS_INLINE void pv_tile(float *acc, int hdp, const float *p, int lds, const float *v,
                                  int nk, const int NR, const int NV) {
    __m512 c[4][4];
    #pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 4
        for (int i = 0; i < NV; i++) c[r][i] = _mm512_loadu_ps(acc + (size_t)r * hdp + 16 * i);
    for (int j = 0; j < nk; j++) {
        __m512 x[4];
        #pragma GCC unroll 4
        for (int i = 0; i < NV; i++) x[i] = _mm512_loadu_ps(v + (size_t)j * hdp + 16 * i);
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
        for (int i = 0; i < NV; i++) _mm512_storeu_ps(acc + (size_t)r * hdp + 16 * i, c[r][i]);
}

static ALWAYS_INLINE void pv_rows(float *acc, int hdp, const float *p, int lds, const float *v,
                                  int nk, const int NR) {
    int d = 0;
    for (; d + 64 <= hdp; d += 64) pv_tile(acc + d, hdp, p, lds, v + d, nk, NR, 4);
    switch ((hdp - d) / 16) {
    case 3: pv_tile(acc + d, hdp, p, lds, v + d, nk, NR, 3); break;
    case 2: pv_tile(acc + d, hdp, p, lds, v + d, nk, NR, 2); break;
    case 1: pv_tile(acc + d, hdp, p, lds, v + d, nk, NR, 1); break;
    default: break;
    }
}

static void pv(float *acc, int hdp, const float *p, int lds, const float *v, int r0, int rows,
               int nk) {
    int r = r0;
    for (; r + 4 <= rows; r += 4)
        pv_rows(acc + (size_t)r * hdp, hdp, p + (size_t)r * lds, lds, v, nk, 4);
    float *a = acc + (size_t)r * hdp;
    const float *pr = p + (size_t)r * lds;
    switch (rows - r) {
    case 3: pv_rows(a, hdp, pr, lds, v, nk, 3); break;
    case 2: pv_rows(a, hdp, pr, lds, v, nk, 2); break;
    case 1: pv_rows(a, hdp, pr, lds, v, nk, 1); break;
    default: break;
    }
}

/* Online-softmax step for one row: s[0, nv) scores become probabilities
 * exp(s - m_new), s[nv, nk) become 0 (keys this row must not see); returns
 * the factor exp(m_old - m_new) that rescales the row's old acc and l. */
static float softmax_row(float *s, int nv, int nk, float *m, float *l) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 16 <= nv; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + j));
    const __mmask16 tm = tail_mask(nv - j);
    if (j < nv) vm = _mm512_mask_max_ps(vm, tm, vm, _mm512_maskz_loadu_ps(tm, s + j));
    float mx = _mm512_reduce_max_ps(vm);
    float m_new = mx > *m ? mx : *m;
    float alpha = m_new == *m ? 1.0f : expf(*m - m_new);
    const __m512 mn = _mm512_set1_ps(m_new);
    __m512 vs = _mm512_setzero_ps();
    for (j = 0; j + 16 <= nv; j += 16) {
        __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), mn));
        _mm512_storeu_ps(s + j, e);
        vs = _mm512_add_ps(vs, e);
    }
    if (j < nv) {
        __m512 e = _mm512_maskz_mov_ps(tm, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, s + j), mn)));
        _mm512_mask_storeu_ps(s + j, tm, e);
        vs = _mm512_add_ps(vs, e);
    }
    for (j = nv; j < nk; j++) s[j] = 0.0f;
    *m = m_new;
    *l = *l * alpha + _mm512_reduce_add_ps(vs);
    return alpha;
}

void attn_block_avx512(attn_state *st, const attn_block *b) {
    const int G = st->group, R = st->rows, hdp = st->hdp, lds = st->lds;
    const int r0 = (b->vis0 >= 1 ? 0 : 1 - b->vis0) * G; /* first row that sees a key */
    if (r0 >= R) return;
    int nk = b->vis0 + (R - 1) / G; /* keys the last row sees */
    if (nk > b->n_valid) nk = b->n_valid;
    const int nk4 = (nk + 3) & ~3;

    /* F32 blocks with 16-aligned rows are used in place; the 4-key tiles may
     * read up to 3 rows past nk, still inside the block. */
    const int direct = b->type == QTYPE_F32 && st->head_dim == hdp && st->block_tokens % 4 == 0;
    const float *K = b->k, *V = b->v;
    if (!direct) {
        load_rows(st->kbuf, b->k, b->type, nk, st->head_dim, hdp, b->next_k);
        K = st->kbuf;
    }
    qk(st->q, K, hdp, st->s, lds, r0 & ~3, R, nk4, hdp);
    for (int r = r0; r < R; r++) {
        int nv = b->vis0 + r / G;
        if (nv > nk) nv = nk;
        float alpha = softmax_row(st->s + (size_t)r * lds, nv, nk, &st->m[r], &st->l[r]);
        if (alpha != 1.0f) {
            float *acc = st->acc + (size_t)r * hdp;
            const __m512 va = _mm512_set1_ps(alpha);
            for (int d = 0; d < hdp; d += 16)
                _mm512_storeu_ps(acc + d, _mm512_mul_ps(va, _mm512_loadu_ps(acc + d)));
        }
    }
    if (!direct) {
        load_rows(st->vbuf, b->v, b->type, nk, st->head_dim, hdp, b->next_v);
        V = st->vbuf;
    } else if (b->next_k) {
        /* Prefetch the next block: in place there is no conversion loop to hide it in. */
        size_t bytes = (size_t)st->block_tokens * (size_t)hdp * 4;
        for (size_t o = 0; o < bytes; o += 64) {
            _mm_prefetch(b->next_k + o, _MM_HINT_T0);
            _mm_prefetch(b->next_v + o, _MM_HINT_T0);
        }
    }
    pv(st->acc, hdp, st->s, lds, V, r0, R, nk);
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
