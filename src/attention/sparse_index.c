/* Sparse KV index: summaries, incremental maintenance, truncation, selection,
 * recall, and the scalar references of the per-ISA kernels.
 *
 * Storage per (layer, KV head), see sparse_index_internal.h for a tile:
 *     blk  n_superblocks * superblock_blocks / 16 tiles: block summaries
 *     sb   ceil(n_superblocks / 16) tiles: super-block summaries
 *     open lo[hd], hi[hd] F32: running min/max of the keys of the block holding
 *          the layer's last position (exact; rounded outward into the tile
 *          lane after every append)
 * Tiles are in two anonymous mappings, zero (bound 0) until first written, so
 * an index sized for a long context costs memory only as the context grows.
 *
 * Scratch per (layer, KV head), used only by select (so different pairs can
 * select concurrently): bounds of scored super-blocks and blocks, the scored
 * candidate blocks, the ordered list of super-blocks to expand, and a bitmap
 * that emits the chosen blocks in ascending order without sorting. */
#include "attention/sparse_index.h"
#include "core/prefetch.h"
#include "attention/sparse_index_internal.h"
#include "core/cpu.h"
#include "core/fp16.h"
#include "core/status.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SPARSE_MAX_SB_BLOCKS 1024
/* Super-blocks expanded at least, so that a few strong blocks scattered over
 * distinct super-blocks are found even when the budget wants few blocks. */
#define SPARSE_MIN_EXPAND 4
/* qp/qn of this many floats are prepared on the stack per pass (32 KB). */
#define SPARSE_QPN_FLOATS 8192

struct sparse_index {
    sparse_index_params p;
    int hd, bt, S;        /* head_dim, block_tokens, superblock_blocks */
    int n_blocks;         /* blocks per (layer, head): ceil(n_ctx / bt) */
    int n_sb;             /* super-blocks per (layer, head) */
    int n_blk_tiles, n_sb_tiles;
    size_t tile_elems;    /* halves per tile: 2 * hd * 16 */
    size_t blk_map_bytes, sb_map_bytes; /* bytes of tiles */
    void *blk_map, *sb_map;              /* the mappings holding them */
    size_t blk_map_len, sb_map_len;
    uint16_t *blk;        /* [layer][head][n_blk_tiles] tiles */
    uint16_t *sb;         /* [layer][head][n_sb_tiles] tiles */
    float *open;          /* [layer][head][2][hd] */
    int *len;             /* [layer]: positions appended */
    char *scratch;        /* [layer][head] x scratch_bytes */
    size_t scratch_bytes;
};

/* Scratch of one (layer, head), carved from idx->scratch. */
typedef struct {
    float *sbb;    /* n_sb_tiles * 16: super-block bounds, by super-block index */
    float *blkb;   /* n_blk_tiles * 16: block bounds (exhaustive path), by block index */
    int32_t *ck;   /* n_blocks: keys (order-preserving ints) of the scored candidate blocks */
    int32_t *ci;   /* n_blocks: their block indices */
    float *eb;     /* n_sb: super-blocks to expand, bounds descending */
    int32_t *ei;   /* n_sb: their indices */
    uint64_t *bits;/* ceil(n_blocks / 64): chosen blocks */
} select_scratch;

/* ---- scalar references -------------------------------------------------- */

void sparse_score_scalar(const uint16_t *tiles, int n_tiles, int hd, const float *qpn, int rows,
                         float *out, const uint16_t *next) {
    (void)next;
    for (int t = 0; t < n_tiles; t++) {
        const uint16_t *lo = tiles + (size_t)t * 2 * hd * SPARSE_LANES;
        const uint16_t *hi = lo + (size_t)hd * SPARSE_LANES;
        for (int e = 0; e < SPARSE_LANES; e++) {
            float best = out[t * SPARSE_LANES + e];
            for (int r = 0; r < rows; r++) {
                const float *qp = qpn + (size_t)r * 2 * hd, *qn = qp + hd;
                float sp = 0.0f, sn = 0.0f;
                for (int c = 0; c < hd; c++) {
                    sp = fmaf(qp[c], ellm_f16_to_f32(hi[c * SPARSE_LANES + e]), sp);
                    sn = fmaf(qn[c], ellm_f16_to_f32(lo[c * SPARSE_LANES + e]), sn);
                }
                float b = sp + sn;
                best = b > best ? b : best;
            }
            out[t * SPARSE_LANES + e] = best;
        }
    }
}

void sparse_fold_scalar(const float *k, size_t stride, int n, int hd, int f16, float *lo,
                        float *hi) {
    for (int i = 0; i < n; i++) {
        const float *row = k + (size_t)i * stride;
        for (int c = 0; c < hd; c++) {
            float x = f16 ? ellm_f16_to_f32(ellm_f32_to_f16(row[c])) : row[c];
            lo[c] = x < lo[c] ? x : lo[c];
            hi[c] = x > hi[c] ? x : hi[c];
        }
    }
}

