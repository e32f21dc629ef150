/* The converter: safetensors header validation, the SentencePiece model
 * reader, HF folders written from the fixture GGUF models (every
 * architecture, Q/K in the HF layout) converted back and compared tensor by
 * tensor and by logits, every output type against the reference quantizers,
 * BF16 and sharded input, tokenizer.json vocabularies against llama.cpp's
 * vectors, and bad input. */
#include "convert/convert.h"
#include "core/cpu.h"
#include "convert/gptq.h"
#include "convert/hf_config.h"
#include "convert/hf_vocab.h"
#include "convert/imatrix.h"
#include "convert/safetensors.h"
#include "convert/sp_model.h"
#include "ellm.h"
#include "harness.h"
#include "model/model.h"
#include "hf_writer.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "kernels/quant.h"
#include "tokenizer/tokenizer.h"
#include "vocab_vectors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


/* A fresh empty folder under test_tmp_dir(). */
static const char *new_dir(const char *name) {
    static char buf[8][640];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 640, "%s/%s", test_tmp_dir(), name);
    mkdir(p, 0755);
    return p;
}

static ellm_status convert(const char *dir, const char *out, const char *type, ellm_error *err) {
    convert_params p = {.type = type, .n_threads = 2};
    return convert_hf_to_gguf(dir, out, &p, NULL, err);
}

/* ---- safetensors header ---- */

/* A file of one header + `data_len` zero bytes. */
static char *st_buf(const char *header, size_t data_len, size_t *size) {
    size_t h = strlen(header);
    char *b = calloc(8 + h + data_len + 1, 1);
    for (int i = 0; i < 8; i++) b[i] = (char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    *size = 8 + h + data_len;
    return b;
}

static void expect_st_error(const char *header, size_t data_len, const char *needle) {
    size_t size;
    char *b = st_buf(header, data_len, &size);
    st_set *s = NULL;
    ellm_error err = {0};
    ellm_status st = st_open_memory(b, size, "x.safetensors", &s, &err);
    CHECK(st != ELLM_OK && !s && strstr(err.msg, needle) && strstr(err.msg, "x.safetensors"),
          "header %s: status %d, message '%s' (want '%s')", header, st, err.msg, needle);
    st_close(s);
    free(b);
}

static void test_safetensors(void) {
    size_t size;
    char *b = st_buf("{\"__metadata__\":{\"a\":\"b\"},\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
                     "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                     20, &size);
    st_set *s = NULL;
    ellm_error err = {0};
    CHECK(st_open_memory(b, size, "ok.safetensors", &s, &err) == ELLM_OK, "%s", err.msg);
    if (s) {
        CHECK(st_n_tensors(s) == 2, "%lld tensors", (long long)st_n_tensors(s));
        const st_tensor *w = st_find(s, "w");
        CHECK(w && w->dtype == ST_BF16 && w->n_dims == 2 && w->shape[0] == 2 && w->shape[1] == 3 &&
                  w->n_bytes == 12 && (const char *)w->data == b + 8 + (size - 8 - 20) + 8,
              "tensor w");
        CHECK(st_find(s, "__metadata__") == NULL && st_find(s, "u") == NULL, "lookup");
        st_close(s);
    }
    free(b);
    /* Header length beyond the file. */
    b = st_buf("{}", 0, &size);
    b[0] = 100;
    CHECK(st_open_memory(b, size, "x.safetensors", &s, &err) == ELLM_ERR_FORMAT && strstr(err.msg, "header length"),
          "%s", err.msg);
    free(b);
    CHECK(st_open_memory("abc", 3, "x.safetensors", &s, &err) == ELLM_ERR_FORMAT, "3-byte file");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "past the data section");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16, "give 12 bytes");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                    16, "overlap");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 16, "begin <= end");
    expect_st_error("{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, "unknown dtype");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 16, "shape[0]");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}",
                    16, "more than");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 16, "data_offsets");
    expect_st_error("{\"w\":", 16, "malformed");
    expect_st_error("[1,2]", 16, "not a JSON object");
    /* Every truncation of a valid file fails cleanly (or parses a prefix that is itself valid). */
    b = st_buf("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &size);
    int bad = 0;
    for (size_t n = 0; n < size; n++) {
        if (st_open_memory(b, n, "t.safetensors", &s, &err) == ELLM_OK) bad++;
        st_close(s);
        s = NULL;
    }
    CHECK(bad == 0, "%d truncations accepted", bad);
    free(b);
}

/* ---- tokenizer.model ---- */

static void test_sp_model(void) {
    size_t len;
    char *buf = test_read_file(test_data_path("tok2k.model"), &len);
    CHECK(buf != NULL, "tok2k.model");
    if (!buf) return;
    sp_model sp;
    ellm_error err = {0};
    CHECK(sp_model_parse(buf, len, "tok2k.model", &sp, &err) == ELLM_OK, "%s", err.msg);
    gguf_file *g = NULL;
    gguf_open("models/evalmodel.gguf", &g, &err);
    if (g && sp.pieces) {
        int64_t ti = gguf_find_key(g, "tokenizer.ggml.tokens");
        gguf_value_type et;
        uint64_t n;
        const void *scores, *types;
        gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &scores, &err);
        gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &types, &err);
        CHECK((uint64_t)sp.n_pieces == n, "%lld pieces, GGUF %llu", (long long)sp.n_pieces, (unsigned long long)n);
        int diff = 0;
        for (int64_t i = 0; i < sp.n_pieces && (uint64_t)i < n; i++) {
            const char *s;
            size_t l;
            float sc;
            int32_t ty;
            gguf_get_arr_str(g, ti, (uint64_t)i, &s, &l);
            memcpy(&sc, (const char *)scores + 4 * i, 4);
            memcpy(&ty, (const char *)types + 4 * i, 4);
            diff += l != sp.pieces[i].len || memcmp(s, sp.pieces[i].piece, l) || sc != sp.pieces[i].score ||
                    ty != sp.pieces[i].type;
        }
        CHECK(diff == 0, "%d pieces differ from the GGUF vocabulary", diff);
    }
    if (sp.pieces) sp_model_free(&sp);
    /* Every truncation fails or parses; none crashes (ASan run). */
    int ok = 0;
    for (size_t n = 0; n < len; n += 7) {
        if (sp_model_parse(buf, n, "t.model", &sp, &err) == ELLM_OK) {
            ok++;
            sp_model_free(&sp);
        }
    }
    CHECK(ok > 0, "no prefix parses");
    gguf_close(g);
    free(buf);
}

/* ---- round trips ---- */

/* Compares every tensor of `want` with the same-named tensor of `got`: same
 * type and shape, bytes equal to what the reference quantizer makes of the
 * F32 original (first rounded to BF16 when the HF folder held BF16).
 * Returns the number of mismatches. */
static int compare_tensors(const gguf_file *want, const gguf_file *got, int quantize, int src_bf16) {
    int bad = 0;
    for (int64_t i = 0; i < gguf_n_tensors(want); i++) {
        const gguf_tensor *w = gguf_tensor_at(want, i);
        const gguf_tensor *g = gguf_find_tensor(got, w->name);
        if (!g || g->ne[0] != w->ne[0] || g->ne[1] != w->ne[1] || (!quantize && g->type != w->type)) {
            fprintf(stderr, "tensor %s: missing or shape/type differs\n", w->name);
            bad++;
            continue;
        }
        if (!strcmp(w->name, "rope_freqs.weight")) continue; /* checked on its own */
        int64_t n = w->ne[0] * w->ne[1];
        size_t nb = qtype_row_bytes(g->type, w->ne[0]) * (size_t)w->ne[1];
        void *exp = malloc(nb);
        float *x = malloc((size_t)n * sizeof *x);
        for (int64_t k = 0; k < n; k++) {
            float v = ((const float *)w->data)[k];
            x[k] = src_bf16 ? ellm_bf16_to_f32(ellm_f32_to_bf16(v)) : v;
        }
        qtype_quantize_ref(g->type, x, exp, n);
        free(x);
        if (g->n_bytes != nb || memcmp(exp, g->data, nb)) {
            fprintf(stderr, "tensor %s (%s): bytes differ\n", w->name, qtype_get(g->type)->name);
            bad++;
        }
        free(exp);
    }
    if (gguf_n_tensors(got) != gguf_n_tensors(want)) bad++;
    return bad;
}

