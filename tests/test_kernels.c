/* Kernel tests: type table, quantize/dequantize round trips, hand-built
 * blocks that pin down the ggml layouts, and every kernel at every ISA this
 * CPU runs compared with its scalar reference on random data. */
#include "harness.h"

#include "core/cpu.h"
#include "core/fp16.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_uniform(void) { return (float)((rng_next() >> 40) * (1.0 / 16777216.0)); } /* [0, 1) */

static float rng_gauss(void) {
    float u = rng_uniform() + 1e-7f, v = rng_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static void fill_gauss(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss() * scale;
}

static void fill_bytes(void *p, size_t n) {
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rng_next();
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static const int k_types[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16, QTYPE_Q8_0, QTYPE_Q4_0,   QTYPE_Q4_1,
                              QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K,   QTYPE_Q5_K,
                              QTYPE_Q6_K, QTYPE_IQ4_NL, QTYPE_IQ4_XS, QTYPE_INT4_G128};
enum { N_TYPES = sizeof k_types / sizeof k_types[0] };
/* The blocks of 32 (q32_value): one arithmetic, with per-row and batch
 * kernels on every ISA. */
static const int k_q32_types[] = {QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q5_0, QTYPE_Q4_1, QTYPE_Q5_1, QTYPE_IQ4_NL};
enum { N_Q32_TYPES = sizeof k_q32_types / sizeof k_q32_types[0] };

static int is_quant(int t) { return qtype_get(t)->block_elems > 1; }

/* Byte offsets in a block of its f16 scale d and of its second f16 field
 * (the minimum's scale dmin, or the offset m; -1 for none). */
static void scale_fields(int type, int *d_off, int *m_off) {
    *d_off = 0;
    *m_off = -1;
    switch (type) {
    case QTYPE_Q4_K:
    case QTYPE_Q5_K:
    case QTYPE_Q4_1:
    case QTYPE_Q5_1:
    case QTYPE_INT4_G128: *m_off = 2; break;
    case QTYPE_Q6_K: *d_off = 208; break;
    case QTYPE_Q3_K: *d_off = 108; break;
    case QTYPE_Q2_K:
        *d_off = 80;
        *m_off = 82;
        break;
    default: break; /* Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS */
    }
}

/* Sets every f16 scale field of a quantized row to a power of two so that all
 * products in a matmul are exact (see test_matmul_exact). */
static void set_pow2_scales(int type, void *row, int64_t cols) {
    const qtype_info *ti = qtype_get(type);
    int64_t nblk = cols / ti->block_elems;
    int d_off, m_off;
    scale_fields(type, &d_off, &m_off);
    for (int64_t k = 0; k < nblk; k++) {
        uint8_t *b = (uint8_t *)row + k * ti->block_bytes;
        ellm_f16 d = ellm_f32_to_f16(0.0625f), dmin = ellm_f32_to_f16(0.015625f);
        memcpy(b + d_off, &d, 2);
        if (m_off >= 0) memcpy(b + m_off, &dmin, 2);
    }
}

/* Random weights: random bytes (every bit pattern of the quants and
 * sub-scales) with sane f16 super-scales for quantized types; quantized
 * Gaussians for float types. */
static void make_weights(int type, void *W, int64_t rows, int64_t cols) {
    size_t rb = qtype_row_bytes(type, cols);
    if (!is_quant(type)) {
        float *tmp = xmalloc((size_t)cols * sizeof(float));
        for (int64_t r = 0; r < rows; r++) {
            fill_gauss(tmp, cols, 0.5f);
            qtype_quantize_ref(type, tmp, (char *)W + r * rb, cols);
        }
        free(tmp);
        return;
    }
    fill_bytes(W, rb * (size_t)rows);
    const qtype_info *ti = qtype_get(type);
    int d_off, m_off;
    scale_fields(type, &d_off, &m_off);
    const int offset = type == QTYPE_INT4_G128 || type == QTYPE_Q4_1 || type == QTYPE_Q5_1; /* m, not dmin */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols / ti->block_elems; k++) {
            uint8_t *b = (uint8_t *)W + r * rb + k * ti->block_bytes;
            ellm_f16 d = ellm_f32_to_f16(0.001f + 0.01f * rng_uniform());
            ellm_f16 dmin = ellm_f32_to_f16(0.001f + 0.01f * rng_uniform());
            if (offset) /* a negative offset, as for a centred group */
                dmin = ellm_f32_to_f16(-7.5f * ellm_f16_to_f32(d) * (0.8f + 0.4f * rng_uniform()));
            memcpy(b + d_off, &d, 2);
            if (m_off >= 0) memcpy(b + m_off, &dmin, 2);
        }
}

/* ---- type table ---- */

static void test_type_table(void) {
    struct {
        int type, elems, bytes, supported;
    } want[] = {
        {QTYPE_F32, 1, 4, 1},     {QTYPE_F16, 1, 2, 1},      {QTYPE_BF16, 1, 2, 1},
        {QTYPE_Q4_0, 32, 18, 1},  {QTYPE_Q8_0, 32, 34, 1},   {QTYPE_Q4_K, 256, 144, 1},
        {QTYPE_Q6_K, 256, 210, 1}, {QTYPE_Q8_K, 256, 292, 0}, {QTYPE_Q4_1, 32, 20, 1},
        {QTYPE_Q5_0, 32, 22, 1},  {QTYPE_Q5_1, 32, 24, 1},   {QTYPE_Q2_K, 256, 84, 1},
        {QTYPE_Q3_K, 256, 110, 1}, {QTYPE_Q5_K, 256, 176, 1}, {QTYPE_INT4_G128, 128, 68, 1},
        {QTYPE_IQ4_NL, 32, 18, 1}, {QTYPE_IQ4_XS, 256, 136, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const qtype_info *t = qtype_get(want[i].type);
        CHECK(t != NULL, "type %d", want[i].type);
        if (!t) continue;
        CHECK(t->block_elems == want[i].elems && t->block_bytes == want[i].bytes &&
                  t->supported == want[i].supported,
              "type %s: %d elems %d bytes supported %d", t->name, t->block_elems, t->block_bytes,
              t->supported);
    }
    int unknown[] = {-1, 4, 5, 31, 40, 127, 129, 1000};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
        CHECK(qtype_get(unknown[i]) == NULL, "type %d should be unknown", unknown[i]);
    CHECK(qtype_row_bytes(QTYPE_Q8_0, 4096) == 4352, "q8_0 row");
    CHECK(qtype_row_bytes(QTYPE_Q4_K, 4096) == 16 * 144, "q4_K row");
    CHECK(qtype_row_bytes(QTYPE_Q4_K, 255) == 0, "q4_K partial block");
    CHECK(qtype_row_bytes(QTYPE_F32, 7) == 28, "f32 row");
    CHECK(qtype_row_bytes(QTYPE_F16, -2) == 0, "negative n");
    CHECK(qtype_row_bytes(5, 32) == 0, "retired type");
    CHECK(qtype_row_bytes(QTYPE_F32, INT64_MAX) == 0, "overflow");
    CHECK(kern_act_bytes(16 /* iq2_xxs */, 256, 1) == 0, "unsupported matmul type");
    CHECK(kern_act_bytes(QTYPE_Q8_0, 48, 1) == 0, "q8_0 act of partial block");
    CHECK(kern_act_bytes(QTYPE_F32, 7, 3) >= 3 * 7 * sizeof(float), "f32 act bytes");
}

/* ---- hand-built blocks ---- */

static void test_known_blocks(void) {
    float y[256];

    /* Q8_0: d = 0.5, q = i - 16. */
    {
        uint8_t blk[34];
        ellm_f16 d = ellm_f32_to_f16(0.5f);
        memcpy(blk, &d, 2);
        for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)(i - 16);
        qtype_dequantize_ref(QTYPE_Q8_0, blk, y, 32);
        int ok = 1;
        for (int i = 0; i < 32; i++) ok &= y[i] == 0.5f * (float)(i - 16);
        CHECK(ok, "q8_0 known block");
    }
    /* Q4_0: d = 2, byte i = (i & 15) | (15 - i) << 4: y[i] = 2 (i - 8), y[i + 16] = 2 (7 - i). */
    {
        uint8_t blk[18];
        ellm_f16 d = ellm_f32_to_f16(2.0f);
        memcpy(blk, &d, 2);
        for (int i = 0; i < 16; i++) blk[2 + i] = (uint8_t)(i | ((15 - i) << 4));
        qtype_dequantize_ref(QTYPE_Q4_0, blk, y, 32);
        int ok = 1;
        for (int i = 0; i < 16; i++) ok &= y[i] == 2.0f * (float)(i - 8) && y[i + 16] == 2.0f * (float)(7 - i);
        CHECK(ok, "q4_0 known block (y[0]=%g y[16]=%g)", y[0], y[16]);
    }
    /* Q4_K: d = 1, dmin = 0.5; sub-block j has scale sc[j] = 1 + 5j (needs 6
     * bits from j = 3 on: 16, 21, ..., 36) and min m[j] = 40 - 3j. Scales
     * packed by hand from ggml's layout:
     *   bytes 0-3: sc[0..3] | (sc[4..7] >> 4) << 6
     *   bytes 4-7: m[0..3]  | (m[4..7] >> 4) << 6
     *   bytes 8-11: (sc[4..7] & 15) | (m[4..7] & 15) << 4
     * qs[32g + l] = (l & 15) | (15 - (l & 15)) << 4, so element 64g + l has
     * q = l & 15 and element 64g + 32 + l has q = 15 - (l & 15). */
    {
        uint8_t blk[144];
        int sc[8], m[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = 1 + 5 * j;
            m[j] = 40 - 3 * j;
        }
        ellm_f16 d = ellm_f32_to_f16(1.0f), dmin = ellm_f32_to_f16(0.5f);
        memcpy(blk, &d, 2);
        memcpy(blk + 2, &dmin, 2);
        uint8_t *s = blk + 4;
        for (int j = 0; j < 4; j++) {
            s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
            s[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
            s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
        }
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) blk[16 + 32 * g + l] = (uint8_t)((l & 15) | ((15 - (l & 15)) << 4));
        qtype_dequantize_ref(QTYPE_Q4_K, blk, y, 256);
        int bad = -1;
        for (int e = 0; e < 256 && bad < 0; e++) {
            int j = e / 32, l = e % 32;
            int q = (j & 1) ? 15 - (l & 15) : (l & 15);
            float want = (float)(sc[j] * q) - 0.5f * (float)m[j];
            if (y[e] != want) bad = e;
        }
        CHECK(bad < 0, "q4_K known block: element %d = %g", bad, bad >= 0 ? y[bad] : 0.0f);
        /* A few values worked out by hand. */
        CHECK(y[0] == -20.0f, "q4_K y[0] = %g", y[0]);         /* 1*0 - 0.5*40 */
        CHECK(y[33] == 6 * 14 - 18.5f, "q4_K y[33] = %g", y[33]); /* sc 6, q 14, m 37 */
        CHECK(y[255] == 36 * 0 - 9.5f, "q4_K y[255] = %g", y[255]); /* sc 36, q 0, m 19 */
        CHECK(y[200] == 31 * 8 - 11.0f, "q4_K y[200] = %g", y[200]); /* j 6: sc 31, q 8, m 22 */
    }
    /* Q6_K: d = 0.25, scales[j] = j - 8 (signed), 6-bit q of element e =
     * (e * 7) & 63, placed by ggml's layout: for e = 128h + 32k + l the low
     * nibble goes to ql[64h + l + 32 (k & 1)] (high nibble if k >= 2) and
     * the top 2 bits to bits 2k, 2k+1 of qh[32h + l]. */
    {
        uint8_t blk[210];
        memset(blk, 0, sizeof blk);
        uint8_t *ql = blk, *qh = blk + 128;
        int8_t *scales = (int8_t *)(blk + 192);
        for (int j = 0; j < 16; j++) scales[j] = (int8_t)(j - 8);
        ellm_f16 d = ellm_f32_to_f16(0.25f);
        memcpy(blk + 208, &d, 2);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++) {
                    int e = 128 * h + 32 * k + l, q = (e * 7) & 63;
                    ql[64 * h + l + 32 * (k & 1)] |= (uint8_t)(k >= 2 ? (q & 15) << 4 : q & 15);
                    qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
                }
        qtype_dequantize_ref(QTYPE_Q6_K, blk, y, 256);
        int bad = -1;
        for (int e = 0; e < 256 && bad < 0; e++) {
            float want = 0.25f * (float)(e / 16 - 8) * (float)(((e * 7) & 63) - 32);
            if (y[e] != want) bad = e;
        }
        CHECK(bad < 0, "q6_K known block: element %d = %g", bad, bad >= 0 ? y[bad] : 0.0f);
        CHECK(y[0] == 0.25f * -8 * -32, "q6_K y[0] = %g", y[0]);
        CHECK(y[100] == 0.25f * -2 * (float)((700 & 63) - 32), "q6_K y[100] = %g", y[100]);
        CHECK(y[255] == 0.25f * 7 * (float)(((255 * 7) & 63) - 32), "q6_K y[255] = %g", y[255]);
    }
}

