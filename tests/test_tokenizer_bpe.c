/* Tokenizer tests for byte-level BPE and tokenizer.json: the llama.cpp golden
 * vectors of all 13 vocabularies in tests/data/vocab (from GGUF), the same
 * vectors through the matching tokenizer.json files in tests/data/hf,
 * streaming detokenization of byte-level pieces, special tokens, BOS, the
 * public ellm_tokenizer API, and malformed tokenizer.json files. */
#include "harness.h"
#include "vocab_vectors.h"

#include "ellm.h"

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Opens a GGUF vocabulary and builds its tokenizer; NULL (with a failed
 * CHECK) on error. */
static tokenizer *open_gguf(const char *path) {
    gguf_file *f = NULL;
    ellm_error err = {0};
    ellm_status st = gguf_open(path, &f, &err);
    CHECK(st == ELLM_OK, "gguf_open %s: %s", path, err.msg);
    if (st != ELLM_OK) return NULL;
    tokenizer *t = NULL;
    st = tokenizer_init_gguf(f, &t, &err);
    CHECK(st == ELLM_OK, "tokenizer_init_gguf %s: %s", path, err.msg);
    gguf_close(f);
    return st == ELLM_OK ? t : NULL;
}

static tokenizer *open_hf(const char *rel) {
    tokenizer *t = NULL;
    ellm_error err = {0};
    ellm_status st = tokenizer_init_hf_json(test_data_path(rel), &t, &err);
    CHECK(st == ELLM_OK, "tokenizer_init_hf_json %s: %s", rel, err.msg);
    return st == ELLM_OK ? t : NULL;
}



/* ---- golden vectors: .inp strings separated by "\n__ggml_vocab_test__\n",
 * .out one line of ids per string (no BOS, special text not parsed) ---- */


/* Checks every vector of the .inp file `inp_rel` against the ids of the
 * .out file `out_rel`, encoding with tokenizer `t` (labelled `via`); returns
 * the number that match and sets *n_total. */
static int check_vectors(const tokenizer *t, const char *inp_rel, const char *out_rel,
                         const char *via, int add_bos, int parse_special, int *n_total) {
    size_t inp_len = 0, out_len = 0;
    char *inp = test_read_file(test_data_path(inp_rel), &inp_len);
    char *out = test_read_file(test_data_path(out_rel), &out_len);
    CHECK(inp && out, "reading %s / %s", inp_rel, out_rel);
    int n_tests = 0, n_match = 0;
    char *p = inp, *o = out;
    while (inp && out) {
        char *e = strstr(p, SEP);
        if (!e) break;
        size_t len = (size_t)(e - p);
        char *oe = strchr(o, '\n');
        CHECK(oe != NULL, "%s: fewer lines than %s has strings", out_rel, inp_rel);
        if (!oe) break;
        int n_exp = 0, n_got = 0;
        int32_t *exp = parse_ids(o, (size_t)(oe - o), &n_exp);
        ellm_status st = ELLM_OK;
        int32_t *got = encode(t, p, len, add_bos, parse_special, &n_got, &st);
        int same = got && n_got == n_exp && memcmp(got, exp, (size_t)n_exp * sizeof(int32_t)) == 0;
        CHECK(same, "%s (%s) vector %d ('%.*s'): %d ids expected, got %d (status %d)", inp_rel, via,
              n_tests, (int)(len > 40 ? 40 : len), p, n_exp, got ? n_got : -1, (int)st);
        if (!same && got) {
            fprintf(stderr, "  expected:");
            for (int i = 0; i < n_exp; i++) fprintf(stderr, " %d", exp[i]);
            fprintf(stderr, "\n  got:     ");
            for (int i = 0; i < n_got; i++) fprintf(stderr, " %d", got[i]);
            fprintf(stderr, "\n");
        }
        n_match += same;
        free(exp);
        free(got);
        n_tests++;
        p = e + strlen(SEP);
        o = oe + 1;
    }
    free(inp);
    free(out);
    *n_total = n_tests;
    return n_match;
}

