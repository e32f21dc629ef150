/* Drafting copies of a model: the low-bit copy and its on-disk cache, and the
 * shallow cut. See draft_model.h. */
#include "spec/draft_model.h"
#include "spec/draft_map.h"
#include "core/crc32c.h"
#include "core/file_atomic.h"
#include "core/status.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define DRAFT_MAGIC "ELLMDRFT"
#define DRAFT_VERSION 1
#define DRAFT_HEADER_BYTES 4096 /* the payload starts page-aligned, for mmap */
#define DRAFT_SAMPLE_CHUNKS 64
#define DRAFT_SAMPLE_BYTES 4096

/* The cache file's header (native byte order: the file never leaves the
 * machine that wrote it). */
typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t type;          /* the low-bit type */
    uint64_t model_size;    /* the model file as it was requantized: */
    int64_t model_mtime_s, model_mtime_ns;
    uint64_t model_ino;
    uint32_t model_crc;     /* its first 64 KiB and DRAFT_SAMPLE_CHUNKS chunks spread over it */
    uint32_t payload_crc;   /* of the payload that follows the header */
    uint64_t payload_bytes;
    uint32_t n_matrices;    /* requantized (the layout follows from the model and type) */
    uint32_t pad;
} draft_header;

/* A derived model and what it owns; `m` first, so the model pointer is the
 * record's. */
typedef struct {
    ellm_model m;
    model_layer *layers;  /* m.layers: the base's, with matrices replaced */
    void *map;            /* the payload's mapping (map_bytes): the cache file, or memory it was requantized into */
    size_t map_bytes;
    float *draft_map;     /* shallow: the (d, d) map, or NULL */
    draft_quant_info info; /* quant: where the copy came from */
} draft_copy;

static void draft_copy_free(ellm_model *m) {
    draft_copy *c = (draft_copy *)m;
    free(c->layers);
    if (c->map) munmap(c->map, c->map_bytes);
    free(c->draft_map);
    free(c);
}

/* A copy of base's struct that borrows everything and owns nothing yet. */
static draft_copy *copy_init(const ellm_model *base) {
    draft_copy *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->layers = malloc((size_t)base->cfg.n_layer * sizeof *c->layers);
    if (!c->layers) {
        free(c);
        return NULL;
    }
    memcpy(c->layers, base->layers, (size_t)base->cfg.n_layer * sizeof *c->layers);
    c->m = *base;
    c->m.layers = c->layers;
    c->m.file = NULL;
    c->m.owned = NULL;
    c->m.n_owned = 0;
    c->m.plan = NULL;
    c->m.node_delta = NULL;
    c->m.replicas = NULL;
    c->m.replica_bytes = 0;
    c->m.split_by_matrix = 0;
    c->m.path = NULL;
    c->m.derived = NULL;
    memset(&c->m.draft_map, 0, sizeof c->m.draft_map);
    memset(&c->m.derived_lock, 0, sizeof c->m.derived_lock);
    return c;
}

/* The derived model of `key` already made for base, or NULL; lock held. */
static const ellm_model *find_derived(const ellm_model *base, const char *key) {
    for (const model_derived *d = base->derived; d; d = d->next)
        if (!strcmp(d->key, key)) return d->m;
    return NULL;
}

/* Keeps c with base under `key`; lock held. Frees c on failure. */
static ellm_status add_derived(ellm_model *base, const char *key, draft_copy *c, ellm_error *err) {
    model_derived *d = calloc(1, sizeof *d);
    if (!d) {
        draft_copy_free(&c->m);
        return ellm_fail(err, ELLM_ERR_NOMEM, "draft model: out of memory");
    }
    snprintf(d->key, sizeof d->key, "%s", key);
    d->m = &c->m;
    d->free_fn = draft_copy_free;
    d->next = base->derived;
    base->derived = d;
    return ELLM_OK;
}

