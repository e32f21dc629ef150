/* Tokenizer tests: golden vectors produced by llama.cpp (tests/data/vocab),
 * the prompts of the test models, detokenization round trips and streaming,
 * special tokens, invalid input and malformed metadata, and a speed run. */
#include "harness.h"
#include "vocab_vectors.h"

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}


/* The evaluation model lives in models/ at the top of the tree. */
static const char *eval_model_path(void) {
    static char buf[1024];
    snprintf(buf, sizeof(buf), "%s/../../models/evalmodel.gguf", test_data_dir());
    FILE *f = fopen(buf, "rb");
    if (f) {
        fclose(f);
        return buf;
    }
    return "models/evalmodel.gguf";
}

/* Opens a GGUF and builds its tokenizer; NULL (with a failed CHECK) on error. */
static tokenizer *open_tokenizer(const char *path) {
    gguf_file *f = NULL;
    ellm_error err = {0};
    ellm_status st = gguf_open(path, &f, &err);
    CHECK(st == ELLM_OK, "gguf_open %s: %s", path, err.msg);
    if (st != ELLM_OK) return NULL;
    tokenizer *t = NULL;
    st = tokenizer_init_gguf(f, &t, &err);
    CHECK(st == ELLM_OK, "tokenizer_init_gguf %s: %s", path, err.msg);
    gguf_close(f); /* the tokenizer keeps copies */
    return st == ELLM_OK ? t : NULL;
}


/* Streams ids through the detokenizer and flushes; returns a malloc'ed,
 * NUL-terminated string and its length. */
static char *detok_all(const tokenizer *t, const int32_t *ids, int n, size_t *len) {
    size_t cap = 64 * (size_t)n + 64, w = 0;
    char *s = malloc(cap + 1);
    ellm_detok d = {0};
    for (int i = 0; i < n; i++) w += (size_t)tokenizer_detok_push(t, &d, ids[i], s + w, 64);
    w += (size_t)tokenizer_detok_flush(&d, s + w, 64);
    s[w] = 0;
    *len = w;
    return s;
}


/* ---- golden vectors: .inp strings separated by "\n__ggml_vocab_test__\n",
 * .out one line of ids per string (no BOS, special text not parsed) ---- */


static void test_vocab_vectors(const char *name) {
    char rel[256];
    snprintf(rel, sizeof(rel), "vocab/ggml-vocab-%s.gguf", name);
    tokenizer *t = open_tokenizer(test_data_path(rel));
    if (!t) return;
    snprintf(rel, sizeof(rel), "vocab/ggml-vocab-%s.gguf.inp", name);
    size_t inp_len = 0, out_len = 0;
    char *inp = test_read_file(test_data_path(rel), &inp_len);
    snprintf(rel, sizeof(rel), "vocab/ggml-vocab-%s.gguf.out", name);
    char *out = test_read_file(test_data_path(rel), &out_len);
    CHECK(inp && out, "reading %s vectors", name);
    if (!inp || !out) {
        free(inp);
        free(out);
        tokenizer_free(t);
        return;
    }

    int n_tests = 0, n_match = 0, n_roundtrip = 0;
    char *p = inp, *o = out;
    for (;;) {
        char *e = strstr(p, SEP);
        if (!e) break;
        size_t len = (size_t)(e - p);
        char *oe = strchr(o, '\n');
        CHECK(oe != NULL, "%s: .out has fewer lines than .inp has strings", name);
        if (!oe) break;
        int n_exp = 0, n_got = 0;
        int32_t *exp = parse_ids(o, (size_t)(oe - o), &n_exp);
        ellm_status st;
        int32_t *got = encode(t, p, len, 0, 0, &n_got, &st);
        int same = got && n_got == n_exp && memcmp(got, exp, (size_t)n_exp * sizeof(int32_t)) == 0;
        CHECK(same, "%s vector %d ('%.*s'): %d ids expected, got %d (status %d)", name, n_tests,
              (int)(len > 40 ? 40 : len), p, n_exp, got ? n_got : -1, (int)st);
        if (!same && got) {
            fprintf(stderr, "  expected:");
            for (int i = 0; i < n_exp; i++) fprintf(stderr, " %d", exp[i]);
            fprintf(stderr, "\n  got:     ");
            for (int i = 0; i < n_got; i++) fprintf(stderr, " %d", got[i]);
            fprintf(stderr, "\n");
        }
        n_match += same;

        /* Round trip: the detokenizer drops the space prefix again. */
        if (got) {
            size_t dl;
            char *dec = detok_all(t, got, n_got, &dl);
            int rt = dl == len && memcmp(dec, p, len) == 0;
            CHECK(rt, "%s vector %d: decode(encode(s)) = '%s' != s", name, n_tests, dec);
            n_roundtrip += rt;
            free(dec);
        }
        free(exp);
        free(got);
        n_tests++;
        p = e + strlen(SEP);
        o = oe + 1;
    }
    CHECK(n_tests > 40, "%s: only %d vectors parsed", name, n_tests);
    printf("vocab %-10s %d/%d vectors match, %d/%d round trips\n", name, n_match, n_tests,
           n_roundtrip, n_tests);
    free(inp);
    free(out);
    tokenizer_free(t);
}

/* ---- model prompts: the 2048-piece vocabulary, add_space_prefix = false ---- */

/* Decodes the first line of `tokens_rel` (BOS + prompt ids), re-encodes the
 * text with BOS and expects the same ids. */
static void test_prompt_roundtrip(const char *model_path, const char *tokens_rel) {
    tokenizer *t = open_tokenizer(model_path);
    if (!t) return;
    size_t n_file;
    char *file = test_read_file(test_data_path(tokens_rel), &n_file);
    CHECK(file != NULL, "reading %s", tokens_rel);
    if (!file) {
        tokenizer_free(t);
        return;
    }
    char *nl = strchr(file, '\n');
    int n_ids;
    int32_t *ids = parse_ids(file, nl ? (size_t)(nl - file) : n_file, &n_ids);
    CHECK(n_ids > 1 && ids[0] == tokenizer_bos(t), "%s: prompt starts with BOS", tokens_rel);
    CHECK(tokenizer_add_bos(t), "%s: model asks for BOS", model_path);

    size_t len;
    char *text = detok_all(t, ids, n_ids, &len);
    int n_got;
    ellm_status st;
    int32_t *got = encode(t, text, len, 1, 0, &n_got, &st);
    int same = got && n_got == n_ids && memcmp(got, ids, (size_t)n_ids * sizeof(int32_t)) == 0;
    CHECK(same, "%s: encode(decode(prompt)) differs (%d ids, got %d)", tokens_rel, n_ids,
          got ? n_got : -1);
    if (!same && got) {
        for (int i = 0; i < n_ids && i < n_got; i++) {
            if (ids[i] != got[i]) {
                fprintf(stderr, "  first difference at %d: %d vs %d\n", i, ids[i], got[i]);
                break;
            }
        }
    }
    printf("prompt %-28s %d ids, %s\n", tokens_rel, n_ids, same ? "re-encodes exactly" : "DIFFERS");
    free(got);
    free(text);
    free(ids);
    free(file);
    tokenizer_free(t);
}