/* Compares a tokenizer.ggml.* array or scalar key of two files. */
static int same_key(const gguf_file *a, const gguf_file *b, const char *key) {
    int64_t ia = gguf_find_key(a, key), ib = gguf_find_key(b, key);
    if (ia < 0 || ib < 0) return ia == ib;
    gguf_value_type ta = gguf_kv_type(a, ia), tb = gguf_kv_type(b, ib);
    if (ta == GGUF_TYPE_ARRAY) {
        gguf_value_type ea, eb;
        uint64_t na, nb;
        const void *da, *db;
        if (tb != ta || gguf_get_arr(a, key, &ea, &na, &da, NULL) || gguf_get_arr(b, key, &eb, &nb, &db, NULL) ||
            ea != eb || na != nb)
            return 0;
        if (ea == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < na; i++) {
                const char *sa, *sb;
                size_t la, lb;
                gguf_get_arr_str(a, ia, i, &sa, &la);
                gguf_get_arr_str(b, ib, i, &sb, &lb);
                if (la != lb || memcmp(sa, sb, la)) return 0;
            }
            return 1;
        }
        return !memcmp(da, db, na * 4);
    }
    if (ta == GGUF_TYPE_STRING) {
        const char *sa, *sb;
        size_t la, lb;
        gguf_get_str(a, key, &sa, &la, NULL);
        gguf_get_str(b, key, &sb, &lb, NULL);
        return la == lb && !memcmp(sa, sb, la);
    }
    if (ta == GGUF_TYPE_BOOL) {
        int va, vb;
        return tb == ta && !gguf_get_bool(a, key, &va, NULL) && !gguf_get_bool(b, key, &vb, NULL) && va == vb;
    }
    double va, vb;
    if (gguf_get_f64(a, key, &va, NULL) || gguf_get_f64(b, key, &vb, NULL)) return 0;
    return va == vb;
}

/* Max |a - b| / max |b| over the logits of `tokens` for two models. */
static double logits_diff(const char *path_a, const char *path_b, const int32_t *ids, int n, int *am) {
    ellm_model *ma = NULL, *mb = NULL;
    ellm_error err = {0};
    ellm_model_params mp = {.n_threads = 2, .pin_threads = 0};
    double rel = 1e30;
    *am = 0;
    if (ellm_model_load(path_a, &mp, &ma, &err) || ellm_model_load(path_b, &mp, &mb, &err)) {
        fprintf(stderr, "logits_diff: %s\n", err.msg);
        goto done;
    }
    ellm_model_info info;
    ellm_model_get_info(ma, &info);
    float *la = malloc((size_t)n * info.n_vocab * 4), *lb = malloc((size_t)n * info.n_vocab * 4);
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n;
    cp.kv_type = ELLM_KV_F32;
    ellm_context *ca = NULL, *cb = NULL;
    if (!ellm_context_init(ma, &cp, &ca, &err) && !ellm_context_init(mb, &cp, &cb, &err) &&
        !ellm_decode(ca, ids, n, la, &err) && !ellm_decode(cb, ids, n, lb, &err)) {
        double maxd = 0, maxref = 0;
        for (size_t i = 0; i < (size_t)n * info.n_vocab; i++) {
            double d = fabs((double)la[i] - lb[i]);
            if (!(d <= maxd)) maxd = d;
            if (fabs(lb[i]) > maxref) maxref = fabs(lb[i]);
        }
        for (int r = 0; r < n; r++) {
            const float *x = la + (size_t)r * info.n_vocab, *y = lb + (size_t)r * info.n_vocab;
            int ax = 0, ay = 0;
            for (int i = 1; i < info.n_vocab; i++) {
                if (x[i] > x[ax]) ax = i;
                if (y[i] > y[ay]) ay = i;
            }
            *am += ax == ay;
        }
        rel = maxd / maxref;
    } else {
        fprintf(stderr, "logits_diff: %s\n", err.msg);
    }
    ellm_context_free(ca);
    ellm_context_free(cb);
    free(la);
    free(lb);
done:
    ellm_model_free(ma);
    ellm_model_free(mb);
    return rel;
}

static int32_t test_ids[96];
static int n_test_ids;

static void load_test_ids(void) {
    char *t = test_read_file(test_data_path("models/llama-gqa.tokens.txt"), NULL);
    n_test_ids = 0;
    for (char *p = t ? strtok(t, " \n") : NULL; p && n_test_ids < 96; p = strtok(NULL, " \n"))
        test_ids[n_test_ids++] = atoi(p);
    free(t);
}

/* GGUF -> HF folder -> GGUF (f32): tensors and tokenizer identical, logits
 * equal to 1e-6 (relative to the largest logit). */
