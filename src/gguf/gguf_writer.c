/* GGUF v3 writer (see gguf_writer.h for the layout). Metadata is serialized
 * into one growing byte buffer as it is added; tensors are kept as descriptors
 * and their data is streamed at write time. */
#include "gguf/gguf_writer.h"

#include "core/async_writer.h"
#include "core/status.h"
#include "kernels/quant.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Values are copied in host order; GGUF is little-endian. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "gguf_writer assumes a little-endian host");

#define GGUF_WRITER_VERSION 3
#define GGUF_WRITER_MAX_NAME 63 /* ggml's GGML_MAX_NAME is 64 including the NUL */
/* Progress is reported at least this often (bytes). */
#define GGUF_WRITER_PROGRESS_STEP (8u << 20)

typedef struct {
    char *name;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    int type;
    size_t row_bytes;  /* bytes of one row of ne[0] elements */
    int64_t n_rows;    /* ne[1] * ne[2] * ne[3] */
    uint64_t n_bytes;  /* row_bytes * n_rows */
    const void *data;  /* borrowed data, or NULL when rows come from fn */
    gguf_writer_row_fn fn;
    void *user;
} gguf_writer_tensor;

struct gguf_writer {
    unsigned char *kv; /* serialized { key, type, value } pairs */
    size_t kv_len, kv_cap;
    size_t *key_off;   /* offset in kv of each pair (its key's u64 length) */
    int64_t n_kv, key_cap;
    gguf_writer_tensor *tensors;
    int64_t n_tensors, tensor_cap;
    uint32_t alignment;
    ellm_error first_err; /* first failure; status ELLM_OK while there is none */
    gguf_writer_progress_fn progress;
    void *progress_user;
};

/* Records a failure (keeping only the first in the writer) and returns it. */
static ellm_status gw_fail(gguf_writer *w, ellm_error *err, ellm_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static ellm_status gw_fail(gguf_writer *w, ellm_error *err, ellm_status st, const char *fmt, ...) {
    ellm_error e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    e.status = st;
    if (w && w->first_err.status == ELLM_OK) w->first_err = e;
    if (err) *err = e;
    return st;
}

ellm_status gguf_writer_init(gguf_writer **out, ellm_error *err) {
    *out = NULL;
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return ellm_fail(err, ELLM_ERR_NOMEM, "gguf writer: out of memory");
    w->alignment = 32;
    w->first_err.status = ELLM_OK;
    *out = w;
    return ELLM_OK;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->tensors);
    free(w->key_off);
    free(w->kv);
    free(w);
}

void gguf_writer_set_progress(gguf_writer *w, gguf_writer_progress_fn fn, void *user) {
    w->progress = fn;
    w->progress_user = user;
}

int64_t gguf_writer_n_kv(const gguf_writer *w) { return w->n_kv; }
int64_t gguf_writer_n_tensors(const gguf_writer *w) { return w->n_tensors; }

/* ---- metadata buffer ---- */

/* Makes room for `n` more bytes in the metadata buffer; 0 on success. */
static int kv_reserve(gguf_writer *w, size_t n) {
    if (n > SIZE_MAX / 2 - w->kv_len) return -1;
    if (w->kv_len + n <= w->kv_cap) return 0;
    size_t cap = w->kv_cap ? w->kv_cap : 4096;
    while (cap < w->kv_len + n) cap *= 2;
    unsigned char *p = realloc(w->kv, cap);
    if (!p) return -1;
    w->kv = p;
    w->kv_cap = cap;
    return 0;
}

/* Appends bytes that kv_reserve has made room for. */
static void kv_put(gguf_writer *w, const void *src, size_t n) {
    memcpy(w->kv + w->kv_len, src, n);
    w->kv_len += n;
}
static void kv_put_u32(gguf_writer *w, uint32_t v) { kv_put(w, &v, 4); }
static void kv_put_u64(gguf_writer *w, uint64_t v) { kv_put(w, &v, 8); }

