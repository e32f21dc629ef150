/* GGUF reader: known values of the fixtures in tests/data, round trips of
 * files built in memory (every value type, several tensor types, layouts and
 * alignments), and malformed input: every corruption must end in a specific
 * error whose message names the problem, never in a crash or an over-read
 * (buffers are malloc'ed at their exact size so AddressSanitizer sees any). */
#include "gguf/gguf.h"
#include "kernels/quant.h"
#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int contains(const char *s, const char *sub) { return sub == NULL || strstr(s, sub) != NULL; }

/* Compares a (pointer, length) string from the reader with a C string. */
static int str_eq(const char *s, size_t len, const char *want) {
    return s && len == strlen(want) && memcmp(s, want, len) == 0;
}

static uint32_t rd32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* ---- a tiny GGUF writer --------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void w_bytes(wbuf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void w_u8(wbuf *b, uint8_t v) { w_bytes(b, &v, 1); }
static void w_u16(wbuf *b, uint16_t v) { w_bytes(b, &v, 2); }
static void w_u32(wbuf *b, uint32_t v) { w_bytes(b, &v, 4); }
static void w_u64(wbuf *b, uint64_t v) { w_bytes(b, &v, 8); }
static void w_f32(wbuf *b, float v) { w_bytes(b, &v, 4); }
static void w_f64(wbuf *b, double v) { w_bytes(b, &v, 8); }
static void w_strn(wbuf *b, const char *s, size_t n) {
    w_u64(b, n);
    w_bytes(b, s, n);
}
static void w_str(wbuf *b, const char *s) { w_strn(b, s, strlen(s)); }
/* Key and value type; returns the offset of the type field. */
static size_t w_key(wbuf *b, const char *key, gguf_value_type t) {
    w_str(b, key);
    size_t at = b->n;
    w_u32(b, t);
    return at;
}

/* Element size and block shape of the tensor types the tests write, kept here
 * independently of kernels/quant.c. */
static size_t tensor_bytes(int type, const int64_t ne[4]) {
    int be, bb;
    switch (type) {
    case 0: be = 1, bb = 4; break;     /* f32 */
    case 1: be = 1, bb = 2; break;     /* f16 */
    case 3: be = 32, bb = 20; break;   /* q4_1 */
    case 8: be = 32, bb = 34; break;   /* q8_0 */
    case 12: be = 256, bb = 144; break; /* q4_k */
    case 30: be = 1, bb = 2; break;    /* bf16 */
    default: abort();
    }
    return (size_t)(ne[0] / be * bb) * (size_t)(ne[1] * ne[2] * ne[3]);
}

typedef struct {
    const char *name;
    int n_dims;
    int64_t ne[4];
    int type;
} tspec;

/* The default tensor set: several types and ranks; the last one is 28 bytes
 * so that the data after it is not a multiple of the alignment. */
static const tspec TENSORS[] = {
    {"token_embd.weight", 2, {64, 10, 1, 1}, 0},
    {"blk.0.w_q4k", 2, {256, 3, 1, 1}, 12},
    {"blk.0.w_q8", 2, {64, 2, 1, 1}, 8},
    {"blk.0.w_q41", 1, {32, 1, 1, 1}, 3},
    {"blk.0.bf16_3d", 3, {4, 3, 2, 1}, 30},
    {"blk.0.f16_4d", 4, {2, 2, 2, 2}, 1},
    {"output_norm.weight", 1, {7, 1, 1, 1}, 0},
};
#define N_TENSORS ((int)(sizeof TENSORS / sizeof TENSORS[0]))

typedef struct {
    uint32_t version;      /* 0: 3 */
    size_t alignment;      /* 0: no general.alignment key (default 32) */
    int all_kvs;           /* write one pair of every value type */
    int dup_key;           /* write "t.u8" twice */
    int reverse_data;      /* lay tensor data out in reverse directory order */
    int no_data;           /* stop after the padding (data section not written) */
    int n_vocab;           /* write tokenizer.ggml.tokens with this many "tok<i>" */
    const tspec *tensors;  /* NULL: TENSORS */
    int n_tensors;
} build_opts;

/* Offsets of fields in a built file, so a test can corrupt one at a time. */
typedef struct {
    size_t n_tensors, n_kv;
    size_t key0_len;             /* length prefix of the first key */
    size_t u8_type;              /* value type of "t.u8" */
    size_t arr_i32_elem_type;    /* element type of "t.arr_i32" */
    size_t arr_str_count;        /* count of "t.arr_str" */
    size_t arr_str_elem1;        /* length prefix of its element 1 */
    size_t align_value;          /* value of general.alignment (0 if absent) */
    size_t t_name[16], t_ndims[16], t_ne[16], t_type[16], t_offset[16];
    uint64_t t_data_off[16];     /* offset written for each tensor */
    size_t dir_end, data_off;
} marks;

/* Byte j of tensor i's data: a pattern that differs between tensors. */
static uint8_t pattern(int i, size_t j) { return (uint8_t)(i * 31 + j * 7 + 1); }

static const char *ARR_STR[] = {"a", "", "hello world", "\xe2\x96\x81x"};

/* Builds a GGUF file in memory; the caller frees the result. */
static uint8_t *build(const build_opts *o, size_t *size, marks *m) {
    wbuf b = {0};
    marks mk;
    memset(&mk, 0, sizeof mk);
    const tspec *ts = o->tensors ? o->tensors : TENSORS;
    int nt = o->tensors ? o->n_tensors : N_TENSORS;
    size_t align = o->alignment ? o->alignment : 32;

    w_bytes(&b, "GGUF", 4);
    w_u32(&b, o->version ? o->version : 3);
    mk.n_tensors = b.n;
    w_u64(&b, (uint64_t)nt);
    mk.n_kv = b.n;
    w_u64(&b, 0); /* patched below */
    uint64_t n_kv = 0;

    mk.key0_len = b.n;
    w_key(&b, "general.architecture", GGUF_TYPE_STRING), w_str(&b, "test"), n_kv++;
    if (o->alignment) {
        w_key(&b, "general.alignment", GGUF_TYPE_UINT32);
        mk.align_value = b.n;
        w_u32(&b, (uint32_t)o->alignment), n_kv++;
    }
    if (o->all_kvs) {
        mk.u8_type = w_key(&b, "t.u8", GGUF_TYPE_UINT8), w_u8(&b, 200), n_kv++;
        w_key(&b, "t.i8", GGUF_TYPE_INT8), w_u8(&b, (uint8_t)-100), n_kv++;
        w_key(&b, "t.u16", GGUF_TYPE_UINT16), w_u16(&b, 60000), n_kv++;
        w_key(&b, "t.i16", GGUF_TYPE_INT16), w_u16(&b, (uint16_t)-30000), n_kv++;
        w_key(&b, "t.u32", GGUF_TYPE_UINT32), w_u32(&b, 4000000000u), n_kv++;
        w_key(&b, "t.i32", GGUF_TYPE_INT32), w_u32(&b, (uint32_t)-2000000000), n_kv++;
        w_key(&b, "t.f32", GGUF_TYPE_FLOAT32), w_f32(&b, 1.5f), n_kv++;
        w_key(&b, "t.bool", GGUF_TYPE_BOOL), w_u8(&b, 1), n_kv++;
        w_key(&b, "t.false", GGUF_TYPE_BOOL), w_u8(&b, 0), n_kv++;
        w_key(&b, "t.str", GGUF_TYPE_STRING), w_str(&b, "hello, gguf"), n_kv++;
        w_key(&b, "t.empty_str", GGUF_TYPE_STRING), w_str(&b, ""), n_kv++;
        w_key(&b, "t.u64", GGUF_TYPE_UINT64), w_u64(&b, 1234567890123ull), n_kv++;
        w_key(&b, "t.u64_big", GGUF_TYPE_UINT64), w_u64(&b, (1ull << 63) + 5), n_kv++;
        w_key(&b, "t.i64", GGUF_TYPE_INT64), w_u64(&b, (uint64_t)-9000000000000000000ll), n_kv++;
        w_key(&b, "t.f64", GGUF_TYPE_FLOAT64), w_f64(&b, 3.25), n_kv++;

        w_key(&b, "t.arr_u8", GGUF_TYPE_ARRAY), w_u32(&b, GGUF_TYPE_UINT8), w_u64(&b, 3);
        w_u8(&b, 1), w_u8(&b, 2), w_u8(&b, 3), n_kv++;
        w_key(&b, "t.arr_i32", GGUF_TYPE_ARRAY);
        mk.arr_i32_elem_type = b.n;
        w_u32(&b, GGUF_TYPE_INT32), w_u64(&b, 4);
        w_u32(&b, (uint32_t)-1), w_u32(&b, 2), w_u32(&b, (uint32_t)-3), w_u32(&b, 4), n_kv++;
        w_key(&b, "t.arr_f32", GGUF_TYPE_ARRAY), w_u32(&b, GGUF_TYPE_FLOAT32), w_u64(&b, 2);
        w_f32(&b, 0.5f), w_f32(&b, -2.0f), n_kv++;
        w_key(&b, "t.arr_f64", GGUF_TYPE_ARRAY), w_u32(&b, GGUF_TYPE_FLOAT64), w_u64(&b, 1);
        w_f64(&b, -0.125), n_kv++;
        w_key(&b, "t.arr_u64", GGUF_TYPE_ARRAY), w_u32(&b, GGUF_TYPE_UINT64), w_u64(&b, 2);
        w_u64(&b, 7), w_u64(&b, UINT64_MAX), n_kv++;
        w_key(&b, "t.arr_bool", GGUF_TYPE_ARRAY), w_u32(&b, GGUF_TYPE_BOOL), w_u64(&b, 2);
        w_u8(&b, 0), w_u8(&b, 1), n_kv++;
        w_key(&b, "t.arr_str", GGUF_TYPE_ARRAY), w_u32(&b, GGUF_TYPE_STRING);
        mk.arr_str_count = b.n;
        w_u64(&b, 4);
        for (int i = 0; i < 4; i++) {
            if (i == 1) mk.arr_str_elem1 = b.n;
            w_str(&b, ARR_STR[i]);
        }
        n_kv++;
        w_key(&b, "t.arr_empty", GGUF_TYPE_ARRAY), w_u32(&b, GGUF_TYPE_INT32), w_u64(&b, 0), n_kv++;
        w_key(&b, "t.arr_str_empty", GGUF_TYPE_ARRAY), w_u32(&b, GGUF_TYPE_STRING), w_u64(&b, 0);
        n_kv++;
        /* [[1, 2], ["x"]] */
        w_key(&b, "t.arr_arr", GGUF_TYPE_ARRAY), w_u32(&b, GGUF_TYPE_ARRAY), w_u64(&b, 2);
        w_u32(&b, GGUF_TYPE_UINT8), w_u64(&b, 2), w_u8(&b, 1), w_u8(&b, 2);
        w_u32(&b, GGUF_TYPE_STRING), w_u64(&b, 1), w_str(&b, "x");
        n_kv++;
        if (o->dup_key) w_key(&b, "t.u8", GGUF_TYPE_UINT8), w_u8(&b, 1), n_kv++;
    }
    if (o->n_vocab) {
        w_key(&b, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY), w_u32(&b, GGUF_TYPE_STRING);
        w_u64(&b, (uint64_t)o->n_vocab), n_kv++;
        for (int i = 0; i < o->n_vocab; i++) {
            char tok[32];
            snprintf(tok, sizeof tok, "tok%d", i);
            w_str(&b, tok);
        }
    }
    put64(b.p + mk.n_kv, n_kv);

    /* Data offsets: consecutive, each aligned, in directory or reverse order. */
    uint64_t off = 0;
    for (int k = 0; k < nt; k++) {
        int i = o->reverse_data ? nt - 1 - k : k;
        mk.t_data_off[i] = off;
        off += tensor_bytes(ts[i].type, ts[i].ne);
        off = (off + align - 1) / align * align;
    }
    for (int i = 0; i < nt; i++) {
        mk.t_name[i] = b.n;
        w_str(&b, ts[i].name);
        mk.t_ndims[i] = b.n;
        w_u32(&b, (uint32_t)ts[i].n_dims);
        mk.t_ne[i] = b.n;
        for (int d = 0; d < ts[i].n_dims; d++) w_u64(&b, (uint64_t)ts[i].ne[d]);
        mk.t_type[i] = b.n;
        w_u32(&b, (uint32_t)ts[i].type);
        mk.t_offset[i] = b.n;
        w_u64(&b, mk.t_data_off[i]);
    }
    mk.dir_end = b.n;
    while (b.n % align) w_u8(&b, 0);
    mk.data_off = b.n;
    if (!o->no_data) {
        /* Pad between tensors with 0xEE, and end right after the last tensor's
         * bytes so that cutting any byte off makes the file invalid. */
        size_t end = mk.data_off;
        for (int i = 0; i < nt; i++) {
            size_t e = mk.data_off + mk.t_data_off[i] + tensor_bytes(ts[i].type, ts[i].ne);
            if (e > end) end = e;
        }
        size_t start = b.n;
        for (size_t j = start; j < end; j++) w_u8(&b, 0xEE);
        for (int i = 0; i < nt; i++) {
            size_t n = tensor_bytes(ts[i].type, ts[i].ne);
            for (size_t j = 0; j < n; j++) b.p[mk.data_off + mk.t_data_off[i] + j] = pattern(i, j);
        }
    }
    if (m) *m = mk;
    *size = b.n;
    return b.p;
}

/* ---- helpers -------------------------------------------------------------- */

/* Opens a private, exactly-sized copy of `src`; on success *out owns a file
 * that borrows *copy (free both). */
static ellm_status open_copy(const uint8_t *src, size_t size, uint8_t **copy, gguf_file **out,
                             ellm_error *err) {
    *copy = malloc(size ? size : 1);
    if (!*copy) abort();
    if (size) memcpy(*copy, src, size);
    return gguf_open_memory(*copy, size, out, err);
}

/* Expects `src[0..size)` to be rejected with `want` and a message containing
 * s1 and s2 (either may be NULL). */
static void expect_fail_(const char *label, int line, const uint8_t *src, size_t size,
                         ellm_status want, const char *s1, const char *s2) {
    uint8_t *copy;
    gguf_file *f = (gguf_file *)1;
    ellm_error err = {0};
    ellm_status st = open_copy(src, size, &copy, &f, &err);
    CHECK(st == want, "line %d %s: status %d (%s), want %d; msg: %s", line, label, st,
          ellm_status_str(st), want, st ? err.msg : "");
    CHECK(f == NULL, "line %d %s: *out not NULL on failure", line, label);
    if (st != ELLM_OK) {
        CHECK(err.status == st, "line %d %s: err.status %d", line, label, err.status);
        CHECK(strncmp(err.msg, "gguf: ", 6) == 0 && contains(err.msg, s1) && contains(err.msg, s2),
              "line %d %s: message '%s' lacks '%s' / '%s'", line, label, err.msg,
              s1 ? s1 : "", s2 ? s2 : "");
    } else {
        gguf_close(f);
    }
    free(copy);
}
#define expect_fail(label, src, size, want, s1, s2) \
    expect_fail_(label, __LINE__, src, size, want, s1, s2)

/* Checks what must hold of any successfully opened file. */
static void check_invariants(const gguf_file *f, const char *label) {
    const uint8_t *base = gguf_base(f);
    size_t size = gguf_size(f);
    size_t align = gguf_alignment(f);
    CHECK(align && (align & (align - 1)) == 0, "%s: alignment %zu", label, align);
    int bad_keys = 0, bad_tensors = 0;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const char *k = gguf_key_name(f, i);
        if (!k || gguf_find_key(f, k) != i || gguf_kv_type(f, i) >= GGUF_TYPE_COUNT) bad_keys++;
    }
    CHECK(bad_keys == 0, "%s: %d keys not found back by name", label, bad_keys);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const uint8_t *d = t->data;
        int ok = gguf_find_tensor(f, t->name) == t && t->n_dims >= 1 && t->n_dims <= 4 &&
                 d >= base && d + t->n_bytes <= base + size && t->offset % align == 0 &&
                 (size_t)(d - base) % align == 0 && qtype_get(t->type) != NULL;
        int64_t n = 1;
        for (int k = 0; k < GGUF_MAX_DIMS; k++) {
            if (k >= t->n_dims && t->ne[k] != 1) ok = 0;
            n *= t->ne[k];
        }
        const qtype_info *q = qtype_get(t->type);
        if (q && t->n_bytes != (size_t)(n / q->block_elems) * (size_t)q->block_bytes) ok = 0;
        if (!ok) {
            bad_tensors++;
            fprintf(stderr, "%s: tensor %lld '%s' inconsistent\n", label, (long long)i, t->name);
        }
    }
    CHECK(bad_tensors == 0, "%s: %d inconsistent tensors", label, bad_tensors);
    CHECK(gguf_tensor_at(f, -1) == NULL && gguf_tensor_at(f, gguf_n_tensors(f)) == NULL, "%s", label);
    CHECK(gguf_key_name(f, -1) == NULL && gguf_key_name(f, gguf_n_kv(f)) == NULL, "%s", label);
    CHECK(gguf_kv_type(f, gguf_n_kv(f)) == GGUF_TYPE_COUNT, "%s", label);
    CHECK(gguf_find_key(f, "no.such.key") == -1 && gguf_find_tensor(f, "no.such.tensor") == NULL,
          "%s", label);
}