static void roundtrip(const char *gguf, const char *arch_name, const char *label, const char *rope_scaling) {
    const char *dir = new_dir(label);
    char tok[512], out[700];
    snprintf(tok, sizeof tok, "%s", test_data_path("tok2k.model"));
    hfw_options o = {.hf_arch = arch_name, .dtype = HFW_F32, .tokenizer_model = tok, .rope_scaling_json = rope_scaling};
    CHECK(hfw_from_gguf(gguf, dir, &o) == 0, "%s: writing the HF folder", label);
    snprintf(out, sizeof out, "%s.gguf", dir);
    ellm_error err = {0};
    ellm_status st = convert(dir, out, "f32", &err);
    CHECK(st == ELLM_OK, "%s: %s", label, err.msg);
    if (st) return;
    gguf_file *a = NULL, *b = NULL;
    gguf_open(gguf, &a, &err);
    gguf_open(out, &b, &err);
    if (a && b) {
        CHECK(compare_tensors(a, b, 0, 0) == 0, "%s: tensors differ", label);
        static const char *const keys[] = {"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                           "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
                                           "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token",
                                           "tokenizer.ggml.add_space_prefix", "general.architecture"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            CHECK(same_key(a, b, keys[k]), "%s: %s differs", label, keys[k]);
        /* RoPE scaling keys: the same in both (or absent from both) */
        static const char *const rope_keys[] = {"type", "factor", "original_context_length", "yarn_beta_fast",
                                                "yarn_beta_slow", "yarn_attn_factor"};
        const char *arch = strstr(arch_name, "Qwen2") ? "qwen2" : strstr(arch_name, "Qwen3") ? "qwen3" : "llama";
        for (size_t k = 0; k < sizeof rope_keys / sizeof rope_keys[0]; k++) {
            char key[96];
            snprintf(key, sizeof key, "%s.rope.scaling.%s", arch, rope_keys[k]);
            CHECK(same_key(a, b, key), "%s: %s differs", label, key);
        }
        const int llama3 = rope_scaling && strstr(rope_scaling, "llama3");
        const gguf_tensor *rf = gguf_find_tensor(b, "rope_freqs.weight");
        CHECK(!llama3 == !rf, "%s: rope_freqs %s", label, rf ? "present" : "absent");
        if (rf) {
            /* llama.cpp's formula for factor 8, low 1, high 4, original 8192
             * and theta 500000, head 64 (computed here independently). */
            int bad = 0;
            for (int i = 0; i < 32; i++) {
                double freq = 1.0 / pow(500000.0, 2.0 * i / 64), wl = 2 * M_PI / freq, f;
                if (wl < 8192 / 4.0)
                    f = 1;
                else if (wl > 8192 / 1.0)
                    f = 8;
                else {
                    double sm = (8192 / wl - 1) / (4 - 1);
                    f = 1 / ((1 - sm) / 8 + sm);
                }
                bad += fabs(((const float *)rf->data)[i] - f) > 1e-5 * f;
            }
            CHECK(bad == 0, "%s: %d rope_freqs differ from the Llama 3 formula", label, bad);
        }
    }
    gguf_close(a);
    gguf_close(b);
    if (!rope_scaling || !strstr(rope_scaling, "llama3")) { /* Llama 3's rope_freqs are computed, not copied */
        int am;
        double rel = logits_diff(out, gguf, test_ids, n_test_ids, &am);
        CHECK(rel <= 1e-6 && am == n_test_ids, "%s: logits differ by %.3g (argmax %d/%d)", label, rel, am, n_test_ids);
        printf("%-28s f32 round trip: tensors identical, logits max rel diff %.2e\n", label, rel);
    }
}

/* Every output type of the evaluation model from an F32 HF folder: the
 * planned types and bytes equal the reference quantizers, and the file runs. */
static void test_types(const char *dir) {
    gguf_file *ref = NULL;
    ellm_error err = {0};
    gguf_open("models/evalmodel.gguf", &ref, &err);
    int n;
    const convert_type *types = convert_types(&n);
    for (int i = 0; i < n && ref; i++) {
        char out[700];
        snprintf(out, sizeof out, "%s/out-%s.gguf", test_tmp_dir(), types[i].name);
        ellm_status st = convert(dir, out, types[i].name, &err);
        CHECK(st == ELLM_OK, "%s: %s", types[i].name, err.msg);
        gguf_file *g = NULL;
        if (st || gguf_open(out, &g, &err)) continue;
        /* d_model 192 is not a multiple of 256: K-quants fall back to Q5_0 /
         * Q8_0 (llama-quantize's); the output matrix (tied embeddings) takes the Q6_K rule. */
        int bad = 0;
        for (int64_t k = 0; k < gguf_n_tensors(ref); k++) {
            const gguf_tensor *w = gguf_tensor_at(ref, k);
            const gguf_tensor *t = gguf_find_tensor(g, w->name);
            int want = w->n_dims == 1 ? QTYPE_F32
                                      : convert_matrix_type(&types[i], !strcmp(w->name, "token_embd.weight"),
                                                            strstr(w->name, "attn_v") || strstr(w->name, "ffn_down")
                                                                ? convert_more_bits(atoi(w->name + 4), 6)
                                                                : 0,
                                                            w->ne[0]);
            if (!t || t->type != want) bad++;
        }
        CHECK(bad == 0, "%s: %d tensors have another type than planned", types[i].name, bad);
        CHECK(compare_tensors(ref, g, 1, 0) == 0, "%s: bytes differ from the reference quantizers", types[i].name);
        int64_t ft;
        CHECK(gguf_get_i64(g, "general.file_type", &ft, &err) == ELLM_OK && ft == types[i].file_type,
              "%s: file_type", types[i].name);
        gguf_close(g);
        int am;
        double rel = logits_diff(out, "models/evalmodel.gguf", test_ids, n_test_ids, &am);
        CHECK(rel < 0.5 && am >= n_test_ids * 3 / 4, "%s: logits rel diff %.3g, argmax %d/%d", types[i].name, rel, am,
              n_test_ids);
        printf("evalmodel -> %-7s logits max rel diff vs F32 %.2e, argmax %d/%d\n", types[i].name, rel, am,
               n_test_ids);
    }
    gguf_close(ref);
}

/* The 4-bit types on a model whose rows are multiples of 128 and 256
 * (llama-gqa: d 256, FFN 512), so int4-g128 and Q4_K are used rather than
 * their fallbacks: the file runs and stays close to F32. */
static void test_4bit_types(const char *dir) {
    static const char *const types[] = {"int4-g128", "q4_0", "q4_k_m"};
    for (int i = 0; i < 3; i++) {
        char out[700];
        snprintf(out, sizeof out, "%s/gqa-%s.gguf", test_tmp_dir(), types[i]);
        ellm_error err = {0};
        ellm_status st = convert(dir, out, types[i], &err);
        CHECK(st == ELLM_OK, "%s: %s", types[i], err.msg);
        if (st) continue;
        gguf_file *g = NULL;
        gguf_open(out, &g, &err);
        const gguf_tensor *t = g ? gguf_find_tensor(g, "blk.1.ffn_up.weight") : NULL;
        const gguf_tensor *e = g ? gguf_find_tensor(g, "token_embd.weight") : NULL;
        int want = i == 0 ? QTYPE_INT4_G128 : i == 1 ? QTYPE_Q4_0 : QTYPE_Q4_K;
        CHECK(t && t->type == want && e && e->type == QTYPE_Q6_K, "%s: ffn_up %s, token_embd %s", types[i],
              t ? qtype_get(t->type)->name : "-", e ? qtype_get(e->type)->name : "-");
        gguf_close(g);
        int am;
        double rel = logits_diff(out, "tests/data/models/llama-gqa.gguf", test_ids, n_test_ids, &am);
        /* random weights amplify 4-bit error (max-logit-relative 0.3-0.45 for all three) */
        CHECK(rel < 0.6 && am >= n_test_ids * 85 / 96, "%s: logits rel diff %.3g, argmax %d/%d", types[i], rel, am,
              n_test_ids);
        printf("llama-gqa -> %-9s logits max rel diff vs F32 %.2e, argmax %d/%d\n", types[i], rel, am, n_test_ids);
    }
}

/* Whether two GGUF files hold the same tensors (names, types, bytes) in
 * the same order. */
static int same_tensors(const char *p1, const char *p2) {
    ellm_error err = {0};
    gguf_file *g1 = NULL, *g2 = NULL;
    int same = gguf_open(p1, &g1, &err) == ELLM_OK && gguf_open(p2, &g2, &err) == ELLM_OK &&
               gguf_n_tensors(g1) == gguf_n_tensors(g2);
    for (int64_t i = 0; same && i < gguf_n_tensors(g1); i++) {
        const gguf_tensor *a = gguf_tensor_at(g1, i), *b = gguf_tensor_at(g2, i);
        same = !strcmp(a->name, b->name) && a->type == b->type && a->n_bytes == b->n_bytes &&
               !memcmp(a->data, b->data, a->n_bytes);
    }
    gguf_close(g1);
    gguf_close(g2);
    return same;
}

/* Rewrites a safetensors file with one more space at the end of its JSON
 * header, so that the data section (and every tensor in it) moves by one
 * byte. Returns the new header length, or 0 on failure. */
static uint64_t shift_safetensors_data(const char *path) {
    size_t n = 0;
    char *b = test_read_file(path, &n);
    uint64_t hl = 0;
    if (b && n >= 8) memcpy(&hl, b, 8);
    FILE *f = b && n >= 8 && 8 + hl <= n ? fopen(path, "wb") : NULL;
    if (!f) {
        free(b);
        return 0;
    }
    const uint64_t hl2 = hl + 1;
    int ok = fwrite(&hl2, 8, 1, f) == 1 && fwrite(b + 8, 1, hl, f) == hl && fputc(' ', f) == ' ' &&
             fwrite(b + 8 + hl, 1, n - 8 - hl, f) == n - 8 - hl;
    ok = fclose(f) == 0 && ok;
    free(b);
    return ok ? hl2 : 0;
}

/* Safetensors data offsets need not be even (the header length is free):
 * BF16 and F16 checkpoints whose tensors all sit at odd addresses convert
 * to the same tensors as the file with an aligned header. (The converter's
 * scalar dequantizers once read such elements as misaligned 2-byte loads:
 * UBSan under make test-asan; fuzz/README.md.) */
static void test_odd_offsets(void) {
    char tok[512];
    snprintf(tok, sizeof tok, "%s", test_data_path("tok2k.model"));
    const int dtypes[2] = {HFW_BF16, HFW_F16};
    for (int i = 0; i < 2; i++) {
        const char *dir = new_dir(i ? "odd-f16" : "odd-bf16");
        hfw_options o = {.hf_arch = "LlamaForCausalLM", .dtype = dtypes[i], .tokenizer_model = tok};
        CHECK(hfw_from_gguf("tests/data/models/llama-gqa.gguf", dir, &o) == 0, "%s folder", hfw_dtype_name[dtypes[i]]);
        char aligned[700], odd[700], st[800];
        snprintf(aligned, sizeof aligned, "%s-aligned.gguf", dir);
        snprintf(odd, sizeof odd, "%s-odd.gguf", dir);
        snprintf(st, sizeof st, "%s/model.safetensors", dir);
        ellm_error err = {0};
        CHECK(convert(dir, aligned, "f32", &err) == ELLM_OK, "%s", err.msg);
        const uint64_t hl = shift_safetensors_data(st);
        CHECK(hl % 2 == 1, "%s: header length %llu after the shift", hfw_dtype_name[dtypes[i]], (unsigned long long)hl);
        /* with the scalar kernels too: their dequantizers read element by element */
        const ellm_isa isas[2] = {ellm_cpu_isa(), ELLM_ISA_SCALAR};
        for (int k = 0; k < 2; k++) {
            const ellm_isa saved = ellm_cpu_isa();
            ellm_cpu_set_isa(isas[k]);
            ellm_status cs = convert(dir, odd, "f32", &err);
            ellm_cpu_set_isa(saved);
            CHECK(cs == ELLM_OK, "%s at odd offsets (%s): %s", hfw_dtype_name[dtypes[i]], ellm_isa_str(isas[k]), err.msg);
            CHECK(same_tensors(aligned, odd), "%s at odd offsets (%s): tensors differ from the aligned file's",
                  hfw_dtype_name[dtypes[i]], ellm_isa_str(isas[k]));
            remove(odd);
        }
    }
}

/* BF16 and F16 checkpoints, and a sharded one: same result as the source
 * rounded to that type; sharding changes nothing. */
static void test_dtypes_and_shards(void) {
    char tok[512];
    snprintf(tok, sizeof tok, "%s", test_data_path("tok2k.model"));
    const char *d1 = new_dir("bf16");
    hfw_options o = {.hf_arch = "LlamaForCausalLM", .dtype = HFW_BF16, .tokenizer_model = tok};
    CHECK(hfw_from_gguf("models/evalmodel.gguf", d1, &o) == 0, "bf16 folder");
    const char *d2 = new_dir("bf16-sharded");
    o.n_shards = 3;
    CHECK(hfw_from_gguf("models/evalmodel.gguf", d2, &o) == 0, "sharded folder");
    char o1[700], o2[700];
    snprintf(o1, sizeof o1, "%s.gguf", d1);
    snprintf(o2, sizeof o2, "%s.gguf", d2);
    ellm_error err = {0};
    CHECK(convert(d1, o1, "bf16", &err) == ELLM_OK, "%s", err.msg);
    CHECK(convert(d2, o2, "bf16", &err) == ELLM_OK, "%s", err.msg);
    CHECK(same_tensors(o1, o2), "sharded and single-file conversions differ");
    gguf_file *ref = NULL, *g = NULL;
    gguf_open("models/evalmodel.gguf", &ref, &err);
    gguf_open(o1, &g, &err);
    if (ref && g) CHECK(compare_tensors(ref, g, 1, 1) == 0, "bf16: tensors are not the rounded source");
    gguf_close(ref);
    gguf_close(g);
    int am;
    double rel = logits_diff(o1, "models/evalmodel.gguf", test_ids, n_test_ids, &am);
    CHECK(rel < 0.1 && am >= n_test_ids * 9 / 10, "bf16 logits rel diff %.3g argmax %d", rel, am);
}

/* Error-feedback rounding (gptq_prepare, gptq_quantize_row): U is
 * the upper Cholesky factor of the damped H's inverse (U^T U H = I), and on
 * correlated inputs the output error sum over rows of e^T H e (the squared
 * error of W x over the samples x that gave H) is well below the
 * element-wise weighted rounding's, for Q4_0 and INT4_G128; a block that is
 * not positive definite is refused, and so are other types and rows longer
 * than the scratch. */
static void test_gptq(void) {
    enum { N = 512, B = 256, T = 1024, F = 6, ROWS = 8 };
    float *X = malloc((size_t)T * N * sizeof(float)), *L = malloc(N * F * sizeof(float));
    float *cov = malloc((size_t)N * B * sizeof(float)), *H = malloc((size_t)N * B * sizeof(float));
    float *U = malloc((size_t)N * B * sizeof(float)), *im = malloc(N * sizeof(float));
    float *W = malloc(N * ROWS * sizeof(float)), *xq = malloc(N * sizeof(float));
    void *q = malloc(qtype_row_bytes(QTYPE_Q4_0, N) * ROWS);
    uint64_t rs = 0x2545F4914F6CDD1Dull;
    gptq_scratch *S = gptq_scratch_new(N);
    CHECK(X && L && cov && H && U && im && W && xq && q && S, "gptq test: out of memory");
    if (!(X && L && cov && H && U && im && W && xq && q && S)) return;
    /* activations: F shared factors plus noise, columns of unequal scale */
    for (int i = 0; i < N * F; i++) L[i] = test_frand(&rs);
    for (int t = 0; t < T; t++) {
        float u[F];
        for (int f = 0; f < F; f++) u[f] = test_frand(&rs);
        for (int c = 0; c < N; c++) {
            float v = 0.4f * test_frand(&rs);
            for (int f = 0; f < F; f++) v += L[c * F + f] * u[f];
            X[(size_t)t * N + c] = v * (0.5f + (float)(c % 7) * 0.25f);
        }
    }
    for (int c = 0; c < N; c++) {
        const int c0 = c / B * B;
        for (int j = 0; j < B; j++) {
            double s = 0;
            for (int t = 0; t < T; t++) s += (double)X[(size_t)t * N + c] * X[(size_t)t * N + c0 + j];
            cov[(size_t)c * B + j] = (float)(s / T);
        }
        im[c] = cov[(size_t)c * B + c - c0];
    }
    const double damp = 0.01;
    CHECK(gptq_prepare(cov, N, B, damp, H, U), "gptq: a covariance was refused as not positive definite");
    /* U upper triangular and U^T U H = I per block (H as damped) */
    double worst = 0, lower = 0, *utu = malloc((size_t)B * B * sizeof(double));
    for (int c0 = 0; c0 < N; c0 += B) {
        for (int i = 0; i < B; i++)
            for (int k = 0; k < B; k++) {
                if (k < i) lower = fmax(lower, fabs(U[(size_t)(c0 + i) * B + k]));
                double v = 0;
                for (int l = 0; l <= (i < k ? i : k); l++)
                    v += (double)U[(size_t)(c0 + l) * B + i] * U[(size_t)(c0 + l) * B + k];
                utu[(size_t)i * B + k] = v;
            }
        for (int i = 0; i < B; i++)
            for (int j = 0; j < B; j++) {
                double s = 0;
                for (int k = 0; k < B; k++) s += utu[(size_t)i * B + k] * H[(size_t)(c0 + k) * B + j];
                worst = fmax(worst, fabs(s - (i == j)));
            }
    }
    free(utu);
    CHECK(lower == 0 && worst < 1e-3, "gptq: U^T U H is off the identity by %.3g (lower triangle %.3g)", worst, lower);
    for (int i = 0; i < N * ROWS; i++) W[i] = 0.02f * test_frand(&rs);
    for (int i = 0; i < N * ROWS; i += 89) W[i] *= 6.0f; /* outliers */
    static const int types[] = {QTYPE_Q4_0, QTYPE_INT4_G128};
    for (int k = 0; k < 2; k++) {
        const int type = types[k];
        const size_t rb = qtype_row_bytes(type, N);
        double E[2] = {0, 0};
        for (int method = 0; method < 2; method++) {
            for (int r = 0; r < ROWS; r++) {
                if (method)
                    CHECK(gptq_quantize_row(type, W + r * N, (char *)q + r * rb, N, im, H, U, B, S),
                          "gptq %s: row refused", qtype_get(type)->name);
                else
                    qtype_quantize_weighted(type, W + r * N, (char *)q + r * rb, N, im, N);
                qtype_dequantize_ref(type, (char *)q + r * rb, xq, N);
                for (int c = 0; c < N; c++) { /* e^T cov e, undamped */
                    const int c0 = c / B * B;
                    double s = 0;
                    for (int j = 0; j < B; j++)
                        s += (double)cov[(size_t)c * B + j] * (W[r * N + c0 + j] - xq[c0 + j]);
                    E[method] += (W[r * N + c] - xq[c]) * s;
                }
            }
        }
        printf("gptq %s: output error %.4g against %.4g element-wise (ratio %.3f)\n", qtype_get(type)->name, E[1], E[0],
               E[1] / E[0]);
        CHECK(E[1] < 0.2 * E[0], "gptq %s: output error %.4g not well below the element-wise %.4g",
              qtype_get(type)->name, E[1], E[0]);
    }
    /* not positive definite: refused */
    float bad[2 * 32] = {0}, bh[2 * 32], bu[2 * 32];
    bad[0] = bad[33] = 1.0f;
    bad[1] = bad[32] = 2.0f;
    CHECK(!gptq_prepare(bad, 2, 32, 0.0, bh, bu), "gptq: an indefinite covariance was accepted");
    /* another type, or a block the type's groups do not divide: refused */
    char q8[N * 2];
    gptq_scratch *small = gptq_scratch_new(N / 2);
    CHECK(small && !gptq_quantize_row(QTYPE_Q8_0, W, q8, N, im, H, U, B, S) &&
              !gptq_quantize_row(QTYPE_INT4_G128, W, q, N, im, H, U, 64, S) &&
              !gptq_quantize_row(QTYPE_Q4_0, W, q, N, im, H, U, B, small),
          "gptq: q8_0, an int4-g128 block of 64 or a row longer than the scratch was taken");
    gptq_scratch_free(small);
    gptq_scratch_free(S);
    free(X);
    free(L);
    free(cov);
    free(H);
    free(U);
    free(im);
    free(W);
    free(xq);
    free(q);
}

/* Whether tensor `name` has the same type but different bytes in the GGUF
 * files at a and b (0 if either is missing). */
static int tensor_differs(const char *a, const char *b, const char *name) {
    ellm_error err = {0};
    gguf_file *fa = NULL, *fb = NULL;
    gguf_open(a, &fa, &err);
    gguf_open(b, &fb, &err);
    const gguf_tensor *ta = fa ? gguf_find_tensor(fa, name) : NULL;
    const gguf_tensor *tb = fb ? gguf_find_tensor(fb, name) : NULL;
    int differs = ta && tb && ta->type == tb->type && ta->n_bytes == tb->n_bytes &&
                  memcmp(ta->data, tb->data, ta->n_bytes) != 0;
    gguf_close(fa);
    gguf_close(fb);
    return differs;
}

/* Collects llama-gqa's importance matrix over the test ids (with input
 * covariances in blocks of cov_block columns when > 0) and writes it to
 * path; returns the status (err says why). */
static ellm_status write_test_imatrix(const char *path, int cov_block, ellm_error *err) {
    ellm_model *m = NULL;
    ellm_context *ctx = NULL;
    ellm_imatrix *im = NULL;
    ellm_model_params mp = {.n_threads = 2, .pin_threads = 0};
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n_test_ids;
    ellm_status st = ellm_model_load("tests/data/models/llama-gqa.gguf", &mp, &m, err);
    if (st == ELLM_OK) st = ellm_context_init(m, &cp, &ctx, err);
    if (st == ELLM_OK) st = ellm_imatrix_init(m, &im, err);
    if (st == ELLM_OK && cov_block > 0) {
        st = ellm_imatrix_set_covariance(im, cov_block, err);
        ellm_error e2 = {0};
        if (st == ELLM_OK)
            CHECK(ellm_imatrix_set_covariance(im, cov_block, &e2) == ELLM_ERR_ARG, "covariance enabled twice");
    }
    if (st == ELLM_OK) st = ellm_imatrix_collect(ctx, im, test_ids, n_test_ids, err);
    if (st == ELLM_OK) st = ellm_imatrix_write(im, path, "test", err);
    ellm_imatrix_free(im);
    ellm_context_free(ctx);
    ellm_model_free(m);
    return st;
}

/* With --covariance: one more entry per distinct input ("<name>.cov",
 * columns x 128, under attn_q, attn_output, ffn_gate and ffn_down), symmetric within its block, whose diagonal is the main entry's mean
 * squares and whose products obey Cauchy-Schwarz; the converter's
 * error-feedback rounding from it changes the rows and lowers the logits'
 * error against F32 below the element-wise rounding's (`diag`, the file
 * without covariances). Negative values pass only in ".cov" entries. */
static void test_imatrix_covariance(const char *hf_dir, const char *diag) {
    enum { B = 128 };
    ellm_error err = {0};
    char path[700], out[700], out_d[700];
    snprintf(path, sizeof path, "%s/gqa-cov.imatrix", test_tmp_dir());
    ellm_status st = write_test_imatrix(path, B, &err);
    CHECK(st == ELLM_OK, "imatrix with covariance: %s", err.msg);
    cv_imatrix cv;
    st = cv_imatrix_load(path, &cv, &err);
    CHECK(st == ELLM_OK && cv.n == 2 * (7 + 4), "imatrix with covariance read: %s (%d entries)", err.msg,
          st ? 0 : cv.n);
    if (st != ELLM_OK) return;
    static const struct {
        const char *name;
        int cols;
    } mats[] = {{"blk.1.attn_q.weight", 256}, {"blk.0.attn_output.weight", 256}, {"blk.0.ffn_down.weight", 512}};
    for (int k = 0; k < 3; k++) {
        int blk = 0, n = mats[k].cols;
        const float *d = cv_imatrix_find(&cv, mats[k].name, n), *c = cv_imatrix_find_cov(&cv, mats[k].name, n, &blk);
        CHECK(d && c && blk == B, "%s: covariance entry missing or block %d", mats[k].name, blk);
        if (!d || !c || blk != B) continue;
        double diag_err = 0, asym = 0, cs = 0, offdiag = 0;
        for (int i = 0; i < n; i++) {
            const int i0 = i / B * B;
            diag_err = fmax(diag_err, fabs(c[(size_t)i * B + i - i0] - d[i]) / fmax(d[i], 1e-30));
            for (int j = 0; j < B; j++) {
                const double v = c[(size_t)i * B + j], t = c[(size_t)(i0 + j) * B + i - i0];
                asym = fmax(asym, fabs(v - t));
                cs = fmax(cs, v * v / fmax((double)d[i] * d[i0 + j], 1e-30));
                if (j != i - i0) offdiag = fmax(offdiag, fabs(v));
            }
        }
        CHECK(diag_err < 1e-5 && asym == 0 && cs <= 1.0 + 1e-4 && offdiag > 0,
              "%s: covariance diagonal off the mean squares by %.3g, asymmetry %.3g, Cauchy-Schwarz %.6f, "
              "largest off-diagonal %.3g",
              mats[k].name, diag_err, asym, cs, offdiag);
    }
    int blk = 0, bk = 0, bu = 0;
    CHECK(!cv_imatrix_find_cov(&cv, "blk.1.attn_q.weight", 100, &blk), "a covariance of the wrong width was found");
    {
        char o[64], tiny[8];
        CHECK(model_input_owner("blk.12.attn_v.weight", o, sizeof o) && !strcmp(o, "blk.12.attn_q.weight") &&
                  model_input_owner("blk.0.ffn_up.weight", o, sizeof o) && !strcmp(o, "blk.0.ffn_gate.weight") &&
                  model_input_owner("blk.0.ffn_down.weight", o, sizeof o) && !strcmp(o, "blk.0.ffn_down.weight") &&
                  model_input_owner("output.weight", o, sizeof o) && !strcmp(o, "output.weight") &&
                  !model_input_owner("blk.0.attn_k.weight", tiny, sizeof tiny),
              "model_input_owner: '%s'", o);
    }
    /* one covariance per input: K and V read Q's, up reads gate's */
    const float *cq = cv_imatrix_find_cov(&cv, "blk.1.attn_q.weight", 256, &blk);
    const float *cg = cv_imatrix_find_cov(&cv, "blk.0.ffn_gate.weight", 256, &blk);
    CHECK(cq && cg && cv_imatrix_find_cov(&cv, "blk.1.attn_k.weight", 256, &bk) == cq &&
              cv_imatrix_find_cov(&cv, "blk.1.attn_v.weight", 256, &bk) == cq &&
              cv_imatrix_find_cov(&cv, "blk.0.ffn_up.weight", 256, &bu) == cg && bk == B && bu == B &&
              !cv_imatrix_find(&cv, "blk.1.attn_k.weight.cov", 256 * B),
          "shared inputs: K/V or up do not find the one covariance of their input");
    cv_imatrix_free(&cv);
    for (int k = 0; k < 2; k++) {
        const char *ty = k ? "q4_0" : "int4-g128";
        snprintf(out, sizeof out, "%s/cov-%s.gguf", test_tmp_dir(), ty);
        snprintf(out_d, sizeof out_d, "%s/covd-%s.gguf", test_tmp_dir(), ty);
        convert_params p = {.type = ty, .n_threads = 2, .imatrix = path};
        CHECK(convert_hf_to_gguf(hf_dir, out, &p, NULL, &err) == ELLM_OK, "%s with covariance: %s", ty, err.msg);
        p.imatrix = diag;
        CHECK(convert_hf_to_gguf(hf_dir, out_d, &p, NULL, &err) == ELLM_OK, "%s", err.msg);
        CHECK(tensor_differs(out, out_d, "blk.0.ffn_down.weight"), "%s: the covariance changed nothing", ty);
        int am, am_d;
        double rel = logits_diff(out, "tests/data/models/llama-gqa.gguf", test_ids, n_test_ids, &am);
        double rel_d = logits_diff(out_d, "tests/data/models/llama-gqa.gguf", test_ids, n_test_ids, &am_d);
        printf("llama-gqa -> %-9s with covariance: logits max rel diff vs F32 %.2e (element-wise %.2e), "
               "argmax %d/%d (%d)\n", ty, rel, rel_d, am, n_test_ids, am_d);
        CHECK(rel < 0.7 * rel_d, "%s: error-feedback rounding's logits error %.3g not below the element-wise %.3g",
              ty, rel, rel_d);
    }
    /* negative values: refused in a mean-square entry, taken in a covariance */
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "blk.0.ffn_up.weight.cov" : "blk.0.ffn_up.weight";
        int32_t len = (int32_t)strlen(name), hdr[3];
        uint8_t buf[128];
        size_t o = 0;
        hdr[0] = 1;
        memcpy(buf + o, hdr, 4), o += 4;
        memcpy(buf + o, &len, 4), o += 4;
        memcpy(buf + o, name, (size_t)len), o += (size_t)len;
        hdr[1] = 1, hdr[2] = 2;
        memcpy(buf + o, hdr + 1, 8), o += 8;
        const float v[2] = {0.5f, -0.25f};
        memcpy(buf + o, v, 8), o += 8;
        st = cv_imatrix_parse(buf, o, "neg.imatrix", &cv, &err);
        CHECK(k ? st == ELLM_OK : st == ELLM_ERR_FORMAT && strstr(err.msg, "non-negative"),
              "a negative value in '%s': status %d '%s'", name, st, st ? err.msg : "");
        if (st == ELLM_OK) cv_imatrix_free(&cv);
    }
}