/* Bytes of one element of a fixed-size value type; 0 for string, array, unknown. */
static size_t type_size(gguf_value_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* Checks `key` and appends it with its value type; the caller then reserves and
 * appends the value. On failure the buffer is unchanged. */
static ellm_status kv_begin(gguf_writer *w, const char *key, uint32_t type, size_t value_bytes,
                            ellm_error *err) {
    if (!key || !*key) return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: empty metadata key");
    size_t klen = strlen(key);
    for (int64_t i = 0; i < w->n_kv; i++) {
        uint64_t len;
        memcpy(&len, w->kv + w->key_off[i], 8);
        if (len == klen && memcmp(w->kv + w->key_off[i] + 8, key, klen) == 0)
            return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: duplicate metadata key '%s'", key);
    }
    if (w->n_kv == w->key_cap) {
        int64_t cap = w->key_cap ? w->key_cap * 2 : 32;
        size_t *p = realloc(w->key_off, (size_t)cap * sizeof *p);
        if (!p) return gw_fail(w, err, ELLM_ERR_NOMEM, "gguf writer: out of memory adding '%s'", key);
        w->key_off = p;
        w->key_cap = cap;
    }
    if (value_bytes > SIZE_MAX / 4 || kv_reserve(w, 8 + klen + 4 + value_bytes))
        return gw_fail(w, err, ELLM_ERR_NOMEM, "gguf writer: out of memory adding '%s'", key);
    w->key_off[w->n_kv++] = w->kv_len;
    kv_put_u64(w, klen);
    kv_put(w, key, klen);
    kv_put_u32(w, type);
    return ELLM_OK;
}

static ellm_status add_scalar(gguf_writer *w, const char *key, gguf_value_type t, const void *v,
                              ellm_error *err) {
    size_t n = type_size(t);
    ellm_status st = kv_begin(w, key, t, n, err);
    if (st != ELLM_OK) return st;
    kv_put(w, v, n);
    return ELLM_OK;
}

ellm_status gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v, ellm_error *err) {
    return add_scalar(w, key, GGUF_TYPE_UINT8, &v, err);
}
ellm_status gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v, ellm_error *err) {
    return add_scalar(w, key, GGUF_TYPE_INT8, &v, err);
}
ellm_status gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v, ellm_error *err) {
    return add_scalar(w, key, GGUF_TYPE_UINT16, &v, err);
}
ellm_status gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v, ellm_error *err) {
    return add_scalar(w, key, GGUF_TYPE_INT16, &v, err);
}
ellm_status gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v, ellm_error *err) {
    return add_scalar(w, key, GGUF_TYPE_UINT32, &v, err);
}
ellm_status gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v, ellm_error *err) {
    return add_scalar(w, key, GGUF_TYPE_INT32, &v, err);
}
ellm_status gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v, ellm_error *err) {
    return add_scalar(w, key, GGUF_TYPE_UINT64, &v, err);
}
ellm_status gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v, ellm_error *err) {
    return add_scalar(w, key, GGUF_TYPE_INT64, &v, err);
}
ellm_status gguf_writer_add_f32(gguf_writer *w, const char *key, float v, ellm_error *err) {
    return add_scalar(w, key, GGUF_TYPE_FLOAT32, &v, err);
}
ellm_status gguf_writer_add_f64(gguf_writer *w, const char *key, double v, ellm_error *err) {
    return add_scalar(w, key, GGUF_TYPE_FLOAT64, &v, err);
}
ellm_status gguf_writer_add_bool(gguf_writer *w, const char *key, int v, ellm_error *err) {
    uint8_t b = v ? 1 : 0;
    return add_scalar(w, key, GGUF_TYPE_BOOL, &b, err);
}

ellm_status gguf_writer_add_strn(gguf_writer *w, const char *key, const char *v, size_t len,
                                 ellm_error *err) {
    if (!v && len) return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: '%s': NULL string", key ? key : "");
    ellm_status st = kv_begin(w, key, GGUF_TYPE_STRING, 8 + len, err);
    if (st != ELLM_OK) return st;
    kv_put_u64(w, len);
    if (len) kv_put(w, v, len);
    return ELLM_OK;
}

