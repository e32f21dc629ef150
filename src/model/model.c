/* Model loading: reads hyper-parameters, binds and validates every tensor. */
#include "model/model.h"
#include "core/cpu.h"
#include "core/status.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n);

typedef struct {
    ellm_model *m;
    ellm_error *err;
    const ellm_rope_params *rope; /* the caller's overrides, or NULL */
    int rope_overridden;          /* override_rope changed the file's settings */
} loader;

/* Reads integer "<arch>.<suffix>" into *out; optional keys keep *out if absent. */
static ellm_status arch_int(loader *ld, const char *suffix, int optional, int64_t lo, int64_t hi,
                            int *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", ld->m->cfg.arch_name, suffix);
    if (gguf_find_key(ld->m->file, key) < 0) {
        if (optional) return ELLM_OK;
        return ellm_fail(ld->err, ELLM_ERR_FORMAT, "model: missing required key '%s'", key);
    }
    int64_t v;
    ellm_status st = gguf_get_i64(ld->m->file, key, &v, ld->err);
    if (st != ELLM_OK) return st;
    if (v < lo || v > hi)
        return ellm_fail(ld->err, ELLM_ERR_FORMAT, "model: '%s' = %lld is out of range [%lld, %lld]",
                         key, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return ELLM_OK;
}

static ellm_status arch_float(loader *ld, const char *suffix, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", ld->m->cfg.arch_name, suffix);
    if (gguf_find_key(ld->m->file, key) < 0) return ELLM_OK; /* all float keys have defaults */
    double v;
    ellm_status st = gguf_get_f64(ld->m->file, key, &v, ld->err);
    if (st != ELLM_OK) return st;
    if (!(v > 0) || v > 1e12)
        return ellm_fail(ld->err, ELLM_ERR_FORMAT, "model: '%s' = %g is out of range", key, v);
    *out = (float)v;
    return ELLM_OK;
}

/* Finds tensor `name` and checks its shape is exactly (cols, rows) in GGUF
 * order (rows = 0 means a vector of `cols`). */
static ellm_status find_tensor(loader *ld, const char *name, int optional, int64_t cols,
                               int64_t rows, const gguf_tensor **out) {
    const gguf_tensor *t = gguf_find_tensor(ld->m->file, name);
    *out = NULL;
    if (!t) {
        if (optional) return ELLM_OK;
        return ellm_fail(ld->err, ELLM_ERR_FORMAT, "model: missing required tensor '%s'", name);
    }
    int want_dims = rows ? 2 : 1;
    int64_t n2 = t->n_dims >= 2 ? t->ne[1] : 1;
    int ok = t->ne[0] == cols && n2 == (rows ? rows : 1) && t->n_dims <= want_dims + 0 &&
             (t->n_dims < 3 || t->ne[2] == 1);
    if (!ok && t->n_dims <= 4) {
        /* allow trailing unit dims */
        ok = t->ne[0] == cols && n2 == (rows ? rows : 1) && t->ne[2] == 1 && t->ne[3] == 1;
    }
    if (!ok)
        return ellm_fail(ld->err, ELLM_ERR_FORMAT,
                         "model: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                         (long long)t->ne[0], (long long)n2, (long long)cols,
                         (long long)(rows ? rows : 1));
    const qtype_info *qi = qtype_get(t->type);
    if (!qi || !qi->supported)
        return ellm_fail(ld->err, ELLM_ERR_UNSUPPORTED,
                         "model: tensor '%s' has type %s (id %d), which eLLM cannot compute with",
                         name, qi ? qi->name : "unknown", t->type);
    /* F32 vectors are used where they lie in the mapped file (bind_vector),
     * and the float-weight matmuls read F32, F16 and BF16 elements in place;
     * a general.alignment below 4 can put a tensor where those reads would
     * be misaligned. */
    if ((uintptr_t)t->data % 4 != 0)
        return ellm_fail(ld->err, ELLM_ERR_UNSUPPORTED,
                         "model: tensor '%s' starts at byte %llu of the file, not a multiple of 4 "
                         "(general.alignment = %zu); eLLM needs tensor data aligned to 4 bytes or more "
                         "(GGUF writers align to 32 unless told otherwise)",
                         name, (unsigned long long)((const char *)t->data - (const char *)gguf_base(ld->m->file)),
                         gguf_alignment(ld->m->file));
    *out = t;
    return ELLM_OK;
}

static ellm_status bind_matrix(loader *ld, const char *name, int optional, int64_t cols,
                               int64_t rows, model_matrix *out) {
    const gguf_tensor *t;
    memset(out, 0, sizeof *out);
    ellm_status st = find_tensor(ld, name, optional, cols, rows, &t);
    if (st != ELLM_OK || !t) return st;
    out->type = t->type;
    out->data = t->data;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = qtype_row_bytes(t->type, cols);
    ld->m->n_params += (uint64_t)rows * (uint64_t)cols;
    ld->m->weight_bytes += t->n_bytes;
    return ELLM_OK;
}

/* Binds a vector of n floats: zero-copy when stored as F32, else converted. */
static ellm_status bind_vector(loader *ld, const char *name, int optional, int64_t n,
                               const float **out) {
    const gguf_tensor *t;
    *out = NULL;
    ellm_status st = find_tensor(ld, name, optional, n, 0, &t);
    if (st != ELLM_OK || !t) return st;
    ld->m->n_params += (uint64_t)n;
    ld->m->weight_bytes += t->n_bytes;
    if (t->type == QTYPE_F32) {
        *out = t->data;
        return ELLM_OK;
    }
    const qtype_info *qi = qtype_get(t->type);
    if (n % qi->block_elems)
        return ellm_fail(ld->err, ELLM_ERR_FORMAT, "model: tensor '%s' length %lld is not a multiple of its block",
                         name, (long long)n);
    float *buf = malloc((size_t)n * sizeof(float));
    float **owned = realloc(ld->m->owned, (size_t)(ld->m->n_owned + 1) * sizeof *owned);
    if (!buf || !owned) {
        free(buf);
        if (owned) ld->m->owned = owned;
        return ellm_fail(ld->err, ELLM_ERR_NOMEM, "model: out of memory converting '%s'", name);
    }
    ld->m->owned = owned;
    owned[ld->m->n_owned++] = buf;
    kern_dequantize(t->type, t->data, buf, n);
    *out = buf;
    return ELLM_OK;
}

/* <arch>.rope.scaling.*, read as llama.cpp reads them for these
 * architectures: "type" none, linear or yarn (absent: linear, which with no
 * factor changes nothing), "factor" (or the older rope.scale_linear; absent
 * or 0: 1), "original_context_length" (YaRN; absent: the training context)
 * and "attn_factor" (absent: 1). Other types are refused by name. Also the
 * keys llama.cpp's converter writes from a Hugging Face YaRN configuration
 * and its loader leaves unread for these architectures: "yarn_beta_fast",
 * "yarn_beta_slow" and "yarn_attn_factor" (Hugging Face's attention_factor,
 * the magnitude itself), honoured as Hugging Face defines them. */
static ellm_status read_rope_scaling(loader *ld) {
    model_config *c = &ld->m->cfg;
    c->rope_scaling = MODEL_ROPE_LINEAR;
    c->rope_factor = 1.0f;
    c->rope_orig_ctx = c->n_ctx_train;
    c->rope_attn_factor = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", c->arch_name);
    if (gguf_find_key(ld->m->file, key) >= 0) {
        const char *type;
        size_t len;
        ellm_status st = gguf_get_str(ld->m->file, key, &type, &len, ld->err);
        if (st != ELLM_OK) return st;
        if (len == 4 && !memcmp(type, "none", 4)) c->rope_scaling = MODEL_ROPE_NONE;
        else if (len == 4 && !memcmp(type, "yarn", 4)) c->rope_scaling = MODEL_ROPE_YARN;
        else if (!(len == 6 && !memcmp(type, "linear", 6)))
            return ellm_fail(ld->err, ELLM_ERR_UNSUPPORTED,
                             "model: '%s' = '%.*s' is not supported (none, linear and yarn are)", key,
                             (int)(len > 32 ? 32 : len), type);
    }
    static const char *const factor_keys[2] = {"rope.scaling.factor", "rope.scale_linear"};
    for (int i = 0; i < 2; i++) {
        snprintf(key, sizeof key, "%s.%s", c->arch_name, factor_keys[i]);
        if (gguf_find_key(ld->m->file, key) < 0) continue;
        double v;
        ellm_status st = gguf_get_f64(ld->m->file, key, &v, ld->err);
        if (st != ELLM_OK) return st;
        if (!(v >= 0) || v > 1e6)
            return ellm_fail(ld->err, ELLM_ERR_FORMAT, "model: '%s' = %g is out of range [0, 1e6]", key, v);
        if (v > 0) c->rope_factor = (float)v; /* 0 stands for none */
        break;
    }
    if (c->rope_scaling == MODEL_ROPE_NONE) c->rope_factor = 1.0f;
    c->yarn_beta_fast = 32.0f;
    c->yarn_beta_slow = 1.0f;
    c->yarn_magnitude = 0.0f;
    ellm_status st = arch_int(ld, "rope.scaling.original_context_length", 1, 1, 1 << 30, &c->rope_orig_ctx);
    if (st == ELLM_OK) st = arch_float(ld, "rope.scaling.attn_factor", &c->rope_attn_factor);
    if (st == ELLM_OK) st = arch_float(ld, "rope.scaling.yarn_beta_fast", &c->yarn_beta_fast);
    if (st == ELLM_OK) st = arch_float(ld, "rope.scaling.yarn_beta_slow", &c->yarn_beta_slow);
    if (st == ELLM_OK) st = arch_float(ld, "rope.scaling.yarn_attn_factor", &c->yarn_magnitude);
    if (st == ELLM_OK && c->yarn_beta_slow > c->yarn_beta_fast)
        return ellm_fail(ld->err, ELLM_ERR_FORMAT,
                         "model: '%s.rope.scaling.yarn_beta_slow' = %g exceeds yarn_beta_fast = %g", c->arch_name,
                         c->yarn_beta_slow, c->yarn_beta_fast);
    return st;
}

/* The caller's RoPE settings over the file's (ellm_rope_params). */
static ellm_status override_rope(loader *ld) {
    const ellm_rope_params *o = ld->rope;
    model_config *c = &ld->m->cfg;
    if (!o || (!o->type && o->factor == 0 && o->freq_base == 0 && o->orig_ctx == 0)) return ELLM_OK;
    if (o->type) {
        if (!strcmp(o->type, "none")) c->rope_scaling = MODEL_ROPE_NONE;
        else if (!strcmp(o->type, "linear")) c->rope_scaling = MODEL_ROPE_LINEAR;
        else if (!strcmp(o->type, "yarn")) c->rope_scaling = MODEL_ROPE_YARN;
        else
            return ellm_fail(ld->err, ELLM_ERR_ARG, "RoPE scaling '%.32s' is not none, linear or yarn", o->type);
    }
    if (!(o->factor >= 0) || o->factor > 1e6 || !(o->freq_base >= 0) || o->freq_base > 1e12 || o->orig_ctx < 0)
        return ellm_fail(ld->err, ELLM_ERR_ARG, "RoPE settings out of range (factor %g, base %g, original context %d)",
                         o->factor, o->freq_base, o->orig_ctx);
    if (o->freq_base > 0) c->rope_theta = o->freq_base;
    if (o->orig_ctx > 0) c->rope_orig_ctx = o->orig_ctx;
    if (o->factor > 0) {
        c->rope_factor = o->factor;
        /* the context the scaled model is meant for (llama.cpp: original context / frequency scale) */
        const double ctx = (c->rope_scaling == MODEL_ROPE_YARN ? c->rope_orig_ctx : c->n_ctx_train) * (double)o->factor;
        if (c->rope_scaling != MODEL_ROPE_NONE && ctx > c->n_ctx_train) c->n_ctx_train = ctx < (1 << 30) ? (int)ctx : 1 << 30;
    }
    if (c->rope_scaling == MODEL_ROPE_NONE) c->rope_factor = 1.0f;
    ld->rope_overridden = 1;
    return ELLM_OK;
}

static ellm_status read_config(loader *ld) {
    ellm_model *m = ld->m;
    model_config *c = &m->cfg;
    const char *arch;
    size_t arch_len;
    ellm_status st = gguf_get_str(m->file, "general.architecture", &arch, &arch_len, ld->err);
    if (st != ELLM_OK) return st;
    if (arch_len >= sizeof c->arch_name) arch_len = sizeof c->arch_name - 1;
    memcpy(c->arch_name, arch, arch_len);
    c->arch_name[arch_len] = 0;
    if (!strcmp(c->arch_name, "llama") || !strcmp(c->arch_name, "mistral")) {
        c->arch = MODEL_ARCH_LLAMA;
        c->rope_neox = 0;
    } else if (!strcmp(c->arch_name, "qwen2")) {
        c->arch = MODEL_ARCH_QWEN2;
        c->rope_neox = 1;
    } else if (!strcmp(c->arch_name, "qwen3")) {
        c->arch = MODEL_ARCH_QWEN3;
        c->rope_neox = 1;
    } else {
        return ellm_fail(ld->err, ELLM_ERR_UNSUPPORTED,
                         "model: architecture '%s' is not supported (llama, mistral, qwen2, qwen3 are)",
                         c->arch_name);
    }
    /* One part of a model split over several files (llama.cpp's gguf-split):
     * its other parts hold tensors this one does not */
    if (gguf_find_key(m->file, "split.count") >= 0) {
        int64_t count = 0, no = 0;
        if ((st = gguf_get_i64(m->file, "split.count", &count, ld->err))) return st;
        if (gguf_find_key(m->file, "split.no") >= 0 && (st = gguf_get_i64(m->file, "split.no", &no, ld->err)))
            return st;
        if (count > 1)
            return ellm_fail(ld->err, ELLM_ERR_UNSUPPORTED,
                             "model: this file is part %lld of a model split into %lld files (split.count); eLLM "
                             "reads one file: merge the parts first, e.g. `llama-gguf-split --merge FIRST-PART.gguf "
                             "MERGED.gguf`",
                             (long long)no + 1, (long long)count);
    }
    /* Mixtral-style files are "llama" with experts (ffn_*_exps tensors), which
     * the engine does not run: say so instead of naming a missing tensor */
    int n_expert = 0;
    if ((st = arch_int(ld, "expert_count", 1, 0, 1 << 20, &n_expert))) return st;
    if (n_expert > 0)
        return ellm_fail(ld->err, ELLM_ERR_UNSUPPORTED,
                         "model: mixture-of-experts files ('%s.expert_count' = %d) are not supported (dense llama, "
                         "mistral, qwen2, qwen3 are)",
                         c->arch_name, n_expert);
    c->n_ctx_train = 2048;
    c->rope_theta = 10000.0f;
    c->norm_eps = 1e-5f;
    if ((st = arch_int(ld, "block_count", 0, 1, 4096, &c->n_layer)) ||
        (st = arch_int(ld, "embedding_length", 0, 1, 1 << 20, &c->n_embd)) ||
        (st = arch_int(ld, "feed_forward_length", 0, 1, 1 << 22, &c->n_ff)) ||
        (st = arch_int(ld, "attention.head_count", 0, 1, 1 << 14, &c->n_head)) ||
        (st = arch_int(ld, "context_length", 1, 1, 1 << 30, &c->n_ctx_train)))
        return st;
    /* Mistral-style sliding-window attention; the engine refuses contexts
     * longer than the window (see ellm_context_init). 0 means none. */
    if ((st = arch_int(ld, "attention.sliding_window", 1, 0, 1 << 30, &c->sliding_window))) return st;
    c->n_head_kv = c->n_head;
    if ((st = arch_int(ld, "attention.head_count_kv", 1, 1, 1 << 14, &c->n_head_kv))) return st;
    if (c->n_head % c->n_head_kv)
        return ellm_fail(ld->err, ELLM_ERR_FORMAT,
                         "model: head_count %d is not a multiple of head_count_kv %d", c->n_head,
                         c->n_head_kv);
    c->head_dim = c->n_embd / c->n_head;
    if ((st = arch_int(ld, "attention.key_length", 1, 1, 1 << 14, &c->head_dim))) return st;
    int v_len = c->head_dim;
    if ((st = arch_int(ld, "attention.value_length", 1, 1, 1 << 14, &v_len))) return st;
    if (v_len != c->head_dim)
        return ellm_fail(ld->err, ELLM_ERR_UNSUPPORTED,
                         "model: value_length %d differs from key_length %d", v_len, c->head_dim);
    if (c->head_dim % 2)
        return ellm_fail(ld->err, ELLM_ERR_FORMAT, "model: head dimension %d is odd", c->head_dim);
    c->n_rot = c->head_dim;
    if ((st = arch_int(ld, "rope.dimension_count", 1, 2, c->head_dim, &c->n_rot))) return st;
    if (c->n_rot % 2)
        return ellm_fail(ld->err, ELLM_ERR_FORMAT, "model: rope.dimension_count %d is odd", c->n_rot);
    if ((st = arch_float(ld, "rope.freq_base", &c->rope_theta)) ||
        (st = arch_float(ld, "attention.layer_norm_rms_epsilon", &c->norm_eps)))
        return st;
    if ((st = read_rope_scaling(ld))) return st;
    return override_rope(ld);
}

/* YaRN's correction dimension: the (fractional) pair whose rotation turns
 * `turns` times over the original training context. */
static double yarn_pair(const model_config *c, double turns) {
    return c->n_rot * log(c->rope_orig_ctx / (turns * 2 * M_PI)) / (2 * log((double)c->rope_theta));
}

/* m->rope_freq and m->rope_mscale from the configuration: base^(-2i/n_rot),
 * divided by the rope_freqs factor of pair i, then scaled. Linear: times
 * 1/factor. YaRN (Peng et al., 2023): pairs that turn more than beta_fast
 * (32) times over the original context keep their frequency, those that
 * turn less than beta_slow (1) times take 1/factor of it, and the pairs
 * between blend the two linearly in their index (the correction dimensions
 * rounded outwards); cos and sin are multiplied by 1 + 0.1 ln(factor), or
 * by yarn_attn_factor when the file gives it. attn_factor multiplies that
 * magnitude. */
static void rope_frequencies(ellm_model *m) {
    const model_config *c = &m->cfg;
    const int yarn = c->rope_scaling == MODEL_ROPE_YARN;
    const double scale = 1.0 / c->rope_factor;
    double lo = 0, hi = 0;
    if (yarn && c->rope_theta > 1) { /* (a base of 1 or less turns nothing: no correction range) */
        lo = floor(yarn_pair(c, c->yarn_beta_fast));
        hi = ceil(yarn_pair(c, c->yarn_beta_slow));
        if (lo < 0) lo = 0;
        if (hi > c->n_rot - 1) hi = c->n_rot - 1;
    }
    for (int i = 0; i < c->n_rot / 2; i++) {
        double f = pow((double)c->rope_theta, -2.0 * i / c->n_rot);
        if (m->rope_freqs) f /= m->rope_freqs[i];
        if (yarn) {
            double y = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
            const double keep = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y); /* share of the unscaled frequency */
            f *= scale * (1.0 - keep) + keep;
        } else {
            f *= scale;
        }
        m->rope_freq[i] = f;
    }
    double magnitude = 1.0;
    if (yarn) magnitude = c->yarn_magnitude > 0 ? c->yarn_magnitude : c->rope_factor > 1 ? 1.0 + 0.1 * log(c->rope_factor) : 1.0;
    m->rope_mscale = c->rope_attn_factor * magnitude;
}