static void test_prompt64_file(void) {
    size_t n1, n2;
    char *a = test_read_file(test_data_path("models/prompt64.txt"), &n1);
    char *b = test_read_file(test_data_path("models/llama-gqa.tokens.txt"), &n2);
    CHECK(a && b, "reading prompt64.txt / llama-gqa.tokens.txt");
    if (a && b) {
        int na, nb;
        char *nl = strchr(b, '\n');
        int32_t *x = parse_ids(a, n1, &na);
        int32_t *y = parse_ids(b, nl ? (size_t)(nl - b) : n2, &nb);
        CHECK(na == 64 && na == nb && memcmp(x, y, (size_t)na * sizeof(int32_t)) == 0,
              "prompt64.txt (%d ids) is the first line of llama-gqa.tokens.txt (%d ids)", na, nb);
        free(x);
        free(y);
    }
    free(a);
    free(b);
}

/* ---- detokenization ---- */

static int32_t piece_id(const tokenizer *t, const char *piece) {
    for (int32_t i = 0; i < tokenizer_n_vocab(t); i++) {
        size_t len;
        const char *s = tokenizer_piece(t, i, &len);
        if (len == strlen(piece) && memcmp(s, piece, len) == 0) return i;
    }
    return -1;
}

static void test_detok_streaming(const tokenizer *t) {
    /* "🦙" is not in the llama vocabulary: four byte-fallback tokens. */
    const char *llama = "\xf0\x9f\xa6\x99";
    int n;
    ellm_status st;
    int32_t *ids = encode(t, llama, 4, 0, 0, &n, &st);
    CHECK(ids && n == 5, "encode llama emoji: %d ids", ids ? n : -1);
    if (ids && n == 5) {
        CHECK(ids[1] == piece_id(t, "<0xF0>") && ids[4] == piece_id(t, "<0x99>"),
              "byte fallback ids %d..%d", ids[1], ids[4]);
        char out[64];
        ellm_detok d = {0};
        int w = tokenizer_detok_push(t, &d, ids[0], out, sizeof(out)); /* "▁", dropped */
        CHECK(w == 0, "leading space prefix dropped (%d bytes)", w);
        for (int i = 1; i < 4; i++) {
            w = tokenizer_detok_push(t, &d, ids[i], out, sizeof(out));
            CHECK(w == 0, "byte %d of 4 held back (%d bytes written)", i, w);
            CHECK(d.n_pending == i, "pending %d", d.n_pending);
        }
        w = tokenizer_detok_push(t, &d, ids[4], out, sizeof(out));
        CHECK(w == 4 && memcmp(out, llama, 4) == 0, "complete character emitted (%d bytes)", w);
        CHECK(tokenizer_detok_flush(&d, out, sizeof(out)) == 0, "nothing left to flush");

        /* A sequence cut short by another character: U+FFFD, then the rest. */
        ellm_detok d2 = {0};
        d2.n_emitted = 1;
        tokenizer_detok_push(t, &d2, ids[1], out, sizeof(out));
        tokenizer_detok_push(t, &d2, ids[2], out, sizeof(out));
        int32_t a = piece_id(t, "a");
        w = tokenizer_detok_push(t, &d2, a, out, sizeof(out));
        CHECK(w == 4 && memcmp(out,
                               "\xef\xbf\xbd"
                               "a",
                               4) == 0,
              "invalid sequence -> U+FFFD a (%d)", w);

        /* Flushing a held-back prefix gives U+FFFD. */
        ellm_detok d3 = {0};
        d3.n_emitted = 1;
        tokenizer_detok_push(t, &d3, ids[1], out, sizeof(out));
        w = tokenizer_detok_flush(&d3, out, sizeof(out));
        CHECK(w == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0 && d3.n_pending == 0,
              "flush -> U+FFFD");

        /* A lone continuation byte is invalid at once. */
        ellm_detok d4 = {0};
        d4.n_emitted = 1;
        w = tokenizer_detok_push(t, &d4, ids[2], out, sizeof(out));
        CHECK(w == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0, "stray continuation -> U+FFFD");
    }
    free(ids);

    /* Control tokens print nothing; a BOS first keeps the next leading space,
     * as llama.cpp's detokenizer does. */
    ids = encode(t, "Hello world", 11, 1, 0, &n, &st);
    CHECK(ids && n >= 3 && ids[0] == 1, "encode with BOS");
    if (ids) {
        size_t len;
        char *s = detok_all(t, ids, n, &len);
        CHECK(strcmp(s, " Hello world") == 0, "BOS + text detokenizes to '%s'", s);
        free(s);
        s = detok_all(t, ids + 1, n - 1, &len);
        CHECK(strcmp(s, "Hello world") == 0, "text alone detokenizes to '%s'", s);
        free(s);
    }
    free(ids);

    char out[64];
    ellm_detok d = {0};
    CHECK(tokenizer_detok_push(t, &d, -5, out, sizeof(out)) == 0, "out-of-range id prints nothing");
    CHECK(tokenizer_detok_push(t, &d, 1 << 30, out, sizeof(out)) == 0, "huge id prints nothing");
    CHECK(tokenizer_piece(t, -1, NULL) == NULL && tokenizer_piece(t, 32000, NULL) == NULL,
          "tokenizer_piece out of range");
    size_t pl;
    const char *p = tokenizer_piece(t, 13, &pl);
    CHECK(p && pl == 6 && memcmp(p, "<0x0A>", 6) == 0, "piece 13 is <0x0A>");
}

/* ---- special tokens, invalid input, API edges ---- */

