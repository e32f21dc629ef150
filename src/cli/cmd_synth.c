/* `ellm synth`: writes a random-weight GGUF with the shape of a real model, for
 * speed runs (ours and llama.cpp's on the same file) without downloading one.
 *
 * Weights follow make_bench.py's scaling so that attention and activations
 * look like a trained model's rather than collapsing or exploding: a matrix
 * with fan-in n holds N(0,1) * s / sqrt(n) with s = 1, except s = 2 for attn_q
 * and attn_k (sharper attention) and token embeddings (and an untied output
 * matrix) at N(0,1) * 0.5; norms are ones, qwen2's q/k/v biases N(0,1) * 0.1.
 * The normal is approximated by a sum of four uniforms (Irwin-Hall, bounded at
 * +-3.46 sigma), which costs one xoshiro256++ draw per weight, so random
 * numbers cost less than quantizing them: the 8B Q4_0 file (4.7 GB) takes
 * a minute or two, bound by the quantizer and the disk.
 *
 * Tensors are generated row by row while the file is written (gguf_writer's row
 * callback), so memory stays at one row whatever the model size.
 *
 * The tokenizer is the embedded model's (tokenizer.ggml.* copied), padded with
 * "<unusedN>" pieces (type 5 = unused, score -1e9) up to the shape's vocabulary,
 * so the output matrix and embedding table have the real model's size. */
#include "cli/args.h"
#include "cli/commands.h"
#include "core/status.h"
#include "core/timer.h"
#include "kernels/quant.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- shapes ---- */

typedef struct {
    const char *name;
    const char *arch;     /* "llama" or "qwen2" (adds q/k/v bias vectors) */
    const char *like;     /* the public model whose dimensions these are */
    int n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    int tied;             /* output matrix shared with token_embd */
    float rope_theta;
    float rms_eps;
    int hidden;           /* small shapes for tests; not listed in --help */
} synth_shape;

/* context_length is 131072 for every shape (as in make_bench.py) so that depth
 * runs are never refused by the training length; Llama 3.x's rope scaling
 * (rope_freqs) is left out. */
#define SYNTH_CTX_LEN 131072

static const synth_shape synth_shapes[] = {
    {"smollm2-135m", "llama", "SmolLM2-135M", 576, 30, 9, 3, 64, 1536, 49152, 1, 1e5f, 1e-5f, 0},
    {"smollm2-360m", "llama", "SmolLM2-360M", 960, 32, 15, 5, 64, 2560, 49152, 1, 1e5f, 1e-5f, 0},
    {"qwen2.5-0.5b", "qwen2", "Qwen2.5-0.5B", 896, 24, 14, 2, 64, 4864, 151936, 1, 1e6f, 1e-6f, 0},
    {"llama3.2-1b", "llama", "Llama-3.2-1B", 2048, 16, 32, 8, 64, 8192, 128256, 1, 5e5f, 1e-5f, 0},
    {"llama3-8b", "llama", "Llama-3-8B", 4096, 32, 32, 8, 128, 14336, 128256, 0, 5e5f, 1e-5f, 0},
    /* Tests: 256-multiple dims (every type applies) and a qwen2 with an untied
     * output and n_embd 320, where K-quants fall back. */
    {"tiny", "llama", "tests", 256, 2, 4, 2, 64, 512, 2304, 1, 1e4f, 1e-5f, 1},
    {"tiny-qwen2", "qwen2", "tests", 320, 2, 5, 1, 64, 768, 2112, 0, 1e6f, 1e-6f, 1},
    /* One layer: its keys depend on the token and position only, so a context
     * shift can be compared with a fresh context exactly (normal and NeoX RoPE). */
    {"tiny-1layer", "llama", "tests", 256, 1, 4, 2, 64, 512, 2304, 1, 1e4f, 1e-5f, 1},
    {"tiny-qwen2-1layer", "qwen2", "tests", 320, 1, 5, 1, 64, 768, 2112, 0, 1e6f, 1e-6f, 1},
};
#define N_SYNTH_SHAPES (int)(sizeof synth_shapes / sizeof synth_shapes[0])