static ellm_status bind_weights(loader *ld) {
    ellm_model *m = ld->m;
    model_config *c = &m->cfg;
    ellm_status st;
    const gguf_tensor *embd = gguf_find_tensor(m->file, "token_embd.weight");
    if (!embd)
        return ellm_fail(ld->err, ELLM_ERR_FORMAT, "model: missing required tensor 'token_embd.weight'");
    if (embd->n_dims != 2 || embd->ne[0] != c->n_embd || embd->ne[1] < 1 || embd->ne[1] > (1 << 24))
        return ellm_fail(ld->err, ELLM_ERR_FORMAT,
                         "model: tensor 'token_embd.weight' has shape [%lld, %lld], expected [%d, n_vocab]",
                         (long long)embd->ne[0], (long long)embd->ne[1], c->n_embd);
    c->n_vocab = (int)embd->ne[1];
    int64_t d = c->n_embd, hd = c->head_dim, nq = (int64_t)c->n_head * hd,
            nkv = (int64_t)c->n_head_kv * hd, ff = c->n_ff, V = c->n_vocab;
    if ((st = bind_matrix(ld, "token_embd.weight", 0, d, V, &m->tok_embd)) ||
        (st = bind_matrix(ld, "output.weight", 1, d, V, &m->output)) ||
        (st = bind_vector(ld, "output_norm.weight", 0, d, &m->output_norm)) ||
        (st = bind_vector(ld, "rope_freqs.weight", 1, c->n_rot / 2, &m->rope_freqs)))
        return st;
    if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
    /* RoPE frequencies once per model, not per token. */
    m->rope_freq = malloc((size_t)(c->n_rot / 2) * sizeof *m->rope_freq);
    if (!m->rope_freq) return ellm_fail(ld->err, ELLM_ERR_NOMEM, "model: out of memory");
    rope_frequencies(m);
    if (ld->rope_overridden) { /* the settings the caller chose, for saved states' model identity */
        uint64_t h = fnv1a(0xcbf29ce484222325ull, (const unsigned char *)m->rope_freq,
                           (size_t)(c->n_rot / 2) * sizeof *m->rope_freq);
        h = fnv1a(h, (const unsigned char *)&m->rope_mscale, sizeof m->rope_mscale);
        m->rope_override_hash = h ? h : 1;
    }
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) return ellm_fail(ld->err, ELLM_ERR_NOMEM, "model: out of memory");
    for (int l = 0; l < c->n_layer; l++) {
        model_layer *L = &m->layers[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
        if ((st = bind_vector(ld, NAME("attn_norm.weight"), 0, d, &L->attn_norm)) ||
            (st = bind_matrix(ld, NAME("attn_q.weight"), 0, d, nq, &L->wq)) ||
            (st = bind_matrix(ld, NAME("attn_k.weight"), 0, d, nkv, &L->wk)) ||
            (st = bind_matrix(ld, NAME("attn_v.weight"), 0, d, nkv, &L->wv)) ||
            (st = bind_matrix(ld, NAME("attn_output.weight"), 0, nq, d, &L->wo)) ||
            (st = bind_vector(ld, NAME("ffn_norm.weight"), 0, d, &L->ffn_norm)) ||
            (st = bind_matrix(ld, NAME("ffn_gate.weight"), 0, d, ff, &L->w_gate)) ||
            (st = bind_matrix(ld, NAME("ffn_up.weight"), 0, d, ff, &L->w_up)) ||
            (st = bind_matrix(ld, NAME("ffn_down.weight"), 0, ff, d, &L->w_down)))
            return st;
        int need_bias = c->arch == MODEL_ARCH_QWEN2;
        if ((st = bind_vector(ld, NAME("attn_q.bias"), !need_bias, nq, &L->bq)) ||
            (st = bind_vector(ld, NAME("attn_k.bias"), !need_bias, nkv, &L->bk)) ||
            (st = bind_vector(ld, NAME("attn_v.bias"), !need_bias, nkv, &L->bv)))
            return st;
        int need_qk_norm = c->arch == MODEL_ARCH_QWEN3;
        if ((st = bind_vector(ld, NAME("attn_q_norm.weight"), !need_qk_norm, hd, &L->q_norm)) ||
            (st = bind_vector(ld, NAME("attn_k_norm.weight"), !need_qk_norm, hd, &L->k_norm)))
            return st;
#undef NAME
    }
    return ELLM_OK;
}