/* Importance matrix: collected by the engine over text, written in
 * llama.cpp's layout, read back with the right shapes, and used by the
 * converter (q4_0 and int4-g128 rows change, the file runs; a malformed
 * file is refused naming it). */
static void test_imatrix(const char *hf_dir) {
    ellm_error err = {0};
    char path[700], out1[700], out2[700];
    snprintf(path, sizeof path, "%s/gqa.imatrix", test_tmp_dir());
    ellm_status st = write_test_imatrix(path, 0, &err);
    CHECK(st == ELLM_OK, "imatrix: %s", err.msg);
    cv_imatrix cv;
    st = cv_imatrix_load(path, &cv, &err);
    CHECK(st == ELLM_OK && cv.n == 2 * 7, "imatrix read: %s (%d entries)", err.msg, st ? 0 : cv.n);
    if (st == ELLM_OK) {
        const float *q = cv_imatrix_find(&cv, "blk.1.attn_q.weight", 256);
        const float *dn = cv_imatrix_find(&cv, "blk.0.ffn_down.weight", 512);
        int pos = 1;
        for (int i = 0; q && dn && i < 256; i++) pos &= q[i] > 0 && dn[i] >= 0;
        CHECK(q && dn && pos && !cv_imatrix_find(&cv, "blk.1.attn_q.weight", 128),
              "imatrix entries missing, wrong size or not positive");
        cv_imatrix_free(&cv);
    }
    /* A truncated file is refused. */
    size_t len = 0;
    char *buf = test_read_file(path, &len);
    CHECK(buf && cv_imatrix_parse(buf, len / 2, "half.imatrix", &cv, &err) == ELLM_ERR_FORMAT &&
              strstr(err.msg, "half.imatrix"),
          "truncated imatrix: '%s'", err.msg);
    /* The same on disk, an empty file, a folder and a missing file, through
     * cv_imatrix_load (which maps the file) */
    char bad[720];
    snprintf(bad, sizeof bad, "%s/half.imatrix", test_tmp_dir());
    FILE *f = fopen(bad, "wb");
    if (f) {
        fwrite(buf, 1, len / 2, f);
        fclose(f);
    }
    CHECK(buf && cv_imatrix_load(bad, &cv, &err) == ELLM_ERR_FORMAT && strstr(err.msg, "half.imatrix"),
          "truncated imatrix file: '%s'", err.msg);
    free(buf);
    snprintf(bad, sizeof bad, "%s/empty.imatrix", test_tmp_dir());
    f = fopen(bad, "wb");
    if (f) fclose(f);
    CHECK(cv_imatrix_load(bad, &cv, &err) == ELLM_ERR_FORMAT && strstr(err.msg, "empty.imatrix") &&
              strstr(err.msg, "entry count"),
          "empty imatrix file: '%s'", err.msg);
    CHECK(cv_imatrix_load(test_tmp_dir(), &cv, &err) == ELLM_ERR_IO && strstr(err.msg, "not a regular file"),
          "a folder as imatrix: '%s'", err.msg);
    snprintf(bad, sizeof bad, "%s/no-such.imatrix", test_tmp_dir());
    CHECK(cv_imatrix_load(bad, &cv, &err) == ELLM_ERR_IO && strstr(err.msg, "no-such.imatrix"),
          "a missing imatrix: '%s'", err.msg);
    /* Larger than 2 GiB (a covariance file of a large model): one entry of
     * 2^29 + 16 zeros, a sparse file, read whole */
    snprintf(bad, sizeof bad, "%s/big.imatrix", test_tmp_dir());
    f = fopen(bad, "wb");
    const int32_t nval = (1 << 29) + 16, head[] = {1, 10};
    const int32_t counts[] = {1, nval};
    int wrote = f && fwrite(head, 4, 2, f) == 2 && fwrite("big.weight", 1, 10, f) == 10 &&
                fwrite(counts, 4, 2, f) == 2 && fseeko(f, (off_t)nval * 4 - 4, SEEK_CUR) == 0 &&
                fwrite("\0\0\0\0", 1, 4, f) == 4;
    if (f) fclose(f);
    CHECK(wrote, "writing a 2 GiB imatrix file");
    if (wrote) {
        st = cv_imatrix_load(bad, &cv, &err);
        const float *v = st == ELLM_OK ? cv_imatrix_find(&cv, "big.weight", nval) : NULL;
        CHECK(v && v[0] == 0 && v[nval - 1] == 0, "a 2 GiB imatrix file: status %d '%s'", st, st ? err.msg : "");
        if (st == ELLM_OK) cv_imatrix_free(&cv);
    }
    remove(bad);
    for (int k = 0; k < 2; k++) {
        const char *ty = k ? "q4_0" : "int4-g128";
        snprintf(out1, sizeof out1, "%s/im-%s.gguf", test_tmp_dir(), ty);
        snprintf(out2, sizeof out2, "%s/noim-%s.gguf", test_tmp_dir(), ty);
        convert_params p = {.type = ty, .n_threads = 2, .imatrix = path};
        st = convert_hf_to_gguf(hf_dir, out1, &p, NULL, &err);
        CHECK(st == ELLM_OK, "%s with imatrix: %s", ty, err.msg);
        p.imatrix = NULL;
        CHECK(convert_hf_to_gguf(hf_dir, out2, &p, NULL, &err) == ELLM_OK, "%s", err.msg);
        CHECK(tensor_differs(out1, out2, "blk.0.ffn_up.weight"), "%s: the imatrix changed nothing", ty);
        int am;
        double rel = logits_diff(out1, "tests/data/models/llama-gqa.gguf", test_ids, n_test_ids, &am);
        CHECK(rel < 0.6 && am >= n_test_ids * 85 / 96, "%s with imatrix: logits rel diff %.3g, argmax %d", ty, rel,
              am);
        printf("llama-gqa -> %-9s with imatrix: logits max rel diff vs F32 %.2e, argmax %d/%d\n", ty, rel, am,
               n_test_ids);
    }
    test_imatrix_covariance(hf_dir, path);
    convert_params p = {.type = "q4_0", .n_threads = 2, .imatrix = "/nonexistent.imatrix"};
    CHECK(convert_hf_to_gguf(hf_dir, out1, &p, NULL, &err) == ELLM_ERR_IO && strstr(err.msg, "/nonexistent.imatrix"),
          "missing imatrix: '%s'", err.msg);
}

