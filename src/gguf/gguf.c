/* GGUF v2/v3 reader.
 *
 * File layout (all integers little-endian):
 *
 *   header     "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   metadata   n_kv x (string key | u32 value type | value)
 *   directory  n_tensors x (string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset)
 *   padding    up to a multiple of `general.alignment` (default 32)
 *   data       tensor i at data_start + offset_i, each offset a multiple of the alignment
 *
 *   string = u64 length | bytes (no NUL)
 *   array  = u32 element type | u64 count | count elements
 *
 * v1 used 32-bit counts and lengths and is rejected. v2 and v3 share one layout
 * (v3 only allowed big-endian files, which are rejected here).
 *
 * Parsing is one pass over the header, metadata and directory; tensor data is
 * never touched, so opening costs O(metadata), not O(file). Strings stay in the
 * buffer; only key and tensor names are copied (to give them a NUL). */
#include "gguf/gguf.h"

#include "core/status.h"
#include "kernels/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_HEADER_BYTES 24 /* magic, version, n_tensors, n_kv */
#define GGUF_DEFAULT_ALIGNMENT 32
/* Nesting limit for arrays of arrays: bounds the recursion on hostile input. */
#define GGUF_MAX_ARRAY_DEPTH 8
/* Smallest encodings, used to reject counts that cannot fit in the bytes left
 * before allocating anything for them. A pair: key length (8) + a 1-byte key +
 * value type (4) + a 1-byte value. A tensor: name length (8) + a 1-byte name +
 * n_dims (4) + one ne (8) + type (4) + offset (8). An array header: 4 + 8. */
#define GGUF_MIN_KV_BYTES 14
#define GGUF_MIN_TENSOR_BYTES 33
#define GGUF_ARRAY_HEADER_BYTES 12
#define GGUF_STRING_HEADER_BYTES 8

/* One metadata pair. Offsets are from the start of the buffer. */
typedef struct {
    const char *name;       /* NUL-terminated, in f->names */
    size_t name_off;        /* into f->names while the arena may still move */
    gguf_value_type type;
    gguf_value_type elem_type; /* arrays only */
    uint64_t n;             /* string: byte length; array: element count; else 1 */
    size_t value_off;       /* scalar: the value; string: its bytes; array: first element */
    uint64_t *str_off;      /* string arrays: offset of element i's length prefix */
} gguf_kv;

struct gguf_file {
    const uint8_t *base;
    size_t size;
    int mapped;             /* base is our mmap of `size` bytes */
    uint32_t version;
    size_t alignment;
    size_t data_off;        /* start of the data section (may equal size if no tensors) */

    int64_t n_kv;
    gguf_kv *kvs;           /* (n_kv) in file order */
    int64_t n_tensors;
    gguf_tensor *tensors;   /* (n_tensors) in file order */

    char *names;            /* arena of NUL-terminated key and tensor names */
    size_t names_len, names_cap;

    /* Open-addressing hash tables of index + 1 (0 = empty); capacity a power of two. */
    int64_t *kv_slots;
    size_t kv_cap;
    int64_t *tensor_slots;
    size_t tensor_cap;
};

/* ---- little-endian decoding (the host may be either) ---------------------- */

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }

static const char *const gguf_type_names[GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};
/* Bytes of a scalar value; 0 for string and array, whose size is encoded. */
static const size_t gguf_type_size[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static const char *type_name(gguf_value_type t) {
    return (unsigned)t < GGUF_TYPE_COUNT ? gguf_type_names[t] : "invalid";
}

/* ---- reader --------------------------------------------------------------- */

typedef struct {
    const uint8_t *base;
    size_t size;
    size_t pos;
    ellm_error *err;
    char where[160]; /* the item being read, e.g. "key 4 'tokenizer.ggml.tokens'" */
} gguf_reader;

/* Fails with "gguf: <where>: <message>" and returns `status`. */
__attribute__((format(printf, 3, 4)))
static ellm_status fail_at(gguf_reader *r, ellm_status status, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->where[0]) return ellm_fail(r->err, status, "gguf: %s: %s", r->where, msg);
    return ellm_fail(r->err, status, "gguf: %s", msg);
}

static size_t remaining(const gguf_reader *r) { return r->size - r->pos; }

/* Checks that `n` bytes of `what` are available at the cursor. */
static ellm_status need(gguf_reader *r, size_t n, const char *what) {
    if (n <= remaining(r)) return ELLM_OK;
    return fail_at(r, ELLM_ERR_FORMAT,
                   "%s needs %zu bytes at offset %zu but the file has %zu bytes (truncated?)",
                   what, n, r->pos, r->size);
}

static ellm_status rd_u32(gguf_reader *r, const char *what, uint32_t *v) {
    ellm_status st = need(r, 4, what);
    if (st != ELLM_OK) return st;
    *v = le32(r->base + r->pos);
    r->pos += 4;
    return ELLM_OK;
}

static ellm_status rd_u64(gguf_reader *r, const char *what, uint64_t *v) {
    ellm_status st = need(r, 8, what);
    if (st != ELLM_OK) return st;
    *v = le64(r->base + r->pos);
    r->pos += 8;
    return ELLM_OK;
}

