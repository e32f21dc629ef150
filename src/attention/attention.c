/* Fused flash-decoding attention over the block KV cache: work partitioning,
 * log-sum-exp merge, the scalar block kernel and the naive reference.
 *
 * Work model. A segment is (KV head h, tile of up to ATTN_TILE_Q query tokens);
 * its rows are the tile's tokens times the group's query heads. A segment's
 * KV blocks (those its last token can see, or its sparse list) are cut into
 * parts at fixed places of the cache: part c holds the segment's blocks among
 * cache blocks [c * ATTN_PART_BLOCKS, (c + 1) * ATTN_PART_BLOCKS) -- all of
 * them for dense attention, the run of the (ascending) list that falls there
 * for sparse, so a KV cache sharded by parts over processes has every part of
 * a sparse call on one process, as it has for dense (a Q8_0 cache, never
 * sharded with a sparse index, cuts its lists every ATTN_PART_BLOCKS listed
 * blocks instead: part_end). Each part
 * starts from an empty online-softmax state, and a segment of several parts is
 * merged by a log-sum-exp reduction summed in fixed point (attention_merge.c),
 * whose bits do not depend on the order or grouping of the parts. Where the parts
 * are cut depends only on block indices -- not on the number of query tokens in
 * the call, nor on the number of threads -- and a row ignores the blocks it
 * cannot see, so every query row gets exactly the bits a single-token call at
 * its position gets: a batched prefill or speculative verification reproduces
 * decode bit for bit.
 *
 * The parts of all segments are put in a work order -- a sparse list's
 * segment by segment (heads outer, tiles inner), dense ones in page order
 * (part c of every segment, then part c + 1: work_order) -- and the blocks
 * they hold are cut into nth equal contiguous ranges of that order; a thread
 * computes the parts that start in its range. A segment of one part is
 * written out by its thread; otherwise each part leaves its (m, l, acc) in
 * its own slot, and after one barrier the rows of those segments are merged,
 * split over the threads. One threadpool_run per wave of tiles (a long
 * prefill runs in waves so the part slots stay within the workspace).
 *
 * attention_forward_select (sparse decode) cannot cut the work in advance: the
 * block lists come from the selection in the same job. There, threads take
 * units from a shared counter -- each head's selection, then parts of each
 * head's list -- and a head's parts are merged by whichever finishes last. */
#include "attention/attention.h"
#include "attention/attention_kernel.h"
#include "attention/attention_rows.h"
#include "core/cpu.h"
#include "core/fp16.h"
#include "core/prefetch.h"
#include "core/status.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* attention_workspace.range: one 64-byte line per thread */
#define RANGE_STRIDE 8

struct attention_workspace {
    int n_threads;
    int max_q;
    int n_head;
    int head_dim;
    int hdp;          /* head_dim rounded up to ATTN_PAD */
    int max_ctx;
    int block_tokens;
    int lds;          /* block_tokens rounded up to 4 */
    int rows_pad;     /* rows of the largest segment, rounded up to ATTN_PAD */
    int tile;         /* query tokens of a tile: min(max_q, ATTN_TILE_Q) */
    int q_rows;       /* rows of a thread's prepared queries: every KV head's of one tile (thread_state) */
    int max_seg;      /* n_head * ceil(max_q / ATTN_TILE_Q): bound on segments */
    int max_units;    /* parts one wave may hold */
    size_t thread_floats; /* per-thread scratch, see thread_state() */
    unsigned calls;       /* waves run so far (attn_job.call) */
    uint64_t *q_tag;      /* n_threads x n_head: (call, segment) whose query rows the thread's scratch holds for each KV head */
    float *mem;           /* n_threads x thread_floats, 64-byte aligned */
    float *part_mem;      /* part_floats: the partials of the segments of a wave */
    size_t part_floats;
    long *seg_start;      /* max_seg + 1: first unit (part) of each segment, then the total */
    size_t *seg_slot;     /* max_seg: offset of the segment's part slots in part_mem */
    long *unit_block;     /* max_units + 1: blocks before each unit, then the total */
    int *unit_seg;        /* max_units: the segment of each unit */
    long *work_unit;      /* max_units: the units in the order threads take them (attention_run) */
    long *work_block;     /* max_units + 1: blocks before each item of work_unit, then the total */
    atomic_int *arrived;  /* max_seg: parts done of each segment (attention_forward_select) */
    long *merge_row;      /* max_seg + 1: rows of the segments of several parts before each segment, then the total */
    _Atomic uint64_t *range; /* n_threads, RANGE_STRIDE apart: items [next, end) of the work order a thread has left, next << 32 | end */
    atomic_int merge_barrier; /* attn_worker's barrier before the merge */
    /* attention_forward_select */
    atomic_int next_unit; /* the next unit of work to take */
    atomic_int *sel_done; /* max_seg: generation of the call whose selection is done */
    int gen;              /* generation of the current call */
    float *chunk_mem;     /* max_parts partials of every head, see chunk_slot() */
    int max_parts;        /* parts of a cache of max_ctx tokens: ceil(blocks / ATTN_PART_BLOCKS) */
    int *sel_cut;         /* max_seg x (max_parts + 1): where each head's list changes part */
    int *sel_chunks;      /* max_seg: parts of each head's list */
    int64_t *lse_mem;     /* n_threads x lse_rows rows of lse_row_words: each thread's running merge */
    int *lse_gen;         /* n_threads x max_seg: generation whose parts a thread's head sums hold */
    int lse_rows;         /* rows of one tile over all heads: tile x n_head */
};

/* int64 words of one row of a thread's running merge (lse_acc). */
static size_t lse_row_words(int head_dim) {
    return 2 * sizeof(attention_lse_bound) / sizeof(int64_t) + ATTENTION_LSE_SUMS((size_t)head_dim);
}

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Validates the shapes and sizes the scratch for calls with n_q <= max_q,
 * n_head query heads of head_dim, q_pos0 + n_q <= max_ctx and caches with
 * block_tokens <= the given value. */
ellm_status attention_workspace_init(int n_threads, int max_q, int n_head, int head_dim,
                                     int max_ctx, int block_tokens,
                                     attention_workspace **out, ellm_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024 || max_q < 1 || n_head < 1 || head_dim < 1 ||
        head_dim > 4096 || max_ctx < 1 || block_tokens < 1 || block_tokens > 4096)
        return ellm_fail(err, ELLM_ERR_ARG,
                         "attention workspace: bad shape (threads=%d max_q=%d n_head=%d "
                         "head_dim=%d max_ctx=%d block_tokens=%d)",
                         n_threads, max_q, n_head, head_dim, max_ctx, block_tokens);
    attention_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) return ellm_fail(err, ELLM_ERR_NOMEM, "attention workspace: out of memory");
    int tile = max_q < ATTN_TILE_Q ? max_q : ATTN_TILE_Q;
    ws->n_threads = n_threads;
    ws->max_q = max_q;
    ws->n_head = n_head;
    ws->head_dim = head_dim;
    ws->hdp = (int)round16((size_t)head_dim);
    ws->max_ctx = max_ctx;
    ws->block_tokens = block_tokens;
    ws->lds = (block_tokens + 3) & ~3;
    ws->rows_pad = (int)round16((size_t)tile * (size_t)n_head);
    /* KV head h's rows from row h * round4(tile * group): with n_kv heads
     * that is at most tile * n_head + 3 * n_kv rows */
    ws->tile = tile;
    ws->q_rows = (int)round16((size_t)tile * (size_t)n_head + 3 * (size_t)n_head);
    ws->max_seg = n_head * ((max_q + ATTN_TILE_Q - 1) / ATTN_TILE_Q);
    size_t rp = (size_t)ws->rows_pad, qr = (size_t)ws->q_rows, hdp = (size_t)ws->hdp, lds = (size_t)ws->lds;
    /* q: q_rows x hdp; acc: rows x hdp; m, l: rows; s: rows x lds; kbuf, vbuf: lds x hdp; lv: rows x 16;
     * q8: q_rows x hdp bytes, qd, qsum: q_rows x (hdp / 32 + 1); alpha: rows x 2 */
    ws->thread_floats = qr * hdp + rp * hdp + 2 * rp + round16(rp * lds) + 2 * round16(lds * hdp) + 16 * rp +
                        round16(qr * hdp / 4) + 2 * round16(qr * (hdp / 32 + 1)) + round16(2 * rp);
    size_t floats = (size_t)n_threads * ws->thread_floats;
    /* Part slots: every part of one tile at the deepest position (all heads:
     * rows sum to tile * n_head, each head's m and l padded by < 16), and
     * at least one part per segment of a call. */
    size_t max_parts = ((size_t)(max_ctx + block_tokens - 1) / (size_t)block_tokens + ATTN_PART_BLOCKS - 1) /
                       ATTN_PART_BLOCKS;
    size_t tile_part = (size_t)tile * (size_t)n_head * hdp + 2 * (size_t)n_head * ((size_t)tile + 16);
    ws->part_floats = tile_part * max_parts;
    ws->max_parts = (int)max_parts;
    ws->max_units = (int)((size_t)n_head * max_parts) + ws->max_seg;
    void *mem = NULL;
    if (posix_memalign(&mem, 64, floats * sizeof(float)) != 0) mem = NULL;
    ws->mem = mem;
    /* Not cleared: a part writes its slot before it is read, and pages are
     * only committed as deep contexts use them. */
    void *pmem = NULL;
    if (posix_memalign(&pmem, 64, ws->part_floats * sizeof(float)) != 0) pmem = NULL;
    ws->part_mem = pmem;
    ws->seg_start = calloc((size_t)ws->max_seg + 1, sizeof *ws->seg_start);
    ws->seg_slot = calloc((size_t)ws->max_seg, sizeof *ws->seg_slot);
    ws->unit_block = calloc((size_t)ws->max_units + 1, sizeof *ws->unit_block);
    ws->unit_seg = calloc((size_t)ws->max_units, sizeof *ws->unit_seg);
    ws->work_unit = calloc((size_t)ws->max_units, sizeof *ws->work_unit);
    ws->work_block = calloc((size_t)ws->max_units + 1, sizeof *ws->work_block);
    ws->arrived = calloc((size_t)ws->max_seg, sizeof *ws->arrived);
    ws->merge_row = calloc((size_t)ws->max_seg + 1, sizeof *ws->merge_row);
    ws->range = aligned_alloc(64, (size_t)n_threads * RANGE_STRIDE * sizeof *ws->range);
    ws->q_tag = calloc((size_t)n_threads * (size_t)n_head, sizeof *ws->q_tag);
    ws->sel_done = calloc((size_t)ws->max_seg, sizeof *ws->sel_done);
    /* The rows of all heads of one tile are at most rows_pad; each head's
     * partial is padded by < 16 floats per m and l. */
    size_t chunk_floats = max_parts * (2 * rp + 32 * (size_t)n_head + rp * hdp);
    void *cmem = NULL;
    if (posix_memalign(&cmem, 64, chunk_floats * sizeof(float)) != 0) cmem = NULL;
    ws->chunk_mem = cmem;
    ws->sel_cut = malloc((size_t)ws->max_seg * (max_parts + 1) * sizeof *ws->sel_cut);
    ws->sel_chunks = calloc((size_t)ws->max_seg, sizeof *ws->sel_chunks);
    ws->lse_rows = tile * n_head;
    ws->lse_mem = malloc((size_t)n_threads * (size_t)ws->lse_rows * lse_row_words(head_dim) * sizeof(int64_t));
    ws->lse_gen = calloc((size_t)n_threads * (size_t)ws->max_seg, sizeof *ws->lse_gen);
    if (!ws->lse_mem || !ws->lse_gen || !ws->mem || !ws->q_tag || !ws->part_mem || !ws->seg_start || !ws->seg_slot || !ws->unit_block || !ws->unit_seg || !ws->work_unit || !ws->work_block || !ws->arrived || !ws->merge_row || !ws->range ||
        !ws->sel_done || !ws->chunk_mem || !ws->sel_cut || !ws->sel_chunks) {
        attention_workspace_free(ws);
        return ellm_fail(err, ELLM_ERR_NOMEM, "attention workspace: cannot allocate %.1f MB",
                         (double)(floats + ws->part_floats) * sizeof(float) / 1e6);
    }
    /* Zeroed once so pad lanes and pad rows of the scratch are finite. */
    memset(ws->mem, 0, floats * sizeof(float));
    *out = ws;
    return ELLM_OK;
}