ellm_status gguf_writer_add_str(gguf_writer *w, const char *key, const char *v, ellm_error *err) {
    if (!v) return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: '%s': NULL string", key ? key : "");
    return gguf_writer_add_strn(w, key, v, strlen(v), err);
}

ellm_status gguf_writer_add_arr(gguf_writer *w, const char *key, gguf_value_type elem_type,
                                const void *data, uint64_t n, ellm_error *err) {
    size_t es = type_size(elem_type);
    if (!es)
        return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: '%s': array element type %d is not a number or bool",
                       key ? key : "", (int)elem_type);
    if (n && !data) return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: '%s': NULL array data", key ? key : "");
    if (n > (SIZE_MAX / 4) / es)
        return gw_fail(w, err, ELLM_ERR_NOMEM, "gguf writer: '%s': array of %llu elements is too large",
                       key ? key : "", (unsigned long long)n);
    if (elem_type == GGUF_TYPE_BOOL) {
        const uint8_t *b = data;
        for (uint64_t i = 0; i < n; i++)
            if (b[i] > 1)
                return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: '%s': bool element %llu is %u, not 0 or 1",
                               key ? key : "", (unsigned long long)i, b[i]);
    }
    size_t bytes = (size_t)n * es;
    ellm_status st = kv_begin(w, key, GGUF_TYPE_ARRAY, 4 + 8 + bytes, err);
    if (st != ELLM_OK) return st;
    kv_put_u32(w, (uint32_t)elem_type);
    kv_put_u64(w, n);
    if (bytes) kv_put(w, data, bytes);
    return ELLM_OK;
}

ellm_status gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                                    const size_t *lens, uint64_t n, ellm_error *err) {
    if (n && !strs) return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: '%s': NULL string array", key ? key : "");
    if (n > SIZE_MAX / 16)
        return gw_fail(w, err, ELLM_ERR_NOMEM, "gguf writer: '%s': array of %llu strings is too large",
                       key ? key : "", (unsigned long long)n);
    size_t bytes = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i] && (!lens || lens[i]))
            return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: '%s': string %llu is NULL", key ? key : "",
                           (unsigned long long)i);
        size_t len = lens ? lens[i] : strlen(strs[i]);
        if (len > SIZE_MAX / 4 - bytes - 8)
            return gw_fail(w, err, ELLM_ERR_NOMEM, "gguf writer: '%s': string array is too large", key ? key : "");
        bytes += 8 + len;
    }
    ellm_status st = kv_begin(w, key, GGUF_TYPE_ARRAY, 4 + 8 + bytes, err);
    if (st != ELLM_OK) return st;
    kv_put_u32(w, GGUF_TYPE_STRING);
    kv_put_u64(w, n);
    for (uint64_t i = 0; i < n; i++) {
        size_t len = lens ? lens[i] : strlen(strs[i]);
        kv_put_u64(w, len);
        if (len) kv_put(w, strs[i], len);
    }
    return ELLM_OK;
}

ellm_status gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment, ellm_error *err) {
    if (alignment == 0 || alignment > 65536 || (alignment & (alignment - 1)))
        return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: alignment %u is not a power of two in 1..65536",
                       alignment);
    ellm_status st = gguf_writer_add_u32(w, "general.alignment", alignment, err);
    if (st != ELLM_OK) return st;
    w->alignment = alignment;
    return ELLM_OK;
}

/* ---- tensors ---- */