/* Reads a string; *off receives the offset of its bytes, *len their count. */
static ellm_status rd_str(gguf_reader *r, const char *what, size_t *off, size_t *len) {
    uint64_t n;
    ellm_status st = rd_u64(r, what, &n);
    if (st != ELLM_OK) return st;
    if (n > remaining(r)) {
        return fail_at(r, ELLM_ERR_FORMAT,
                       "%s is %llu bytes at offset %zu but only %zu bytes remain (truncated?)",
                       what, (unsigned long long)n, r->pos, remaining(r));
    }
    *off = r->pos;
    *len = (size_t)n;
    r->pos += (size_t)n;
    return ELLM_OK;
}

/* Validates a name read from the file: non-empty, no NUL inside (a NUL would
 * make two different names look equal through the C API). */
static ellm_status check_name(gguf_reader *r, size_t off, size_t len, const char *what) {
    if (len == 0) return fail_at(r, ELLM_ERR_FORMAT, "empty %s", what);
    if (memchr(r->base + off, 0, len)) {
        return fail_at(r, ELLM_ERR_FORMAT, "%s contains a NUL byte", what);
    }
    return ELLM_OK;
}

/* Reads and validates a value type id. */
static ellm_status rd_type(gguf_reader *r, const char *what, gguf_value_type *t) {
    uint32_t v;
    ellm_status st = rd_u32(r, what, &v);
    if (st != ELLM_OK) return st;
    if (v >= GGUF_TYPE_COUNT) {
        return fail_at(r, ELLM_ERR_FORMAT, "unknown %s %u at offset %zu (valid: 0..%d)", what,
                       v, r->pos - 4, GGUF_TYPE_COUNT - 1);
    }
    *t = (gguf_value_type)v;
    return ELLM_OK;
}

/* Skips `count` elements of type `t` (the body of an array), validating every
 * length on the way. Nested arrays recurse up to GGUF_MAX_ARRAY_DEPTH. */
static ellm_status skip_elems(gguf_reader *r, gguf_value_type t, uint64_t count, int depth) {
    if (gguf_type_size[t]) {
        size_t esize = gguf_type_size[t];
        if (count > remaining(r) / esize) {
            return fail_at(r, ELLM_ERR_FORMAT,
                           "array of %llu %s (%zu bytes each) at offset %zu does not fit in "
                           "the %zu bytes left (truncated?)",
                           (unsigned long long)count, type_name(t), esize, r->pos, remaining(r));
        }
        r->pos += (size_t)count * esize;
        return ELLM_OK;
    }
    if (t == GGUF_TYPE_STRING) {
        if (count > remaining(r) / GGUF_STRING_HEADER_BYTES) {
            return fail_at(r, ELLM_ERR_FORMAT,
                           "array of %llu strings cannot fit in the %zu bytes left at offset "
                           "%zu (corrupt or truncated?)",
                           (unsigned long long)count, remaining(r), r->pos);
        }
        for (uint64_t i = 0; i < count; i++) {
            size_t off, len;
            ellm_status st = rd_str(r, "string element", &off, &len);
            if (st != ELLM_OK) return st;
        }
        return ELLM_OK;
    }
    /* arrays of arrays */
    if (depth >= GGUF_MAX_ARRAY_DEPTH) {
        return fail_at(r, ELLM_ERR_UNSUPPORTED, "arrays nested more than %d deep at offset %zu",
                       GGUF_MAX_ARRAY_DEPTH, r->pos);
    }
    if (count > remaining(r) / GGUF_ARRAY_HEADER_BYTES) {
        return fail_at(r, ELLM_ERR_FORMAT,
                       "array of %llu arrays cannot fit in the %zu bytes left at offset %zu "
                       "(corrupt or truncated?)",
                       (unsigned long long)count, remaining(r), r->pos);
    }
    for (uint64_t i = 0; i < count; i++) {
        gguf_value_type et;
        uint64_t n;
        ellm_status st = rd_type(r, "array element type", &et);
        if (st == ELLM_OK) st = rd_u64(r, "array count", &n);
        if (st == ELLM_OK) st = skip_elems(r, et, n, depth + 1);
        if (st != ELLM_OK) return st;
    }
    return ELLM_OK;
}

/* ---- name arena and hash tables ------------------------------------------- */

/* Appends a NUL-terminated copy of `len` bytes; *off receives its position.
 * Offsets rather than pointers because the arena moves as it grows. */
static ellm_status arena_push(gguf_file *f, const uint8_t *s, size_t len, size_t *off,
                              ellm_error *err) {
    if (len >= SIZE_MAX - f->names_len) {
        return ellm_fail(err, ELLM_ERR_NOMEM, "gguf: names too large");
    }
    size_t need_cap = f->names_len + len + 1;
    if (need_cap > f->names_cap) {
        size_t cap = f->names_cap ? f->names_cap : 4096;
        while (cap < need_cap) cap = cap > SIZE_MAX / 2 ? need_cap : cap * 2;
        char *p = realloc(f->names, cap);
        if (!p) return ellm_fail(err, ELLM_ERR_NOMEM, "gguf: out of memory for %zu bytes of names", cap);
        f->names = p;
        f->names_cap = cap;
    }
    memcpy(f->names + f->names_len, s, len);
    f->names[f->names_len + len] = 0;
    *off = f->names_len;
    f->names_len += len + 1;
    return ELLM_OK;
}