static void test_specials_llama(const tokenizer *t) {
    const char *s = "<s>hello</s>";
    int n;
    ellm_status st;
    int32_t *ids = encode(t, s, strlen(s), 0, 1, &n, &st);
    int32_t hello = piece_id(t, "\xe2\x96\x81hello");
    CHECK(ids && n == 3 && ids[0] == 1 && ids[1] == hello && ids[2] == 2,
          "parse_special on: <s> ▁hello </s> (n=%d)", ids ? n : -1);
    free(ids);

    ids = encode(t, s, strlen(s), 0, 0, &n, &st);
    int has_special = 0;
    for (int i = 0; ids && i < n; i++) has_special |= ids[i] == 1 || ids[i] == 2;
    CHECK(ids && n > 3 && !has_special, "parse_special off: special text is plain text");
    if (ids) {
        size_t len;
        char *dec = detok_all(t, ids, n, &len);
        CHECK(strcmp(dec, s) == 0, "plain special text round-trips ('%s')", dec);
        free(dec);
    }
    free(ids);

    /* Space prefix after a special token, BOS added only when asked. */
    ids = encode(t, "<s>hello", 8, 1, 1, &n, &st);
    CHECK(ids && n == 3 && ids[0] == 1 && ids[1] == 1 && ids[2] == hello, "BOS + <s> + ▁hello");
    free(ids);

    CHECK(tokenizer_is_eog(t, 2) && !tokenizer_is_eog(t, 1) && !tokenizer_is_eog(t, hello) &&
              !tokenizer_is_eog(t, -1) && !tokenizer_is_eog(t, 99999),
          "EOG: only </s>");
    CHECK(tokenizer_bos(t) == 1 && tokenizer_eos(t) == 2 && tokenizer_n_vocab(t) == 32000,
          "bos/eos/n_vocab");

    /* Empty text: nothing, or just BOS. */
    int32_t one[4];
    ellm_error err = {0};
    st = tokenizer_encode(t, "", 0, 0, 0, one, 4, &n, &err);
    CHECK(st == ELLM_OK && n == 0, "empty text -> no ids");
    st = tokenizer_encode(t, NULL, 0, 1, 0, one, 4, &n, &err);
    CHECK(st == ELLM_OK && n == 1 && one[0] == 1, "empty text with BOS -> [BOS]");

    /* Too small a buffer: ELLM_ERR_ARG with the needed count. */
    st = tokenizer_encode(t, "Hello world again", 17, 1, 0, one, 2, &n, &err);
    CHECK(st == ELLM_ERR_ARG && n == 4, "cap overflow reports the needed count (%d)", n);

    /* Invalid UTF-8 is refused with the byte offset. */
    struct {
        const char *s;
        size_t len;
        size_t off;
    } bad[] = {
        {"abc\xff", 4, 3},             /* invalid byte */
        {"ab\xc0\x80", 4, 2},          /* overlong NUL */
        {"\xed\xa0\x80", 3, 0},        /* surrogate */
        {"x\xe2\x96", 3, 1},           /* truncated */
        {"ok \xf4\x90\x80\x80", 7, 3}, /* above U+10FFFF */
        {"\x80", 1, 0},                /* stray continuation */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char want[64];
        snprintf(want, sizeof(want), "offset %zu", bad[i].off);
        memset(&err, 0, sizeof(err));
        st = tokenizer_encode(t, bad[i].s, bad[i].len, 0, 0, one, 4, &n, &err);
        CHECK(st == ELLM_ERR_FORMAT && strstr(err.msg, want), "invalid UTF-8 case %zu: %d '%s'", i,
              (int)st, err.msg);
    }
    /* NUL bytes are valid text. */
    int32_t many[16];
    st = tokenizer_encode(t, "a\0b", 3, 0, 0, many, 16, &n, &err);
    CHECK(st == ELLM_OK && n >= 3, "embedded NUL encodes (%d)", n);
}