/* Neighbours of a finite half (as bits) towards -inf / +inf. */
static ellm_f16 f16_prev(ellm_f16 h) {
    if (h == 0x0000) return 0x8001; /* +0 -> the negative subnormal nearest zero */
    return (h & 0x8000) ? (ellm_f16)(h + 1) : (ellm_f16)(h - 1);
}
static ellm_f16 f16_next(ellm_f16 h) {
    if (h == 0x8000) return 0x0001;
    return (h & 0x8000) ? (ellm_f16)(h - 1) : (ellm_f16)(h + 1);
}

static float clamp_f16_range(float x) {
    x = x > -SPARSE_F16_MAX ? x : -SPARSE_F16_MAX; /* also maps NaN to -max */
    return x < SPARSE_F16_MAX ? x : SPARSE_F16_MAX;
}

void sparse_round_scalar(const float *lo, const float *hi, int hd, uint16_t *lo16, uint16_t *hi16) {
    for (int c = 0; c < hd; c++) {
        float a = clamp_f16_range(lo[c]), b = clamp_f16_range(hi[c]);
        ellm_f16 l = ellm_f32_to_f16(a), h = ellm_f32_to_f16(b);
        if (ellm_f16_to_f32(l) > a) l = f16_prev(l);
        if (ellm_f16_to_f32(h) < b) h = f16_next(h);
        lo16[c] = l;
        hi16[c] = h;
    }
}

static const sparse_score_fn score_fns[] = {
    [ELLM_ISA_SCALAR] = sparse_score_scalar,
    [ELLM_ISA_AVX2] = sparse_score_avx2,
    [ELLM_ISA_AVX512] = sparse_score_avx512,
};
static const sparse_fold_fn fold_fns[] = {
    [ELLM_ISA_SCALAR] = sparse_fold_scalar,
    [ELLM_ISA_AVX2] = sparse_fold_avx2,
    [ELLM_ISA_AVX512] = sparse_fold_avx512,
};
static const sparse_round_fn round_fns[] = {
    [ELLM_ISA_SCALAR] = sparse_round_scalar,
    [ELLM_ISA_AVX2] = sparse_round_avx2,
    [ELLM_ISA_AVX512] = sparse_round_avx512,
};

/* ---- lifecycle ---------------------------------------------------------- */

#define HUGE_PAGE ((size_t)2 << 20)

/* A zero-filled anonymous mapping of `bytes`, 2 MB aligned and marked for
 * transparent huge pages when large: selection touches tiles scattered over
 * the whole index, and with 4 KB pages every tile would be a TLB miss (and a
 * page walk a prefetch may not survive). *base and *len receive the mapping
 * to munmap. */