/* ---- the low-bit copy ---------------------------------------------------- */

/* The matrices of a model in layout order: 7 per layer, then the output. */
static int n_slots(const ellm_model *m) { return m->cfg.n_layer * 7 + 1; }

static model_matrix *slot(ellm_model *m, model_layer *layers, int i) {
    if (i == m->cfg.n_layer * 7) return &m->output;
    model_layer *L = &layers[i / 7];
    model_matrix *w[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return w[i % 7];
}

/* Bytes of w's copy at `type`, or 0 if it stays borrowed (its rows would not
 * shrink or the type's blocks do not divide them). */
static size_t requant_bytes(const model_matrix *w, int type) {
    size_t rb = qtype_row_bytes(type, w->cols);
    if (!rb || rb >= w->row_bytes) return 0;
    return rb * (size_t)w->rows;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Payload layout: the requantized matrices in slot order, each 64-aligned. */
static size_t payload_bytes(ellm_model *m, int type, int *n_mat) {
    size_t total = 0;
    *n_mat = 0;
    for (int i = 0; i < n_slots(m); i++) {
        size_t b = requant_bytes(slot(m, m->layers, i), type);
        if (b) total += align64(b), (*n_mat)++;
    }
    return total;
}

/* Points c's matrices into `payload` (laid out as payload_bytes says). */
static void bind_payload(draft_copy *c, const ellm_model *base, int type, const char *payload) {
    size_t off = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < n_slots(&c->m); i++) {
        model_matrix *w = slot(&c->m, c->layers, i);
        size_t b = requant_bytes(w, type);
        if (b) {
            w->type = type;
            w->data = payload + off;
            w->row_bytes = qtype_row_bytes(type, w->cols);
            w->layout = MODEL_LAYOUT_ROWS;
            off += align64(b);
        }
        bytes += (uint64_t)w->rows * w->row_bytes;
    }
    c->m.weight_bytes = bytes;
    (void)base;
}

/* Whether w lies in the payload [p[0], p[1]): the copy's own, not borrowed
 * from the base. */
static int in_payload(const model_matrix *w, void *arg) {
    const char *const *p = arg;
    return (const char *)w->data >= p[0] && (const char *)w->data < p[1];
}

/* Rewrites c's own matrices (in the payload at p, bytes long) in the 16-row
 * interleaved layout as a model load does with the file's (model_pack_r16:
 * the payload's pages replaced by packed huge-page memory), unless the base
 * model kept its file's layout. The cache file keeps the plain layout, which
 * every CPU reads. bench_gemm, Llama-3.2-1B-shaped Q4_0 layer, 2 threads,
 * one row: 0.38 ms against 0.47 in the plain layout (3 runs,
 * bench/KQUANT.md). */
static void pack_own(draft_copy *c, const ellm_model *base, const char *p, size_t bytes) {
    if (base->keep_layout) return;
    model_matrix **list = malloc(((size_t)c->m.cfg.n_layer * 7 + 1) * sizeof *list);
    if (!list) return;
    const char *range[2] = {p, p + bytes};
    model_pack_r16(list, model_r16_candidates(&c->m, in_payload, range, list), NULL, 0);
    free(list);
}

/* Requantizes every matrix that shrinks into payload (row by row: dequantize
 * to F32, quantize with the reference quantizer). */
static ellm_status requantize(ellm_model *base, int type, char *payload, ellm_error *err) {
    int64_t widest = 0;
    for (int i = 0; i < n_slots(base); i++)
        if (slot(base, base->layers, i)->cols > widest) widest = slot(base, base->layers, i)->cols;
    float *row = malloc((size_t)widest * sizeof *row);
    if (!row) return ellm_fail(err, ELLM_ERR_NOMEM, "draft model: out of memory");
    size_t off = 0;
    for (int i = 0; i < n_slots(base); i++) {
        const model_matrix *w = slot(base, base->layers, i);
        size_t b = requant_bytes(w, type), rb = qtype_row_bytes(type, w->cols);
        if (!b) continue;
        for (int64_t r = 0; r < w->rows; r++) {
            model_matrix_row(w, r, row);
            qtype_quantize_ref(type, row, payload + off + (size_t)r * rb, w->cols);
        }
        off += align64(b);
    }
    free(row);
    return ELLM_OK;
}

/* The model file's identity as the cache header records it. */
static int model_identity(const char *path, draft_header *h) {
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return -1;
    }
    h->model_size = (uint64_t)st.st_size;
    h->model_mtime_s = (int64_t)st.st_mtim.tv_sec;
    h->model_mtime_ns = (int64_t)st.st_mtim.tv_nsec;
    h->model_ino = (uint64_t)st.st_ino;
    /* the header (metadata, tensor table) and chunks spread over the data */
    char *buf = malloc(65536);
    uint32_t crc = 0;
    if (!buf) {
        close(fd);
        return -1;
    }
    ssize_t n = pread(fd, buf, 65536, 0);
    if (n > 0) crc = crc32c_update(crc, buf, (size_t)n);
    for (int i = 0; i < DRAFT_SAMPLE_CHUNKS && st.st_size > 65536; i++) {
        off_t at = (off_t)((double)(st.st_size - DRAFT_SAMPLE_BYTES) * (i + 1) / DRAFT_SAMPLE_CHUNKS);
        n = pread(fd, buf, DRAFT_SAMPLE_BYTES, at);
        if (n > 0) crc = crc32c_update(crc, buf, (size_t)n);
    }
    free(buf);
    close(fd);
    h->model_crc = crc;
    return 0;
}