/* ---- bad input ---- */

static void expect_fail(const char *dir, const char *label, const char *n1, const char *n2) {
    char out[700];
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    ellm_error err = {0};
    ellm_status st = convert(dir, out, "q8_0", &err);
    CHECK(st != ELLM_OK && strstr(err.msg, n1) && (!n2 || strstr(err.msg, n2)), "%s: status %d, '%s'", label, st,
          err.msg);
    /* No output and no temporary file is left behind. */
    DIR *d = opendir(dir);
    int left = 0;
    for (struct dirent *e; d && (e = readdir(d));) left += !strncmp(e->d_name, "out.gguf", 8);
    if (d) closedir(d);
    CHECK(left == 0, "%s: %d output files left", label, left);
    printf("bad input (%s): %s\n", label, err.msg);
}

/* Replaces the first `from` in DIR/name (binary-safe: safetensors files
 * start with a length holding NUL bytes). */
static void patch_file(const char *dir, const char *name, const char *from, const char *to) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t n = 0;
    char *t = test_read_file(path, &n);
    char *at = t ? memmem(t, n, from, strlen(from)) : NULL;
    if (!at) {
        CHECK(0, "patch %s: '%s' not found", name, from);
        free(t);
        return;
    }
    FILE *f = fopen(path, "wb");
    fwrite(t, 1, (size_t)(at - t), f);
    fwrite(to, 1, strlen(to), f);
    size_t rest = n - (size_t)(at - t) - strlen(from);
    fwrite(at + strlen(from), 1, rest, f);
    fclose(f);
    free(t);
}