/* ---- quantize -> dequantize round trips ---- */

static void test_roundtrip(void) {
    enum { N = 4096 };
    float *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
    void *q = xmalloc(qtype_row_bytes(QTYPE_F32, N));
    for (int t = 0; t < N_TYPES; t++) {
        int type = k_types[t];
        const qtype_info *ti = qtype_get(type);
        for (int trial = 0; trial < 3; trial++) {
            fill_gauss(x, N, trial == 2 ? 100.0f : 1.0f);
            if (trial == 1) /* sub-blocks of one sign and of zeros */
                for (int i = 0; i < N; i++) {
                    if ((i / 32) % 3 == 0) x[i] = fabsf(x[i]) + 1.0f;
                    if ((i / 32) % 5 == 1) x[i] = 0.0f;
                }
            qtype_quantize_ref(type, x, q, N);
            qtype_dequantize_ref(type, q, y, N);
            int be = ti->block_elems > 1 ? ti->block_elems : 32;
            double err2 = 0, x2 = 0;
            int bad = -1;
            float bad_err = 0, bad_bound = 0;
            for (int b = 0; b < N / be; b++) {
                float amax = 0, emax = 0, lo = x[b * be], hi = x[b * be];
                for (int i = b * be; i < (b + 1) * be; i++) {
                    amax = fmaxf(amax, fabsf(x[i]));
                    lo = fminf(lo, x[i]);
                    hi = fmaxf(hi, x[i]);
                    emax = fmaxf(emax, fabsf(y[i] - x[i]));
                    err2 += (double)(y[i] - x[i]) * (y[i] - x[i]);
                    x2 += (double)x[i] * x[i];
                }
                float bound;
                switch (type) {
                case QTYPE_F32: bound = 0; break;
                case QTYPE_F16: bound = amax * (1.0f / 2048); break;
                case QTYPE_BF16: bound = amax * (1.0f / 256); break;
                case QTYPE_Q8_0: bound = 0.57f * amax / 127; break;
                case QTYPE_Q4_0: bound = 1.02f * amax / 8; break; /* +amax clips from 8 to 7 */
                case QTYPE_Q5_0: bound = 1.02f * amax / 16; break; /* +amax clips from 16 to 15 */
                case QTYPE_Q3_K: bound = 0.28f * amax; break; /* +max clips from 4 to 3 steps of max / 4, and the 6-bit scales */
                case QTYPE_Q2_K: bound = 0.4f * amax; break; /* half a step of (max - min) / 3, mins rounded up */
                case QTYPE_IQ4_NL: bound = 0.12f * amax; break; /* half the grid's widest gap (89 to 113, or to 127 with the opposite sign's scale) */
                case QTYPE_IQ4_XS: bound = 0.15f * amax; break; /* the same, and the 6-bit sub-block scales' rounding */
                case QTYPE_Q4_1: bound = 0.52f * 2 * amax / 15 + 2e-3f * amax; break; /* half a step of (max - min) / 15, f16 d and m */
                case QTYPE_Q5_1: bound = 0.52f * 2 * amax / 31 + 2e-3f * amax; break;
                case QTYPE_Q4_K: bound = 0.075f * amax; break;
                case QTYPE_Q5_K: bound = 0.04f * amax; break;
                /* in steps of the group's own (max - min) / 15: the least-squares fit
                 * may clip an outlier by more than one; 1.38 steps at worst over
                 * 200,000 random groups (Gaussian, one-signed, x100) */
                case QTYPE_INT4_G128: bound = 1.5f * (hi - lo) / 15; break;
                default: bound = 0.02f * amax; break; /* Q6_K */
                }
                if (emax > bound && bad < 0) {
                    bad = b;
                    bad_err = emax;
                    bad_bound = bound;
                }
            }
            CHECK(bad < 0, "%s round trip trial %d: block %d error %g > %g", ti->name, trial, bad,
                  bad_err, bad_bound);
            double rel = sqrt(err2 / x2);
            double rel_max = type == QTYPE_F32 ? 0 : type == QTYPE_F16 ? 3e-4 : type == QTYPE_BF16 ? 3e-3
                           : type == QTYPE_Q8_0 ? 0.01 : type == QTYPE_Q4_0 ? 0.12 : type == QTYPE_Q5_0 ? 0.06
                           : type == QTYPE_Q4_K || type == QTYPE_INT4_G128 ? 0.1 : type == QTYPE_Q5_K ? 0.05
                           : type == QTYPE_Q4_1 || type == QTYPE_IQ4_NL || type == QTYPE_IQ4_XS ? 0.1 : type == QTYPE_Q5_1 ? 0.05
                           : type == QTYPE_Q3_K ? 0.2 : type == QTYPE_Q2_K ? 0.4 : 0.03;
            CHECK(rel <= rel_max, "%s round trip trial %d: rms error %.4g > %.4g", ti->name, trial, rel, rel_max);
        }
        /* all zeros stay zeros */
        memset(x, 0, N * sizeof(float));
        qtype_quantize_ref(type, x, q, N);
        qtype_dequantize_ref(type, q, y, N);
        int nz = 0;
        for (int i = 0; i < N; i++) nz += y[i] != 0.0f;
        CHECK(nz == 0, "%s: zeros round trip to %d non-zeros", ti->name, nz);
    }
    free(x);
    free(y);
    free(q);
}