/* FNV-1a: the names are short and few, a simple hash is enough. */
static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Allocates a table with at least twice `n` slots (load factor <= 1/2). */
static ellm_status table_init(int64_t n, int64_t **slots, size_t *cap, ellm_error *err) {
    size_t c = 8;
    while (c < (size_t)n * 2) c *= 2; /* n is bounded by the file size / 14 */
    *slots = calloc(c, sizeof **slots);
    if (!*slots) return ellm_fail(err, ELLM_ERR_NOMEM, "gguf: out of memory for a %zu-slot index", c);
    *cap = c;
    return ELLM_OK;
}

/* Returns the slot holding `name` (name_of(idx) compared) or the empty slot
 * where it would go. */
static size_t table_probe(const int64_t *slots, size_t cap, const char *name,
                          const char *(*name_of)(const gguf_file *, int64_t), const gguf_file *f) {
    size_t mask = cap - 1;
    size_t i = (size_t)hash_name(name) & mask;
    while (slots[i] && strcmp(name_of(f, slots[i] - 1), name) != 0) i = (i + 1) & mask;
    return i;
}

static const char *kv_name_of(const gguf_file *f, int64_t i) { return f->kvs[i].name; }
static const char *tensor_name_of(const gguf_file *f, int64_t i) { return f->tensors[i].name; }

/* ---- parsing -------------------------------------------------------------- */

static ellm_status parse_header(gguf_reader *r, gguf_file *f, uint64_t *n_tensors, uint64_t *n_kv) {
    if (r->size < GGUF_HEADER_BYTES) {
        if (r->size >= 4 && memcmp(r->base, "GGUF", 4) != 0) goto bad_magic;
        return fail_at(r, ELLM_ERR_FORMAT,
                       "file is %zu bytes, smaller than the %d-byte GGUF header (truncated?)",
                       r->size, GGUF_HEADER_BYTES);
    }
    if (memcmp(r->base, "GGUF", 4) != 0) goto bad_magic;
    uint32_t v = le32(r->base + 4);
    if (v == 1) {
        return fail_at(r, ELLM_ERR_UNSUPPORTED,
                       "GGUF version 1 is not supported (it used 32-bit lengths); re-convert "
                       "the model to GGUF v3");
    }
    if (v != 2 && v != 3) {
        uint32_t swapped = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
        if (swapped == 2 || swapped == 3) {
            return fail_at(r, ELLM_ERR_UNSUPPORTED,
                           "big-endian GGUF (version %u byte-swapped) is not supported", swapped);
        }
        return fail_at(r, ELLM_ERR_UNSUPPORTED, "GGUF version %u is not supported (expected 2 or 3)", v);
    }
    f->version = v;
    r->pos = 8;
    /* cannot fail: the size was checked against the header above */
    rd_u64(r, "n_tensors", n_tensors);
    return rd_u64(r, "n_kv", n_kv);

bad_magic:;
    const uint8_t *m = r->base;
    return fail_at(r, ELLM_ERR_FORMAT,
                   "bad magic %02x %02x %02x %02x (expected \"GGUF\" = 47 47 55 46): not a GGUF file",
                   m[0], m[1], m[2], m[3]);
}

/* Reads one metadata pair into kv (index i, for messages). */
static ellm_status parse_kv(gguf_reader *r, gguf_file *f, int64_t i, gguf_kv *kv) {
    ellm_status st;
    size_t key_off, key_len;
    snprintf(r->where, sizeof r->where, "key %lld", (long long)i);
    if ((st = rd_str(r, "key name", &key_off, &key_len)) != ELLM_OK) return st;
    if ((st = check_name(r, key_off, key_len, "key name")) != ELLM_OK) return st;
    snprintf(r->where, sizeof r->where, "key %lld '%.*s'", (long long)i,
             key_len > 96 ? 96 : (int)key_len, (const char *)r->base + key_off);
    if ((st = arena_push(f, r->base + key_off, key_len, &kv->name_off, r->err)) != ELLM_OK) return st;

    if ((st = rd_type(r, "value type", &kv->type)) != ELLM_OK) return st;
    kv->n = 1;
    if (gguf_type_size[kv->type]) {
        if ((st = need(r, gguf_type_size[kv->type], type_name(kv->type))) != ELLM_OK) return st;
        kv->value_off = r->pos;
        r->pos += gguf_type_size[kv->type];
        return ELLM_OK;
    }
    if (kv->type == GGUF_TYPE_STRING) {
        size_t len;
        if ((st = rd_str(r, "string value", &kv->value_off, &len)) != ELLM_OK) return st;
        kv->n = len;
        return ELLM_OK;
    }

    /* array */
    if ((st = rd_type(r, "array element type", &kv->elem_type)) != ELLM_OK) return st;
    if ((st = rd_u64(r, "array count", &kv->n)) != ELLM_OK) return st;
    kv->value_off = r->pos;
    if (kv->elem_type != GGUF_TYPE_STRING) return skip_elems(r, kv->elem_type, kv->n, 1);

    /* String arrays (vocabularies: up to ~150k entries) get an offset index so
     * element i is found in O(1). The count check bounds the allocation by the
     * file size. */
    if (kv->n > remaining(r) / GGUF_STRING_HEADER_BYTES) {
        return fail_at(r, ELLM_ERR_FORMAT,
                       "array of %llu strings cannot fit in the %zu bytes left at offset %zu "
                       "(corrupt or truncated?)",
                       (unsigned long long)kv->n, remaining(r), r->pos);
    }
    kv->str_off = malloc((kv->n ? (size_t)kv->n : 1) * sizeof *kv->str_off);
    if (!kv->str_off) {
        return fail_at(r, ELLM_ERR_NOMEM, "out of memory for an index of %llu strings",
                       (unsigned long long)kv->n);
    }
    for (uint64_t j = 0; j < kv->n; j++) {
        size_t off, len;
        if (remaining(r) < GGUF_STRING_HEADER_BYTES ||
            le64(r->base + r->pos) > remaining(r) - GGUF_STRING_HEADER_BYTES) {
            /* Name the element: costs nothing on the success path. */
            char what[64];
            snprintf(what, sizeof what, "string element %llu of %llu", (unsigned long long)j,
                     (unsigned long long)kv->n);
            return rd_str(r, what, &off, &len);
        }
        kv->str_off[j] = r->pos;
        r->pos += GGUF_STRING_HEADER_BYTES + (size_t)le64(r->base + r->pos);
    }
    return ELLM_OK;
}