static void test_specials_phi3(void) {
    tokenizer *t = open_tokenizer(test_data_path("vocab/ggml-vocab-phi-3.gguf"));
    if (!t) return;
    /* Phi-3 special tokens eat the whitespace after them (llama.cpp's rule for
     * this model family), and each fragment after one gets the space prefix. */
    const char *s = "<|user|>\nHi<|end|>\n<|assistant|>";
    int n;
    ellm_status st;
    int32_t *ids = encode(t, s, strlen(s), 1, 1, &n, &st);
    int32_t hi = piece_id(t, "\xe2\x96\x81Hi");
    CHECK(ids && n == 5 && ids[0] == 1 && ids[1] == 32010 && ids[2] == hi && ids[3] == 32007 &&
              ids[4] == 32001,
          "phi-3 chat turn: [<s> <|user|> ▁Hi <|end|> <|assistant|>] (n=%d)", ids ? n : -1);
    if (ids && n != 5) {
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    ids = encode(t, s, strlen(s), 0, 0, &n, &st);
    int any = 0;
    for (int i = 0; ids && i < n; i++) any |= ids[i] >= 32000;
    CHECK(ids && !any, "phi-3 without parse_special: no added tokens");
    free(ids);
    CHECK(tokenizer_eos(t) == 32000 && tokenizer_is_eog(t, 32000) && tokenizer_is_eog(t, 32007) &&
              !tokenizer_is_eog(t, 32010) && !tokenizer_is_eog(t, 1),
          "phi-3 EOG: <|endoftext|> and <|end|>");
    tokenizer_free(t);
}

/* ---- malformed metadata: a GGUF built in memory ---- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv;
} gbuf;

static void gb_put(gbuf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void gb_u32(gbuf *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(gbuf *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_str(gbuf *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static void gb_key(gbuf *b, const char *key, uint32_t type) {
    gb_str(b, key);
    gb_u32(b, type);
    b->n_kv++;
}
static void gb_kv_str(gbuf *b, const char *key, const char *v) {
    gb_key(b, key, GGUF_TYPE_STRING);
    gb_str(b, v);
}
static void gb_kv_strs(gbuf *b, const char *key, const char *const *v, int n) {
    gb_key(b, key, GGUF_TYPE_ARRAY);
    gb_u32(b, GGUF_TYPE_STRING);
    gb_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) gb_str(b, v[i]);
}
static void gb_kv_arr(gbuf *b, const char *key, uint32_t et, const void *v, int n) {
    gb_key(b, key, GGUF_TYPE_ARRAY);
    gb_u32(b, et);
    gb_u64(b, (uint64_t)n);
    gb_put(b, v, 4 * (size_t)n);
}

/* Finishes the file: header in front, padding behind; returns the buffer. */
static uint8_t *gb_finish(gbuf *b, size_t *size) {
    gbuf h = {0};
    gb_put(&h, "GGUF", 4);
    gb_u32(&h, 3);
    gb_u64(&h, 0);
    gb_u64(&h, b->n_kv);
    gb_put(&h, b->p, b->n);
    while (h.n % 32) gb_put(&h, "", 1);
    free(b->p);
    *size = h.n;
    return h.p;
}

/* Builds a tokenizer from an in-memory GGUF; returns the status. */
static ellm_status init_from(gbuf *b, tokenizer **out, ellm_error *err) {
    size_t size;
    uint8_t *mem = gb_finish(b, &size);
    gguf_file *f = NULL;
    *out = NULL;
    ellm_status st = gguf_open_memory(mem, size, &f, err);
    if (st == ELLM_OK) {
        st = tokenizer_init_gguf(f, out, err);
        gguf_close(f);
    }
    free(mem);
    return st;
}

static const char *const tiny_tokens[] = {"<unk>",
                                          "<s>",
                                          "</s>",
                                          "a",
                                          "b",
                                          "ab",
                                          "\xe2\x96\x81",
                                          "\xe2\x96\x81"
                                          "ab"};
static const float tiny_scores[] = {0, 0, 0, -1, -1, -2, -1, -3};
static const int32_t tiny_types[] = {2, 3, 3, 1, 1, 1, 1, 1};

static void test_metadata(void) {
    ellm_error err;
    tokenizer *t;
    ellm_status st;

    /* A valid tiny vocabulary without byte tokens: unknown characters -> <unk>. */
    gbuf b = {0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 8);
    gb_kv_arr(&b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, tiny_scores, 8);
    gb_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, tiny_types, 8);
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_OK, "tiny vocabulary loads: %s", err.msg);
    if (t) {
        int32_t ids[8];
        int n;
        st = tokenizer_encode(t, "abzb", 4, 1, 0, ids, 8, &n, &err);
        /* "▁abzb": ▁ab (merged via ab, then ▁ab), z -> <unk>, b */
        CHECK(st == ELLM_OK && n == 4 && ids[0] == 1 && ids[1] == 7 && ids[2] == 0 && ids[3] == 4,
              "tiny encode (n=%d: %d %d %d %d)", n, ids[0], ids[1], ids[2], ids[3]);
        CHECK(tokenizer_is_eog(t, 2), "default EOS is EOG");
        tokenizer_free(t);
    }

    /* User-defined tokens are split out even without parse_special (as in
     * llama.cpp and Hugging Face), control tokens only with it. */
    static const char *const ud_tokens[] = {"<unk>", "<s>",          "</s>", "a",
                                            "b",     "\xe2\x96\x81", "<x>"};
    static const float ud_scores[] = {0, 0, 0, -1, -1, -1, 0};
    static const int32_t ud_types[] = {2, 3, 3, 1, 1, 1, 4};
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", ud_tokens, 7);
    gb_kv_arr(&b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, ud_scores, 7);
    gb_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, ud_types, 7);
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_OK, "user-defined vocabulary loads: %s", err.msg);
    if (t) {
        int32_t ids[16];
        int n;
        st = tokenizer_encode(t, "a<x>b", 5, 0, 0, ids, 16, &n, &err);
        CHECK(st == ELLM_OK && n == 5 && ids[0] == 5 && ids[1] == 3 && ids[2] == 6 && ids[3] == 5 &&
                  ids[4] == 4,
              "user-defined split without parse_special: ▁ a <x> ▁ b (n=%d)", n);
        st = tokenizer_encode(t, "<s>a", 4, 0, 0, ids, 16, &n, &err);
        CHECK(st == ELLM_OK && n == 5 && ids[0] == 5 && ids[1] == 0 && ids[2] == 0 && ids[3] == 0 &&
                  ids[4] == 3,
              "control text without parse_special is text: ▁ then <unk> for each of '<' 's' '>', "
              "then a (n=%d)",
              n);
        st = tokenizer_encode(t, "<s>a", 4, 0, 1, ids, 16, &n, &err);
        CHECK(st == ELLM_OK && n == 3 && ids[0] == 1 && ids[1] == 5 && ids[2] == 3,
              "control text with parse_special: <s> ▁ a (n=%d)", n);
        char out[64];
        ellm_detok d = {0};
        int w = tokenizer_detok_push(t, &d, 6, out, sizeof(out));
        CHECK(w == 3 && memcmp(out, "<x>", 3) == 0, "user-defined token detokenizes to its text");
        w = tokenizer_detok_push(t, &d, 0, out, sizeof(out));
        CHECK(w == 0, "unknown token detokenizes to nothing (llama.cpp, special=false)");
        tokenizer_free(t);
    }

    /* Scores shorter than the token list. */
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 8);
    gb_kv_arr(&b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, tiny_scores, 3);
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_ERR_FORMAT && t == NULL && strstr(err.msg, "scores"),
          "short scores -> FORMAT (%d: %s)", (int)st, err.msg);

    /* Token types of the wrong element type. */
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 8);
    gb_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_TYPE_FLOAT32, tiny_scores, 8);
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_ERR_FORMAT && t == NULL, "float token types -> FORMAT (%d: %s)", (int)st,
          err.msg);

    /* Tokens not an array of strings. */
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_arr(&b, "tokenizer.ggml.tokens", GGUF_TYPE_INT32, tiny_types, 8);
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_ERR_FORMAT && t == NULL, "numeric tokens -> FORMAT (%d: %s)", (int)st,
          err.msg);

    /* Missing token list; missing model. */
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_ERR_FORMAT && t == NULL && strstr(err.msg, "tokens"),
          "no tokens -> FORMAT (%s)", err.msg);
    b = (gbuf){0};
    gb_kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 8);
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_ERR_FORMAT && t == NULL, "no model -> FORMAT (%s)", err.msg);

    /* Duplicate token text. */
    static const char *const dup[] = {"<unk>", "<s>", "</s>", "a", "a"};
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", dup, 5);
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_ERR_FORMAT && t == NULL && strstr(err.msg, "duplicate"),
          "duplicate token -> FORMAT (%s)", err.msg);

    /* Byte-level BPE needs its merges; unknown models are unsupported, with
     * a clear message. */
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 8);
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_ERR_FORMAT && t == NULL && strstr(err.msg, "tokenizer.ggml.merges"),
          "gpt2 without merges -> FORMAT (%s)", err.msg);
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "t5");
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_ERR_UNSUPPORTED && t == NULL && strstr(err.msg, "t5"),
          "t5 -> UNSUPPORTED (%s)", err.msg);

    /* Out-of-range special ids fall back to defaults; wrong-typed ones fail. */
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 8);
    gb_key(&b, "tokenizer.ggml.eos_token_id", GGUF_TYPE_UINT32);
    gb_u32(&b, 1000000);
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_OK && t && tokenizer_eos(t) == 2, "out-of-range eos keeps the default");
    tokenizer_free(t);
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 8);
    gb_kv_str(&b, "tokenizer.ggml.bos_token_id", "one");
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    CHECK(st == ELLM_ERR_FORMAT && t == NULL, "string bos id -> FORMAT (%s)", err.msg);

    /* An empty token text is replaced, not a crash. */
    static const char *const empty[] = {"<unk>", "<s>", "</s>", "", "a"};
    b = (gbuf){0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", empty, 5);
    memset(&err, 0, sizeof(err));
    st = init_from(&b, &t, &err);
    size_t pl = 0;
    const char *p = t ? tokenizer_piece(t, 3, &pl) : NULL;
    CHECK(st == ELLM_OK && p && pl == 9 && memcmp(p, "[EMPTY_3]", 9) == 0, "empty token renamed");
    tokenizer_free(t);
}

