/* The converter's driver (see convert.h): plans the GGUF tensors from
 * config.json and the safetensors directory, then writes the file with one
 * row callback per tensor that converts chunks of rows on the thread pool. */
#include "convert/convert.h"

#include "convert/hf_config.h"
#include "convert/hf_vocab.h"
#include "convert/gptq.h"
#include "convert/imatrix.h"
#include "convert/safetensors.h"
#include "core/cpu.h"
#include "core/file_atomic.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "gguf/gguf_writer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- output types ---- */

static const convert_type cv_types[] = {
    {"f32", QTYPE_F32, 0, 1, "32-bit floats (exact)"},
    {"f16", QTYPE_F16, 1, 1, "16-bit floats"},
    {"bf16", QTYPE_BF16, 32, 1, "bfloat16 (exact for BF16 checkpoints)"},
    {"q8_0", QTYPE_Q8_0, 7, 1, "8-bit, blocks of 32 (8.5 bits per weight)"},
    {"q4_0", QTYPE_Q4_0, 2, 1, "4-bit, blocks of 32 (4.5 bits per weight); output matrix Q6_K"},
    {"q4_k_m", QTYPE_Q4_K, 15, 1, "4-bit K-quant, super-blocks of 256; Q6_K for output, some attn_v/ffn_down"},
    {"q6_k", QTYPE_Q6_K, 18, 1, "6-bit K-quant, super-blocks of 256 (6.56 bits per weight)"},
    {"int4-g128", QTYPE_INT4_G128, CONVERT_FTYPE_INT4_G128, 0,
     "4-bit, groups of 128 with scale and offset (4.25 bits per weight);\n"
     "             output matrix Q6_K, rows not a multiple of 128 Q4_0"},
};
#define N_CV_TYPES (int)(sizeof cv_types / sizeof cv_types[0])

const convert_type *convert_types(int *n) {
    *n = N_CV_TYPES;
    return cv_types;
}

const convert_type *convert_type_find(const char *name) {
    for (int i = 0; name && i < N_CV_TYPES; i++)
        if (!strcmp(name, cv_types[i].name)) return &cv_types[i];
    return NULL;
}