static void *map_zero(size_t bytes, void **base, size_t *len) {
    size_t n = bytes >= HUGE_PAGE ? bytes + HUGE_PAGE : bytes;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    *base = p;
    *len = n;
    if (n == bytes) return p;
    char *a = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
    madvise(a, (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    return a;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

ellm_status sparse_index_init(const sparse_index_params *p, sparse_index **out, ellm_error *err) {
    *out = NULL;
    sparse_index_params q = *p;
    if (q.superblock_blocks == 0) q.superblock_blocks = 16;
    if (q.expand == 0.0f) q.expand = 2.0f;
    if (q.n_layer <= 0 || q.n_kv_head <= 0 || q.head_dim <= 0 || q.n_ctx <= 0 ||
        q.block_tokens <= 0 || q.n_layer > 4096 || q.n_kv_head > 4096 || q.block_tokens > 4096)
        return ellm_fail(err, ELLM_ERR_ARG,
                         "sparse index: n_layer=%d n_kv_head=%d head_dim=%d n_ctx=%d "
                         "block_tokens=%d must be positive (and sane)",
                         q.n_layer, q.n_kv_head, q.head_dim, q.n_ctx, q.block_tokens);
    if (q.superblock_blocks < 0 || q.superblock_blocks % SPARSE_LANES ||
        q.superblock_blocks > SPARSE_MAX_SB_BLOCKS)
        return ellm_fail(err, ELLM_ERR_ARG,
                         "sparse index: superblock_blocks=%d must be a multiple of %d up to %d",
                         q.superblock_blocks, SPARSE_LANES, SPARSE_MAX_SB_BLOCKS);
    if (!(q.expand > 0.0f) || q.expand > 1e6f)
        return ellm_fail(err, ELLM_ERR_ARG, "sparse index: expand=%g must be positive",
                         (double)q.expand);
    if (q.head_dim > SPARSE_MAX_HEAD_DIM)
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED, "sparse index: head_dim=%d exceeds %d",
                         q.head_dim, SPARSE_MAX_HEAD_DIM);
    if (q.key_type != QTYPE_F32 && q.key_type != QTYPE_F16)
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "sparse index: key type %d unsupported (F32=%d or F16=%d)", q.key_type,
                         QTYPE_F32, QTYPE_F16);

    sparse_index *idx = calloc(1, sizeof *idx);
    if (!idx) return ellm_fail(err, ELLM_ERR_NOMEM, "sparse index: out of memory");
    idx->p = q;
    idx->hd = q.head_dim;
    idx->bt = q.block_tokens;
    idx->S = q.superblock_blocks;
    idx->n_blocks = (int)(((long)q.n_ctx + q.block_tokens - 1) / q.block_tokens);
    idx->n_sb = (idx->n_blocks + idx->S - 1) / idx->S;
    /* Whole super-blocks of tiles, so expanding the last one stays inside. */
    idx->n_blk_tiles = idx->n_sb * (idx->S / SPARSE_LANES);
    idx->n_sb_tiles = (idx->n_sb + SPARSE_LANES - 1) / SPARSE_LANES;
    idx->tile_elems = (size_t)2 * (size_t)q.head_dim * SPARSE_LANES;
    const size_t pairs = (size_t)q.n_layer * (size_t)q.n_kv_head;
    const size_t tile_bytes = idx->tile_elems * sizeof(uint16_t);
    idx->blk_map_bytes = pairs * (size_t)idx->n_blk_tiles * tile_bytes;
    idx->sb_map_bytes = pairs * (size_t)idx->n_sb_tiles * tile_bytes;
    const size_t nb = (size_t)idx->n_blocks, nsb = (size_t)idx->n_sb;
    idx->scratch_bytes = align64((size_t)idx->n_sb_tiles * SPARSE_LANES * 4) +
                         align64((size_t)idx->n_blk_tiles * SPARSE_LANES * 4) +
                         2 * align64(nb * 4) + 2 * align64(nsb * 4) + align64((nb + 63) / 64 * 8);
    idx->blk = map_zero(idx->blk_map_bytes, &idx->blk_map, &idx->blk_map_len);
    idx->sb = map_zero(idx->sb_map_bytes, &idx->sb_map, &idx->sb_map_len);
    idx->open = malloc(pairs * 2 * (size_t)q.head_dim * sizeof(float));
    idx->len = calloc((size_t)q.n_layer, sizeof(int));
    if (posix_memalign((void **)&idx->scratch, 64, pairs * idx->scratch_bytes) != 0)
        idx->scratch = NULL;
    if (!idx->blk || !idx->sb || !idx->open || !idx->len || !idx->scratch) {
        double mb = (double)(idx->blk_map_bytes + idx->sb_map_bytes +
                             pairs * idx->scratch_bytes) / 1e6;
        sparse_index_free(idx);
        return ellm_fail(err, ELLM_ERR_NOMEM, "sparse index: cannot allocate %.1f MB", mb);
    }
    /* The chosen-block bitmaps must start clear (select leaves them clear). */
    memset(idx->scratch, 0, pairs * idx->scratch_bytes);
    *out = idx;
    return ELLM_OK;
}

void sparse_index_free(sparse_index *idx) {
    if (!idx) return;
    if (idx->blk) munmap(idx->blk_map, idx->blk_map_len);
    if (idx->sb) munmap(idx->sb_map, idx->sb_map_len);
    free(idx->open);
    free(idx->len);
    free(idx->scratch);
    free(idx);
}

size_t sparse_index_bytes(const sparse_index *idx) {
    size_t pairs = (size_t)idx->p.n_layer * (size_t)idx->p.n_kv_head;
    return idx->blk_map_bytes + idx->sb_map_bytes + pairs * idx->scratch_bytes +
           pairs * 2 * (size_t)idx->hd * sizeof(float);
}

/* ---- summaries ---------------------------------------------------------- */

static size_t pair_of(const sparse_index *idx, int layer, int head) {
    return (size_t)layer * (size_t)idx->p.n_kv_head + (size_t)head;
}

static uint16_t *blk_tiles(const sparse_index *idx, int layer, int head) {
    return idx->blk + pair_of(idx, layer, head) * (size_t)idx->n_blk_tiles * idx->tile_elems;
}

static uint16_t *sb_tiles(const sparse_index *idx, int layer, int head) {
    return idx->sb + pair_of(idx, layer, head) * (size_t)idx->n_sb_tiles * idx->tile_elems;
}

static float *open_state(const sparse_index *idx, int layer, int head) {
    return idx->open + pair_of(idx, layer, head) * 2 * (size_t)idx->hd;
}

/* lo lane of entry i in an array of tiles (hi lane at + hd * 16). */
static uint16_t *lane(const sparse_index *idx, uint16_t *tiles, int i) {
    return tiles + (size_t)(i / SPARSE_LANES) * idx->tile_elems + i % SPARSE_LANES;
}

/* Order-preserving map of half bits to unsigned (so min/max need no conversion). */
static inline unsigned f16_key(uint16_t h) {
    return (h & 0x8000) ? (uint16_t)~h : (unsigned)h | 0x8000u;
}

void sparse_index_summary(const sparse_index *idx, int layer, int kv_head, int level, int i,
                          float *lo, float *hi) {
    ELLM_ASSERT(layer >= 0 && layer < idx->p.n_layer && kv_head >= 0 &&
                kv_head < idx->p.n_kv_head && i >= 0 &&
                i < (level ? idx->n_sb : idx->n_blocks));
    uint16_t *t = level ? sb_tiles(idx, layer, kv_head) : blk_tiles(idx, layer, kv_head);
    const uint16_t *l = lane(idx, t, i), *h = l + (size_t)idx->hd * SPARSE_LANES;
    for (int c = 0; c < idx->hd; c++) {
        lo[c] = ellm_f16_to_f32(l[c * SPARSE_LANES]);
        hi[c] = ellm_f16_to_f32(h[c * SPARSE_LANES]);
    }
}

/* Writes the outward-rounded open state of (layer, head) as block blk's
 * summary and folds it into its super-block (which it starts, if blk is the
 * super-block's first block). */
static void flush_block(sparse_index *idx, int layer, int head, int blk) {
    const int hd = idx->hd;
    const float *st = open_state(idx, layer, head);
    uint16_t lo16[SPARSE_MAX_HEAD_DIM], hi16[SPARSE_MAX_HEAD_DIM];
    round_fns[ellm_cpu_isa()](st, st + hd, hd, lo16, hi16);
    uint16_t *bl = lane(idx, blk_tiles(idx, layer, head), blk), *bh = bl + (size_t)hd * SPARSE_LANES;
    uint16_t *sl = lane(idx, sb_tiles(idx, layer, head), blk / idx->S);
    uint16_t *sh = sl + (size_t)hd * SPARSE_LANES;
    const int first = blk % idx->S == 0;
    for (int c = 0; c < hd; c++) {
        size_t o = (size_t)c * SPARSE_LANES;
        bl[o] = lo16[c];
        bh[o] = hi16[c];
        if (first || f16_key(lo16[c]) < f16_key(sl[o])) sl[o] = lo16[c];
        if (first || f16_key(hi16[c]) > f16_key(sh[o])) sh[o] = hi16[c];
    }
}

static void open_reset(float *st, int hd) {
    for (int c = 0; c < hd; c++) {
        st[c] = INFINITY;
        st[hd + c] = -INFINITY;
    }
}

void sparse_index_append(sparse_index *idx, int layer, int pos, int n, const float *k) {
    ELLM_ASSERT(layer >= 0 && layer < idx->p.n_layer);
    ELLM_ASSERT(pos == idx->len[layer] && n >= 0 && pos <= idx->p.n_ctx - n);
    const int hd = idx->hd, bt = idx->bt, nkv = idx->p.n_kv_head;
    const int f16 = idx->p.key_type == QTYPE_F16;
    const size_t row = (size_t)nkv * (size_t)hd;
    const sparse_fold_fn fold = fold_fns[ellm_cpu_isa()];
    for (int t = 0; t < n;) {
        const int p = pos + t, blk = p / bt, off = p % bt;
        const int m = n - t < bt - off ? n - t : bt - off; /* tokens of this block */
        for (int h = 0; h < nkv; h++) {
            float *st = open_state(idx, layer, h);
            if (off == 0) open_reset(st, hd);
            fold(k + (size_t)t * row + (size_t)h * hd, row, m, hd, f16, st, st + hd);
            flush_block(idx, layer, h, blk);
        }
        t += m;
    }
    idx->len[layer] = pos + n;
}

void sparse_index_truncate(sparse_index *idx, const kv_cache *kv, int n_keep) {
    const kv_cache_params *kp = kv_cache_get_params(kv);
    ELLM_ASSERT(kp->n_layer == idx->p.n_layer && kp->n_kv_head == idx->p.n_kv_head &&
                kp->head_dim == idx->hd && kp->block_tokens == idx->bt &&
                (kp->type == idx->p.key_type || (kp->type == QTYPE_Q8_0 && idx->p.key_type == QTYPE_F32)) &&
                kp->n_ctx >= n_keep);
    ELLM_ASSERT(n_keep >= 0);
    const int hd = idx->hd, bt = idx->bt, S = idx->S;
    const sparse_fold_fn fold = fold_fns[ellm_cpu_isa()];
    float row[SPARSE_MAX_HEAD_DIM];
    for (int l = 0; l < idx->p.n_layer; l++) {
        ELLM_ASSERT(n_keep <= idx->len[l]);
        if (n_keep == idx->len[l]) continue;
        const int nbk = (n_keep + bt - 1) / bt; /* blocks kept */
        for (int h = 0; h < idx->p.n_kv_head; h++) {
            if (n_keep % bt) { /* the partial last block, from the stored keys */
                const int blk = n_keep / bt;
                float *st = open_state(idx, l, h);
                open_reset(st, hd);
                for (int pos = blk * bt; pos < n_keep; pos++) {
                    kv_cache_key(kv, l, h, pos, row);
                    fold(row, 0, 1, hd, 0, st, st + hd); /* already as stored */
                }
                flush_block(idx, l, h, blk);
            }
            if (nbk == 0) continue;
            /* The last kept super-block: the min/max of its kept blocks. */
            const int sbi = (nbk - 1) / S;
            uint16_t *sl = lane(idx, sb_tiles(idx, l, h), sbi), *sh = sl + (size_t)hd * SPARSE_LANES;
            uint16_t *bt0 = blk_tiles(idx, l, h);
            for (int b = sbi * S; b < nbk; b++) {
                const uint16_t *bl = lane(idx, bt0, b), *bh = bl + (size_t)hd * SPARSE_LANES;
                for (int c = 0; c < hd; c++) {
                    size_t o = (size_t)c * SPARSE_LANES;
                    if (b == sbi * S || f16_key(bl[o]) < f16_key(sl[o])) sl[o] = bl[o];
                    if (b == sbi * S || f16_key(bh[o]) > f16_key(sh[o])) sh[o] = bh[o];
                }
            }
        }
        idx->len[l] = n_keep;
    }
}

/* ---- selection ---------------------------------------------------------- */

static select_scratch scratch_of(const sparse_index *idx, int layer, int head) {
    char *p = idx->scratch + pair_of(idx, layer, head) * idx->scratch_bytes;
    const size_t nb = (size_t)idx->n_blocks, nsb = (size_t)idx->n_sb;
    select_scratch s;
    s.sbb = (float *)p;
    p += align64((size_t)idx->n_sb_tiles * SPARSE_LANES * 4);
    s.blkb = (float *)p;
    p += align64((size_t)idx->n_blk_tiles * SPARSE_LANES * 4);
    s.ck = (int32_t *)p;
    p += align64(nb * 4);
    s.ci = (int32_t *)p;
    p += align64(nb * 4);
    s.eb = (float *)p;
    p += align64(nsb * 4);
    s.ei = (int32_t *)p;
    p += align64(nsb * 4);
    s.bits = (uint64_t *)p;
    return s;
}

/* The query rows of one selection and how to score tiles with them. Row
 * r = i * group + g is query token i, head g of the KV head's group. */
typedef struct {
    const float *q;
    int n_head, head0, group, rows, hd;
    sparse_score_fn score;
    float *qpn;     /* prepared rows [prep0, prep0 + prep_n): qp[hd], qn[hd] each */
    int per_pass;   /* rows that fit in qpn */
    int prep0, prep_n;
} query_rows;

static void prepare_rows(query_rows *Q, int r0) {
    const int hd = Q->hd;
    int n = Q->rows - r0 < Q->per_pass ? Q->rows - r0 : Q->per_pass;
    for (int r = 0; r < n; r++) {
        int i = (r0 + r) / Q->group, g = (r0 + r) % Q->group;
        const float *src = Q->q + ((size_t)i * Q->n_head + (size_t)Q->head0 + g) * hd;
        float *qp = Q->qpn + (size_t)r * 2 * hd, *qn = qp + hd;
        /* Split by the sign bit, without branches (signs are random). */
        for (int c = 0; c < hd; c++) {
            uint32_t b, neg, p_, n_;
            memcpy(&b, &src[c], 4);
            neg = (uint32_t)((int32_t)b >> 31);
            p_ = b & ~neg;
            n_ = b & neg;
            memcpy(&qp[c], &p_, 4);
            memcpy(&qn[c], &n_, 4);
        }
    }
    Q->prep0 = r0;
    Q->prep_n = n;
}

/* out[0 .. n_tiles * 16) = bounds of the tiles' entries, max over all rows;
 * `next` (or NULL) is the tile the caller reads next, to prefetch. */
static void score_tiles(query_rows *Q, const uint16_t *tiles, int n_tiles, float *out,
                        const uint16_t *next) {
    for (int i = 0; i < n_tiles * SPARSE_LANES; i++) out[i] = -INFINITY;
    for (int r0 = 0; r0 < Q->rows; r0 += Q->per_pass) {
        if (Q->prep0 != r0) prepare_rows(Q, r0); /* only when rows exceed one pass */
        for (int r = 0; r < Q->prep_n; r += SPARSE_ROWS) {
            int last = r0 + r + SPARSE_ROWS >= Q->rows; /* the final pass prefetches */
            Q->score(tiles, n_tiles, Q->hd, Q->qpn + (size_t)r * 2 * Q->hd,
                     Q->prep_n - r < SPARSE_ROWS ? Q->prep_n - r : SPARSE_ROWS, out,
                     last ? next : tiles);
        }
    }
}

/* Order-preserving map of a float to a signed int (-0 just below +0). */
static inline int32_t f32_key(float x) {
    int32_t b;
    memcpy(&b, &x, 4);
    return b ^ (int32_t)((uint32_t)(b >> 31) >> 1);
}

/* Number of keys >= t, without branches (the inner loop vectorizes). */
static int count_ge(const int32_t *key, int m, int32_t t) {
    int cnt = 0, i = 0;
    for (; i + 16 <= m; i += 16) {
        int c = 0;
        for (int j = 0; j < 16; j++) c += key[i + j] >= t;
        cnt += c;
    }
    for (; i < m; i++) cnt += key[i] >= t;
    return cnt;
}

/* Marks the k best of the m scored candidates in the bitmap: every key above
 * the k-th largest, then ties at it in candidate order. The k-th largest is
 * found by bisecting the key range with counting passes: ~log2(range) passes
 * of m compares and no data-dependent branches, where a heap or quickselect
 * would mispredict on about every other candidate. */
static void mark_best(const int32_t *key, const int32_t *idx, int m, int k, uint64_t *bits) {
    int32_t kmin = key[0], kmax = key[0];
    for (int i = 1; i < m; i++) {
        kmin = key[i] < kmin ? key[i] : kmin;
        kmax = key[i] > kmax ? key[i] : kmax;
    }
    /* Invariant: c_lo = count(>= lo) >= k > c_hi = count(>= hi). Bisect until
     * at most 16 keys lie in [lo, hi), then finish among those by sorting. */
    int64_t lo = kmin, hi = (int64_t)kmax + 1;
    int c_lo = m, c_hi = 0;
    while (hi - lo > 1 && c_lo - c_hi > 16) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = count_ge(key, m, (int32_t)mid);
        if (c >= k) lo = mid, c_lo = c;
        else hi = mid, c_hi = c;
    }
    int32_t t = (int32_t)lo;
    if (hi - lo > 1) {
        int32_t in[16];
        int n = 0;
        for (int i = 0; i < m && n < 16; i++)
            if (key[i] >= lo && key[i] < hi) in[n++] = key[i];
        for (int i = 1; i < n; i++) /* descending */
            for (int j = i; j > 0 && in[j - 1] < in[j]; j--) {
                int32_t x = in[j];
                in[j] = in[j - 1];
                in[j - 1] = x;
            }
        t = in[k - c_hi - 1];
    }
    int ties = k - (t == INT32_MAX ? 0 : count_ge(key, m, t + 1));
    /* Candidates come in runs of consecutive blocks: gather a word of the
     * bitmap in a register while the run stays inside it. */
    int w = idx[0] >> 6;
    uint64_t word = 0;
    for (int i = 0; i < m; i++) {
        int eq = key[i] == t, take = (key[i] > t) | (eq & (ties > 0));
        ties -= eq & take;
        if (idx[i] >> 6 != w) {
            bits[w] |= word;
            w = idx[i] >> 6;
            word = 0;
        }
        word |= (uint64_t)take << (idx[i] & 63);
    }
    bits[w] |= word;
}