/* Reads one directory entry (index i) into t, name offset into *name_off. */
static ellm_status parse_tensor(gguf_reader *r, gguf_file *f, int64_t i, gguf_tensor *t,
                                size_t *name_off) {
    ellm_status st;
    size_t off, len;
    snprintf(r->where, sizeof r->where, "tensor %lld", (long long)i);
    if ((st = rd_str(r, "name", &off, &len)) != ELLM_OK) return st;
    if ((st = check_name(r, off, len, "name")) != ELLM_OK) return st;
    snprintf(r->where, sizeof r->where, "tensor %lld '%.*s'", (long long)i,
             len > 96 ? 96 : (int)len, (const char *)r->base + off);
    if ((st = arena_push(f, r->base + off, len, name_off, r->err)) != ELLM_OK) return st;

    uint32_t n_dims;
    if ((st = rd_u32(r, "n_dims", &n_dims)) != ELLM_OK) return st;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        return fail_at(r, ELLM_ERR_FORMAT, "n_dims = %u (must be 1..%d)", n_dims, GGUF_MAX_DIMS);
    }
    t->n_dims = (int)n_dims;
    int64_t n_elems = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        if ((st = rd_u64(r, "ne", &ne)) != ELLM_OK) return st;
        if (ne == 0 || ne > (uint64_t)INT64_MAX) {
            return fail_at(r, ELLM_ERR_FORMAT, "ne[%u] = %llu (must be 1..2^63-1)", d,
                           (unsigned long long)ne);
        }
        t->ne[d] = (int64_t)ne;
        if (n_elems > INT64_MAX / t->ne[d]) {
            return fail_at(r, ELLM_ERR_FORMAT,
                           "shape {%lld, %lld, %lld, %lld} has more than 2^63 elements",
                           (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                           (long long)t->ne[3]);
        }
        n_elems *= t->ne[d];
    }

    uint32_t type;
    if ((st = rd_u32(r, "type", &type)) != ELLM_OK) return st;
    const qtype_info *qi = type <= (uint32_t)INT32_MAX ? qtype_get((int)type) : NULL;
    if (!qi) {
        return fail_at(r, ELLM_ERR_UNSUPPORTED, "unknown tensor type id %u", type);
    }
    t->type = (int)type;
    ELLM_ASSERT(qi->block_elems > 0 && qi->block_bytes > 0);
    /* Types that eLLM cannot compute with (qi->supported == 0) still load: the
     * file is valid, and only the code that multiplies by them needs to refuse. */
    if (t->ne[0] % qi->block_elems != 0) {
        return fail_at(r, ELLM_ERR_FORMAT,
                       "ne[0] = %lld is not a multiple of the block size %d of type %s",
                       (long long)t->ne[0], qi->block_elems, qi->name);
    }
    /* bytes = blocks per row * block bytes * rows, each step overflow-checked */
    uint64_t blocks = (uint64_t)(t->ne[0] / qi->block_elems);
    uint64_t rows = (uint64_t)(n_elems / t->ne[0]);
    if (blocks > SIZE_MAX / (size_t)qi->block_bytes ||
        rows > SIZE_MAX / (blocks * (size_t)qi->block_bytes)) {
        return fail_at(r, ELLM_ERR_FORMAT, "data size of %lld elements of type %s overflows",
                       (long long)n_elems, qi->name);
    }
    size_t row_bytes = qtype_row_bytes(t->type, t->ne[0]);
    if (row_bytes == 0) {
        return fail_at(r, ELLM_ERR_FORMAT, "ne[0] = %lld gives no valid row size for type %s",
                       (long long)t->ne[0], qi->name);
    }
    t->n_bytes = row_bytes * (size_t)rows;

    if ((st = rd_u64(r, "offset", &t->offset)) != ELLM_OK) return st;
    return ELLM_OK;
}

