/* GGUF v3 writer: collects metadata (key/value pairs) and a tensor directory,
 * then writes header, metadata, directory and the aligned tensor data in one
 * pass to a FILE* or a path.
 *
 * Tensor data is either borrowed from the caller (a pointer that must stay valid
 * until the write) or produced row by row at write time by a callback, so files
 * of many GB can be written with one row in memory.
 *
 * Layout written (all integers little-endian):
 *   "GGUF" u32 version=3 u64 n_tensors u64 n_kv
 *   n_kv    x { string key, u32 type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset }
 *   zero padding to `alignment`, then each tensor's data at its offset (relative
 *   to the start of the data section), each padded with zeros to `alignment`.
 * A string is u64 length + bytes (no NUL); an array is u32 element type + u64
 * count + packed elements (strings one after another).
 *
 * Errors: every function returns an ellm_status and fills `err` (may be NULL).
 * The first failure of an add/set call is also remembered by the writer, and
 * gguf_writer_write* returns it, so a run of gguf_writer_add_* calls may be
 * checked once at the end. A failed write is not remembered: the same writer
 * may be written again, e.g. to another disk.
 * Nothing here prints or aborts. */
#ifndef ELLM_GGUF_GGUF_WRITER_H
#define ELLM_GGUF_GGUF_WRITER_H

#include "ellm.h"
#include "gguf/gguf.h"

#include <stdint.h>
#include <stdio.h>

typedef struct gguf_writer gguf_writer;

/* Produces row `row` (0 .. ne[1]*ne[2]*ne[3]-1, in file order) of a tensor into
 * `dst`, which holds exactly `n_bytes` = qtype_row_bytes(type, ne[0]) bytes.
 * Rows are requested once each, in increasing order. Returns ELLM_OK, or a status
 * (with `err` filled) that aborts the write. */
typedef ellm_status (*gguf_writer_row_fn)(void *user, int64_t row, void *dst, size_t n_bytes,
                                          ellm_error *err);

/* Told how many bytes of the file are written so far, of `total`; called at
 * least once per tensor and every few MB, and once with done == total. */
typedef void (*gguf_writer_progress_fn)(void *user, uint64_t done, uint64_t total);

/* Creates an empty writer (no metadata, no tensors, alignment 32). */
ellm_status gguf_writer_init(gguf_writer **out, ellm_error *err);
/* Frees the writer and its copies of keys, values and names. NULL is a no-op. */
void gguf_writer_free(gguf_writer *w);

/* Sets the data alignment (a power of two, 1..65536) and records it as the
 * u32 key "general.alignment", which readers need for any value but 32. */
ellm_status gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment, ellm_error *err);
/* Registers a progress callback (NULL to clear). */
void gguf_writer_set_progress(gguf_writer *w, gguf_writer_progress_fn fn, void *user);

/* ---- metadata ----
 * Keys are non-empty, unique (ELLM_ERR_ARG on a repeat) and copied; values are
 * copied immediately, so the caller's buffers may be freed right after. */
ellm_status gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v, ellm_error *err);
ellm_status gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v, ellm_error *err);
ellm_status gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v, ellm_error *err);
ellm_status gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v, ellm_error *err);
ellm_status gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v, ellm_error *err);
ellm_status gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v, ellm_error *err);
ellm_status gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v, ellm_error *err);
ellm_status gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v, ellm_error *err);
ellm_status gguf_writer_add_f32(gguf_writer *w, const char *key, float v, ellm_error *err);
ellm_status gguf_writer_add_f64(gguf_writer *w, const char *key, double v, ellm_error *err);
/* Stored as one byte, 0 or 1 (any non-zero `v` is 1). */
ellm_status gguf_writer_add_bool(gguf_writer *w, const char *key, int v, ellm_error *err);
/* A NUL-terminated string. */
ellm_status gguf_writer_add_str(gguf_writer *w, const char *key, const char *v, ellm_error *err);
/* `len` bytes of `v` (may contain NUL; need not be terminated). */
ellm_status gguf_writer_add_strn(gguf_writer *w, const char *key, const char *v, size_t len,
                                 ellm_error *err);
/* An array of `n` numbers or bools packed at `data` in the element type's size
 * and host (little-endian) order: GGUF_TYPE_UINT8 .. GGUF_TYPE_FLOAT64, except
 * STRING and ARRAY (ELLM_ERR_ARG). Bools are bytes and must be 0 or 1. */
ellm_status gguf_writer_add_arr(gguf_writer *w, const char *key, gguf_value_type elem_type,
                                const void *data, uint64_t n, ellm_error *err);
/* An array of `n` strings; lens[i] is the length of strs[i], or lens may be NULL
 * for NUL-terminated strings. */
ellm_status gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                                    const size_t *lens, uint64_t n, ellm_error *err);

/* Copies metadata pair `k` of `src` (key, value type and value, arrays of
 * strings included) into the writer. */
ellm_status gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, int64_t k, ellm_error *err);

/* ---- tensors ----
 * `name` is copied (1..63 bytes, unique); ne[0..n_dims-1] >= 1 with ne[0] a
 * multiple of the type's block size; `type` a known ggml type id
 * (kernels/quant.h). Tensors are written in the order they are added. */

/* Data borrowed from `data`: qtype_row_bytes(type, ne[0]) * ne[1]*ne[2]*ne[3]
 * bytes, which must stay valid until the write has returned. */
ellm_status gguf_writer_add_tensor(gguf_writer *w, const char *name, int n_dims,
                                   const int64_t *ne, int type, const void *data,
                                   ellm_error *err);
/* Data produced at write time by `fn(user, row, ...)`, one row of ne[0] elements
 * at a time; `user` must stay valid until the write has returned. */
ellm_status gguf_writer_add_tensor_rows(gguf_writer *w, const char *name, int n_dims,
                                        const int64_t *ne, int type, gguf_writer_row_fn fn,
                                        void *user, ellm_error *err);

/* Number of metadata pairs and tensors added so far. */
int64_t gguf_writer_n_kv(const gguf_writer *w);
int64_t gguf_writer_n_tensors(const gguf_writer *w);
/* Size in bytes of the whole file as it would be written now. */
uint64_t gguf_writer_file_size(const gguf_writer *w);

/* Writes the file to `fp` (opened for binary writing, positioned at its start
 * or wherever the file should begin) and flushes it; `what` names the target in
 * messages. Returns ELLM_ERR_IO naming the failing part (e.g. "writing
 * 'x.gguf': No space left on device"), the status of a failing row callback, or
 * the first earlier add/set failure of this writer. Does not close `fp`. */
ellm_status gguf_writer_write_fp(gguf_writer *w, FILE *fp, const char *what, ellm_error *err);
/* Creates or truncates `path`, writes the file and closes it (checking the
 * close, where a full disk may show up). Fails early with ELLM_ERR_IO if the
 * file system reports less free space than the file needs. On any failure the
 * partial file is removed. */
ellm_status gguf_writer_write(gguf_writer *w, const char *path, ellm_error *err);

#endif
