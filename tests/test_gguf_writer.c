/* GGUF writer: files with every metadata type and tensors of every type are
 * written, read back with the gguf reader and compared value by value and byte
 * by byte; errors (bad arguments, full disk, failing row callbacks) are checked;
 * and `ellm synth` of the small test shapes is read back for names, shapes,
 * types, tokenizer and weight statistics. */
#include "harness.h"

#include "core/status.h"
#include "kernels/quant.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

/* The CLI is not part of libellm.a, so `ellm synth` and its argument helpers
 * are compiled into this test directly. */
#include "cli/args.c"
#include "cli/cmd_synth.c"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* A unique temporary path (the file is created empty). */
static void tmp_path(char *buf, size_t cap, const char *tag) {
    const char *dir = getenv("TMPDIR");
    snprintf(buf, cap, "%s/ellm-test-%s-XXXXXX", dir && *dir ? dir : "/tmp", tag);
    int fd = mkstemp(buf);
    if (fd >= 0) close(fd);
}

static uint64_t tw_rng = 0x1234567;
static uint8_t tw_byte(void) {
    tw_rng = tw_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint8_t)(tw_rng >> 56);
}

/* ---- every metadata type ---- */

static const uint8_t v_u8 = 250;
static const int8_t v_i8 = -100;
static const uint16_t v_u16 = 65000;
static const int16_t v_i16 = -32000;
static const uint32_t v_u32 = 4000000000u;
static const int32_t v_i32 = -2000000000;
static const uint64_t v_u64 = 9000000000000000000ull;
static const int64_t v_i64 = -9000000000000000000ll;
static const float v_f32 = 3.25f;
static const double v_f64 = -1.0e300;
static const char v_str_nul[] = {'a', 0, 'b'}; /* embedded NUL */

static const uint8_t a_u8[] = {0, 1, 255};
static const int8_t a_i8[] = {-128, 0, 127};
static const uint16_t a_u16[] = {0, 65535};
static const int16_t a_i16[] = {-32768, 32767, 5};
static const uint32_t a_u32[] = {1, 2, 3, 4294967295u};
static const int32_t a_i32[] = {-1, 0, 2147483647};
static const uint64_t a_u64[] = {18446744073709551615ull, 7};
static const int64_t a_i64[] = {-9223372036854775807ll - 1, 9223372036854775807ll};
static const float a_f32[] = {1.5f, -2.25f, 1e-30f};
static const double a_f64[] = {3.141592653589793, -0.0};
static const uint8_t a_bool[] = {1, 0, 1, 1};
static const char *const a_str[] = {"", "hello", "<0x0A>", "\xe2\x96\x81the"};

