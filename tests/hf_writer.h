/* Writes Hugging Face checkpoint folders for the converter's tests and
 * benchmarks: a safetensors writer (single file or shards + index), and
 * hfw_from_gguf, which turns a GGUF model into the HF layout the converter
 * reads back (config.json, HF tensor names, Q/K rows in the rotate-half
 * order, tokenizer.model + tokenizer_config.json).
 *
 * Header-only (static functions) so that a test or a bench program includes
 * it once. */
#ifndef ELLM_TESTS_HF_WRITER_H
#define ELLM_TESTS_HF_WRITER_H

#include "core/fp16.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "gguf/gguf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* dtypes as safetensors names them */
enum { HFW_F32, HFW_F16, HFW_BF16 };
static const char *const hfw_dtype_name[] = {"F32", "F16", "BF16"};
static const size_t hfw_dtype_size[] = {4, 2, 2};

typedef struct hfw_tensor hfw_tensor;
/* Writes the tensor's n_bytes to fp (when data is NULL). Returns 0 on success. */
typedef int (*hfw_gen_fn)(void *user, const hfw_tensor *t, FILE *fp);

struct hfw_tensor {
    char name[128];
    int dtype;
    int n_dims;
    int64_t shape[2];  /* [rows, cols] or [n] */
    void *data;        /* n_bytes in dtype, or NULL: gen writes them */
    size_t n_bytes;
    hfw_gen_fn gen;
    void *gen_user;
    int shard;         /* for hfw_write_sharded */
};

/* Appends an entry to t (at t[*n], counting it): tensor `name` of dtype,
 * rows x cols (cols 0: a 1-D tensor of rows), with no data or generator yet. */
static inline hfw_tensor *hfw_add(hfw_tensor *t, int *n, const char *name, int dtype, int64_t rows, int64_t cols) {
    hfw_tensor *x = &t[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->dtype = dtype;
    x->n_dims = cols ? 2 : 1;
    x->shape[0] = rows;
    x->shape[1] = cols;
    x->n_bytes = (size_t)(rows * (cols ? cols : 1)) * hfw_dtype_size[dtype];
    return x;
}

/* Writes tensors t[0..n) to `path` (one safetensors file) in the order given.
 * The header is padded with spaces to a multiple of 8 bytes. 0 on success. */
static int hfw_write_safetensors(const char *path, hfw_tensor *t, int n) {
    size_t cap = 256 + (size_t)n * 256, len = 0;
    char *h = malloc(cap);
    if (!h) return -1;
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name,
                                hfw_dtype_name[t[i].dtype]);
        for (int d = 0; d < t[i].n_dims; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                                (unsigned long long)(off + t[i].n_bytes));
        off += t[i].n_bytes;
    }
    h[len++] = '}';
    while (len % 8) h[len++] = ' ';
    FILE *fp = fopen(path, "wb");
    int rc = fp ? 0 : -1;
    uint8_t hl[8];
    for (int i = 0; i < 8; i++) hl[i] = (uint8_t)((uint64_t)len >> (8 * i));
    if (!rc && (fwrite(hl, 1, 8, fp) != 8 || fwrite(h, 1, len, fp) != len)) rc = -1;
    for (int i = 0; i < n && !rc; i++) {
        if (t[i].data)
            rc = fwrite(t[i].data, 1, t[i].n_bytes, fp) == t[i].n_bytes ? 0 : -1;
        else
            rc = t[i].gen(t[i].gen_user, &t[i], fp);
    }
    if (fp && fclose(fp) != 0) rc = -1;
    free(h);
    return rc;
}

/* Writes the tensors as `n_shards` files model-0000k-of-0000n.safetensors
 * (tensor i goes to shard t[i].shard) and model.safetensors.index.json. */