/* ---- output types ---- */

typedef struct {
    const char *name;
    int base;       /* type of most matrices */
    int file_type;  /* general.file_type (llama_ftype) */
} synth_type;

static const synth_type synth_types[] = {
    {"f32", QTYPE_F32, 0},   {"f16", QTYPE_F16, 1},   {"bf16", QTYPE_BF16, 32},
    {"q8_0", QTYPE_Q8_0, 7}, {"q4_0", QTYPE_Q4_0, 2}, {"q4_1", QTYPE_Q4_1, 3},
    {"q5_0", QTYPE_Q5_0, 8}, {"q5_1", QTYPE_Q5_1, 9}, {"q4_k_m", QTYPE_Q4_K, 15},
    {"q5_k_m", QTYPE_Q5_K, 17}, {"q3_k_m", QTYPE_Q3_K, 12}, {"q2_k", QTYPE_Q2_K, 10},
};
#define N_SYNTH_TYPES (int)(sizeof synth_types / sizeof synth_types[0])

/* llama.cpp's layer choice for the extra bits of Q4_K_M: the first and last
 * eighth of the layers and every third one in between. */
static int use_more_bits(int layer, int n_layer) {
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

/* What a matrix is, for the choice of its type. */
typedef enum { ROLE_PLAIN, ROLE_OUTPUT, ROLE_ATTN_V, ROLE_ATTN_OUTPUT, ROLE_FFN_DOWN } matrix_role;

/* Where a matrix sits: its role, its layer of n_layer, and the model's query
 * heads per KV head. */
typedef struct {
    matrix_role role;
    int layer, n_layer, n_gqa;
} matrix_place;

/* Type of one matrix with ne[0] = `ne0`, roughly as llama-quantize picks it:
 * - the output matrix (token_embd when tied) is Q6_K for every type below
 *   8 bits (q4_0, q4_1, q5_0, q5_1 and the K-quant types);
 * - q4_k_m and q5_k_m: Q6_K attn_v and ffn_down in use_more_bits() layers;
 * - q3_k_m: attn_v Q5_K in the first two layers and Q4_K after, ffn_down Q5_K
 *   in the first sixteenth and Q4_K after, attn_output Q4_K;
 * - q2_k: attn_v Q4_K (Q3_K with fewer than 4 query heads per KV head),
 *   ffn_down and attn_output Q3_K;
 * - every other matrix the base type.
 * When ne0 is not a multiple of 256 (the K-quant super-block), each type falls
 * back as in llama.cpp's llama-quant.cpp: Q6_K to Q8_0, Q5_K to Q5_1, Q4_K to
 * Q5_0, Q3_K / Q2_K to IQ4_NL. `pure` keeps every matrix at the
 * base type. */
static int matrix_type(const synth_type *t, int pure, matrix_place m, int64_t ne0) {
    int type = t->base;
    const int kq = t->base == QTYPE_Q4_K || t->base == QTYPE_Q5_K || t->base == QTYPE_Q3_K || t->base == QTYPE_Q2_K;
    const int q32 = t->base == QTYPE_Q4_0 || t->base == QTYPE_Q4_1 || t->base == QTYPE_Q5_0 || t->base == QTYPE_Q5_1;
    if (!pure && (q32 || kq) && m.role == ROLE_OUTPUT) type = QTYPE_Q6_K;
    if (!pure && (t->base == QTYPE_Q4_K || t->base == QTYPE_Q5_K) && (m.role == ROLE_ATTN_V || m.role == ROLE_FFN_DOWN) &&
        use_more_bits(m.layer, m.n_layer))
        type = QTYPE_Q6_K;
    if (!pure && t->base == QTYPE_Q3_K) {
        if (m.role == ROLE_ATTN_V) type = m.layer < 2 ? QTYPE_Q5_K : QTYPE_Q4_K;
        if (m.role == ROLE_FFN_DOWN) type = m.layer < m.n_layer / 16 ? QTYPE_Q5_K : QTYPE_Q4_K;
        if (m.role == ROLE_ATTN_OUTPUT) type = QTYPE_Q4_K;
    }
    if (!pure && t->base == QTYPE_Q2_K) {
        if (m.role == ROLE_ATTN_V) type = m.n_gqa >= 4 ? QTYPE_Q4_K : QTYPE_Q3_K;
        if (m.role == ROLE_FFN_DOWN || m.role == ROLE_ATTN_OUTPUT) type = QTYPE_Q3_K;
    }
    if (ne0 % 256) {
        if (type == QTYPE_Q6_K) type = QTYPE_Q8_0;
        if (type == QTYPE_Q5_K) type = QTYPE_Q5_1;
        if (type == QTYPE_Q4_K) type = QTYPE_Q5_0;
        if (type == QTYPE_Q3_K || type == QTYPE_Q2_K) type = QTYPE_IQ4_NL;
    }
    return type;
}

/* ---- random rows ---- */

/* xoshiro256++ (every output bit is usable; the sum of four 16-bit fields
 * below uses them all), seeded through splitmix64. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t r = rotl64(s[0] + s[3], 23) + s[0], t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return r;
}

/* Approximately N(0,1) from 64 random bits: four 16-bit uniforms summed
 * (mean 131070, variance 65536^2/3), centred and scaled. */
static inline float approx_normal(uint64_t r) {
    int32_t s = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) + (int32_t)((r >> 32) & 0xffff) +
                (int32_t)(r >> 48);
    return (float)(s - 131070) * (1.7320508f / 65536.0f);
}

