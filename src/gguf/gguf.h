/* GGUF v2/v3 reader: parses the header, metadata and tensor directory of a file
 * mapped read-only (or of a caller's buffer); tensor data stays in the mapping.
 *
 * Safe on untrusted input: every count, length and offset is checked against
 * the buffer, and a failure fills `err` with a message naming the field
 * ("tensor 'blk.0.attn_q.weight': data [off, off+len) beyond end of file
 * (size N)"). Nothing here aborts. */
#ifndef ELLM_GGUF_GGUF_H
#define ELLM_GGUF_GGUF_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_value_type;

#define GGUF_MAX_DIMS 4

typedef struct {
    const char *name;     /* NUL-terminated copy owned by the gguf_file */
    int n_dims;           /* 1..4 */
    int64_t ne[GGUF_MAX_DIMS]; /* elements per dim, ne[0] fastest; unused dims 1 */
    int type;             /* ggml type id (see kernels/quant.h) */
    uint64_t offset;      /* from the start of the data section */
    size_t n_bytes;       /* size of the data */
    const void *data;     /* inside the mapping, aligned to the file's alignment */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Maps `path` read-only and parses it. */
ellm_status gguf_open(const char *path, gguf_file **out, ellm_error *err);
/* Parses a caller-owned buffer (must outlive the gguf_file; not copied). */
ellm_status gguf_open_memory(const void *data, size_t size, gguf_file **out, ellm_error *err);
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
size_t gguf_alignment(const gguf_file *f);
const void *gguf_base(const gguf_file *f); /* start of the file/buffer */
size_t gguf_size(const gguf_file *f);
int gguf_is_mapped(const gguf_file *f); /* 1: gguf_open's private mapping of the file */

/* ---- metadata ---- */
int64_t gguf_n_kv(const gguf_file *f);
/* Index of `key`, or -1. */
int64_t gguf_find_key(const gguf_file *f, const char *key);
const char *gguf_key_name(const gguf_file *f, int64_t idx);
gguf_value_type gguf_kv_type(const gguf_file *f, int64_t idx);

/* Typed getters by key. Return ELLM_OK; ELLM_ERR_FORMAT (with a message naming
 * the key) if the key is missing or has an incompatible type. Integer getters
 * accept any integer type (and bool) whose value fits; float getters accept
 * float32/float64 and integers. */
ellm_status gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, ellm_error *err);
ellm_status gguf_get_f64(const gguf_file *f, const char *key, double *out, ellm_error *err);
ellm_status gguf_get_bool(const gguf_file *f, const char *key, int *out, ellm_error *err);
/* String: pointer into the mapping (NOT NUL-terminated) and its length. */
ellm_status gguf_get_str(const gguf_file *f, const char *key, const char **str, size_t *len,
                         ellm_error *err);
/* Array: element type and count. For non-string arrays *data points at the
 * packed little-endian elements in the mapping (may be unaligned: memcpy). */
ellm_status gguf_get_arr(const gguf_file *f, const char *key, gguf_value_type *elem_type,
                         uint64_t *n, const void **data, ellm_error *err);
/* Element i of a string array (key index from gguf_find_key). */
ellm_status gguf_get_arr_str(const gguf_file *f, int64_t key_idx, uint64_t i, const char **str,
                             size_t *len);

/* ---- tensors ---- */
int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
/* The tensor named `name`, or NULL. */
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

#endif