/* ---- per-ISA comparisons ---- */

static int close_rel(float got, float want, float rel, float abs_tol) {
    if (isnan(want)) return isnan(got);
    return fabsf(got - want) <= rel * fabsf(want) + abs_tol;
}

static void test_dequantize(ellm_isa isa) {
    const char *in = ellm_isa_str(isa);
    int64_t sizes[] = {1, 3, 7, 16};
    for (int t = 0; t < N_TYPES; t++) {
        int type = k_types[t];
        const qtype_info *ti = qtype_get(type);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            int64_t n = sizes[s] * (ti->block_elems > 1 ? ti->block_elems : 37);
            size_t rb = qtype_row_bytes(type, n);
            void *q = xmalloc(rb);
            if (is_quant(type)) make_weights(type, q, 1, n);
            else fill_bytes(q, rb); /* every bit pattern, incl. inf / nan / subnormal */
            float *want = xmalloc((size_t)n * sizeof(float)), *got = xmalloc((size_t)n * sizeof(float));
            qtype_dequantize_ref(type, q, want, n);
            kern_dequantize(type, q, got, n);
            int64_t bad = -1;
            for (int64_t i = 0; i < n && bad < 0; i++) {
                int same = memcmp(&got[i], &want[i], 4) == 0 || (isnan(got[i]) && isnan(want[i])) ||
                           close_rel(got[i], want[i], 2.5e-7f, 0);
                if (!same) bad = i;
            }
            CHECK(bad < 0, "[%s] dequantize %s n=%lld: element %lld %g vs %g", in, ti->name, (long long)n,
                  (long long)bad, bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);
            if (ti->block_elems == 1) {
                /* F32, F16, BF16 at an odd byte address (a safetensors file's
                 * data offsets may be odd): the same values (UBSan reports a
                 * misaligned element read under make test-asan) */
                unsigned char *raw = xmalloc(rb + 1);
                float *odd = xmalloc((size_t)n * sizeof(float)), *odd_ref = xmalloc((size_t)n * sizeof(float));
                memcpy(raw + 1, q, rb);
                qtype_dequantize_ref(type, raw + 1, odd_ref, n);
                kern_dequantize(type, raw + 1, odd, n);
                CHECK(!memcmp(odd_ref, want, (size_t)n * 4) && !memcmp(odd, got, (size_t)n * 4),
                      "[%s] dequantize %s n=%lld from an odd address differs", in, ti->name, (long long)n);
                free(raw);
                free(odd);
                free(odd_ref);
            }
            free(q);
            free(want);
            free(got);
        }
    }
}

static void test_act_prepare_case(ellm_isa isa, int type, int64_t cols, int nb) {
    const char *in = ellm_isa_str(isa);
    float *X = xmalloc((size_t)(cols * nb) * sizeof(float));
    fill_gauss(X, cols * nb, 2.0f);
    for (int64_t i = 0; i < 32; i++) X[i] = 0; /* an all-zero block */
    X[cols + 5] = 1e-30f;                      /* a tiny block maximum */
    size_t bytes = kern_act_bytes(type, cols, nb);
    void *a = xmalloc(bytes), *b = xmalloc(bytes);
    memset(a, 0, bytes);
    memset(b, 0, bytes);
    ellm_cpu_set_isa(ELLM_ISA_SCALAR);
    kern_act_prepare(type, X, cols, nb, a);
    ellm_cpu_set_isa(isa);
    kern_act_prepare(type, X, cols, nb, b);
    CHECK(memcmp(a, b, bytes) == 0, "[%s] act_prepare %s cols=%lld nb=%d differs from scalar", in,
          qtype_get(type)->name, (long long)cols, nb);
    /* the same bytes prepared in row ranges (as threads of a pass split
     * them), the last range first */
    const int cuts[] = {0, 4, 12, 20};
    int n_cut = 0, at[6];
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++)
        if (cuts[i] < nb) at[n_cut++] = cuts[i];
    at[n_cut] = nb;
    memset(a, 0, bytes);
    for (int i = n_cut - 1; i >= 0; i--) kern_act_prepare_rows(type, X, cols, nb, at[i], at[i + 1], a);
    CHECK(memcmp(a, b, bytes) == 0, "[%s] act_prepare_rows %s cols=%lld nb=%d in %d ranges differs from one call", in,
          qtype_get(type)->name, (long long)cols, nb, n_cut);
    free(X);
    free(a);
    free(b);
}

static void test_act_prepare(ellm_isa isa) {
    int types[] = {QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q5_0, QTYPE_Q4_1, QTYPE_Q5_1, QTYPE_IQ4_NL, QTYPE_Q2_K,
                   QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_IQ4_XS, QTYPE_Q6_K, QTYPE_F32, QTYPE_INT4_G128};
    int64_t cols_list[] = {256, 768, 4096};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t c = 0; c < sizeof cols_list / sizeof cols_list[0]; c++) {
            test_act_prepare_case(isa, types[t], cols_list[c], 3);
            test_act_prepare_case(isa, types[t], cols_list[c], 29); /* batch quads, the last padded */
        }
}

/* Bound on |sum_c w x| rounding: sum_c |w_c| |x_c| over dequantized weights
 * and (de)quantized activations, so tolerances scale with the magnitudes
 * actually summed rather than with a possibly cancelling result. */
static double abs_dot(const float *w, const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += fabs((double)w[i] * x[i]);
    return s;
}

/* One matmul run through the current ISA's kernel and the reference: rows x
 * cols random weights W of type, nb Gaussian activation rows X, outputs for
 * rows [r0, r1) in Y (kernel) and Yr (reference), ldy = rows + 3 apart, NaN
 * everywhere else. */
typedef struct {
    void *W, *act;
    float *X, *Y, *Yr;
    int64_t ldy;
} matmul_run;

static void matmul_run_both(matmul_run *m, int type, int64_t rows, int64_t cols, int nb, int64_t r0, int64_t r1) {
    m->W = xmalloc(qtype_row_bytes(type, cols) * (size_t)rows);
    make_weights(type, m->W, rows, cols);
    m->X = xmalloc((size_t)(cols * nb) * sizeof(float));
    fill_gauss(m->X, cols * nb, 1.0f);
    m->act = xmalloc(kern_act_bytes(type, cols, nb));
    kern_act_prepare(type, m->X, cols, nb, m->act);
    m->ldy = rows + 3;
    m->Y = xmalloc((size_t)(m->ldy * nb) * sizeof(float));
    m->Yr = xmalloc((size_t)(m->ldy * nb) * sizeof(float));
    for (int64_t i = 0; i < m->ldy * nb; i++) m->Y[i] = m->Yr[i] = NAN;
    kern_matmul_ref(type, m->W, cols, r0, r1, m->act, nb, m->Yr, m->ldy);
    kern_matmul(type, m->W, cols, r0, r1, m->act, nb, m->Y, m->ldy);
}

static void matmul_run_free(matmul_run *m) {
    free(m->W);
    free(m->X);
    free(m->act);
    free(m->Y);
    free(m->Yr);
}

static void test_matmul_case(ellm_isa isa, int type, int64_t rows, int64_t cols, int nb, int64_t r0,
                             int64_t r1) {
    const char *in = ellm_isa_str(isa);
    const char *tn = qtype_get(type)->name;
    size_t rb = qtype_row_bytes(type, cols);
    matmul_run m;
    matmul_run_both(&m, type, rows, cols, nb, r0, r1);
    const void *W = m.W;
    const float *X = m.X, *Y = m.Y, *Yr = m.Yr;
    const int64_t ldy = m.ldy;

    float *wf = xmalloc((size_t)cols * sizeof(float));
    int bad = 0, untouched = 1;
    for (int b = 0; b < nb; b++) {
        const float *xf = X + b * cols; /* the quantized activations are close enough for a bound */
        for (int64_t r = 0; r < ldy; r++) {
            float got = Y[b * ldy + r], want = Yr[b * ldy + r];
            if (r < r0 || r >= r1) {
                untouched &= isnan(got) != 0;
                continue;
            }
            qtype_dequantize_ref(type, (const char *)W + r * rb, wf, cols);
            double tol = 2e-6 * abs_dot(wf, xf, cols) + 1e-7;
            double err = fabs((double)got - want);
            if (!(err <= tol)) {
                if (!bad)
                    fprintf(stderr, "  [%s] %s cols=%lld nb=%d: Y[%d][%lld] = %.9g, ref %.9g (tol %.3g)\n",
                            in, tn, (long long)cols, nb, b, (long long)r, got, want, tol);
                bad++;
            }
        }
    }
    CHECK(bad == 0, "[%s] matmul %s cols=%lld nb=%d rows [%lld,%lld): %d mismatches", in, tn,
          (long long)cols, nb, (long long)r0, (long long)r1, bad);
    CHECK(untouched, "[%s] matmul %s wrote outside rows [%lld,%lld)", in, tn, (long long)r0, (long long)r1);
    matmul_run_free(&m);
    free(wf);
}