static ellm_status add_tensor(gguf_writer *w, const char *name, int n_dims, const int64_t *ne,
                              int type, const void *data, gguf_writer_row_fn fn, void *user,
                              ellm_error *err) {
    if (!name || !*name) return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: empty tensor name");
    size_t nlen = strlen(name);
    if (nlen > GGUF_WRITER_MAX_NAME)
        return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: tensor name '%s' is longer than %d bytes", name,
                       GGUF_WRITER_MAX_NAME);
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: duplicate tensor '%s'", name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne)
        return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: tensor '%s': n_dims %d not in 1..%d", name, n_dims,
                       GGUF_MAX_DIMS);
    const qtype_info *qi = qtype_get(type);
    if (!qi) return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: tensor '%s': unknown type %d", name, type);

    gguf_writer_tensor t = {0};
    t.n_dims = n_dims;
    t.type = type;
    int64_t n_rows = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 1)
            return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: tensor '%s': ne[%d] = %lld is not positive", name,
                           d, (long long)t.ne[d]);
        if (d > 0) {
            if (t.ne[d] > INT64_MAX / n_rows)
                return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: tensor '%s': too many elements", name);
            n_rows *= t.ne[d];
        }
    }
    t.row_bytes = qtype_row_bytes(type, t.ne[0]);
    if (!t.row_bytes)
        return gw_fail(w, err, ELLM_ERR_ARG,
                       "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the %s block size %d", name,
                       (long long)t.ne[0], qi->name, qi->block_elems);
    if ((uint64_t)n_rows > (UINT64_MAX / 2) / t.row_bytes)
        return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: tensor '%s': too large", name);
    t.n_rows = n_rows;
    t.n_bytes = (uint64_t)n_rows * t.row_bytes;
    t.data = data;
    t.fn = fn;
    t.user = user;

    if (w->n_tensors == w->tensor_cap) {
        int64_t cap = w->tensor_cap ? w->tensor_cap * 2 : 64;
        gguf_writer_tensor *p = realloc(w->tensors, (size_t)cap * sizeof *p);
        if (!p) return gw_fail(w, err, ELLM_ERR_NOMEM, "gguf writer: out of memory adding tensor '%s'", name);
        w->tensors = p;
        w->tensor_cap = cap;
    }
    t.name = malloc(nlen + 1);
    if (!t.name) return gw_fail(w, err, ELLM_ERR_NOMEM, "gguf writer: out of memory adding tensor '%s'", name);
    memcpy(t.name, name, nlen + 1);
    w->tensors[w->n_tensors++] = t;
    return ELLM_OK;
}

ellm_status gguf_writer_add_tensor(gguf_writer *w, const char *name, int n_dims, const int64_t *ne,
                                   int type, const void *data, ellm_error *err) {
    if (!data) return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: tensor '%s': NULL data", name ? name : "");
    return add_tensor(w, name, n_dims, ne, type, data, NULL, NULL, err);
}

ellm_status gguf_writer_add_tensor_rows(gguf_writer *w, const char *name, int n_dims,
                                        const int64_t *ne, int type, gguf_writer_row_fn fn,
                                        void *user, ellm_error *err) {
    if (!fn) return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: tensor '%s': NULL row callback", name ? name : "");
    return add_tensor(w, name, n_dims, ne, type, NULL, fn, user, err);
}

/* ---- sizes ---- */

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Bytes before the data section: header, metadata and directory (unpadded). */
static uint64_t meta_size(const gguf_writer *w) {
    uint64_t n = 4 + 4 + 8 + 8 + w->kv_len;
    for (int64_t i = 0; i < w->n_tensors; i++)
        n += 8 + strlen(w->tensors[i].name) + 4 + 8 * (uint64_t)w->tensors[i].n_dims + 4 + 8;
    return n;
}

uint64_t gguf_writer_file_size(const gguf_writer *w) {
    uint64_t n = align_up(meta_size(w), w->alignment);
    for (int64_t i = 0; i < w->n_tensors; i++) n += align_up(w->tensors[i].n_bytes, w->alignment);
    return n;
}

/* ---- writing ---- */

typedef struct {
    gguf_writer *w;
    FILE *fp;
    async_writer *aw; /* background writes to fp, or NULL: fwrite here */
    const char *what;
    uint64_t done, total, last_report;
} gw_out;

/* Output buffers of the background writer (two of them). */
#define GGUF_WRITER_ASYNC_BYTES ((size_t)8 << 20)

