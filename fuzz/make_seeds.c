/* Writes seed corpora for the tokenizer and model loader fuzz targets into
 * OUT_DIR:
 *   OUT_DIR/gguf/  small SentencePiece and byte-level BPE vocabularies (GGUF)
 *   OUT_DIR/model/ tiny whole models (llama, mistral, qwen2, qwen3; several
 *                  tensor types; tied and untied output, rope_freqs)
 *   OUT_DIR/hf/    small tokenizer.json files (some with a tokenizer_config.json
 *                  after a NUL byte), one per supported component
 *   OUT_DIR/text/  llama.cpp's tokenizer test strings, with a selector byte
 * usage: make_seeds OUT_DIR [TEST_DATA_DIR]   (see fuzz/README.md) */
#include "gguf/gguf_writer.h"
#include "kernels/quant.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *out_dir;

static void write_file(const char *sub, const char *name, const void *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s/%s", out_dir, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) {
        fprintf(stderr, "make_seeds: cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

static void check(ellm_status st, const ellm_error *err) {
    if (st != ELLM_OK) {
        fprintf(stderr, "make_seeds: %s\n", err->msg);
        exit(1);
    }
}

/* UTF-8 of the GPT-2 byte-map character of byte b. */
static void byte_char(int b, char *out) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    unsigned cp = (unsigned)b;
    if (!printable) {
        unsigned k = 0;
        for (int c = 0; c < b; c++) {
            k += !((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
        }
        cp = 0x100 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* A byte-level BPE vocabulary: the 256 byte characters, a few merged tokens
 * and special tokens, with tokenizer.ggml.pre = `pre` (NULL: none). */
static void bpe_seed(const char *name, const char *pre) {
    static char bytes[256][3];
    const char *tokens[300];
    int32_t types[300];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        byte_char(b, bytes[b]);
        types[n] = 1;
        tokens[n++] = bytes[b];
    }
    static const char *const extra[] = {"\xc4\xa0t",
                                        "he",
                                        "\xc4\xa0the",
                                        "in",
                                        "\xc4\xa0"
                                        "a",
                                        "ll",
                                        "\xc4\xa0\xc4\xa0",
                                        "\xc4\x8a\xc4\x8a",
                                        "12",
                                        "<|endoftext|>",
                                        "<|im_start|>",
                                        "<|im_end|>",
                                        "<x>"};
    for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++) {
        types[n] = i >= 9 ? (i == 12 ? 4 : 3) : 1;
        tokens[n++] = extra[i];
    }
    static const char *const merges[] = {
        "\xc4\xa0 t",        "h e", "\xc4\xa0t he", "i n", "\xc4\xa0 a", "l l", "\xc4\xa0 \xc4\xa0",
        "\xc4\x8a \xc4\x8a", "1 2"};
    gguf_writer *w;
    ellm_error err = {0};
    check(gguf_writer_init(&w, &err), &err);
    gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2", &err);
    if (pre) gguf_writer_add_str(w, "tokenizer.ggml.pre", pre, &err);
    gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, (uint64_t)n, &err);
    gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n, &err);
    gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL,
                            sizeof(merges) / sizeof(merges[0]), &err);
    gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 265, &err);
    gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 267, &err);
    gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1, &err);
    gguf_writer_add_str(w, "tokenizer.chat_template", "{{ messages }}", &err);
    char path[1024];
    snprintf(path, sizeof(path), "%s/gguf/%s", out_dir, name);
    check(gguf_writer_write(w, path, &err), &err);
    gguf_writer_free(w);
}