/* Orders tensors by data offset (then index) for the overlap check. */
typedef struct {
    uint64_t begin, end;
    int64_t idx;
} gguf_span;

static int span_cmp(const void *a, const void *b) {
    const gguf_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Checks every tensor's range against the file and against each other, then
 * sets the data pointers. */
static ellm_status place_tensors(gguf_reader *r, gguf_file *f) {
    size_t data_size = f->data_off <= f->size ? f->size - f->data_off : 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        snprintf(r->where, sizeof r->where, "tensor %lld '%.96s'", (long long)i, t->name);
        if (t->offset % f->alignment != 0) {
            return fail_at(r, ELLM_ERR_FORMAT,
                           "offset %llu is not a multiple of the alignment %zu",
                           (unsigned long long)t->offset, f->alignment);
        }
        if (f->data_off > f->size) {
            return fail_at(r, ELLM_ERR_FORMAT,
                           "the data section starts at byte %zu but the file has %zu bytes "
                           "(truncated?)", f->data_off, f->size);
        }
        if (t->offset > data_size || t->n_bytes > data_size - t->offset) {
            if (t->offset > SIZE_MAX - f->data_off || t->n_bytes > SIZE_MAX - f->data_off - t->offset) {
                return fail_at(r, ELLM_ERR_FORMAT,
                               "data at offset %llu (+%zu bytes) lies far beyond the end of the "
                               "file (%zu bytes)",
                               (unsigned long long)t->offset, t->n_bytes, f->size);
            }
            return fail_at(r, ELLM_ERR_FORMAT,
                           "data ends at byte %zu but the file has %zu bytes (truncated?)",
                           f->data_off + (size_t)t->offset + t->n_bytes, f->size);
        }
        t->data = f->base + f->data_off + t->offset;
    }
    r->where[0] = 0;

    if (f->n_tensors < 2) return ELLM_OK;
    gguf_span *spans = malloc((size_t)f->n_tensors * sizeof *spans);
    if (!spans) return fail_at(r, ELLM_ERR_NOMEM, "out of memory sorting %lld tensors",
                               (long long)f->n_tensors);
    for (int64_t i = 0; i < f->n_tensors; i++) {
        spans[i] = (gguf_span){f->tensors[i].offset, f->tensors[i].offset + f->tensors[i].n_bytes, i};
    }
    qsort(spans, (size_t)f->n_tensors, sizeof *spans, span_cmp);
    ellm_status st = ELLM_OK;
    for (int64_t i = 1; i < f->n_tensors; i++) {
        if (spans[i].begin < spans[i - 1].end) {
            const gguf_span *a = &spans[i - 1], *b = &spans[i];
            st = fail_at(r, ELLM_ERR_FORMAT,
                         "tensors %lld '%.80s' [%llu, %llu) and %lld '%.80s' [%llu, %llu) "
                         "overlap in the data section",
                         (long long)a->idx, f->tensors[a->idx].name, (unsigned long long)a->begin,
                         (unsigned long long)a->end, (long long)b->idx, f->tensors[b->idx].name,
                         (unsigned long long)b->begin, (unsigned long long)b->end);
            break;
        }
    }
    free(spans);
    return st;
}

/* Sets f->alignment from `general.alignment` (default 32). */
static ellm_status read_alignment(gguf_reader *r, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t idx = gguf_find_key(f, "general.alignment");
    if (idx < 0) return ELLM_OK;
    int64_t a;
    ellm_status st = gguf_get_i64(f, "general.alignment", &a, r->err);
    if (st != ELLM_OK) return st;
    if (a <= 0 || (a & (a - 1)) != 0 || (uint64_t)a > SIZE_MAX / 2) {
        return fail_at(r, ELLM_ERR_FORMAT,
                       "general.alignment = %lld (must be a nonzero power of two)", (long long)a);
    }
    f->alignment = (size_t)a;
    return ELLM_OK;
}