/* ---- differential test against a naive reference ----
 * The reference is the definition of SentencePiece BPE, written plainly:
 * repeatedly merge the adjacent pair whose concatenation is the
 * highest-scoring token (leftmost on ties), rescanning every time; then byte
 * fallback. O(n^2), independent of the encoder's queue and of its cuts. */

typedef struct {
    char **text;
    size_t *len;
    float *score;
    int32_t *order; /* ids sorted by text, for bsearch */
    int n;
    int space_prefix;
} ref_vocab;

static const ref_vocab *ref_cmp_ctx;
static int ref_cmp_text(const char *a, size_t la, const char *b, size_t lb) {
    size_t m = la < lb ? la : lb;
    int c = memcmp(a, b, m);
    return c ? c : (la < lb ? -1 : la > lb);
}
static int ref_cmp_ids(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return ref_cmp_text(ref_cmp_ctx->text[a], ref_cmp_ctx->len[a], ref_cmp_ctx->text[b],
                        ref_cmp_ctx->len[b]);
}

static int32_t ref_find(const ref_vocab *v, const char *s, size_t n) {
    int lo = 0, hi = v->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int32_t id = v->order[mid];
        int c = ref_cmp_text(v->text[id], v->len[id], s, n);
        if (c == 0) return id;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static int ref_load(const char *path, ref_vocab *v) {
    memset(v, 0, sizeof(*v));
    gguf_file *f;
    ellm_error err;
    if (gguf_open(path, &f, &err) != ELLM_OK) return 0;
    int64_t k = gguf_find_key(f, "tokenizer.ggml.tokens");
    gguf_value_type et;
    uint64_t n;
    const void *data;
    gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, &data, &err);
    v->n = (int)n;
    v->text = malloc(n * sizeof(char *));
    v->len = malloc(n * sizeof(size_t));
    v->score = malloc(n * sizeof(float));
    v->order = malloc(n * sizeof(int32_t));
    for (uint64_t i = 0; i < n; i++) {
        const char *str;
        size_t len;
        gguf_get_arr_str(f, k, i, &str, &len);
        v->text[i] = malloc(len + 1);
        memcpy(v->text[i], str, len);
        v->len[i] = len;
        v->order[i] = (int32_t)i;
    }
    gguf_get_arr(f, "tokenizer.ggml.scores", &et, &n, &data, &err);
    memcpy(v->score, data, (size_t)v->n * sizeof(float));
    v->space_prefix = 1;
    if (gguf_find_key(f, "tokenizer.ggml.add_space_prefix") >= 0) {
        gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &v->space_prefix, &err);
    }
    gguf_close(f);
    ref_cmp_ctx = v;
    qsort(v->order, (size_t)v->n, sizeof(int32_t), ref_cmp_ids);
    return 1;
}

static void ref_free(ref_vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->text[i]);
    free(v->text);
    free(v->len);
    free(v->score);
    free(v->order);
}

/* Reference encoding of plain text (no BOS, no special tokens). */
static int32_t *ref_encode(const ref_vocab *v, const char *text, size_t len, int *n_out) {
    char *buf = malloc(3 * len + 4);
    size_t n = 0;
    if (v->space_prefix && len > 0) {
        memcpy(buf, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            buf[n++] = text[i];
        }
    }
    size_t *off = malloc((n + 1) * sizeof(size_t)), *sl = malloc((n + 1) * sizeof(size_t));
    int ns = 0;
    for (size_t i = 0; i < n;) {
        uint8_t b = (uint8_t)buf[i];
        size_t cl = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        off[ns] = i;
        sl[ns++] = cl;
        i += cl;
    }
    for (;;) {
        int best = -1;
        float best_score = 0;
        for (int i = 0; i + 1 < ns; i++) {
            int32_t id = ref_find(v, buf + off[i], sl[i] + sl[i + 1]);
            if (id >= 0 && (best < 0 || v->score[id] > best_score)) {
                best = i;
                best_score = v->score[id];
            }
        }
        if (best < 0) break;
        sl[best] += sl[best + 1];
        memmove(off + best + 1, off + best + 2, (size_t)(ns - best - 2) * sizeof(size_t));
        memmove(sl + best + 1, sl + best + 2, (size_t)(ns - best - 2) * sizeof(size_t));
        ns--;
    }
    int32_t *ids = malloc((n + 1) * sizeof(int32_t));
    int k = 0;
    for (int i = 0; i < ns; i++) {
        int32_t id = ref_find(v, buf + off[i], sl[i]);
        if (id >= 0) {
            ids[k++] = id;
            continue;
        }
        for (size_t j = 0; j < sl[i]; j++) {
            char hex[8];
            snprintf(hex, sizeof(hex), "<0x%02X>", (unsigned)(uint8_t)buf[off[i] + j]);
            ids[k++] = ref_find(v, hex, 6);
        }
    }
    free(buf);
    free(off);
    free(sl);
    *n_out = k;
    return ids;
}

static void check_against_ref(const tokenizer *t, const ref_vocab *v, const char *what,
                              const char *text, size_t len, int *n_ok, int *n_bad) {
    int n_ref, n_got;
    ellm_status st;
    int32_t *ref = ref_encode(v, text, len, &n_ref);
    int32_t *got = encode(t, text, len, 0, 0, &n_got, &st);
    int same = got && n_got == n_ref && memcmp(got, ref, (size_t)n_ref * sizeof(int32_t)) == 0;
    if (!same && *n_bad < 3) {
        fprintf(stderr, "reference mismatch (%s) on '%.*s'\n", what, (int)(len > 80 ? 80 : len),
                text);
    }
    *n_ok += same;
    *n_bad += !same;
    free(ref);
    free(got);
}

