/* config.json -> hf_config (see hf_config.h). Field names and defaults follow
 * the transformers configuration classes and llama.cpp's converter. */
#include "convert/hf_config.h"

#include "convert/fileio.h"
#include "core/status.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    hf_arch arch;
    const char *gguf;
} hf_archs[] = {
    {"LlamaForCausalLM", HF_ARCH_LLAMA, "llama"},
    {"MistralForCausalLM", HF_ARCH_MISTRAL, "llama"},
    {"Qwen2ForCausalLM", HF_ARCH_QWEN2, "qwen2"},
    {"Qwen3ForCausalLM", HF_ARCH_QWEN3, "qwen3"},
};
#define N_HF_ARCHS (int)(sizeof hf_archs / sizeof hf_archs[0])

static const cJSON *get(const cJSON *o, const char *k) {
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

#define HF_REQUIRED INT64_MIN

/* An integer field in [lo, hi]; absent (or null) gives `dflt`, or an error
 * naming the field when dflt is HF_REQUIRED. */
static ellm_status get_int(const cJSON *o, const char *what, const char *key, int64_t lo, int64_t hi, int64_t dflt,
                           int64_t *out, ellm_error *err) {
    const cJSON *v = get(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (dflt == HF_REQUIRED) return ellm_fail(err, ELLM_ERR_FORMAT, "%s: \"%s\" is missing", what, key);
        *out = dflt;
        return ELLM_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return ellm_fail(err, ELLM_ERR_FORMAT, "%s: \"%s\" must be an integer in [%lld, %lld]", what, key,
                         (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return ELLM_OK;
}

/* A positive finite number; absent gives dflt. */
static ellm_status get_num(const cJSON *o, const char *what, const char *key, double dflt, double *out,
                           ellm_error *err) {
    const cJSON *v = get(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return ELLM_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble <= 0)
        return ellm_fail(err, ELLM_ERR_FORMAT, "%s: \"%s\" must be a positive number", what, key);
    *out = v->valuedouble;
    return ELLM_OK;
}

/* rope_scaling (or rope_parameters, newer transformers): type and factors. */
static ellm_status parse_rope(const cJSON *root, const char *what, hf_config *c, ellm_error *err) {
    const cJSON *rp = get(root, "rope_parameters");
    if (!cJSON_IsObject(rp)) rp = get(root, "rope_scaling");
    if (!rp || cJSON_IsNull(rp)) return ELLM_OK;
    if (!cJSON_IsObject(rp)) return ellm_fail(err, ELLM_ERR_FORMAT, "%s: \"rope_scaling\" is not an object", what);
    ellm_status st;
    if (get(rp, "rope_theta") && (st = get_num(rp, what, "rope_theta", c->rope_theta, &c->rope_theta, err)))
        return st;
    const cJSON *t = get(rp, "rope_type");
    if (!cJSON_IsString(t)) t = get(rp, "type");
    if (!cJSON_IsString(t) || !strcmp(t->valuestring, "default")) return ELLM_OK;
    const char *type = t->valuestring;
    if (!strcmp(type, "linear")) {
        c->rope_scaling = HF_ROPE_LINEAR;
        return get_num(rp, what, "factor", 1.0, &c->rope_factor, err);
    }
    if (!strcmp(type, "yarn")) {
        c->rope_scaling = HF_ROPE_YARN;
        if ((st = get_int(rp, what, "original_max_position_embeddings", 1, INT32_MAX, HF_REQUIRED, &c->rope_orig_ctx,
                          err)) ||
            /* without a factor, transformers takes max_position_embeddings / original */
            (st = get_num(rp, what, "factor", (double)c->n_ctx / (double)c->rope_orig_ctx, &c->rope_factor, err)) ||
            (st = get_num(rp, what, "beta_fast", 0, &c->yarn_beta_fast, err)) ||
            (st = get_num(rp, what, "beta_slow", 0, &c->yarn_beta_slow, err)) ||
            (st = get_num(rp, what, "attention_factor", 0, &c->yarn_attn_factor, err)))
            return st;
        const cJSON *tr = get(rp, "truncate");
        if (cJSON_IsFalse(tr))
            return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                             "%s: rope_scaling \"truncate\": false is not supported (GGUF's YaRN rounds the correction "
                             "range outwards)",
                             what);
        double ms = 0, msa = 0;
        if ((st = get_num(rp, what, "mscale", 0, &ms, err)) || (st = get_num(rp, what, "mscale_all_dim", 0, &msa, err)))
            return st;
        if (c->yarn_attn_factor == 0 && ms > 0 && msa > 0) { /* transformers' get_mscale(factor, m) ratio */
            const double f = c->rope_factor;
            c->yarn_attn_factor = f <= 1 ? 1.0 : (0.1 * ms * log(f) + 1.0) / (0.1 * msa * log(f) + 1.0);
        }
        return ELLM_OK;
    }
    if (!strcasecmp(type, "llama3")) {
        c->rope_scaling = HF_ROPE_LLAMA3;
        if ((st = get_num(rp, what, "factor", 8.0, &c->rope_factor, err)) ||
            (st = get_num(rp, what, "low_freq_factor", 1.0, &c->rope_low_freq, err)) ||
            (st = get_num(rp, what, "high_freq_factor", 4.0, &c->rope_high_freq, err)) ||
            (st = get_int(rp, what, "original_max_position_embeddings", 1, INT32_MAX, 8192, &c->rope_orig_ctx, err)))
            return st;
        if (c->rope_high_freq <= c->rope_low_freq)
            return ellm_fail(err, ELLM_ERR_FORMAT, "%s: rope_scaling high_freq_factor must exceed low_freq_factor",
                             what);
        return ELLM_OK;
    }
    return ellm_fail(err, ELLM_ERR_UNSUPPORTED, "%s: rope scaling type '%.32s' is not supported (linear, yarn, llama3)",
                     what, type);
}

ellm_status hf_config_parse(const char *json, size_t len, const char *what, hf_config *c, ellm_error *err) {
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ellm_fail(err, ELLM_ERR_FORMAT, "%s: %s", what, root ? "the top level is not an object" : "malformed JSON");
    }
    ellm_status st = ELLM_OK;
    const cJSON *archs = get(root, "architectures");
    const char *name = cJSON_IsArray(archs) && cJSON_IsString(archs->child) ? archs->child->valuestring : NULL;
    if (!name) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "%s: \"architectures\" is missing or not a list of names", what);
        goto done;
    }
    int ai = -1;
    for (int i = 0; i < N_HF_ARCHS; i++)
        if (!strcmp(name, hf_archs[i].name)) ai = i;
    if (ai < 0) {
        st = ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                       "%s: architecture '%.60s' is not supported (LlamaForCausalLM, MistralForCausalLM, "
                       "Qwen2ForCausalLM, Qwen3ForCausalLM)",
                       what, name);
        goto done;
    }
    c->arch = hf_archs[ai].arch;
    snprintf(c->hf_name, sizeof c->hf_name, "%s", name);
    c->gguf_arch = hf_archs[ai].gguf;
    c->permute_qk = c->arch == HF_ARCH_LLAMA || c->arch == HF_ARCH_MISTRAL;
    const int64_t BIG = (int64_t)1 << 31;
    if ((st = get_int(root, what, "vocab_size", 1, BIG, HF_REQUIRED, &c->n_vocab, err)) ||
        (st = get_int(root, what, "hidden_size", 1, BIG, HF_REQUIRED, &c->n_embd, err)) ||
        (st = get_int(root, what, "num_hidden_layers", 1, 100000, HF_REQUIRED, &c->n_layer, err)) ||
        (st = get_int(root, what, "num_attention_heads", 1, 100000, HF_REQUIRED, &c->n_head, err)) ||
        (st = get_int(root, what, "num_key_value_heads", 1, 100000, c->n_head, &c->n_head_kv, err)) ||
        (st = get_int(root, what, "intermediate_size", 1, BIG, HF_REQUIRED, &c->n_ff, err)) ||
        (st = get_int(root, what, "max_position_embeddings", 1, BIG, 2048, &c->n_ctx, err)) ||
        (st = get_int(root, what, "bos_token_id", 0, BIG, -1, &c->bos_id, err)) ||
        (st = get_num(root, what, "rms_norm_eps", 1e-6, &c->rms_eps, err)) ||
        (st = get_num(root, what, "rope_theta", 10000.0, &c->rope_theta, err)))
        goto done;
    /* eos_token_id may be a list (several end-of-generation ids): the first. */
    const cJSON *eos = get(root, "eos_token_id");
    if (cJSON_IsArray(eos)) {
        cJSON *tmp = cJSON_CreateObject();
        if (tmp && eos->child) cJSON_AddItemReferenceToObject(tmp, "eos_token_id", eos->child);
        st = get_int(tmp, what, "eos_token_id", 0, BIG, -1, &c->eos_id, err);
        cJSON_Delete(tmp);
    } else {
        st = get_int(root, what, "eos_token_id", 0, BIG, -1, &c->eos_id, err);
    }
    if (st) goto done;
    if (c->n_head % c->n_head_kv) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                       what, (long long)c->n_head, (long long)c->n_head_kv);
        goto done;
    }
    const cJSON *hd = get(root, "head_dim");
    if (hd && !cJSON_IsNull(hd)) {
        if ((st = get_int(root, what, "head_dim", 2, 65536, HF_REQUIRED, &c->head_dim, err))) goto done;
        c->head_dim_given = 1;
    } else {
        if (c->n_embd % c->n_head) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld",
                           what, (long long)c->n_embd, (long long)c->n_head);
            goto done;
        }
        c->head_dim = c->n_embd / c->n_head;
    }
    if (c->head_dim % 2) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "%s: the head size %lld is odd (RoPE rotates pairs)", what,
                       (long long)c->head_dim);
        goto done;
    }
    const cJSON *tie = get(root, "tie_word_embeddings");
    c->tied = cJSON_IsBool(tie) ? cJSON_IsTrue(tie) : 0;
    if ((st = parse_rope(root, what, c, err))) goto done;