static void path_join(char *out, size_t cap, const char *a, const char *b, const char *c) {
    snprintf(out, cap, "%s/%s%s%s", a, b, c ? "/" : "", c ? c : "");
}

static int64_t get_i64(const gguf_file *f, const char *key) {
    int64_t v = INT64_MIN;
    ellm_error err;
    if (gguf_get_i64(f, key, &v, &err) != ELLM_OK) fprintf(stderr, "%s\n", err.msg);
    return v;
}

static int str_is(const gguf_file *f, const char *key, const char *want) {
    const char *s = NULL;
    size_t n = 0;
    ellm_error err;
    return gguf_get_str(f, key, &s, &n, &err) == ELLM_OK && str_eq(s, n, want);
}

static int arr_str_is(const gguf_file *f, const char *key, uint64_t i, const char *want) {
    const char *s = NULL;
    size_t n = 0;
    return gguf_get_arr_str(f, gguf_find_key(f, key), i, &s, &n) == ELLM_OK && str_eq(s, n, want);
}

/* ---- 1. fixtures ---------------------------------------------------------- */

/* Opens every *.gguf under tests/data/{models,vocab}, mapped and from memory. */
static void test_all_fixtures(void) {
    const char *subdirs[] = {"models", "vocab"};
    int n_files = 0;
    for (int s = 0; s < 2; s++) {
        char dir[512];
        path_join(dir, sizeof dir, test_data_dir(), subdirs[s], NULL);
        DIR *d = opendir(dir);
        CHECK(d != NULL, "cannot list %s", dir);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t len = strlen(e->d_name);
            if (len < 5 || strcmp(e->d_name + len - 5, ".gguf") != 0) continue;
            char path[1024];
            path_join(path, sizeof path, test_data_dir(), subdirs[s], e->d_name);
            n_files++;
            gguf_file *f = NULL;
            ellm_error err;
            ellm_status st = gguf_open(path, &f, &err);
            CHECK(st == ELLM_OK, "%s: %s", path, err.msg);
            if (st != ELLM_OK) continue;
            CHECK(gguf_version(f) == 3, "%s: version %u", path, gguf_version(f));
            CHECK(gguf_alignment(f) == 32, "%s: alignment %zu", path, gguf_alignment(f));
            check_invariants(f, path);
            const char *arch;
            size_t arch_len;
            CHECK(gguf_get_str(f, "general.architecture", &arch, &arch_len, &err) == ELLM_OK,
                  "%s: %s", path, err.msg);

            /* The same bytes parsed from a buffer give the same directory. */
            size_t size = 0;
            char *buf = test_read_file(path, &size);
            gguf_file *g = NULL;
            CHECK(buf && gguf_open_memory(buf, size, &g, &err) == ELLM_OK, "%s: memory: %s", path,
                  err.msg);
            if (g) {
                int same = gguf_n_kv(g) == gguf_n_kv(f) && gguf_n_tensors(g) == gguf_n_tensors(f) &&
                           gguf_size(g) == gguf_size(f);
                for (int64_t i = 0; same && i < gguf_n_tensors(f); i++) {
                    const gguf_tensor *a = gguf_tensor_at(f, i), *b = gguf_tensor_at(g, i);
                    same = strcmp(a->name, b->name) == 0 && a->offset == b->offset &&
                           a->n_bytes == b->n_bytes && a->type == b->type &&
                           memcmp(a->data, b->data, a->n_bytes) == 0;
                }
                CHECK(same, "%s: mapped and in-memory parses differ", path);
                gguf_close(g);
            }
            free(buf);
            gguf_close(f);
        }
        closedir(d);
    }
    CHECK(n_files >= 12, "found only %d fixtures", n_files);
}