int draft_cache_paths(const char *model_path, const char *type_name, char paths[2][1024]) {
    int n = 0;
    if (!model_path || !*model_path) return 0;
    if (snprintf(paths[n], 1024, "%s.%s.ellm-draft", model_path, type_name) < 1024) n++;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[900];
    if (xdg && *xdg) snprintf(dir, sizeof dir, "%s/ellm", xdg);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/ellm", home);
    else return n;
    /* the file name plus a hash of the full path: two models of one name in
     * different folders get different files */
    char full[4096];
    const char *id = realpath(model_path, full) ? full : model_path;
    const char *base = strrchr(model_path, '/');
    base = base ? base + 1 : model_path;
    if (snprintf(paths[n], 1024, "%s/%.200s-%08x.%s.ellm-draft", dir, base, crc32c_update(0, id, strlen(id)),
                 type_name) < 1024)
        n++;
    return n;
}

/* Maps the cache file at path if it matches `want` (the model now); else
 * returns NULL with the reason in why. */
static void *cache_load(const char *path, const draft_header *want, size_t *map_bytes, char *why, size_t why_cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) snprintf(why, why_cap, "%.100s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    draft_header h;
    void *map = NULL;
    const char *bad = NULL;
    if (fstat(fd, &st) != 0 || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) bad = "unreadable or shorter than its header";
    else if (memcmp(h.magic, DRAFT_MAGIC, 8) || h.version != DRAFT_VERSION) bad = "not a draft cache of this version";
    else if (h.type != want->type || h.payload_bytes != want->payload_bytes || h.n_matrices != want->n_matrices)
        bad = "made for another type or model shape";
    else if (h.model_size != want->model_size || h.model_mtime_s != want->model_mtime_s ||
             h.model_mtime_ns != want->model_mtime_ns || h.model_ino != want->model_ino ||
             h.model_crc != want->model_crc)
        bad = "stale: the model file changed since it was made";
    else if ((uint64_t)st.st_size != DRAFT_HEADER_BYTES + h.payload_bytes)
        bad = "torn: its size does not match its header";
    if (!bad) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            map = NULL;
            bad = "cannot be mapped";
        } else if (crc32c_update(0, (const char *)map + DRAFT_HEADER_BYTES, h.payload_bytes) != h.payload_crc) {
            munmap(map, (size_t)st.st_size);
            map = NULL;
            bad = "corrupt: payload checksum mismatch";
        }
    }
    close(fd);
    if (bad) {
        snprintf(why, why_cap, "%.100s: %s", path, bad);
        return NULL;
    }
    *map_bytes = (size_t)st.st_size;
    return map;
}