/* Chooses the k best blocks of [c0, c1) (0 < k < c1 - c0) into the bitmap. */
static void choose_blocks(sparse_index *idx, int layer, int head, query_rows *Q, int c0, int c1,
                          int k, select_scratch *X, sparse_select_stats *stats) {
    const int S = idx->S, tpsb = S / SPARSE_LANES;
    const int64_t tile_bytes = (int64_t)(idx->tile_elems * sizeof(uint16_t));
    const int s0 = c0 / S, s1 = (c1 - 1) / S, nsb = s1 - s0 + 1;
    const float e = ceilf(idx->p.expand * (float)k / (float)S);
    int E = e >= (float)nsb ? nsb : (int)e;
    if (E < SPARSE_MIN_EXPAND) E = SPARSE_MIN_EXPAND;
    int m = 0; /* scored candidates in X->ck, X->ci */
    const uint16_t *bt0 = blk_tiles(idx, layer, head);
    int64_t sb_scored = 0, blk_scored = 0, expanded = 0, bytes = 0;
    int exact = 1;

    if (E >= nsb) {
        /* Expanding that many super-blocks would read every block anyway. */
        const int t0 = c0 / SPARSE_LANES, t1 = (c1 - 1) / SPARSE_LANES;
        score_tiles(Q, bt0 + (size_t)t0 * idx->tile_elems, t1 - t0 + 1,
                    X->blkb + (size_t)t0 * SPARSE_LANES, NULL);
        for (int b = c0; b < c1; b++, m++) {
            X->ck[m] = f32_key(X->blkb[b]);
            X->ci[m] = b;
        }
        blk_scored = (int64_t)(t1 - t0 + 1) * SPARSE_LANES;
        bytes = (int64_t)(t1 - t0 + 1) * tile_bytes;
    } else {
        const int t0 = s0 / SPARSE_LANES, t1 = s1 / SPARSE_LANES;
        float *sbb = X->sbb;
        prefetch_range_l1(sb_tiles(idx, layer, head) + (size_t)t0 * idx->tile_elems,
                       (size_t)tile_bytes);
        score_tiles(Q, sb_tiles(idx, layer, head) + (size_t)t0 * idx->tile_elems, t1 - t0 + 1,
                    sbb + (size_t)t0 * SPARSE_LANES, NULL);
        sb_scored = (int64_t)(t1 - t0 + 1) * SPARSE_LANES;
        bytes = (int64_t)(t1 - t0 + 1) * tile_bytes;
        /* The E super-blocks of highest bound, descending (ties: lower index first). */
        int ne = 0;
        float rest = -INFINITY; /* the best bound left out of the list */
        for (int s = s0; s <= s1; s++) {
            float b = sbb[s];
            if (ne == E && !(b > X->eb[ne - 1])) {
                rest = b > rest ? b : rest;
                continue;
            }
            if (ne == E) rest = X->eb[ne - 1] > rest ? X->eb[ne - 1] : rest;
            int j = ne < E ? ne++ : ne - 1;
            while (j > 0 && X->eb[j - 1] < b) {
                X->eb[j] = X->eb[j - 1];
                X->ei[j] = X->ei[j - 1];
                j--;
            }
            X->eb[j] = b;
            X->ei[j] = s;
        }
        /* The first expansion's tiles into L1, so that scoring it does not
         * start on cold misses (each expansion prefetches the next one's into
         * L1), and the others' towards L2 now: they are scattered 4 KB reads
         * that no hardware prefetcher anticipates, and asking for all of them
         * at once overlaps their latencies (selection -10..15% at 32K). */
        prefetch_range_l1(bt0 + (size_t)X->ei[0] * tpsb * idx->tile_elems,
                       (size_t)tpsb * tile_bytes);
        for (int x = 1; x < ne; x++)
            prefetch_range_l2(bt0 + (size_t)X->ei[x] * tpsb * idx->tile_elems,
                              (size_t)tpsb * tile_bytes);
        float bb[SPARSE_MAX_SB_BLOCKS];
        for (int x = 0;; x++) {
            int s;
            if (x < ne) {
                s = X->ei[x];
            } else {
                /* Past the cap: continue (best first) only to reach k candidates,
                 * which the clipped super-blocks at c0 and c1 may leave short. */
                if (m >= k) {
                    exact = count_ge(X->ck, m, f32_key(rest)) >= k;
                    break;
                }
                s = -1;
                for (int t = s0; t <= s1; t++)
                    if (sbb[t] != -INFINITY && (s < 0 || sbb[t] > sbb[s])) s = t;
                if (s < 0) break;
            }
            if (sbb[s] == -INFINITY) continue; /* expanded already */
            ELLM_ASSERT(s >= s0 && s <= s1 && (s + 1) * tpsb <= idx->n_blk_tiles);
            /* Exact stop: k candidates already reach this super-block's bound,
             * so no block of it or of any later one can do better. */
            if (m >= k && count_ge(X->ck, m, f32_key(sbb[s])) >= k) break;
            const uint16_t *next =
                x + 1 < ne ? bt0 + (size_t)X->ei[x + 1] * tpsb * idx->tile_elems : NULL;
            score_tiles(Q, bt0 + (size_t)s * tpsb * idx->tile_elems, tpsb, bb, next);
            int b0 = s * S > c0 ? s * S : c0, b1 = (s + 1) * S < c1 ? (s + 1) * S : c1;
            for (int b = b0; b < b1; b++, m++) {
                X->ck[m] = f32_key(bb[b - s * S]);
                X->ci[m] = b;
            }
            sbb[s] = -INFINITY;
            expanded++;
            blk_scored += S;
            bytes += (int64_t)tpsb * tile_bytes;
        }
    }
    ELLM_ASSERT(m >= k);
    mark_best(X->ck, X->ci, m, k, X->bits);
    if (stats) {
        stats->scored_calls++;
        stats->superblocks_scored += sb_scored;
        stats->blocks_scored += blk_scored;
        stats->superblocks_expanded += expanded;
        stats->bytes_read += bytes;
        /* a flat scan reads the candidates' summaries in whole tiles too */
        stats->flat_bytes += (int64_t)((c1 - 1) / SPARSE_LANES - c0 / SPARSE_LANES + 1) * tile_bytes;
        stats->exact_calls += exact;
    }
}

