/* Writes a random-weight Hugging Face checkpoint folder with the shape of a
 * real model, for `ellm convert` speed and memory runs (bench/convert_speed.sh):
 * config.json, model.safetensors (BF16, F16 or F32, streamed tensor by
 * tensor so memory stays flat), tokenizer.model (a copy of the one given;
 * config.json's vocab_size pads it) and tokenizer_config.json.
 *
 * usage: convert_synth_hf OUT_DIR [--shape llama3.2-1b|smollm2-135m]
 *                         [--dtype bf16|f16|f32] [--tokenizer FILE]
 * Weights: uniform in [-0.05, 0.05) (xorshift), norms 1. */
#include "../tests/hf_writer.h"

#include <errno.h>
#include <sys/stat.h>

typedef struct {
    const char *name;
    int64_t d, n_layer, n_head, n_kv, head_dim, ff, vocab;
    int tied;
    double theta;
    int llama3_rope;
} shape;

static const shape shapes[] = {
    {"llama3.2-1b", 2048, 16, 32, 8, 64, 8192, 128256, 1, 500000.0, 1},
    {"smollm2-135m", 576, 30, 9, 3, 64, 1536, 49152, 1, 100000.0, 0},
};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* Streams the tensor's values in 64 KB pieces: norms (1-D) are 1, matrices
 * uniform random. */
static int gen(void *user, const hfw_tensor *t, FILE *fp) {
    (void)user;
    enum { CH = 32768 };
    static uint16_t buf16[CH];
    static float buf32[CH];
    size_t esz = hfw_dtype_size[t->dtype], n = t->n_bytes / esz;
    for (size_t done = 0; done < n;) {
        size_t k = n - done < CH ? n - done : CH;
        for (size_t i = 0; i < k; i++) {
            float v = 1.0f;
            if (t->n_dims == 2) {
                rng_state ^= rng_state << 13;
                rng_state ^= rng_state >> 7;
                rng_state ^= rng_state << 17;
                v = ((float)(rng_state >> 40) / 16777216.0f - 0.5f) * 0.1f;
            }
            if (t->dtype == HFW_F32)
                buf32[i] = v;
            else if (t->dtype == HFW_F16)
                buf16[i] = ellm_f32_to_f16(v);
            else
                buf16[i] = ellm_f32_to_bf16(v);
        }
        const void *src = t->dtype == HFW_F32 ? (const void *)buf32 : (const void *)buf16;
        if (fwrite(src, esz, k, fp) != k) return -1;
        done += k;
    }
    return 0;
}

static void add(hfw_tensor *t, int *n, const char *name, int dtype, int64_t rows, int64_t cols) {
    hfw_add(t, n, name, dtype, rows, cols)->gen = gen;
}

int main(int argc, char **argv) {
    (void)hfw_from_gguf; /* the shared writer's GGUF path is not used here */
    const char *out = NULL, *shape_name = "llama3.2-1b", *dt = "bf16", *tok = "tests/data/tok2k.model";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            shape_name = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc)
            dt = argv[++i];
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            tok = argv[++i];
        else if (argv[i][0] != '-' && !out)
            out = argv[i];
        else {
            fprintf(stderr, "usage: convert_synth_hf OUT_DIR [--shape llama3.2-1b|smollm2-135m] "
                            "[--dtype bf16|f16|f32] [--tokenizer FILE]\n");
            return 2;
        }
    }
    const shape *s = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].name, shape_name)) s = &shapes[i];
    int dtype = !strcmp(dt, "f32") ? HFW_F32 : !strcmp(dt, "f16") ? HFW_F16 : !strcmp(dt, "bf16") ? HFW_BF16 : -1;
    if (!out || !s || dtype < 0) {
        fprintf(stderr, "convert_synth_hf: need OUT_DIR, a known --shape and --dtype\n");
        return 2;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        perror(out);
        return 1;
    }
    int cap = 4 + (int)s->n_layer * 9, n = 0;
    hfw_tensor *t = calloc((size_t)cap, sizeof *t);
    char nm[128];
    const int64_t nq = s->n_head * s->head_dim, nkv = s->n_kv * s->head_dim;
    add(t, &n, "model.embed_tokens.weight", dtype, s->vocab, s->d);
    for (int64_t l = 0; l < s->n_layer; l++) {
#define NM(x) (snprintf(nm, sizeof nm, "model.layers.%lld." x, (long long)l), nm)
        add(t, &n, NM("input_layernorm.weight"), dtype, s->d, 0);
        add(t, &n, NM("self_attn.q_proj.weight"), dtype, nq, s->d);
        add(t, &n, NM("self_attn.k_proj.weight"), dtype, nkv, s->d);
        add(t, &n, NM("self_attn.v_proj.weight"), dtype, nkv, s->d);
        add(t, &n, NM("self_attn.o_proj.weight"), dtype, s->d, nq);
        add(t, &n, NM("post_attention_layernorm.weight"), dtype, s->d, 0);
        add(t, &n, NM("mlp.gate_proj.weight"), dtype, s->ff, s->d);
        add(t, &n, NM("mlp.up_proj.weight"), dtype, s->ff, s->d);
        add(t, &n, NM("mlp.down_proj.weight"), dtype, s->d, s->ff);
#undef NM
    }
    add(t, &n, "model.norm.weight", dtype, s->d, 0);
    if (!s->tied) add(t, &n, "lm_head.weight", dtype, s->vocab, s->d);
    char path[1024], cfg[2048];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (hfw_write_safetensors(path, t, n) != 0) {
        fprintf(stderr, "convert_synth_hf: writing %s failed\n", path);
        return 1;
    }
    int k = snprintf(cfg, sizeof cfg,
                     "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": %lld, \"hidden_size\": %lld, "
                     "\"num_hidden_layers\": %lld, \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, "
                     "\"head_dim\": %lld, \"intermediate_size\": %lld, \"max_position_embeddings\": 131072, "
                     "\"rms_norm_eps\": 1e-05, \"rope_theta\": %.1f, \"tie_word_embeddings\": %s, "
                     "\"bos_token_id\": 1, \"eos_token_id\": 2, \"torch_dtype\": \"%s\"",
                     (long long)s->vocab, (long long)s->d, (long long)s->n_layer, (long long)s->n_head,
                     (long long)s->n_kv, (long long)s->head_dim, (long long)s->ff, s->theta, s->tied ? "true" : "false",
                     dtype == HFW_BF16 ? "bfloat16" : dtype == HFW_F16 ? "float16" : "float32");
    if (s->llama3_rope)
        k += snprintf(cfg + k, sizeof cfg - (size_t)k,
                      ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0, "
                      "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}");
    snprintf(cfg + k, sizeof cfg - (size_t)k, "}\n");
    if (hfw_write_text(out, "config.json", cfg) || hfw_copy_file(tok, out, "tokenizer.model") ||
        hfw_write_text(out, "tokenizer_config.json", "{\"add_bos_token\": true, \"add_eos_token\": false}\n")) {
        fprintf(stderr, "convert_synth_hf: writing the folder's files failed\n");
        return 1;
    }
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += t[i].n_bytes;
    printf("%s: %s, %d tensors, %.2f GB of %s weights\n", out, s->name, n, (double)bytes / 1e9, dt);
    free(t);
    return 0;
}
