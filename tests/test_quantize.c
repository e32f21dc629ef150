/* kern_quantize against qtype_quantize_ref: every ISA's quantizer writes the
 * reference's bytes, on random rows of several scales and on the edge cases
 * (ties between +a and -a for the largest magnitude, zero and tiny blocks,
 * values at the rounding midpoints, F16-range extremes). */
#include "core/cpu.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include "harness.h"

#include <stdint.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

enum { N = 32 * 64 };
static ellm_isa saved_isa;

/* Fills x with pattern p (one of N_PATTERNS). */
enum { N_PATTERNS = 9 };
static void fill(float *x, int p) {
    for (int i = 0; i < N; i++) x[i] = frand();
    switch (p) {
    case 0: break;
    case 1:
        for (int i = 0; i < N; i++) x[i] *= 1e-3f;
        break;
    case 2:
        for (int i = 0; i < N; i++) x[i] *= 60000.0f;
        break;
    case 3: /* ties: +a and -a both the largest magnitude, in either order */
        for (int b = 0; b < N / 32; b++) {
            int i = (b * 7) % 32, j = (b * 13 + 5) % 32;
            if (i == j) j = (j + 1) % 32;
            x[32 * b + i] = (b & 1) ? 1.5f : -1.5f;
            x[32 * b + j] = (b & 1) ? -1.5f : 1.5f;
        }
        break;
    case 4: /* zero blocks, blocks of -0.0 and tiny (subnormal) blocks */
        for (int b = 0; b < N / 32; b++)
            for (int i = 0; i < 32; i++) {
                float *v = &x[32 * b + i];
                if (b % 4 == 0) *v = 0.0f;
                else if (b % 4 == 1) *v = -0.0f;
                else if (b % 4 == 2) *v *= 1e-39f;
                else *v *= 1e-31f;
            }
        break;
    case 5: /* integers: x * id lands on .5 midpoints often */
        for (int i = 0; i < N; i++) x[i] = (float)((int)(x[i] * 16.0f)) * 0.5f;
        break;
    case 6: /* one large value per block */
        for (int b = 0; b < N / 32; b++) x[32 * b + (b % 32)] = (b & 1) ? 40.0f : -40.0f;
        break;
    case 7: /* constant blocks */
        for (int b = 0; b < N / 32; b++)
            for (int i = 0; i < 32; i++) x[32 * b + i] = (float)(b - 32) * 0.25f;
        break;
    default: /* wide dynamic range inside blocks */
        for (int i = 0; i < N; i++) x[i] *= powf(10.0f, (float)(i % 9) - 6.0f);
        break;
    }
}

static void check_type(int type, ellm_isa isa, const char *isa_name) {
    static float x[N];
    static uint8_t want[N * 2], got[N * 2];
    size_t bytes = qtype_row_bytes(type, N);
    for (int p = 0; p < N_PATTERNS; p++) {
        for (int rep = 0; rep < 8; rep++) {
            fill(x, p);
            memset(want, 0xAB, sizeof want);
            memset(got, 0xCD, sizeof got);
            qtype_quantize_ref(type, x, want, N);
            ellm_cpu_set_isa(isa);
            kern_quantize(type, x, got, N);
            ellm_cpu_set_isa(saved_isa);
            CHECK(memcmp(want, got, bytes) == 0, "%s %s pattern %d rep %d differs from the reference",
                  qtype_get(type)->name, isa_name, p, rep);
        }
    }
}

/* kern_first_out_of_range finds the first NaN, infinity or value past the
 * limit wherever it sits (inside a 64-wide step or in the tail). */
static void check_range(void) {
    static float x[1000];
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY, 70000.0f, -65505.0f};
    for (int isa = ELLM_ISA_SCALAR; isa <= (int)ellm_cpu()->best; isa++) {
        ellm_cpu_set_isa((ellm_isa)isa);
        for (int n = 1; n <= 1000; n += 37) {
            for (int i = 0; i < n; i++) x[i] = frand() * 65504.0f;
            x[0] = 65504.0f;
            CHECK(kern_first_out_of_range(x, n, 65504.0f) == -1, "isa %d n %d: clean row flagged", isa, n);
            for (int at = 0; at < n; at += 1 + n / 5) {
                float keep = x[at];
                x[at] = bad[(at + n) % 6];
                if (at + 3 < n) x[at + 3] = bad[(at + n + 1) % 6];
                int64_t got = kern_first_out_of_range(x, n, 65504.0f);
                CHECK(got == at, "isa %d n %d: bad value at %d found at %lld", isa, n, at, (long long)got);
                x[at] = keep;
                if (at + 3 < n) x[at + 3] = 0.5f;
            }
        }
    }
    ellm_cpu_set_isa(saved_isa);
}

int main(void) {
    const ellm_cpu_features *cpu = ellm_cpu();
    saved_isa = ellm_cpu_isa();
    const int types[] = {QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_F16, QTYPE_BF16, QTYPE_Q4_K, QTYPE_Q6_K};
    for (int isa = ELLM_ISA_SCALAR; isa <= ELLM_ISA_AVX512; isa++) {
        const char *name = isa == ELLM_ISA_AVX512 ? "avx512" : isa == ELLM_ISA_AVX2 ? "avx2" : "scalar";
        if (isa > (int)cpu->best) {
            SKIP("kern_quantize on %s: this CPU lacks it", name);
            continue;
        }
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) check_type(types[t], (ellm_isa)isa, name);
    }
    check_range();
    return test_finish();
}