void sparse_index_select(sparse_index *idx, int layer, int kv_head, const float *q, int n_q,
                         int group, int len, int budget_tokens, int sink_blocks,
                         int window_tokens, int32_t *blocks_out, int *n_out,
                         sparse_select_stats *stats) {
    ELLM_ASSERT(layer >= 0 && layer < idx->p.n_layer && kv_head >= 0 &&
                kv_head < idx->p.n_kv_head);
    ELLM_ASSERT(len >= 1 && len <= idx->len[layer] && n_q >= 1 && n_q <= len && group >= 1);
    ELLM_ASSERT(budget_tokens >= 0 && sink_blocks >= 0 && window_tokens >= 0);
    const int bt = idx->bt, nb = (len + bt - 1) / bt, last = nb - 1;
    int n = 0;
    if (stats) stats->calls++;
    if (budget_tokens >= len) {
        for (int b = 0; b < nb; b++) blocks_out[n++] = b;
        *n_out = n;
        return;
    }
    /* Forced blocks, counted by the keys they hold: the last block, the sink,
     * then the window newest first, each only while it fits. */
    int used = len - last * bt;
    int s_end = 0;
    const int sink = sink_blocks < last ? sink_blocks : last;
    while (s_end < sink && used + bt <= budget_tokens) {
        s_end++;
        used += bt;
    }
    const int win = window_tokens > n_q ? window_tokens : n_q;
    const int first_win = len - win > 0 ? (len - win) / bt : 0;
    int w_start = last;
    while (w_start - 1 >= first_win && w_start - 1 >= s_end && used + bt <= budget_tokens) {
        w_start--;
        used += bt;
    }
    const int c0 = s_end, c1 = w_start; /* candidates: full blocks between */
    int k = budget_tokens > used ? (budget_tokens - used) / bt : 0;
    if (k > c1 - c0) k = c1 - c0;

    for (int b = 0; b < s_end; b++) blocks_out[n++] = b;
    if (k == c1 - c0) {
        for (int b = c0; b < c1; b++) blocks_out[n++] = b;
    } else if (k > 0) {
        select_scratch X = scratch_of(idx, layer, kv_head);
        float qpn[SPARSE_QPN_FLOATS];
        query_rows Q = {.q = q,
                        .n_head = idx->p.n_kv_head * group,
                        .head0 = kv_head * group,
                        .group = group,
                        .rows = n_q * group,
                        .hd = idx->hd,
                        .score = score_fns[ellm_cpu_isa()],
                        .qpn = qpn,
                        .per_pass = SPARSE_QPN_FLOATS / (2 * idx->hd),
                        .prep0 = -1,
                        .prep_n = 0};
        prepare_rows(&Q, 0);
        choose_blocks(idx, layer, kv_head, &Q, c0, c1, k, &X, stats);
        /* Emit the chosen blocks in ascending order, clearing the bitmap. */
        for (int w = c0 >> 6; w <= (c1 - 1) >> 6; w++) {
            uint64_t m = X.bits[w];
            X.bits[w] = 0;
            while (m) {
                blocks_out[n++] = (w << 6) + __builtin_ctzll(m);
                m &= m - 1;
            }
        }
    }
    for (int b = w_start; b < nb; b++) blocks_out[n++] = b;
    *n_out = n;
}

