/* Two buffers: `fill` is the producer's, `out` (when busy) the thread's. */
#include "core/async_writer.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct async_writer {
    FILE *fp;
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
        int e = 0;
        if (!failed) {
            errno = 0;
            if (fwrite(p, 1, n, a->fp) != n) e = errno ? errno : EIO;
        }
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
    a->cap = buf_bytes;
    a->buf[0] = malloc(buf_bytes);
    a->buf[1] = malloc(buf_bytes);
    if (!a->buf[0] || !a->buf[1]) goto fail;
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
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a->buf[0]);
    free(a->buf[1]);
    free(a);
    return e;
}