void attention_workspace_free(attention_workspace *ws) {
    if (!ws) return;
    free(ws->mem);
    free(ws->part_mem);
    free(ws->seg_start);
    free(ws->seg_slot);
    free(ws->unit_block);
    free(ws->unit_seg);
    free(ws->work_unit);
    free(ws->work_block);
    free(ws->arrived);
    free(ws->merge_row);
    free((void *)ws->range);
    free(ws->q_tag);
    free((void *)ws->sel_done);
    free(ws->chunk_mem);
    free(ws->sel_cut);
    free(ws->sel_chunks);
    free(ws->lse_mem);
    free(ws->lse_gen);
    free(ws);
}

static int g_pairs_on = 1;

void attention_pairs_enable(int on) { g_pairs_on = on != 0; }

static int g_prefetch_nta = -1;

void attention_prefetch_nta(int mode) { g_prefetch_nta = mode < 0 ? -1 : mode != 0; }
int attention_prefetch_nta_active(void) { return g_prefetch_nta >= 0 ? g_prefetch_nta : ellm_cpu()->amd; }

static int g_uneven;
static atomic_long g_taken;

void attention_uneven_ranges(int on) { g_uneven = on != 0; }
long attention_parts_taken(void) { return atomic_load_explicit(&g_taken, memory_order_relaxed); }

/* ---- one call ----------------------------------------------------------- */

typedef struct {
    const attention_args *a;
    attention_workspace *ws;
    attn_block_fn fn;
    attn_block_fn rows_fn; /* for parts of attn_rows_min(type) rows or more, or NULL (attention_rows.h) */
    attn_block2_fn rows2_fn; /* rows_fn's pair kernel, or NULL */
    const int32_t *blocks; /* sparse block lists, or NULL for all visible blocks */
    const int *list_n;     /* their lengths (a head's read only once its list is complete) */
    int max_blocks;
    int hd, bt, type;
    size_t half_bytes; /* bytes of a block's K (or V) */
    int n_kv, group, n_tiles, n_seg;
    int t0, nt; /* the wave's tiles [t0, t0 + nt); segment s is head s / nt, tile t0 + s % nt */
    long n_units; /* parts over the wave's segments */
    /* attention_forward_select */
    attention_select_fn select;
    void *select_arg;
    int32_t *sel_blocks;
    int *sel_n;
    int n_blocks_cache; /* kv_cache_n_blocks */
    int lanes;          /* the kernels keep lane sums of l (attn_state.lanes) */
    unsigned call;      /* this wave's number (never 0), for attention_workspace.q_tag */
} attn_job;

/* Scratch of thread ith: m, l and acc are its own for whole segments. */
static attn_state thread_state(const attn_job *J, int ith) {
    const attention_workspace *ws = J->ws;
    size_t rp = (size_t)ws->rows_pad, qr = (size_t)ws->q_rows, hdp = (size_t)ws->hdp, lds = (size_t)ws->lds;
    float *base = ws->mem + (size_t)ith * ws->thread_floats;
    attn_state st;
    st.head_dim = J->hd;
    st.hdp = ws->hdp;
    st.rows = 0;
    st.group = J->group;
    st.block_tokens = J->bt;
    st.lds = ws->lds;
    st.q = base; /* KV head 0's rows; run_part_ahead moves to a segment's head */
    st.acc = base + qr * hdp;
    st.m = st.acc + rp * hdp;
    st.l = st.m + rp;
    st.s = st.l + rp;
    st.kbuf = st.s + round16(rp * lds);
    st.vbuf = st.kbuf + round16(lds * hdp);
    st.lv = st.vbuf + round16(lds * hdp);
    st.lanes = J->lanes;
    st.ahead_nta = attention_prefetch_nta_active();
    st.q8 = (int8_t *)(st.lv + 16 * rp);
    st.qd = st.lv + 16 * rp + round16(qr * hdp / 4);
    st.qsum = (int32_t *)(st.qd + round16(qr * (hdp / 32 + 1)));
    st.alpha = st.qd + 2 * round16(qr * (hdp / 32 + 1));
    return st;
}

/* The first item of the work order whose first block is at or after block
 * offset w of that order. */