static void test_bad_input(void) {
    char tok[512];
    snprintf(tok, sizeof tok, "%s", test_data_path("tok2k.model"));
    hfw_options o = {.hf_arch = "LlamaForCausalLM", .dtype = HFW_BF16, .tokenizer_model = tok};
    const char *src = "tests/data/models/llama-gqa.gguf";

    const char *d = new_dir("bad-arch");
    o.hf_arch = "GPT2LMHeadModel";
    hfw_from_gguf(src, d, &o);
    expect_fail(d, "unknown architecture", "config.json", "'GPT2LMHeadModel' is not supported");
    o.hf_arch = "LlamaForCausalLM";

    d = new_dir("bad-missing");
    o.skip_tensor = "model.layers.1.mlp.up_proj.weight";
    hfw_from_gguf(src, d, &o);
    expect_fail(d, "missing tensor", "model.layers.1.mlp.up_proj.weight", "missing");
    o.skip_tensor = NULL;

    /* a good folder with one string of one file replaced */
    static const struct {
        const char *dir, *file, *from, *to, *label, *n1, *n2;
    } patched[] = {
        {"bad-shape", "config.json", "\"intermediate_size\": 512", "\"intermediate_size\": 640",
         "shape disagrees with config.json", "model.safetensors", "config.json"},
        {"bad-layers", "config.json", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1", "extra tensors",
         "model.layers.1.", "not part of"},
        {"bad-offsets", "model.safetensors", "\"data_offsets\":[0,", "\"data_offsets\":[9,", "offsets disagree",
         "model.safetensors", "data_offsets"},
        {"bad-dtype", "model.safetensors", "\"dtype\":\"BF16\",", "\"dtype\":\"I16\" ,", "integer dtype",
         "model.safetensors", "dtype I16"},
    };
    for (size_t i = 0; i < sizeof patched / sizeof patched[0]; i++) {
        d = new_dir(patched[i].dir);
        hfw_from_gguf(src, d, &o);
        patch_file(d, patched[i].file, patched[i].from, patched[i].to);
        expect_fail(d, patched[i].label, patched[i].n1, patched[i].n2);
    }

    d = new_dir("bad-truncated");
    hfw_from_gguf(src, d, &o);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    struct stat sb;
    stat(path, &sb);
    CHECK(truncate(path, sb.st_size - 1000) == 0, "truncate");
    expect_fail(d, "truncated safetensors", "model.safetensors", "truncated");

    d = new_dir("bad-tokenizer");
    o.tokenizer_model = NULL;
    hfw_from_gguf(src, d, &o);
    hfw_write_text(d, "tokenizer.json", "{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}");
    expect_fail(d, "unsupported tokenizer", "tokenizer.json", "'Unigram' is not supported");

    d = new_dir("bad-no-tokenizer");
    hfw_from_gguf(src, d, &o);
    expect_fail(d, "no tokenizer", "neither tokenizer.model nor tokenizer.json", NULL);

    d = new_dir("bad-no-weights");
    hfw_write_text(d, "config.json",
                   "{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"intermediate_size\":16}");
    expect_fail(d, "no weights", "model.safetensors", NULL);

    hf_config c;
    ellm_error err = {0};
    const char *cfgs[][2] = {
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
         "\"num_attention_heads\":3,\"intermediate_size\":16}",
         "not a multiple"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,\"num_attention_heads\":2,"
         "\"intermediate_size\":16}",
         "num_hidden_layers"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":-1}", "vocab_size"},
        {"{\"architectures\":\"LlamaForCausalLM\"}", "architectures"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
         "\"num_attention_heads\":2,\"intermediate_size\":16,\"rope_scaling\":{\"rope_type\":\"dynamic\"}}",
         "'dynamic'"},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        ellm_status st = hf_config_parse(cfgs[i][0], strlen(cfgs[i][0]), "config.json", &c, &err);
        CHECK(st != ELLM_OK && strstr(err.msg, cfgs[i][1]) && strstr(err.msg, "config.json"), "config %zu: '%s'", i,
              err.msg);
    }
    /* YaRN as transformers reads it: no factor means max_position_embeddings / original; mscale and
     * mscale_all_dim give the magnitude get_mscale(f, mscale) / get_mscale(f, mscale_all_dim);
     * "truncate": false (an unrounded correction range) has no GGUF key and is refused */
