/* core/async_writer: bytes arrive in order whatever the sizes of the puts;
 * a failing file (/dev/full) reports its errno by put or close; and
 * gguf_writer, which writes files of 16 MB and more through it, names the
 * file in its error. */
#include "core/async_writer.h"
#include "gguf/gguf_writer.h"

#include "harness.h"

#include <errno.h>
#include <stdint.h>

/* Writes 3 MB + 1234 bytes to `path` in puts of changing sizes through
 * 4 KB buffers and reads them back: the O_DIRECT path on a disk file system
 * (its last, partial buffer written without it), the fallback on tmpfs. */
static void test_order(const char *path) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL, "open %s", path);
    if (!fp) return;
    async_writer *a = async_writer_open(fp, 4096);
    CHECK(a != NULL, "async_writer_open");
    if (!a) {
        fclose(fp);
        return;
    }
    /* puts of 1 byte up to several buffers, 3 MB in all */
    enum { TOTAL = (3 << 20) + 1234 };
    static unsigned char want[TOTAL], got[TOTAL];
    for (size_t i = 0; i < TOTAL; i++) want[i] = (unsigned char)(i * 2654435761u >> 13);
    size_t at = 0, step = 1;
    int e = 0;
    while (at < TOTAL && !e) {
        size_t n = step < TOTAL - at ? step : TOTAL - at;
        e = async_writer_put(a, want + at, n);
        at += n;
        step = step * 3 % 20011 + 1;
    }
    CHECK(e == 0, "put: %s", strerror(e));
    CHECK(async_writer_close(a) == 0, "close");
    CHECK(fclose(fp) == 0, "fclose");
    fp = fopen(path, "rb");
    size_t n = fp ? fread(got, 1, TOTAL, fp) : 0;
    CHECK(n == TOTAL && fgetc(fp) == EOF, "file holds %zu bytes, want %d", n, TOTAL);
    CHECK(memcmp(want, got, TOTAL) == 0, "bytes differ from what was put");
    if (fp) fclose(fp);
    unlink(path);
}

static void test_full(void) {
    FILE *fp = fopen("/dev/full", "wb");
    if (!fp) {
        SKIP("async writer on a full device: /dev/full cannot be opened");
        return;
    }
    setvbuf(fp, NULL, _IONBF, 0);
    async_writer *a = async_writer_open(fp, 1 << 16);
    CHECK(a != NULL, "async_writer_open");
    static unsigned char block[1 << 16];
    int e = 0;
    for (int i = 0; i < 8 && !e; i++) e = async_writer_put(a, block, sizeof block);
    int ec = async_writer_close(a);
    CHECK(e == ENOSPC || ec == ENOSPC, "no ENOSPC from /dev/full (put %d, close %d)", e, ec);
    fclose(fp);

    /* A 20 MB tensor: gguf_writer goes through the background writer. */
    ellm_error err = {0};
    gguf_writer *w = NULL;
    CHECK(gguf_writer_init(&w, &err) == ELLM_OK, "gguf_writer_init: %s", err.msg);
    if (!w) return;
    int64_t ne[2] = {5 << 20, 1};
    float *data = calloc((size_t)ne[0], sizeof *data);
    CHECK(data && gguf_writer_add_tensor(w, "big", 1, ne, 0 /* F32 */, data, &err) == ELLM_OK, "add: %s", err.msg);
    fp = fopen("/dev/full", "wb");
    CHECK(fp && gguf_writer_write_fp(w, fp, "/dev/full", &err) == ELLM_ERR_IO && strstr(err.msg, "/dev/full") &&
              strstr(err.msg, "No space"),
          "20 MB to /dev/full: %s", err.msg);
    if (fp) fclose(fp);
    gguf_writer_free(w);
    free(data);
}

int main(void) {
    test_order(test_tmp_path("async.bin"));
    struct stat sb;
    if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char shm[64];
        snprintf(shm, sizeof shm, "/dev/shm/ellm-async-%d.bin", (int)getpid());
        test_order(shm);
    } else {
        SKIP("async writer on tmpfs: no /dev/shm");
    }
    test_full();
    return test_finish();
}