int convert_more_bits(int layer, int n_layer) {
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

int convert_matrix_type(const convert_type *t, int is_output, int more_bits, int64_t ne0) {
    int type = t->base;
    if ((t->base == QTYPE_Q4_0 || t->base == QTYPE_Q4_K || t->base == QTYPE_INT4_G128) && is_output)
        type = QTYPE_Q6_K;
    if (t->base == QTYPE_Q4_K && more_bits) type = QTYPE_Q6_K;
    if (ne0 % 256) {
        if (type == QTYPE_Q6_K) type = QTYPE_Q8_0;
        if (type == QTYPE_Q4_K) type = QTYPE_Q5_0; /* as llama-quantize */
    }
    if (type == QTYPE_INT4_G128 && ne0 % QK_G128) type = QTYPE_Q4_0;
    if (ne0 % qtype_get(type)->block_elems) type = QTYPE_F16;
    return type;
}

/* ---- the plan: one entry per GGUF tensor ---- */

typedef struct cv_ctx cv_ctx;

typedef struct {
    char name[64];          /* GGUF name */
    const st_tensor *src;   /* NULL for generated tensors (rope_freqs) */
    const float *gen;       /* generated data (ne0 floats) */
    int type;               /* output qtype */
    int64_t ne0, ne1;       /* GGUF dims: ne0 = elements per row, ne1 rows */
    int n_dims;
    int permute_heads;      /* > 0: llama Q/K row permutation over this many heads */
    const float *imatrix;   /* (ne0) column importances, or NULL */
    const float *cov;       /* (ne0 x cov_block) input covariance blocks, or NULL */
    int cov_block;
    cv_ctx *ctx;
    int index;
} cv_tensor;

struct cv_ctx {
    const convert_params *p;
    hf_config cfg;
    st_set *st;
    cv_vocab vocab;
    cv_imatrix imatrix;
    gguf_writer *w;
    cv_tensor *t;
    int n_t;
    float *rope_freqs;
    threadpool *pool;
    /* Chunk being served: rows [chunk_row0, chunk_row0 + chunk_rows) of
     * tensor chunk_tensor, converted into chunk (out row bytes each). */
    uint8_t *chunk;
    size_t chunk_cap;
    int chunk_tensor;
    int64_t chunk_row0, chunk_rows;
    float *scratch;         /* n_threads x max_ne0 floats */
    /* Error-feedback rounding of the tensor being converted (gptq_tensor):
     * the damped covariance blocks and the Cholesky factors of their
     * inverses (gptq_prepare), ne0 x cov_block each. */
    int gptq_tensor;
    float *gptq_H, *gptq_U;
    size_t gptq_cap;
    gptq_scratch **gptq_scratch; /* n_threads of them, for rows of max_ne0 */
    int n_threads;
    int64_t max_ne0;
    /* progress */
    uint64_t src_total, src_before, out_total, out_before;
    double t0_ms;
    ellm_error job_err;
};

/* Output chunk target: big enough to amortize a pool launch, small enough to
 * keep memory flat. */
#define CV_CHUNK_BYTES ((size_t)8 << 20)

/* Source row of GGUF row r of a Q or K matrix: HF keeps each head's two
 * rotary halves apart (rotate-half); GGUF llama interleaves them in pairs. */
static inline int64_t permuted_row(int64_t r, int64_t rows, int n_heads) {
    int64_t hd = rows / n_heads, h = r / hd, rem = r % hd;
    return h * hd + (rem % 2) * (hd / 2) + rem / 2;
}

typedef struct {
    cv_ctx *c;
    const cv_tensor *t;
    size_t out_row;
    int64_t bad_row; /* first row holding a value the output type cannot take, or INT64_MAX */
} cv_job;

/* Largest magnitude a weight may have in a file of qtype `type`: every type
 * but F32 and BF16 stores F16 values or F16 block scales, and a weight past
 * F16's range would turn them infinite (and the quantizers' integer
 * conversions undefined). NaN and infinities are refused for every type. */
static float cv_weight_limit(int type) {
    return type == QTYPE_F32 || type == QTYPE_BF16 ? 3.4028235e38f : 65504.0f;
}



/* Row r of tensor t as floats: the source row (its Q/K permutation
 * applied) converted into x (ne0 floats), or the generated data. */
static const float *load_row(const cv_tensor *t, int64_t r, float *x) {
    if (!t->src) return t->gen + r * t->ne0;
    size_t esz = st_dtype_size(t->src->dtype);
    int stype = t->src->dtype == ST_F32 ? QTYPE_F32 : t->src->dtype == ST_F16 ? QTYPE_F16 : QTYPE_BF16;
    if (t->permute_heads && t->ne1 == 1) {
        /* A 1-D bias of a permuted matrix: permute its elements. */
        for (int64_t k = 0; k < t->ne0; k++) {
            int64_t sk = permuted_row(k, t->ne0, t->permute_heads);
            kern_dequantize(stype, (const uint8_t *)t->src->data + (size_t)sk * esz, x + k, 1);
        }
        return x;
    }
    int64_t sr = t->permute_heads ? permuted_row(r, t->ne1, t->permute_heads) : r;
    kern_dequantize(stype, (const uint8_t *)t->src->data + (size_t)sr * (size_t)t->ne0 * esz, x, t->ne0);
    return x;
}

/* Converts rows [chunk_row0, +chunk_rows) of a tensor: thread ith takes an
 * equal share. */
static void chunk_job(void *arg, int ith, int nth) {
    cv_job *j = arg;
    cv_ctx *c = j->c;
    const cv_tensor *t = j->t;
    long b, e;
    threadpool_split((long)c->chunk_rows, ith, nth, 1, &b, &e);
    float *x = c->scratch + (size_t)ith * (size_t)c->max_ne0;
    const float lim = cv_weight_limit(t->type);
    for (long i = b; i < e; i++) {
        int64_t r = c->chunk_row0 + i;
        const float *row = load_row(t, r, x);
        if (kern_first_out_of_range(row, t->ne0, lim) >= 0) {
            /* Record the first bad row; cv_row reports it. */
            int64_t cur = __atomic_load_n(&j->bad_row, __ATOMIC_RELAXED);
            while (r < cur &&
                   !__atomic_compare_exchange_n(&j->bad_row, &cur, r, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            }
            continue;
        }
        uint8_t *out = c->chunk + (size_t)i * j->out_row;
        if (c->gptq_tensor == t->index &&
            gptq_quantize_row(t->type, row, out, t->ne0, t->imatrix, c->gptq_H, c->gptq_U, t->cov_block,
                              c->gptq_scratch[ith]))
            continue;
        if (t->imatrix)
            qtype_quantize_weighted(t->type, row, out, t->ne0, t->imatrix, t->ne0);
        else
            kern_quantize(t->type, row, out, t->ne0);
    }
}

/* The error for row `r` of `t`, which kern_first_out_of_range flagged: names the file,
 * the tensor, the row, the column and the value. */
static ellm_status bad_row_error(cv_ctx *c, const cv_tensor *t, int64_t r, ellm_error *err) {
    const char *file = t->src ? st_file_name(c->st, t->src->file) : "(generated)";
    const char *name = t->src ? t->src->name : t->name;
    const float *row = load_row(t, r, c->scratch); /* the pool is idle: thread 0's row is free */
    int64_t k = kern_first_out_of_range(row, t->ne0, cv_weight_limit(t->type));
    float v = k >= 0 ? row[k] : 0.0f;
    if (isnan(v) || isinf(v))
        return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': tensor '%s' holds %s at row %lld, column %lld", file, name,
                         isnan(v) ? "NaN" : "an infinity", (long long)r, (long long)k);
    return ellm_fail(err, ELLM_ERR_FORMAT,
                     "'%s': tensor '%s' holds %g at row %lld, column %lld, outside the F16 range (+-65504) in "
                     "which %s stores its values or block scales",
                     file, name, (double)v, (long long)r, (long long)k, qtype_get(t->type)->name);
}

static void report(cv_ctx *c, const cv_tensor *t, int64_t rows_done, int finished) {
    if (!c->p->progress) return;
    uint64_t src_row = t->src ? (uint64_t)t->src->n_bytes / (uint64_t)t->ne1 : 0;
    convert_progress pr = {
        .tensor = t->name,
        .index = t->index,
        .n_tensors = c->n_t,
        .type = t->type,
        .src_done = c->src_before + src_row * (uint64_t)rows_done,
        .src_total = c->src_total,
        .out_done = c->out_before + qtype_row_bytes(t->type, t->ne0) * (uint64_t)rows_done,
        .out_total = c->out_total,
        .elapsed_s = (ellm_time_ms() - c->t0_ms) / 1e3,
        .tensor_finished = finished,
    };
    c->p->progress(c->p->progress_user, &pr);
}

/* Damping of the covariance before inversion, as a share of its mean
 * diagonal (GPTQ's default). */
#define CV_GPTQ_DAMP 0.01

/* Readies error-feedback rounding for tensor t; a covariance that is not
 * positive definite even damped leaves it to the element-wise rounding. */
static ellm_status cv_gptq_begin(cv_ctx *c, const cv_tensor *t, ellm_error *err) {
    if (!c->gptq_scratch) {
        c->gptq_scratch = calloc((size_t)c->n_threads, sizeof *c->gptq_scratch);
        int ok = c->gptq_scratch != NULL;
        for (int i = 0; ok && i < c->n_threads; i++) ok = (c->gptq_scratch[i] = gptq_scratch_new(c->max_ne0)) != NULL;
        if (!ok) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory for error-feedback rounding");
    }
    size_t need = (size_t)t->ne0 * (size_t)t->cov_block;
    if (need > c->gptq_cap) {
        free(c->gptq_H);
        free(c->gptq_U);
        c->gptq_H = malloc(need * sizeof(float));
        c->gptq_U = malloc(need * sizeof(float));
        c->gptq_cap = c->gptq_H && c->gptq_U ? need : 0;
        if (!c->gptq_cap) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory for the covariance of '%s'", t->name);
    }
    c->gptq_tensor = gptq_prepare(t->cov, t->ne0, t->cov_block, CV_GPTQ_DAMP, c->gptq_H, c->gptq_U)
                         ? t->index : -1;
    return ELLM_OK;
}

/* gguf_writer row callback. */
static ellm_status cv_row(void *user, int64_t row, void *dst, size_t n_bytes, ellm_error *err) {
    cv_tensor *t = user;
    cv_ctx *c = t->ctx;
    if (c->p->cancel && *c->p->cancel) return ellm_fail(err, ELLM_ERR_IO, "interrupted");
    if (c->chunk_tensor != t->index || row < c->chunk_row0 || row >= c->chunk_row0 + c->chunk_rows) {
        if (c->chunk_tensor != t->index && row == 0) {
            report(c, t, 0, 0);
            if (t->cov && t->imatrix) {
                ellm_status st = cv_gptq_begin(c, t, err);
                if (st) return st;
            }
            if (t->index == 0) st_prefetch(c->st, t->src);
            if (t->index + 1 < c->n_t) st_prefetch(c->st, c->t[t->index + 1].src);
        }
        size_t out_row = n_bytes;
        size_t src_row = t->src ? st_dtype_size(t->src->dtype) * (size_t)t->ne0 : out_row;
        size_t per = out_row > src_row ? out_row : src_row;
        int64_t n = (int64_t)(CV_CHUNK_BYTES / (per ? per : 1));
        if (n < 1) n = 1;
        if (n > t->ne1 - row) n = t->ne1 - row;
        if ((size_t)n * out_row > c->chunk_cap) {
            free(c->chunk);
            c->chunk_cap = (size_t)n * out_row;
            c->chunk = malloc(c->chunk_cap);
            if (!c->chunk) {
                c->chunk_cap = 0;
                return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory for a %zu-byte chunk", (size_t)n * out_row);
            }
        }
        c->chunk_tensor = t->index;
        c->chunk_row0 = row;
        c->chunk_rows = n;
        cv_job j = {c, t, out_row, INT64_MAX};
        threadpool_run(c->pool, chunk_job, &j);
        if (j.bad_row != INT64_MAX) return bad_row_error(c, t, j.bad_row, err);
        int64_t done = row + n;
        report(c, t, done, done == t->ne1);
        if (done == t->ne1) {
            /* Done with the source: its mapped pages leave this process
             * (resident memory ~ the largest tensor, not the checkpoint). */
            st_release(c->st, t->src);
            c->src_before += t->src ? t->src->n_bytes : 0;
            c->out_before += (uint64_t)out_row * (uint64_t)t->ne1;
        }
    }
    memcpy(dst, c->chunk + (size_t)(row - c->chunk_row0) * n_bytes, n_bytes);
    return ELLM_OK;
}

/* ---- planning ---- */

/* Checks the HF tensor `hf_name` against the shape config.json implies:
 * [rows, cols] (cols 0: a 1-D tensor of `rows`). */
static ellm_status check_src(cv_ctx *c, const char *hf_name, int64_t rows, int64_t cols, const char *why,
                             const st_tensor **out, ellm_error *err) {
    const st_tensor *s = st_find(c->st, hf_name);
    *out = s;
    if (!s) return ellm_fail(err, ELLM_ERR_FORMAT, "tensor '%s' is missing from the safetensors files", hf_name);
    const char *file = st_file_name(c->st, s->file);
    if (s->dtype != ST_F32 && s->dtype != ST_F16 && s->dtype != ST_BF16)
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED, "'%s': tensor '%s' has dtype %s (F32, F16 or BF16 can be converted)",
                         file, hf_name, st_dtype_name(s->dtype));
    int ok = cols ? s->n_dims == 2 && s->shape[0] == rows && s->shape[1] == cols
                  : s->n_dims == 1 && s->shape[0] == rows;
    if (!ok) {
        char got[96] = "[";
        for (int i = 0; i < s->n_dims; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)s->shape[i]);
        strcat(got, "]");
        if (cols)
            return ellm_fail(err, ELLM_ERR_FORMAT,
                             "'%s': tensor '%s' has shape %s but config.json (%s) implies [%lld, %lld]", file, hf_name,
                             got, why, (long long)rows, (long long)cols);
        return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': tensor '%s' has shape %s but config.json (%s) implies [%lld]",
                         file, hf_name, got, why, (long long)rows);
    }
    return ELLM_OK;
}