done:
    cJSON_Delete(root);
    return st;
}

ellm_status hf_config_load(const char *dir, hf_config *out, ellm_error *err) {
    char *path = cv_path_join(dir, "config.json");
    if (!path) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    char *text = NULL;
    size_t len = 0;
    ellm_status st = cv_read_file(path, 16u << 20, &text, &len, err);
    if (st == ELLM_OK) st = hf_config_parse(text, len, path, out, err);
    free(text);
    free(path);
    return st;
}

/* llama.cpp's LlamaModel.generate_extra_tensors, in the same float32
 * arithmetic for the frequencies (torch.arange / dim, base ** x) and
 * double-precision Python floats for the rest. */
void hf_config_llama3_rope_freqs(const hf_config *c, float *out) {
    const int64_t dim = c->head_dim;
    const double factor = c->rope_factor, lo = c->rope_low_freq, hi = c->rope_high_freq;
    const double old_ctx = (double)c->rope_orig_ctx;
    const double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
    for (int64_t i = 0; i < dim / 2; i++) {
        float freq = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)dim);
        double wavelen = 2 * M_PI / (double)freq;
        double f;
        if (wavelen < hi_wavelen)
            f = 1;
        else if (wavelen > lo_wavelen)
            f = factor;
        else {
            double smooth = (old_ctx / wavelen - lo) / (hi - lo);
            f = 1 / ((1 - smooth) / factor + smooth);
        }
        out[i] = (float)f;
    }
}