/* Writes the cache file (atomically: a crash leaves the old file or none). */
static int cache_save(const char *path, const draft_header *h, const void *payload, int make_dirs) {
    if (make_dirs) { /* the user cache folder and its parent may not exist yet */
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
            *slash = 0;
            char *up = strrchr(dir, '/');
            if (up && up != dir) {
                *up = 0;
                mkdir(dir, 0755);
                *up = '/';
            }
            mkdir(dir, 0755);
        }
    }
    file_atomic af;
    ellm_error e;
    if (file_atomic_open(path, &af, &e) != ELLM_OK) return -1;
    char head[DRAFT_HEADER_BYTES];
    memset(head, 0, sizeof head);
    memcpy(head, h, sizeof *h);
    file_atomic_write(&af, head, sizeof head);
    file_atomic_write(&af, payload, h->payload_bytes);
    return file_atomic_commit(&af, &e) == ELLM_OK ? 0 : -1;
}

ellm_status draft_model_quant(ellm_model *base, int type, const ellm_model **out, draft_quant_info *info,
                              ellm_error *err) {
    *out = NULL;
    draft_quant_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    const qtype_info *qi = qtype_get(type);
    if (!qi || !qtype_has_quantizer(type))
        return ellm_fail(err, ELLM_ERR_ARG, "quant drafter: eLLM has no quantizer for type %s", qi ? qi->name : "?");
    char key[48];
    snprintf(key, sizeof key, "quant:%s", qi->name);
    pthread_mutex_lock(&base->derived_lock);
    const ellm_model *have = find_derived(base, key);
    if (have) {
        *info = ((const draft_copy *)have)->info;
        pthread_mutex_unlock(&base->derived_lock);
        *out = have;
        return ELLM_OK;
    }
    ellm_status st = ELLM_OK;
    draft_copy *c = copy_init(base);
    if (!c) {
        pthread_mutex_unlock(&base->derived_lock);
        return ellm_fail(err, ELLM_ERR_NOMEM, "quant drafter: out of memory");
    }
    draft_header want;
    memset(&want, 0, sizeof want);
    memcpy(want.magic, DRAFT_MAGIC, 8);
    want.version = DRAFT_VERSION;
    want.type = (uint32_t)type;
    int n_mat;
    want.payload_bytes = payload_bytes(base, type, &n_mat);
    want.n_matrices = (uint32_t)n_mat;
    info->n_requantized = n_mat;
    if (n_mat == 0) {
        pthread_mutex_unlock(&base->derived_lock);
        draft_copy_free(&c->m);
        return ellm_fail(err, ELLM_ERR_ARG,
                         "quant drafter: no matrix of this model gets smaller at %s (its blocks do not divide the "
                         "rows, or the weights are already that small)",
                         qi->name);
    }
    char paths[2][1024];
    int n_paths = base->path && model_identity(base->path, &want) == 0
                      ? draft_cache_paths(base->path, qi->name, paths) : 0;
    const char *payload = NULL;
    for (int i = 0; i < n_paths && !payload; i++) {
        char why[sizeof info->rejected];
        why[0] = 0;
        c->map = cache_load(paths[i], &want, &c->map_bytes, why, sizeof why);
        if (c->map) {
            payload = (const char *)c->map + DRAFT_HEADER_BYTES;
            info->state = DRAFT_CACHE_LOADED;
            snprintf(info->path, sizeof info->path, "%.1000s", paths[i]);
        } else if (why[0] && !info->rejected[0]) {
            snprintf(info->rejected, sizeof info->rejected, "%s", why);
        }
    }
    if (!payload) {
        /* its own mapping (zeroed: alignment gaps give deterministic file
         * bytes), whose pages pack_own may replace */
        c->map_bytes = want.payload_bytes;
        c->map = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (c->map == MAP_FAILED) {
            c->map = NULL;
            st = ellm_fail(err, ELLM_ERR_NOMEM, "quant drafter: out of memory for a %.1f MB copy",
                           want.payload_bytes / 1e6);
        }
        if (st == ELLM_OK) st = requantize(base, type, c->map, err);
        if (st == ELLM_OK) {
            payload = c->map;
            want.payload_crc = crc32c_update(0, payload, want.payload_bytes);
            info->state = DRAFT_CACHE_MEMORY;
            for (int i = 0; i < n_paths; i++)
                if (cache_save(paths[i], &want, payload, i > 0) == 0) {
                    info->state = DRAFT_CACHE_SAVED;
                    snprintf(info->path, sizeof info->path, "%.1000s", paths[i]);
                    break;
                }
        }
    }
    if (st == ELLM_OK) {
        bind_payload(c, base, type, payload);
        pack_own(c, base, payload, want.payload_bytes);
        info->draft_weight_bytes = c->m.weight_bytes;
        c->info = *info;
        st = add_derived(base, key, c, err);
        if (st == ELLM_OK) *out = &c->m;
    } else {
        draft_copy_free(&c->m);
    }
    pthread_mutex_unlock(&base->derived_lock);
    return st;
}