static long work_at(const attn_job *J, long w) {
    const long *wb = J->ws->work_block;
    long lo = 0, hi = J->n_units;
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (wb[mid] < w) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Blocks of a sparse list prefetched ahead of the one being computed. A block
 * (K then V, 4 KB at 16 tokens x 64 dims in F16) is a separate random read
 * that the hardware prefetchers do not anticipate, and one core keeps only a
 * few dozen cache-line misses in flight: without software prefetch scattered
 * blocks were read at 0.4x the speed of a sequential scan
 * (bench/bench_sparse_attention, 2 threads, 32K). Asking for the block four
 * ahead towards L2, a few lines per key tile so that the requests never stall
 * the computation, brought that to about 0.65x; a burst of the whole block at
 * once gained half as much, prefetching only the next block or into L1 little. */
#define SPARSE_PREFETCH_BLOCKS 4

/* Dense blocks of a (layer, head) are adjacent, but each 16-token F16 block is
 * one 4 KB page-aligned piece, and the hardware streamer does not run ahead
 * across 4 KB boundaries: every block started with cache misses. Asking for
 * the block two ahead towards L2, a few lines per key tile, instead of the next
 * block into L1 in one burst at the start of each block, read 16K-32K
 * contexts ~15% faster on one thread (0.63 -> 0.74 of a streaming read of the
 * same bytes, CPU time, interleaved A/B); three ahead measured the same.
 * What counts is the distance in bytes: a Q8_0 block (2,176 bytes at 64
 * dims) two ahead is half as far, and four ahead read 16K-32K contexts 7-11%
 * faster in 12 of 13 alternated comparisons of bench_attention (2 threads
 * and 1; the other, with a wide spread, slower). F16 blocks four ahead
 * (16 KB), or a second prefetch 16 or 32 KB beyond, were no faster: the
 * differences stayed within the ~7% by which copies of one binary differ in
 * such runs here; six ahead was 15-25% slower. So the look-ahead is
 * ATTENTION_DENSE_PREFETCH_BYTES (attention.h), and at least
 * DENSE_PREFETCH_MIN blocks. */
#define DENSE_PREFETCH_MIN 2

int attention_dense_look_ahead(size_t block_bytes) {
    const size_t n = (ATTENTION_DENSE_PREFETCH_BYTES + block_bytes - 1) / block_bytes;
    return n < DENSE_PREFETCH_MIN ? DENSE_PREFETCH_MIN : n > 7 ? 7 : (int)n; /* the ring holds 8 blocks */
}

/* Blocks the look-ahead of J's parts runs ahead: SPARSE_PREFETCH_BLOCKS over
 * block lists, else attention_dense_look_ahead of the cache's blocks (K and
 * V). */
static int look_ahead_blocks(const attn_job *J) {
    return J->blocks ? SPARSE_PREFETCH_BLOCKS : attention_dense_look_ahead(2 * J->half_bytes);
}

/* Where the look-ahead of a part goes past the blocks it computes
 * (attention_forward_select): list positions >= at stand for positions
 * [b, e) of KV head h's list, the run of parts the thread computes next. So
 * the blocks it prefetches are those it reads next, not the first blocks of
 * a run that the other thread may take; b == e stops the look-ahead at `at`. */
typedef struct {
    long at;
    int h;
    const int32_t *list;
    long b, e;
} attn_ahead;

/* K of list position z of segment s's head h, or of the continuation. */
static inline const char *ahead_block(const attn_job *J, int h, const int32_t *list, long z, const attn_ahead *nx) {
    if (nx && z >= nx->at) {
        const long i = nx->b + (z - nx->at);
        return kv_cache_block_k(J->a->kv, J->a->layer, nx->h, nx->list ? nx->list[i] : (int)i);
    }
    return kv_cache_block_k(J->a->kv, J->a->layer, h, list ? list[z] : (int)z);
}

/* Runs blocks [kb, ke) of segment s's block list into st (whose m, l, acc are
 * where the partial goes), starting from an empty state. nx (may be NULL:
 * the look-ahead runs on to the end of the list) continues the look-ahead
 * elsewhere. The part's first blocks are asked for at once from list
 * position pf_from on (those before it the thread's previous part already
 * asked for). */
static void run_part_ahead(const attn_job *J, attn_state *st, int s, long kb, long ke, uint64_t *qtag,
                           const attn_ahead *nx, long pf_from) {
    const attention_args *a = J->a;
    const int h = s / J->nt, t = J->t0 + s % J->nt;
    const int i0 = t * ATTN_TILE_Q;
    const int nqt = a->n_q - i0 < ATTN_TILE_Q ? a->n_q - i0 : ATTN_TILE_Q;
    const int G = J->group, hd = J->hd, hdp = st->hdp, bt = J->bt;
    st->rows = nqt * G;
    const attn_block_fn fn = J->rows_fn && st->rows >= attn_rows_min(J->type) ? J->rows_fn : J->fn;
    /* dense parts on the multi-row kernel take adjacent full blocks in pairs;
     * the single-row AVX-512 kernel takes any two full blocks of a part */
    const attn_block2_fn pair_fn = fn == J->rows_fn ? (!J->blocks ? J->rows2_fn : NULL)
                                                    : fn == attn_block_avx512 && g_pairs_on ? attn_block2_avx512 : NULL;
    attn_block held; /* a full block waiting for the next one (pair_fn) */
    int have = 0;
    /* the AVX-512 single-row kernels take runs of whole blocks in multi-block
     * steps: Q8_0 overlapping the blocks' phases, F16 with the state in registers */
    void (*const run_fn)(attn_state *, const attn_block *, int) =
        !g_pairs_on ? NULL
        : fn == attn_block_q8_avx512 && attn_blocks_q8_fits(st) ? attn_blocks_q8_avx512
        : fn == attn_block_avx512 && J->type == QTYPE_F16 && attn_blocks_f16_fits(st) ? attn_blocks_f16_avx512
                                                                                      : NULL;
    const int qn = run_fn == attn_blocks_q8_avx512 ? ATTN_Q8_STEP_BLOCKS : run_fn ? ATTN_F16_STEP_BLOCKS : 0;
    /* one cache line per slot wherever the callers' frames put this array:
     * the driver fills a slot and the kernel reads it right after (see
     * bench/KV.md, 2026-12-05, for F16 timings that moved with the build) */
    _Alignas(64) attn_block run[ATTN_Q8_STEP_BLOCKS > ATTN_F16_STEP_BLOCKS ? ATTN_Q8_STEP_BLOCKS : ATTN_F16_STEP_BLOCKS];
    int n_run = 0;
    const int rows_pad = (st->rows + 3) & ~3;

    /* Queries of the tile, pre-multiplied by the scale; pad lanes and rows
     * zero; for a Q8_0 cache quantized too. Once per thread and segment,
     * kept per KV head: a thread's parts of one segment are many (a deep
     * dense call or a sparse list has dozens), and in page order (dense)
     * they alternate between the heads. Preparing every part's rows afresh
     * cost ~6% of a sparse Q8_0 call and ~20% of a dense one. */
    {
        const size_t off = (size_t)h * (size_t)((J->ws->tile * G + 3) & ~3);
        st->q += off * (size_t)hdp;
        st->q8 += off * (size_t)hdp;
        st->qd += off * (size_t)(hdp / 32);
        st->qsum += off * (size_t)(hdp / 32);
    }
    float *q = (float *)st->q;
    const uint64_t tag = (uint64_t)J->call << 32 | (uint32_t)s;
    qtag += h;
    if (*qtag != tag) {
        for (int r = 0; r < rows_pad; r++) {
            float *dst = q + (size_t)r * hdp;
            int d = 0;
            if (r < st->rows) {
                const float *src = a->q + ((size_t)(i0 + r / G) * a->n_head + (size_t)h * G + r % G) * hd;
                for (; d < hd; d++) dst[d] = src[d] * a->scale;
            }
            for (; d < hdp; d++) dst[d] = 0.0f;
        }
        if (J->type == QTYPE_Q8_0) /* the int8 query of the Q8_0 kernels */
            for (int r = 0; r < st->rows; r++)
                attn_q8_quantize_query(q + (size_t)r * hdp, hd, st->q8 + (size_t)r * hdp,
                                       st->qd + (size_t)r * (hdp / 32), st->qsum + (size_t)r * (hdp / 32));
        *qtag = tag;
    }
    for (int r = 0; r < st->rows; r++) {
        st->m[r] = -INFINITY;
        st->l[r] = 0.0f;
    }
    memset(st->acc, 0, (size_t)st->rows * hdp * sizeof(float));
    if (st->lanes) memset(st->lv, 0, (size_t)st->rows * 16 * sizeof(float));

    const int end_pos = a->q_pos0 + i0 + nqt; /* keys the tile's last token sees */
    const int32_t *list = J->blocks ? J->blocks + (size_t)h * J->max_blocks : NULL;
    /* Blocks k .. k + A of the list (a block's V half follows its K half),
     * each looked up once: ring[z % 8] holds block z. A sparse list's part
     * holds a few blocks only (2-3 of a 2048-token budget at 32K), so its
     * look-ahead runs on into the next part this thread computes (nx; the
     * list's next part when nx is NULL), whose first blocks would otherwise
     * start cold. */
    const int A = look_ahead_blocks(J);
    const long lim = nx ? nx->at + (nx->e - nx->b) : list && J->list_n ? J->list_n[h] : ke;
    _Static_assert(SPARSE_PREFETCH_BLOCKS < 8, "the ring holds 8 blocks");
    const char *ring[8];
    for (long z = kb; z < lim && z <= kb + A; z++) ring[z & 7] = ahead_block(J, h, list, z, nx);
    for (long k = kb; k < ke; k++) {
        if (k > kb && k + A < lim) ring[(k + A) & 7] = ahead_block(J, h, list, k + A, nx);
        int blk = list ? list[k] : (int)k;
        int pos0 = blk * bt;
        /* filled in place: a run's block in its slot (copying a block
         * just filled field by field stalls on store forwarding) */
        attn_block b_own, *const bp = qn ? &run[n_run] : &b_own;
        bp->n_valid = end_pos - pos0 < bt ? end_pos - pos0 : bt;
        if (bp->n_valid <= 0) continue; /* sparse: a block after the tile's last token */
        bp->vis0 = a->q_pos0 + i0 + 1 - pos0;
        bp->type = J->type;
        bp->k = ring[k & 7];
        bp->v = ring[k & 7] + J->half_bytes;
        bp->next_k = bp->next_v = NULL;
        bp->ahead_k = bp->ahead_v = NULL;
        /* Scattered blocks: SPARSE_PREFETCH_BLOCKS in flight towards L2 (see
         * the constant); the part's first ones at once, then the kernel asks
         * for the block that far ahead while it computes. Contiguous blocks:
         * look_ahead_blocks ahead, and the next one for kernels
         * that convert it into scratch (many rows). */
        if (k == kb)
            for (long z = pf_from > k + 1 ? pf_from : k + 1; z < k + A && z < lim; z++)
                prefetch_range_l2(ring[z & 7], 2 * J->half_bytes);
        if (!list && k + 1 < ke) {
            bp->next_k = ring[(k + 1) & 7];
            bp->next_v = ring[(k + 1) & 7] + J->half_bytes;
        }
        if (k + A < lim) {
            bp->ahead_k = ring[(k + A) & 7];
            bp->ahead_v = ring[(k + A) & 7] + J->half_bytes;
        }
        if (qn) {
            if (bp->n_valid == bt && bp->vis0 >= bt) {
                n_run++;
                if (n_run == qn) {
                    run_fn(st, run, n_run);
                    n_run = 0;
                }
                continue;
            }
            if (n_run) run_fn(st, run, n_run);
            n_run = 0;
        }
        if (pair_fn) {
            const int full = bp->n_valid == bt && bp->vis0 >= bt;
            if (have) {
                have = 0;
                if (full) {
                    pair_fn(st, &held, bp);
                    continue;
                }
                fn(st, &held);
            } else if (full && k + 1 < ke) {
                held = *bp;
                have = 1;
                continue;
            }
        }
        fn(st, bp);
    }
    if (have) fn(st, &held);
    if (n_run) run_fn(st, run, n_run);
    if (st->lanes)
        for (int r = 0; r < st->rows; r++) {
            /* lane order, whatever the ISA of the sum */
            float l = 0.0f;
            for (int i = 0; i < 16; i++) l += st->lv[16 * r + i];
            st->l[r] = l;
        }
}

static void run_part(const attn_job *J, attn_state *st, int s, long kb, long ke, uint64_t *qtag) {
    run_part_ahead(J, st, s, kb, ke, qtag, NULL, 0);
}

/* Output row of segment s's row r. */
static float *out_row(const attn_job *J, int s, int r) {
    const attention_args *a = J->a;
    int h = s / J->nt, t = J->t0 + s % J->nt, G = J->group;
    return a->out + ((size_t)(t * ATTN_TILE_Q + r / G) * a->n_head + (size_t)h * G + r % G) *
                        J->hd;
}

static int seg_rows(const attn_job *J, int s) {
    int i0 = (J->t0 + s % J->nt) * ATTN_TILE_Q;
    int nqt = J->a->n_q - i0 < ATTN_TILE_Q ? J->a->n_q - i0 : ATTN_TILE_Q;
    return nqt * J->group;
}

/* out = acc / l for a segment computed whole by one thread. */
static void write_out(const attn_job *J, const attn_state *st, int s) {
    for (int r = 0; r < st->rows; r++) {
        float *dst = out_row(J, s, r);
        const float *acc = st->acc + (size_t)r * st->hdp;
        float inv = st->l[r] > 0.0f ? 1.0f / st->l[r] : 0.0f;
        /* (0 + acc) * inv: the bits merge_slots gives a single partial (its
         * 0 + e * acc with e = 1), signed zeros included */
        for (int d = 0; d < J->hd; d++) dst[d] = (0.0f + acc[d]) * inv;
    }
}

/* Merge of rows [r0, r1) of np >= 2 partials of segment s, each m[rp], l[rp] then
 * acc[rows][hdp], partial i at base + i * stride: out = sum_i e_i acc_i /
 * sum_i e_i l_i with e_i = exp(m_i) (to a common factor), summed exactly (attention_lse_*),
 * so the bits depend neither on who merges nor on how the parts would be
 * grouped -- processes holding shards of the cache get them too. A row that
 * saw keys of one partial only gets its acc / l, as write_out gives it. */
static void merge_slots(const attn_job *J, int s, const float *base, size_t stride, int np, size_t rp, int r0,
                        int r1) {
    const attention_workspace *ws = J->ws;
    const int hd = J->hd;
    int64_t sum[ATTENTION_LSE_SUMS(hd)];
    for (int r = r0; r < r1; r++) {
        attention_lse_bound b;
        attention_lse_bound_init(&b);
        for (int i = 0; i < np; i++) {
            const float *p = base + (size_t)i * stride;
            attention_lse_bound_add(&b, i, p[r], p[rp + r], p + 2 * rp + (size_t)r * ws->hdp, hd);
        }
        const int one = attention_lse_single(&b);
        if (one >= 0) {
            const float *p = base + (size_t)one * stride;
            attention_lse_one(p[rp + r], p + 2 * rp + (size_t)r * ws->hdp, hd, out_row(J, s, r));
            continue;
        }
        attention_lse_grid g;
        attention_lse_grid_init(&g, &b);
        memset(sum, 0, sizeof sum);
        for (int i = 0; i < np; i++) {
            const float *p = base + (size_t)i * stride;
            attention_lse_sum(&g, p[r], p[rp + r], p + 2 * rp + (size_t)r * ws->hdp, hd, sum);
        }
        attention_lse_out(&g, sum, hd, out_row(J, s, r));
    }
}

/* Floats of one part slot of a segment of `rows` rows: m, l (each padded to
 * 16) and acc. */
static size_t part_slot_floats(const attn_job *J, int rows) {
    return 2 * round16((size_t)rows) + (size_t)rows * (size_t)J->ws->hdp;
}

/* Slot of part c of segment s. */
static float *part_slot(const attn_job *J, int s, int c) {
    return J->ws->part_mem + J->ws->seg_slot[s] + (size_t)c * part_slot_floats(J, seg_rows(J, s));
}

/* The look-ahead of a part ending at list position `at` of its segment,
 * continued into work item i, the part this thread computes next, and the
 * items after it (up to i_end) that continue the same segment's list: their
 * blocks, of that segment's KV head. A sparse list's parts hold a few blocks
 * each, so the look-ahead often reaches beyond the next one; in page order
 * (dense) the next item is usually another head's run of the same page. */
static attn_ahead unit_continuation(const attn_job *J, long at, long i, long i_end) {
    const attention_workspace *ws = J->ws;
    const long u = ws->work_unit[i];
    const int s = ws->unit_seg[u];
    long ue = u + 1;
    for (long j = i + 1; j < i_end && ws->work_unit[j] == ue && ue < ws->seg_start[s + 1]; j++) ue++;
    const long sb = ws->unit_block[ws->seg_start[s]];
    const int h = s / J->nt;
    attn_ahead nx = {.at = at, .h = h, .list = J->blocks ? J->blocks + (size_t)h * J->max_blocks : NULL,
                     .b = ws->unit_block[u] - sb, .e = ws->unit_block[ue] - sb};
    return nx;
}

/* Rows [r0, r1) of the rows of the wave's segments of several parts
 * (attention_workspace.merge_row), merged. */
static void merge_rows(const attn_job *J, long r0, long r1) {
    const long *mr = J->ws->merge_row;
    for (int s = 0; s < J->n_seg && r0 < r1; s++) {
        if (mr[s + 1] <= r0) continue;
        const long e = r1 < mr[s + 1] ? r1 : mr[s + 1];
        const int n_parts = (int)(J->ws->seg_start[s + 1] - J->ws->seg_start[s]);
        merge_slots(J, s, part_slot(J, s, 0), part_slot_floats(J, seg_rows(J, s)), n_parts,
                    round16((size_t)seg_rows(J, s)), (int)(r0 - mr[s]), (int)(e - mr[s]));
        r0 = e;
    }
}

/* The next item of a thread's range, from its front (the owner) or its
 * back (another thread that ran out), or -1 when it is empty. */
static long range_take(_Atomic uint64_t *r, int back) {
    uint64_t v = atomic_load_explicit(r, memory_order_relaxed);
    for (;;) {
        const uint64_t next = v >> 32, end = v & 0xFFFFFFFFu;
        if (next >= end) return -1;
        const uint64_t nv = back ? next << 32 | (end - 1) : (next + 1) << 32 | end;
        if (atomic_compare_exchange_weak_explicit(r, &v, nv, memory_order_relaxed, memory_order_relaxed))
            return (long)(back ? end - 1 : next);
    }
}

static void attn_worker(void *arg, int ith, int nth) {
    const attn_job *J = arg;
    attention_workspace *ws = J->ws;
    const attn_state own = thread_state(J, ith);
    /* Each part's look-ahead runs on into the next part this thread
     * computes (the next page run of a dense cache, or the next part of a
     * list), whose first blocks would otherwise start cold after the jump;
     * that part then skips the blocks already asked for (pf_from). Dense
     * parts were one page run each (32 blocks, 128 KB at 64 dims in F16), so
     * every part began with cache misses: bench_attention on 2 threads, six
     * alternated rounds on a Zen 5 guest, medians 9.67 -> 8.56 ms at 16K and
     * 19.95 -> 17.41 at 32K (F16), 6.29 -> 5.60 and 11.98 -> 11.11 (Q8_0).
     * With it, pages of 1024 blocks instead of 32 gained nothing clear. */
    const int A = look_ahead_blocks(J);
    long pf_from = 0, looked = -1; /* the item the last part's look-ahead ran into */
    uint64_t *qtag = &ws->q_tag[(size_t)ith * (size_t)ws->n_head];
    /* A thread takes the items of its range from the front; one that has
     * run out takes the others' last items from the back, so a thread held
     * up (by the machine, or by the caller's set-up) does not keep the rest
     * waiting at the merge. On a shared 2-vCPU guest the second thread was
     * at times ~20% slower for whole minutes: the first then took ~5 of the
     * 96 parts of a 16K F16 call from it, and bench_attention (5 alternated
     * rounds) went 7.59 -> 6.97 ms at 16K and 17.3 -> 14.8 ms at 32K, Q8_0
     * unchanged (5.34 -> 5.38, 10.49 -> 10.57). */
    for (;;) {
        _Atomic uint64_t *mine = &ws->range[(size_t)ith * RANGE_STRIDE];
        long i = range_take(mine, 0), i_next = -1, i_end = 0;
        if (i >= 0) {
            i_next = i + 1;
            i_end = (long)(atomic_load_explicit(mine, memory_order_relaxed) & 0xFFFFFFFFu);
        } else {
            _Atomic uint64_t *other = NULL;
            for (int t = 1; t < nth && i < 0; t++) {
                other = &ws->range[(size_t)((ith + t) % nth) * RANGE_STRIDE];
                i = range_take(other, 1);
            }
            if (i < 0) break;
            atomic_fetch_add_explicit(&g_taken, 1, memory_order_relaxed);
            /* the look-ahead runs into the item before, which it takes next if still there */
            if ((long)(atomic_load_explicit(other, memory_order_relaxed) >> 32) < i) {
                i_next = i - 1;
                i_end = i;
            }
        }
        const long u = ws->work_unit[i];
        const int s = ws->unit_seg[u];
        const int n_parts = (int)(ws->seg_start[s + 1] - ws->seg_start[s]);
        const int c = (int)(u - ws->seg_start[s]);
        const long sb = ws->unit_block[ws->seg_start[s]];
        const long kb = ws->unit_block[u] - sb, ke = ws->unit_block[u + 1] - sb;
        attn_ahead nx_store, *nx = NULL;
        if (i_next >= 0 && i_next < i_end) {
            nx_store = unit_continuation(J, ke, i_next, i_end);
            nx = &nx_store;
        }
        attn_state st = own;
        const long from = i == looked ? pf_from : 0;
        /* the next part's first A blocks are asked for by this one's look-ahead */
        pf_from = nx ? nx->b + A : 0;
        looked = nx ? i_next : -1;
        if (n_parts == 1) {
            run_part_ahead(J, &st, s, kb, ke, qtag, nx, from);
            write_out(J, &st, s);
            continue;
        }
        const size_t rp = round16((size_t)seg_rows(J, s));
        float *slot = part_slot(J, s, c);
        st.m = slot;
        st.l = slot + rp;
        st.acc = slot + 2 * rp;
        run_part_ahead(J, &st, s, kb, ke, qtag, nx, from);
    }
    /* Segments of several parts are merged once all their parts are done,
     * their rows split over the threads. In page order every segment's last
     * parts come at the end of the call, and one thread merging them all
     * (the last to finish one of each segment's parts) while the others
     * waited cost a decode step at 32K ~10% (Q8_0 cache, 64 parts per
     * head). */
    const long rows = ws->merge_row[J->n_seg];
    if (!rows) return;
    if (nth > 1) threadpool_barrier(&ws->merge_barrier, nth, 1);
    long r0, r1;
    threadpool_split(rows, ith, nth, 1, &r0, &r1);
    merge_rows(J, r0, r1);
}

static const attn_block_fn block_fns[] = {
    [ELLM_ISA_SCALAR] = attn_block_scalar,
    [ELLM_ISA_AVX2] = attn_block_avx2,
    [ELLM_ISA_AVX512] = attn_block_avx512,
};

static const attn_block_fn q8_block_fns[] = {
    [ELLM_ISA_SCALAR] = attn_block_q8_scalar,
    [ELLM_ISA_AVX2] = attn_block_q8_avx2,
    [ELLM_ISA_AVX512] = attn_block_q8_avx512,
};

/* A new wave number (never 0, which q_tag starts as). */
static unsigned next_call(attention_workspace *ws) {
    if (++ws->calls == 0) ws->calls = 1;
    return ws->calls;
}

/* Checks the call against the workspace and fills the job's shapes. */
static void job_init(attn_job *J, const attention_args *a, attention_workspace *ws, threadpool *pool) {
    const kv_cache_params *p = kv_cache_get_params(a->kv);
    int nth = pool ? threadpool_size(pool) : 1;
    ELLM_ASSERT(nth <= ws->n_threads);
    ELLM_ASSERT(a->n_q >= 1 && a->n_q <= ws->max_q && a->q_pos0 >= 0);
    ELLM_ASSERT(a->q_pos0 + a->n_q <= p->n_ctx && a->q_pos0 + a->n_q <= ws->max_ctx);
    ELLM_ASSERT(a->layer >= 0 && a->layer < p->n_layer);
    ELLM_ASSERT(a->n_head <= ws->n_head && a->n_head % p->n_kv_head == 0);
    ELLM_ASSERT(p->head_dim == ws->head_dim && p->block_tokens <= ws->block_tokens);
    memset(J, 0, sizeof *J);
    J->a = a;
    J->ws = ws;
    J->fn = p->type == QTYPE_Q8_0 ? q8_block_fns[ellm_cpu_isa()] : block_fns[ellm_cpu_isa()];
    if (J->fn == attn_block_q8_avx512 && !(ellm_cpu()->avx512vnni && ellm_cpu()->avx512vbmi))
        J->fn = attn_block_q8_avx2; /* its int8 instructions are missing */
    J->rows_fn = attn_rows_kernel(p->type); /* keeps lane sums too */
    J->rows2_fn = attn_rows_pair_kernel(p->type);
    /* the AVX-512 kernels' softmax keeps lane sums */
    J->lanes = J->fn == attn_block_avx512 || J->fn == attn_block_q8_avx512;
    J->hd = p->head_dim;
    J->bt = p->block_tokens;
    J->type = p->type;
    J->half_bytes = kv_cache_block_bytes(a->kv) / 2;
    J->n_kv = p->n_kv_head;
    J->group = a->n_head / p->n_kv_head;
    J->n_tiles = (a->n_q + ATTN_TILE_Q - 1) / ATTN_TILE_Q;
    J->n_seg = J->n_kv * J->n_tiles;
    J->t0 = 0;
    J->nt = J->n_tiles;
    J->n_blocks_cache = kv_cache_n_blocks(a->kv);
    J->call = next_call(ws);
    ELLM_ASSERT(J->n_seg <= ws->max_seg);
}

/* Blocks segment (h, tile t) walks: those the tile's last token can see, or h's list. */
static long seg_blocks(const attn_job *J, int h, int t, const int *n_blocks) {
    const attention_args *a = J->a;
    if (n_blocks) return n_blocks[h];
    int last = a->q_pos0 + (t + 1) * ATTN_TILE_Q; /* one past the tile's last token */
    if (last > a->q_pos0 + a->n_q) last = a->q_pos0 + a->n_q;
    return (last + J->bt - 1) / J->bt;
}

/* End (exclusive) of the part of a segment's list of nb blocks that starts at
 * index kb. Dense (list NULL): every ATTN_PART_BLOCKS blocks. A sparse list
 * of an F16 or F32 cache: where its blocks leave cache part list[kb] /
 * ATTN_PART_BLOCKS, the parts a cache sharded over MPI ranks keeps whole on
 * one rank, so that a sharded run gets one process's bits. A sparse list of
 * a Q8_0 cache, which is never sharded with a sparse index (the context
 * refuses it): every ATTN_PART_BLOCKS blocks of the list, so that chosen
 * blocks scattered over the cache fill a few parts instead of nearly one
 * part each, every part with its own start, kernel call and exact merge.
 * Llama-3.2-1B shape, Q8_0 KV, a 2,048-token budget at 98K (bench_sparse_
 * attention, 128 scattered blocks per head, 2 threads, 3 alternated rounds):
 * 7.6-8.4 -> 3.2-4.1 ms a step; the engine's own selection at 98K (ellm bench,
 * synthetic KV) fills 13.9 parts per head this way against 2, and its sparse
 * step went from 0.72-0.74 to 0.76-0.78 of the empty context's speed (4
 * alternated rounds; 32K: 0.75-0.77 to 0.76-0.80). Either cut depends only on
 * the list, never on the threads or the rows of the call. */
static long part_end(const attn_job *J, const int32_t *list, long kb, long nb) {
    if (!list || J->type == QTYPE_Q8_0) return kb + ATTN_PART_BLOCKS < nb ? kb + ATTN_PART_BLOCKS : nb;
    const int32_t c = list[kb] / ATTN_PART_BLOCKS;
    long k = kb + 1;
    while (k < nb && list[k] / ATTN_PART_BLOCKS == c) k++;
    return k;
}

/* Parts of segment (h, tile t). */
static long seg_parts(const attn_job *J, int h, int t, const int *n_blocks) {
    const long nb = seg_blocks(J, h, t, n_blocks);
    const int32_t *list = J->blocks ? J->blocks + (size_t)h * J->max_blocks : NULL;
    if (!list) return (nb + ATTN_PART_BLOCKS - 1) / ATTN_PART_BLOCKS;
    long n = 0;
    for (long k = 0; k < nb; k = part_end(J, list, k, nb)) n++;
    return n;
}

/* The order in which the threads take the wave's units, cut into nth
 * contiguous ranges of equal blocks (attn_worker). A sparse list's parts go
 * segment by segment. Dense parts go in page order: part c of every segment,
 * then part c + 1. Part c of every head of a layer is one page's run of that
 * layer (kv_cache.c: the heads' runs are adjacent), so a thread reads
 * 768 KB runs (3 KV heads, F16, 64 dims) instead of 256 KB ones, and a
 * prefill's tiles of one head read the same run one after another, from
 * L2. bench_attention on 2 threads (Zen 5 guest), a plain read of the
 * blocks in each order: 46.5-55.1 GB/s segment by segment, 55.5-62.1 in
 * page order (the streaming read 63-74); decode attention over 30 layers,
 * medians of 5 alternated rounds, F16 16K 8.81 -> 8.18 ms and 32K 18.84 ->
 * 16.82, Q8_0 (6 rounds) 5.80 -> 5.68 and 11.30 -> 10.80. Inside a whole
 * decode step (ellm bench) the gain measured smaller, 1-5%. The bits do
 * not depend on the order (the merge is exact, attention_merge.c). */
static void work_order(attn_job *J) {
    attention_workspace *ws = J->ws;
    long i = 0, blk = 0;
    if (J->blocks) {
        for (long u = 0; u < J->n_units; u++, i++) {
            ws->work_unit[i] = u;
            ws->work_block[i] = ws->unit_block[u];
        }
    } else {
        for (long c = 0; i < J->n_units; c++)
            for (int s = 0; s < J->n_seg; s++) {
                const long u = ws->seg_start[s] + c;
                if (u >= ws->seg_start[s + 1]) continue;
                ws->work_unit[i] = u;
                ws->work_block[i++] = blk;
                blk += ws->unit_block[u + 1] - ws->unit_block[u];
            }
    }
    ws->work_block[i] = ws->unit_block[J->n_units];
}

static void attention_run(const attention_args *a, const int32_t *blocks, const int *n_blocks,
                          int max_blocks, attention_workspace *ws, threadpool *pool) {
    attn_job J;
    job_init(&J, a, ws, pool);
    J.blocks = blocks;
    J.list_n = n_blocks;
    J.max_blocks = max_blocks;

    /* Waves of consecutive tiles whose parts fit the workspace's slots (one
     * tile always does). */
    for (int t0 = 0; t0 < J.n_tiles;) {
        int nt = 0;
        size_t floats = 0;
        long units = 0;
        while (t0 + nt < J.n_tiles) {
            const int t = t0 + nt;
            const int nqt = a->n_q - t * ATTN_TILE_Q < ATTN_TILE_Q ? a->n_q - t * ATTN_TILE_Q : ATTN_TILE_Q;
            size_t f = 0;
            long u = 0;
            for (int h = 0; h < J.n_kv; h++) {
                long parts = seg_parts(&J, h, t, n_blocks);
                u += parts;
                if (parts > 1) f += (size_t)parts * part_slot_floats(&J, nqt * J.group);
            }
            if (nt > 0 && (floats + f > ws->part_floats || units + u > ws->max_units)) break;
            floats += f;
            units += u;
            nt++;
        }
        J.t0 = t0;
        J.nt = nt;
        J.n_seg = J.n_kv * nt;
        if (t0 > 0) J.call = next_call(ws); /* segments are numbered per wave */
        long unit = 0, blk = 0, merge_rows_total = 0;
        size_t slot = 0;
        for (int s = 0; s < J.n_seg; s++) {
            const int h = s / nt, t = t0 + s % nt;
            const long nb = seg_blocks(&J, h, t, n_blocks);
            const long parts = seg_parts(&J, h, t, n_blocks);
            const int32_t *list = blocks ? blocks + (size_t)h * max_blocks : NULL;
            ws->seg_start[s] = unit;
            ws->seg_slot[s] = slot;
            if (parts > 1) slot += (size_t)parts * part_slot_floats(&J, seg_rows(&J, s));
            ws->merge_row[s] = merge_rows_total;
            if (parts > 1) merge_rows_total += seg_rows(&J, s);
            for (long k = 0; k < nb;) {
                const long e = part_end(&J, list, k, nb);
                ws->unit_seg[unit] = s;
                ws->unit_block[unit++] = blk;
                blk += e - k;
                k = e;
            }
        }
        ELLM_ASSERT(unit <= ws->max_units && slot <= ws->part_floats);
        ws->merge_row[J.n_seg] = merge_rows_total;
        atomic_store_explicit(&ws->merge_barrier, 0, memory_order_relaxed);
        ws->seg_start[J.n_seg] = unit;
        ws->unit_block[unit] = blk;
        J.n_units = unit;
        work_order(&J);
        const int nth = pool ? threadpool_size(pool) : 1;
        for (int t = 0; t < nth; t++) {
            long w0, w1;
            threadpool_split(ws->work_block[J.n_units], t, nth, 1, &w0, &w1);
            uint64_t r = (uint64_t)work_at(&J, w0) << 32 | (uint64_t)work_at(&J, w1);
            if (g_uneven) r = t ? 0 : (uint64_t)J.n_units; /* thread 0: [0, n_units) */
            atomic_store_explicit(&ws->range[(size_t)t * RANGE_STRIDE], r, memory_order_relaxed);
        }
        if (pool) threadpool_run(pool, attn_worker, &J);
        else attn_worker(&J, 0, 1);
        t0 += nt;
    }
}

/* A head's block list: 1..max_blocks entries, each a block of the cache. */
static void check_blocks(const int32_t *list, int n, int max_blocks, int n_blocks_cache) {
    ELLM_ASSERT(n >= 1 && n <= max_blocks);
    for (int i = 0; i < n; i++) ELLM_ASSERT(list[i] >= 0 && list[i] < n_blocks_cache);
}

/* Dense attention of the batch over positions [0, q_pos0 + n_q). With pool NULL
 * it runs on the calling thread. */
void attention_forward(const attention_args *a, attention_workspace *ws, threadpool *pool) {
    attention_run(a, NULL, NULL, 0, ws, pool);
}

void attention_forward_blocks(const attention_args *a, const int32_t *blocks, const int *n_blocks,
                              int max_blocks, attention_workspace *ws, threadpool *pool) {
    const int n_kv = kv_cache_get_params(a->kv)->n_kv_head, nb = kv_cache_n_blocks(a->kv);
    for (int h = 0; h < n_kv; h++)
        check_blocks(blocks + (size_t)h * max_blocks, n_blocks[h], max_blocks, nb);
    attention_run(a, blocks, n_blocks, max_blocks, ws, pool);
}

/* ---- selection and attention in one job ---------------------------------- */

/* Partial of part c of head h: m[rp], l[rp], acc[rows][hdp], rp the head's rows
 * rounded up to 16 (one tile, so heads have equal rows). */
static float *chunk_slot(const attn_job *J, int h, int c, size_t *rp) {
    const size_t rows = (size_t)seg_rows(J, h);
    *rp = round16(rows);
    size_t per = 2 * *rp + rows * (size_t)J->ws->hdp;
    return J->ws->chunk_mem + ((size_t)c * (size_t)J->n_kv + (size_t)h) * per;
}

/* Parts of a head's list one unit of attention_forward_select holds: a run
 * of consecutive parts stays on one thread, so the look-ahead of its blocks
 * (SPARSE_PREFETCH_BLOCKS) prefetches for the thread that reads them, and
 * the threads take fewer units from the shared counter. At a 2048-token
 * budget and 32K a part holds 2-3 blocks and a head ~50 parts; claimed one
 * at a time, the claims and the waits for a selection took ~5% of the
 * sparse attention's time on 2 threads. */
#define SELECT_UNIT_PARTS 4

/* Row r of head h of thread ith's running merge of the head's parts: the
 * bound of the parts added, the grid of that bound, then the binned sums
 * (attention_lse_*) kept on that grid. */
static int64_t *lse_acc(const attn_job *J, int ith, int h, int r) {
    const attention_workspace *ws = J->ws;
    const size_t row = (size_t)ith * (size_t)ws->lse_rows + (size_t)h * (size_t)seg_rows(J, h) + (size_t)r;
    return ws->lse_mem + row * lse_row_words(J->hd);
}

/* Adds part c of head h (its partial in st) to thread ith's running merge
 * of the head, started afresh in each call. Each part is added by the thread
 * that computed it, while its partial is in cache and the other threads
 * still compute; the merge of the head is then a merge of the threads'
 * sums, as processes holding shards of the cache merge theirs (attention.h:
 * the binned sums do not depend on the grouping, so the bits are those of
 * merging every part at once). */
static void lse_add_part(const attn_job *J, int ith, int h, int c, const attn_state *st) {
    attention_workspace *ws = J->ws;
    int *gen = &ws->lse_gen[(size_t)ith * (size_t)ws->max_seg + (size_t)h];
    const int fresh = *gen != ws->gen;
    *gen = ws->gen;
    for (int r = 0; r < st->rows; r++) {
        int64_t *w = lse_acc(J, ith, h, r);
        attention_lse_bound *b = (attention_lse_bound *)w;
        attention_lse_grid *g = (attention_lse_grid *)(b + 1);
        int64_t *sum = (int64_t *)(g + 1);
        _Static_assert(sizeof(attention_lse_grid) <= sizeof(attention_lse_bound), "lse_row_words");
        if (fresh) {
            attention_lse_bound_init(b);
            attention_lse_grid_init(g, b);
            memset(sum, 0, ATTENTION_LSE_SUMS((size_t)J->hd) * sizeof *sum);
        }
        /* a row with m = -inf adds nothing, as the merge skips it */
        attention_lse_accumulate(b, g, sum, c, st->m[r], st->l[r], st->acc + (size_t)r * st->hdp, J->hd);
    }
}

/* Output of head h from the threads' running merges of its parts: merge_slots'
 * bits. A row that saw keys of one part only gets that part's acc / l. */
static void lse_finish(const attn_job *J, int h, int n_threads) {
    attention_workspace *ws = J->ws;
    const int rows = seg_rows(J, h), hd = J->hd;
    int64_t sum[ATTENTION_LSE_SUMS(hd)], part[ATTENTION_LSE_SUMS(hd)];
    for (int r = 0; r < rows; r++) {
        attention_lse_bound b;
        attention_lse_bound_init(&b);
        for (int t = 0; t < n_threads; t++)
            if (ws->lse_gen[(size_t)t * (size_t)ws->max_seg + (size_t)h] == ws->gen)
                attention_lse_bound_merge(&b, (const attention_lse_bound *)lse_acc(J, t, h, r));
        const int one = attention_lse_single(&b);
        if (one >= 0) {
            size_t rp;
            const float *p = chunk_slot(J, h, one, &rp);
            attention_lse_one(p[rp + r], p + 2 * rp + (size_t)r * ws->hdp, hd, out_row(J, h, r));
            continue;
        }
        attention_lse_grid g;
        attention_lse_grid_init(&g, &b);
        memset(sum, 0, sizeof sum);
        for (int t = 0; t < n_threads; t++) {
            if (ws->lse_gen[(size_t)t * (size_t)ws->max_seg + (size_t)h] != ws->gen) continue;
            const attention_lse_bound *tb = (const attention_lse_bound *)lse_acc(J, t, h, r);
            const attention_lse_grid *tg = (const attention_lse_grid *)(tb + 1);
            memcpy(part, tg + 1, sizeof part);
            attention_lse_rebase(tg, &g, part, hd);
            for (size_t i = 0; i < ATTENTION_LSE_SUMS((size_t)hd); i++) sum[i] += part[i];
        }
        attention_lse_out(&g, sum, hd, out_row(J, h, r));
    }
}

/* Unit u (a value of the unit counter) as the run of KV head *h's parts
 * from part *c0; 0 if u is a selection unit or past the last unit. */
static int part_unit(const attn_job *J, int u, int *h, int *c0) {
    const int units = (J->ws->max_parts + SELECT_UNIT_PARTS - 1) / SELECT_UNIT_PARTS; /* per head */
    u -= J->n_kv;
    if (u < 0 || u >= J->n_kv * units) return 0;
    *h = u / units;
    *c0 = u % units * SELECT_UNIT_PARTS;
    return 1;
}

/* One past the last part of the unit from part c0 of a head with n_chunks. */
static inline int unit_end(int c0, int n_chunks) {
    return c0 + SELECT_UNIT_PARTS < n_chunks ? c0 + SELECT_UNIT_PARTS : n_chunks;
}

/* Points the look-ahead continuation ax (its `at` set, the rest empty) at
 * unit u's blocks if u is a run of parts whose selection is published;
 * else leaves it empty (the look-ahead stops at `at`). */
static void unit_ahead(const attn_job *J, int u, attn_ahead *ax) {
    const attention_workspace *ws = J->ws;
    int h, c0;
    if (!part_unit(J, u, &h, &c0) || atomic_load_explicit(&ws->sel_done[h], memory_order_acquire) != ws->gen)
        return;
    const int n_chunks = ws->sel_chunks[h];
    if (c0 >= n_chunks) return;
    const int *cut = ws->sel_cut + (size_t)h * (size_t)(ws->max_parts + 1);
    ax->h = h;
    ax->list = J->sel_blocks + (size_t)h * J->max_blocks;
    ax->b = cut[c0];
    ax->e = cut[unit_end(c0, n_chunks)];
}

/* Units, taken in order by whichever thread is free: first the selection of
 * each KV head, then for each head runs of SELECT_UNIT_PARTS of its max_parts
 * parts (a part: the run of its list within one cache part, see part_end;
 * those past the list's parts are empty). A unit waits until its head's
 * selection is published; selections come first and never wait, so the wait
 * always ends. A thread takes its next unit when it starts the last part of
 * the one it holds, so that part's look-ahead prefetches the blocks this
 * thread reads next (unit_ahead). Each thread adds the parts it computes to
 * its own running merge of the head (lse_add_part), and the last part of a
 * head to finish merges those (lse_finish), so the output does not depend on
 * the threads' timing. */
static void select_worker(void *arg, int ith, int nth) {
    attn_job *J = arg;
    attention_workspace *ws = J->ws;
    const attn_state own = thread_state(J, ith);
    int u = atomic_fetch_add_explicit(&ws->next_unit, 1, memory_order_relaxed);
    long warm_to = 0; /* pf_from of the unit's first part */
    for (;;) {
        if (u < J->n_kv) {
            int32_t *list = J->sel_blocks + (size_t)u * J->max_blocks;
            J->select(J->select_arg, u, ith, list, &J->sel_n[u]);
            check_blocks(list, J->sel_n[u], J->max_blocks, J->n_blocks_cache);
            int *cut = ws->sel_cut + (size_t)u * (size_t)(ws->max_parts + 1), nc = 0;
            for (long k = 0; k < J->sel_n[u]; k = part_end(J, list, k, J->sel_n[u])) cut[nc++] = (int)k;
            cut[nc] = J->sel_n[u];
            ws->sel_chunks[u] = nc;
            atomic_store_explicit(&ws->sel_done[u], ws->gen, memory_order_release);
            u = atomic_fetch_add_explicit(&ws->next_unit, 1, memory_order_relaxed);
            continue;
        }
        int h, c0;
        if (!part_unit(J, u, &h, &c0)) return;
        while (atomic_load_explicit(&ws->sel_done[h], memory_order_acquire) != ws->gen)
            __builtin_ia32_pause();
        const int n_chunks = ws->sel_chunks[h];
        const int *cut = ws->sel_cut + (size_t)h * (size_t)(ws->max_parts + 1);
        const int c1 = unit_end(c0, n_chunks);
        int next = -1;
        long next_warm = 0; /* list position of the next unit's head up to which its blocks were asked for */
        for (int c = c0; c < c1; c++) {
            attn_ahead ax = {.at = cut[c1]}; /* the look-ahead stays within this unit... */
            /* the unit's first part's first blocks: asked for by this thread's
             * previous part if it looked ahead into this unit */
            long pf_from = c > c0 ? cut[c1] : warm_to;
            if (c == c1 - 1) { /* ...but for its last part, which runs on into the next */
                next = atomic_fetch_add_explicit(&ws->next_unit, 1, memory_order_relaxed);
                unit_ahead(J, next, &ax);
                /* the look-ahead reaches SPARSE_PREFETCH_BLOCKS past the last block */
                next_warm = ax.e > ax.b ? ax.b + SPARSE_PREFETCH_BLOCKS : 0;
            }
            attn_state st = own;
            if (n_chunks == 1) {
                run_part_ahead(J, &st, h, cut[c], cut[c + 1], &ws->q_tag[(size_t)ith * (size_t)ws->n_head], &ax, pf_from);
                write_out(J, &st, h);
                continue;
            }
            size_t rp;
            float *slot = chunk_slot(J, h, c, &rp);
            st.m = slot;
            st.l = slot + rp;
            st.acc = slot + 2 * rp;
            run_part_ahead(J, &st, h, cut[c], cut[c + 1], &ws->q_tag[(size_t)ith * (size_t)ws->n_head], &ax, pf_from);
            lse_add_part(J, ith, h, c, &st);
            /* acq_rel: the last arrival sees every other thread's sums. */
            if (atomic_fetch_add_explicit(&ws->arrived[h], 1, memory_order_acq_rel) + 1 == n_chunks)
                lse_finish(J, h, nth);
        }
        warm_to = next >= 0 ? next_warm : 0;
        u = next >= 0 ? next : atomic_fetch_add_explicit(&ws->next_unit, 1, memory_order_relaxed);
    }
}

/* Selection of every head on the pool's threads (batches of more than one
 * tile, which are not the decode path: attention follows separately). */
static void select_all_task(void *arg, int ith, int nth) {
    attn_job *J = arg;
    for (int h = ith; h < J->n_kv; h += nth) {
        int32_t *list = J->sel_blocks + (size_t)h * J->max_blocks;
        J->select(J->select_arg, h, ith, list, &J->sel_n[h]);
        check_blocks(list, J->sel_n[h], J->max_blocks, J->n_blocks_cache);
    }
}

void attention_forward_select(const attention_args *a, attention_select_fn select, void *select_arg,
                              int32_t *blocks, int *n_blocks, int max_blocks,
                              attention_workspace *ws, threadpool *pool) {
    attn_job J;
    job_init(&J, a, ws, pool);
    J.select = select;
    J.select_arg = select_arg;
    J.sel_blocks = blocks;
    J.sel_n = n_blocks;
    J.blocks = blocks;
    J.list_n = n_blocks;
    J.max_blocks = max_blocks;
    if (J.n_tiles > 1) {
        if (pool) threadpool_run(pool, select_all_task, &J);
        else select_all_task(&J, 0, 1);
        attention_run(a, blocks, n_blocks, max_blocks, ws, pool);
        return;
    }
    if (++ws->gen == 0) ws->gen = 1; /* 0 is what sel_done starts as */
    atomic_store_explicit(&ws->next_unit, 0, memory_order_relaxed);
    for (int h = 0; h < J.n_kv; h++) atomic_store_explicit(&ws->arrived[h], 0, memory_order_relaxed);
    if (pool) threadpool_run(pool, select_worker, &J);
    else select_worker(&J, 0, 1);
}

/* ---- parts for a sharded KV cache ---------------------------------------- */

_Static_assert(ATTN_PART_BLOCKS == ATTENTION_PART_BLOCKS, "attention.h and the driver cut parts alike");
/* work_order's page order reads part c of a layer's heads as one run when a
 * long context's page holds exactly one part (kv_cache.h) */
_Static_assert(KV_PAGE_BLOCKS_LONG == ATTN_PART_BLOCKS, "a long-context page is one attention part");

int attention_n_tiles(const attention_args *a) { return (a->n_q + ATTN_TILE_Q - 1) / ATTN_TILE_Q; }

/* As attention_run counts them: blocks the tile's last token sees (seg_blocks), in parts. */
int attention_tile_parts(const attention_args *a, int t) {
    const int bt = kv_cache_get_params(a->kv)->block_tokens;
    int last = a->q_pos0 + (t + 1) * ATTN_TILE_Q;
    if (last > a->q_pos0 + a->n_q) last = a->q_pos0 + a->n_q;
    const int nb = (last + bt - 1) / bt;
    return (nb + ATTN_PART_BLOCKS - 1) / ATTN_PART_BLOCKS;
}

long attention_part_first(const attention_args *a, int t) {
    long n = 0;
    for (int i = 0; i < t; i++) n += attention_tile_parts(a, i);
    return n;
}

size_t attention_part_floats(const attention_args *a, int t) {
    const int i0 = t * ATTN_TILE_Q;
    const int nqt = a->n_q - i0 < ATTN_TILE_Q ? a->n_q - i0 : ATTN_TILE_Q;
    return (size_t)nqt * (size_t)a->n_head * (size_t)(kv_cache_get_params(a->kv)->head_dim + 2);
}

typedef struct {
    attn_job J;
    float *const *out_parts;     /* attention_forward_parts */
    const int *n_blocks;         /* attention_forward_parts with sparse lists, else NULL */
    const float *const *in_parts; /* attention_merge_parts */
    long n_rec;
} parts_job;

/* Record i's tile and part. */
static void rec_tile_part(const attention_args *a, long i, int *t, int *c) {
    int tt = 0;
    for (int np; i >= (np = attention_tile_parts(a, tt)); tt++) i -= np;
    *t = tt;
    *c = (int)i;
}

/* First index of an ascending list of n blocks whose block is >= b. */
static long list_lower(const int32_t *list, long n, long b) {
    long lo = 0, hi = n;
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (list[mid] < b) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Units (record, KV head) of the records wanted, dealt round-robin over the
 * threads (a rank's records interleave with the others', so a contiguous
 * split would be as good; each unit starts from an empty state, so who
 * computes it changes nothing). With sparse lists, part c of head h is the
 * run of h's list inside cache part c (part_end), as attention_run cuts it;
 * a head with no block there gets rows of m = -inf, l = 0, acc = 0, which
 * the merge skips as it skips such rows of a computed part. */
static void parts_worker(void *arg, int ith, int nth) {
    const parts_job *P = arg;
    const attn_job *J = &P->J;
    const attention_args *a = J->a;
    const attn_state own = thread_state(J, ith);
    const int hd = J->hd;
    long k = 0;
    int t = 0, c = 0;
    for (long i = 0; i < P->n_rec; i++) {
        if (!P->out_parts[i]) continue;
        rec_tile_part(a, i, &t, &c);
        for (int h = 0; h < J->n_kv; h++, k++) {
            if (k % nth != ith) continue;
            long kb = (long)c * ATTN_PART_BLOCKS, ke;
            if (J->blocks) {
                const int32_t *list = J->blocks + (size_t)h * J->max_blocks;
                const long n = P->n_blocks[h];
                ke = list_lower(list, n, kb + ATTN_PART_BLOCKS);
                kb = list_lower(list, n, kb);
            } else {
                const long nb = seg_blocks(J, 0, t, NULL);
                ke = kb + ATTN_PART_BLOCKS < nb ? kb + ATTN_PART_BLOCKS : nb;
            }
            attn_state st = own;
            if (kb < ke) {
                run_part(J, &st, h * J->nt + t, kb, ke, &J->ws->q_tag[(size_t)ith * (size_t)J->ws->n_head]);
            } else {
                st.rows = seg_rows(J, h * J->nt + t);
                for (int r = 0; r < st.rows; r++) {
                    st.m[r] = -INFINITY;
                    st.l[r] = 0.0f;
                    memset(st.acc + (size_t)r * st.hdp, 0, (size_t)hd * sizeof(float));
                }
            }
            float *rec = P->out_parts[i] + (size_t)h * st.rows * (size_t)(hd + 2);
            for (int r = 0; r < st.rows; r++, rec += hd + 2) {
                rec[0] = st.m[r];
                rec[1] = st.l[r];
                memcpy(rec + 2, st.acc + (size_t)r * st.hdp, (size_t)hd * sizeof(float));
            }
        }
    }
}

void attention_forward_parts(const attention_args *a, const int32_t *blocks, const int *n_blocks, int max_blocks,
                             float *const *parts, attention_workspace *ws, threadpool *pool) {
    parts_job P;
    job_init(&P.J, a, ws, pool);
    if (blocks) {
        const int n_kv = kv_cache_get_params(a->kv)->n_kv_head, nb = kv_cache_n_blocks(a->kv);
        for (int h = 0; h < n_kv; h++) {
            const int32_t *list = blocks + (size_t)h * max_blocks;
            check_blocks(list, n_blocks[h], max_blocks, nb);
            for (int i = 1; i < n_blocks[h]; i++) ELLM_ASSERT(list[i - 1] < list[i]);
        }
    }
    P.J.blocks = blocks;
    P.J.list_n = n_blocks;
    P.J.max_blocks = max_blocks;
    P.n_blocks = n_blocks;
    P.out_parts = parts;
    P.in_parts = NULL;
    P.n_rec = attention_part_first(a, P.J.n_tiles);
    if (pool) threadpool_run(pool, parts_worker, &P);
    else parts_worker(&P, 0, 1);
}

/* attention_forward's arithmetic over records: merge_slots' per row (a
 * segment of one part gives the same bits: its rows saw keys of that part
 * only, or of none). */
static void merge_worker(void *arg, int ith, int nth) {
    const parts_job *P = arg;
    const attn_job *J = &P->J;
    const attention_args *a = J->a;
    const int hd = J->hd;
    const long n_units = (long)J->n_tiles * J->n_kv;
    int64_t sum[ATTENTION_LSE_SUMS(hd)];
    long u0, u1;
    threadpool_split(n_units, ith, nth, 1, &u0, &u1);
    for (long u = u0; u < u1; u++) {
        const int t = (int)(u / J->n_kv), h = (int)(u % J->n_kv);
        const int rows = seg_rows(J, h * J->nt + t);
        const float *const *rec = P->in_parts + attention_part_first(a, t);
        const int np = attention_tile_parts(a, t);
        const size_t head_off = (size_t)h * rows * (size_t)(hd + 2);
        for (int r = 0; r < rows; r++) {
            const size_t off = head_off + (size_t)r * (size_t)(hd + 2);
            float *dst = out_row(J, h * J->nt + t, r);
            attention_lse_bound b;
            attention_lse_bound_init(&b);
            for (int i = 0; i < np; i++) attention_lse_bound_add(&b, i, rec[i][off], rec[i][off + 1], rec[i] + off + 2, hd);
            const int one = attention_lse_single(&b);
            if (one >= 0) {
                attention_lse_one(rec[one][off + 1], rec[one] + off + 2, hd, dst);
                continue;
            }
            attention_lse_grid g;
            attention_lse_grid_init(&g, &b);
            memset(sum, 0, sizeof sum);
            for (int i = 0; i < np; i++) attention_lse_sum(&g, rec[i][off], rec[i][off + 1], rec[i] + off + 2, hd, sum);
            attention_lse_out(&g, sum, hd, dst);
        }
    }
}

void attention_merge_parts(const attention_args *a, const float *const *parts, threadpool *pool) {
    parts_job P;
    memset(&P, 0, sizeof P);
    const kv_cache_params *p = kv_cache_get_params(a->kv);
    /* job_init's shapes without its workspace checks: merging needs no scratch */
    P.J.a = a;
    P.J.hd = p->head_dim;
    P.J.bt = p->block_tokens;
    P.J.n_kv = p->n_kv_head;
    P.J.group = a->n_head / p->n_kv_head;
    P.J.n_tiles = attention_n_tiles(a);
    P.J.t0 = 0;
    P.J.nt = P.J.n_tiles;
    P.J.n_seg = P.J.n_kv * P.J.n_tiles;
    P.in_parts = parts;
    P.n_rec = attention_part_first(a, P.J.n_tiles);
    if (pool) threadpool_run(pool, merge_worker, &P);
    else merge_worker(&P, 0, 1);
}

void attention_lse(const attention_args *a, const int32_t *blocks, const int *n_blocks, int max_blocks,
                   float *const *parts, float *lse, attention_workspace *ws, threadpool *pool) {
    attention_forward_parts(a, blocks, n_blocks, max_blocks, parts, ws, pool);
    const kv_cache_params *p = kv_cache_get_params(a->kv);
    const int hd = p->head_dim, n_kv = p->n_kv_head, group = a->n_head / n_kv;
    for (int t = 0; t < attention_n_tiles(a); t++) {
        float *const *rec = parts + attention_part_first(a, t);
        const int np = attention_tile_parts(a, t), i0 = t * ATTN_TILE_Q;
        const int rows = (a->n_q - i0 < ATTN_TILE_Q ? a->n_q - i0 : ATTN_TILE_Q) * group;
        for (int h = 0; h < n_kv; h++)
            for (int r = 0; r < rows; r++) {
                const size_t off = ((size_t)h * rows + (size_t)r) * (size_t)(hd + 2);
                /* parts without a key of the row hold l = 0 (m = -inf) */
                float m = -INFINITY;
                for (int i = 0; i < np; i++)
                    if (rec[i][off + 1] > 0.0f && rec[i][off] > m) m = rec[i][off];
                double l = 0.0;
                for (int i = 0; i < np; i++)
                    if (rec[i][off + 1] > 0.0f) l += (double)rec[i][off + 1] * exp((double)rec[i][off] - (double)m);
                lse[(size_t)(i0 + r / group) * a->n_head + (size_t)h * group + r % group] =
                    l > 0.0 ? (float)((double)m + log(l)) : -INFINITY;
            }
    }
}

/* ---- scalar block kernel ------------------------------------------------ */

/* Row by row: scores of the visible keys, online-softmax update, then P*V. */
void attn_block_scalar(attn_state *st, const attn_block *b) {
    const int G = st->group, R = st->rows, hd = st->head_dim, hdp = st->hdp;
    const int r0 = (b->vis0 >= 1 ? 0 : 1 - b->vis0) * G; /* first row that sees a key */
    if (r0 >= R) return;
    int nk = b->vis0 + (R - 1) / G; /* keys the last row sees */
    if (nk > b->n_valid) nk = b->n_valid;

    /* Keys to token-major F32 rows in kbuf (the cache holds them channel-major). */
    const int bt = st->block_tokens;
    const float *V;
    int ldv;
    for (int j = 0; j < nk; j++)
        for (int d = 0; d < hd; d++)
            st->kbuf[(size_t)j * hdp + d] =
                b->type == QTYPE_F32 ? ((const float *)b->k)[(size_t)d * bt + j]
                                     : ellm_f16_to_f32(((const ellm_f16 *)b->k)[(size_t)d * bt + j]);
    const float *K = st->kbuf;
    const int ldk = hdp;
    if (b->type == QTYPE_F32) {
        V = b->v;
        ldv = hd;
    } else {
        const ellm_f16 *v16 = b->v;
        for (int j = 0; j < nk; j++)
            for (int d = 0; d < hd; d++)
                st->vbuf[(size_t)j * hdp + d] = ellm_f16_to_f32(v16[(size_t)j * hd + d]);
        V = st->vbuf;
        ldv = hdp;
    }
    for (int r = r0; r < R; r++) {
        int nv = b->vis0 + r / G;
        if (nv > nk) nv = nk;
        const float *q = st->q + (size_t)r * hdp;
        float *s = st->s + (size_t)r * st->lds;
        float mx = -INFINITY;
        for (int j = 0; j < nv; j++) {
            const float *k = K + (size_t)j * ldk;
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += q[d] * k[d];
            s[j] = dot;
            if (dot > mx) mx = dot;
        }
        float *acc = attn_softmax_step_ref(st, r, s, nv, mx);
        for (int j = 0; j < nv; j++) {
            const float *v = V + (size_t)j * ldv;
            for (int d = 0; d < hd; d++) acc[d] += s[j] * v[d];
        }
    }
}

/* ---- reference ---------------------------------------------------------- */

static float ref_score(const attention_args *a, const float *q, int h, int pos) {
    const kv_cache_params *p = kv_cache_get_params(a->kv);
    if (p->type == QTYPE_Q8_0) {
        /* the kernels' score: the scaled query quantized, integer dot products (attention_q8.c) */
        const int hd = p->head_dim, bt = p->block_tokens;
        float x[4096], qd[128];
        int8_t q8[4096];
        int32_t qsum[128];
        for (int d = 0; d < hd; d++) x[d] = q[d] * a->scale;
        attn_q8_quantize_query(x, hd, q8, qd, qsum);
        const int8_t *k = kv_cache_block_k(a->kv, a->layer, h, pos / bt);
        return attn_q8_score_ref(q8, qd, k, (const uint16_t *)(k + (size_t)hd * bt), hd, bt, pos % bt);
    }
    float k[4096]; /* head_dim <= 4096 (kv_cache_init) */
    kv_cache_key(a->kv, a->layer, h, pos, k);
    float dot = 0.0f;
    for (int d = 0; d < p->head_dim; d++) dot += q[d] * k[d];
    return a->scale * dot;
}

/* Two passes per query row (max, then exp-weighted sum), recomputing the
 * scores instead of storing them, so the reference needs no memory. */
void attention_forward_ref(const attention_args *a) {
    const kv_cache_params *p = kv_cache_get_params(a->kv);
    const int hd = p->head_dim, G = a->n_head / p->n_kv_head;
    for (int i = 0; i < a->n_q; i++) {
        int n = a->q_pos0 + i + 1;
        for (int hq = 0; hq < a->n_head; hq++) {
            const int h = hq / G;
            const float *q = a->q + ((size_t)i * a->n_head + hq) * hd;
            float *out = a->out + ((size_t)i * a->n_head + hq) * hd;
            float mx = -INFINITY;
            for (int pos = 0; pos < n; pos++) {
                float s = ref_score(a, q, h, pos);
                if (s > mx) mx = s;
            }
            for (int d = 0; d < hd; d++) out[d] = 0.0f;
            float l = 0.0f;
            for (int pos = 0; pos < n; pos++) {
                float w = expf(ref_score(a, q, h, pos) - mx);
                float v[4096]; /* the value as stored, whatever the cache's type */
                kv_cache_value(a->kv, a->layer, h, pos, v);
                l += w;
                for (int d = 0; d < hd; d++) out[d] += w * v[d];
            }
            for (int d = 0; d < hd; d++) out[d] /= l;
        }
    }
}
