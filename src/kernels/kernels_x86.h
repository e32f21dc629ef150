/* Private to src/kernels: small x86 SIMD helpers shared by kernels_avx2.c
 * and kernels_avx512.c. Include only from files compiled with at least
 * -mavx2 -mfma -mf16c (the Makefile's *_avx2.c / *_avx512.c rule). */
#ifndef ELLM_KERNELS_KERNELS_X86_H
#define ELLM_KERNELS_KERNELS_X86_H

#include "kernels/kernels_impl.h"

#include <immintrin.h>

#include "kernels/vec_exp.h"
#include <stdint.h>

#define INLINE static inline __attribute__((always_inline))

INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

INLINE float f16_to_f32(ellm_f16 h) { return _cvtsh_ss(h); }

/* ---- weight stream prefetch ----
 * Weights stream from DRAM through 4 KB pages (the model file is mapped
 * without huge pages). The hardware prefetcher stops at each page boundary
 * and the next page starts with a TLB miss, which caps a plain read loop at
 * ~17 GB/s where huge pages give ~29 on Zen 4. Touching each page once,
 * KERN_PF_AHEAD bytes before the stream gets there, starts its walk and
 * first lines early (~23 GB/s for the same loop; 8-64 KB ahead all do
 * about as well). Prefetching every line 1-4 KB ahead measured worse than
 * none (13-17 GB/s). Prefetches never fault, so running past the matrix end
 * is harmless. */
enum { KERN_PF_AHEAD = 16384 };

/* Touches the pages that start in [p, p + n) shifted KERN_PF_AHEAD ahead:
 * called for consecutive pieces of a stream, each page once. */
INLINE void kern_pf_pages(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p + KERN_PF_AHEAD, e = a + n;
    for (uintptr_t q = (a + 4095) & ~(uintptr_t)4095; q < e; q += 4096) _mm_prefetch((const char *)q, _MM_HINT_T0);
}

/* Single-row (decode) matmuls also prefetch every line KERN_PF_LINE_AHEAD
 * bytes ahead (the AVX-512 kernels) or KERN_PF_LINE_AHEAD_AVX2 (the AVX2
 * ones, which also serve AVX-512 machines for the types without a VNNI
 * kernel). One activation row gives the weight stream little work per
 * byte, yet the kernel's dependency chains fill the scheduler before the
 * loads run far ahead, so the hardware prefetchers alone keep too few lines
 * in flight: on the Ice Lake-SP guest a SmolLM2-135M weight pass (Q8_0, 2
 * threads, rows split as in decode) read at 73-86% of a same-run stream
 * read with the page touches alone and at 94-101% with lines prefetched
 * 6 KB ahead (3-12 KB all did about as well). On a Zen 3 guest (AVX2 only)
 * 16 KB decoded faster than 6 KB and 32 KB faster than 16 KB, 64 KB no
 * faster than 32 (ellm bench, builds alternated round by round, 5-8 rounds:
 * a Llama-3.2-1B Q4_K_M file 1.13x and 1.25x at 2 and 1 threads for 32 KB
 * against 6 KB, SmolLM2-135M Q8_0 the paired bandwidth share 0.76-0.80
 * against 0.70-0.72 on 2 threads; bench/AVX2.md). */
enum { KERN_PF_LINE_AHEAD = 6144, KERN_PF_LINE_AHEAD_AVX2 = 32768 };

/* Prefetches (into L1) the lines of [p, p + n) shifted KERN_PF_LINE_AHEAD
 * ahead: called for consecutive pieces of a stream. */
INLINE void kern_pf_lines(const void *p, size_t n) {
    uintptr_t a = ((uintptr_t)p + KERN_PF_LINE_AHEAD) & ~(uintptr_t)63, e = (uintptr_t)p + KERN_PF_LINE_AHEAD + n;
    for (uintptr_t q = a; q < e; q += 64) _mm_prefetch((const char *)q, _MM_HINT_T0);
}

/* kern_pf_lines for one block of a row kernel's decode loop, of n bytes (a
 * constant): (n + 63) / 64 prefetches from p + ahead (KERN_PF_LINE_AHEAD or
 * KERN_PF_LINE_AHEAD_AVX2, as the kernel's ISA), with no
 * loop. Each covers its block's bytes (a line the last one misses is the
 * next block's first); called per Q4_K / Q6_K block, kern_pf_lines' loop
 * measured 4-13% slower in bench_kernels (Zen 5 guest, one thread). */
INLINE void kern_pf_block(const void *p, const int n, const int ahead) {
    const char *pf = (const char *)p + ahead;
#pragma GCC unroll 8
    for (int i = 0; i < (n + 63) / 64; i++) _mm_prefetch(pf + 64 * i, _MM_HINT_T0);
}