/* ---- the shallow cut ----------------------------------------------------- */

ellm_status draft_model_shallow(ellm_model *base, int n_layer, const char *map_path, const ellm_model **out,
                                ellm_error *err) {
    *out = NULL;
    if (n_layer < 1 || n_layer >= base->cfg.n_layer)
        return ellm_fail(err, ELLM_ERR_ARG, "shallow drafter: %d layers outside [1, %d) of this model", n_layer,
                         base->cfg.n_layer);
    char key[48];
    if (map_path) snprintf(key, sizeof key, "shallow:%d:map:%08x", n_layer, crc32c_update(0, map_path, strlen(map_path)));
    else snprintf(key, sizeof key, "shallow:%d", n_layer);
    pthread_mutex_lock(&base->derived_lock);
    const ellm_model *have = find_derived(base, key);
    ellm_status st = ELLM_OK;
    if (have) {
        *out = have;
    } else {
        draft_copy *c = copy_init(base);
        if (!c) {
            st = ellm_fail(err, ELLM_ERR_NOMEM, "shallow drafter: out of memory");
        } else {
            c->m.cfg.n_layer = n_layer;
            const int d = base->cfg.n_embd;
            if (map_path)
                st = draft_map_load(map_path, d, base->cfg.n_layer, n_layer, &c->draft_map, &c->m.draft_map_norm, err);
            if (st == ELLM_OK && c->draft_map)
                c->m.draft_map = (model_matrix){.type = QTYPE_F32, .data = c->draft_map, .rows = d, .cols = d,
                                                .row_bytes = (size_t)d * sizeof(float)};
            uint64_t bytes = 0; /* what a draft step reads: the kept layers, the head, the map */
            for (int i = 0; i < n_slots(&c->m); i++) {
                const model_matrix *w = slot(&c->m, c->layers, i);
                bytes += (uint64_t)w->rows * w->row_bytes;
            }
            c->m.weight_bytes = bytes + (c->draft_map ? (uint64_t)d * d * sizeof(float) : 0);
            if (st == ELLM_OK) st = add_derived(base, key, c, err);
            else draft_copy_free(&c->m);
            if (st == ELLM_OK) *out = &c->m;
        }
    }
    pthread_mutex_unlock(&base->derived_lock);
    return st;
}