/* Appends one UTF-8 character of code point cp. */
static size_t put_utf8(char *dst, uint32_t cp) {
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | (cp >> 6));
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xE0 | (cp >> 12));
        dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        dst[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (char)(0xF0 | (cp >> 18));
    dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static void test_reference(const char *model_path, const char *name) {
    tokenizer *t = open_tokenizer(model_path);
    ref_vocab v;
    int loaded = ref_load(model_path, &v);
    CHECK(loaded, "reference vocabulary %s", name);
    if (!t || !loaded) {
        tokenizer_free(t);
        if (loaded) ref_free(&v);
        return;
    }
    int ok = 0, bad = 0;

    /* Chunks of real text (Python source), cut at arbitrary characters. */
    size_t n;
    char *sample = test_read_file(test_data_path("heldout-sample.txt"), &n);
    if (sample) {
        size_t pos = 0;
        for (int i = 0; i < 12 && pos < n; i++) {
            size_t len = 1500 + (size_t)i * 97;
            if (pos + len > n) len = n - pos;
            while (len > 0 && ((uint8_t)sample[pos + len] & 0xC0) == 0x80) len--;
            check_against_ref(t, &v, "sample", sample + pos, len, &ok, &bad);
            pos += len + 7919;
            while (pos < n && ((uint8_t)sample[pos] & 0xC0) == 0x80) pos++;
        }
        free(sample);
    }

    /* Random strings over an alphabet of ASCII, spaces, accents, CJK, emoji. */
    static const uint32_t alphabet[] = {'a',    'e',     't',     'h',    'n',   's',    'o',
                                        ' ',    ' ',     ' ',     '\n',   '.',   '(',    '_',
                                        '0',    '1',     0xE9,    0xC4,   0x431, 0x4E2D, 0x6587,
                                        0x2581, 0x1F999, 0x1F600, 0xD55C, '\t',  'I',    'T'};
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    char buf[1024];
    for (int i = 0; i < 300; i++) {
        size_t len = 0;
        int nc = 1 + (int)(i % 150);
        for (int c = 0; c < nc; c++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            len += put_utf8(buf + len,
                            alphabet[(rng >> 33) % (sizeof(alphabet) / sizeof(alphabet[0]))]);
        }
        check_against_ref(t, &v, "random", buf, len, &ok, &bad);
    }
    CHECK(bad == 0, "%s: %d of %d texts differ from the naive reference", name, bad, ok + bad);
    printf("reference %-10s %d/%d texts identical to the naive merge loop\n", name, ok, ok + bad);
    ref_free(&v);
    tokenizer_free(t);
}

/* ---- byte-by-byte detokenization of random bytes ---- */

/* 1 if s[0..n) is valid UTF-8. */
static int valid_utf8(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        uint8_t b = u[i];
        size_t need = b < 0x80                   ? 1
                      : (b >= 0xC2 && b <= 0xDF) ? 2
                      : (b >= 0xE0 && b <= 0xEF) ? 3
                      : (b >= 0xF0 && b <= 0xF4) ? 4
                                                 : 0;
        if (need == 0 || n - i < need) return 0;
        if (need > 1) {
            uint8_t lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80;
            uint8_t hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
            if (u[i + 1] < lo || u[i + 1] > hi) return 0;
            for (size_t k = 2; k < need; k++) {
                if ((u[i + k] & 0xC0) != 0x80) return 0;
            }
        }
        i += need;
    }
    return 1;
}

static void test_detok_random_bytes(const tokenizer *t) {
    int32_t byte_id[256];
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        byte_id[b] = piece_id(t, name);
    }
    uint64_t rng = 12345;
    int all_valid = 1, valid_kept = 1;
    for (int iter = 0; iter < 2000; iter++) {
        uint8_t in[24];
        size_t n = 1 + iter % 24;
        int make_valid = iter % 2;
        if (make_valid) {
            /* Random code points, encoded: the output must be the input. */
            size_t k = 0;
            while (k < n) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                uint32_t cp = (uint32_t)(rng >> 40) % 0x110000;
                if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
                char tmp[4];
                size_t l = put_utf8(tmp, cp);
                if (k + l > sizeof(in)) break;
                memcpy(in + k, tmp, l);
                k += l;
            }
            n = k;
        } else {
            for (size_t i = 0; i < n; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                uint8_t b = (uint8_t)(rng >> 56);
                /* Bias towards lead and continuation bytes. */
                in[i] = (rng >> 20) % 3 ? (uint8_t)(0x80 | (b & 0x7F)) : b;
            }
        }
        char out[24 * 3 + 64];
        size_t w = 0;
        ellm_detok d = {0};
        d.n_emitted = 1;
        for (size_t i = 0; i < n; i++) {
            char chunk[64];
            int m = tokenizer_detok_push(t, &d, byte_id[in[i]], chunk, sizeof(chunk));
            all_valid &= valid_utf8(chunk, (size_t)m);
            memcpy(out + w, chunk, (size_t)m);
            w += (size_t)m;
        }
        char chunk[64];
        int m = tokenizer_detok_flush(&d, chunk, sizeof(chunk));
        all_valid &= valid_utf8(chunk, (size_t)m);
        memcpy(out + w, chunk, (size_t)m);
        w += (size_t)m;
        if (make_valid) valid_kept &= w == n && memcmp(out, in, n) == 0;
    }
    CHECK(all_valid, "every detok output chunk is valid UTF-8");
    CHECK(valid_kept, "valid UTF-8 fed byte by byte comes out unchanged");
}

/* ---- special-token splitting against a literal port of llama.cpp's loop ----
 * For each special token in priority order, for each text fragment, split at
 * each leftmost occurrence (stripping whitespace where the token says so). */

typedef struct {
    int is_token;
    int32_t id;
    size_t off, len;
} frag;

typedef struct {
    int32_t id;
    const char *text;
    size_t len;
    int rstrip;
} ref_special;

static int cmp_ref_special(const void *a, const void *b) {
    const ref_special *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static frag *ref_partition(const char *text, size_t len, const ref_special *sp, int n_sp,
                           int *n_frag) {
    int cap = (int)len * 2 + 4, n = 0;
    frag *f = malloc((size_t)cap * sizeof(frag));
    if (len > 0) f[n++] = (frag){0, -1, 0, len};
    for (int k = 0; k < n_sp; k++) {
        frag *g = malloc((size_t)cap * sizeof(frag));
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (f[i].is_token) {
                g[m++] = f[i];
                continue;
            }
            size_t off = f[i].off, flen = f[i].len;
            for (;;) {
                const char *hit = memmem(text + off, flen, sp[k].text, sp[k].len);
                if (!hit) {
                    if (flen > 0) g[m++] = (frag){0, -1, off, flen};
                    break;
                }
                size_t q = (size_t)(hit - text);
                if (q > off) g[m++] = (frag){0, -1, off, q - off};
                g[m++] = (frag){1, sp[k].id, q, sp[k].len};
                size_t r = q + sp[k].len, rlen = off + flen - r;
                if (sp[k].rstrip) {
                    while (rlen > 0 && is_ws(text[r])) {
                        r++;
                        rlen--;
                    }
                }
                off = r;
                flen = rlen;
            }
        }
        free(f);
        f = g;
        n = m;
    }
    *n_frag = n;
    return f;
}