/* Generator state of one tensor, the `user` of its row callback. */
typedef struct {
    int type;
    int64_t ne0;     /* elements per row */
    float std;       /* of the random values; 0: every value is `fill` */
    float fill;
    uint64_t rng[4];
    float *scratch;  /* ne0 floats, shared by all tensors (rows are made one at a time) */
} synth_tensor;

static volatile sig_atomic_t synth_interrupted;
static void synth_on_signal(int sig) { synth_interrupted = sig; }

/* Row callback: ne0 values, quantized into `dst`. */
static ellm_status synth_row(void *user, int64_t row, void *dst, size_t n_bytes, ellm_error *err) {
    synth_tensor *t = user;
    if (synth_interrupted) return ellm_fail(err, ELLM_ERR_IO, "interrupted");
    float *x = t->scratch;
    if (t->std == 0.0f) {
        for (int64_t i = 0; i < t->ne0; i++) x[i] = t->fill;
    } else {
        for (int64_t i = 0; i < t->ne0; i++) x[i] = approx_normal(xoshiro_next(t->rng)) * t->std;
    }
    qtype_quantize_ref(t->type, x, dst, t->ne0);
    return ELLM_OK;
}

/* ---- building the file ---- */

typedef struct {
    gguf_writer *w;
    const synth_shape *shape;
    const synth_type *type;
    int pure;
    uint64_t seed;
    synth_tensor *tensors; /* one per tensor, live until the write is done */
    int n_tensors, cap_tensors;
    float *scratch;
    int64_t scratch_len;
} synth_ctx;

/* Adds a tensor of `n_dims` dims generated by synth_row: random N(0, std^2)
 * values or, with std == 0, the constant `fill`. */
static ellm_status synth_add(synth_ctx *c, const char *name, int type, int n_dims, int64_t ne0,
                             int64_t ne1, float std, float fill, ellm_error *err) {
    ELLM_ASSERT(c->n_tensors < c->cap_tensors);
    synth_tensor *t = &c->tensors[c->n_tensors];
    t->type = type;
    t->ne0 = ne0;
    t->std = std;
    t->fill = fill;
    /* An independent stream per tensor, so a tensor's values depend only on the
     * seed and its index. */
    uint64_t sm = c->seed ^ ((uint64_t)(c->n_tensors + 1) * 0xd1342543de82ef95ull);
    for (int i = 0; i < 4; i++) t->rng[i] = splitmix64(&sm);
    t->scratch = c->scratch;
    ELLM_ASSERT(ne0 <= c->scratch_len);
    int64_t ne[2] = {ne0, ne1};
    ellm_status st = gguf_writer_add_tensor_rows(c->w, name, n_dims, ne, type, synth_row, t, err);
    if (st == ELLM_OK) c->n_tensors++;
    return st;
}