static const char *const vocabs[] = {
    "llama-spm",    "phi-3",     "llama-bpe", "qwen2",  "qwen35", "gpt-2",    "deepseek-coder",
    "deepseek-llm", "starcoder", "falcon",    "refact", "mpt",    "command-r"};

static void test_gguf_vectors(void) {
    for (size_t i = 0; i < sizeof(vocabs) / sizeof(vocabs[0]); i++) {
        char rel[256];
        snprintf(rel, sizeof(rel), "vocab/ggml-vocab-%s.gguf", vocabs[i]);
        double t0 = now_s();
        tokenizer *t = open_gguf(test_data_path(rel));
        double t1 = now_s();
        if (!t) continue;
        int n_total = 0;
        char inp[256], out[256];
        snprintf(inp, sizeof(inp), "vocab/ggml-vocab-%s.gguf.inp", vocabs[i]);
        snprintf(out, sizeof(out), "vocab/ggml-vocab-%s.gguf.out", vocabs[i]);
        int n_match = check_vectors(t, inp, out, "gguf", 0, 0, &n_total);
        CHECK(n_total > 40, "%s: only %d vectors", vocabs[i], n_total);
        printf("vocab %-15s gguf %3d/%3d vectors match (load %.0f ms)\n", vocabs[i], n_match,
               n_total, (t1 - t0) * 1e3);
        tokenizer_free(t);
    }
}

/* The tokenizer.json files: llama3 and qwen3 hold the tokenizers of the
 * llama-bpe and qwen2 vocabularies, so llama.cpp's vectors apply; the
 * "llama2" package holds Mistral 7B's SentencePiece-style BPE (a different
 * vocabulary), checked against transformers.js on the same strings
 * (vectors.out, made by tools/hf_vectors.mjs). special.inp has special-token
 * texts, encoded with parse_special, without and with BOS. */
static void test_hf_vectors(void) {
    static const struct {
        const char *dir, *inp, *out;
    } sets[] = {
        {"llama3", "vocab/ggml-vocab-llama-bpe.gguf.inp", "vocab/ggml-vocab-llama-bpe.gguf.out"},
        {"qwen3", "vocab/ggml-vocab-qwen2.gguf.inp", "vocab/ggml-vocab-qwen2.gguf.out"},
        {"llama2", "vocab/ggml-vocab-llama-spm.gguf.inp", "hf/llama2/vectors.out"},
    };
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
        char rel[256];
        snprintf(rel, sizeof(rel), "hf/%s/tokenizer.json", sets[i].dir);
        double t0 = now_s();
        tokenizer *t = open_hf(rel);
        double t1 = now_s();
        if (!t) continue;
        int n_total = 0, n_sp = 0, n_bos = 0;
        int n_match = check_vectors(t, sets[i].inp, sets[i].out, rel, 0, 0, &n_total);
        CHECK(n_total > 40, "%s: only %d vectors", rel, n_total);
        char out[256];
        snprintf(out, sizeof(out), "hf/%s/special.out", sets[i].dir);
        int m_sp = check_vectors(t, "hf/special.inp", out, rel, 0, 1, &n_sp);
        snprintf(out, sizeof(out), "hf/%s/special_bos.out", sets[i].dir);
        int m_bos = check_vectors(t, "hf/special.inp", out, rel, 1, 1, &n_bos);
        printf("tokenizer.json %-6s %3d/%3d vectors match, special %d/%d, with BOS %d/%d "
               "(load %.0f ms)\n",
               sets[i].dir, n_match, n_total, m_sp, n_sp, m_bos, n_bos, (t1 - t0) * 1e3);
        tokenizer_free(t);
    }
}

/* Whether s[0, n) is UTF-8 made of whole characters only. */
static int whole_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (k == 0 || i + k > n) return 0;
        for (size_t j = 1; j < k; j++) {
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) return 0;
        }
        i += k;
    }
    return 1;
}

/* Every vector string of `inp_rel` encodes and streams back to itself, each
 * push writing whole characters only. */