static void test_llama_gqa(void) {
    char path[512];
    path_join(path, sizeof path, test_data_dir(), "models", "llama-gqa.gguf");
    gguf_file *f = NULL;
    ellm_error err;
    if (gguf_open(path, &f, &err) != ELLM_OK) {
        CHECK(0, "%s", err.msg);
        return;
    }
    CHECK(gguf_n_kv(f) == 23 && gguf_n_tensors(f) == 20, "counts %lld %lld",
          (long long)gguf_n_kv(f), (long long)gguf_n_tensors(f));
    CHECK(gguf_size(f) == 6603104, "size %zu", gguf_size(f));
    CHECK(str_is(f, "general.architecture", "llama"), "architecture");
    CHECK(str_is(f, "general.name", "llama-gqa"), "name");
    CHECK(str_is(f, "tokenizer.ggml.model", "llama"), "tokenizer model");
    CHECK(gguf_find_key(f, "general.architecture") == 0, "key index");
    CHECK(get_i64(f, "llama.block_count") == 2, "block_count");
    CHECK(get_i64(f, "llama.embedding_length") == 256, "embedding_length");
    CHECK(get_i64(f, "llama.context_length") == 4096, "context_length");
    CHECK(get_i64(f, "llama.feed_forward_length") == 512, "ff");
    CHECK(get_i64(f, "llama.attention.head_count") == 8, "heads");
    CHECK(get_i64(f, "llama.attention.head_count_kv") == 2, "kv heads");
    CHECK(get_i64(f, "tokenizer.ggml.bos_token_id") == 1, "bos");
    CHECK(gguf_kv_type(f, gguf_find_key(f, "llama.block_count")) == GGUF_TYPE_UINT32, "u32 type");
    double eps = 0, base = 0;
    CHECK(gguf_get_f64(f, "llama.attention.layer_norm_rms_epsilon", &eps, &err) == ELLM_OK &&
          fabs(eps - 1e-5) < 1e-10, "eps %g", eps);
    CHECK(gguf_get_f64(f, "llama.rope.freq_base", &base, &err) == ELLM_OK && base == 10000.0,
          "freq_base %g", base);
    int add_bos = -1, add_eos = -1;
    CHECK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, &err) == ELLM_OK && add_bos == 1,
          "add_bos %d", add_bos);
    CHECK(gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &add_eos, &err) == ELLM_OK && add_eos == 0,
          "add_eos %d", add_eos);

    gguf_value_type et = GGUF_TYPE_COUNT;
    uint64_t n = 0;
    const void *data = (const void *)1;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, &data, &err) == ELLM_OK &&
          et == GGUF_TYPE_STRING && n == 2048 && data == NULL, "tokens: type %d n %llu", et,
          (unsigned long long)n);
    CHECK(arr_str_is(f, "tokenizer.ggml.tokens", 0, "<unk>"), "token 0");
    CHECK(arr_str_is(f, "tokenizer.ggml.tokens", 1, "<s>"), "token 1");
    CHECK(arr_str_is(f, "tokenizer.ggml.tokens", 2, "</s>"), "token 2");
    CHECK(arr_str_is(f, "tokenizer.ggml.tokens", 100, "<0x61>"), "token 100");
    CHECK(arr_str_is(f, "tokenizer.ggml.tokens", 2047, "K"), "token 2047");
    const char *s;
    size_t len;
    CHECK(gguf_get_arr_str(f, gguf_find_key(f, "tokenizer.ggml.tokens"), 2048, &s, &len) ==
          ELLM_ERR_ARG, "token 2048 out of range");
    CHECK(gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &n, &data, &err) == ELLM_OK &&
          et == GGUF_TYPE_INT32 && n == 2048 && data, "token_type");
    if (data) CHECK(rd32(data) == 2 && rd32((const char *)data + 4) == 3, "token types");
    CHECK(gguf_get_arr(f, "tokenizer.ggml.scores", &et, &n, &data, &err) == ELLM_OK &&
          et == GGUF_TYPE_FLOAT32 && n == 2048, "scores");

    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->n_dims == 2 && t->ne[0] == 256 && t->ne[1] == 2048 && t->ne[2] == 1 &&
          t->ne[3] == 1 && t->type == QTYPE_F32 && t->offset == 0 && t->n_bytes == 2097152,
          "token_embd.weight");
    if (t) {
        float v[2];
        memcpy(v, t->data, sizeof v);
        CHECK((const char *)t->data - (const char *)gguf_base(f) == 44384, "data section offset");
        CHECK(v[0] == 0.17279209196567535f && v[1] == 0.41080906987190247f, "values %g %g",
              v[0], v[1]);
    }
    t = gguf_find_tensor(f, "output_norm.weight");
    CHECK(t && t->n_dims == 1 && t->ne[0] == 256 && t->offset == 6557696 && t->n_bytes == 1024 &&
          (const char *)t->data + t->n_bytes == (const char *)gguf_base(f) + gguf_size(f),
          "output_norm.weight ends the file");
    if (t) {
        float v;
        memcpy(&v, t->data, sizeof v);
        CHECK(v == 1.037514328956604f, "output_norm[0] %g", v);
    }
    t = gguf_find_tensor(f, "blk.1.attn_q.weight");
    CHECK(t && t->ne[0] == 256 && t->ne[1] == 256 && t == gguf_tensor_at(f, 11), "blk.1.attn_q");
    CHECK(gguf_tensor_at(f, 1) == gguf_find_tensor(f, "blk.0.attn_norm.weight"), "tensor order");
    gguf_close(f);
}