static void test_matmul(ellm_isa isa) {
    static const int nbs[] = {1, 2, 3, 7, 16};
    for (int t = 0; t < N_TYPES; t++) {
        int type = k_types[t];
        int be = qtype_get(type)->block_elems;
        int64_t cols_list[3];
        if (be == 1) {
            cols_list[0] = 7;
            cols_list[1] = 40;
            cols_list[2] = 301;
        } else if (be == 32) {
            cols_list[0] = 32;
            cols_list[1] = 96;
            cols_list[2] = 320;
        } else if (be == 128) {
            cols_list[0] = 128;
            cols_list[1] = 384;
            cols_list[2] = 1280;
        } else {
            cols_list[0] = 256;
            cols_list[1] = 512;
            cols_list[2] = 1280;
        }
        for (int c = 0; c < 3; c++)
            for (size_t n = 0; n < sizeof nbs / sizeof nbs[0]; n++)
                test_matmul_case(isa, type, 21, cols_list[c], nbs[n], 3, 20);
        test_matmul_case(isa, type, 5, cols_list[1], 5, 4, 5); /* a single last row */
    }
    /* SmolLM2-135M rows (18 and 48 blocks) with row ranges that are not
     * multiples of anything, at decode, verification and prefill batch sizes
     * (per-row kernels for 1-3 rows, quads from 4, the last one padded, more
     * than one pass of 16 rows; weight rows in groups of 16, 8 and 4 and
     * 0-3 left over) */
    static const int q8_nbs[] = {1, 2, 3, 4, 5, 7, 8, 9, 14, 16, 17, 28, 37};
    for (int t = 0; t < N_Q32_TYPES; t++)
        for (size_t n = 0; n < sizeof q8_nbs / sizeof q8_nbs[0]; n++) {
            test_matmul_case(isa, k_q32_types[t], 37, 576, q8_nbs[n], 3, 36);
            test_matmul_case(isa, k_q32_types[t], 19, 1536, q8_nbs[n], 1, 18);
        }
    /* one activation row against rows whose last chunk has 1, 3 and 4
     * blocks (the decode kernel reads tails of up to 4 blocks directly) */
    static const int64_t tail_cols[] = {32 * 17, 32 * 3, 32 * 20, 32 * 4};
    for (int t = 0; t < N_Q32_TYPES; t++)
        for (size_t c = 0; c < sizeof tail_cols / sizeof tail_cols[0]; c++)
            test_matmul_case(isa, k_q32_types[t], 13, tail_cols[c], 1, 2, 13);
    /* decode-sized rows and a prefill-sized batch */
    test_matmul_case(isa, QTYPE_Q8_0, 8, 4096, 16, 1, 8);
    test_matmul_case(isa, QTYPE_Q4_K, 8, 4096, 3, 2, 8);
    test_matmul_case(isa, QTYPE_Q5_K, 8, 4096, 3, 2, 8);
    test_matmul_case(isa, QTYPE_Q5_K, 7, 2048, 11, 1, 7);
    test_matmul_case(isa, QTYPE_IQ4_XS, 8, 4096, 3, 2, 8);
    test_matmul_case(isa, QTYPE_IQ4_XS, 7, 2048, 11, 1, 7);
    test_matmul_case(isa, QTYPE_Q3_K, 8, 4096, 3, 2, 8);
    test_matmul_case(isa, QTYPE_Q3_K, 7, 2048, 11, 1, 7);
    test_matmul_case(isa, QTYPE_Q2_K, 8, 4096, 3, 2, 8);
    test_matmul_case(isa, QTYPE_Q2_K, 7, 2048, 11, 1, 7);
    test_matmul_case(isa, QTYPE_Q6_K, 9, 2048, 37, 1, 9);
    test_matmul_case(isa, QTYPE_F16, 9, 1000, 20, 1, 9);
    test_matmul_case(isa, QTYPE_Q4_0, 6, 512, 64, 0, 6);
}

/* Batch invariance: a row's result must not depend on how many rows share
 * the call, where it sits in the batch, or how the weight rows are split
 * among calls (threads), so that batched verification of draft tokens gives
 * exactly the logits single-token decode would. Compared bit for bit. */
static void test_matmul_batch_invariance_case(ellm_isa isa, int type, int64_t cols, int nb) {
    {
        int64_t rows = 40;
        size_t rb = qtype_row_bytes(type, cols);
        void *W = xmalloc(rb * (size_t)rows);
        make_weights(type, W, rows, cols);
        float *X = xmalloc((size_t)(cols * nb) * sizeof(float));
        fill_gauss(X, cols * nb, 1.0f);
        void *act = xmalloc(kern_act_bytes(type, cols, nb)), *act1 = xmalloc(kern_act_bytes(type, cols, 1));
        void *act3 = xmalloc(kern_act_bytes(type, cols, 3));
        kern_act_prepare(type, X, cols, nb, act);
        float *Y = xmalloc((size_t)(rows * nb) * sizeof(float)), *Ys = xmalloc((size_t)(rows * nb) * sizeof(float));
        float y1[40];
        kern_matmul(type, W, cols, 1, rows, act, nb, Y, rows);
        /* the same rows in three calls of uneven size */
        kern_matmul(type, W, cols, 1, 4, act, nb, Ys, rows);
        kern_matmul(type, W, cols, 4, 9, act, nb, Ys, rows);
        kern_matmul(type, W, cols, 9, rows, act, nb, Ys, rows);
        int diff_split = 0, diff_single = 0, diff_sub = 0;
        for (int b = 0; b < nb; b++)
            for (int64_t r = 1; r < rows; r++) diff_split += memcmp(&Y[b * rows + r], &Ys[b * rows + r], 4) != 0;
        for (int b = 0; b < nb; b++) {
            kern_act_prepare(type, X + b * cols, cols, 1, act1);
            kern_matmul(type, W, cols, 1, rows, act1, 1, y1, 0);
            for (int64_t r = 1; r < rows; r++) diff_single += memcmp(&Y[b * rows + r], &y1[r], 4) != 0;
        }
        /* rows 2..4 of the batch as a batch of their own (of a batch of 2-4:
         * all rows but the last) */
        int s0 = nb >= 5 ? 2 : 0, ns = nb >= 5 ? 3 : nb - 1;
        kern_act_prepare(type, X + s0 * cols, cols, ns, act3);
        kern_matmul(type, W, cols, 1, rows, act3, ns, Ys, rows);
        for (int b = 0; b < ns; b++)
            for (int64_t r = 1; r < rows; r++) diff_sub += memcmp(&Y[(b + s0) * rows + r], &Ys[b * rows + r], 4) != 0;
        CHECK(diff_split == 0 && diff_single == 0 && diff_sub == 0,
              "[%s] matmul %s cols=%lld nb=%d not batch-invariant: %d differ by row split, %d vs nb=1, %d vs "
              "sub-batch",
              ellm_isa_str(isa), qtype_get(type)->name, (long long)cols, nb, diff_split, diff_single, diff_sub);
        free(W);
        free(X);
        free(act);
        free(act1);
        free(act3);
        free(Y);
        free(Ys);
    }
}

/* R16 (kernels.h) of Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1, Q4_K, Q5_K or IQ4_XS (wt): rows of a packed matrix read
 * back as the original's; this ISA's kernel gives the reference's bits (the
 * same float operations in the same order) for every batch size, row split
 * and sub-batch, within the file layout's reference tolerance, also with
 * every weight and activation at its largest magnitude (the integer sums'
 * bounds); shapes and types the layout cannot take are refused and leave
 * the destination alone. */