#define YARN_CFG(x)                                                                                                     \
    "{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"           \
    "\"num_attention_heads\":2,\"intermediate_size\":16,\"max_position_embeddings\":131072,"                             \
    "\"rope_scaling\":{\"type\":\"yarn\",\"original_max_position_embeddings\":32768" x "}}"
    const char *no_factor = YARN_CFG(""), *ms = YARN_CFG(",\"factor\":4,\"mscale\":2,\"mscale_all_dim\":1"),
               *untrunc = YARN_CFG(",\"factor\":4,\"truncate\":false");
#undef YARN_CFG
    ellm_status st = hf_config_parse(no_factor, strlen(no_factor), "config.json", &c, &err);
    CHECK(st == ELLM_OK && c.rope_scaling == HF_ROPE_YARN && c.rope_factor == 4.0 && c.yarn_attn_factor == 0,
          "yarn without a factor: %d, factor %g (%s)", (int)st, c.rope_factor, err.msg);
    st = hf_config_parse(ms, strlen(ms), "config.json", &c, &err);
    const double want = (0.2 * log(4.0) + 1) / (0.1 * log(4.0) + 1);
    CHECK(st == ELLM_OK && fabs(c.yarn_attn_factor - want) < 1e-12, "yarn mscale 2 / mscale_all_dim 1: %d, %g (want %g)",
          (int)st, c.yarn_attn_factor, want);
    st = hf_config_parse(untrunc, strlen(untrunc), "config.json", &c, &err);
    CHECK(st == ELLM_ERR_UNSUPPORTED && strstr(err.msg, "truncate"), "yarn truncate false: %d '%s'", (int)st, err.msg);
}

/* ---- tokenizer.json vocabularies ---- */

/* Converts HF tokenizer folder `hf` into a vocab-only GGUF and encodes the
 * strings of `inp` with it, against the ids of `out`. */