static void test_quantized_fixture(void) {
    char path[512];
    path_join(path, sizeof path, test_data_dir(), "models", "llama-gqa-Q4_K_M.gguf");
    gguf_file *f = NULL;
    ellm_error err;
    if (gguf_open(path, &f, &err) != ELLM_OK) {
        CHECK(0, "%s", err.msg);
        return;
    }
    CHECK(get_i64(f, "general.file_type") == 15 && get_i64(f, "general.quantization_version") == 2,
          "file type");
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->type == QTYPE_Q6_K && t->offset == 1024 && t->n_bytes == 2048 * 210,
          "token_embd is q6_k");
    t = gguf_find_tensor(f, "blk.0.attn_k.weight");
    CHECK(t && t->type == QTYPE_Q4_K && t->ne[0] == 256 && t->ne[1] == 64 && t->offset == 431104 &&
          t->n_bytes == 64 * 144, "attn_k is q4_k");
    CHECK(gguf_tensor_at(f, 0) == gguf_find_tensor(f, "output_norm.weight"), "directory order");
    gguf_close(f);

    path_join(path, sizeof path, test_data_dir(), "models", "llama-gqa-BF16.gguf");
    if (gguf_open(path, &f, &err) == ELLM_OK) {
        t = gguf_find_tensor(f, "blk.0.ffn_down.weight");
        CHECK(t && t->type == QTYPE_BF16 && t->ne[0] == 512 && t->ne[1] == 256 &&
              t->n_bytes == 512 * 256 * 2, "bf16 ffn_down");
        gguf_close(f);
    } else {
        CHECK(0, "%s", err.msg);
    }
}

static void test_other_fixtures(void) {
    static const struct {
        const char *dir, *file, *arch;
        int64_t n_tensors, n_vocab, block_count;
        const char *block_key, *last_token;
    } cases[] = {
        {"models", "qwen2-bias.gguf", "qwen2", 26, 2048, 2, "qwen2.block_count", "K"},
        {"models", "qwen3-qknorm.gguf", "qwen3", 24, 2048, 2, "qwen3.block_count", "K"},
        {"models", "llama-untied-ropefreqs.gguf", "llama", 22, 2048, 2, "llama.block_count", "K"},
        {"vocab", "ggml-vocab-llama-spm.gguf", "llama", 0, 32000, 32, "llama.block_count",
         "\xe7\xbb\x99"},
        {"vocab", "ggml-vocab-phi-3.gguf", "phi3", 0, 32064, 32, "phi3.block_count", "[PAD32063]"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char path[512];
        path_join(path, sizeof path, test_data_dir(), cases[c].dir, cases[c].file);
        gguf_file *f = NULL;
        ellm_error err;
        double t0 = now_ms();
        if (gguf_open(path, &f, &err) != ELLM_OK) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        double ms = now_ms() - t0;
        printf("open %-32s %8zu bytes %6.3f ms\n", cases[c].file, gguf_size(f), ms);
        CHECK(str_is(f, "general.architecture", cases[c].arch), "%s: arch", cases[c].file);
        CHECK(gguf_n_tensors(f) == cases[c].n_tensors, "%s: %lld tensors", cases[c].file,
              (long long)gguf_n_tensors(f));
        CHECK(get_i64(f, cases[c].block_key) == cases[c].block_count, "%s: blocks", cases[c].file);
        gguf_value_type et;
        uint64_t n = 0;
        const void *data;
        CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, &data, &err) == ELLM_OK &&
              et == GGUF_TYPE_STRING && n == (uint64_t)cases[c].n_vocab, "%s: vocab %llu",
              cases[c].file, (unsigned long long)n);
        CHECK(arr_str_is(f, "tokenizer.ggml.tokens", n - 1, cases[c].last_token), "%s: last token",
              cases[c].file);
        CHECK(arr_str_is(f, "tokenizer.ggml.tokens", 3, "<0x00>"),
              "%s: token 3", cases[c].file);
        if (cases[c].n_tensors == 0) {
            /* The vocabulary files end right after the directory, before the
             * (empty) aligned data section: valid, nothing to place. */
            CHECK(arr_str_is(f, "tokenizer.ggml.tokens", 259, "\xe2\x96\x81\xe2\x96\x81"),
                  "%s: token 259", cases[c].file);
        }
        gguf_close(f);
    }
}

/* ---- 2. synthetic round trips --------------------------------------------- */