/* Parses the whole buffer into f (already zeroed, base/size set). */
static ellm_status parse(gguf_file *f, ellm_error *err) {
    gguf_reader r = {.base = f->base, .size = f->size, .pos = 0, .err = err};
    uint64_t n_tensors = 0, n_kv = 0;
    ellm_status st = parse_header(&r, f, &n_tensors, &n_kv);
    if (st != ELLM_OK) return st;

    /* Counts come from the file: refuse any that could not fit in the bytes
     * left before sizing an allocation by them. */
    if (n_kv > remaining(&r) / GGUF_MIN_KV_BYTES) {
        return fail_at(&r, ELLM_ERR_FORMAT,
                       "n_kv = %llu but only %zu bytes follow the header (each pair takes at "
                       "least %d; corrupt or truncated?)",
                       (unsigned long long)n_kv, remaining(&r), GGUF_MIN_KV_BYTES);
    }
    if (n_tensors > remaining(&r) / GGUF_MIN_TENSOR_BYTES) {
        return fail_at(&r, ELLM_ERR_FORMAT,
                       "n_tensors = %llu but only %zu bytes follow the header (each tensor "
                       "takes at least %d; corrupt or truncated?)",
                       (unsigned long long)n_tensors, remaining(&r), GGUF_MIN_TENSOR_BYTES);
    }
    f->kvs = calloc(n_kv ? (size_t)n_kv : 1, sizeof *f->kvs);
    f->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *f->tensors);
    size_t *tname_off = malloc((n_tensors ? (size_t)n_tensors : 1) * sizeof *tname_off);
    if (!f->kvs || !f->tensors || !tname_off) {
        free(tname_off);
        return ellm_fail(err, ELLM_ERR_NOMEM, "gguf: out of memory for %llu keys and %llu tensors",
                         (unsigned long long)n_kv, (unsigned long long)n_tensors);
    }

    for (uint64_t i = 0; i < n_kv && st == ELLM_OK; i++) {
        st = parse_kv(&r, f, (int64_t)i, &f->kvs[i]);
        f->n_kv = (int64_t)i + 1; /* so gguf_close frees the string index */
    }
    for (uint64_t i = 0; i < n_tensors && st == ELLM_OK; i++) {
        st = parse_tensor(&r, f, (int64_t)i, &f->tensors[i], &tname_off[i]);
    }
    if (st != ELLM_OK) {
        free(tname_off);
        return st;
    }
    size_t dir_end = r.pos;
    r.where[0] = 0;

    /* The arena no longer moves: turn name offsets into pointers. */
    f->n_tensors = (int64_t)n_tensors;
    for (int64_t i = 0; i < f->n_kv; i++) f->kvs[i].name = f->names + f->kvs[i].name_off;
    for (int64_t i = 0; i < f->n_tensors; i++) f->tensors[i].name = f->names + tname_off[i];
    free(tname_off);

    if ((st = table_init(f->n_kv, &f->kv_slots, &f->kv_cap, err)) != ELLM_OK) return st;
    for (int64_t i = 0; i < f->n_kv; i++) {
        size_t s = table_probe(f->kv_slots, f->kv_cap, f->kvs[i].name, kv_name_of, f);
        if (f->kv_slots[s]) {
            return fail_at(&r, ELLM_ERR_FORMAT, "duplicate key '%.96s' (pairs %lld and %lld)",
                           f->kvs[i].name, (long long)(f->kv_slots[s] - 1), (long long)i);
        }
        f->kv_slots[s] = i + 1;
    }
    if ((st = table_init(f->n_tensors, &f->tensor_slots, &f->tensor_cap, err)) != ELLM_OK) return st;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        size_t s = table_probe(f->tensor_slots, f->tensor_cap, f->tensors[i].name, tensor_name_of, f);
        if (f->tensor_slots[s]) {
            return fail_at(&r, ELLM_ERR_FORMAT, "duplicate tensor name '%.96s' (tensors %lld and %lld)",
                           f->tensors[i].name, (long long)(f->tensor_slots[s] - 1), (long long)i);
        }
        f->tensor_slots[s] = i + 1;
    }

    if ((st = read_alignment(&r, f)) != ELLM_OK) return st;
    /* Data starts at the next multiple of the alignment. A file without tensors
     * may end before that point (vocabulary-only files do). */
    size_t pad = (f->alignment - dir_end % f->alignment) % f->alignment;
    f->data_off = pad <= SIZE_MAX - dir_end ? dir_end + pad : SIZE_MAX;
    return place_tensors(&r, f);
}

/* ---- open / close --------------------------------------------------------- */

/* Parses `size` bytes at `data` into a new gguf_file; `mapped` says whether
 * the file owns (and must munmap) the buffer. On failure nothing is kept. */
static ellm_status open_buffer(const void *data, size_t size, int mapped, gguf_file **out,
                               ellm_error *err) {
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) return ellm_fail(err, ELLM_ERR_NOMEM, "gguf: out of memory");
    f->base = data;
    f->size = size;
    ellm_status st = parse(f, err);
    if (st != ELLM_OK) {
        gguf_close(f); /* f->mapped is still 0: the caller unmaps */
        return st;
    }
    f->mapped = mapped;
    *out = f;
    return ELLM_OK;
}

/* Parses a caller-owned buffer, which must outlive the returned file. Returns
 * ELLM_OK, ELLM_ERR_FORMAT/UNSUPPORTED for a bad file, ELLM_ERR_ARG for NULL
 * arguments, ELLM_ERR_NOMEM. Safe on untrusted input. */
ellm_status gguf_open_memory(const void *data, size_t size, gguf_file **out, ellm_error *err) {
    if (!out) return ellm_fail(err, ELLM_ERR_ARG, "gguf: out is NULL");
    *out = NULL;
    if (!data && size) return ellm_fail(err, ELLM_ERR_ARG, "gguf: data is NULL");
    static const uint8_t empty[1];
    return open_buffer(data ? data : empty, size, 0, out, err);
}

/* Maps `path` read-only (pages are read lazily: tensor data is not touched)
 * and parses it. Returns ELLM_ERR_IO naming the path if it cannot be opened,
 * is not a regular file or cannot be mapped; parse errors are prefixed with
 * the path. */