/* A weight matrix [ne1 rows of ne0 = fan-in] scaled s / sqrt(fan-in). */
static ellm_status synth_matrix(synth_ctx *c, const char *name, int64_t ne0, int64_t ne1, float s, matrix_place m,
                                ellm_error *err) {
    int type = matrix_type(c->type, c->pure, m, ne0);
    return synth_add(c, name, type, 2, ne0, ne1, s / sqrtf((float)ne0), 0.0f, err);
}

/* Copies the tokenizer.ggml.* metadata of `src` into the writer, padding the
 * tokens, scores and token_type arrays to `n_vocab` with unused pieces.
 * Fails if `src` has no token list or more pieces than `n_vocab`. */
static ellm_status copy_tokenizer(gguf_writer *w, const gguf_file *src, const char *src_path,
                                  int64_t n_vocab, ellm_error *err) {
    const char *K_TOKENS = "tokenizer.ggml.tokens", *K_SCORES = "tokenizer.ggml.scores",
               *K_TYPES = "tokenizer.ggml.token_type";
    ellm_status st;
    gguf_value_type et;
    uint64_t n_src;
    const void *data;
    int64_t tok_idx = gguf_find_key(src, K_TOKENS);
    if (tok_idx < 0 || (st = gguf_get_arr(src, K_TOKENS, &et, &n_src, &data, err)) != ELLM_OK ||
        et != GGUF_TYPE_STRING || n_src == 0)
        return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': no %s string array to copy the tokenizer from", src_path,
                         K_TOKENS);
    if (n_src > (uint64_t)n_vocab)
        return ellm_fail(err, ELLM_ERR_ARG, "'%s' has %llu tokenizer pieces, more than the shape's %lld",
                         src_path, (unsigned long long)n_src, (long long)n_vocab);

    const char **strs = malloc((size_t)n_vocab * sizeof *strs);
    size_t *lens = malloc((size_t)n_vocab * sizeof *lens);
    float *scores = malloc((size_t)n_vocab * sizeof *scores);
    int32_t *types = malloc((size_t)n_vocab * sizeof *types);
    char *pad = malloc((size_t)(n_vocab - (int64_t)n_src) * 24 + 1); /* "<unusedN>" pieces */
    if (!strs || !lens || !scores || !types || !pad) {
        st = ellm_fail(err, ELLM_ERR_NOMEM, "out of memory for a %lld-piece vocabulary", (long long)n_vocab);
        goto done;
    }
    for (uint64_t i = 0; i < n_src; i++) {
        if ((st = gguf_get_arr_str(src, tok_idx, i, &strs[i], &lens[i])) != ELLM_OK) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': cannot read token %llu", src_path, (unsigned long long)i);
            goto done;
        }
    }
    char *p = pad;
    for (int64_t i = (int64_t)n_src; i < n_vocab; i++) {
        int n = sprintf(p, "<unused%lld>", (long long)i);
        strs[i] = p;
        lens[i] = (size_t)n;
        p += n;
    }

    /* Scores and types: the source's if present (with the token count), else
     * SentencePiece's defaults (score 0, type 1 = normal). */
    for (int64_t i = 0; i < n_vocab; i++) {
        scores[i] = i < (int64_t)n_src ? 0.0f : -1e9f;
        types[i] = i < (int64_t)n_src ? 1 : 5;
    }
    if (gguf_find_key(src, K_SCORES) >= 0) {
        uint64_t n;
        if ((st = gguf_get_arr(src, K_SCORES, &et, &n, &data, err)) != ELLM_OK) goto done;
        if (et != GGUF_TYPE_FLOAT32 || n != n_src) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': %s is not %llu float32s", src_path, K_SCORES,
                           (unsigned long long)n_src);
            goto done;
        }
        memcpy(scores, data, n * sizeof(float));
    }
    if (gguf_find_key(src, K_TYPES) >= 0) {
        uint64_t n;
        if ((st = gguf_get_arr(src, K_TYPES, &et, &n, &data, err)) != ELLM_OK) goto done;
        if (et != GGUF_TYPE_INT32 || n != n_src) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': %s is not %llu int32s", src_path, K_TYPES,
                           (unsigned long long)n_src);
            goto done;
        }
        memcpy(types, data, n * sizeof(int32_t));
    }
    if ((st = gguf_writer_add_arr_str(w, K_TOKENS, strs, lens, (uint64_t)n_vocab, err)) ||
        (st = gguf_writer_add_arr(w, K_SCORES, GGUF_TYPE_FLOAT32, scores, (uint64_t)n_vocab, err)) ||
        (st = gguf_writer_add_arr(w, K_TYPES, GGUF_TYPE_INT32, types, (uint64_t)n_vocab, err)))
        goto done;

    /* Every other tokenizer.ggml.* key (model, pre, bos/eos/unk ids, add_bos,
     * merges, ...) as it is, with its type. */
    for (int64_t k = 0; k < gguf_n_kv(src); k++) {
        const char *key = gguf_key_name(src, k);
        if (!key || strncmp(key, "tokenizer.ggml.", 15) || !strcmp(key, K_TOKENS) || !strcmp(key, K_SCORES) ||
            !strcmp(key, K_TYPES))
            continue;
        if ((st = gguf_writer_copy_kv(w, src, k, err)) != ELLM_OK) goto done;
    }
    st = ELLM_OK;