static void check_roundtrips(const tokenizer *t, const char *inp_rel, const char *via) {
    size_t inp_len = 0;
    char *inp = test_read_file(test_data_path(inp_rel), &inp_len);
    CHECK(inp != NULL, "reading %s", inp_rel);
    int n_tests = 0, n_ok = 0, all_whole = 1;
    size_t step = tokenizer_max_token_bytes(t) + 8;
    if (step < 64) step = 64;
    for (char *p = inp; inp;) {
        char *e = strstr(p, SEP);
        if (!e) break;
        size_t len = (size_t)(e - p);
        int n = 0;
        int32_t *ids = encode(t, p, len, 0, 0, &n, NULL);
        if (ids) {
            char *buf = malloc(step * ((size_t)n + 1) + 1);
            size_t w = 0;
            ellm_detok d = {0};
            for (int i = 0; i < n; i++) {
                int k = tokenizer_detok_push(t, &d, ids[i], buf + w, step);
                all_whole &= whole_utf8(buf + w, (size_t)k);
                w += (size_t)k;
            }
            w += (size_t)tokenizer_detok_flush(&d, buf + w, step);
            int ok = w == len && memcmp(buf, p, len) == 0;
            CHECK(ok, "%s (%s) vector %d: decode(encode(s)) = '%.*s'", inp_rel, via, n_tests,
                  (int)w, buf);
            n_ok += ok;
            free(buf);
        }
        free(ids);
        n_tests++;
        p = e + strlen(SEP);
    }
    CHECK(all_whole, "%s (%s): a push wrote part of a character", inp_rel, via);
    printf("round trip %-16s %-28s %d/%d\n", via, inp_rel, n_ok, n_tests);
    free(inp);
}

static void test_roundtrips(void) {
    static const char *const bpe[] = {"llama-bpe",      "qwen2",        "qwen35",    "gpt-2",
                                      "deepseek-coder", "deepseek-llm", "starcoder", "falcon",
                                      "refact",         "mpt",          "command-r"};
    for (size_t i = 0; i < sizeof(bpe) / sizeof(bpe[0]); i++) {
        char rel[256], inp[256];
        snprintf(rel, sizeof(rel), "vocab/ggml-vocab-%s.gguf", bpe[i]);
        snprintf(inp, sizeof(inp), "vocab/ggml-vocab-%s.gguf.inp", bpe[i]);
        tokenizer *t = open_gguf(test_data_path(rel));
        if (!t) continue;
        check_roundtrips(t, inp, bpe[i]);
        tokenizer_free(t);
    }
    static const struct {
        const char *dir, *inp;
    } hf[] = {{"llama3", "vocab/ggml-vocab-llama-bpe.gguf.inp"},
              {"qwen3", "vocab/ggml-vocab-qwen2.gguf.inp"},
              {"llama2", "vocab/ggml-vocab-llama-spm.gguf.inp"}};
    for (size_t i = 0; i < sizeof(hf) / sizeof(hf[0]); i++) {
        char rel[256];
        snprintf(rel, sizeof(rel), "hf/%s/tokenizer.json", hf[i].dir);
        tokenizer *t = open_hf(rel);
        if (!t) continue;
        check_roundtrips(t, hf[i].inp, rel);
        tokenizer_free(t);
    }
}

/* The token that stands for exactly byte b, or -1. */
static int32_t byte_token(const tokenizer *t, unsigned char b) {
    for (int32_t id = 0; id < tokenizer_n_vocab(t); id++) {
        size_t n;
        const char *s = tokenizer_token_bytes(t, id, &n);
        if (n == 1 && (unsigned char)s[0] == b) return id;
    }
    return -1;
}

/* Streaming: the bytes of one character spread over byte tokens come out
 * only once the character is whole; a flush turns a cut one into U+FFFD; a
 * stray continuation byte becomes U+FFFD at once. */