static ellm_status plan_add(cv_ctx *c, const char *gguf_name, const st_tensor *src, int64_t ne0, int64_t ne1,
                            int n_dims, int type, int permute_heads, ellm_error *err) {
    (void)err;
    cv_tensor *t = &c->t[c->n_t];
    snprintf(t->name, sizeof t->name, "%s", gguf_name);
    t->src = src;
    t->type = type;
    t->ne0 = ne0;
    t->ne1 = ne1;
    t->n_dims = n_dims;
    t->permute_heads = permute_heads;
    t->ctx = c;
    t->index = c->n_t++;
    if (ne0 > c->max_ne0) c->max_ne0 = ne0;
    return ELLM_OK;
}

/* A 2-D weight: HF [rows, cols] -> GGUF ne {cols, rows}. */
static ellm_status plan_matrix(cv_ctx *c, const convert_type *ty, const char *hf, const char *gg, int64_t rows,
                               int64_t cols, const char *why, int is_output, int more_bits, int permute_heads,
                               ellm_error *err) {
    const st_tensor *s;
    ellm_status st = check_src(c, hf, rows, cols, why, &s, err);
    if (st) return st;
    return plan_add(c, gg, s, cols, rows, 2, convert_matrix_type(ty, is_output, more_bits, cols), permute_heads, err);
}