ellm_status gguf_open(const char *path, gguf_file **out, ellm_error *err) {
    if (!out) return ellm_fail(err, ELLM_ERR_ARG, "gguf: out is NULL");
    *out = NULL;
    if (!path) return ellm_fail(err, ELLM_ERR_ARG, "gguf: path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ellm_fail(err, ELLM_ERR_IO, "gguf: cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return ellm_fail(err, ELLM_ERR_IO, "gguf: cannot stat '%s': %s", path, strerror(e));
    }
    if (S_ISDIR(sb.st_mode)) {
        close(fd);
        return ellm_fail(err, ELLM_ERR_IO, "gguf: '%s' is a directory, not a GGUF file", path);
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return ellm_fail(err, ELLM_ERR_IO, "gguf: '%s' is not a regular file", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return ellm_fail(err, ELLM_ERR_IO, "gguf: '%s' is too large to map (%lld bytes)", path,
                         (long long)sb.st_size);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return ellm_fail(err, ELLM_ERR_IO, "gguf: cannot map '%s' (%zu bytes): %s", path,
                             size, strerror(e));
        }
    }
    close(fd); /* the mapping keeps the file alive */

    static const uint8_t empty[1];
    ellm_status st = open_buffer(map ? map : empty, size, map != NULL, out, err);
    if (st != ELLM_OK) {
        if (map) munmap(map, size);
        if (err) {
            /* "gguf: <what>" -> "gguf: '<path>': <what>" */
            char msg[sizeof err->msg];
            const char *m = strncmp(err->msg, "gguf: ", 6) == 0 ? err->msg + 6 : err->msg;
            snprintf(msg, sizeof msg, "%s", m);
            ellm_fail(err, st, "gguf: '%s': %s", path, msg);
        }
    }
    return st;
}

/* Frees everything and unmaps the file if gguf_open mapped it. NULL is a no-op. */
void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->kvs) {
        for (int64_t i = 0; i < f->n_kv; i++) free(f->kvs[i].str_off);
    }
    free(f->kvs);
    free(f->tensors);
    free(f->names);
    free(f->kv_slots);
    free(f->tensor_slots);
    if (f->mapped) munmap((void *)f->base, f->size);
    free(f);
}

/* Header facts of an open file: version (2 or 3), alignment of the data
 * section, and the whole buffer (tensor data pointers lie inside it). */
uint32_t gguf_version(const gguf_file *f) { return f->version; }
size_t gguf_alignment(const gguf_file *f) { return f->alignment; }
const void *gguf_base(const gguf_file *f) { return f->base; }
size_t gguf_size(const gguf_file *f) { return f->size; }
int gguf_is_mapped(const gguf_file *f) { return f->mapped; }

/* ---- metadata ------------------------------------------------------------- */

/* Number of metadata pairs. */
int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }

/* Index of `key`, or -1 (also for NULL arguments). O(1) expected. */
int64_t gguf_find_key(const gguf_file *f, const char *key) {
    if (!f || !key || !f->kv_slots) return -1;
    size_t s = table_probe(f->kv_slots, f->kv_cap, key, kv_name_of, f);
    return f->kv_slots[s] - 1;
}

/* Name of pair `idx`, or NULL if out of range. */
const char *gguf_key_name(const gguf_file *f, int64_t idx) {
    return idx >= 0 && idx < f->n_kv ? f->kvs[idx].name : NULL;
}

/* Type of pair `idx`, or GGUF_TYPE_COUNT if out of range. */
gguf_value_type gguf_kv_type(const gguf_file *f, int64_t idx) {
    return idx >= 0 && idx < f->n_kv ? f->kvs[idx].type : GGUF_TYPE_COUNT;
}

/* The pair named `key`, or NULL after filling err with "key not found". */
static const gguf_kv *lookup(const gguf_file *f, const char *key, ellm_error *err) {
    int64_t i = gguf_find_key(f, key);
    if (i < 0) {
        ellm_fail(err, ELLM_ERR_FORMAT, "gguf: key '%s' not found", key ? key : "(null)");
        return NULL;
    }
    return &f->kvs[i];
}

static ellm_status wrong_type(const gguf_kv *kv, const char *expected, ellm_error *err) {
    return ellm_fail(err, ELLM_ERR_FORMAT, "gguf: key '%s' is %s, expected %s", kv->name,
                     type_name(kv->type), expected);
}

/* Reads an integer or bool pair; ELLM_ERR_FORMAT for other types or a uint64
 * above INT64_MAX. */
static ellm_status kv_int(const gguf_file *f, const gguf_kv *kv, int64_t *out, ellm_error *err) {
    const uint8_t *p = f->base + kv->value_off;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: *out = p[0]; return ELLM_OK;
    case GGUF_TYPE_INT8: *out = (int8_t)p[0]; return ELLM_OK;
    case GGUF_TYPE_UINT16: *out = le16(p); return ELLM_OK;
    case GGUF_TYPE_INT16: *out = (int16_t)le16(p); return ELLM_OK;
    case GGUF_TYPE_UINT32: *out = le32(p); return ELLM_OK;
    case GGUF_TYPE_INT32: *out = (int32_t)le32(p); return ELLM_OK;
    case GGUF_TYPE_BOOL: *out = p[0] != 0; return ELLM_OK;
    case GGUF_TYPE_INT64: *out = (int64_t)le64(p); return ELLM_OK;
    case GGUF_TYPE_UINT64: {
        uint64_t v = le64(p);
        if (v > (uint64_t)INT64_MAX) {
            return ellm_fail(err, ELLM_ERR_FORMAT, "gguf: key '%s' = %llu does not fit in int64",
                             kv->name, (unsigned long long)v);
        }
        *out = (int64_t)v;
        return ELLM_OK;
    }
    default: return wrong_type(kv, "an integer", err);
    }
}