static void test_detok_bytes(void) {
    tokenizer *t = open_gguf(test_data_path("vocab/ggml-vocab-qwen2.gguf"));
    if (!t) return;
    const unsigned char emoji[4] = {0xF0, 0x9F, 0x98, 0x80}; /* U+1F600 */
    ellm_detok d = {0};
    char out[64];
    int wrote = 0, ok = 1;
    for (int i = 0; i < 4; i++) {
        int32_t id = byte_token(t, emoji[i]);
        ok &= id >= 0;
        int k = tokenizer_detok_push(t, &d, id, out, sizeof(out));
        if (i < 3)
            ok &= k == 0;
        else
            wrote = k;
    }
    CHECK(ok && wrote == 4 && memcmp(out, emoji, 4) == 0, "4 byte tokens -> one character");
    tokenizer_detok_push(t, &d, byte_token(t, 0xE6), out, sizeof(out));
    int k = tokenizer_detok_flush(&d, out, sizeof(out));
    CHECK(k == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0, "flush of a cut character -> U+FFFD");
    k = tokenizer_detok_push(t, &d, byte_token(t, 0x80), out, sizeof(out));
    CHECK(k == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0, "stray continuation byte -> U+FFFD");

    /* Control tokens stand for nothing; the byte-level space is a space. */
    size_t n;
    const char *s = tokenizer_token_bytes(t, byte_token(t, ' '), &n);
    CHECK(s && n == 1 && s[0] == ' ', "Ġ -> ' '");
    int32_t ids[8];
    int cnt = 0;
    ellm_error err = {0};
    CHECK(tokenizer_encode(t, "<|im_end|>", 10, 0, 1, ids, 8, &cnt, &err) == ELLM_OK && cnt == 1,
          "<|im_end|> parsed");
    tokenizer_token_bytes(t, ids[0], &n);
    CHECK(n == 0 && tokenizer_is_eog(t, ids[0]),
          "<|im_end|> is an end of generation with no bytes");
    CHECK(tokenizer_encode(t, "<|im_end|>", 10, 0, 0, ids, 8, &cnt, &err) == ELLM_OK && cnt > 1,
          "<|im_end|> as text when special text is not parsed (%d ids)", cnt);
    tokenizer_free(t);
}

/* BOS follows the file: llama-bpe asks for it, qwen2 does not. */
static void test_bos(void) {
    tokenizer *t = open_gguf(test_data_path("vocab/ggml-vocab-llama-bpe.gguf"));
    if (t) {
        int32_t ids[8];
        int n = 0;
        ellm_error err = {0};
        CHECK(tokenizer_add_bos(t) && tokenizer_bos(t) == 128000, "llama-bpe BOS %d",
              tokenizer_bos(t));
        CHECK(tokenizer_encode(t, "Hi", 2, 1, 0, ids, 8, &n, &err) == ELLM_OK && n == 2 &&
                  ids[0] == 128000,
              "llama-bpe: BOS prepended");
        CHECK(tokenizer_encode(t, "Hi", 2, 0, 0, ids, 8, &n, &err) == ELLM_OK && n == 1,
              "llama-bpe: no BOS when not asked");
        tokenizer_free(t);
    }
    t = open_gguf(test_data_path("vocab/ggml-vocab-qwen2.gguf"));
    if (t) {
        int32_t ids[8];
        int n = 0;
        ellm_error err = {0};
        CHECK(tokenizer_encode(t, "Hi", 2, 1, 0, ids, 8, &n, &err) == ELLM_OK && n == 1,
              "qwen2: no BOS (add_bos_token %d)", tokenizer_add_bos(t));
        tokenizer_free(t);
    }
}