static void check_synthetic(const gguf_file *f, const build_opts *o, const marks *m, const char *label) {
    ellm_error err;
    size_t align = o->alignment ? o->alignment : 32;
    CHECK(gguf_version(f) == (o->version ? o->version : 3u), "%s: version", label);
    CHECK(gguf_alignment(f) == align, "%s: alignment %zu", label, gguf_alignment(f));
    check_invariants(f, label);
    CHECK(str_is(f, "general.architecture", "test"), "%s: arch", label);

    int nt = o->tensors ? o->n_tensors : N_TENSORS;
    const tspec *ts = o->tensors ? o->tensors : TENSORS;
    CHECK(gguf_n_tensors(f) == nt, "%s: n_tensors", label);
    for (int i = 0; i < nt && i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        int ok = strcmp(t->name, ts[i].name) == 0 && gguf_find_tensor(f, ts[i].name) == t &&
                 t->n_dims == ts[i].n_dims && t->type == ts[i].type &&
                 t->offset == m->t_data_off[i] && t->n_bytes == tensor_bytes(ts[i].type, ts[i].ne) &&
                 (const uint8_t *)t->data == (const uint8_t *)gguf_base(f) + m->data_off + t->offset;
        for (int d = 0; d < 4; d++) ok = ok && t->ne[d] == ts[i].ne[d];
        const uint8_t *p = t->data;
        for (size_t j = 0; ok && j < t->n_bytes; j++) ok = p[j] == pattern(i, j);
        CHECK(ok, "%s: tensor %d '%s'", label, i, ts[i].name);
    }
    if (!o->all_kvs) return;

    CHECK(get_i64(f, "t.u8") == 200 && get_i64(f, "t.i8") == -100 && get_i64(f, "t.u16") == 60000 &&
          get_i64(f, "t.i16") == -30000 && get_i64(f, "t.u32") == 4000000000ll &&
          get_i64(f, "t.i32") == -2000000000ll && get_i64(f, "t.u64") == 1234567890123ll &&
          get_i64(f, "t.i64") == -9000000000000000000ll && get_i64(f, "t.bool") == 1,
          "%s: integers", label);
    int64_t iv;
    CHECK(gguf_get_i64(f, "t.u64_big", &iv, &err) == ELLM_ERR_FORMAT &&
          contains(err.msg, "t.u64_big") && contains(err.msg, "9223372036854775813"),
          "%s: u64 beyond int64: %s", label, err.msg);
    CHECK(gguf_get_i64(f, "t.f32", &iv, &err) == ELLM_ERR_FORMAT && contains(err.msg, "t.f32") &&
          contains(err.msg, "float32"), "%s: float as int: %s", label, err.msg);
    CHECK(gguf_get_i64(f, "t.str", &iv, &err) == ELLM_ERR_FORMAT && contains(err.msg, "string"),
          "%s: %s", label, err.msg);
    CHECK(gguf_get_i64(f, "no.such", &iv, &err) == ELLM_ERR_FORMAT && contains(err.msg, "no.such") &&
          contains(err.msg, "not found"), "%s: missing: %s", label, err.msg);

    double dv = 0;
    CHECK(gguf_get_f64(f, "t.f32", &dv, &err) == ELLM_OK && dv == 1.5, "%s: f32", label);
    CHECK(gguf_get_f64(f, "t.f64", &dv, &err) == ELLM_OK && dv == 3.25, "%s: f64", label);
    CHECK(gguf_get_f64(f, "t.i32", &dv, &err) == ELLM_OK && dv == -2e9, "%s: int as f64", label);
    CHECK(gguf_get_f64(f, "t.u64_big", &dv, &err) == ELLM_OK && dv == 9223372036854775808.0,
          "%s: u64 as f64 %g", label, dv);
    CHECK(gguf_get_f64(f, "t.bool", &dv, &err) == ELLM_ERR_FORMAT && contains(err.msg, "bool"),
          "%s: bool as f64", label);
    CHECK(gguf_get_f64(f, "t.arr_f32", &dv, &err) == ELLM_ERR_FORMAT && contains(err.msg, "array"),
          "%s: array as f64", label);

    int bv = -1;
    CHECK(gguf_get_bool(f, "t.bool", &bv, &err) == ELLM_OK && bv == 1, "%s: bool", label);
    CHECK(gguf_get_bool(f, "t.false", &bv, &err) == ELLM_OK && bv == 0, "%s: false", label);
    CHECK(gguf_get_bool(f, "t.u8", &bv, &err) == ELLM_OK && bv == 1, "%s: int as bool", label);
    CHECK(gguf_get_bool(f, "t.str", &bv, &err) == ELLM_ERR_FORMAT, "%s: str as bool", label);

    const char *s;
    size_t len;
    CHECK(str_is(f, "t.str", "hello, gguf") && str_is(f, "t.empty_str", ""), "%s: strings", label);
    CHECK(gguf_get_str(f, "t.u8", &s, &len, &err) == ELLM_ERR_FORMAT && contains(err.msg, "t.u8") &&
          contains(err.msg, "uint8"), "%s: int as str: %s", label, err.msg);

    gguf_value_type et;
    uint64_t n;
    const void *data;
    CHECK(gguf_get_arr(f, "t.arr_u8", &et, &n, &data, &err) == ELLM_OK && et == GGUF_TYPE_UINT8 &&
          n == 3 && data && memcmp(data, "\1\2\3", 3) == 0, "%s: arr_u8", label);
    CHECK(gguf_get_arr(f, "t.arr_i32", &et, &n, &data, &err) == ELLM_OK && et == GGUF_TYPE_INT32 &&
          n == 4 && data, "%s: arr_i32", label);
    if (data) {
        int32_t v[4];
        memcpy(v, data, sizeof v);
        CHECK(v[0] == -1 && v[1] == 2 && v[2] == -3 && v[3] == 4, "%s: arr_i32 values", label);
    }
    CHECK(gguf_get_arr(f, "t.arr_f32", &et, &n, &data, &err) == ELLM_OK && et == GGUF_TYPE_FLOAT32 &&
          n == 2, "%s: arr_f32", label);
    if (data) {
        float v[2];
        memcpy(v, data, sizeof v);
        CHECK(v[0] == 0.5f && v[1] == -2.0f, "%s: arr_f32 values", label);
    }
    CHECK(gguf_get_arr(f, "t.arr_f64", &et, &n, &data, &err) == ELLM_OK && et == GGUF_TYPE_FLOAT64 &&
          n == 1, "%s: arr_f64", label);
    CHECK(gguf_get_arr(f, "t.arr_u64", &et, &n, &data, &err) == ELLM_OK && et == GGUF_TYPE_UINT64 &&
          n == 2, "%s: arr_u64", label);
    if (data) {
        uint64_t v[2];
        memcpy(v, data, sizeof v);
        CHECK(v[0] == 7 && v[1] == UINT64_MAX, "%s: arr_u64 values", label);
    }
    CHECK(gguf_get_arr(f, "t.arr_bool", &et, &n, &data, &err) == ELLM_OK && et == GGUF_TYPE_BOOL &&
          n == 2 && memcmp(data, "\0\1", 2) == 0, "%s: arr_bool", label);
    CHECK(gguf_get_arr(f, "t.arr_empty", &et, &n, &data, &err) == ELLM_OK && n == 0, "%s: empty", label);
    CHECK(gguf_get_arr(f, "t.arr_str_empty", &et, &n, &data, &err) == ELLM_OK && n == 0 &&
          et == GGUF_TYPE_STRING, "%s: empty string array", label);
    CHECK(gguf_get_arr_str(f, gguf_find_key(f, "t.arr_str_empty"), 0, &s, &len) == ELLM_ERR_ARG,
          "%s: element of an empty array", label);
    CHECK(gguf_get_arr(f, "t.arr_arr", &et, &n, &data, &err) == ELLM_OK && et == GGUF_TYPE_ARRAY &&
          n == 2 && data == NULL, "%s: array of arrays", label);
    CHECK(gguf_get_arr(f, "t.str", &et, &n, &data, &err) == ELLM_ERR_FORMAT &&
          contains(err.msg, "t.str"), "%s: str as array", label);

    CHECK(gguf_get_arr(f, "t.arr_str", &et, &n, &data, &err) == ELLM_OK && et == GGUF_TYPE_STRING &&
          n == 4, "%s: arr_str", label);
    for (int i = 0; i < 4; i++) {
        CHECK(arr_str_is(f, "t.arr_str", (uint64_t)i, ARR_STR[i]), "%s: arr_str[%d]", label, i);
    }
    CHECK(gguf_get_arr_str(f, gguf_find_key(f, "t.arr_str"), 4, &s, &len) == ELLM_ERR_ARG &&
          gguf_get_arr_str(f, gguf_find_key(f, "t.arr_i32"), 0, &s, &len) == ELLM_ERR_ARG &&
          gguf_get_arr_str(f, gguf_find_key(f, "t.str"), 0, &s, &len) == ELLM_ERR_ARG &&
          gguf_get_arr_str(f, -1, 0, &s, &len) == ELLM_ERR_ARG &&
          gguf_get_arr_str(f, gguf_n_kv(f), 0, &s, &len) == ELLM_ERR_ARG,
          "%s: gguf_get_arr_str misuse", label);
    CHECK(gguf_kv_type(f, gguf_find_key(f, "t.i16")) == GGUF_TYPE_INT16 &&
          gguf_kv_type(f, gguf_find_key(f, "t.arr_str")) == GGUF_TYPE_ARRAY, "%s: kv types", label);
}

