/* Safetensors reader: one file or a sharded set (model.safetensors.index.json),
 * each file mapped read-only; tensor data stays in the mapping.
 *
 * File layout: u64 N (little-endian) | N bytes of JSON header | data section.
 * The header maps each tensor name to {"dtype": "F32", "shape": [rows, cols],
 * "data_offsets": [begin, end]} with offsets relative to the data section;
 * "__metadata__" holds free-form strings and is ignored.
 *
 * Safe on untrusted input: the header length must lie inside the file, every
 * tensor's [begin, end) inside the data section, shape x dtype size must equal
 * end - begin, and tensors may not overlap. A failure names the file and the
 * tensor ("'model.safetensors': tensor 'lm_head.weight': data_offsets [a, b)
 * end past the data section (N bytes)"). Nothing here aborts or prints. */
#ifndef ELLM_CONVERT_SAFETENSORS_H
#define ELLM_CONVERT_SAFETENSORS_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

/* Element types. Only F32, F16 and BF16 can be converted; the others are
 * known so that headers holding them still validate (a checkpoint may carry
 * integer buffers the converter never reads). */
typedef enum {
    ST_F32, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL,
    ST_U16, ST_U32, ST_U64, ST_F8_E4M3, ST_F8_E5M2, ST_DTYPE_COUNT
} st_dtype;

#define ST_MAX_DIMS 8

typedef struct {
    const char *name;          /* NUL-terminated, owned by the set */
    st_dtype dtype;
    int n_dims;                /* 0..ST_MAX_DIMS (0: a scalar) */
    int64_t shape[ST_MAX_DIMS]; /* outermost first, as in PyTorch: [rows, cols] */
    const void *data;          /* inside the mapping; may be unaligned */
    size_t n_bytes;
    int file;                  /* index of the file that holds it */
} st_tensor;

typedef struct st_set st_set;

/* Name ("F32") and element size in bytes of a dtype. */
const char *st_dtype_name(st_dtype t);
size_t st_dtype_size(st_dtype t);

/* Opens the checkpoint in directory `dir`: model.safetensors.index.json (its
 * "weight_map" names the shard of every tensor; each shard is opened once and
 * must hold exactly the tensors the index gives it) or else model.safetensors.
 * ELLM_ERR_IO if neither exists. */
ellm_status st_open_dir(const char *dir, st_set **out, ellm_error *err);
/* Opens one .safetensors file. */
ellm_status st_open_file(const char *path, st_set **out, ellm_error *err);
/* Parses a caller-owned buffer holding a whole .safetensors file (not copied;
 * must outlive the set). `what` names it in messages. */
ellm_status st_open_memory(const void *data, size_t size, const char *what, st_set **out,
                           ellm_error *err);
void st_close(st_set *s);

int64_t st_n_tensors(const st_set *s);
/* Tensors in name order. */
const st_tensor *st_tensor_at(const st_set *s, int64_t i);
/* The tensor named `name`, or NULL. */
const st_tensor *st_find(const st_set *s, const char *name);
/* Path (or `what`) of file i, for messages. */
const char *st_file_name(const st_set *s, int file);
/* Drops the process's pages of tensor t's data (a mapped file's pages stay
 * in the page cache; a later read maps them again): after a tensor is
 * converted, so resident memory stays near one tensor whatever the
 * checkpoint's size. Nothing for a set opened from memory. */
void st_release(const st_set *s, const st_tensor *t);
/* Asks the kernel to start reading tensor t's bytes from disk now (the
 * converter calls it for the next tensor while it converts one), so a cold
 * read overlaps the work instead of waiting on page faults. */
void st_prefetch(const st_set *s, const st_tensor *t);
/* Total bytes of tensor data. */
uint64_t st_data_bytes(const st_set *s);

#endif