/* Invalid UTF-8 is refused with its offset, for every kind of tokenizer. */
static void test_invalid_utf8(void) {
    static const char *const files[] = {"vocab/ggml-vocab-llama-bpe.gguf",
                                        "vocab/ggml-vocab-deepseek-llm.gguf",
                                        "hf/qwen3/tokenizer.json", "hf/llama2/tokenizer.json"};
    static const char *const bad[] = {"abc\xff", "\xc3", "a\xed\xa0\x80z", "\xf4\x90\x80\x80",
                                      "\xc0\xaf"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        ellm_tokenizer *tok = NULL;
        ellm_error err = {0};
        if (ellm_tokenizer_load(test_data_path(files[i]), &tok, &err) != ELLM_OK) {
            CHECK(0, "loading %s: %s", files[i], err.msg);
            continue;
        }
        for (size_t j = 0; j < sizeof(bad) / sizeof(bad[0]); j++) {
            int32_t ids[16];
            int n = 0;
            memset(&err, 0, sizeof(err));
            ellm_status st =
                ellm_tokenizer_encode(tok, bad[j], strlen(bad[j]), 1, 1, ids, 16, &n, &err);
            CHECK(st == ELLM_ERR_FORMAT && strstr(err.msg, "invalid UTF-8 at byte offset"),
                  "%s: invalid UTF-8 %zu -> %d (%s)", files[i], j, (int)st, err.msg);
        }
        ellm_tokenizer_free(tok);
    }
}

/* The public API loads GGUF vocabularies, tokenizer.json files and folders,
 * and borrows a model's tokenizer. */
static void test_public_api(void) {
    ellm_tokenizer *a = NULL, *b = NULL, *c = NULL;
    ellm_error err = {0};
    CHECK(ellm_tokenizer_load(test_data_path("vocab/ggml-vocab-qwen2.gguf"), &a, &err) == ELLM_OK,
          "load gguf: %s", err.msg);
    CHECK(ellm_tokenizer_load(test_data_path("hf/qwen3/tokenizer.json"), &b, &err) == ELLM_OK,
          "load json: %s", err.msg);
    CHECK(ellm_tokenizer_load(test_data_path("hf/qwen3"), &c, &err) == ELLM_OK, "load folder: %s",
          err.msg);
    if (a && b && c) {
        const char *text = "Hello, world! <|im_start|>assistant\n";
        int32_t x[64], y[64], z[64];
        int nx = 0, ny = 0, nz = 0;
        ellm_tokenizer_encode(a, text, strlen(text), 1, 1, x, 64, &nx, &err);
        ellm_tokenizer_encode(b, text, strlen(text), 1, 1, y, 64, &ny, &err);
        ellm_tokenizer_encode(c, text, strlen(text), 1, 1, z, 64, &nz, &err);
        CHECK(nx > 5 && nx == ny && ny == nz && !memcmp(x, y, (size_t)nx * 4) &&
                  !memcmp(y, z, (size_t)ny * 4),
              "qwen2 gguf and qwen3 tokenizer.json agree (%d, %d, %d ids)", nx, ny, nz);
        char out[512];
        size_t w = 0;
        ellm_detok d = {0};
        for (int i = 0; i < nx; i++)
            w += (size_t)ellm_tokenizer_detok_push(a, &d, x[i], out + w, 64);
        w += (size_t)ellm_detok_flush(&d, out + w, 64);
        CHECK(w == strlen("Hello, world! assistant\n") &&
                  !memcmp(out, "Hello, world! assistant\n", w),
              "API detok: '%.*s'", (int)w, out);
        const char *tmpl = ellm_tokenizer_chat_template(b);
        CHECK(tmpl && strstr(tmpl, "<|im_start|>"), "chat template from tokenizer_config.json");
        CHECK(ellm_tokenizer_n_vocab(b) == 151669 && ellm_tokenizer_eos(b) == 151645 &&
                  ellm_tokenizer_bos(b) == -1 && ellm_tokenizer_is_eog(b, 151645),
              "qwen3 n_vocab %d eos %d bos %d", ellm_tokenizer_n_vocab(b), ellm_tokenizer_eos(b),
              ellm_tokenizer_bos(b));
        size_t n;
        const char *txt = ellm_tokenizer_token_text(b, 151645, &n);
        CHECK(txt && n == 10 && !memcmp(txt, "<|im_end|>", 10), "token text");
        CHECK(ellm_tokenizer_max_token_bytes(a) >= 16, "max token bytes %zu",
              ellm_tokenizer_max_token_bytes(a));
    }
    ellm_tokenizer_free(a);
    ellm_tokenizer_free(b);
    ellm_tokenizer_free(c);

    ellm_tokenizer *t = NULL;
    CHECK(ellm_tokenizer_load("/nonexistent/tokenizer.json", &t, &err) == ELLM_ERR_IO && !t &&
              strstr(err.msg, "/nonexistent"),
          "missing file: %s", err.msg);

    ellm_model *m = NULL;
    if (ellm_model_load(test_data_path("models/qwen2-bias.gguf"), NULL, &m, &err) == ELLM_OK) {
        const ellm_tokenizer *mt = ellm_model_tokenizer(m);
        int32_t ids[16];
        int n = 0, n2 = 0;
        int32_t ids2[16];
        CHECK(mt && ellm_tokenizer_encode(mt, "hello", 5, 1, 0, ids, 16, &n, &err) == ELLM_OK &&
                  ellm_tokenize(m, "hello", 5, 1, 0, ids2, 16, &n2, &err) == ELLM_OK && n == n2 &&
                  !memcmp(ids, ids2, (size_t)n * 4),
              "model tokenizer");
        ellm_model_free(m);
    }
}