/* Integer value of `key` (any integer type or bool, if it fits in int64). */
ellm_status gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, ellm_error *err) {
    const gguf_kv *kv = lookup(f, key, err);
    return kv ? kv_int(f, kv, out, err) : ELLM_ERR_FORMAT;
}

/* Floating value of `key` (float32, float64 or any integer type; not bool). */
ellm_status gguf_get_f64(const gguf_file *f, const char *key, double *out, ellm_error *err) {
    const gguf_kv *kv = lookup(f, key, err);
    if (!kv) return ELLM_ERR_FORMAT;
    const uint8_t *p = f->base + kv->value_off;
    if (kv->type == GGUF_TYPE_FLOAT32) {
        uint32_t bits = le32(p);
        float v;
        memcpy(&v, &bits, sizeof v);
        *out = v;
        return ELLM_OK;
    }
    if (kv->type == GGUF_TYPE_FLOAT64) {
        uint64_t bits = le64(p);
        memcpy(out, &bits, sizeof *out);
        return ELLM_OK;
    }
    if (kv->type == GGUF_TYPE_UINT64) {
        *out = (double)le64(p);
        return ELLM_OK;
    }
    if (kv->type == GGUF_TYPE_BOOL || gguf_type_size[kv->type] == 0) {
        return wrong_type(kv, "a number", err);
    }
    int64_t v;
    ellm_status st = kv_int(f, kv, &v, err);
    if (st == ELLM_OK) *out = (double)v;
    return st;
}

/* Boolean value of `key` (bool, or an integer type: nonzero is true) as 0/1. */
ellm_status gguf_get_bool(const gguf_file *f, const char *key, int *out, ellm_error *err) {
    const gguf_kv *kv = lookup(f, key, err);
    if (!kv) return ELLM_ERR_FORMAT;
    if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64 ||
        gguf_type_size[kv->type] == 0) {
        return wrong_type(kv, "a bool", err);
    }
    if (kv->type == GGUF_TYPE_UINT64 || kv->type == GGUF_TYPE_INT64) {
        *out = le64(f->base + kv->value_off) != 0;
        return ELLM_OK;
    }
    int64_t v;
    ellm_status st = kv_int(f, kv, &v, err);
    if (st == ELLM_OK) *out = v != 0;
    return st;
}

/* String value of `key`: a pointer into the buffer (not NUL-terminated). */
ellm_status gguf_get_str(const gguf_file *f, const char *key, const char **str, size_t *len,
                         ellm_error *err) {
    const gguf_kv *kv = lookup(f, key, err);
    if (!kv) return ELLM_ERR_FORMAT;
    if (kv->type != GGUF_TYPE_STRING) return wrong_type(kv, "a string", err);
    *str = (const char *)f->base + kv->value_off;
    *len = (size_t)kv->n;
    return ELLM_OK;
}

/* Array `key`: element type and count; *data points at the packed elements for
 * scalar arrays, and is NULL for arrays of strings (use gguf_get_arr_str) and
 * of arrays (accepted and validated, but opaque). */
ellm_status gguf_get_arr(const gguf_file *f, const char *key, gguf_value_type *elem_type,
                         uint64_t *n, const void **data, ellm_error *err) {
    const gguf_kv *kv = lookup(f, key, err);
    if (!kv) return ELLM_ERR_FORMAT;
    if (kv->type != GGUF_TYPE_ARRAY) return wrong_type(kv, "an array", err);
    *elem_type = kv->elem_type;
    *n = kv->n;
    *data = gguf_type_size[kv->elem_type] ? f->base + kv->value_off : NULL;
    return ELLM_OK;
}

/* Element i of the string array at key_idx, O(1). ELLM_ERR_ARG if key_idx is
 * not a string array or i is out of range. */
ellm_status gguf_get_arr_str(const gguf_file *f, int64_t key_idx, uint64_t i, const char **str,
                             size_t *len) {
    if (!f || key_idx < 0 || key_idx >= f->n_kv) return ELLM_ERR_ARG;
    const gguf_kv *kv = &f->kvs[key_idx];
    if (kv->type != GGUF_TYPE_ARRAY || kv->elem_type != GGUF_TYPE_STRING || i >= kv->n) {
        return ELLM_ERR_ARG;
    }
    const uint8_t *p = f->base + kv->str_off[i];
    *len = (size_t)le64(p);
    *str = (const char *)p + GGUF_STRING_HEADER_BYTES;
    return ELLM_OK;
}

/* ---- tensors -------------------------------------------------------------- */

/* Number of tensors in the directory. */
int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

/* Tensor i in directory order, or NULL if out of range. */
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

/* The tensor named `name`, or NULL. O(1) expected. */
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    if (!f || !name || !f->tensor_slots) return NULL;
    size_t s = table_probe(f->tensor_slots, f->tensor_cap, name, tensor_name_of, f);
    return f->tensor_slots[s] ? &f->tensors[f->tensor_slots[s] - 1] : NULL;
}