ellm_status ellm_model_load(const char *path, const ellm_model_params *params, ellm_model **out,
                            ellm_error *err) {
    double t0 = ellm_time_ms();
    *out = NULL;
    if (!path) return ellm_fail(err, ELLM_ERR_ARG, "model: no path given");
    gguf_file *f = NULL;
    ellm_status st = gguf_open(path, &f, err);
    if (st == ELLM_OK) st = model_load_gguf(f, params, out, err);
    if (st == ELLM_OK) {
        (*out)->load_ms = ellm_time_ms() - t0;
        (*out)->path = strdup(path);
    }
    return st;
}

ellm_status model_load_gguf(gguf_file *f, const ellm_model_params *params, ellm_model **out,
                            ellm_error *err) {
    double t0 = ellm_time_ms();
    *out = NULL;
    ellm_model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(f);
        return ellm_fail(err, ELLM_ERR_NOMEM, "model: out of memory");
    }
    m->file = f;
    pthread_mutex_init(&m->derived_lock, NULL);
    m->n_threads = params && params->n_threads > 0 ? params->n_threads : ellm_default_threads();
    m->pin_threads = params ? params->pin_threads : 1;
    loader ld = {m, err, params ? &params->rope : NULL, 0};
    ellm_status st = read_config(&ld);
    if (st == ELLM_OK) st = bind_weights(&ld);
    if (st == ELLM_OK) st = tokenizer_init_gguf(m->file, &m->tok, err);
    double repack_ms = 0;
    if (st == ELLM_OK) {
        const double r0 = ellm_time_ms();
        model_repack_weights(m, params);
        repack_ms = ellm_time_ms() - r0;
    }
    if (st == ELLM_OK) st = model_place_weights(m, params, err);
    if (st == ELLM_OK && m->n_repacked) {
        const size_t len = strlen(m->placement);
        snprintf(m->placement + len, sizeof m->placement - len, "; %d matrices interleaved by 16 rows at load (%.0f ms)",
                 m->n_repacked, repack_ms);
    } else if (st == ELLM_OK && m->repack_note[0]) {
        const size_t len = strlen(m->placement);
        snprintf(m->placement + len, sizeof m->placement - len, "; %s", m->repack_note);
    }
    if (st == ELLM_OK && tokenizer_n_vocab(m->tok) > m->cfg.n_vocab)
        st = ellm_fail(err, ELLM_ERR_FORMAT, "model: tokenizer has %d tokens but token_embd.weight only %d rows",
                       tokenizer_n_vocab(m->tok), m->cfg.n_vocab);
    if (st != ELLM_OK) {
        ellm_model_free(m);
        return st;
    }
    m->load_ms = ellm_time_ms() - t0;
    *out = m;
    return ELLM_OK;
}