/* ---- malformed tokenizer.json ---- */

static char tmp_dir[256];

/* Writes `json` as tmp_dir/tokenizer.json (and `config` as
 * tokenizer_config.json, or removes it) and loads it. */
static ellm_status load_json(const char *json, size_t len, const char *config, tokenizer **t,
                             ellm_error *err) {
    char p[512];
    snprintf(p, sizeof(p), "%s/tokenizer_config.json", tmp_dir);
    if (config) {
        FILE *f = fopen(p, "wb");
        fputs(config, f);
        fclose(f);
    } else {
        unlink(p);
    }
    snprintf(p, sizeof(p), "%s/tokenizer.json", tmp_dir);
    FILE *f = fopen(p, "wb");
    fwrite(json, 1, len, f);
    fclose(f);
    *t = NULL;
    memset(err, 0, sizeof(*err));
    return tokenizer_init_hf_json(p, t, err);
}

/* A small byte-level tokenizer: "ab ab" is [ab, Ġab]. */
static const char *const TINY_JSON =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":5,\"content\":\"<|end|>\",\"special\":true},"
    "{\"id\":6,\"content\":\"<x>\",\"special\":false,\"rstrip\":true}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
    "\"pattern\":{\"Regex\":\"\\\\s?\\\\p{L}+|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false}"
    ","
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
    "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"ignore_merges\":false,"
    "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\\u0120\":3,\"\\u0120ab\":4},"
    "\"merges\":[\"a b\",[\"\\u0120\",\"ab\"]]}}";