/* A SentencePiece vocabulary with byte fallback. */
static void spm_seed(void) {
    static char hex[256][7];
    const char *tokens[300];
    float scores[300];
    int32_t types[300];
    int n = 0;
    static const char *const head[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        tokens[n] = head[i];
        scores[n] = 0;
        types[n++] = i == 0 ? 2 : 3;
    }
    for (int b = 0; b < 256; b++) {
        snprintf(hex[b], sizeof(hex[b]), "<0x%02X>", b);
        tokens[n] = hex[b];
        scores[n] = 0;
        types[n++] = 6;
    }
    static const char *const pieces[] = {"\xe2\x96\x81",
                                         "a",
                                         "b",
                                         "\xe2\x96\x81"
                                         "a",
                                         "ab",
                                         "\xe2\x96\x81"
                                         "ab",
                                         "\xe6\x97\xa5",
                                         "<x>"};
    for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
        tokens[n] = pieces[i];
        scores[n] = -(float)i;
        types[n++] = i == 7 ? 4 : 1;
    }
    gguf_writer *w;
    ellm_error err = {0};
    check(gguf_writer_init(&w, &err), &err);
    gguf_writer_add_str(w, "general.name", "phi3-seed", &err);
    gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", &err);
    gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, (uint64_t)n, &err);
    gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, (uint64_t)n, &err);
    gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n, &err);
    char path[1024];
    snprintf(path, sizeof(path), "%s/gguf/spm.gguf", out_dir);
    check(gguf_writer_write(w, path, &err), &err);
    gguf_writer_free(w);
}

/* ---- tiny models for fuzz_model_load ---------------------------------------
 * d_model 32, 2 heads of 16 (1 KV head), d_ff 32, 2 layers, a SentencePiece
 * vocabulary of 8 pieces: a few KB each, so mutations reach every part of the
 * header, metadata and tensor table. */

enum { SEED_D = 32, SEED_HEADS = 2, SEED_KV = 1, SEED_HD = 16, SEED_FF = 32, SEED_LAYERS = 2, SEED_VOCAB = 8 };

static uint64_t seed_rng = 0x9E3779B97F4A7C15ull;