static ellm_status out_write(gw_out *o, const void *p, size_t n, ellm_error *err) {
    if (o->aw && n) {
        int e = async_writer_put(o->aw, p, n);
        if (e)
            return gw_fail(o->w, err, ELLM_ERR_IO, "writing '%s' before byte %llu: %s", o->what,
                           (unsigned long long)(o->done + n), strerror(e));
    } else if (n && fwrite(p, 1, n, o->fp) != n) {
        int e = errno;
        return gw_fail(o->w, err, ELLM_ERR_IO, "writing '%s' at byte %llu: %s", o->what,
                       (unsigned long long)o->done, e ? strerror(e) : "write error");
    }
    o->done += n;
    if (o->w->progress && o->done - o->last_report >= GGUF_WRITER_PROGRESS_STEP) {
        o->last_report = o->done;
        o->w->progress(o->w->progress_user, o->done, o->total);
    }
    return ELLM_OK;
}

static ellm_status out_u32(gw_out *o, uint32_t v, ellm_error *err) { return out_write(o, &v, 4, err); }
static ellm_status out_u64(gw_out *o, uint64_t v, ellm_error *err) { return out_write(o, &v, 8, err); }

static ellm_status out_pad(gw_out *o, ellm_error *err) {
    static const unsigned char zeros[64];
    uint64_t pad = align_up(o->done, o->w->alignment) - o->done;
    while (pad) {
        size_t n = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        ellm_status st = out_write(o, zeros, n, err);
        if (st != ELLM_OK) return st;
        pad -= n;
    }
    return ELLM_OK;
}

static ellm_status write_tensor_data(gw_out *o, const gguf_writer_tensor *t, unsigned char *row,
                                     ellm_error *err) {
    ellm_status st;
    if (t->data) {
        /* In chunks, so that progress is reported inside large tensors. */
        const unsigned char *p = t->data;
        uint64_t left = t->n_bytes;
        while (left) {
            size_t n = left < GGUF_WRITER_PROGRESS_STEP ? (size_t)left : GGUF_WRITER_PROGRESS_STEP;
            if ((st = out_write(o, p, n, err)) != ELLM_OK) return st;
            p += n;
            left -= n;
        }
        return ELLM_OK;
    }
    for (int64_t r = 0; r < t->n_rows; r++) {
        ellm_error e = {0};
        st = t->fn(t->user, r, row, t->row_bytes, &e);
        if (st != ELLM_OK)
            return gw_fail(o->w, err, st, "tensor '%s' row %lld: %s", t->name, (long long)r,
                           e.msg[0] ? e.msg : ellm_status_str(st));
        if ((st = out_write(o, row, t->row_bytes, err)) != ELLM_OK) return st;
    }
    return ELLM_OK;
}

/* Writes to `fp`; the failure of one write is not remembered by the writer,
 * which may be written again (to another file). */