static void test_malformed_json(void) {
    snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/ellm_tok_test_%d", (int)getpid());
    mkdir(tmp_dir, 0700);
    tokenizer *t = NULL;
    ellm_error err;
    ellm_status st = load_json(TINY_JSON, strlen(TINY_JSON), NULL, &t, &err);
    CHECK(st == ELLM_OK, "tiny tokenizer.json: %s", err.msg);
    if (t) {
        int32_t ids[16];
        int n = 0;
        st = tokenizer_encode(t, "ab ab<x>  ab<|end|>", 19, 0, 1, ids, 16, &n, &err);
        CHECK(st == ELLM_OK && n == 5 && ids[0] == 2 && ids[1] == 4 && ids[2] == 6 && ids[3] == 2 &&
                  ids[4] == 5,
              "tiny: [ab, Gab, <x> (eats the spaces), ab, <|end|>] (%d ids)", n);
        tokenizer_free(t);
    }

    /* Every truncation fails cleanly with a message. */
    size_t len = strlen(TINY_JSON);
    int clean = 1;
    for (size_t k = 0; k < len; k++) {
        st = load_json(TINY_JSON, k, NULL, &t, &err);
        clean &= st == ELLM_ERR_FORMAT && t == NULL && strstr(err.msg, "tokenizer.json") != NULL;
    }
    CHECK(clean, "every truncation of tokenizer.json -> FORMAT naming the file");

    static const struct {
        const char *what, *json, *config;
        ellm_status st;
        const char *msg;
    } cases[] = {
        {"not JSON", "hello", NULL, ELLM_ERR_FORMAT, "malformed JSON at line 1"},
        {"array", "[1,2]", NULL, ELLM_ERR_FORMAT, "top level"},
        {"no model", "{}", NULL, ELLM_ERR_FORMAT, "\"model\" is missing"},
        {"WordPiece", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", NULL,
         ELLM_ERR_UNSUPPORTED, "WordPiece"},
        {"no vocab", "{\"model\":{\"type\":\"BPE\",\"merges\":[]}}", NULL, ELLM_ERR_FORMAT,
         "model.vocab"},
        {"no merges", "{\"model\":{\"vocab\":{\"a\":0}}}", NULL, ELLM_ERR_FORMAT, "model.merges"},
        {"bad id", "{\"model\":{\"vocab\":{\"a\":-1},\"merges\":[]}}", NULL, ELLM_ERR_FORMAT,
         "model.vocab['a']"},
        {"fraction id", "{\"model\":{\"vocab\":{\"a\":0.5},\"merges\":[]}}", NULL, ELLM_ERR_FORMAT,
         "model.vocab['a']"},
        {"huge id", "{\"model\":{\"vocab\":{\"a\":1e30},\"merges\":[]}}", NULL, ELLM_ERR_FORMAT,
         "model.vocab['a']"},
        {"sparse ids", "{\"model\":{\"vocab\":{\"a\":16000000},\"merges\":[]}}", NULL,
         ELLM_ERR_FORMAT, "too sparse"},
        {"empty vocab", "{\"model\":{\"vocab\":{},\"merges\":[]}}", NULL, ELLM_ERR_FORMAT, "empty"},
        {"same id twice", "{\"model\":{\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}", NULL,
         ELLM_ERR_FORMAT, "both"},
        {"bad merge", "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", NULL,
         ELLM_ERR_FORMAT, "model.merges[0]"},
        {"bad merge type", "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}}", NULL,
         ELLM_ERR_FORMAT, "model.merges[0]"},
        {"bad added",
         "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"added_tokens\":[{\"id\":1}]}", NULL,
         ELLM_ERR_FORMAT, "added_tokens[0]"},
        {"added not array", "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"added_tokens\":3}",
         NULL, ELLM_ERR_FORMAT, "added_tokens"},
        {"pre-tokenizer",
         "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":"
         "\"BertPreTokenizer\"}}",
         NULL, ELLM_ERR_UNSUPPORTED, "BertPreTokenizer"},
        {"normalizer",
         "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"normalizer\":{\"type\":\"Precompiled\"}"
         "}",
         NULL, ELLM_ERR_UNSUPPORTED, "Precompiled"},
        {"bad regex",
         "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
         "\"pattern\":{\"Regex\":\"(a\"},\"behavior\":\"Isolated\"}}",
         NULL, ELLM_ERR_FORMAT, "regex '(a'"},
        {"bad behavior",
         "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
         "\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"}}",
         NULL, ELLM_ERR_FORMAT, "Sideways"},
        {"step after ByteLevel",
         "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Sequence\","
         "\"pretokenizers\":[{\"type\":\"ByteLevel\"},{\"type\":\"Digits\"}]}}",
         NULL, ELLM_ERR_UNSUPPORTED, "after ByteLevel"},
        {"no type", "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"normalizer\":{}}", NULL,
         ELLM_ERR_FORMAT, "no \"type\""},
        {"unk missing", "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[],\"unk_token\":\"<unk>\"}}",
         NULL, ELLM_ERR_FORMAT, "unk_token '<unk>'"},
        {"bad config", "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}",
         "{\"bos_token\":", ELLM_ERR_FORMAT, "tokenizer_config.json: malformed JSON"},
        {"config bos missing", "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}",
         "{\"bos_token\":\"<s>\",\"add_bos_token\":true}", ELLM_ERR_FORMAT, "bos_token '<s>'"},
        {"deep nesting",
         "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"normalizer\":{\"type\":\"Sequence\","
         "\"normalizers\":[{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Sequence\","
         "\"normalizers\":[{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Sequence\","
         "\"normalizers\":[{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Sequence\","
         "\"normalizers\":[{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Sequence\","
         "\"normalizers\":[]}]}]}]}]}]}]}]}]}}",
         NULL, ELLM_ERR_UNSUPPORTED, "nested"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        st = load_json(cases[i].json, strlen(cases[i].json), cases[i].config, &t, &err);
        CHECK(st == cases[i].st && t == NULL && strstr(err.msg, cases[i].msg),
              "%s: status %d, message '%s'", cases[i].what, (int)st, err.msg);
        tokenizer_free(t);
    }
    char p[512];
    snprintf(p, sizeof(p), "%s/tokenizer_config.json", tmp_dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/tokenizer.json", tmp_dir);
    unlink(p);
    rmdir(tmp_dir);
}