static void test_round_trips(void) {
    static const tspec one_tensor[] = {{"only", 1, {8, 1, 1, 1}, 0}};
    const struct {
        const char *label;
        build_opts o;
    } cases[] = {
        {"v3, all kvs", {.all_kvs = 1}},
        {"v2", {.version = 2, .all_kvs = 1}},
        {"alignment 64", {.alignment = 64, .all_kvs = 1}},
        {"alignment 1", {.alignment = 1, .all_kvs = 1}},
        {"alignment 4096", {.alignment = 4096}},
        {"explicit alignment 32", {.alignment = 32, .all_kvs = 1}},
        {"reverse data order", {.all_kvs = 1, .reverse_data = 1}},
        {"no kvs but the architecture", {0}},
        {"one tensor", {.tensors = one_tensor, .n_tensors = 1}},
        {"no tensors", {.all_kvs = 1, .tensors = one_tensor, .n_tensors = 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        marks m;
        size_t size;
        uint8_t *file = build(&cases[c].o, &size, &m);
        uint8_t *copy;
        gguf_file *f = NULL;
        ellm_error err;
        if (open_copy(file, size, &copy, &f, &err) == ELLM_OK) {
            check_synthetic(f, &cases[c].o, &m, cases[c].label);
            gguf_close(f);
        } else {
            CHECK(0, "%s: %s", cases[c].label, err.msg);
        }
        free(copy);
        free(file);
    }

    /* A file without tensors may stop anywhere after its directory, even
     * before the aligned start of the (empty) data section. */
    build_opts o = {.all_kvs = 1, .tensors = one_tensor, .n_tensors = 0};
    marks m;
    size_t size;
    uint8_t *file = build(&o, &size, &m);
    CHECK(m.dir_end % 32 != 0, "test assumes padding after the directory");
    uint8_t *copy;
    gguf_file *f = NULL;
    ellm_error err;
    CHECK(open_copy(file, m.dir_end, &copy, &f, &err) == ELLM_OK, "unpadded, no tensors: %s", err.msg);
    gguf_close(f);
    free(copy);
    free(file);

    /* gguf_open on a file on disk, and argument checks. */
    CHECK(gguf_open_memory(NULL, 10, &f, &err) == ELLM_ERR_ARG, "NULL data");
    CHECK(gguf_open_memory("GGUF", 4, NULL, &err) == ELLM_ERR_ARG, "NULL out");
    gguf_close(NULL);
}

/* ---- 3. malformed input --------------------------------------------------- */

/* Builds the default synthetic file (all value types, all tensors). */
static uint8_t *build_default(size_t *size, marks *m) {
    build_opts o = {.all_kvs = 1, .alignment = 32};
    return build(&o, size, m);
}

/* Copies `file`, lets `patch` change it, and expects the given failure. */
#define PATCHED(label, stmt, want, s1, s2)                                     \
    do {                                                                       \
        uint8_t *p_ = malloc(size);                                            \
        memcpy(p_, file, size);                                                \
        uint8_t *p = p_;                                                       \
        stmt;                                                                  \
        expect_fail(label, p_, size, want, s1, s2);                            \
        free(p_);                                                              \
    } while (0)

static void test_header_errors(void) {
    marks m;
    size_t size;
    uint8_t *file = build_default(&size, &m);

    PATCHED("bad magic", p[0] = 'X', ELLM_ERR_FORMAT, "magic", "not a GGUF file");
    PATCHED("ggml magic", memcpy(p, "lmgg", 4), ELLM_ERR_FORMAT, "magic", NULL);
    PATCHED("version 1", put32(p + 4, 1), ELLM_ERR_UNSUPPORTED, "version 1", "not supported");
    PATCHED("version 4", put32(p + 4, 4), ELLM_ERR_UNSUPPORTED, "version 4", "expected 2 or 3");
    PATCHED("version 0", put32(p + 4, 0), ELLM_ERR_UNSUPPORTED, "version 0", NULL);
    PATCHED("big-endian", put32(p + 4, 0x03000000u), ELLM_ERR_UNSUPPORTED, "big-endian", NULL);
    expect_fail("empty", file, 0, ELLM_ERR_FORMAT, "0 bytes", "truncated");
    expect_fail("3 bytes", file, 3, ELLM_ERR_FORMAT, "3 bytes", "truncated");
    expect_fail("bad magic, short", (const uint8_t *)"GGUX", 4, ELLM_ERR_FORMAT, "magic", NULL);

    PATCHED("n_kv huge", put64(p + m.n_kv, UINT64_MAX), ELLM_ERR_FORMAT,
            "n_kv = 18446744073709551615", "bytes");
    PATCHED("n_kv 2^40", put64(p + m.n_kv, 1ull << 40), ELLM_ERR_FORMAT, "n_kv = 1099511627776", NULL);
    PATCHED("n_tensors huge", put64(p + m.n_tensors, UINT64_MAX / 2), ELLM_ERR_FORMAT,
            "n_tensors = 9223372036854775807", NULL);
    /* Plausible but wrong counts: the parser runs on into other sections and
     * must still stop cleanly. */
    for (uint64_t extra = 1; extra < 40; extra += 3) {
        uint8_t *p = malloc(size);
        memcpy(p, file, size);
        put64(p + m.n_kv, rd32(file + m.n_kv) + extra);
        gguf_file *f = NULL;
        ellm_error err;
        ellm_status st = gguf_open_memory(p, size, &f, &err);
        CHECK(st != ELLM_OK && f == NULL && strncmp(err.msg, "gguf: ", 6) == 0,
              "n_kv + %llu: status %d", (unsigned long long)extra, st);
        put64(p + m.n_kv, rd32(file + m.n_kv));
        put64(p + m.n_tensors, N_TENSORS + extra);
        st = gguf_open_memory(p, size, &f, &err);
        CHECK(st != ELLM_OK && f == NULL, "n_tensors + %llu: status %d", (unsigned long long)extra, st);
        free(p);
    }
    free(file);
}

static void test_metadata_errors(void) {
    marks m;
    size_t size;
    uint8_t *file = build_default(&size, &m);

    PATCHED("key length beyond file", put64(p + m.key0_len, size), ELLM_ERR_FORMAT, "key 0",
            "truncated");
    PATCHED("key length 2^64-1", put64(p + m.key0_len, UINT64_MAX), ELLM_ERR_FORMAT,
            "key name is 18446744073709551615 bytes", NULL);
    PATCHED("empty key", put64(p + m.key0_len, 0), ELLM_ERR_FORMAT, "key 0", "empty key name");
    PATCHED("NUL in key", p[m.key0_len + 8 + 3] = 0, ELLM_ERR_FORMAT, "key 0", "NUL");
    PATCHED("unknown value type", put32(p + m.u8_type, 13), ELLM_ERR_FORMAT, "'t.u8'",
            "unknown value type 13");
    PATCHED("value type 2^32-1", put32(p + m.u8_type, UINT32_MAX), ELLM_ERR_FORMAT, "'t.u8'",
            "4294967295");
    PATCHED("unknown array element type", put32(p + m.arr_i32_elem_type, 99), ELLM_ERR_FORMAT,
            "'t.arr_i32'", "unknown array element type 99");
    PATCHED("array count beyond file", put64(p + m.arr_i32_elem_type + 4, 1ull << 62),
            ELLM_ERR_FORMAT, "'t.arr_i32'", "array of 4611686018427387904 int32 (4 bytes each)");
    PATCHED("string array count huge", put64(p + m.arr_str_count, UINT64_MAX), ELLM_ERR_FORMAT,
            "'t.arr_str'", "18446744073709551615 strings");
    PATCHED("string element length beyond file", put64(p + m.arr_str_elem1, size),
            ELLM_ERR_FORMAT, "'t.arr_str'", "string element 1 of 4");
    PATCHED("string element length 2^64-1", put64(p + m.arr_str_elem1, UINT64_MAX),
            ELLM_ERR_FORMAT, "string element 1", "truncated");
    PATCHED("alignment 0", put32(p + m.align_value, 0), ELLM_ERR_FORMAT, "general.alignment = 0",
            "power of two");
    PATCHED("alignment 3", put32(p + m.align_value, 3), ELLM_ERR_FORMAT, "general.alignment = 3",
            "power of two");
    PATCHED("alignment 48", put32(p + m.align_value, 48), ELLM_ERR_FORMAT, "general.alignment = 48",
            NULL);
    free(file);

    /* Duplicate keys. */
    build_opts o = {.all_kvs = 1, .dup_key = 1};
    file = build(&o, &size, &m);
    expect_fail("duplicate key", file, size, ELLM_ERR_FORMAT, "duplicate key 't.u8'", NULL);
    free(file);

    /* general.alignment of the wrong type. */
    wbuf b = {0};
    w_bytes(&b, "GGUF", 4), w_u32(&b, 3), w_u64(&b, 0), w_u64(&b, 1);
    w_key(&b, "general.alignment", GGUF_TYPE_STRING), w_str(&b, "32");
    expect_fail("alignment as string", b.p, b.n, ELLM_ERR_FORMAT, "general.alignment", "string");
    b.n = 0;

    /* Arrays nested deeper than the reader follows. */
    w_bytes(&b, "GGUF", 4), w_u32(&b, 3), w_u64(&b, 0), w_u64(&b, 1);
    w_key(&b, "deep", GGUF_TYPE_ARRAY);
    for (int d = 0; d < 20; d++) w_u32(&b, GGUF_TYPE_ARRAY), w_u64(&b, 1);
    w_u32(&b, GGUF_TYPE_UINT8), w_u64(&b, 0);
    expect_fail("deep nesting", b.p, b.n, ELLM_ERR_UNSUPPORTED, "'deep'", "nested");
    free(b.p);
}

static void test_directory_errors(void) {
    marks m;
    size_t size;
    uint8_t *file = build_default(&size, &m);
    /* tensor 0: token_embd.weight {64, 10} f32; tensor 1: blk.0.w_q4k {256, 3} q4_k */

    PATCHED("n_dims 0", put32(p + m.t_ndims[1], 0), ELLM_ERR_FORMAT, "tensor 1 'blk.0.w_q4k'",
            "n_dims = 0");
    PATCHED("n_dims 5", put32(p + m.t_ndims[1], 5), ELLM_ERR_FORMAT, "tensor 1 'blk.0.w_q4k'",
            "n_dims = 5");
    PATCHED("ne 0", put64(p + m.t_ne[1] + 8, 0), ELLM_ERR_FORMAT, "'blk.0.w_q4k'", "ne[1] = 0");
    PATCHED("ne negative", put64(p + m.t_ne[0], (uint64_t)-64), ELLM_ERR_FORMAT,
            "'token_embd.weight'", "ne[0] = 18446744073709551552");
    PATCHED("ne product overflow",
            (put64(p + m.t_ne[0], 1ull << 32), put64(p + m.t_ne[0] + 8, 1ull << 32)),
            ELLM_ERR_FORMAT, "'token_embd.weight'", "more than 2^63 elements");
    PATCHED("byte size overflow",
            (put64(p + m.t_ne[0], 1ull << 31), put64(p + m.t_ne[0] + 8, 1ull << 31)),
            ELLM_ERR_FORMAT, "'token_embd.weight'", "overflows");
    PATCHED("ne[0] not a multiple of the block", put64(p + m.t_ne[1], 255), ELLM_ERR_FORMAT,
            "'blk.0.w_q4k'", "not a multiple of the block size 256");
    PATCHED("unknown tensor type", put32(p + m.t_type[1], 1000), ELLM_ERR_UNSUPPORTED,
            "tensor 1 'blk.0.w_q4k'", "unknown tensor type id 1000");
    PATCHED("retired tensor type", put32(p + m.t_type[1], 4), ELLM_ERR_UNSUPPORTED,
            "'blk.0.w_q4k'", "type id 4");
    PATCHED("tensor type 2^31", put32(p + m.t_type[1], 0x80000000u), ELLM_ERR_UNSUPPORTED,
            "'blk.0.w_q4k'", "2147483648");
    PATCHED("tensor name beyond file", put64(p + m.t_name[2], size), ELLM_ERR_FORMAT, "tensor 2",
            "truncated");
    PATCHED("empty tensor name", put64(p + m.t_name[2], 0), ELLM_ERR_FORMAT, "tensor 2",
            "empty name");

    int last = N_TENSORS - 1;
    PATCHED("misaligned offset", put64(p + m.t_offset[last], m.t_data_off[last] + 4),
            ELLM_ERR_FORMAT, "'output_norm.weight'", "not a multiple of the alignment 32");
    PATCHED("data beyond end", put64(p + m.t_offset[last], m.t_data_off[last] + 32),
            ELLM_ERR_FORMAT, "'output_norm.weight'", "but the file has");
    PATCHED("offset 2^63", put64(p + m.t_offset[last], 1ull << 63), ELLM_ERR_FORMAT,
            "'output_norm.weight'", "data ends at byte 92233720368547");
    PATCHED("offset 2^64-32", put64(p + m.t_offset[last], UINT64_MAX - 31), ELLM_ERR_FORMAT,
            "'output_norm.weight'", "beyond the end of the file");
    PATCHED("overlap", put64(p + m.t_offset[2], m.t_data_off[1]), ELLM_ERR_FORMAT, "overlap",
            "'blk.0.w_q8'");
    free(file);

    /* The exact message for a model cut short inside its last tensor. */
    file = build_default(&size, &m);
    {
        size_t cut = size - 1;
        uint8_t *copy;
        gguf_file *f = NULL;
        ellm_error err;
        CHECK(open_copy(file, cut, &copy, &f, &err) == ELLM_ERR_FORMAT, "cut by one byte");
        char want[200];
        snprintf(want, sizeof want,
                 "gguf: tensor %d 'output_norm.weight': data ends at byte %zu but the file has "
                 "%zu bytes (truncated?)", last, size, cut);
        CHECK(strcmp(err.msg, want) == 0, "message '%s'\n   want '%s'", err.msg, want);
        free(copy);
    }
    free(file);

    static const tspec dup[] = {
        {"a", 1, {32, 1, 1, 1}, 0},
        {"b", 1, {32, 1, 1, 1}, 0},
        {"a", 1, {32, 1, 1, 1}, 0},
    };
    build_opts o = {.tensors = dup, .n_tensors = 3};
    file = build(&o, &size, &m);
    expect_fail("duplicate tensor", file, size, ELLM_ERR_FORMAT, "duplicate tensor name 'a'",
                "tensors 0 and 2");
    free(file);
}

/* Every prefix of the synthetic file is rejected as truncated. */
static void test_truncation_synthetic(void) {
    marks m;
    size_t size;
    uint8_t *file = build_default(&size, &m);
    int bad = 0;
    for (size_t cut = 0; cut < size; cut++) {
        uint8_t *copy;
        gguf_file *f = NULL;
        ellm_error err = {0};
        ellm_status st = open_copy(file, cut, &copy, &f, &err);
        if (st != ELLM_ERR_FORMAT || f || !contains(err.msg, "truncated")) {
            if (bad++ < 5) fprintf(stderr, "cut at %zu of %zu: status %d: %s\n", cut, size, st, err.msg);
        }
        if (f) gguf_close(f);
        free(copy);
    }
    CHECK(bad == 0, "%d of %zu truncations not reported as truncated", bad, size);
    free(file);
}

/* Prefixes of a real model: every cut inside the header, metadata, directory
 * and the start of the data, and 2000 spread over the rest. */
static void test_truncation_fixture(void) {
    char path[512];
    path_join(path, sizeof path, test_data_dir(), "models", "llama-gqa-Q4_K_M.gguf");
    size_t size = 0;
    uint8_t *file = (uint8_t *)test_read_file(path, &size);
    CHECK(file != NULL, "cannot read %s", path);
    if (!file) return;
    gguf_file *f = NULL;
    ellm_error err;
    CHECK(gguf_open_memory(file, size, &f, &err) == ELLM_OK, "%s", err.msg);
    if (!f) {
        free(file);
        return;
    }
    /* Bytes after the last tensor's data (alignment padding) are optional. */
    size_t needed = 0, data_start = SIZE_MAX;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        size_t end = (size_t)((const uint8_t *)t->data - file) + t->n_bytes;
        size_t start = (size_t)((const uint8_t *)t->data - file) - t->offset;
        if (end > needed) needed = end;
        if (start < data_start) data_start = start;
    }
    gguf_close(f);
    CHECK(data_start == 44448 && needed <= size, "data section %zu..%zu", data_start, needed);

    int bad = 0, n_cuts = 0;
    size_t dense_end = data_start + 4096;
    for (size_t k = 0; k < dense_end + 2000; k++) {
        size_t cut = k < dense_end ? k : dense_end + (k - dense_end) * (needed - dense_end) / 2000;
        if (cut >= needed) break;
        uint8_t *copy;
        f = NULL;
        err.msg[0] = 0;
        ellm_status st = open_copy(file, cut, &copy, &f, &err);
        if (st != ELLM_ERR_FORMAT || f || !contains(err.msg, "truncated")) {
            if (bad++ < 5) fprintf(stderr, "cut at %zu of %zu: status %d: %s\n", cut, size, st, err.msg);
        }
        if (f) gguf_close(f);
        free(copy);
        n_cuts++;
    }
    CHECK(n_cuts > 48000, "only %d cuts", n_cuts);
    CHECK(bad == 0, "%d of %d truncations of %s not reported as truncated", bad, n_cuts, path);
    free(file);
}

/* Random byte corruptions of the header/metadata/directory: any outcome but a
 * crash (or, under the sanitizers, an over-read) is acceptable; a failure must
 * come with a message. */
static void test_random_corruption(void) {
    marks m;
    size_t size;
    uint8_t *file = build_default(&size, &m);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int n_fail = 0, no_msg = 0;
    uint8_t *p = malloc(size);
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(p, file, size);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            size_t at = (size_t)(rng % m.data_off);
            p[at] = (uint8_t)(iter & 1 ? rng >> 32 : p[at] ^ (1u << (rng >> 40) % 8));
        }
        gguf_file *f = NULL;
        ellm_error err = {0};
        if (gguf_open_memory(p, size, &f, &err) == ELLM_OK) {
            check_invariants(f, "corrupted");
            gguf_close(f);
        } else {
            n_fail++;
            if (strncmp(err.msg, "gguf: ", 6) != 0) no_msg++;
        }
    }
    CHECK(no_msg == 0, "%d failures without a message", no_msg);
    CHECK(n_fail > 1000, "only %d of 20000 corruptions rejected", n_fail);
    free(p);
    free(file);
}