static void test_matmul_r16(ellm_isa isa, int wt) {
    char in[48];
    snprintf(in, sizeof in, "%s %s", ellm_isa_str(isa), qtype_get(wt)->name);
    const int kq = wt == QTYPE_Q4_K || wt == QTYPE_Q5_K || wt == QTYPE_IQ4_XS; /* super-blocks of 256 */
    const int64_t shapes[][2] = {{48, kq ? 256 : 96}, {64, kq ? 768 : 576}, {32, 1536}, {16, kq ? 512 : 64}};
    static const int nbs[] = {1, 2, 3, 4, 5, 8, 9, 16, 17};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t rows = shapes[si][0], cols = shapes[si][1];
        const int extreme = si == 3; /* all weights and activations at their largest */
        const size_t rb = qtype_row_bytes(wt, cols), wb = rb * (size_t)rows;
        char *W = xmalloc(wb), *P = xmalloc(wb), *P2 = xmalloc(wb);
        make_weights(wt, W, rows, cols);
        if (extreme) /* the largest nibbles (and Q4_K scales), Q8_0's -127 */
            for (int64_t r = 0; r < rows; r++) {
                const qtype_info *ti = qtype_get(wt);
                for (int64_t k = 0; k < cols / ti->block_elems; k++) {
                    char *b = W + (size_t)r * rb + (size_t)k * ti->block_bytes;
                    if (wt == QTYPE_Q4_K) memset(b + offsetof(block_q4_K, scales), 0xFF, 12 + QK_K / 2); /* sc, m 63 */
                    else if (wt == QTYPE_Q5_K) memset(b + offsetof(block_q5_K, scales), 0xFF, 12 + QK_K / 8 + QK_K / 2);
                    else if (wt == QTYPE_Q8_0) memset(b + 2, 0x81, 32); /* -127 */
                    else if (wt == QTYPE_IQ4_NL) memset(b + 2, 0x00, 16); /* every code -127 */
                    else if (wt == QTYPE_Q5_1) memset(b + offsetof(block_q5_1, qh), 0xFF, 20); /* every value 31 */
                    else if (wt == QTYPE_Q4_1) memset(b + offsetof(block_q4_1, qs), 0xFF, 16); /* every value 15 */
                    else if (wt == QTYPE_IQ4_XS) { /* scales 31, every code -127 */
                        memset(b + 2, 0xFF, 6);
                        memset(b + offsetof(block_iq4_xs, qs), 0x00, QK_K / 2);
                    }
                    else memset(b + 2, 0xFF, ti->block_bytes - 2);
                }
            }
        CHECK(kern_r16_pack(wt, P, W, rows, cols) == 0, "[%s] r16 pack %lldx%lld", in, (long long)rows, (long long)cols);
        memcpy(P2, W, wb);
        CHECK(kern_r16_pack(wt, P2, P2, rows, cols) == 0 && memcmp(P, P2, wb) == 0,
              "[%s] r16 pack in place differs from a packed copy", in);
        CHECK(memcmp(P, W, wb) != 0, "[%s] r16 pack left the bytes as they were", in);
        float *f1 = xmalloc((size_t)cols * 4), *f2 = xmalloc((size_t)cols * 4);
        int bad_rows = 0;
        for (int64_t r = 0; r < rows; r++) {
            kern_r16_row(wt, P, cols, r, f1);
            qtype_dequantize_ref(wt, W + (size_t)r * rb, f2, cols);
            bad_rows += memcmp(f1, f2, (size_t)cols * 4) != 0;
        }
        CHECK(bad_rows == 0, "[%s] r16 rows %lldx%lld: %d read back differently", in, (long long)rows,
              (long long)cols, bad_rows);
        for (size_t ni = 0; ni < sizeof nbs / sizeof *nbs; ni++) {
            const int nb = nbs[ni];
            float *X = xmalloc((size_t)(cols * nb) * 4);
            fill_gauss(X, cols * nb, 1.0f);
            if (extreme)
                for (int64_t i = 0; i < cols * nb; i++) X[i] = 1.0f; /* every activation quantizes to 127 */
            void *act = xmalloc(kern_act_bytes(wt, cols, nb)), *act1 = xmalloc(kern_act_bytes(wt, cols, 1));
            kern_act_prepare(wt, X, cols, nb, act);
            const size_t yb = (size_t)(rows * nb) * 4;
            float *Y = xmalloc(yb), *Yr = xmalloc(yb), *Ys = xmalloc(yb), *Yq = xmalloc(yb), *y1 = xmalloc((size_t)rows * 4);
            /* the layout's own activations: the rows of kern_act_prepare's */
            const size_t ab = kern_act_bytes_r16(cols, nb);
            void *actr = xmalloc(ab);
            CHECK(ab > 0 && ab <= kern_act_bytes(wt, cols, nb), "[%s] r16 act bytes %zu", in, ab);
            kern_act_prepare_rows_r16(wt, X, cols, nb, 0, nb, actr);
            CHECK(memcmp(actr, act, ab) == 0, "[%s] r16 activations (nb=%d) are not kern_act_prepare's rows", in, nb);
            kern_matmul_r16(wt, P, cols, 0, rows, actr, nb, Y, rows);
            free(actr);
            kern_matmul_r16_ref(wt, P, cols, 0, rows, act, nb, Yr, rows);
            kern_matmul_ref(wt, W, cols, 0, rows, act, nb, Yq, rows);
            kern_matmul_r16(wt, P, cols, 16, rows, act, nb, Ys, rows);
            kern_matmul_r16(wt, P, cols, 0, 16, act, nb, Ys, rows);
            int d_ref = 0, d_split = 0, d_single = 0, d_tol = 0;
            for (int b = 0; b < nb; b++) {
                kern_act_prepare(wt, X + (int64_t)b * cols, cols, 1, act1);
                kern_matmul_r16(wt, P, cols, 0, rows, act1, 1, y1, rows);
                for (int64_t r = 0; r < rows; r++) {
                    const float got = Y[b * rows + r];
                    d_ref += memcmp(&got, &Yr[b * rows + r], 4) != 0;
                    d_split += memcmp(&got, &Ys[b * rows + r], 4) != 0;
                    d_single += memcmp(&got, &y1[r], 4) != 0;
                    qtype_dequantize_ref(wt, W + (size_t)r * rb, f2, cols);
                    const double tol = 2e-6 * abs_dot(f2, X + (int64_t)b * cols, cols) + 1e-7;
                    d_tol += !(fabs((double)got - Yq[b * rows + r]) <= tol);
                }
            }
            CHECK(d_ref == 0 && d_split == 0 && d_single == 0 && d_tol == 0,
                  "[%s] r16 matmul %lldx%lld nb=%d: %d differ from the reference's bits, %d by row split, %d from "
                  "the row alone, %d beyond the file layout reference's tolerance",
                  in, (long long)rows, (long long)cols, nb, d_ref, d_split, d_single, d_tol);
            free(X);
            free(act);
            free(act1);
            free(Y);
            free(Yr);
            free(Ys);
            free(Yq);
            free(y1);
        }
        free(f1);
        free(f2);
        free(W);
        free(P);
        free(P2);
    }
    /* shapes the layout cannot take */
    const int64_t c0 = kq ? 256 : 96;
    char *W = xmalloc(qtype_row_bytes(wt, c0) * 40), *P = xmalloc(qtype_row_bytes(wt, c0) * 40);
    make_weights(wt, W, 40, c0);
    memset(P, 0x5a, qtype_row_bytes(wt, c0) * 40);
    int untouched = 1;
    CHECK(kern_r16_pack(wt, P, W, 40, c0) == -1, "[%s] r16 pack took 40 rows", in);
    CHECK(kern_r16_pack(wt, P, W, 32, kq ? 160 : 80) == -1, "[%s] r16 pack took %d columns", in, kq ? 160 : 80);
    CHECK(kern_r16_pack(wt, P, W, 0, c0) == -1, "[%s] r16 pack took 0 rows", in);
    CHECK(kern_r16_pack(QTYPE_Q2_K, P, W, 16, 256) == -1 && !kern_r16_type(QTYPE_Q2_K), "[%s] r16 pack took Q2_K", in);
    CHECK(kern_r16_pack(QTYPE_Q6_K, P, W, 16, 256) == -1 && !kern_r16_type(QTYPE_Q6_K), "[%s] r16 pack took Q6_K", in);
    for (size_t i = 0; i < qtype_row_bytes(wt, c0) * 40; i++) untouched &= (unsigned char)P[i] == 0x5a;
    CHECK(untouched, "[%s] a refused r16 pack wrote its destination", in);
    free(W);
    free(P);
}

/* Batch invariance for every type, with a batch below and one above the
 * 16 rows of a Q8_0 / Q4_0 quad kernel pass, and SmolLM2-sized rows of
 * 18 and 48 blocks (a short last chunk, and whole chunks only). */