/* Long runs that make naive regexes quadratic stay fast. */
/* The chat template of a tokenizer_config.json, which the tokenizer and the
 * converter both take: a string, or from a list the one named "default",
 * else the first. */
static void test_config_chat_template(void) {
    static const char *const cases[][2] = {
        {"{\"chat_template\": \"S\"}", "S"},
        {"{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
         " {\"name\": \"default\", \"template\": \"D\"}]}",
         "D"},
        {"{\"chat_template\": [{\"name\": \"a\", \"template\": \"A\"}, {\"name\": \"b\", \"template\": \"B\"}]}",
         "A"},
        {"{\"chat_template\": [{\"name\": \"default\"}, {\"template\": 3}]}", NULL},
        {"{\"chat_template\": 7}", NULL},
        {"{}", NULL},
        {"[]", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *cfg = cJSON_Parse(cases[i][0]);
        const char *got = tokenizer_hf_chat_template(cfg);
        const char *want = cases[i][1];
        CHECK(cfg && (want ? got && !strcmp(got, want) : !got), "%s: got %s", cases[i][0], got ? got : "NULL");
        cJSON_Delete(cfg);
    }
    CHECK(tokenizer_hf_chat_template(NULL) == NULL, "no config: no template");
}

static void test_long_runs(void) {
    static const char *const names[] = {"deepseek-llm", "llama-bpe", "gpt-2", "deepseek-coder"};
    size_t n = 200000;
    char *text = malloc(n + 16);
    for (size_t i = 0; i < n; i++) text[i] = ' ';
    memcpy(text + n, "\xf0\x9f\x98\x80x", 5); /* an emoji (no letter class), then a letter */
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char rel[256];
        snprintf(rel, sizeof(rel), "vocab/ggml-vocab-%s.gguf", names[i]);
        tokenizer *t = open_gguf(test_data_path(rel));
        if (!t) continue;
        int cnt = 0;
        ellm_error err = {0};
        double t0 = now_s();
        ellm_status st = tokenizer_encode(t, text, n + 5, 0, 0, NULL, 0, &cnt, &err);
        double dt = now_s() - t0;
        CHECK((st == ELLM_OK || st == ELLM_ERR_ARG) && cnt > 0 && dt < 2.0,
              "%s: 200 KB of spaces in %.2f s (%d tokens, %s)", names[i], dt, cnt, err.msg);
        tokenizer_free(t);
    }
    free(text);
}

int main(void) {
    test_gguf_vectors();
    test_hf_vectors();
    test_roundtrips();
    test_detok_bytes();
    test_bos();
    test_invalid_utf8();
    test_public_api();
    test_malformed_json();
    test_config_chat_template();
    test_long_runs();
    return test_finish();
}