static void add_all_kvs(gguf_writer *w) {
    ellm_error err;
    CHECK(gguf_writer_add_u8(w, "t.u8", v_u8, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_i8(w, "t.i8", v_i8, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_u16(w, "t.u16", v_u16, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_i16(w, "t.i16", v_i16, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_u32(w, "t.u32", v_u32, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_i32(w, "t.i32", v_i32, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_u64(w, "t.u64", v_u64, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_i64(w, "t.i64", v_i64, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_f32(w, "t.f32", v_f32, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_f64(w, "t.f64", v_f64, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_bool(w, "t.true", 7, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_bool(w, "t.false", 0, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_str(w, "t.str", "llama", &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_str(w, "t.str_empty", "", &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_strn(w, "t.str_nul", v_str_nul, 3, &err) == ELLM_OK, "%s", err.msg);
#define ADD_ARR(key, T, a) \
    CHECK(gguf_writer_add_arr(w, key, T, a, sizeof a / sizeof a[0], &err) == ELLM_OK, "%s", err.msg)
    ADD_ARR("a.u8", GGUF_TYPE_UINT8, a_u8);
    ADD_ARR("a.i8", GGUF_TYPE_INT8, a_i8);
    ADD_ARR("a.u16", GGUF_TYPE_UINT16, a_u16);
    ADD_ARR("a.i16", GGUF_TYPE_INT16, a_i16);
    ADD_ARR("a.u32", GGUF_TYPE_UINT32, a_u32);
    ADD_ARR("a.i32", GGUF_TYPE_INT32, a_i32);
    ADD_ARR("a.u64", GGUF_TYPE_UINT64, a_u64);
    ADD_ARR("a.i64", GGUF_TYPE_INT64, a_i64);
    ADD_ARR("a.f32", GGUF_TYPE_FLOAT32, a_f32);
    ADD_ARR("a.f64", GGUF_TYPE_FLOAT64, a_f64);
    ADD_ARR("a.bool", GGUF_TYPE_BOOL, a_bool);
#undef ADD_ARR
    CHECK(gguf_writer_add_arr(w, "a.empty", GGUF_TYPE_INT32, NULL, 0, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_arr_str(w, "a.str", a_str, NULL, 4, &err) == ELLM_OK, "%s", err.msg);
    const char *with_nul[] = {v_str_nul, "xy"};
    const size_t lens[] = {3, 2};
    CHECK(gguf_writer_add_arr_str(w, "a.str_len", with_nul, lens, 2, &err) == ELLM_OK, "%s", err.msg);
}

#define N_TEST_KV 29 /* pairs added by add_all_kvs */

static void check_arr(const gguf_file *f, const char *key, gguf_value_type type, const void *want,
                      uint64_t n_want, size_t elem) {
    ellm_error err = {0};
    gguf_value_type et = GGUF_TYPE_COUNT;
    uint64_t n = 0;
    const void *data = NULL;
    CHECK(gguf_get_arr(f, key, &et, &n, &data, &err) == ELLM_OK, "%s: %s", key, err.msg);
    CHECK(et == type && n == n_want, "%s: type %d n %llu", key, (int)et, (unsigned long long)n);
    if (n == n_want && n) CHECK(data && memcmp(data, want, n * elem) == 0, "%s: values differ", key);
}

static void check_all_kvs(const gguf_file *f) {
    ellm_error err = {0};
    int64_t iv = 0;
    double fv = 0;
    int bv = -1;
#define CHECK_INT(key, T, want)                                                                     \
    do {                                                                                            \
        int64_t k_ = gguf_find_key(f, key);                                                        \
        CHECK(k_ >= 0 && gguf_kv_type(f, k_) == T, "%s: missing or wrong type", key);             \
        CHECK(gguf_get_i64(f, key, &iv, &err) == ELLM_OK && iv == (int64_t)(want), "%s: %lld (%s)", \
              key, (long long)iv, err.msg);                                                         \
    } while (0)
    CHECK_INT("t.u8", GGUF_TYPE_UINT8, v_u8);
    CHECK_INT("t.i8", GGUF_TYPE_INT8, v_i8);
    CHECK_INT("t.u16", GGUF_TYPE_UINT16, v_u16);
    CHECK_INT("t.i16", GGUF_TYPE_INT16, v_i16);
    CHECK_INT("t.u32", GGUF_TYPE_UINT32, v_u32);
    CHECK_INT("t.i32", GGUF_TYPE_INT32, v_i32);
    CHECK_INT("t.u64", GGUF_TYPE_UINT64, v_u64);
    CHECK_INT("t.i64", GGUF_TYPE_INT64, v_i64);
#undef CHECK_INT
    CHECK(gguf_kv_type(f, gguf_find_key(f, "t.f32")) == GGUF_TYPE_FLOAT32, "t.f32 type");
    CHECK(gguf_get_f64(f, "t.f32", &fv, &err) == ELLM_OK && fv == (double)v_f32, "t.f32: %g", fv);
    CHECK(gguf_kv_type(f, gguf_find_key(f, "t.f64")) == GGUF_TYPE_FLOAT64, "t.f64 type");
    CHECK(gguf_get_f64(f, "t.f64", &fv, &err) == ELLM_OK && fv == v_f64, "t.f64: %g", fv);
    CHECK(gguf_kv_type(f, gguf_find_key(f, "t.true")) == GGUF_TYPE_BOOL, "t.true type");
    CHECK(gguf_get_bool(f, "t.true", &bv, &err) == ELLM_OK && bv == 1, "t.true: %d", bv);
    CHECK(gguf_get_bool(f, "t.false", &bv, &err) == ELLM_OK && bv == 0, "t.false: %d", bv);
    const char *s = NULL;
    size_t len = 99;
    CHECK(gguf_get_str(f, "t.str", &s, &len, &err) == ELLM_OK && len == 5 && !memcmp(s, "llama", 5), "t.str");
    CHECK(gguf_get_str(f, "t.str_empty", &s, &len, &err) == ELLM_OK && len == 0, "t.str_empty: %zu", len);
    CHECK(gguf_get_str(f, "t.str_nul", &s, &len, &err) == ELLM_OK && len == 3 && !memcmp(s, v_str_nul, 3),
          "t.str_nul");
    check_arr(f, "a.u8", GGUF_TYPE_UINT8, a_u8, 3, 1);
    check_arr(f, "a.i8", GGUF_TYPE_INT8, a_i8, 3, 1);
    check_arr(f, "a.u16", GGUF_TYPE_UINT16, a_u16, 2, 2);
    check_arr(f, "a.i16", GGUF_TYPE_INT16, a_i16, 3, 2);
    check_arr(f, "a.u32", GGUF_TYPE_UINT32, a_u32, 4, 4);
    check_arr(f, "a.i32", GGUF_TYPE_INT32, a_i32, 3, 4);
    check_arr(f, "a.u64", GGUF_TYPE_UINT64, a_u64, 2, 8);
    check_arr(f, "a.i64", GGUF_TYPE_INT64, a_i64, 2, 8);
    check_arr(f, "a.f32", GGUF_TYPE_FLOAT32, a_f32, 3, 4);
    check_arr(f, "a.f64", GGUF_TYPE_FLOAT64, a_f64, 2, 8);
    check_arr(f, "a.bool", GGUF_TYPE_BOOL, a_bool, 4, 1);
    check_arr(f, "a.empty", GGUF_TYPE_INT32, NULL, 0, 4);

    gguf_value_type et;
    uint64_t n = 0;
    const void *data;
    int64_t k = gguf_find_key(f, "a.str");
    CHECK(gguf_get_arr(f, "a.str", &et, &n, &data, &err) == ELLM_OK && et == GGUF_TYPE_STRING && n == 4,
          "a.str: %llu", (unsigned long long)n);
    for (uint64_t i = 0; i < 4 && i < n; i++) {
        CHECK(gguf_get_arr_str(f, k, i, &s, &len) == ELLM_OK && len == strlen(a_str[i]) &&
                  !memcmp(s, a_str[i], len),
              "a.str[%llu]", (unsigned long long)i);
    }
    k = gguf_find_key(f, "a.str_len");
    CHECK(gguf_get_arr_str(f, k, 0, &s, &len) == ELLM_OK && len == 3 && !memcmp(s, v_str_nul, 3), "a.str_len[0]");
    CHECK(gguf_get_arr_str(f, k, 1, &s, &len) == ELLM_OK && len == 2 && !memcmp(s, "xy", 2), "a.str_len[1]");
}

/* ---- tensors of every type ---- */

typedef struct {
    const char *name;
    int type;
    int n_dims;
    int64_t ne[4];
    int by_rows; /* data from the row callback instead of a pointer */
    unsigned char *data;
    size_t n_bytes;
} test_tensor;

static test_tensor test_tensors[] = {
    {"f32.1d", QTYPE_F32, 1, {7, 1, 1, 1}, 0, NULL, 0},
    {"f32.4d.rows", QTYPE_F32, 4, {3, 2, 2, 2}, 1, NULL, 0},
    {"f16.2d", QTYPE_F16, 2, {5, 3, 1, 1}, 0, NULL, 0},
    {"bf16.3d.rows", QTYPE_BF16, 3, {4, 3, 2, 1}, 1, NULL, 0},
    {"q8_0.2d", QTYPE_Q8_0, 2, {64, 3, 1, 1}, 0, NULL, 0},
    {"q8_0.2d.rows", QTYPE_Q8_0, 2, {32, 5, 1, 1}, 1, NULL, 0},
    {"q4_0.2d", QTYPE_Q4_0, 2, {96, 2, 1, 1}, 0, NULL, 0},
    {"q4_k.2d.rows", QTYPE_Q4_K, 2, {512, 3, 1, 1}, 1, NULL, 0},
    {"q6_k.2d", QTYPE_Q6_K, 2, {256, 2, 1, 1}, 0, NULL, 0},
    {"q6_k.1d.rows", QTYPE_Q6_K, 1, {256, 1, 1, 1}, 1, NULL, 0},
};
#define N_TEST_TENSORS (int)(sizeof test_tensors / sizeof test_tensors[0])

/* Row callback: copies row `row` of the tensor's reference bytes. */
static ellm_status tw_rows(void *user, int64_t row, void *dst, size_t n_bytes, ellm_error *err) {
    test_tensor *t = user;
    size_t row_bytes = qtype_row_bytes(t->type, t->ne[0]);
    if (n_bytes != row_bytes) return ellm_fail(err, ELLM_ERR_ARG, "row size %zu, want %zu", n_bytes, row_bytes);
    memcpy(dst, t->data + (size_t)row * row_bytes, n_bytes);
    return ELLM_OK;
}

static void make_test_tensors(void) {
    for (int i = 0; i < N_TEST_TENSORS; i++) {
        test_tensor *t = &test_tensors[i];
        t->n_bytes = qtype_row_bytes(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        t->data = malloc(t->n_bytes);
        /* Any bytes: the writer and reader do not interpret tensor data. */
        for (size_t j = 0; j < t->n_bytes; j++) t->data[j] = tw_byte();
    }
}

static void add_test_tensors(gguf_writer *w) {
    ellm_error err;
    for (int i = 0; i < N_TEST_TENSORS; i++) {
        test_tensor *t = &test_tensors[i];
        ellm_status st = t->by_rows ? gguf_writer_add_tensor_rows(w, t->name, t->n_dims, t->ne, t->type, tw_rows, t, &err)
                                    : gguf_writer_add_tensor(w, t->name, t->n_dims, t->ne, t->type, t->data, &err);
        CHECK(st == ELLM_OK, "add %s: %s", t->name, err.msg);
    }
}

static void check_test_tensors(const gguf_file *f, size_t alignment) {
    CHECK(gguf_n_tensors(f) == N_TEST_TENSORS, "%lld tensors", (long long)gguf_n_tensors(f));
    for (int i = 0; i < N_TEST_TENSORS; i++) {
        const test_tensor *t = &test_tensors[i];
        const gguf_tensor *g = gguf_tensor_at(f, i);
        CHECK(g && !strcmp(g->name, t->name), "tensor %d is '%s', want '%s'", i, g ? g->name : "(none)", t->name);
        if (!g) continue;
        CHECK(gguf_find_tensor(f, t->name) == g, "%s: find", t->name);
        CHECK(g->n_dims == t->n_dims && g->type == t->type, "%s: n_dims %d type %d", t->name, g->n_dims, g->type);
        for (int d = 0; d < 4; d++)
            CHECK(g->ne[d] == t->ne[d], "%s: ne[%d] = %lld", t->name, d, (long long)g->ne[d]);
        CHECK(g->n_bytes == t->n_bytes, "%s: %zu bytes, want %zu", t->name, g->n_bytes, t->n_bytes);
        CHECK(g->offset % alignment == 0, "%s: offset %llu", t->name, (unsigned long long)g->offset);
        CHECK(((const unsigned char *)g->data - (const unsigned char *)gguf_base(f)) % alignment == 0,
              "%s: data not aligned to %zu", t->name, alignment);
        CHECK(g->n_bytes == t->n_bytes && !memcmp(g->data, t->data, t->n_bytes), "%s: data differs", t->name);
    }
}

static void test_roundtrip_file(void) {
    char path[256];
    tmp_path(path, sizeof path, "kv");
    gguf_writer *w = NULL;
    ellm_error err = {0};
    CHECK(gguf_writer_init(&w, &err) == ELLM_OK, "%s", err.msg);
    add_all_kvs(w);
    add_test_tensors(w);
    CHECK(gguf_writer_n_kv(w) == N_TEST_KV, "%lld kvs", (long long)gguf_writer_n_kv(w));
    CHECK(gguf_writer_n_tensors(w) == N_TEST_TENSORS, "n_tensors");
    uint64_t expect = gguf_writer_file_size(w);
    CHECK(gguf_writer_write(w, path, &err) == ELLM_OK, "write: %s", err.msg);
    gguf_writer_free(w);

    gguf_file *f = NULL;
    CHECK(gguf_open(path, &f, &err) == ELLM_OK, "open: %s", err.msg);
    if (f) {
        CHECK(gguf_version(f) == 3, "version %u", gguf_version(f));
        CHECK(gguf_alignment(f) == 32, "alignment %zu", gguf_alignment(f));
        CHECK(gguf_size(f) == expect, "size %zu, writer said %llu", gguf_size(f), (unsigned long long)expect);
        CHECK(gguf_size(f) % 32 == 0, "file size %zu not padded", gguf_size(f));
        CHECK(gguf_n_kv(f) == N_TEST_KV, "%lld kvs", (long long)gguf_n_kv(f));
        for (int64_t i = 0; i < gguf_n_kv(f) && i < 2; i++) /* order kept */
            CHECK(!strcmp(gguf_key_name(f, i), i ? "t.i8" : "t.u8"), "key %lld: %s", (long long)i,
                  gguf_key_name(f, i));
        check_all_kvs(f);
        check_test_tensors(f, 32);
        gguf_close(f);
    }
    unlink(path);
}

/* Same content through a FILE* into memory, 64-byte alignment, read back with
 * gguf_open_memory. */
static void test_roundtrip_memory(void) {
    char *buf = NULL;
    size_t size = 0;
    FILE *fp = open_memstream(&buf, &size);
    gguf_writer *w = NULL;
    ellm_error err = {0};
    CHECK(fp && gguf_writer_init(&w, &err) == ELLM_OK, "init");
    if (!fp || !w) return;
    CHECK(gguf_writer_set_alignment(w, 64, &err) == ELLM_OK, "%s", err.msg);
    add_all_kvs(w);
    add_test_tensors(w);
    CHECK(gguf_writer_write_fp(w, fp, "memory", &err) == ELLM_OK, "write: %s", err.msg);
    uint64_t expect = gguf_writer_file_size(w);
    gguf_writer_free(w);
    fclose(fp);
    CHECK(size == expect, "wrote %zu bytes, writer said %llu", size, (unsigned long long)expect);

    /* The reader wants the buffer aligned like a mapping would be. */
    void *aligned = NULL;
    CHECK(posix_memalign(&aligned, 64, size ? size : 1) == 0, "posix_memalign");
    memcpy(aligned, buf, size);
    gguf_file *f = NULL;
    CHECK(gguf_open_memory(aligned, size, &f, &err) == ELLM_OK, "open: %s", err.msg);
    if (f) {
        CHECK(gguf_alignment(f) == 64, "alignment %zu", gguf_alignment(f));
        CHECK(gguf_get_i64(f, "general.alignment", &(int64_t){0}, &err) == ELLM_OK, "general.alignment");
        CHECK(gguf_n_kv(f) == N_TEST_KV + 1, "%lld kvs", (long long)gguf_n_kv(f));
        check_all_kvs(f);
        check_test_tensors(f, 64);
        gguf_close(f);
    }
    free(aligned);
    free(buf);
}

/* An empty file (no KVs, no tensors) is valid GGUF. */
static void test_empty(void) {
    char *buf = NULL;
    size_t size = 0;
    FILE *fp = open_memstream(&buf, &size);
    gguf_writer *w = NULL;
    ellm_error err = {0};
    gguf_writer_init(&w, &err);
    CHECK(gguf_writer_write_fp(w, fp, "memory", &err) == ELLM_OK, "%s", err.msg);
    gguf_writer_free(w);
    fclose(fp);
    CHECK(size == 32, "empty file is %zu bytes (24 header + padding)", size);
    gguf_file *f = NULL;
    CHECK(gguf_open_memory(buf, size, &f, &err) == ELLM_OK, "open: %s", err.msg);
    if (f) {
        CHECK(gguf_n_kv(f) == 0 && gguf_n_tensors(f) == 0, "counts");
        gguf_close(f);
    }
    free(buf);
}

/* ---- errors ---- */

static ellm_status fail_at_row_3(void *user, int64_t row, void *dst, size_t n_bytes, ellm_error *err) {
    memset(dst, 0, n_bytes);
    return row == 3 ? ellm_fail(err, ELLM_ERR_NOMEM, "generator ran dry") : ELLM_OK;
}

static void test_errors(void) {
    gguf_writer *w = NULL;
    ellm_error err = {0};
    gguf_writer_init(&w, &err);
    const int64_t ne_ok[2] = {32, 2}, ne_bad[2] = {100, 2}, ne_zero[2] = {32, 0};
    unsigned char data[4096] = {0};
    uint8_t bad_bool[2] = {0, 2};

    CHECK(gguf_writer_add_u32(w, "k", 1, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_u32(w, "k", 2, &err) == ELLM_ERR_ARG && strstr(err.msg, "duplicate"), "dup key: %s",
          err.msg);
    CHECK(gguf_writer_add_str(w, "", "x", &err) == ELLM_ERR_ARG, "empty key");
    CHECK(gguf_writer_add_arr(w, "b", GGUF_TYPE_BOOL, bad_bool, 2, &err) == ELLM_ERR_ARG, "bool 2");
    CHECK(gguf_writer_add_arr(w, "s", GGUF_TYPE_STRING, data, 1, &err) == ELLM_ERR_ARG, "string via add_arr");
    CHECK(gguf_writer_add_arr(w, "x", GGUF_TYPE_COUNT, data, 1, &err) == ELLM_ERR_ARG, "unknown elem type");
    CHECK(gguf_writer_set_alignment(w, 48, &err) == ELLM_ERR_ARG, "alignment 48");
    CHECK(gguf_writer_add_tensor(w, "t", 2, ne_ok, QTYPE_Q8_0, data, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_writer_add_tensor(w, "t", 2, ne_ok, QTYPE_Q8_0, data, &err) == ELLM_ERR_ARG, "dup tensor");
    CHECK(gguf_writer_add_tensor(w, "u", 2, ne_bad, QTYPE_Q4_K, data, &err) == ELLM_ERR_ARG &&
              strstr(err.msg, "multiple"),
          "ne0 100 for q4_K: %s", err.msg);
    CHECK(gguf_writer_add_tensor(w, "u", 2, ne_zero, QTYPE_F32, data, &err) == ELLM_ERR_ARG, "ne1 0");
    CHECK(gguf_writer_add_tensor(w, "u", 5, ne_ok, QTYPE_F32, data, &err) == ELLM_ERR_ARG, "5 dims");
    CHECK(gguf_writer_add_tensor(w, "u", 2, ne_ok, 4 /* retired Q4_2 */, data, &err) == ELLM_ERR_ARG,
          "type 4");
    CHECK(gguf_writer_add_tensor(w, "u", 2, ne_ok, QTYPE_F32, NULL, &err) == ELLM_ERR_ARG, "NULL data");
    char long_name[80];
    memset(long_name, 'n', 64);
    long_name[64] = 0;
    CHECK(gguf_writer_add_tensor(w, long_name, 2, ne_ok, QTYPE_F32, data, &err) == ELLM_ERR_ARG, "64-byte name");
    long_name[63] = 0;
    CHECK(gguf_writer_add_tensor(w, long_name, 2, ne_ok, QTYPE_F32, data, &err) == ELLM_OK, "63-byte name: %s",
          err.msg);

    /* The first failure sticks: the write refuses with its message. */
    char path[256];
    tmp_path(path, sizeof path, "err");
    CHECK(gguf_writer_write(w, path, &err) == ELLM_ERR_ARG && strstr(err.msg, "duplicate metadata key 'k'"),
          "sticky: %s", err.msg);
    gguf_writer_free(w);

    /* A failing row callback: its status and message, naming tensor and row;
     * the partial file is removed. */
    gguf_writer_init(&w, &err);
    const int64_t ne[2] = {32, 8};
    gguf_writer_add_tensor_rows(w, "gen", 2, ne, QTYPE_F32, fail_at_row_3, NULL, &err);
    CHECK(gguf_writer_write(w, path, &err) == ELLM_ERR_NOMEM && strstr(err.msg, "'gen' row 3") &&
              strstr(err.msg, "ran dry"),
          "callback failure: %s", err.msg);
    CHECK(access(path, F_OK) != 0, "partial file left behind");
    gguf_writer_free(w);

    /* A full disk. */
    gguf_writer_init(&w, &err);
    gguf_writer_add_tensor(w, "t", 2, ne_ok, QTYPE_F32, data, &err);
    FILE *full = fopen("/dev/full", "wb");
    if (full) {
        CHECK(gguf_writer_write_fp(w, full, "/dev/full", &err) == ELLM_ERR_IO && strstr(err.msg, "/dev/full") &&
                  strstr(err.msg, "space"),
              "disk full: %s", err.msg);
        fclose(full);
        /* Through the path API: reported, and the device is not unlinked. */
        CHECK(gguf_writer_write(w, "/dev/full", &err) == ELLM_ERR_IO, "disk full by path: %s", err.msg);
        CHECK(access("/dev/full", F_OK) == 0, "/dev/full removed");
    }
    CHECK(gguf_writer_write(w, "/nonexistent-dir/x.gguf", &err) == ELLM_ERR_IO && strstr(err.msg, "x.gguf"),
          "bad dir: %s", err.msg);
    gguf_writer_free(w);
}

/* ---- ellm synth ---- */

static int run_synth(const char *shape, const char *type, const char *out, const char *seed, int pure) {
    char vocab[512];
    snprintf(vocab, sizeof vocab, "%s/../../models/evalmodel.gguf", test_data_dir());
    char *argv[16];
    int argc = 0;
    argv[argc++] = "synth";
    argv[argc++] = "--shape";
    argv[argc++] = (char *)shape;
    argv[argc++] = "--type";
    argv[argc++] = (char *)type;
    argv[argc++] = "-o";
    argv[argc++] = (char *)out;
    argv[argc++] = "--vocab";
    argv[argc++] = vocab;
    if (seed) {
        argv[argc++] = "--seed";
        argv[argc++] = (char *)seed;
    }
    if (pure) argv[argc++] = "--pure";
    argv[argc] = NULL;
    return cmd_synth(argc, argv);
}

/* Mean and std of a tensor's dequantized values. */
static void tensor_stats(const gguf_tensor *t, double *mean, double *std) {
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    float *x = malloc((size_t)n * sizeof *x);
    qtype_dequantize_ref(t->type, t->data, x, n);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    *mean = s / n;
    *std = sqrt(s2 / n - *mean * *mean);
    free(x);
}

static const gguf_tensor *expect_tensor(const gguf_file *f, const char *name, int64_t ne0, int64_t ne1,
                                        int type) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    CHECK(t != NULL, "missing %s", name);
    if (!t) return NULL;
    CHECK(t->ne[0] == ne0 && t->ne[1] == ne1 && t->n_dims == (ne1 > 1 ? 2 : 1), "%s: [%lld, %lld] dims %d", name,
          (long long)t->ne[0], (long long)t->ne[1], t->n_dims);
    CHECK(t->type == type, "%s: type %d, want %d", name, t->type, type);
    return t;
}

/* A tensor a synth type's mix must have: name, shape and type. */
typedef struct {
    const char *name;
    int64_t ne0, ne1;
    int type;
} mix_tensor;

/* Writes `shape` as `type` (seed 7) to path and checks its
 * general.file_type and the tensors listed. */
static void check_mix(const char *path, const char *shape, const char *type, int64_t file_type, const mix_tensor *t,
                      int n) {
    gguf_file *f = NULL;
    ellm_error err = {0};
    int64_t v;
    CHECK(run_synth(shape, type, path, "7", 0) == 0, "synth %s %s", shape, type);
    CHECK(gguf_open(path, &f, &err) == ELLM_OK, "open %s: %s", type, err.msg);
    if (!f) return;
    CHECK(gguf_get_i64(f, "general.file_type", &v, &err) == ELLM_OK && v == file_type, "%s file_type %lld", type,
          (long long)v);
    for (int i = 0; i < n; i++) expect_tensor(f, t[i].name, t[i].ne0, t[i].ne1, t[i].type);
    gguf_close(f);
}

static void test_synth_tiny(void) {
    char path[256], path2[256];
    tmp_path(path, sizeof path, "synth");
    tmp_path(path2, sizeof path2, "synth2");
    CHECK(run_synth("tiny", "q4_k_m", path, "7", 0) == 0, "synth tiny q4_k_m");
    gguf_file *f = NULL, *src = NULL;
    ellm_error err = {0};
    char vocab[512];
    snprintf(vocab, sizeof vocab, "%s/../../models/evalmodel.gguf", test_data_dir());
    CHECK(gguf_open(vocab, &src, &err) == ELLM_OK, "%s", err.msg);
    CHECK(gguf_open(path, &f, &err) == ELLM_OK, "open synth: %s", err.msg);
    if (f && src) {
        const char *s;
        size_t len;
        int64_t v;
        CHECK(gguf_get_str(f, "general.architecture", &s, &len, &err) == ELLM_OK && len == 5 &&
                  !memcmp(s, "llama", 5),
              "arch");
        CHECK(gguf_get_i64(f, "llama.embedding_length", &v, &err) == ELLM_OK && v == 256, "d %lld", (long long)v);
        CHECK(gguf_get_i64(f, "llama.block_count", &v, &err) == ELLM_OK && v == 2, "layers");
        CHECK(gguf_get_i64(f, "llama.attention.head_count_kv", &v, &err) == ELLM_OK && v == 2, "kv heads");
        CHECK(gguf_get_i64(f, "general.file_type", &v, &err) == ELLM_OK && v == 15, "file_type %lld", (long long)v);
        CHECK(gguf_alignment(f) == 32, "alignment");
        /* 2 layers x 9 + token_embd + output_norm; tied: no output.weight. */
        CHECK(gguf_n_tensors(f) == 20, "%lld tensors", (long long)gguf_n_tensors(f));
        CHECK(gguf_find_tensor(f, "output.weight") == NULL, "tied model has output.weight");
        /* Q4_K_M mix: tied token_embd is the output (Q6_K); with 2 layers only
         * layer 1 gets the extra bits for attn_v/ffn_down. */
        expect_tensor(f, "token_embd.weight", 256, 2304, QTYPE_Q6_K);
        expect_tensor(f, "blk.0.attn_norm.weight", 256, 1, QTYPE_F32);
        const gguf_tensor *q = expect_tensor(f, "blk.0.attn_q.weight", 256, 256, QTYPE_Q4_K);
        expect_tensor(f, "blk.0.attn_k.weight", 256, 128, QTYPE_Q4_K);
        const gguf_tensor *vw = expect_tensor(f, "blk.0.attn_v.weight", 256, 128, QTYPE_Q4_K);
        expect_tensor(f, "blk.1.attn_v.weight", 256, 128, QTYPE_Q6_K);
        expect_tensor(f, "blk.0.attn_output.weight", 256, 256, QTYPE_Q4_K);
        expect_tensor(f, "blk.1.ffn_gate.weight", 256, 512, QTYPE_Q4_K);
        expect_tensor(f, "blk.1.ffn_up.weight", 256, 512, QTYPE_Q4_K);
        expect_tensor(f, "blk.0.ffn_down.weight", 512, 256, QTYPE_Q4_K);
        expect_tensor(f, "blk.1.ffn_down.weight", 512, 256, QTYPE_Q6_K);
        const gguf_tensor *norm = expect_tensor(f, "output_norm.weight", 256, 1, QTYPE_F32);
        const gguf_tensor *embd = gguf_find_tensor(f, "token_embd.weight");

        /* Weight scales: q is N(0, (2/sqrt(256))^2), v N(0, (1/16)^2),
         * embeddings N(0, 0.5^2), norms exactly 1. */
        double mean, std;
        if (q) {
            tensor_stats(q, &mean, &std);
            CHECK(fabs(std - 0.125) < 0.01 && fabs(mean) < 0.005, "attn_q mean %g std %g", mean, std);
        }
        if (vw) {
            tensor_stats(vw, &mean, &std);
            CHECK(fabs(std - 0.0625) < 0.005 && fabs(mean) < 0.005, "attn_v mean %g std %g", mean, std);
        }
        if (embd) {
            tensor_stats(embd, &mean, &std);
            CHECK(fabs(std - 0.5) < 0.02 && fabs(mean) < 0.01, "token_embd mean %g std %g", mean, std);
        }
        if (norm) {
            float one;
            int all_one = 1;
            for (int i = 0; i < 256; i++) {
                memcpy(&one, (const char *)norm->data + 4 * i, 4);
                all_one &= one == 1.0f;
            }
            CHECK(all_one, "output_norm is not all ones");
        }

        /* Tokenizer: the source's 2048 pieces, then <unusedN> up to 2304. */
        gguf_value_type et;
        uint64_t n = 0, n_src = 0;
        const void *data, *src_data;
        int64_t kt = gguf_find_key(f, "tokenizer.ggml.tokens"), ks = gguf_find_key(src, "tokenizer.ggml.tokens");
        CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, &data, &err) == ELLM_OK && n == 2304, "n tokens %llu",
              (unsigned long long)n);
        gguf_get_arr(src, "tokenizer.ggml.tokens", &et, &n_src, &src_data, &err);
        CHECK(n_src == 2048, "source has %llu pieces", (unsigned long long)n_src);
        int same = 1;
        for (uint64_t i = 0; i < n_src && i < n; i++) {
            const char *a, *b;
            size_t la, lb;
            gguf_get_arr_str(f, kt, i, &a, &la);
            gguf_get_arr_str(src, ks, i, &b, &lb);
            same &= la == lb && !memcmp(a, b, la);
        }
        CHECK(same, "copied pieces differ");
        CHECK(gguf_get_arr_str(f, kt, 2048, &s, &len) == ELLM_OK && len == 12 && !memcmp(s, "<unused2048>", 12),
              "piece 2048");
        CHECK(gguf_get_arr_str(f, kt, 2303, &s, &len) == ELLM_OK && len == 12 && !memcmp(s, "<unused2303>", 12),
              "piece 2303");
        const void *src_types, *src_scores;
        CHECK(gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &n, &data, &err) == ELLM_OK &&
                  et == GGUF_TYPE_INT32 && n == 2304,
              "token_type");
        gguf_get_arr(src, "tokenizer.ggml.token_type", &et, &n_src, &src_types, &err);
        CHECK(!memcmp(data, src_types, 2048 * 4), "copied token types differ");
        int32_t ty;
        memcpy(&ty, (const char *)data + 4 * 2300, 4);
        CHECK(ty == 5, "padding type %d", ty);
        CHECK(gguf_get_arr(f, "tokenizer.ggml.scores", &et, &n, &data, &err) == ELLM_OK &&
                  et == GGUF_TYPE_FLOAT32 && n == 2304,
              "scores");
        gguf_get_arr(src, "tokenizer.ggml.scores", &et, &n_src, &src_scores, &err);
        CHECK(!memcmp(data, src_scores, 2048 * 4), "copied scores differ");
        float sc;
        memcpy(&sc, (const char *)data + 4 * 2100, 4);
        CHECK(sc == -1e9f, "padding score %g", sc);
        /* Every other tokenizer key, same type and value. */
        const char *keys[] = {"tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                              "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token"};
        for (int i = 0; i < 5; i++) {
            int64_t a = gguf_find_key(f, keys[i]), b = gguf_find_key(src, keys[i]);
            CHECK(a >= 0 && b >= 0 && gguf_kv_type(f, a) == gguf_kv_type(src, b), "%s", keys[i]);
        }
        int64_t x = -1, y = -2;
        gguf_get_i64(f, "tokenizer.ggml.bos_token_id", &x, &err);
        gguf_get_i64(src, "tokenizer.ggml.bos_token_id", &y, &err);
        CHECK(x == y, "bos %lld vs %lld", (long long)x, (long long)y);
    }
    if (f) gguf_close(f);

    /* Same seed, same bytes; another seed, other weights. */
    CHECK(run_synth("tiny", "q4_k_m", path2, "7", 0) == 0, "synth again");
    size_t n1 = 0, n2 = 0;
    char *b1 = test_read_file(path, &n1), *b2 = test_read_file(path2, &n2);
    CHECK(b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1), "same seed gave different files");
    free(b2);
    CHECK(run_synth("tiny", "q4_k_m", path2, "8", 0) == 0, "synth seed 8");
    b2 = test_read_file(path2, &n2);
    CHECK(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1), "seed 8 gave the same file");
    free(b1);
    free(b2);

    /* qwen2: biases, untied output; n_embd 320 is not a multiple of 256, so
     * Q4_K rows fall back to Q5_0 and the output's Q6_K to Q8_0, as
     * llama-quantize does. */
    CHECK(run_synth("tiny-qwen2", "q4_k_m", path, NULL, 0) == 0, "synth tiny-qwen2");
    f = NULL;
    CHECK(gguf_open(path, &f, &err) == ELLM_OK, "open: %s", err.msg);
    if (f) {
        int64_t v = 0;
        CHECK(gguf_get_i64(f, "qwen2.attention.head_count", &v, &err) == ELLM_OK && v == 5, "heads");
        CHECK(gguf_n_tensors(f) == 2 * 12 + 3, "%lld tensors", (long long)gguf_n_tensors(f));
        expect_tensor(f, "token_embd.weight", 320, 2112, QTYPE_Q5_0);
        expect_tensor(f, "output.weight", 320, 2112, QTYPE_Q8_0);
        expect_tensor(f, "blk.0.attn_q.bias", 320, 1, QTYPE_F32);
        expect_tensor(f, "blk.1.attn_k.bias", 64, 1, QTYPE_F32);
        expect_tensor(f, "blk.1.attn_v.bias", 64, 1, QTYPE_F32);
        expect_tensor(f, "blk.0.attn_q.weight", 320, 320, QTYPE_Q5_0);
        expect_tensor(f, "blk.1.attn_v.weight", 320, 64, QTYPE_Q8_0);
        expect_tensor(f, "blk.0.ffn_down.weight", 768, 320, QTYPE_Q4_K);
        expect_tensor(f, "blk.1.ffn_down.weight", 768, 320, QTYPE_Q6_K);
        const gguf_tensor *out = gguf_find_tensor(f, "output.weight");
        if (out) {
            double mean, std;
            tensor_stats(out, &mean, &std);
            CHECK(fabs(std - 0.5) < 0.02, "output std %g", std);
        }
        gguf_close(f);
    }

    /* and Q5_K rows to Q5_1 */
    static const mix_tensor q5km_qwen2[] = {
        {"blk.0.attn_q.weight", 320, 320, QTYPE_Q5_1}, {"blk.1.ffn_up.weight", 320, 768, QTYPE_Q5_1},
        {"blk.0.ffn_down.weight", 768, 320, QTYPE_Q5_K}, {"output.weight", 320, 2112, QTYPE_Q8_0}};
    check_mix(path, "tiny-qwen2", "q5_k_m", 17, q5km_qwen2, 4);

    /* q5_k_m: Q5_K with Q6_K where q4_k_m has it (the tied output here) */
    static const mix_tensor q5km[] = {{"token_embd.weight", 256, 2304, QTYPE_Q6_K},
                                      {"blk.1.attn_q.weight", 256, 256, QTYPE_Q5_K}};
    check_mix(path, "tiny", "q5_k_m", 17, q5km, 2);
    /* q4_1, q5_0, q5_1: the base type with a Q6_K output, as llama-quantize writes them */
    static const mix_tensor q41[] = {{"token_embd.weight", 256, 2304, QTYPE_Q6_K},
                                     {"blk.1.ffn_down.weight", 512, 256, QTYPE_Q4_1}};
    check_mix(path, "tiny", "q4_1", 3, q41, 2);
    static const mix_tensor q50[] = {{"token_embd.weight", 256, 2304, QTYPE_Q6_K},
                                     {"blk.0.attn_v.weight", 256, 128, QTYPE_Q5_0}};
    check_mix(path, "tiny", "q5_0", 8, q50, 2);
    static const mix_tensor q51[] = {{"token_embd.weight", 256, 2304, QTYPE_Q6_K},
                                     {"blk.1.attn_q.weight", 256, 256, QTYPE_Q5_1}};
    check_mix(path, "tiny", "q5_1", 9, q51, 2);
    /* q3_k_m: Q3_K with llama-quantize's Q4_K/Q5_K attn_v (Q5_K in the first
     * two layers), ffn_down (Q5_K in the first sixteenth: none of 2 layers)
     * and attn_output; q2_k: Q2_K with Q3_K attn_v (2 query heads per KV
     * head here, under 4), ffn_down and attn_output */
    static const mix_tensor q3km[] = {
        {"token_embd.weight", 256, 2304, QTYPE_Q6_K},  {"blk.1.attn_q.weight", 256, 256, QTYPE_Q3_K},
        {"blk.1.ffn_up.weight", 256, 512, QTYPE_Q3_K}, {"blk.1.attn_v.weight", 256, 128, QTYPE_Q5_K},
        {"blk.0.ffn_down.weight", 512, 256, QTYPE_Q4_K}, {"blk.1.attn_output.weight", 256, 256, QTYPE_Q4_K}};
    check_mix(path, "tiny", "q3_k_m", 12, q3km, 6);
    static const mix_tensor q2k[] = {
        {"token_embd.weight", 256, 2304, QTYPE_Q6_K},    {"blk.0.attn_k.weight", 256, 128, QTYPE_Q2_K},
        {"blk.1.ffn_gate.weight", 256, 512, QTYPE_Q2_K}, {"blk.0.attn_v.weight", 256, 128, QTYPE_Q3_K},
        {"blk.1.ffn_down.weight", 512, 256, QTYPE_Q3_K}, {"blk.0.attn_output.weight", 256, 256, QTYPE_Q3_K}};
    check_mix(path, "tiny", "q2_k", 10, q2k, 6);

    /* Every type, pure: all matrices in that type. */
    const char *types[] = {"f32",  "f16",    "bf16",   "q8_0",   "q4_0", "q4_1",
                           "q5_0", "q5_1",   "q4_k_m", "q5_k_m", "q3_k_m", "q2_k"};
    const int qtypes[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16, QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1,
                          QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q3_K, QTYPE_Q2_K};
    for (int i = 0; i < (int)(sizeof types / sizeof *types); i++) {
        CHECK(run_synth("tiny", types[i], path, "1", 1) == 0, "synth tiny %s", types[i]);
        f = NULL;
        CHECK(gguf_open(path, &f, &err) == ELLM_OK, "open %s: %s", types[i], err.msg);
        if (!f) continue;
        expect_tensor(f, "token_embd.weight", 256, 2304, qtypes[i]);
        expect_tensor(f, "blk.1.ffn_down.weight", 512, 256, qtypes[i]);
        expect_tensor(f, "blk.1.ffn_norm.weight", 256, 1, QTYPE_F32);
        const gguf_tensor *k = gguf_find_tensor(f, "blk.1.attn_k.weight");
        if (k) {
            double mean, std;
            tensor_stats(k, &mean, &std);
            /* 2-bit rounding adds its own noise: Q2_K's std comes out ~9% high */
            const double tol = qtypes[i] == QTYPE_Q2_K ? 0.02 : 0.01;
            CHECK(fabs(std - 0.125) < tol, "%s attn_k std %g", types[i], std);
        }
        gguf_close(f);
    }
    if (src) gguf_close(src);

    /* Strict arguments. */
    CHECK(run_synth("gpt5", "q8_0", path, NULL, 0) == 2, "unknown shape");
    CHECK(run_synth("tiny", "q3_k", path, NULL, 0) == 2, "unknown type");
    CHECK(run_synth("tiny", "q8_0", path, "-1", 0) == 2, "negative seed");
    CHECK(run_synth("tiny", "q8_0", path, "12x", 0) == 2, "bad seed");
    char *no_out[] = {"synth", "--shape", "tiny", "--type", "q8_0", NULL};
    CHECK(cmd_synth(5, no_out) == 2, "missing -o");
    char *extra[] = {"synth", "--shape", "tiny", "--type", "q8_0", "-o", path, "stray", NULL};
    CHECK(cmd_synth(8, extra) == 2, "stray argument");
    char *no_val[] = {"synth", "--shape", NULL};
    CHECK(cmd_synth(2, no_val) == 2, "missing value");
    char *bad_vocab[] = {"synth", "--shape", "tiny", "--type", "q8_0", "-o", path, "--vocab", "/nonexistent.gguf", NULL};
    CHECK(cmd_synth(9, bad_vocab) == 1, "missing vocab file");
    unlink(path);
    unlink(path2);
}

int main(void) {
    make_test_tensors();
    test_roundtrip_file();
    test_roundtrip_memory();
    test_empty();
    test_errors();
    test_synth_tiny();
    for (int i = 0; i < N_TEST_TENSORS; i++) free(test_tensors[i].data);
    return test_finish();
}