static float seed_uniform(void) {
    seed_rng ^= seed_rng << 13;
    seed_rng ^= seed_rng >> 7;
    seed_rng ^= seed_rng << 17;
    return (float)((seed_rng >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

/* Tensor data kept alive until the writer has written the file. */
static void *seed_bufs[64];
static int seed_n_bufs;

static void seed_tensor(gguf_writer *w, const char *name, int64_t cols, int64_t rows, int type,
                        float scale, float offset) {
    int64_t n = cols * rows;
    float *x = malloc((size_t)n * sizeof *x);
    size_t bytes = qtype_row_bytes(type, cols) * (size_t)rows;
    void *q = malloc(bytes);
    if (!x || !q || seed_n_bufs == 64) {
        fprintf(stderr, "make_seeds: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) x[i] = offset + scale * seed_uniform();
    qtype_quantize_ref(type, x, q, n);
    free(x);
    seed_bufs[seed_n_bufs++] = q;
    int64_t ne[2] = {cols, rows};
    ellm_error err = {0};
    check(gguf_writer_add_tensor(w, name, rows > 1 ? 2 : 1, ne, type, q, &err), &err);
}

enum { SEED_UNTIED = 1, SEED_ROPE_FREQS = 2, SEED_SLIDING = 4, SEED_YARN = 8, SEED_LINEAR = 16 };

static void model_seed(const char *name, const char *arch, int type, int flags) {
    gguf_writer *w;
    ellm_error err = {0};
    check(gguf_writer_init(&w, &err), &err);
    char key[128];
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    gguf_writer_add_str(w, "general.architecture", arch, &err);
    gguf_writer_add_u32(w, ARCH_KEY("block_count"), SEED_LAYERS, &err);
    gguf_writer_add_u32(w, ARCH_KEY("context_length"), 64, &err);
    gguf_writer_add_u32(w, ARCH_KEY("embedding_length"), SEED_D, &err);
    gguf_writer_add_u32(w, ARCH_KEY("feed_forward_length"), SEED_FF, &err);
    gguf_writer_add_u32(w, ARCH_KEY("attention.head_count"), SEED_HEADS, &err);
    gguf_writer_add_u32(w, ARCH_KEY("attention.head_count_kv"), SEED_KV, &err);
    gguf_writer_add_u32(w, ARCH_KEY("rope.dimension_count"), SEED_HD, &err);
    gguf_writer_add_f32(w, ARCH_KEY("rope.freq_base"), 10000.0f, &err);
    gguf_writer_add_f32(w, ARCH_KEY("attention.layer_norm_rms_epsilon"), 1e-5f, &err);
    if (flags & SEED_SLIDING) gguf_writer_add_u32(w, ARCH_KEY("attention.sliding_window"), 4096, &err);
    if (flags & (SEED_YARN | SEED_LINEAR)) {
        gguf_writer_add_str(w, ARCH_KEY("rope.scaling.type"), flags & SEED_YARN ? "yarn" : "linear", &err);
        gguf_writer_add_f32(w, ARCH_KEY("rope.scaling.factor"), 4.0f, &err);
        gguf_writer_add_f32(w, ARCH_KEY("rope.scaling.attn_factor"), 1.0f, &err);
    }
    if (flags & SEED_YARN) {
        gguf_writer_add_u32(w, ARCH_KEY("rope.scaling.original_context_length"), 16, &err);
        gguf_writer_add_f32(w, ARCH_KEY("rope.scaling.yarn_beta_fast"), 32.0f, &err);
        gguf_writer_add_f32(w, ARCH_KEY("rope.scaling.yarn_beta_slow"), 1.0f, &err);
        gguf_writer_add_f32(w, ARCH_KEY("rope.scaling.yarn_attn_factor"), 1.1f, &err);
    }
#undef ARCH_KEY
    static const char *const pieces[SEED_VOCAB] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b",
                                                   "\xe2\x96\x81" "a", "ab"};
    float scores[SEED_VOCAB];
    int32_t types[SEED_VOCAB];
    for (int i = 0; i < SEED_VOCAB; i++) {
        scores[i] = -(float)i;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : 1;
    }
    gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", &err);
    gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", pieces, NULL, SEED_VOCAB, &err);
    gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, SEED_VOCAB, &err);
    gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, SEED_VOCAB, &err);
    gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1, &err);
    gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2, &err);

    const int64_t d = SEED_D, nq = SEED_HEADS * SEED_HD, nkv = SEED_KV * SEED_HD, ff = SEED_FF;
    seed_tensor(w, "token_embd.weight", d, SEED_VOCAB, type, 1.0f, 0.0f);
    seed_tensor(w, "output_norm.weight", d, 1, QTYPE_F32, 0.1f, 1.0f);
    if (flags & SEED_UNTIED) seed_tensor(w, "output.weight", d, SEED_VOCAB, type, 0.5f, 0.0f);
    if (flags & SEED_ROPE_FREQS) seed_tensor(w, "rope_freqs.weight", SEED_HD / 2, 1, QTYPE_F32, 0.5f, 1.5f);
    for (int l = 0; l < SEED_LAYERS; l++) {
        char n[64];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
        seed_tensor(w, NAME("attn_norm.weight"), d, 1, QTYPE_F32, 0.1f, 1.0f);
        seed_tensor(w, NAME("attn_q.weight"), d, nq, type, 0.3f, 0.0f);
        seed_tensor(w, NAME("attn_k.weight"), d, nkv, type, 0.3f, 0.0f);
        seed_tensor(w, NAME("attn_v.weight"), d, nkv, type, 0.3f, 0.0f);
        seed_tensor(w, NAME("attn_output.weight"), nq, d, type, 0.3f, 0.0f);
        if (!strcmp(arch, "qwen2")) {
            seed_tensor(w, NAME("attn_q.bias"), nq, 1, QTYPE_F32, 0.1f, 0.0f);
            seed_tensor(w, NAME("attn_k.bias"), nkv, 1, QTYPE_F32, 0.1f, 0.0f);
            seed_tensor(w, NAME("attn_v.bias"), nkv, 1, QTYPE_F32, 0.1f, 0.0f);
        }
        if (!strcmp(arch, "qwen3")) {
            seed_tensor(w, NAME("attn_q_norm.weight"), SEED_HD, 1, QTYPE_F32, 0.1f, 1.0f);
            seed_tensor(w, NAME("attn_k_norm.weight"), SEED_HD, 1, QTYPE_F32, 0.1f, 1.0f);
        }
        seed_tensor(w, NAME("ffn_norm.weight"), d, 1, QTYPE_F32, 0.1f, 1.0f);
        seed_tensor(w, NAME("ffn_gate.weight"), d, ff, type, 0.3f, 0.0f);
        seed_tensor(w, NAME("ffn_up.weight"), d, ff, type, 0.3f, 0.0f);
        seed_tensor(w, NAME("ffn_down.weight"), ff, d, type, 0.3f, 0.0f);
#undef NAME
    }
    char path[1024];
    snprintf(path, sizeof(path), "%s/model/%s", out_dir, name);
    check(gguf_writer_write(w, path, &err), &err);
    gguf_writer_free(w);
    while (seed_n_bufs > 0) free(seed_bufs[--seed_n_bufs]);
}