done:
    free(strs);
    free(lens);
    free(scores);
    free(types);
    free(pad);
    return st;
}

/* Adds the model's hyperparameters, the tokenizer and every tensor (generated
 * at write time) to c->w. */
static ellm_status synth_build(synth_ctx *c, const gguf_file *vocab, const char *vocab_path,
                               ellm_error *err) {
    const synth_shape *sh = c->shape;
    gguf_writer *w = c->w;
    const char *a = sh->arch;
    char key[96], desc[256];
    ellm_status st;
    const int64_t d = sh->n_embd, q_dim = (int64_t)sh->n_head * sh->head_dim,
                  kv_dim = (int64_t)sh->n_head_kv * sh->head_dim, ff = sh->n_ff, V = sh->n_vocab;

#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, a), key)
    snprintf(desc, sizeof desc,
             "Random weights (seed %llu) with the shape of %s, for speed measurements only; "
             "the tokenizer is a small one padded with unused pieces.",
             (unsigned long long)c->seed, sh->like);
    gguf_writer_add_str(w, "general.architecture", a, err);
    snprintf(key, sizeof key, "random-%s", sh->name);
    gguf_writer_add_str(w, "general.name", key, err);
    gguf_writer_add_str(w, "general.description", desc, err);
    gguf_writer_add_u32(w, "general.file_type", (uint32_t)c->type->file_type, err);
    if (qtype_get(c->type->base)->block_elems > 1) gguf_writer_add_u32(w, "general.quantization_version", 2, err);
    gguf_writer_set_alignment(w, 32, err);
    gguf_writer_add_u32(w, KEY("context_length"), SYNTH_CTX_LEN, err);
    gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)d, err);
    gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)sh->n_layer, err);
    gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)ff, err);
    gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)sh->n_head, err);
    gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)sh->n_head_kv, err);
    gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)sh->head_dim, err);
    gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)sh->head_dim, err);
    gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), sh->rms_eps, err);
    gguf_writer_add_f32(w, KEY("rope.freq_base"), sh->rope_theta, err);
    gguf_writer_add_u32(w, KEY("rope.dimension_count"), (uint32_t)sh->head_dim, err);
    gguf_writer_add_u32(w, KEY("vocab_size"), (uint32_t)V, err);