/* ---- 4. files on disk ----------------------------------------------------- */

static void test_open_errors(void) {
    gguf_file *f = (gguf_file *)1;
    ellm_error err;
    const char *missing = "tests/data/no-such-model.gguf";
    CHECK(gguf_open(missing, &f, &err) == ELLM_ERR_IO && f == NULL && contains(err.msg, missing) &&
          contains(err.msg, "No such file"), "missing file: %s", err.msg);
    CHECK(gguf_open(test_data_dir(), &f, &err) == ELLM_ERR_IO && contains(err.msg, test_data_dir()) &&
          contains(err.msg, "directory"), "directory: %s", err.msg);

    /* A malformed file on disk: the message names the path and the problem. */
    char path[] = "/tmp/ellm_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    marks m;
    size_t size;
    uint8_t *file = build_default(&size, &m);
    put32(file + 4, 1);
    CHECK(write(fd, file, size) == (ssize_t)size, "write");
    CHECK(gguf_open(path, &f, &err) == ELLM_ERR_UNSUPPORTED && contains(err.msg, path) &&
          contains(err.msg, "version 1"), "bad file on disk: %s", err.msg);
    CHECK(ftruncate(fd, 0) == 0, "truncate");
    CHECK(gguf_open(path, &f, &err) == ELLM_ERR_FORMAT && contains(err.msg, path) &&
          contains(err.msg, "0 bytes"), "empty file: %s", err.msg);
    close(fd);
    unlink(path);
    free(file);
}