static void test_matmul_batch_invariance(ellm_isa isa) {
    for (int t = 0; t < N_TYPES; t++) {
        int type = k_types[t];
        int be = qtype_get(type)->block_elems;
        int64_t cols = be == 1 ? 203 : be == 32 ? 32 * 21 : be == 128 ? 128 * 5 : 256 * 3;
        test_matmul_batch_invariance_case(isa, type, cols, 11);
        test_matmul_batch_invariance_case(isa, type, cols, 37);
    }
    /* Blocks of 32: per-row kernels only (2 rows of 1,536 columns), quads
     * (2 rows of at most ACT_Q8_SHORT_COLS columns; 3, 4, 8, 16), a padded
     * quad (5, 9, the verification size of 8 drafts), two passes of quads
     * (19, 28); 39 weight rows split into calls of 3, 5 and 31 rows */
    static const int64_t q8_cols[] = {576, 1536, 32 * 5, 32 * 31};
    static const int q8_nbs[] = {2, 3, 4, 5, 8, 9, 16, 19, 28};
    for (size_t c = 0; c < sizeof q8_cols / sizeof q8_cols[0]; c++)
        for (size_t n = 0; n < sizeof q8_nbs / sizeof q8_nbs[0]; n++)
            for (int t = 0; t < N_Q32_TYPES; t++)
                test_matmul_batch_invariance_case(isa, k_q32_types[t], q8_cols[c], q8_nbs[n]);
    /* Q4_K, Q5_K and IQ4_XS, their blocks of 32 by the same kernels: one
     * super-block, a short last chunk (3 and 5 super-blocks), whole chunks
     * only */
    static const int64_t kq_cols[] = {256, 768, 1280, 2048};
    static const int sb_types[] = {QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_IQ4_XS, QTYPE_Q6_K};
    for (int t = 0; t < 4; t++)
        for (size_t c = 0; c < sizeof kq_cols / sizeof kq_cols[0]; c++)
            for (size_t n = 0; n < sizeof q8_nbs / sizeof q8_nbs[0]; n++)
                test_matmul_batch_invariance_case(isa, sb_types[t], kq_cols[c], q8_nbs[n]);
    /* Q6_K and Q3_K by their batch kernel: 17 super-blocks (a chunk of 16
     * and one more); Q3_K also at the sizes above */
    for (size_t n = 0; n < sizeof q8_nbs / sizeof q8_nbs[0]; n++) {
        test_matmul_batch_invariance_case(isa, QTYPE_Q6_K, 256 * 17, q8_nbs[n]);
        test_matmul_batch_invariance_case(isa, QTYPE_Q3_K, 256 * 17, q8_nbs[n]);
        for (size_t c = 0; c < sizeof kq_cols / sizeof kq_cols[0]; c++)
            test_matmul_batch_invariance_case(isa, QTYPE_Q3_K, kq_cols[c], q8_nbs[n]);
    }
}

/* Integer parts must match exactly: with activation blocks whose max is 127
 * (so the activation scale is exactly 1) and power-of-two weight scales, every
 * product and partial sum is exact in float, so any difference is a bug in
 * the integer dot products rather than rounding. */
static void test_matmul_exact(ellm_isa isa) {
    int types[] = {QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_IQ4_XS, QTYPE_Q6_K, QTYPE_INT4_G128};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int type = types[t];
        int64_t cols = type == QTYPE_Q8_0 || type == QTYPE_Q4_0 ? 256 : 512, rows = 9;
        int nb = 5, be = qtype_get(type)->block_elems;
        size_t rb = qtype_row_bytes(type, cols);
        void *W = xmalloc(rb * (size_t)rows);
        fill_bytes(W, rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) set_pow2_scales(type, (char *)W + r * rb, cols);
        float *X = xmalloc((size_t)(cols * nb) * sizeof(float));
        for (int64_t i = 0; i < cols * nb; i++) {
            int v = (int)(rng_next() % 17) - 8;
            X[i] = (float)v;
        }
        /* activation block: INT4_G128, Q4_K, Q5_K and IQ4_XS scale activations per 32 */
        int ab = type == QTYPE_INT4_G128 || type == QTYPE_Q4_K || type == QTYPE_Q5_K || type == QTYPE_IQ4_XS ? 32 : be;
        for (int64_t k = 0; k < cols * nb / ab; k++) X[k * ab + (k * 7) % ab] = (k & 1) ? 127.0f : -127.0f;
        void *act = xmalloc(kern_act_bytes(type, cols, nb));
        kern_act_prepare(type, X, cols, nb, act);
        float Y[9 * 5], Yr[9 * 5];
        kern_matmul_ref(type, W, cols, 0, rows, act, nb, Yr, rows);
        kern_matmul(type, W, cols, 0, rows, act, nb, Y, rows);
        /* and against a direct float computation from the dequantized weights */
        float *wf = xmalloc((size_t)cols * sizeof(float));
        int bad = 0, bad_direct = 0;
        for (int64_t r = 0; r < rows; r++) {
            qtype_dequantize_ref(type, (const char *)W + r * rb, wf, cols);
            for (int b = 0; b < nb; b++) {
                double direct = 0;
                for (int64_t c = 0; c < cols; c++) direct += (double)wf[c] * X[b * cols + c];
                bad += Y[b * rows + r] != Yr[b * rows + r];
                bad_direct += (double)Yr[b * rows + r] != direct;
            }
        }
        CHECK(bad == 0, "[%s] exact matmul %s: %d results differ from the reference", ellm_isa_str(isa),
              qtype_get(type)->name, bad);
        CHECK(bad_direct == 0, "[%s] exact matmul %s: %d reference results differ from dequantized dot",
              ellm_isa_str(isa), qtype_get(type)->name, bad_direct);
        free(W);
        free(X);
        free(act);
        free(wf);
    }
}

/* The 4-bit quantizers that fit their scales by least squares (Q4_0 with
 * an importance matrix, INT4_G128 with or without) end with a gain
 * correction: per block, sum w x xq = sum w x^2 up to the F16 rounding of
 * the scale and offset (a least-squares fit alone leaves it 0.5-2% low). w
 * is the weighting qtype_quantize_weighted documents (1 without imatrix). */
static void test_quant_gain(void) {
    enum { N = 1024, ROWS = 6 };
    float *x = xmalloc(N * ROWS * sizeof(float)), *im = xmalloc(N * sizeof(float)), *xq = xmalloc(N * sizeof(float));
    void *q = xmalloc(qtype_row_bytes(QTYPE_Q4_0, N) * ROWS);
    fill_gauss(x, N * ROWS, 0.02f);
    for (int i = 0; i < N * ROWS; i += 97) x[i] *= 8.0f; /* outliers */
    for (int i = 0; i < N; i++) im[i] = 0.01f + 4.0f * rng_uniform() * rng_uniform();
    static const int types[] = {QTYPE_Q4_0, QTYPE_INT4_G128, QTYPE_INT4_G128};
    for (int c = 0; c < 3; c++) {
        int type = types[c], weighted = c != 2, be = type == QTYPE_Q4_0 ? QK4_0 : QK_G128;
        if (weighted) qtype_quantize_weighted(type, x, q, N * ROWS, im, N);
        else qtype_quantize_ref(type, x, q, N * ROWS);
        double worst = 0;
        for (int r = 0; r < ROWS; r++) {
            const float *xr = x + r * N;
            qtype_dequantize_ref(type, (char *)q + r * qtype_row_bytes(type, N), xq, N);
            double s2 = 0;
            for (int i = 0; i < N; i++) s2 += (double)xr[i] * xr[i];
            float sigma2 = (float)(s2 / N);
            for (int k = 0; k < N / be; k++) {
                double sxx = 0, sxq = 0;
                for (int i = k * be; i < (k + 1) * be; i++) {
                    double w = weighted ? sqrtf(im[i]) * sqrtf(sigma2 + xr[i] * xr[i]) : 1.0;
                    sxx += w * xr[i] * xr[i];
                    sxq += w * xr[i] * xq[i];
                }
                double g = fabs(sxq / sxx - 1.0);
                if (g > worst) worst = g;
            }
        }
        CHECK(worst <= 2e-3, "%s%s: a block's gain sum w x xq / sum w x^2 is off 1 by %.2g", qtype_get(type)->name,
              weighted ? " (imatrix)" : "", worst);
    }
    free(x);
    free(im);
    free(xq);
    free(q);
}

/* INT4_G128: the reference defines the float arithmetic exactly (sub-block
 * dots weighted by their activation scales into one float per group, two
 * multiply-adds per group into lane g % 16, one fixed 16-lane sum), so
 * every ISA's kernel must return its bits: whole chunks of 16 groups, a short
 * last chunk (3, 10, 17, 33 groups), 1-19 activation rows (passes of 8),
 * row ranges that start and end inside the matrix. */
static void test_matmul_int4_bits(ellm_isa isa) {
    static const int64_t ng_list[] = {1, 3, 10, 16, 17, 33, 64};
    static const int nbs[] = {1, 2, 3, 7, 8, 9, 19};
    const int type = QTYPE_INT4_G128;
    for (size_t c = 0; c < sizeof ng_list / sizeof ng_list[0]; c++)
        for (size_t n = 0; n < sizeof nbs / sizeof nbs[0]; n++) {
            int64_t cols = QK_G128 * ng_list[c], rows = 11, r0 = 1, r1 = 10;
            int nb = nbs[n];
            matmul_run m;
            matmul_run_both(&m, type, rows, cols, nb, r0, r1);
            int diff = 0;
            for (int64_t i = 0; i < m.ldy * nb; i++) diff += memcmp(&m.Y[i], &m.Yr[i], 4) != 0;
            CHECK(diff == 0, "[%s] matmul int4_g128 cols=%lld nb=%d: %d results differ from the reference's bits",
                  ellm_isa_str(isa), (long long)cols, nb, diff);
            matmul_run_free(&m);
        }
}