#undef KEY
    if ((st = copy_tokenizer(w, vocab, vocab_path, V, err)) != ELLM_OK) return st;

    /* Tensors in llama.cpp's converter order. Shapes are GGUF ne[] = {fan-in,
     * rows}: token_embd [V rows of d], attn_q [q_dim rows of d], ... */
    const float embd_std = 0.5f * sqrtf((float)d); /* makes N(0,1) * 0.5 after / sqrt(d) */
    const int gqa = sh->n_head / sh->n_head_kv;
    const matrix_place embd = {sh->tied ? ROLE_OUTPUT : ROLE_PLAIN, 0, sh->n_layer, gqa};
    if ((st = synth_matrix(c, "token_embd.weight", d, V, embd_std, embd, err))) return st;
    for (int l = 0; l < sh->n_layer; l++) {
        char name[64];
        const matrix_place plain = {ROLE_PLAIN, l, sh->n_layer, gqa}, attn_v = {ROLE_ATTN_V, l, sh->n_layer, gqa},
                           attn_out = {ROLE_ATTN_OUTPUT, l, sh->n_layer, gqa}, down = {ROLE_FFN_DOWN, l, sh->n_layer, gqa};
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, l), name)
        if ((st = synth_add(c, NAME("attn_norm.weight"), QTYPE_F32, 1, d, 1, 0.0f, 1.0f, err)) ||
            (st = synth_matrix(c, NAME("attn_q.weight"), d, q_dim, 2.0f, plain, err)) ||
            (st = synth_matrix(c, NAME("attn_k.weight"), d, kv_dim, 2.0f, plain, err)) ||
            (st = synth_matrix(c, NAME("attn_v.weight"), d, kv_dim, 1.0f, attn_v, err)))
            return st;
        if (!strcmp(a, "qwen2") &&
            ((st = synth_add(c, NAME("attn_q.bias"), QTYPE_F32, 1, q_dim, 1, 0.1f, 0.0f, err)) ||
             (st = synth_add(c, NAME("attn_k.bias"), QTYPE_F32, 1, kv_dim, 1, 0.1f, 0.0f, err)) ||
             (st = synth_add(c, NAME("attn_v.bias"), QTYPE_F32, 1, kv_dim, 1, 0.1f, 0.0f, err))))
            return st;
        if ((st = synth_matrix(c, NAME("attn_output.weight"), q_dim, d, 1.0f, attn_out, err)) ||
            (st = synth_add(c, NAME("ffn_norm.weight"), QTYPE_F32, 1, d, 1, 0.0f, 1.0f, err)) ||
            (st = synth_matrix(c, NAME("ffn_gate.weight"), d, ff, 1.0f, plain, err)) ||
            (st = synth_matrix(c, NAME("ffn_up.weight"), d, ff, 1.0f, plain, err)) ||
            (st = synth_matrix(c, NAME("ffn_down.weight"), ff, d, 1.0f, down, err)))
            return st;
#undef NAME
    }
    if ((st = synth_add(c, "output_norm.weight", QTYPE_F32, 1, d, 1, 0.0f, 1.0f, err))) return st;
    /* An untied output matrix gets the embeddings' scale, so logits have the
     * same spread whether or not the shape ties them. */
    if (!sh->tied && (st = synth_matrix(c, "output.weight", d, V, embd_std, (matrix_place){ROLE_OUTPUT, 0, sh->n_layer, gqa}, err))) return st;
    return ELLM_OK;
}

/* ---- command ---- */

typedef struct {
    int tty;
    int last_pct;
    double t0_ms;
} synth_progress;

static void synth_on_progress(void *user, uint64_t done, uint64_t total) {
    synth_progress *p = user;
    if (!p->tty || !total) return;
    int pct = (int)(done * 100 / total);
    if (pct == p->last_pct) return;
    p->last_pct = pct;
    double s = (ellm_time_ms() - p->t0_ms) / 1e3;
    fprintf(stderr, "\rsynth: %3d%%  %.2f of %.2f GB  %.0f s ", pct, done / 1e9, total / 1e9, s);
    fflush(stderr);
}