static void test_partition_reference(void) {
    tokenizer *t = open_tokenizer(test_data_path("vocab/ggml-vocab-phi-3.gguf"));
    if (!t) return;
    /* Phi-3's special tokens: GGUF types unknown/control/user-defined; all
     * strip whitespace on their right except <unk>, <s> and <|endoftext|>. */
    gguf_file *f;
    ellm_error err;
    gguf_open(test_data_path("vocab/ggml-vocab-phi-3.gguf"), &f, &err);
    gguf_value_type et;
    uint64_t nt;
    const void *types;
    gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &nt, &types, &err);
    ref_special *sp = malloc(nt * sizeof(ref_special));
    int n_sp = 0;
    for (uint64_t i = 0; i < nt; i++) {
        int32_t ty;
        memcpy(&ty, (const char *)types + 4 * i, 4);
        if (ty != 2 && ty != 3 && ty != 4) continue;
        size_t len;
        const char *txt = tokenizer_piece(t, (int32_t)i, &len);
        int keep = (len == 5 && !memcmp(txt, "<unk>", 5)) || (len == 3 && !memcmp(txt, "<s>", 3)) ||
                   (len == 13 && !memcmp(txt, "<|endoftext|>", 13));
        sp[n_sp++] = (ref_special){(int32_t)i, txt, len, !keep};
    }
    gguf_close(f);
    qsort(sp, (size_t)n_sp, sizeof(ref_special), cmp_ref_special);

    static const char *const parts[] = {"<|user|>",   "<|end|>",
                                        "<s>",        "</s>",
                                        "<unk>",      "<|endoftext|>",
                                        "[PAD32011]", "<|placeholder1|>",
                                        "<|us",       "er|>",
                                        "<|",         "|>",
                                        "<",          ">",
                                        " ",          "\n",
                                        "\t",         "  \n ",
                                        "hi",         "a",
                                        "\xc3\xa9",   "end",
                                        "|",          "s>"};
    const int n_parts = (int)(sizeof(parts) / sizeof(parts[0]));
    uint64_t rng = 777;
    int same_all = 1;
    for (int iter = 0; iter < 400; iter++) {
        char text[256];
        size_t len = 0;
        int k = 1 + iter % 12;
        for (int i = 0; i < k; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const char *p = parts[(rng >> 33) % (uint64_t)n_parts];
            memcpy(text + len, p, strlen(p));
            len += strlen(p);
        }
        int n_frag;
        frag *fr = ref_partition(text, len, sp, n_sp, &n_frag);
        int32_t want[512];
        int n_want = 0;
        for (int i = 0; i < n_frag; i++) {
            if (fr[i].is_token) {
                want[n_want++] = fr[i].id;
                continue;
            }
            int n;
            ellm_status st;
            /* A raw fragment always starts the text or follows a special
             * token, so it is encoded like a text of its own. */
            int32_t *ids = encode(t, text + fr[i].off, fr[i].len, 0, 0, &n, &st);
            for (int j = 0; ids && j < n; j++) want[n_want++] = ids[j];
            free(ids);
        }
        free(fr);
        int n_got;
        ellm_status st;
        int32_t *got = encode(t, text, len, 0, 1, &n_got, &st);
        int same =
            got && n_got == n_want && memcmp(got, want, (size_t)n_want * sizeof(int32_t)) == 0;
        if (!same && same_all) {
            fprintf(stderr, "partition mismatch on '%.*s'\n", (int)len, text);
        }
        same_all &= same;
        free(got);
    }
    CHECK(same_all, "special-token splitting matches llama.cpp's partition loop");
    free(sp);
    tokenizer_free(t);
}

/* Nested user-defined tokens ("\n", "\n\n", ... 31 newlines, as some
 * vocabularies have): splitting agrees with the partition loop, and a long
 * run of newlines stays fast and small. */
static void test_nested_specials(void) {
    const char *toks[36];
    static char runs[32][32];
    float scores[36];
    int32_t types[36];
    int n = 0;
    toks[n] = "<unk>", types[n++] = 2;
    toks[n] = "<s>", types[n++] = 3;
    toks[n] = "</s>", types[n++] = 3;
    toks[n] = "a", types[n++] = 1;
    toks[n] = "\xe2\x96\x81", types[n++] = 1;
    for (int k = 1; k <= 31; k++) {
        memset(runs[k], '\n', (size_t)k);
        runs[k][k] = 0;
        toks[n] = runs[k], types[n++] = 4;
    }
    for (int i = 0; i < n; i++) scores[i] = -1;
    gbuf b = {0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, n);
    gb_kv_arr(&b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, n);
    gb_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n);
    ellm_error err = {0};
    tokenizer *t;
    ellm_status st = init_from(&b, &t, &err);
    CHECK(st == ELLM_OK, "nested vocabulary loads: %s", err.msg);
    if (!t) return;

    ref_special sp[31];
    for (int k = 1; k <= 31; k++) sp[k - 1] = (ref_special){4 + k, runs[k], (size_t)k, 0};
    qsort(sp, 31, sizeof(ref_special), cmp_ref_special);
    uint64_t rng = 99;
    int same_all = 1;
    for (int iter = 0; iter < 300; iter++) {
        char text[400];
        size_t len = 0;
        int parts = 1 + iter % 10;
        for (int i = 0; i < parts; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int kind = (int)((rng >> 33) % 4);
            size_t run = 1 + (size_t)((rng >> 40) % 70);
            char c = kind == 0 ? 'a' : kind == 1 ? ' ' : '\n';
            if (kind == 0 || kind == 1) run = 1 + run % 3;
            memset(text + len, c, run);
            len += run;
        }
        int n_frag;
        frag *fr = ref_partition(text, len, sp, 31, &n_frag);
        int32_t want[512];
        int n_want = 0;
        for (int i = 0; i < n_frag; i++) {
            if (fr[i].is_token) {
                want[n_want++] = fr[i].id;
                continue;
            }
            int m;
            int32_t *ids = encode(t, text + fr[i].off, fr[i].len, 0, 0, &m, &st);
            for (int j = 0; ids && j < m; j++) want[n_want++] = ids[j];
            free(ids);
        }
        free(fr);
        int n_got;
        int32_t *got = encode(t, text, len, 0, 0, &n_got, &st);
        same_all &= got && n_got == n_want && !memcmp(got, want, (size_t)n_want * sizeof(int32_t));
        free(got);
    }
    CHECK(same_all, "nested user-defined tokens split as llama.cpp's partition loop does");

    size_t big = (size_t)3 << 20;
    char *nl = malloc(big);
    memset(nl, '\n', big);
    int cnt = 0;
    double t0 = now_s();
    st = tokenizer_encode(t, nl, big, 0, 0, NULL, 0, &cnt, &err);
    double dt = now_s() - t0;
    /* 31 newlines per token, then one token for the rest. */
    CHECK(st == ELLM_ERR_ARG && (size_t)cnt == big / 31 + (big % 31 != 0),
          "3 MB of newlines: %d tokens", cnt);
    printf("nested specials: 3 MB of newlines in %.2f s\n", dt);
    free(nl);
    tokenizer_free(t);
}

