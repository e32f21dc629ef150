/* Writes the seed corpora of the converter's fuzz targets (fuzz/README.md):
 *   OUT/convert/      type byte + config.json + NUL + model.safetensors of tiny
 *                     llama, mistral, qwen2 and qwen3 checkpoints (F32, F16,
 *                     BF16; tied and untied; llama3 rope scaling)
 *   OUT/safetensors/  those model.safetensors files and small hand-made ones
 *                     (empty header, metadata only, scalar, 3-D, integer
 *                     dtypes, empty tensors)
 *   OUT/sp/           small tokenizer.model files and tests/data/tok2k.model
 * Usage: make_convert_seeds OUT_DIR TESTS_DATA_DIR */
#include "hf_writer.h"
#include "sp_writer.h"

#include "convert/fileio.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *g_out;

static void put(const char *sub, const char *name, const void *p, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_out, sub);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", g_out, sub, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(p, 1, n, fp) != n || fclose(fp) != 0) {
        fprintf(stderr, "make_convert_seeds: cannot write %s\n", path);
        exit(1);
    }
}

/* The whole file at path (malloc'ed, *n bytes), or NULL. */
static uint8_t *slurp(const char *path, size_t *n) {
    char *b = NULL;
    ellm_error err;
    return cv_read_file(path, SIZE_MAX, &b, n, &err) == ELLM_OK ? (uint8_t *)b : NULL;
}

static uint32_t g_rng = 12345;
static float frand(void) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return ((float)(g_rng >> 8) / 16777216.0f - 0.5f) * 0.2f;
}

/* Fills a tensor of `rows` x `cols` (cols 0: 1-D) with small random values. */
static void add(hfw_tensor *t, int *n, const char *name, int dtype, int64_t rows, int64_t cols) {
    hfw_tensor *x = hfw_add(t, n, name, dtype, rows, cols);
    int64_t count = rows * (cols ? cols : 1);
    x->data = malloc(x->n_bytes);
    for (int64_t i = 0; i < count; i++) {
        float v = frand();
        if (dtype == HFW_F32)
            ((float *)x->data)[i] = v;
        else if (dtype == HFW_F16)
            ((ellm_f16 *)x->data)[i] = ellm_f32_to_f16(v);
        else
            ((ellm_bf16 *)x->data)[i] = ellm_f32_to_bf16(v);
    }
}

typedef struct {
    const char *name, *arch;
    int dtype, tied, qkv_bias, qk_norm, llama3, n_layer;
    int64_t vocab, d, heads, kv, ff, head_dim;
} spec;

static void model_seed(const spec *s, int type_byte) {
    hfw_tensor t[64];
    int n = 0;
    char nm[128];
    int64_t hd = s->head_dim ? s->head_dim : s->d / s->heads;
    add(t, &n, "model.embed_tokens.weight", s->dtype, s->vocab, s->d);
    for (int l = 0; l < s->n_layer; l++) {
#define NM(x) (snprintf(nm, sizeof nm, "model.layers.%d." x, l), nm)
        add(t, &n, NM("input_layernorm.weight"), s->dtype, s->d, 0);
        add(t, &n, NM("self_attn.q_proj.weight"), s->dtype, s->heads * hd, s->d);
        add(t, &n, NM("self_attn.k_proj.weight"), s->dtype, s->kv * hd, s->d);
        add(t, &n, NM("self_attn.v_proj.weight"), s->dtype, s->kv * hd, s->d);
        if (s->qkv_bias) {
            add(t, &n, NM("self_attn.q_proj.bias"), s->dtype, s->heads * hd, 0);
            add(t, &n, NM("self_attn.k_proj.bias"), s->dtype, s->kv * hd, 0);
            add(t, &n, NM("self_attn.v_proj.bias"), s->dtype, s->kv * hd, 0);
        }
        if (s->qk_norm) {
            add(t, &n, NM("self_attn.q_norm.weight"), s->dtype, hd, 0);
            add(t, &n, NM("self_attn.k_norm.weight"), s->dtype, hd, 0);
        }
        add(t, &n, NM("self_attn.o_proj.weight"), s->dtype, s->d, s->heads * hd);
        add(t, &n, NM("post_attention_layernorm.weight"), s->dtype, s->d, 0);
        add(t, &n, NM("mlp.gate_proj.weight"), s->dtype, s->ff, s->d);
        add(t, &n, NM("mlp.up_proj.weight"), s->dtype, s->ff, s->d);
        add(t, &n, NM("mlp.down_proj.weight"), s->dtype, s->d, s->ff);
#undef NM
    }
    add(t, &n, "model.norm.weight", s->dtype, s->d, 0);
    if (!s->tied) add(t, &n, "lm_head.weight", s->dtype, s->vocab, s->d);
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s/.seed.safetensors", g_out);
    if (hfw_write_safetensors(tmp, t, n) != 0) exit(1);
    size_t st_len;
    uint8_t *st = slurp(tmp, &st_len);
    unlink(tmp);
    char cfg[2048];
    int k = snprintf(cfg, sizeof cfg,
                     "{\"architectures\": [\"%s\"], \"vocab_size\": %lld, \"hidden_size\": %lld, "
                     "\"num_hidden_layers\": %d, \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, "
                     "\"intermediate_size\": %lld, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05, "
                     "\"rope_theta\": 10000.0, \"tie_word_embeddings\": %s, \"bos_token_id\": 1, "
                     "\"eos_token_id\": [2]",
                     s->arch, (long long)s->vocab, (long long)s->d, s->n_layer, (long long)s->heads, (long long)s->kv,
                     (long long)s->ff, s->tied ? "true" : "false");
    if (s->head_dim) k += snprintf(cfg + k, sizeof cfg - (size_t)k, ", \"head_dim\": %lld", (long long)s->head_dim);
    if (s->llama3)
        k += snprintf(cfg + k, sizeof cfg - (size_t)k,
                      ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                      "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}");
    k += snprintf(cfg + k, sizeof cfg - (size_t)k, "}");
    size_t total = 1 + (size_t)k + 1 + st_len;
    uint8_t *seed = malloc(total);
    seed[0] = (uint8_t)type_byte;
    memcpy(seed + 1, cfg, (size_t)k);
    seed[1 + k] = 0;
    memcpy(seed + 2 + k, st, st_len);
    put("convert", s->name, seed, total);
    put("safetensors", s->name, st, st_len);
    free(seed);
    free(st);
    for (int i = 0; i < n; i++) free(t[i].data);
}