/* Small tokenizer.json files: vocab and merges shared, components varied. */
static void hf_seeds(void) {
    const char *vocab_bl =
        "\"model\":{\"type\":\"BPE\",\"ignore_merges\":%s,\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,"
        "\"\\u0120\":3,\"\\u0120ab\":4,\"1\":7,\"2\":8,\"12\":9,\"\\u010a\":10},"
        "\"merges\":[\"a b\",[\"\\u0120\",\"ab\"],\"1 2\"]}";
    const char *added = "\"added_tokens\":[{\"id\":5,\"content\":\"<|end|>\",\"special\":true,"
                        "\"lstrip\":true},{\"id\":6,\"content\":\"<x>\",\"special\":false,"
                        "\"rstrip\":true}]";
    static const char *const pres[] = {
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}",
        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(?i:'s|'t)|\\\\s?\\\\p{L}+|\\\\p{N}{1,3}|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":"
        "\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
        "\"use_regex\":false}]}",
        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":"
        "true},{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":"
        "\"MergedWithNext\"},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":"
        "false}]}",
        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"b\"},\"behavior\":\"MergedWithPrevious\",\"invert\":true},{\"type\":\"Split\","
        "\"pattern\":{\"Regex\":\"\\\\d\"},\"behavior\":\"Contiguous\"},{\"type\":\"Split\","
        "\"pattern\":{\"Regex\":\"x\"},\"behavior\":\"Removed\"},{\"type\":\"ByteLevel\"}]}",
        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"WhitespaceSplit\"},{\"type\":"
        "\"Whitespace\"},{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
    };
    static const char *const norms[] = {
        "null", "{\"type\":\"NFC\"}",
        "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKD\"},"
        "{\"type\":\"Lowercase\"},{\"type\":\"NFKC\"}]}",
        "{\"type\":\"NFD\"}"};
    char buf[8192];
    int k = 0;
    for (size_t p = 0; p < sizeof(pres) / sizeof(pres[0]); p++) {
        char model[1024];
        snprintf(model, sizeof(model), vocab_bl, p % 2 ? "true" : "false");
        int n = snprintf(buf, sizeof(buf),
                         "{\"version\":\"1.0\",%s,\"normalizer\":%s,\"pre_tokenizer\":%s,"
                         "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
                         "{\"SpecialToken\":{\"id\":\"<|end|>\",\"type_id\":0}},{\"Sequence\":"
                         "{\"id\":\"A\",\"type_id\":0}}]},\"decoder\":{\"type\":\"ByteLevel\"},%s}",
                         added, norms[p % 4], pres[p], model);
        char name[64];
        snprintf(name, sizeof(name), "bytelevel_%d.json", k++);
        write_file("hf", name, buf, (size_t)n);
        if (p == 1) { /* with a config after a NUL byte */
            const char *cfg = "{\"bos_token\":{\"content\":\"<|end|>\"},\"eos_token\":\"<x>\","
                              "\"add_bos_token\":true,\"chat_template\":[{\"name\":\"default\","
                              "\"template\":\"{{ x }}\"}]}";
            memcpy(buf + n, "", 1);
            memcpy(buf + n + 1, cfg, strlen(cfg));
            write_file("hf", "bytelevel_config.json", buf, (size_t)n + 1 + strlen(cfg));
        }
    }
    /* SentencePiece style: Prepend + Replace normalizers or a Metaspace
     * pre-tokenizer, byte fallback, unk. */
    const char *spm_model =
        "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
        "\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0x0A>\":3,"
        "\"<0xE6>\":4,\"<0x97>\":5,\"<0xA5>\":6,\"\\u2581\":7,\"a\":8,\"b\":9,\"\\u2581a\":10,"
        "\"ab\":11,\"\\u2581ab\":12},\"merges\":[\"\\u2581 a\",\"a b\",\"\\u2581a b\"]}";
    const char *spm_added = "\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
                            "{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":2,"
                            "\"content\":\"</s>\",\"special\":true}]";
    int n = snprintf(buf, sizeof(buf),
                     "{%s,\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":"
                     "\"Prepend\",\"prepend\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":"
                     "{\"String\":\" \"},\"content\":\"\\u2581\"}]},\"pre_tokenizer\":null,"
                     "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\","
                     "\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":"
                     "\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
                     "\"start\":1,\"stop\":0}]},%s}",
                     spm_added, spm_model);
    write_file("hf", "spm_prepend.json", buf, (size_t)n);
    static const char *const schemes[] = {"always", "first", "never"};
    for (int s = 0; s < 3; s++) {
        n = snprintf(buf, sizeof(buf),
                     "{%s,\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\","
                     "\"replacement\":\"\\u2581\",\"prepend_scheme\":\"%s\",\"split\":%s},"
                     "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
                     "\"prepend_scheme\":\"%s\",\"split\":true},%s}",
                     spm_added, schemes[s], s == 1 ? "false" : "true", schemes[s], spm_model);
        char name[64];
        snprintf(name, sizeof(name), "spm_metaspace_%s.json", schemes[s]);
        write_file("hf", name, buf, (size_t)n);
    }
}