/* Q6_K and Q3_K: the reference defines the float arithmetic exactly (an
 * exact integer sum per super-block, one multiply-add into slot k % 16, one
 * fixed 16-slot sum), and the AVX-512 kernels follow it, the batch kernel
 * included, so they must return its bits: 1-33 super-blocks (short and whole
 * chunks of 16), 1-3 rows (per-row kernels, each row's last chunk reduced
 * one row later), 4-37 rows (quads: passes of 2 groups x 4
 * quads and 1 group x 8, a padded last quad), row ranges that start and end
 * inside the matrix (a last group of 4 rows, 1-3 rows left to the per-row
 * kernel). (AVX2 keeps per-lane float sums, which cost less there; its
 * batches use the same per-row kernel, so they are batch-invariant too, and
 * test_matmul_case holds it to the reference's tolerance.) */
static void test_matmul_q6k_bits(ellm_isa isa) {
    if (isa == ELLM_ISA_AVX2) return; /* per-lane float sums by design: test_matmul_case's tolerance applies */
    if (isa == ELLM_ISA_AVX512 && !ellm_cpu()->avx512vnni) {
        SKIP("Q6_K / Q3_K bits on AVX-512: this CPU has no VNNI, so they run the AVX2 kernels");
        return;
    }
    static const int64_t nsb_list[] = {1, 3, 8, 16, 17, 33};
    static const int nbs[] = {1, 3, 4, 5, 8, 9, 16, 19, 33, 37};
    static const int64_t ranges[][3] = {{11, 1, 10}, {23, 2, 23}, {16, 0, 16}};
    static const int types[] = {QTYPE_Q6_K, QTYPE_Q3_K};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t c = 0; c < sizeof nsb_list / sizeof nsb_list[0]; c++)
            for (size_t n = 0; n < sizeof nbs / sizeof nbs[0]; n++)
                for (size_t g = 0; g < sizeof ranges / sizeof ranges[0]; g++) {
                    const int type = types[t];
                    int64_t cols = QK_K * nsb_list[c];
                    int nb = nbs[n];
                    matmul_run m;
                    matmul_run_both(&m, type, ranges[g][0], cols, nb, ranges[g][1], ranges[g][2]);
                    int diff = 0;
                    for (int64_t i = 0; i < m.ldy * nb; i++) diff += memcmp(&m.Y[i], &m.Yr[i], 4) != 0;
                    CHECK(diff == 0, "[%s] matmul %s cols=%lld nb=%d rows %lld..%lld: %d results differ from the reference's bits",
                          ellm_isa_str(isa), qtype_get(type)->name, (long long)cols, nb, (long long)ranges[g][1],
                          (long long)ranges[g][2], diff);
                    matmul_run_free(&m);
                }
}

/* One case of test_matmul_isa_agree: rows x cols of type, nb activation rows. */
static void matmul_isa_agree_case(int type, int64_t cols, int nb) {
    int64_t rows = 23;
    void *W = xmalloc(qtype_row_bytes(type, cols) * (size_t)rows);
    make_weights(type, W, rows, cols);
    float *X = xmalloc((size_t)(cols * nb) * sizeof(float));
    fill_gauss(X, cols * nb, 1.0f);
    void *act = xmalloc(kern_act_bytes(type, cols, nb));
    float *Y2 = xmalloc((size_t)(rows * nb) * sizeof(float)), *Y5 = xmalloc((size_t)(rows * nb) * sizeof(float));
    ellm_cpu_set_isa(ELLM_ISA_AVX2);
    kern_act_prepare(type, X, cols, nb, act);
    kern_matmul(type, W, cols, 0, rows, act, nb, Y2, rows);
    ellm_cpu_set_isa(ELLM_ISA_AVX512);
    kern_act_prepare(type, X, cols, nb, act);
    kern_matmul(type, W, cols, 0, rows, act, nb, Y5, rows);
    int diff = 0;
    for (int64_t i = 0; i < rows * nb; i++) diff += memcmp(&Y2[i], &Y5[i], 4) != 0;
    CHECK(diff == 0, "matmul %s cols=%lld nb=%d: %d results differ between AVX2 and AVX-512", qtype_get(type)->name,
          (long long)cols, nb, diff);
    free(W);
    free(X);
    free(act);
    free(Y2);
    free(Y5);
}

/* The blocks of 32 (and Q4_K, Q5_K and IQ4_XS, computed as eight of them per super-block)
 * follow one arithmetic on AVX2 and AVX-512 (exact block dots, one or two
 * multiply-adds per block into 16 slots, one fixed sum), so the two ISAs
 * must agree bit for bit, batch kernels included. */
static void test_matmul_isa_agree(void) {
    const ellm_cpu_features *cpu = ellm_cpu();
    if (cpu->best < ELLM_ISA_AVX512 || !cpu->avx512vnni) {
        SKIP("AVX2 / AVX-512 bit-exact agreement: this CPU has no AVX-512 VNNI");
        return;
    }
    /* rows whose last chunk has 1-5 blocks (32, 544, 96, 640, 576, 672) or none (1536) */
    static const int64_t cols_list[] = {32, 96, 544, 576, 640, 672, 1536};
    static const int nbs[] = {1, 4, 5, 7, 9, 14, 16, 19};
    ellm_isa saved = ellm_cpu_isa();
    for (int t = 0; t < N_Q32_TYPES; t++)
        for (size_t c = 0; c < sizeof cols_list / sizeof cols_list[0]; c++)
            for (size_t n = 0; n < sizeof nbs / sizeof nbs[0]; n++) matmul_isa_agree_case(k_q32_types[t], cols_list[c], nbs[n]);
    /* Q4_K, Q5_K, IQ4_XS: one super-block, a short last chunk (3 and 5), whole chunks only */
    static const int64_t kq_cols[] = {256, 768, 1280, 2048};
    for (size_t c = 0; c < sizeof kq_cols / sizeof kq_cols[0]; c++)
        for (size_t n = 0; n < sizeof nbs / sizeof nbs[0]; n++) {
            matmul_isa_agree_case(QTYPE_Q4_K, kq_cols[c], nbs[n]);
            matmul_isa_agree_case(QTYPE_Q5_K, kq_cols[c], nbs[n]);
            matmul_isa_agree_case(QTYPE_IQ4_XS, kq_cols[c], nbs[n]);
        }
    ellm_cpu_set_isa(saved);
}

static const int64_t k_lens[] = {1, 7, 8, 15, 16, 17, 31, 33, 64, 100, 1023, 4096};
enum { N_LENS = sizeof k_lens / sizeof k_lens[0] };

/* logsumexp over vocabulary-sized rows (several float runs summed in
 * double), a row with -inf entries, and rows with nothing finite but one or
 * none. */
static void test_logsumexp_vocab(ellm_isa isa) {
    const char *in = ellm_isa_str(isa);
    const int64_t lens[] = {49152 + 5, 151936};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        const int64_t n = lens[li];
        float *x = xmalloc((size_t)n * sizeof *x);
        fill_gauss(x, n, 4.0f);
        for (int64_t i = 0; i < n; i += 7) x[i] = -INFINITY;
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        for (int64_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
        const double exact = mx + log(sum), got = kern_logsumexp(x, n);
        CHECK(fabs(got - exact) <= 2e-6 * fabs(exact), "[%s] logsumexp n=%lld: %.9g, exact %.9g", in, (long long)n, got,
              exact);
        for (int64_t i = 0; i < n; i++) x[i] = -INFINITY;
        CHECK(kern_logsumexp(x, n) == -INFINITY, "[%s] logsumexp of nothing finite: -inf", in);
        x[n / 3] = 2.5f;
        CHECK(kern_logsumexp(x, n) == 2.5, "[%s] logsumexp of one finite value: that value", in);
        free(x);
    }
}