/* A 1-D vector (norm or bias): always F32, as llama.cpp keeps them. */
static ellm_status plan_vector(cv_ctx *c, const char *hf, const char *gg, int64_t n, const char *why, int permute_heads,
                               ellm_error *err) {
    const st_tensor *s;
    ellm_status st = check_src(c, hf, n, 0, why, &s, err);
    if (st) return st;
    return plan_add(c, gg, s, n, 1, 1, QTYPE_F32, permute_heads, err);
}

/* HF names of a layer's tensors that the plan consumes are checked off here
 * so that anything left over can be reported. */
static int known_extra(const char *name) {
    const char *s = strstr(name, "rotary_emb.inv_freq");
    return s && !s[strlen("rotary_emb.inv_freq")];
}

static ellm_status plan(cv_ctx *c, const convert_type *ty, ellm_error *err) {
    const hf_config *h = &c->cfg;
    const int64_t d = h->n_embd, hd = h->head_dim, nq = h->n_head * hd, nkv = h->n_head_kv * hd, ff = h->n_ff;
    const int perm = h->permute_qk;
    int cap = 4 + (int)h->n_layer * 16;
    c->t = calloc((size_t)cap, sizeof *c->t);
    if (!c->t) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    ellm_status st;
    const int has_lm_head = st_find(c->st, "lm_head.weight") != NULL;
    const int tied = h->tied || !has_lm_head;
    if (!h->tied && !has_lm_head)
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tensor 'lm_head.weight' is missing from the safetensors files (config.json: "
                         "tie_word_embeddings is false)");
    if ((st = plan_matrix(c, ty, "model.embed_tokens.weight", "token_embd.weight", h->n_vocab, d,
                          "vocab_size x hidden_size", tied, 0, 0, err)))
        return st;
    if (h->rope_scaling == HF_ROPE_LLAMA3 && h->arch != HF_ARCH_QWEN2 && h->arch != HF_ARCH_QWEN3) {
        c->rope_freqs = malloc((size_t)(hd / 2) * sizeof(float));
        if (!c->rope_freqs) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
        hf_config_llama3_rope_freqs(h, c->rope_freqs);
        plan_add(c, "rope_freqs.weight", NULL, hd / 2, 1, 1, QTYPE_F32, 0, err);
        c->t[c->n_t - 1].gen = c->rope_freqs;
    }
    for (int l = 0; l < h->n_layer; l++) {
        char hf[128], gg[64];
        int more = convert_more_bits(l, (int)h->n_layer);
#define HF(s) (snprintf(hf, sizeof hf, "model.layers.%d." s, l), hf)
#define GG(s) (snprintf(gg, sizeof gg, "blk.%d." s, l), gg)
        if ((st = plan_vector(c, HF("input_layernorm.weight"), GG("attn_norm.weight"), d, "hidden_size", 0, err)) ||
            (st = plan_matrix(c, ty, HF("self_attn.q_proj.weight"), GG("attn_q.weight"), nq, d,
                              "num_attention_heads x head size, hidden_size", 0, 0, perm ? (int)h->n_head : 0, err)) ||
            (st = plan_matrix(c, ty, HF("self_attn.k_proj.weight"), GG("attn_k.weight"), nkv, d,
                              "num_key_value_heads x head size, hidden_size", 0, 0, perm ? (int)h->n_head_kv : 0,
                              err)) ||
            (st = plan_matrix(c, ty, HF("self_attn.v_proj.weight"), GG("attn_v.weight"), nkv, d,
                              "num_key_value_heads x head size, hidden_size", 0, more, 0, err)))
            return st;
        /* Q/K/V biases: required for Qwen2, taken when present otherwise. */
        static const char *const bias_hf[3] = {"self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                               "self_attn.v_proj.bias"};
        static const char *const bias_gg[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
        for (int k = 0; k < 3; k++) {
            snprintf(hf, sizeof hf, "model.layers.%d.%s", l, bias_hf[k]);
            snprintf(gg, sizeof gg, "blk.%d.%s", l, bias_gg[k]);
            if (h->arch != HF_ARCH_QWEN2 && !st_find(c->st, hf)) continue;
            int ph = perm ? (int)(k == 0 ? h->n_head : k == 1 ? h->n_head_kv : 0) : 0;
            if ((st = plan_vector(c, hf, gg, k ? nkv : nq, "attention heads x head size", ph, err))) return st;
        }
        if (h->arch == HF_ARCH_QWEN3 &&
            ((st = plan_vector(c, HF("self_attn.q_norm.weight"), GG("attn_q_norm.weight"), hd, "head_dim", 0, err)) ||
             (st = plan_vector(c, HF("self_attn.k_norm.weight"), GG("attn_k_norm.weight"), hd, "head_dim", 0, err))))
            return st;
        if ((st = plan_matrix(c, ty, HF("self_attn.o_proj.weight"), GG("attn_output.weight"), d, nq,
                              "hidden_size, num_attention_heads x head size", 0, 0, 0, err)) ||
            (st = plan_vector(c, HF("post_attention_layernorm.weight"), GG("ffn_norm.weight"), d, "hidden_size", 0,
                              err)) ||
            (st = plan_matrix(c, ty, HF("mlp.gate_proj.weight"), GG("ffn_gate.weight"), ff, d,
                              "intermediate_size, hidden_size", 0, 0, 0, err)) ||
            (st = plan_matrix(c, ty, HF("mlp.up_proj.weight"), GG("ffn_up.weight"), ff, d,
                              "intermediate_size, hidden_size", 0, 0, 0, err)) ||
            (st = plan_matrix(c, ty, HF("mlp.down_proj.weight"), GG("ffn_down.weight"), d, ff,
                              "hidden_size, intermediate_size", 0, more, 0, err)))
            return st;
#undef HF
#undef GG
    }
    if ((st = plan_vector(c, "model.norm.weight", "output_norm.weight", d, "hidden_size", 0, err))) return st;
    if (!tied && (st = plan_matrix(c, ty, "lm_head.weight", "output.weight", h->n_vocab, d,
                                   "vocab_size x hidden_size", 1, 0, 0, err)))
        return st;
    /* A tensor the plan does not use means a layout this converter does not
     * understand (e.g. more layers than config.json says): refuse it rather
     * than write a model without it. */
    for (int64_t i = 0; i < st_n_tensors(c->st); i++) {
        const st_tensor *s = st_tensor_at(c->st, i);
        int used = known_extra(s->name) || (tied && !strcmp(s->name, "lm_head.weight"));
        for (int k = 0; k < c->n_t && !used; k++) used = c->t[k].src == s;
        if (!used)
            return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': tensor '%s' is not part of a %s with %lld layers",
                             st_file_name(c->st, s->file), s->name, h->hf_name, (long long)h->n_layer);
    }
    return ELLM_OK;
}

/* Metadata keys as llama.cpp's converter writes them. */
static ellm_status write_metadata(cv_ctx *c, const convert_type *ty, const char *name, ellm_error *err) {
    const hf_config *h = &c->cfg;
    gguf_writer *w = c->w;
    char key[96];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, h->gguf_arch), key)
    gguf_writer_add_str(w, "general.architecture", h->gguf_arch, err);
    gguf_writer_add_str(w, "general.type", "model", err);
    gguf_writer_add_str(w, "general.name", name, err);
    gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)h->n_layer, err);
    gguf_writer_add_u32(w, KEY("context_length"), (uint32_t)h->n_ctx, err);
    gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)h->n_embd, err);
    gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)h->n_ff, err);
    gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)h->n_head, err);
    gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)h->n_head_kv, err);
    if (h->rope_scaling == HF_ROPE_LINEAR) {
        gguf_writer_add_str(w, KEY("rope.scaling.type"), "linear", err);
        gguf_writer_add_f32(w, KEY("rope.scaling.factor"), (float)h->rope_factor, err);
    } else if (h->rope_scaling == HF_ROPE_YARN) {
        gguf_writer_add_str(w, KEY("rope.scaling.type"), "yarn", err);
        gguf_writer_add_f32(w, KEY("rope.scaling.factor"), (float)h->rope_factor, err);
        gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)h->rope_orig_ctx, err);
        /* llama.cpp's converter writes these three; eLLM reads them (llama.cpp does not, for these architectures) */
        if (h->yarn_beta_fast > 0) gguf_writer_add_f32(w, KEY("rope.scaling.yarn_beta_fast"), (float)h->yarn_beta_fast, err);
        if (h->yarn_beta_slow > 0) gguf_writer_add_f32(w, KEY("rope.scaling.yarn_beta_slow"), (float)h->yarn_beta_slow, err);
        if (h->yarn_attn_factor > 0)
            gguf_writer_add_f32(w, KEY("rope.scaling.yarn_attn_factor"), (float)h->yarn_attn_factor, err);
    }
    gguf_writer_add_f32(w, KEY("rope.freq_base"), (float)h->rope_theta, err);
    gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), (float)h->rms_eps, err);
    if (h->head_dim_given) {
        gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)h->head_dim, err);
        gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)h->head_dim, err);
    }
    gguf_writer_add_u32(w, "general.file_type", (uint32_t)ty->file_type, err);
    if (!strcmp(h->gguf_arch, "llama")) {
        gguf_writer_add_u32(w, KEY("vocab_size"), (uint32_t)h->n_vocab, err);
        gguf_writer_add_u32(w, KEY("rope.dimension_count"), (uint32_t)h->head_dim, err);
    }