static void vocab_case(const char *hf, const char *inp, const char *out, const char *want_model, const char *want_pre) {
    cv_vocab v;
    ellm_error err = {0};
    char dir[512];
    snprintf(dir, sizeof dir, "%s", test_data_path(hf));
    ellm_status st = cv_vocab_load(dir, 0, &v, &err);
    CHECK(st == ELLM_OK, "%s: %s", hf, err.msg);
    if (st) return;
    CHECK(!strcmp(v.model, want_model) && !strcmp(v.pre, want_pre), "%s: model %s pre %s (want %s %s)", hf, v.model,
          v.pre, want_model, want_pre);
    gguf_writer *w = NULL;
    char path[700];
    snprintf(path, sizeof path, "%s/vocab-%s.gguf", test_tmp_dir(), want_pre);
    gguf_writer_init(&w, &err);
    gguf_writer_add_str(w, "general.architecture", "llama", &err);
    st = cv_vocab_write(&v, w, &err);
    if (st == ELLM_OK) st = gguf_writer_write(w, path, &err);
    CHECK(st == ELLM_OK, "%s: %s", hf, err.msg);
    gguf_writer_free(w);
    cv_vocab_free(&v);
    gguf_file *g = NULL;
    tokenizer *t = NULL;
    if (st || gguf_open(path, &g, &err) || tokenizer_init_gguf(g, &t, &err)) {
        CHECK(0, "%s: %s", hf, err.msg);
        gguf_close(g);
        return;
    }
    char ipath[700], opath[700];
    snprintf(ipath, sizeof ipath, "%s", test_data_path(inp));
    snprintf(opath, sizeof opath, "%s", test_data_path(out));
    char *in = test_read_file(ipath, NULL), *ex = test_read_file(opath, NULL);
    CHECK(in && ex, "%s / %s", ipath, opath);
    int n_ok = 0, n_all = 0;
    char *s = in, *line = ex;
    while (in && ex && s && *line) {
        char *sep = strstr(s, SEP);
        size_t len = sep ? (size_t)(sep - s) : strlen(s);
        char *nl = strchr(line, '\n');
        size_t ll = nl ? (size_t)(nl - line) : strlen(line);
        int ne, ng;
        int32_t *want = parse_ids(line, ll, &ne);
        int32_t *got = encode(t, s, len, 0, 0, &ng, NULL);
        int ok = got && ng == ne && !memcmp(got, want, (size_t)ne * 4);
        if (!ok) fprintf(stderr, "%s: string %d ('%.*s') differs\n", hf, n_all, (int)(len > 40 ? 40 : len), s);
        n_ok += ok;
        n_all++;
        free(want);
        free(got);
        if (!sep || !nl) break;
        s = sep + strlen(SEP);
        line = nl + 1;
    }
    CHECK(n_all > 10 && n_ok == n_all, "%s: %d of %d strings tokenize as the reference", hf, n_ok, n_all);
    printf("tokenizer.json %-7s -> GGUF %s/%s: %d/%d reference strings exact\n", hf + 3, want_model, want_pre, n_ok,
           n_all);
    free(in);
    free(ex);
    tokenizer_free(t);
    gguf_close(g);
}

/* ---- fuzz reproducers (tests/data/fuzz/README.md) ---- */

/* A fuzz_convert input (type byte, config.json, NUL, model.safetensors) as
 * a checkpoint folder with the fuzzer's tokenizer.model; *type gets the
 * output type its first byte picks. NULL if the file is not such an input. */
static const char *fuzz_convert_dir(const char *input, const char *name, const char **type) {
    size_t n = 0;
    char *b = test_read_file(test_data_path(input), &n);
    const char *nul = b && n > 1 ? memchr(b + 1, 0, n - 1) : NULL;
    CHECK(nul != NULL, "%s", input);
    if (!nul) {
        free(b);
        return NULL;
    }
    const char *dir = new_dir(name);
    char path[800];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    fwrite(b + 1, 1, (size_t)(nul - b - 1), f);
    fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    fwrite(nul + 1, 1, n - (size_t)(nul + 1 - b), f);
    fclose(f);
    hfw_copy_file(test_data_path("fuzz/tok16.model"), dir, "tokenizer.model");
    int n_types;
    const convert_type *types = convert_types(&n_types);
    *type = types[(unsigned char)b[0] % n_types].name;
    free(b);
    return dir;
}

/* Inputs the fuzz targets of fuzz/ once crashed on, replayed through the
 * same entry points: each must now fail cleanly (or load) as stated. */
static void test_fuzz_reproducers(void) {
    size_t n = 0;
    char *b = test_read_file(test_data_path("fuzz/safetensors-empty-header"), &n);
    st_set *s = NULL;
    ellm_error err = {0};
    /* fuzz_safetensors: a header with no tensors ("{}") sorted and searched
     * a NULL array (undefined behaviour); it is a valid, empty file. */
    CHECK(b && st_open_memory(b, n, "empty.safetensors", &s, &err) == ELLM_OK && s && st_n_tensors(s) == 0 &&
              st_find(s, "w") == NULL,
          "empty safetensors header: %s", err.msg);
    st_close(s);
    free(b);
    /* fuzz_convert: a tensor holding NaN (and values past F16's range)
     * reached the quantizers (a NaN to int conversion). */
    char out[800];
    const char *type = NULL;
    const char *dir = fuzz_convert_dir("fuzz/convert-nan-weight", "fuzz-nan", &type);
    if (!dir) return;
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    convert_params p = {.type = type, .n_threads = 2};
    ellm_status st = convert_hf_to_gguf(dir, out, &p, NULL, &err);
    /* (The first bad value of the file is a huge one, before its NaN.) */
    CHECK(st == ELLM_ERR_FORMAT && strstr(err.msg, "model.safetensors") && strstr(err.msg, " holds ") &&
              strstr(err.msg, "column") && (strstr(err.msg, "NaN") || strstr(err.msg, "F16 range")),
          "NaN weight (%s): status %d, '%s'", type, st, err.msg);
    printf("fuzz reproducer (NaN weight, %s): %s\n", type, err.msg);
    DIR *d = opendir(dir);
    int left = 0;
    for (struct dirent *e; d && (e = readdir(d));) left += !strncmp(e->d_name, "out.gguf", 8);
    if (d) closedir(d);
    CHECK(left == 0, "NaN weight: %d output files left", left);
    /* fuzz_convert: a safetensors header of odd length put every BF16
     * tensor at an odd address, which the scalar dequantizer read as 2-byte
     * elements (misaligned loads, found by UBSan; test_odd_offsets covers
     * the conversion). Its random weights hold NaN: refused by name. */
    dir = fuzz_convert_dir("fuzz/convert-bf16-odd-offset", "fuzz-odd", &type);
    if (!dir) return;
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    p.type = type;
    st = convert_hf_to_gguf(dir, out, &p, NULL, &err);
    CHECK(st == ELLM_ERR_FORMAT && strstr(err.msg, "model.embed_tokens.weight") && strstr(err.msg, "NaN"),
          "BF16 at odd offsets (%s): status %d, '%s'", type, st, err.msg);
}

static void test_vocab(void) {
    vocab_case("hf/llama3", "vocab/ggml-vocab-llama-bpe.gguf.inp", "vocab/ggml-vocab-llama-bpe.gguf.out", "gpt2",
               "llama-bpe");
    vocab_case("hf/qwen3", "vocab/ggml-vocab-qwen2.gguf.inp", "vocab/ggml-vocab-qwen2.gguf.out", "gpt2", "qwen2");
    vocab_case("hf/llama2", "vocab/ggml-vocab-llama-spm.gguf.inp", "hf/llama2/vectors.out", "llama", "default");
}

int main(void) {
    load_test_ids();
    test_safetensors();
    test_sp_model();
    roundtrip("models/evalmodel.gguf", "LlamaForCausalLM", "evalmodel", NULL);
    roundtrip("tests/data/models/llama-gqa.gguf", "LlamaForCausalLM", "llama-gqa", NULL);
    roundtrip("tests/data/models/llama-gqa.gguf", "MistralForCausalLM", "llama-gqa-as-mistral", NULL);
    roundtrip("tests/data/models/qwen2-bias.gguf", "Qwen2ForCausalLM", "qwen2-bias", NULL);
    roundtrip("tests/data/models/qwen3-qknorm.gguf", "Qwen3ForCausalLM", "qwen3-qknorm", NULL);
    roundtrip("tests/data/models/llama-untied-ropefreqs.gguf", "LlamaForCausalLM", "llama-untied-ropefreqs",
              "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
              "\"original_max_position_embeddings\": 8192}");
    /* YaRN: the converted file reads as the source does (its keys and logits) */
    roundtrip("tests/data/models/qwen2-yarn.gguf", "Qwen2ForCausalLM", "qwen2-yarn",
              "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 4096}");
    roundtrip("tests/data/models/qwen2-yarn-betas.gguf", "Qwen2ForCausalLM", "qwen2-yarn-betas",
              "{\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 4096, \"beta_fast\": 16, "
              "\"beta_slow\": 2, \"attention_factor\": 1.2}");
    char evaldir[700];
    snprintf(evaldir, sizeof evaldir, "%s/evalmodel", test_tmp_dir());
    test_types(evaldir);
    snprintf(evaldir, sizeof evaldir, "%s/llama-gqa", test_tmp_dir());
    test_4bit_types(evaldir);
    test_gptq();
    test_imatrix(evaldir);
    test_dtypes_and_shards();
    test_odd_offsets();
    test_bad_input();
    test_fuzz_reproducers();
    test_vocab();
    return test_finish();
}