/* The .inp strings of a few vocabularies, each behind several selector bytes. */
static void text_seeds(const char *data_dir) {
    static const char *const names[] = {"llama-bpe", "qwen35", "deepseek-llm"};
    int k = 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/vocab/ggml-vocab-%s.gguf.inp", data_dir, names[i]);
        FILE *f = fopen(path, "rb");
        if (!f) {
            fprintf(stderr, "make_seeds: cannot read %s\n", path);
            exit(1);
        }
        static char inp[1 << 16];
        size_t len = fread(inp, 1, sizeof(inp) - 1, f);
        fclose(f);
        inp[len] = 0;
        const char *sep = "\n__ggml_vocab_test__\n";
        for (char *p = inp, *e; (e = strstr(p, sep)); p = e + strlen(sep)) {
            static char buf[1 << 16];
            size_t n = (size_t)(e - p);
            buf[0] = (char)((k * 37) & 0xFF); /* tokenizer, BOS and special parsing vary */
            memcpy(buf + 1, p, n);
            char name[64];
            snprintf(name, sizeof(name), "inp_%03d", k++);
            write_file("text", name, buf, n + 1);
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: make_seeds OUT_DIR [TEST_DATA_DIR]\n");
        return 2;
    }
    out_dir = argv[1];
    const char *data_dir = argc > 2 ? argv[2] : "tests/data";
    static const char *const subs[] = {"", "/gguf", "/hf", "/text", "/model"};
    for (int i = 0; i < 5; i++) {
        char p[1024];
        snprintf(p, sizeof(p), "%s%s", out_dir, subs[i]);
        mkdir(p, 0755);
    }
    bpe_seed("bpe_qwen2.gguf", "qwen2");
    bpe_seed("bpe_llama3.gguf", "llama-bpe");
    bpe_seed("bpe_deepseek_llm.gguf", "deepseek-llm");
    bpe_seed("bpe_falcon.gguf", "falcon");
    bpe_seed("bpe_default.gguf", NULL);
    spm_seed();
    hf_seeds();
    text_seeds(data_dir);
    model_seed("llama_f32.gguf", "llama", QTYPE_F32, 0);
    model_seed("llama_q8_0_untied.gguf", "llama", QTYPE_Q8_0, SEED_UNTIED | SEED_ROPE_FREQS);
    model_seed("llama_f16.gguf", "llama", QTYPE_F16, 0);
    model_seed("mistral_q4_0.gguf", "mistral", QTYPE_Q4_0, SEED_SLIDING);
    model_seed("qwen2_bf16.gguf", "qwen2", QTYPE_BF16, SEED_UNTIED);
    model_seed("qwen3_q8_0.gguf", "qwen3", QTYPE_Q8_0, 0);
    model_seed("llama_q5_0.gguf", "llama", QTYPE_Q5_0, 0);
    model_seed("llama_q4_1_untied.gguf", "llama", QTYPE_Q4_1, SEED_UNTIED);
    model_seed("qwen2_q5_1.gguf", "qwen2", QTYPE_Q5_1, 0);
    model_seed("llama_iq4_nl.gguf", "llama", QTYPE_IQ4_NL, 0);
    model_seed("qwen2_q8_0_yarn.gguf", "qwen2", QTYPE_Q8_0, SEED_YARN);
    model_seed("llama_f16_linear.gguf", "llama", QTYPE_F16, SEED_LINEAR | SEED_ROPE_FREQS);
    return 0;
}