/* Truncated and bit-flipped vocabularies: loading fails cleanly or gives a
 * tokenizer that encodes and decodes without crashing (run under ASan). */
static void test_corrupt_metadata(void) {
    static const char *const toks[] = {"<unk>",
                                       "<s>",
                                       "</s>",
                                       "<0x41>",
                                       "a",
                                       "b",
                                       "ab",
                                       "\xe2\x96\x81",
                                       "\xe2\x96\x81"
                                       "ab",
                                       "<x>"};
    static const float scores[] = {0, 0, 0, 0, -1, -1, -2, -1, -3, 0};
    static const int32_t types[] = {2, 3, 3, 6, 1, 1, 1, 1, 1, 4};
    gbuf b = {0};
    gb_kv_str(&b, "general.name", "phi3-test");
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, 10);
    gb_kv_arr(&b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 10);
    gb_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 10);
    gb_key(&b, "tokenizer.ggml.eos_token_id", GGUF_TYPE_INT32);
    gb_u32(&b, 2);
    size_t size;
    uint8_t *good = gb_finish(&b, &size);
    uint8_t *mem = malloc(size);
    int loaded = 0, attempts = 0, crashed_never = 1;
    uint64_t rng = 4242;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(mem, good, size);
        size_t n = size;
        if (iter < (int)size) {
            n = (size_t)iter; /* every truncation */
        } else {
            for (int k = 0; k < 1 + iter % 4; k++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                mem[(rng >> 20) % size] ^= (uint8_t)(1u << ((rng >> 50) % 8));
            }
        }
        gguf_file *f = NULL;
        ellm_error err = {0};
        if (gguf_open_memory(mem, n, &f, &err) != ELLM_OK) continue;
        tokenizer *t = NULL;
        attempts++;
        if (tokenizer_init_gguf(f, &t, &err) == ELLM_OK) {
            loaded++;
            int32_t ids[64];
            int cnt;
            static const char *const texts[] = {"ab ab", "<x>a<s>", "zq\xc3\xa9", "   ", ""};
            for (int i = 0; i < 5; i++) {
                for (int special = 0; special < 2; special++) {
                    ellm_status st = tokenizer_encode(t, texts[i], strlen(texts[i]), 1, special,
                                                      ids, 64, &cnt, &err);
                    if (st != ELLM_OK) continue;
                    ellm_detok d = {0};
                    char out[64];
                    for (int j = 0; j < cnt; j++) {
                        crashed_never &= ids[j] >= 0 && ids[j] < tokenizer_n_vocab(t);
                        tokenizer_detok_push(t, &d, ids[j], out, sizeof(out));
                        tokenizer_is_eog(t, ids[j]);
                    }
                    tokenizer_detok_flush(&d, out, sizeof(out));
                }
            }
            tokenizer_free(t);
        } else {
            crashed_never &= t == NULL && err.msg[0] != 0;
        }
        gguf_close(f);
    }
    CHECK(crashed_never, "corrupt vocabularies: ids in range, failures leave a message");
    CHECK(loaded > 0 && attempts > loaded, "corrupt vocabularies: %d of %d loaded", loaded,
          attempts);
    free(mem);
    free(good);
}

/* ---- speed ---- */

static void bench(const char *name, const tokenizer *t, const char *text, size_t len) {
    ellm_error err = {0};
    int n = 0;
    double t0 = now_s();
    ellm_status st = tokenizer_encode(t, text, len, 1, 0, NULL, 0, &n, &err);
    double dt = now_s() - t0;
    CHECK(st == ELLM_ERR_ARG && n > 0, "%s: sizing encode (%d)", name, (int)st);
    printf("speed %-28s %6.1f MB in %.2f s: %6.1f MB/s, %d tokens\n", name, len / 1e6, dt,
           len / 1e6 / dt, n);
}

static void test_speed(const tokenizer *llama) {
    size_t n;
    char *sample = test_read_file(test_data_path("heldout-sample.txt"), &n);
    CHECK(sample != NULL, "reading heldout-sample.txt");
    if (!sample) return;
    int reps = 10;
    char *big = malloc(n * (size_t)reps);
    for (int i = 0; i < reps; i++) memcpy(big + (size_t)i * n, sample, n);
    tokenizer *code = open_tokenizer(eval_model_path());
    if (code) {
        bench("evalmodel, python source", code, big, n * reps);
        tokenizer_free(code);
    }
    bench("llama-spm, python source", llama, big, n * reps);
    /* One 4 MB word: a single fragment with no spaces. */
    size_t m = 4 << 20;
    char *word = malloc(m);
    for (size_t i = 0; i < m; i++) word[i] = "abcdefghij"[(i * 7 + i / 13) % 10];
    bench("llama-spm, 4 MB without spaces", llama, word, m);
    free(word);
    free(big);
    free(sample);
}

int main(void) {
    test_vocab_vectors("llama-spm");
    test_vocab_vectors("phi-3");
    test_prompt64_file();
    char gqa[1024];
    snprintf(gqa, sizeof(gqa), "%s", test_data_path("models/llama-gqa.gguf"));
    test_prompt_roundtrip(gqa, "models/llama-gqa.tokens.txt");
    test_prompt_roundtrip(eval_model_path(), "evalmodel.tokens.txt");
    test_reference(test_data_path("vocab/ggml-vocab-llama-spm.gguf"), "llama-spm");
    test_reference(eval_model_path(), "evalmodel");

    tokenizer *llama = open_tokenizer(test_data_path("vocab/ggml-vocab-llama-spm.gguf"));
    if (llama) {
        test_detok_streaming(llama);
        test_specials_llama(llama);
        test_detok_random_bytes(llama);
        if (!getenv("ELLM_TEST_NO_BENCH")) test_speed(llama);
        tokenizer_free(llama);
    }
    test_specials_phi3();
    test_partition_reference();
    test_nested_specials();
    test_corrupt_metadata();
    test_metadata();
    return test_finish();
}