void ellm_model_free(ellm_model *m) {
    if (!m) return;
    for (model_derived *d = m->derived, *next; d; d = next) {
        next = d->next;
        d->free_fn(d->m);
        free(d);
    }
    pthread_mutex_destroy(&m->derived_lock);
    free(m->path);
    model_placement_free(m);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->rope_freq);
    tokenizer_free(m->tok);
    gguf_close(m->file);
    free(m);
}

void ellm_model_get_info(const ellm_model *m, ellm_model_info *info) {
    memset(info, 0, sizeof *info);
    snprintf(info->arch, sizeof info->arch, "%s", m->cfg.arch_name);
    info->n_vocab = m->cfg.n_vocab;
    info->n_ctx_train = m->cfg.n_ctx_train;
    info->n_embd = m->cfg.n_embd;
    info->n_layer = m->cfg.n_layer;
    info->n_head = m->cfg.n_head;
    info->n_head_kv = m->cfg.n_head_kv;
    info->head_dim = m->cfg.head_dim;
    info->n_ff = m->cfg.n_ff;
    info->n_params = m->n_params;
    info->weight_bytes = m->weight_bytes;
    /* A step reads every matrix once, but only one row of an untied embedding. */
    info->decode_weight_bytes = m->weight_bytes;
    if (m->output.data != m->tok_embd.data)
        info->decode_weight_bytes -= (uint64_t)m->tok_embd.rows * m->tok_embd.row_bytes;
    info->output_weight_bytes = (uint64_t)m->output.rows * m->output.row_bytes;
    info->load_ms = m->load_ms;
    snprintf(info->placement, sizeof info->placement, "%s", m->placement);
    const model_config *c = &m->cfg;
    if (c->rope_scaling == MODEL_ROPE_YARN && (c->rope_factor != 1 || c->yarn_magnitude > 0)) {
        snprintf(info->rope_scaling, sizeof info->rope_scaling, "yarn x%g from %d tokens", c->rope_factor, c->rope_orig_ctx);
        const size_t n = strlen(info->rope_scaling);
        if (c->yarn_beta_fast != 32 || c->yarn_beta_slow != 1)
            snprintf(info->rope_scaling + n, sizeof info->rope_scaling - n, ", beta %g/%g", c->yarn_beta_fast,
                     c->yarn_beta_slow);
        const size_t n2 = strlen(info->rope_scaling);
        if (c->yarn_magnitude > 0)
            snprintf(info->rope_scaling + n2, sizeof info->rope_scaling - n2, ", magnitude %g", c->yarn_magnitude);
    } else if (c->rope_scaling != MODEL_ROPE_YARN && c->rope_factor != 1) {
        snprintf(info->rope_scaling, sizeof info->rope_scaling, "linear x%g", c->rope_factor);
    }
    if (c->rope_attn_factor != 1) {
        const size_t n = strlen(info->rope_scaling);
        snprintf(info->rope_scaling + n, sizeof info->rope_scaling - n, "%sattn_factor %g", n ? ", " : "",
                 c->rope_attn_factor);
    }
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

int ellm_model_context_advice(const ellm_model *m, int n_ctx, char *buf, size_t cap) {
    const model_config *c = &m->cfg;
    if (cap) buf[0] = 0;
    /* a factor of 1 extends nothing, whatever the type ("none" sets it) */
    if (n_ctx <= c->n_ctx_train || c->rope_factor != 1 || m->rope_override_hash || !cap) return 0;
    snprintf(buf, cap,
             "a context of %d tokens runs past the model's training context of %d, and the file has no RoPE scaling: "
             "positions beyond %d are extrapolated; --rope-scaling yarn --rope-scale %d --yarn-orig-ctx %d usually "
             "holds up better (bench/LONGGEN.md)",
             n_ctx, c->n_ctx_train, c->n_ctx_train, (n_ctx + c->n_ctx_train - 1) / c->n_ctx_train, c->n_ctx_train);
    return 1;
}

uint64_t model_content_hash(const ellm_model *m) {
    return (m->n_repacked ? m->repacked_hash : model_file_hash(m->file)) ^ m->rope_override_hash;
}

uint64_t model_file_hash(const gguf_file *f) {
    const unsigned char *base = gguf_base(f);
    size_t size = gguf_size(f), meta = size;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        size_t start = (size_t)((const unsigned char *)t->data - base);
        if (start < meta) meta = start;
    }
    uint64_t h = fnv1a(0xcbf29ce484222325ull, base, meta);
    const size_t data = size - meta, sample = 256;
    for (int i = 0; i < 64 && data >= sample; i++)
        h = fnv1a(h, base + meta + (data - sample) / 63 * (size_t)i, sample);
    return h;
}