static ellm_status write_fp(gguf_writer *w, FILE *fp, const char *what, ellm_error *err) {
    gw_out o = {w, fp, NULL, what, 0, gguf_writer_file_size(w), 0};
    ellm_status st;
    size_t max_row = 0;
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].fn && w->tensors[i].row_bytes > max_row) max_row = w->tensors[i].row_bytes;
    unsigned char *row = NULL;
    if (max_row && !(row = malloc(max_row)))
        return gw_fail(w, err, ELLM_ERR_NOMEM, "writing '%s': out of memory for a %zu-byte row", what, max_row);

    /* Rows are produced (converted, quantized) while the previous 8 MB go
     * to the kernel; small files are written directly. */
    if (o.total >= 2 * GGUF_WRITER_ASYNC_BYTES) o.aw = async_writer_open(fp, GGUF_WRITER_ASYNC_BYTES);
    errno = 0;
    if ((st = out_write(&o, "GGUF", 4, err)) || (st = out_u32(&o, GGUF_WRITER_VERSION, err)) ||
        (st = out_u64(&o, (uint64_t)w->n_tensors, err)) || (st = out_u64(&o, (uint64_t)w->n_kv, err)) ||
        (st = out_write(&o, w->kv, w->kv_len, err)))
        goto done;

    uint64_t offset = 0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const gguf_writer_tensor *t = &w->tensors[i];
        size_t nlen = strlen(t->name);
        if ((st = out_u64(&o, nlen, err)) || (st = out_write(&o, t->name, nlen, err)) ||
            (st = out_u32(&o, (uint32_t)t->n_dims, err)))
            goto done;
        for (int d = 0; d < t->n_dims; d++)
            if ((st = out_u64(&o, (uint64_t)t->ne[d], err))) goto done;
        if ((st = out_u32(&o, (uint32_t)t->type, err)) || (st = out_u64(&o, offset, err))) goto done;
        offset += align_up(t->n_bytes, w->alignment);
    }
    if ((st = out_pad(&o, err))) goto done;

    for (int64_t i = 0; i < w->n_tensors; i++) {
        if ((st = write_tensor_data(&o, &w->tensors[i], row, err)) || (st = out_pad(&o, err))) goto done;
        if (w->progress && o.last_report != o.done) {
            o.last_report = o.done;
            w->progress(w->progress_user, o.done, o.total);
        }
    }
    if (o.aw) {
        int e = async_writer_close(o.aw);
        o.aw = NULL;
        if (e) {
            st = gw_fail(w, err, ELLM_ERR_IO, "writing '%s': %s", what, strerror(e));
            goto done;
        }
    }
    if (fflush(fp) != 0 || ferror(fp)) {
        int e = errno;
        st = gw_fail(w, err, ELLM_ERR_IO, "writing '%s': %s", what, e ? strerror(e) : "write error");
        goto done;
    }
    ELLM_ASSERT(o.done == o.total);
    if (w->progress && o.last_report != o.done) w->progress(w->progress_user, o.done, o.total);
    st = ELLM_OK;
done:
    if (o.aw) async_writer_close(o.aw); /* after a failure: stop the thread, the error is st's */
    free(row);
    return st;
}

ellm_status gguf_writer_write_fp(gguf_writer *w, FILE *fp, const char *what, ellm_error *err) {
    if (w->first_err.status != ELLM_OK) {
        if (err) *err = w->first_err;
        return w->first_err.status;
    }
    ellm_status st = write_fp(w, fp, what ? what : "gguf output", err);
    w->first_err.status = ELLM_OK;
    return st;
}