static void synth_usage(FILE *f) {
    fprintf(f,
            "usage: ellm synth --shape NAME --type TYPE -o FILE [--seed N] [--pure] [--vocab FILE]\n"
            "\n"
            "Writes a GGUF with random weights and the dimensions of a real model, for\n"
            "speed runs. Values are scaled so attention and activations behave like a\n"
            "trained model's; the text it generates is noise.\n"
            "\n"
            "  --shape NAME    model shape (below)\n"
            "  --type TYPE     f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_m,\n"
            "                  q4_k_m or q5_k_m;\n"
            "                  norms and biases are f32\n"
            "  -o, --output F  file to write (replaced if it exists)\n"
            "  --seed N        random seed (default 0); same seed, same file, and the same\n"
            "                  underlying weights whatever the type\n"
            "  --pure          every matrix in TYPE (default, like llama-quantize: the\n"
            "                  output matrix is Q6_K for types below 8 bits; q4_k_m and\n"
            "                  q5_k_m have Q6_K attn_v/ffn_down in the first/last eighth and\n"
            "                  every third layer; q3_k_m has Q4_K/Q5_K attn_v, ffn_down and\n"
            "                  attn_output; q2_k has Q3_K/Q4_K attn_v and Q3_K ffn_down and\n"
            "                  attn_output; Q2_K, Q3_K, Q4_K, Q5_K, Q6_K fall back to\n"
            "                  IQ4_NL, IQ4_NL, Q5_0, Q5_1, Q8_0\n"
            "                  where a row is not a multiple of 256)\n"
            "  --vocab FILE    GGUF whose tokenizer.ggml.* metadata is copied and padded with\n"
            "                  <unusedN> pieces (default: models/evalmodel.gguf)\n"
            "\n"
            "shapes:         arch   d_model layers heads kv_heads head_dim   d_ff   vocab  tied  rope_theta\n");
    for (int i = 0; i < N_SYNTH_SHAPES; i++) {
        const synth_shape *s = &synth_shapes[i];
        if (s->hidden) continue;
        fprintf(f, "  %-13s %-5s %8d %6d %5d %8d %8d %6d %7d  %-4s  %.0f\n", s->name, s->arch, s->n_embd,
                s->n_layer, s->n_head, s->n_head_kv, s->head_dim, s->n_ff, s->n_vocab, s->tied ? "yes" : "no",
                s->rope_theta);
    }
}

/* The embedded model (source of the tokenizer): models/evalmodel.gguf beside
 * the executable's parent directory (build/ellm), else in the working
 * directory. Not $ELLM_MODEL: the vocabulary must not change with it. */
static const char *synth_default_vocab(char *buf, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        for (int up = 0; up < 2; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = 0;
        }
        int m = snprintf(buf, cap, "%s/models/evalmodel.gguf", exe);
        if (m > 0 && (size_t)m < cap && access(buf, R_OK) == 0) return buf;
    }
    return "models/evalmodel.gguf";
}