/* At the start of a stream at p: its first KERN_PF_AHEAD bytes' pages. */
INLINE void kern_pf_start(const void *p) {
    for (size_t o = 0; o < KERN_PF_AHEAD; o += 4096) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

/* *acc += x with the sums kept in program order: gcc otherwise reassociates
 * a kernel's chain of integer adds into a tree whose partial sums go to the
 * stack and back (the sums are exact, so either order gives the same bits;
 * this one keeps them in registers). */
INLINE void acc_add_epi32(__m256i *acc, __m256i x) {
    *acc = _mm256_add_epi32(*acc, x);
    __asm__("" : "+x"(*acc));
}

/* Packs 4 x 8 int32 (values in int8 range) into 32 int8 in order. */
INLINE __m256i pack_epi32_epi8(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i v = _mm256_packs_epi16(ab, cd); /* lanes interleaved by 4 ints */
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}


/* The 8 scales and 8 mins of a Q4_K block as bytes [sc0..7, m0..7]: the
 * word operations of q4k_unpack_scales on 32-bit lanes, kept in a register
 * (reads 16 bytes at `scales`: the 12 scale bytes and 4 bytes of qs). */
INLINE __m128i q4k_scales_vec(const uint8_t *scales) {
    __m128i u = _mm_loadu_si128((const __m128i *)scales); /* u0 u1 u2 - */
    __m128i lo6 = _mm_and_si128(u, _mm_set1_epi32(0x3f3f3f3f)); /* sc0-3, m0-3 */
    __m128i top2 = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(u, 6), _mm_set1_epi32(0x03030303)), 4);
    __m128i nib = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(u, 0xAA), _mm_setr_epi32(0, 4, 0, 4)),
                                _mm_set1_epi32(0x0f0f0f0f));
    __m128i hi = _mm_or_si128(nib, top2); /* sc4-7, m4-7 */
    return _mm_unpacklo_epi32(lo6, hi);
}

/* The K-quants with sub-blocks of 16 that share Q6_K's per-row and batch
 * kernels (Q6_K, Q3_K): a super-block's bytes, and its f16 scale d. */
INLINE size_t kq16_block_bytes(const int T) { return T == QTYPE_Q3_K ? sizeof(block_q3_K) : sizeof(block_q6_K); }
INLINE uint16_t kq16_d(const void *blk, const int T) {
    return T == QTYPE_Q3_K ? ((const block_q3_K *)blk)->d : ((const block_q6_K *)blk)->d;
}

/* The low 4 bits of a Q3_K block's 16 scales (q3k_scale's bit fields) as
 * int16 lanes: sub-blocks 0-7 in the low nibbles of bytes 0-7, 8-15 in their
 * high nibbles. Each ISA's q3k_scales16 adds the high 2 bits. */
INLINE __m256i q3k_scales_lo16(const uint8_t *s) {
    uint64_t lo8;
    memcpy(&lo8, s, 8);
    const __m128i m4 = _mm_set1_epi8(0xF), x = _mm_cvtsi64_si128((long long)lo8);
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4)));
}

#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* The 16 signed scales (6-bit, - 32) of a Q3_K block as int16 lanes:
 * q3k_scale's bit fields taken by vector shifts (per sub-block scalar
 * extraction cost more than the block's arithmetic in decode). AVX-512's
 * per-row and batch kernels; kernels_avx2.c has its own, with 32-bit
 * shifts. */
INLINE __m256i q3k_scales16(const uint8_t *s) {
    uint32_t hi4;
    memcpy(&hi4, s + 8, 4);
    const __m256i lo = q3k_scales_lo16(s);
    /* high 2 bits: bits 2 (is / 4) of byte 8 + is % 4 */
    const __m256i shifts = _mm256_setr_epi16(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi16(_mm256_cvtepu8_epi16(_mm_set1_epi32((int)hi4)), shifts),
                                        _mm256_set1_epi16(3));
    return _mm256_sub_epi16(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi16(32));
}
#endif

/* Q6_K: the 32 6-bit quants (0..63) of elements 32kk .. 32kk+31 of the half
 * whose ql / qh start at `ql` / `qh`, rebuilt from ql nibbles and qh bit
 * pairs by 16-bit shifts (bits leaking across bytes are masked off). */
INLINE __m256i q6k_quarter(const uint8_t *ql, const uint8_t *qh, int kk) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * (kk & 1)));
    __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
    __m256i lo = kk < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
    __m256i hi;
    switch (kk) {
    case 0: hi = _mm256_slli_epi16(hb, 4); break;
    case 1: hi = _mm256_slli_epi16(hb, 2); break;
    case 2: hi = hb; break;
    default: hi = _mm256_srli_epi16(hb, 2); break;
    }
    return _mm256_or_si256(lo, _mm256_and_si256(hi, m30));
}

#ifdef __AVX512BW__
/* iq4_values + 128 as bytes, in every 128-bit lane (a vpshufb table: code ->
 * unsigned value for vpdpbusd, the offset taken off as Q8_0's). */
INLINE __m512i iq4_lut_u8(void) {
    return _mm512_broadcast_i32x4(_mm_xor_si128(_mm_loadu_si128((const __m128i *)iq4_values), _mm_set1_epi8((char)0x80)));
}
#endif

#endif