static void rope_cs(const ellm_model *m, int pos, double magnitude, float *cs) {
    for (int i = 0; i < m->cfg.n_rot / 2; i++) {
        double theta = (double)pos * m->rope_freq[i];
        cs[2 * i] = (float)(cos(theta) * magnitude);
        cs[2 * i + 1] = (float)(sin(theta) * magnitude);
    }
}

void model_rope_cos_sin(const ellm_model *m, int pos, float *cs) { rope_cs(m, pos, m->rope_mscale, cs); }

void model_rope_rotation(const ellm_model *m, int delta, float *cs) { rope_cs(m, delta, 1.0, cs); }

const char *const model_input_groups[MODEL_INPUT_GROUPS][MODEL_INPUT_GROUP_MAX] = {
    {"attn_q", "attn_k", "attn_v"}, {"attn_output", NULL, NULL}, {"ffn_gate", "ffn_up", NULL}, {"ffn_down", NULL, NULL}};

int model_input_owner(const char *name, char *out, size_t size) {
    const size_t nl = strlen(name);
    for (int g = 0; g < MODEL_INPUT_GROUPS; g++)
        for (int k = 1; k < MODEL_INPUT_GROUP_MAX && model_input_groups[g][k]; k++) {
            char suffix[64];
            const int sl = snprintf(suffix, sizeof suffix, ".%s.weight", model_input_groups[g][k]);
            if (nl > (size_t)sl && !strcmp(name + nl - (size_t)sl, suffix)) {
                const int n = snprintf(out, size, "%.*s.%s.weight", (int)(nl - (size_t)sl), name, model_input_groups[g][0]);
                return n >= 0 && (size_t)n < size;
            }
        }
    const int n = snprintf(out, size, "%s", name);
    return n >= 0 && (size_t)n < size;
}
