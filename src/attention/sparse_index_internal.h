/* Private interface between the sparse index driver (sparse_index.c) and its
 * per-ISA kernels (sparse_index_avx2.c, sparse_index_avx512.c); tests use it to
 * compare every kernel with its scalar reference and to read summaries. Not
 * for use outside src/attention and tests.
 *
 * Summaries live in tiles of SPARSE_LANES entries (blocks or super-blocks),
 * channel-major so that one vector holds one channel of 16 entries:
 *     uint16_t lo[head_dim][16], hi[head_dim][16]     (IEEE half bits)
 * A tile is 2 * head_dim * 16 halves (4 KB at head_dim 64). Scoring walks the
 * channels of a tile once and keeps one accumulator per (query row, entry),
 * so there is no horizontal reduction and one load of a channel serves every
 * query row.
 *
 * The bound of entry e for query row r, with q split by its sign bit into
 * qp >= 0 and qn <= 0 (the other one +0), in exactly this order of operations
 * (every kernel, every ISA, same bits):
 *     sp = 0; for c = 0 .. hd-1: sp = fma(qp[r][c], hi[c][e], sp)
 *     sn = 0; for c = 0 .. hd-1: sn = fma(qn[r][c], lo[c][e], sn)
 *     bound = sp + sn          (= sum_c max(q_c * lo_c, q_c * hi_c))
 * Two chains rather than one halve the FMA latency chain. Each operation is
 * monotone in hi (qp >= 0) and in -lo (qn <= 0), so a summary that contains
 * another one bounds it in floating point too, not only in exact arithmetic. */
#ifndef ELLM_ATTENTION_SPARSE_INDEX_INTERNAL_H
#define ELLM_ATTENTION_SPARSE_INDEX_INTERNAL_H

#include "attention/sparse_index.h"

#include <stddef.h>
#include <stdint.h>

#define SPARSE_LANES 16
/* Query rows per kernel call (2 accumulators each, held in registers). */
#define SPARSE_ROWS 8
/* Largest finite half; summaries are clamped to +-this so no bound is NaN. */
#define SPARSE_F16_MAX 65504.0f

/* Bounds of n_tiles consecutive tiles (tile t at tiles + t * 2 * hd * 16):
 * out[t * 16 + e] = max(out[t * 16 + e], max over rows r of bound(r, e)).
 * qpn holds `rows` (1..SPARSE_ROWS) rows of 2 * hd floats: qp[hd] then qn[hd].
 * While a tile is scored the next one is prefetched (a tile is hd cache lines,
 * one per channel step): tile t + 1, or `next` (may be NULL) after the last,
 * so that a walk over scattered tiles does not wait for DRAM at each one. */
typedef void (*sparse_score_fn)(const uint16_t *tiles, int n_tiles, int hd, const float *qpn,
                                int rows, float *out, const uint16_t *next);
void sparse_score_scalar(const uint16_t *tiles, int n_tiles, int hd, const float *qpn, int rows,
                         float *out, const uint16_t *next);
void sparse_score_avx2(const uint16_t *tiles, int n_tiles, int hd, const float *qpn, int rows,
                       float *out, const uint16_t *next);
void sparse_score_avx512(const uint16_t *tiles, int n_tiles, int hd, const float *qpn, int rows,
                         float *out, const uint16_t *next);

/* Folds n key rows (row i at k + i * stride, hd floats) into the running
 * per-channel min `lo` and max `hi`. With f16 set each key is first rounded to
 * half (nearest even, as an F16 cache stores it) so the summary is of the
 * stored keys. min/max as (x < lo ? x : lo), (x > hi ? x : hi). */
typedef void (*sparse_fold_fn)(const float *k, size_t stride, int n, int hd, int f16, float *lo,
                               float *hi);
void sparse_fold_scalar(const float *k, size_t stride, int n, int hd, int f16, float *lo,
                        float *hi);
void sparse_fold_avx2(const float *k, size_t stride, int n, int hd, int f16, float *lo, float *hi);
void sparse_fold_avx512(const float *k, size_t stride, int n, int hd, int f16, float *lo,
                        float *hi);

/* Outward rounding of a summary to half: lo16[c] = the largest half <= lo[c],
 * hi16[c] = the smallest half >= hi[c], after clamping both to
 * [-SPARSE_F16_MAX, SPARSE_F16_MAX]. */
typedef void (*sparse_round_fn)(const float *lo, const float *hi, int hd, uint16_t *lo16,
                                uint16_t *hi16);
void sparse_round_scalar(const float *lo, const float *hi, int hd, uint16_t *lo16, uint16_t *hi16);
void sparse_round_avx2(const float *lo, const float *hi, int hd, uint16_t *lo16, uint16_t *hi16);
void sparse_round_avx512(const float *lo, const float *hi, int hd, uint16_t *lo16, uint16_t *hi16);

/* The summary of block (level 0) or super-block (level 1) `i` of (layer,
 * kv_head) as floats (exact conversions of the stored halves): lo[hd], hi[hd]. */
void sparse_index_summary(const sparse_index *idx, int layer, int kv_head, int level, int i,
                          float *lo, float *hi);

#endif