static int hfw_write_sharded(const char *dir, hfw_tensor *t, int n, int n_shards) {
    hfw_tensor *sub = malloc((size_t)n * sizeof *sub);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *idx = fopen(path, "wb");
    int rc = sub && idx ? 0 : -1;
    if (!rc) fprintf(idx, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
    for (int s = 0; s < n_shards && !rc; s++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (t[i].shard == s) sub[k++] = t[i];
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        rc = hfw_write_safetensors(path, sub, k);
        for (int i = 0; i < k && !rc; i++)
            fprintf(idx, "%s\"%s\":\"%s\"", (s || i) ? "," : "", sub[i].name, name);
    }
    if (idx) {
        fprintf(idx, "}}\n");
        fclose(idx);
    }
    free(sub);
    return rc;
}

static int hfw_write_text(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = strlen(text);
    int rc = fwrite(text, 1, n, f) == n ? 0 : -1;
    return fclose(f) || rc ? -1 : 0;
}

static int hfw_copy_file(const char *from, const char *dir, const char *name) {
    FILE *f = fopen(from, "rb");
    if (!f) return -1;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *o = fopen(path, "wb");
    int rc = o ? 0 : -1;
    char buf[65536];
    size_t n;
    while (!rc && (n = fread(buf, 1, sizeof buf, f)) > 0) rc = fwrite(buf, 1, n, o) == n ? 0 : -1;
    fclose(f);
    if (o && fclose(o)) rc = -1;
    return rc;
}

/* ---- GGUF model -> HF folder ---- */

typedef struct {
    const char *hf_arch;      /* "LlamaForCausalLM", ... */
    int dtype;                /* HFW_F32 / HFW_F16 / HFW_BF16 */
    int n_shards;             /* 0 or 1: model.safetensors; more: shards + index */
    const char *tokenizer_model; /* copied as tokenizer.model */
    const char *rope_scaling_json; /* e.g. "{\"rope_type\":\"llama3\",...}" or NULL */
    const char *skip_tensor;  /* HF name left out (bad-input tests) */
} hfw_options;

static int64_t hfw_get_int(const gguf_file *f, const char *arch, const char *suffix, int64_t dflt) {
    char key[128];
    int64_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_i64(f, key, &v, NULL) == ELLM_OK ? v : dflt;
}
static double hfw_get_f(const gguf_file *f, const char *arch, const char *suffix, double dflt) {
    char key[128];
    double v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_f64(f, key, &v, NULL) == ELLM_OK ? v : dflt;
}

/* HF name of a GGUF tensor name, or NULL (rope_freqs: derived from config). */
static const char *hfw_hf_name(const char *g, char *buf, size_t cap) {
    static const char *const map[][2] = {
        {"attn_norm.weight", "input_layernorm.weight"}, {"attn_q.weight", "self_attn.q_proj.weight"},
        {"attn_k.weight", "self_attn.k_proj.weight"},   {"attn_v.weight", "self_attn.v_proj.weight"},
        {"attn_q.bias", "self_attn.q_proj.bias"},       {"attn_k.bias", "self_attn.k_proj.bias"},
        {"attn_v.bias", "self_attn.v_proj.bias"},       {"attn_q_norm.weight", "self_attn.q_norm.weight"},
        {"attn_k_norm.weight", "self_attn.k_norm.weight"}, {"attn_output.weight", "self_attn.o_proj.weight"},
        {"ffn_norm.weight", "post_attention_layernorm.weight"}, {"ffn_gate.weight", "mlp.gate_proj.weight"},
        {"ffn_up.weight", "mlp.up_proj.weight"},        {"ffn_down.weight", "mlp.down_proj.weight"},
    };
    if (!strcmp(g, "token_embd.weight")) return "model.embed_tokens.weight";
    if (!strcmp(g, "output_norm.weight")) return "model.norm.weight";
    if (!strcmp(g, "output.weight")) return "lm_head.weight";
    int l, n = 0;
    if (sscanf(g, "blk.%d.%n", &l, &n) == 1 && n > 0) {
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (!strcmp(g + n, map[i][0])) {
                snprintf(buf, cap, "model.layers.%d.%s", l, map[i][1]);
                return buf;
            }
    }
    return NULL;
}

/* Writes `dir` (which must exist) as the HF checkpoint of GGUF `gguf_path`.
 * F32 GGUF weights only. Returns 0 on success. */
static int hfw_from_gguf(const char *gguf_path, const char *dir, const hfw_options *o) {
    gguf_file *f = NULL;
    ellm_error err = {0};
    if (gguf_open(gguf_path, &f, &err) != ELLM_OK) {
        fprintf(stderr, "hfw_from_gguf: %s\n", err.msg);
        return -1;
    }
    const char *as;
    size_t al;
    char arch[32] = "llama";
    if (gguf_get_str(f, "general.architecture", &as, &al, NULL) == ELLM_OK && al < sizeof arch) {
        memcpy(arch, as, al);
        arch[al] = 0;
    }
    int64_t n_head = hfw_get_int(f, arch, "attention.head_count", 0);
    int64_t n_kv = hfw_get_int(f, arch, "attention.head_count_kv", n_head);
    int64_t d = hfw_get_int(f, arch, "embedding_length", 0);
    int64_t key_len = hfw_get_int(f, arch, "attention.key_length", -1);
    int permute = !strcmp(arch, "llama");
    int tied = gguf_find_tensor(f, "output.weight") == NULL;
    const gguf_tensor *embd = gguf_find_tensor(f, "token_embd.weight");
    int64_t bos = -1, eos = -1;
    gguf_get_i64(f, "tokenizer.ggml.bos_token_id", &bos, NULL);
    gguf_get_i64(f, "tokenizer.ggml.eos_token_id", &eos, NULL);

    char cfg[4096];
    int k = snprintf(cfg, sizeof cfg,
                     "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"x\",\n  \"vocab_size\": %lld,\n"
                     "  \"hidden_size\": %lld,\n  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n"
                     "  \"num_key_value_heads\": %lld,\n  \"intermediate_size\": %lld,\n"
                     "  \"max_position_embeddings\": %lld,\n  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.9g,\n"
                     "  \"tie_word_embeddings\": %s,\n  \"bos_token_id\": %lld,\n  \"eos_token_id\": %lld,\n"
                     "  \"torch_dtype\": \"%s\"",
                     o->hf_arch, (long long)(embd ? embd->ne[1] : 0), (long long)d,
                     (long long)hfw_get_int(f, arch, "block_count", 0), (long long)n_head, (long long)n_kv,
                     (long long)hfw_get_int(f, arch, "feed_forward_length", 0),
                     (long long)hfw_get_int(f, arch, "context_length", 2048),
                     hfw_get_f(f, arch, "attention.layer_norm_rms_epsilon", 1e-5),
                     hfw_get_f(f, arch, "rope.freq_base", 10000), tied ? "true" : "false", (long long)bos,
                     (long long)eos, o->dtype == HFW_F32 ? "float32" : o->dtype == HFW_F16 ? "float16" : "bfloat16");
    if (key_len > 0) k += snprintf(cfg + k, sizeof cfg - (size_t)k, ",\n  \"head_dim\": %lld", (long long)key_len);
    if (o->rope_scaling_json)
        k += snprintf(cfg + k, sizeof cfg - (size_t)k, ",\n  \"rope_scaling\": %s", o->rope_scaling_json);
    snprintf(cfg + k, sizeof cfg - (size_t)k, "\n}\n");
    int rc = hfw_write_text(dir, "config.json", cfg);

    int64_t nt = gguf_n_tensors(f);
    hfw_tensor *ts = calloc((size_t)nt, sizeof *ts);
    int n = 0;
    for (int64_t i = 0; i < nt && !rc; i++) {
        const gguf_tensor *g = gguf_tensor_at(f, i);
        char buf[128];
        const char *hf = hfw_hf_name(g->name, buf, sizeof buf);
        if (!hf || (o->skip_tensor && !strcmp(hf, o->skip_tensor))) continue;
        if (g->type != QTYPE_F32) {
            rc = -1;
            break;
        }
        hfw_tensor *t = &ts[n++];
        snprintf(t->name, sizeof t->name, "%s", hf);
        t->dtype = o->dtype;
        int64_t cols = g->ne[0], rows = g->n_dims > 1 ? g->ne[1] : 1;
        t->n_dims = g->n_dims > 1 ? 2 : 1;
        t->shape[0] = g->n_dims > 1 ? rows : cols;
        t->shape[1] = cols;
        t->n_bytes = (size_t)(rows * cols) * hfw_dtype_size[o->dtype];
        t->data = malloc(t->n_bytes);
        t->shard = o->n_shards > 1 ? (int)(i % o->n_shards) : 0;
        /* HF keeps each head's rotary halves apart: HF row h*hd + j*hd/2 + i
         * is GGUF row h*hd + 2i + j (llama's Q and K only). */
        int heads = 0;
        if (permute && strstr(g->name, "attn_q.")) heads = (int)n_head;
        if (permute && strstr(g->name, "attn_k.")) heads = (int)n_kv;
        const float *src = g->data;
        int64_t len = g->n_dims > 1 ? rows : cols, inner = g->n_dims > 1 ? cols : 1;
        for (int64_t s = 0; s < len; s++) {
            int64_t r = s;
            if (heads) {
                int64_t hd = len / heads, h = s / hd, rem = s % hd, j = rem / (hd / 2), ii = rem % (hd / 2);
                r = h * hd + 2 * ii + j;
            }
            for (int64_t c = 0; c < inner; c++) {
                float v = src[r * inner + c];
                size_t at = (size_t)(s * inner + c);
                if (o->dtype == HFW_F32)
                    ((float *)t->data)[at] = v;
                else if (o->dtype == HFW_F16)
                    ((ellm_f16 *)t->data)[at] = ellm_f32_to_f16(v);
                else
                    ((ellm_bf16 *)t->data)[at] = ellm_f32_to_bf16(v);
            }
        }
    }
    if (!rc) {
        if (o->n_shards > 1) {
            rc = hfw_write_sharded(dir, ts, n, o->n_shards);
        } else {
            char path[1024];
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            rc = hfw_write_safetensors(path, ts, n);
        }
    }
    for (int i = 0; i < n; i++) free(ts[i].data);
    free(ts);
    if (!rc && o->tokenizer_model) {
        rc = hfw_copy_file(o->tokenizer_model, dir, "tokenizer.model");
        int64_t add_bos = 1, add_sp = 1;
        int b;
        if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b, NULL) == ELLM_OK) add_bos = b;
        if (gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &b, NULL) == ELLM_OK) add_sp = b;
        char tc[512];
        snprintf(tc, sizeof tc,
                 "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"unk_token\": \"<unk>\", \"add_bos_token\": %s, "
                 "\"add_eos_token\": false, \"add_prefix_space\": %s}\n",
                 add_bos ? "true" : "false", add_sp ? "true" : "false");
        if (!rc) rc = hfw_write_text(dir, "tokenizer_config.json", tc);
    }
    gguf_close(f);
    return rc;
}

#endif
