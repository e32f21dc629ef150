/* Two buffers: `fill` is the producer's, `out` (when busy) the thread's.
 *
 * On a regular file the thread writes full buffers with O_DIRECT: the data
 * goes to the device without a copy into the page cache, which a writer that
 * fsyncs at the end (as every atomic write here does) would flush anyway, and
 * the buffers' sizes and addresses meet its alignment. The last, partial
 * buffer is written after O_DIRECT is switched off again. A file system that
 * refuses O_DIRECT (EINVAL, e.g. tmpfs) gets ordinary writes. */
#include "core/async_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Alignment of O_DIRECT buffers, sizes and file offsets. */
#define AW_ALIGN 4096

struct async_writer {
    FILE *fp;
    int fd;       /* fp's descriptor when writing through it, else -1 */
    int flags;    /* its status flags before O_DIRECT was added */
    int direct;   /* O_DIRECT is on */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned char *buf[2];
    size_t cap;
    int cur;           /* producer's buffer */
    size_t fill;       /* bytes in buf[cur] */
    const unsigned char *out; /* buffer handed to the thread, or NULL */
    size_t out_n;
    int quit;
    int err; /* errno of the first failed write, 0 */
};

/* Writes n bytes: through the descriptor (O_DIRECT while it is on and the
 * piece is aligned) or fwrite. Returns 0 or an errno value. */
static int write_all(async_writer *a, const unsigned char *p, size_t n) {
    if (a->fd < 0) {
        errno = 0;
        return fwrite(p, 1, n, a->fp) == n ? 0 : errno ? errno : EIO;
    }
    if (a->direct && n % AW_ALIGN != 0) {
        fcntl(a->fd, F_SETFL, a->flags);
        a->direct = 0;
    }
    while (n) {
        ssize_t k = write(a->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EINVAL && a->direct) { /* O_DIRECT refused here */
            fcntl(a->fd, F_SETFL, a->flags);
            a->direct = 0;
            continue;
        }
        if (k < 0) return errno;
        if (k == 0) return EIO;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void *writer_main(void *arg) {
    async_writer *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->out && !a->quit) pthread_cond_wait(&a->cv, &a->mu);
        if (!a->out) break; /* quit with nothing pending */
        const unsigned char *p = a->out;
        size_t n = a->out_n;
        int failed = a->err != 0;
        pthread_mutex_unlock(&a->mu);
        int e = failed ? 0 : write_all(a, p, n);
        pthread_mutex_lock(&a->mu);
        if (e && !a->err) a->err = e;
        a->out = NULL;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

async_writer *async_writer_open(FILE *fp, size_t buf_bytes) {
    if (!fp || buf_bytes == 0) return NULL;
    async_writer *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->fp = fp;
    a->fd = -1;
    a->cap = (buf_bytes + AW_ALIGN - 1) / AW_ALIGN * AW_ALIGN;
    for (int i = 0; i < 2; i++)
        if (posix_memalign((void **)&a->buf[i], AW_ALIGN, a->cap) != 0) a->buf[i] = NULL;
    if (!a->buf[0] || !a->buf[1]) goto fail;
    /* A regular file at an aligned offset is written through its descriptor,
     * with O_DIRECT where allowed; anything else through fwrite. */
    struct stat sb;
    int fd = fileno(fp);
    off_t at;
    if (fflush(fp) == 0 && fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
        (at = lseek(fd, 0, SEEK_CUR)) >= 0) {
        a->fd = fd;
        a->flags = fcntl(fd, F_GETFL);
        if (a->flags >= 0 && at % AW_ALIGN == 0 && fcntl(fd, F_SETFL, a->flags | O_DIRECT) == 0) a->direct = 1;
    }
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->thread, NULL, writer_main, a) != 0) {
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        goto fail;
    }
    return a;
fail:
    free(a->buf[0]);
    free(a->buf[1]);
    free(a);
    return NULL;
}

/* Hands buf[cur] to the thread (after it finished the previous one) and
 * switches the producer to the other buffer. Returns the first error. */
static int hand_over(async_writer *a) {
    pthread_mutex_lock(&a->mu);
    while (a->out) pthread_cond_wait(&a->cv, &a->mu);
    int e = a->err;
    if (!e && a->fill) {
        a->out = a->buf[a->cur];
        a->out_n = a->fill;
        pthread_cond_broadcast(&a->cv);
        a->cur ^= 1;
        a->fill = 0;
    }
    pthread_mutex_unlock(&a->mu);
    return e;
}

int async_writer_put(async_writer *a, const void *p, size_t n) {
    const unsigned char *s = p;
    while (n) {
        size_t k = a->cap - a->fill < n ? a->cap - a->fill : n;
        memcpy(a->buf[a->cur] + a->fill, s, k);
        a->fill += k;
        s += k;
        n -= k;
        if (a->fill == a->cap) {
            int e = hand_over(a);
            if (e) return e;
        }
    }
    return 0;
}

int async_writer_close(async_writer *a) {
    if (!a) return 0;
    hand_over(a);
    pthread_mutex_lock(&a->mu);
    while (a->out) pthread_cond_wait(&a->cv, &a->mu);
    a->quit = 1;
    pthread_cond_broadcast(&a->cv);
    int e = a->err;
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    if (a->direct) fcntl(a->fd, F_SETFL, a->flags);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a->buf[0]);
    free(a->buf[1]);
    free(a);
    return e;
}