static void test_rowwise(ellm_isa isa) {
    const char *in = ellm_isa_str(isa);
    for (int li = 0; li < N_LENS; li++) {
        int64_t n = k_lens[li];
        size_t bytes = (size_t)n * sizeof(float);
        float *x = xmalloc(bytes), *w = xmalloc(bytes), *u = xmalloc(bytes);
        float *a = xmalloc(bytes), *b = xmalloc(bytes);
        fill_gauss(x, n, 3.0f);
        fill_gauss(w, n, 1.0f);
        fill_gauss(u, n, 1.0f);

        /* rmsnorm, also in place */
        kern_rmsnorm_ref(a, x, w, n, 1e-5f);
        kern_rmsnorm(b, x, w, n, 1e-5f);
        int ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= close_rel(b[i], a[i], 3e-6f, 1e-30f);
        memcpy(b, x, bytes);
        kern_rmsnorm(b, b, w, n, 1e-5f);
        for (int64_t i = 0; i < n; i++) ok &= close_rel(b[i], a[i], 3e-6f, 1e-30f);
        CHECK(ok, "[%s] rmsnorm n=%lld", in, (long long)n);

        /* swiglu with some saturated gates, also in place over gate */
        for (int64_t i = 0; i < n; i += 5) x[i] = (i & 1) ? 95.0f : -95.0f;
        kern_swiglu_ref(a, x, u, n);
        kern_swiglu(b, x, u, n);
        ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= close_rel(b[i], a[i], 3e-6f, 1e-30f);
        memcpy(b, x, bytes);
        kern_swiglu(b, b, u, n);
        for (int64_t i = 0; i < n; i++) ok &= close_rel(b[i], a[i], 3e-6f, 1e-30f);
        CHECK(ok, "[%s] swiglu n=%lld", in, (long long)n);

        /* softmax with masked (-inf) entries and a wide range */
        fill_gauss(x, n, 10.0f);
        for (int64_t i = 1; i < n; i += 4) x[i] = -INFINITY;
        memcpy(a, x, bytes);
        memcpy(b, x, bytes);
        kern_softmax_ref(a, n);
        kern_softmax(b, n);
        ok = 1;
        double sum = 0;
        for (int64_t i = 0; i < n; i++) {
            ok &= close_rel(b[i], a[i], 3e-6f, 1e-37f);
            if (x[i] == -INFINITY) ok &= b[i] == 0.0f;
            sum += b[i];
        }
        CHECK(ok && fabs(sum - 1.0) < 1e-5, "[%s] softmax n=%lld (sum %g)", in, (long long)n, sum);

        /* logsumexp of the same values (x unchanged), against the reference
         * and against double precision throughout */
        double exact_max = -INFINITY, exact = 0;
        for (int64_t i = 0; i < n; i++) exact_max = x[i] > exact_max ? x[i] : exact_max;
        for (int64_t i = 0; i < n; i++) exact += exp((double)x[i] - exact_max);
        exact = exact_max + log(exact);
        memcpy(a, x, bytes);
        const double lr = kern_logsumexp_ref(x, n), lk = kern_logsumexp(x, n);
        CHECK(fabs(lk - lr) <= 1e-6 * fmax(1.0, fabs(lr)) && fabs(lk - exact) <= 1e-5 * fmax(1.0, fabs(exact)) &&
                  !memcmp(a, x, bytes),
              "[%s] logsumexp n=%lld: %.9g, reference %.9g, exact %.9g", in, (long long)n, lk, lr, exact);

        /* add: exact */
        memcpy(a, w, bytes);
        memcpy(b, w, bytes);
        kern_add_ref(a, u, n);
        kern_add(b, u, n);
        CHECK(memcmp(a, b, bytes) == 0, "[%s] add n=%lld", in, (long long)n);

        /* dot */
        float d = kern_dot_f32(w, u, n), dr = kern_dot_f32_ref(w, u, n);
        CHECK(fabs((double)d - dr) <= 2e-6 * abs_dot(w, u, n) + 1e-30, "[%s] dot n=%lld: %.9g vs %.9g", in,
              (long long)n, d, dr);

        /* f32 -> f16 -> f32, bit-exact, over normal, subnormal, overflowing values */
        uint16_t *h = xmalloc((size_t)n * 2), *hr = xmalloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++) {
            float s = i % 3 == 0 ? 1e-6f : i % 3 == 1 ? 1.0f : 3e4f;
            x[i] = rng_gauss() * s;
        }
        if (n > 3) {
            x[0] = 70000.0f;
            x[1] = -INFINITY;
            x[2] = 65520.0f; /* rounds to inf */
            x[3] = 2.98023224e-8f; /* half the smallest subnormal: ties to 0 */
        }
        kern_f32_to_f16_ref(x, hr, n);
        kern_f32_to_f16(x, h, n);
        CHECK(memcmp(h, hr, (size_t)n * 2) == 0, "[%s] f32_to_f16 n=%lld", in, (long long)n);
        kern_f16_to_f32_ref(hr, a, n);
        kern_f16_to_f32(hr, b, n);
        CHECK(memcmp(a, b, bytes) == 0, "[%s] f16_to_f32 n=%lld", in, (long long)n);
        free(h);
        free(hr);
        free(x);
        free(w);
        free(u);
        free(a);
        free(b);
    }

    /* every half value converts exactly (NaNs: any NaN) */
    {
        uint16_t *h = xmalloc(65536 * 2);
        float *a = xmalloc(65536 * 4), *b = xmalloc(65536 * 4);
        for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
        kern_f16_to_f32_ref(h, a, 65536);
        kern_f16_to_f32(h, b, 65536);
        int bad = 0;
        for (int i = 0; i < 65536; i++) bad += !(memcmp(&a[i], &b[i], 4) == 0 || (isnan(a[i]) && isnan(b[i])));
        CHECK(bad == 0, "[%s] f16_to_f32 exhaustive: %d differ", in, bad);
        free(h);
        free(a);
        free(b);
    }

    /* rope: llama and neox pairing, full and partial rotation */
    struct {
        int n_heads, head_dim, n_rot;
    } shapes[] = {{3, 64, 64}, {2, 128, 128}, {4, 80, 24}, {1, 6, 6}, {2, 96, 64}, {5, 34, 34}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int neox = 0; neox < 2; neox++) {
            int nh = shapes[s].n_heads, hd = shapes[s].head_dim, nr = shapes[s].n_rot;
            size_t n = (size_t)nh * hd;
            float *x = xmalloc(n * 4), *a = xmalloc(n * 4), *b = xmalloc(n * 4), *cs = xmalloc((size_t)nr * 4);
            fill_gauss(x, (int64_t)n, 2.0f);
            for (int i = 0; i < nr / 2; i++) {
                float ang = 7.0f * powf(10000.0f, -2.0f * (float)i / (float)nr);
                cs[2 * i] = cosf(ang);
                cs[2 * i + 1] = sinf(ang);
            }
            memcpy(a, x, n * 4);
            memcpy(b, x, n * 4);
            kern_rope_ref(a, nh, hd, nr, cs, neox);
            kern_rope(b, nh, hd, nr, cs, neox);
            int ok = 1;
            for (size_t i = 0; i < n; i++) ok &= close_rel(b[i], a[i], 1e-6f, 1e-6f);
            CHECK(ok, "[%s] rope heads=%d dim=%d rot=%d neox=%d", in, nh, hd, nr, neox);
            free(x);
            free(a);
            free(b);
            free(cs);
        }
}

int main(void) {
    test_type_table();
    test_known_blocks();
    test_roundtrip();

    const ellm_cpu_features *cpu = ellm_cpu();
    ellm_isa saved = ellm_cpu_isa();
    for (int isa = ELLM_ISA_SCALAR; isa <= ELLM_ISA_AVX512; isa++) {
        if (isa > (int)cpu->best) {
            SKIP("%s kernels: not supported by this CPU", ellm_isa_str((ellm_isa)isa));
            continue;
        }
        CHECK(ellm_cpu_set_isa((ellm_isa)isa) && ellm_cpu_isa() == (ellm_isa)isa, "set isa %d", isa);
        printf("testing %s%s\n", ellm_isa_str((ellm_isa)isa),
               isa == ELLM_ISA_AVX512 ? (cpu->avx512vnni ? " (vnni)" : " (no vnni)") : "");
        test_dequantize((ellm_isa)isa);
        test_act_prepare((ellm_isa)isa);
        ellm_cpu_set_isa((ellm_isa)isa);
        test_matmul((ellm_isa)isa);
        test_matmul_exact((ellm_isa)isa);
        test_matmul_int4_bits((ellm_isa)isa);
        test_matmul_q6k_bits((ellm_isa)isa);
        test_matmul_batch_invariance((ellm_isa)isa);
        test_matmul_r16((ellm_isa)isa, QTYPE_Q8_0);
        test_matmul_r16((ellm_isa)isa, QTYPE_Q4_0);
        test_matmul_r16((ellm_isa)isa, QTYPE_Q4_K);
        test_matmul_r16((ellm_isa)isa, QTYPE_Q5_K);
        test_matmul_r16((ellm_isa)isa, QTYPE_IQ4_XS);
        test_matmul_r16((ellm_isa)isa, QTYPE_IQ4_NL);
        test_matmul_r16((ellm_isa)isa, QTYPE_Q5_0);
        test_matmul_r16((ellm_isa)isa, QTYPE_Q5_1);
        test_matmul_r16((ellm_isa)isa, QTYPE_Q4_1);
        test_rowwise((ellm_isa)isa);
        test_logsumexp_vocab((ellm_isa)isa);
    }
    ellm_cpu_set_isa(saved);
    test_matmul_isa_agree();
    test_quant_gain();
    return test_finish();
}