/* A 1 GiB model (sparse on disk) with a 150k-entry vocabulary opens in
 * milliseconds: only the header, metadata and directory pages are read. */
static void test_open_speed(void) {
    static const tspec big[] = {
        {"token_embd.weight", 2, {4096, 32768, 1, 1}, 1},         /* 256 MiB f16 */
        {"blk.0.ffn_up.weight", 2, {4096, 14336 * 8, 1, 1}, 12},  /* 252 MiB q4_k */
        {"output.weight", 2, {4096, 65536, 1, 1}, 1},             /* 512 MiB f16 */
    };
    build_opts o = {.all_kvs = 1, .tensors = big, .n_tensors = 3, .no_data = 1, .n_vocab = 151936};
    marks m;
    size_t size;
    uint8_t *file = build(&o, &size, &m);
    size_t total = m.data_off;
    for (int i = 0; i < 3; i++) {
        size_t e = m.data_off + m.t_data_off[i] + tensor_bytes(big[i].type, big[i].ne);
        if (e > total) total = e;
    }
    char path[] = "/tmp/ellm_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) {
        free(file);
        return;
    }
    int ok = write(fd, file, size) == (ssize_t)size && ftruncate(fd, (off_t)total) == 0;
    close(fd);
    CHECK(ok, "cannot write %s", path);
    if (ok) {
        gguf_file *f = NULL;
        ellm_error err;
        double t0 = now_ms();
        ellm_status st = gguf_open(path, &f, &err);
        double ms = now_ms() - t0;
        CHECK(st == ELLM_OK, "%s", err.msg);
        printf("open %zu MiB sparse model with 151936 tokens: %.3f ms\n", total >> 20, ms);
        CHECK(ms < 100, "opening a %zu-byte file took %.1f ms", total, ms);
        if (f) {
            const gguf_tensor *t = gguf_find_tensor(f, "output.weight");
            CHECK(t && t->n_bytes == 512u << 20 && gguf_size(f) == total, "big tensor");
            CHECK(arr_str_is(f, "tokenizer.ggml.tokens", 151935, "tok151935") &&
                  arr_str_is(f, "tokenizer.ggml.tokens", 70000, "tok70000"), "vocabulary");
            gguf_close(f);
        }
    }
    unlink(path);
    free(file);
}

int main(void) {
    test_all_fixtures();
    test_llama_gqa();
    test_quantized_fixture();
    test_other_fixtures();
    test_round_trips();
    test_header_errors();
    test_metadata_errors();
    test_directory_errors();
    test_truncation_synthetic();
    test_truncation_fixture();
    test_random_corruption();
    test_open_errors();
    test_open_speed();
    return test_finish();
}