/* ---- recall ------------------------------------------------------------- */

static float dot(const float *a, const float *b, int n) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int c = 0;
    for (; c + 4 <= n; c += 4) {
        s0 += a[c] * b[c];
        s1 += a[c + 1] * b[c + 1];
        s2 += a[c + 2] * b[c + 2];
        s3 += a[c + 3] * b[c + 3];
    }
    for (; c < n; c++) s0 += a[c] * b[c];
    return (s0 + s1) + (s2 + s3);
}

float sparse_index_recall(const kv_cache *kv, int layer, int kv_head, const float *q, int n_q,
                          int group, int len, const int32_t *blocks, int n_blocks, float scale,
                          float *recall_out) {
    const kv_cache_params *kp = kv_cache_get_params(kv);
    ELLM_ASSERT(layer >= 0 && layer < kp->n_layer && kv_head >= 0 && kv_head < kp->n_kv_head);
    ELLM_ASSERT(n_q >= 1 && group >= 1 && len >= n_q && len <= kp->n_ctx);
    ELLM_ASSERT(kp->head_dim <= SPARSE_MAX_HEAD_DIM && n_blocks >= 0);
    for (int i = 1; i < n_blocks; i++) ELLM_ASSERT(blocks[i] > blocks[i - 1]);
    const int hd = kp->head_dim, bt = kp->block_tokens, nb = (len + bt - 1) / bt;
    const int rows = n_q * group, n_head = kp->n_kv_head * group;
    float key[SPARSE_MAX_HEAD_DIM];
    double total = 0.0;
    for (int r0 = 0; r0 < rows; r0 += SPARSE_ROWS) {
        const int nr = rows - r0 < SPARSE_ROWS ? rows - r0 : SPARSE_ROWS;
        const float *qr[SPARSE_ROWS];
        int last_pos[SPARSE_ROWS];
        /* Per row: running max of the scores, sum of exp over all keys and over
         * the chosen keys. Both sums see the same operations, so the ratio is
         * exactly 1 when every block is chosen. */
        float m[SPARSE_ROWS], all[SPARSE_ROWS], sel[SPARSE_ROWS];
        for (int r = 0; r < nr; r++) {
            int i = (r0 + r) / group, g = (r0 + r) % group;
            qr[r] = q + ((size_t)i * n_head + (size_t)kv_head * group + g) * hd;
            last_pos[r] = len - n_q + i;
            m[r] = -INFINITY;
            all[r] = sel[r] = 0.0f;
        }
        int bi = 0;
        for (int b = 0; b < nb; b++) {
            while (bi < n_blocks && blocks[bi] < b) bi++;
            const int in = bi < n_blocks && blocks[bi] == b;
            for (int j = 0; j < bt && b * bt + j < len; j++) {
                const int pos = b * bt + j;
                const float *k = key;
                kv_cache_key(kv, layer, kv_head, pos, key);
                for (int r = 0; r < nr; r++) {
                    if (pos > last_pos[r]) continue;
                    float s = dot(qr[r], k, hd) * scale;
                    if (s > m[r]) {
                        float c = expf(m[r] - s);
                        all[r] *= c;
                        sel[r] *= c;
                        m[r] = s;
                    }
                    float e = expf(s - m[r]);
                    all[r] += e;
                    if (in) sel[r] += e;
                }
            }
        }
        for (int r = 0; r < nr; r++) {
            float rec = all[r] > 0.0f ? sel[r] / all[r] : 0.0f;
            if (recall_out) recall_out[r0 + r] = rec;
            total += rec;
        }
    }
    return (float)(total / rows);
}