int cmd_synth(int argc, char **argv) {
    const char *shape_name = NULL, *type_name = NULL, *out_path = NULL, *vocab_path = NULL;
    uint64_t seed = 0;
    int pure = 0, bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            synth_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--pure")) {
            pure = 1;
        } else if (arg_value(argc, argv, &i, "--shape", NULL, &v, &bad)) {
            shape_name = v;
        } else if (arg_value(argc, argv, &i, "--type", NULL, &v, &bad)) {
            type_name = v;
        } else if (arg_value(argc, argv, &i, "--output", "-o", &v, &bad)) {
            out_path = v;
        } else if (arg_value(argc, argv, &i, "--vocab", NULL, &v, &bad)) {
            vocab_path = v;
        } else if (arg_value(argc, argv, &i, "--seed", NULL, &v, &bad)) {
            if (v && !arg_u64("--seed", v, &seed)) bad = 1;
        } else {
            fprintf(stderr, "error: unknown option '%s' (see ellm synth --help)\n", a);
            bad = 1;
        }
    }
    if (bad) return 2;
    if (!shape_name || !type_name || !out_path || !*out_path) {
        fprintf(stderr, "error: --shape, --type and -o are required (see ellm synth --help)\n");
        return 2;
    }
    const synth_shape *shape = NULL;
    for (int i = 0; i < N_SYNTH_SHAPES; i++)
        if (!strcmp(shape_name, synth_shapes[i].name)) shape = &synth_shapes[i];
    if (!shape) {
        fprintf(stderr, "error: unknown --shape '%s'; one of:", shape_name);
        for (int i = 0; i < N_SYNTH_SHAPES; i++)
            if (!synth_shapes[i].hidden) fprintf(stderr, " %s", synth_shapes[i].name);
        fputc('\n', stderr);
        return 2;
    }
    const synth_type *type = NULL;
    for (int i = 0; i < N_SYNTH_TYPES; i++)
        if (!strcmp(type_name, synth_types[i].name)) type = &synth_types[i];
    if (!type) {
        fprintf(stderr, "error: unknown --type '%s'; one of:", type_name);
        for (int i = 0; i < N_SYNTH_TYPES; i++) fprintf(stderr, " %s", synth_types[i].name);
        fputc('\n', stderr);
        return 2;
    }
    char vocab_buf[PATH_MAX];
    if (!vocab_path) vocab_path = synth_default_vocab(vocab_buf, sizeof vocab_buf);

    ellm_error err = {0};
    gguf_file *vocab = NULL;
    synth_ctx c = {0};
    int rc = 1;
    c.shape = shape;
    c.type = type;
    c.pure = pure;
    c.seed = seed;
    c.cap_tensors = 3 + shape->n_layer * 12;
    c.scratch_len = shape->n_embd;
    if (shape->n_ff > c.scratch_len) c.scratch_len = shape->n_ff;
    if ((int64_t)shape->n_head * shape->head_dim > c.scratch_len)
        c.scratch_len = (int64_t)shape->n_head * shape->head_dim;
    c.tensors = calloc((size_t)c.cap_tensors, sizeof *c.tensors);
    c.scratch = malloc((size_t)c.scratch_len * sizeof *c.scratch);
    if (!c.tensors || !c.scratch) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    if (gguf_open(vocab_path, &vocab, &err) != ELLM_OK) {
        fprintf(stderr, "error: tokenizer source: %s\n", err.msg);
        goto done;
    }
    /* Writing over the tokenizer source would truncate the file we read from
     * (the embedded model, by default). */
    struct stat s_out, s_vocab;
    if (stat(out_path, &s_out) == 0 && stat(vocab_path, &s_vocab) == 0 && s_out.st_dev == s_vocab.st_dev &&
        s_out.st_ino == s_vocab.st_ino) {
        fprintf(stderr, "error: -o %s is the tokenizer source; choose another output file\n", out_path);
        goto done;
    }
    if (gguf_writer_init(&c.w, &err) != ELLM_OK || synth_build(&c, vocab, vocab_path, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }

    synth_progress prog = {isatty(STDERR_FILENO), -1, ellm_time_ms()};
    gguf_writer_set_progress(c.w, synth_on_progress, &prog);
    /* Ctrl-C stops at the next row so the writer can remove the partial file. */
    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = synth_on_signal;
    sigemptyset(&sa.sa_mask);
    synth_interrupted = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    ellm_status st = gguf_writer_write(c.w, out_path, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (prog.tty && prog.last_pct >= 0) fputc('\n', stderr);
    if (st != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        if (synth_interrupted) raise(synth_interrupted);
        goto done;
    }
    fprintf(stderr, "synth: wrote %s: %s %s, %lld tensors, %.3f GB in %.1f s\n", out_path, shape->name, type->name,
            (long long)gguf_writer_n_tensors(c.w), gguf_writer_file_size(c.w) / 1e9,
            (ellm_time_ms() - prog.t0_ms) / 1e3);
    rc = 0;
done:
    gguf_writer_free(c.w);
    if (vocab) gguf_close(vocab);
    free(c.tensors);
    free(c.scratch);
    return rc;
}
