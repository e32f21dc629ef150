/* Copies of a GGUF model with metadata keys added (by the repository's GGUF
 * writer), for tests of how the loader reads them. Include after harness.h. */
#ifndef ELLM_TESTS_GGUF_COPY_H
#define ELLM_TESTS_GGUF_COPY_H

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

/* One key to add. */
typedef struct {
    const char *key;
    char kind; /* 's' string, 'n' the first v bytes of string s, 'f' f32, 'u' u32 */
    const char *s;
    double v;
} extra_key;

/* Writes a copy of src with the keys of extra[0 .. n) added after its own,
 * its data aligned to `alignment` when nonzero (else the writer's 32).
 * Returns 1 on success (a failure is a failed check). */
static int gguf_copy_with_keys(const char *src, const char *dst, uint32_t alignment, const extra_key *extra, int n) {
    gguf_file *f = NULL;
    gguf_writer *w = NULL;
    ellm_error err = {0};
    int ok = gguf_open(src, &f, &err) == ELLM_OK && gguf_writer_init(&w, &err) == ELLM_OK;
    if (ok && alignment) ok = gguf_writer_set_alignment(w, alignment, &err) == ELLM_OK;
    for (int64_t k = 0; ok && k < gguf_n_kv(f); k++) ok = gguf_writer_copy_kv(w, f, k, &err) == ELLM_OK;
    for (int i = 0; ok && i < n; i++)
        ok = (extra[i].kind == 's'   ? gguf_writer_add_str(w, extra[i].key, extra[i].s, &err)
              : extra[i].kind == 'n' ? gguf_writer_add_strn(w, extra[i].key, extra[i].s, (size_t)extra[i].v, &err)
              : extra[i].kind == 'f' ? gguf_writer_add_f32(w, extra[i].key, (float)extra[i].v, &err)
                                     : gguf_writer_add_u32(w, extra[i].key, (uint32_t)extra[i].v, &err)) == ELLM_OK;
    for (int64_t i = 0; ok && i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        ok = gguf_writer_add_tensor(w, t->name, (int)t->n_dims, t->ne, t->type, t->data, &err) == ELLM_OK;
    }
    ok = ok && gguf_writer_write(w, dst, &err) == ELLM_OK;
    CHECK(ok, "writing %s: %s", dst, err.msg);
    gguf_writer_free(w);
    gguf_close(f);
    return ok;
}

#endif