/* A safetensors file from header text and `data_len` data bytes (0x3c). */
static void raw_st(const char *name, const char *header, size_t data_len) {
    size_t hl = strlen(header), total = 8 + hl + data_len;
    uint8_t *b = malloc(total);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, 0x3c, data_len);
    put("safetensors", name, b, total);
    free(b);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: make_convert_seeds OUT_DIR TESTS_DATA_DIR\n");
        return 2;
    }
    g_out = argv[1];
    mkdir(g_out, 0755);
    /* vocab 16 = the fuzz_convert tokenizer.model; d 32 keeps the files small
     * (and exercises the row fallbacks: 32 is not a multiple of 128 or 256);
     * the 256-wide one takes the K-quant and int4-g128 paths. */
    static const spec specs[] = {
        {"llama-f32", "LlamaForCausalLM", HFW_F32, 1, 0, 0, 0, 1, 16, 32, 2, 1, 64, 0},
        {"llama-untied-f16", "LlamaForCausalLM", HFW_F16, 0, 0, 0, 0, 2, 16, 32, 4, 2, 48, 0},
        {"llama3-rope-bf16", "LlamaForCausalLM", HFW_BF16, 1, 0, 0, 1, 1, 16, 32, 2, 2, 32, 0},
        {"mistral-bf16", "MistralForCausalLM", HFW_BF16, 0, 0, 0, 0, 1, 20, 32, 2, 1, 64, 0},
        {"qwen2-bias-f16", "Qwen2ForCausalLM", HFW_F16, 1, 1, 0, 0, 1, 16, 32, 2, 1, 64, 0},
        {"qwen3-norm-f32", "Qwen3ForCausalLM", HFW_F32, 1, 0, 1, 0, 1, 16, 32, 2, 1, 64, 16},
        {"llama-256-bf16", "LlamaForCausalLM", HFW_BF16, 0, 0, 0, 0, 1, 16, 256, 1, 1, 32, 32},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) model_seed(&specs[i], (int)i);
    raw_st("empty-header", "{}", 0);
    raw_st("metadata-only", "{\"__metadata__\":{\"format\":\"pt\"}}  ", 0);
    raw_st("scalar-and-3d",
           "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
           "\"c\":{\"dtype\":\"F16\",\"shape\":[2,2,2],\"data_offsets\":[4,20]}}",
           20);
    raw_st("int-dtypes",
           "{\"a\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[4,12]},"
           "\"e\":{\"dtype\":\"BOOL\",\"shape\":[0,3],\"data_offsets\":[12,12]},"
           "\"f\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,2],\"data_offsets\":[12,16]}}",
           16);
    raw_st("unordered",
           "{\"z\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[6,12]},"
           "\"y\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[12,20]},"
           "\"x\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}",
           20);
    uint8_t sp[4096];
    size_t n = spw_small_model(sp, sizeof sp);
    put("sp", "small16.model", sp, n);
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", "<0x00>", "<0xFF>", "\xe2\x96\x81x", "[MASK]", "y"};
    static const float scores[] = {0, 0, 0, 0, 0, -1.5f, -1000, -2};
    static const int types[] = {2, 3, 3, 6, 6, 1, 4, 5};
    n = spw_model(sp, sizeof sp, pieces, scores, types, 8, 0);
    put("sp", "bytes8-noprefix.model", sp, n);
    n = spw_model(sp, sizeof sp, pieces, scores, types, 3, -1);
    put("sp", "three.model", sp, n);
    char path[1024];
    snprintf(path, sizeof path, "%s/tok2k.model", argv[2]);
    uint8_t *tok = slurp(path, &n);
    if (tok) {
        put("sp", "tok2k.model", tok, n);
        free(tok);
    }
    return 0;
}