/* Creates `path` and writes it (see gguf_writer_write). */
static ellm_status write_path(gguf_writer *w, const char *path, ellm_error *err) {
    if (!path || !*path) return gw_fail(w, err, ELLM_ERR_ARG, "gguf writer: empty output path");
    FILE *fp = fopen(path, "wb");
    if (!fp) return gw_fail(w, err, ELLM_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    /* Only a regular file is removed after a failure (never /dev/full, a FIFO...). */
    struct stat sb;
    int regular = fstat(fileno(fp), &sb) == 0 && S_ISREG(sb.st_mode);

    /* Say so up front rather than after minutes of writing; the byte-by-byte
     * checks below still catch a disk that fills up meanwhile. Unprivileged
     * users get f_bavail. */
    uint64_t need = gguf_writer_file_size(w);
    struct statvfs sv;
    if (regular && fstatvfs(fileno(fp), &sv) == 0 && sv.f_frsize &&
        (uint64_t)sv.f_bavail < (need + sv.f_frsize - 1) / sv.f_frsize) {
        uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
        fclose(fp);
        if (regular) unlink(path);
        return gw_fail(w, err, ELLM_ERR_IO, "cannot write '%s': it needs %.2f GB but only %.2f GB are free", path,
                       need / 1e9, avail / 1e9);
    }

    /* Large buffer: rows are often a few hundred bytes. */
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    ellm_status st = write_fp(w, fp, path, err);
    errno = 0;
    if (fclose(fp) != 0 && st == ELLM_OK)
        st = gw_fail(w, err, ELLM_ERR_IO, "closing '%s': %s", path, errno ? strerror(errno) : "write error");
    if (st != ELLM_OK && regular) unlink(path);
    return st;
}

ellm_status gguf_writer_write(gguf_writer *w, const char *path, ellm_error *err) {
    if (w->first_err.status != ELLM_OK) {
        if (err) *err = w->first_err;
        return w->first_err.status;
    }
    ellm_status st = write_path(w, path, err);
    w->first_err.status = ELLM_OK;
    return st;
}

ellm_status gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, int64_t k, ellm_error *err) {
    if (k < 0 || k >= gguf_n_kv(src))
        return ellm_fail(err, ELLM_ERR_ARG, "gguf writer: no metadata pair %lld to copy", (long long)k);
    const char *key = gguf_key_name(src, k);
    gguf_value_type t = gguf_kv_type(src, k);
    ellm_status st;
    int64_t iv;
    double fv;
    int bv;
    switch (t) {
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64:
        if ((st = gguf_get_f64(src, key, &fv, err)) != ELLM_OK) return st;
        return t == GGUF_TYPE_FLOAT32 ? gguf_writer_add_f32(w, key, (float)fv, err)
                                      : gguf_writer_add_f64(w, key, fv, err);
    case GGUF_TYPE_BOOL:
        if ((st = gguf_get_bool(src, key, &bv, err)) != ELLM_OK) return st;
        return gguf_writer_add_bool(w, key, bv, err);
    case GGUF_TYPE_STRING: {
        const char *s;
        size_t len;
        if ((st = gguf_get_str(src, key, &s, &len, err)) != ELLM_OK) return st;
        return gguf_writer_add_strn(w, key, s, len, err);
    }
    case GGUF_TYPE_ARRAY: {
        gguf_value_type et;
        uint64_t n;
        const void *data;
        if ((st = gguf_get_arr(src, key, &et, &n, &data, err)) != ELLM_OK) return st;
        if (et != GGUF_TYPE_STRING) return gguf_writer_add_arr(w, key, et, data, n, err);
        if (n > SIZE_MAX / 16) return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': array too large", key);
        const char **strs = malloc((size_t)(n ? n : 1) * sizeof *strs);
        size_t *lens = malloc((size_t)(n ? n : 1) * sizeof *lens);
        st = strs && lens ? ELLM_OK : ellm_fail(err, ELLM_ERR_NOMEM, "out of memory copying '%s'", key);
        for (uint64_t i = 0; i < n && st == ELLM_OK; i++)
            if (gguf_get_arr_str(src, k, i, &strs[i], &lens[i]) != ELLM_OK)
                st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': cannot read string %llu", key, (unsigned long long)i);
        if (st == ELLM_OK) st = gguf_writer_add_arr_str(w, key, strs, lens, n, err);
        free(strs);
        free(lens);
        return st;
    }
    default: /* integers */
        if ((st = gguf_get_i64(src, key, &iv, err)) != ELLM_OK) return st;
        switch (t) {
        case GGUF_TYPE_UINT8: return gguf_writer_add_u8(w, key, (uint8_t)iv, err);
        case GGUF_TYPE_INT8: return gguf_writer_add_i8(w, key, (int8_t)iv, err);
        case GGUF_TYPE_UINT16: return gguf_writer_add_u16(w, key, (uint16_t)iv, err);
        case GGUF_TYPE_INT16: return gguf_writer_add_i16(w, key, (int16_t)iv, err);
        case GGUF_TYPE_UINT32: return gguf_writer_add_u32(w, key, (uint32_t)iv, err);
        case GGUF_TYPE_INT32: return gguf_writer_add_i32(w, key, (int32_t)iv, err);
        case GGUF_TYPE_UINT64: return gguf_writer_add_u64(w, key, (uint64_t)iv, err);
        case GGUF_TYPE_INT64: return gguf_writer_add_i64(w, key, iv, err);
        default: return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': unknown value type %d", key, (int)t);
        }
    }
}