#undef KEY
    if (qtype_get(ty->base)->block_elems > 1) gguf_writer_add_u32(w, "general.quantization_version", 2, err);
    return cv_vocab_write(&c->vocab, w, err);
}

/* ---- writing ---- */

/* Writes the GGUF under a temporary name next to `out_path`, syncs it and
 * renames it into place (core/file_atomic). */
static ellm_status write_atomically(cv_ctx *c, const char *out_path, ellm_error *err) {
    file_atomic af;
    ellm_status st = file_atomic_open(out_path, &af, err);
    if (st != ELLM_OK) return st;
    if ((st = gguf_writer_write_fp(c->w, af.f, out_path, err)) != ELLM_OK) {
        file_atomic_abort(&af);
        return st;
    }
    return file_atomic_commit(&af, err);
}

/* The folder's last path component, for general.name. */
static void base_name(const char *dir, char *out, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(out, cap, "%.*s", (int)(n - b), dir + b);
}

ellm_status convert_hf_to_gguf(const char *hf_dir, const char *out_path, const convert_params *p,
                               convert_summary *sum, ellm_error *err) {
    if (!hf_dir || !out_path || !p) return ellm_fail(err, ELLM_ERR_ARG, "convert: NULL argument");
    const convert_type *ty = convert_type_find(p->type);
    if (!ty) return ellm_fail(err, ELLM_ERR_ARG, "unknown output type '%s'", p->type ? p->type : "(null)");
    cv_ctx c = {.p = p, .chunk_tensor = -1, .gptq_tensor = -1, .t0_ms = ellm_time_ms()};
    ellm_status st = hf_config_load(hf_dir, &c.cfg, err);
    if (st == ELLM_OK) st = st_open_dir(hf_dir, &c.st, err);
    if (st == ELLM_OK) st = plan(&c, ty, err);
    if (st == ELLM_OK) st = cv_vocab_load(hf_dir, c.cfg.n_vocab, &c.vocab, err);
    if (st == ELLM_OK && p->imatrix) {
        st = cv_imatrix_load(p->imatrix, &c.imatrix, err);
        for (int i = 0; i < c.n_t && st == ELLM_OK; i++)
            if (c.t[i].n_dims == 2) {
                c.t[i].imatrix = cv_imatrix_find(&c.imatrix, c.t[i].name, c.t[i].ne0);
                c.t[i].cov = cv_imatrix_find_cov(&c.imatrix, c.t[i].name, c.t[i].ne0, &c.t[i].cov_block);
            }
    }
    if (st == ELLM_OK) st = gguf_writer_init(&c.w, err);
    char name[256];
    base_name(hf_dir, name, sizeof name);
    if (st == ELLM_OK) st = write_metadata(&c, ty, name, err);
    for (int i = 0; i < c.n_t && st == ELLM_OK; i++) {
        cv_tensor *t = &c.t[i];
        int64_t ne[2] = {t->ne0, t->ne1};
        st = gguf_writer_add_tensor_rows(c.w, t->name, t->n_dims, ne, t->type, cv_row, t, err);
        c.src_total += t->src ? t->src->n_bytes : 0;
        c.out_total += qtype_row_bytes(t->type, t->ne0) * (uint64_t)t->ne1;
    }
    int n_threads = p->n_threads > 0 ? p->n_threads : ellm_default_threads();
    c.n_threads = n_threads;
    if (st == ELLM_OK) st = threadpool_init(n_threads, 0, &c.pool, err);
    if (st == ELLM_OK) {
        c.scratch = malloc((size_t)n_threads * (size_t)c.max_ne0 * sizeof(float));
        if (!c.scratch) st = ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    }
    if (st == ELLM_OK) st = write_atomically(&c, out_path, err);
    if (st == ELLM_OK && sum) {
        memset(sum, 0, sizeof *sum);
        sum->n_tensors = c.n_t;
        sum->src_bytes = c.src_total;
        sum->out_bytes = gguf_writer_file_size(c.w);
        for (int i = 0; i < c.n_t; i++) sum->n_params += (uint64_t)(c.t[i].ne0 * c.t[i].ne1);
        sum->seconds = (ellm_time_ms() - c.t0_ms) / 1e3;
        snprintf(sum->arch, sizeof sum->arch, "%s", c.cfg.gguf_arch);
    }
    if (c.pool) threadpool_free(c.pool);
    gguf_writer_free(c.w);
    cv_vocab_free(&c.vocab);
    cv_imatrix_free(&c.imatrix);
    st_close(c.st);
    free(c.t);
    free(c.rope_freqs);
    free(c.chunk);
    free(c.scratch);
    free(c.gptq_H);
    free(c.gptq_U);
    for (int i = 0; c.gptq_scratch && i < c.n_threads; i++) gptq_scratch_free(c.gptq_scratch[i]);
    free(c.gptq_scratch);
    return st;
}
