/* Saving and restoring a context: the file behind resumable generation.
 *
 * Layout (little-endian):
 *   header  32 bytes: magic "ELLMSTAT", u32 version, u32 n_sections,
 *           u64 file_bytes, u32 reserved, u32 CRC-32C of the 28 bytes before
 *   section u32 tag, u32 reserved, u64 payload bytes, payload,
 *           u32 CRC-32C of the 16 header bytes and the payload
 * Sections, in this order:
 *   APP    the caller's bytes (the CLI keeps its settings and tokens there)
 *   MODL   identity of the model: file size, a hash of its metadata and of
 *          samples of its weights, shapes
 *   CTXT   context shape (n_ctx, KV type, block size), tokens held, counters
 *   LOGT   logits after the last token (n_vocab floats), if any
 *   SPRS   sparse budgets and their adaptation state, if the context has an index
 *   KVCB   the KV blocks holding positions [0, pos) of every (layer, head)
 * Only the blocks that hold positions are written. The sparse index is not
 * stored: it is rebuilt on load from the stored keys, which gives exactly the
 * summaries the saving context had (they are a function of the stored keys).
 * Every section is checked (length against the file, CRC) before its bytes
 * are used, so a truncated or corrupted file is an error naming what is wrong. */
#include "core/bytebuf.h"
#include "core/crc32c.h"
#include "core/file_atomic.h"
#include "core/status.h"
#include "engine/engine_impl.h"
#include "kernels/quant.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define STATE_MAGIC "ELLMSTAT"
#define STATE_VERSION 1u
#define STATE_HEADER_BYTES 32
#define SECTION_HEADER_BYTES 16
#define TAG(a, b, c, d) ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define TAG_APP TAG('A', 'P', 'P', ' ')
#define TAG_MODEL TAG('M', 'O', 'D', 'L')
#define TAG_CTX TAG('C', 'T', 'X', 'T')
#define TAG_LOGITS TAG('L', 'O', 'G', 'T')
#define TAG_SPARSE TAG('S', 'P', 'R', 'S')
#define TAG_KV TAG('K', 'V', 'C', 'B')
/* The caller's section is small settings and token lists, not gigabytes. */
#define STATE_MAX_APP_BYTES ((uint64_t)1 << 32)

/* ---- model identity ------------------------------------------------------ */

typedef struct {
    uint64_t file_bytes;
    uint64_t hash; /* FNV-1a 64 of the metadata and of samples of the weights */
    uint32_t n_layer, n_kv_head, head_dim, n_vocab, n_embd;
    char arch[32];
} model_identity;

/* The file's size and content hash (model_content_hash: its metadata and
 * samples of its weights as the file holds them, whatever layout the engine
 * reads them in, and the RoPE settings when the caller overrode the file's)
 * and the shape. */
static void identity_of(const ellm_model *m, model_identity *id) {
    memset(id, 0, sizeof *id);
    id->file_bytes = gguf_size(m->file);
    id->hash = model_content_hash(m);
    id->n_layer = (uint32_t)m->cfg.n_layer;
    id->n_kv_head = (uint32_t)m->cfg.n_head_kv;
    id->head_dim = (uint32_t)m->cfg.head_dim;
    id->n_vocab = (uint32_t)m->cfg.n_vocab;
    id->n_embd = (uint32_t)m->cfg.n_embd;
    snprintf(id->arch, sizeof id->arch, "%s", m->cfg.arch_name);
}

static void put_identity(bb_writer *b, const model_identity *id) {
    bb_put_u64(b, id->file_bytes);
    bb_put_u64(b, id->hash);
    bb_put_u32(b, id->n_layer);
    bb_put_u32(b, id->n_kv_head);
    bb_put_u32(b, id->head_dim);
    bb_put_u32(b, id->n_vocab);
    bb_put_u32(b, id->n_embd);
    bb_put(b, id->arch, sizeof id->arch);
}

static void get_identity(bb_reader *b, model_identity *id) {
    id->file_bytes = bb_get_u64(b);
    id->hash = bb_get_u64(b);
    id->n_layer = bb_get_u32(b);
    id->n_kv_head = bb_get_u32(b);
    id->head_dim = bb_get_u32(b);
    id->n_vocab = bb_get_u32(b);
    id->n_embd = bb_get_u32(b);
    bb_get(b, id->arch, sizeof id->arch);
    id->arch[sizeof id->arch - 1] = 0;
}

/* ---- writing ------------------------------------------------------------- */

static void write_section_header(file_atomic *af, uint32_t *crc, uint32_t tag, uint64_t len) {
    unsigned char h[SECTION_HEADER_BYTES] = {0};
    memcpy(h, &tag, 4);
    memcpy(h + 8, &len, 8);
    *crc = crc32c_update(0, h, sizeof h);
    file_atomic_write(af, h, sizeof h);
}

static void write_section(file_atomic *af, uint32_t tag, const void *data, size_t len) {
    uint32_t crc;
    write_section_header(af, &crc, tag, len);
    crc = crc32c_update(crc, data, len);
    file_atomic_write(af, data, len);
    file_atomic_write(af, &crc, 4);
}

static void put_stats(bb_writer *b, const struct ellm_context *ctx) {
    const ellm_context_stats *s = &ctx->stats;
    bb_put_u64(b, (uint64_t)s->decode_steps);
    bb_put_u64(b, (uint64_t)s->sparse_steps);
    bb_put_f64(b, s->select_ms);
    bb_put_u64(b, (uint64_t)s->recall_samples);
    bb_put_f64(b, s->sparse_recall);
    bb_put_u64(b, (uint64_t)ctx->n_sparse_heads);
    bb_put_f64(b, ctx->attended_sum);
    const sparse_select_stats *x = &ctx->sel_stats;
    const int64_t v[8] = {x->calls, x->scored_calls, x->superblocks_scored, x->blocks_scored,
                          x->superblocks_expanded, x->bytes_read, x->flat_bytes, x->exact_calls};
    for (int i = 0; i < 8; i++) bb_put_u64(b, (uint64_t)v[i]);
}

static void get_stats(bb_reader *b, struct ellm_context *ctx) {
    ellm_context_stats *s = &ctx->stats;
    s->decode_steps = (int64_t)bb_get_u64(b);
    s->sparse_steps = (int64_t)bb_get_u64(b);
    s->select_ms = bb_get_f64(b);
    s->recall_samples = (int64_t)bb_get_u64(b);
    s->sparse_recall = bb_get_f64(b);
    ctx->n_sparse_heads = (int64_t)bb_get_u64(b);
    ctx->attended_sum = bb_get_f64(b);
    sparse_select_stats *x = &ctx->sel_stats;
    int64_t *v[8] = {&x->calls, &x->scored_calls, &x->superblocks_scored, &x->blocks_scored,
                     &x->superblocks_expanded, &x->bytes_read, &x->flat_bytes, &x->exact_calls};
    for (int i = 0; i < 8; i++) *v[i] = (int64_t)bb_get_u64(b);
}

ellm_status ellm_context_state_save(const ellm_context *ctx, const char *path, const void *app,
                                    size_t app_len, ellm_error *err) {
    if (!ctx || !path) return ellm_fail(err, ELLM_ERR_ARG, "state save: no context or path");
    if (app_len && !app) return ellm_fail(err, ELLM_ERR_ARG, "state save: app bytes missing");
    if ((uint64_t)app_len > STATE_MAX_APP_BYTES)
        return ellm_fail(err, ELLM_ERR_ARG, "state save: %zu app bytes exceed the limit", app_len);
    const model_config *c = &ctx->model->cfg;
    const kv_cache_params *kp = kv_cache_get_params(ctx->kv);
    const int pos = kv_cache_len(ctx->kv), bt = kp->block_tokens, nb = (pos + bt - 1) / bt;
    const size_t block_bytes = kv_cache_block_bytes(ctx->kv);
    const size_t nlh = (size_t)c->n_layer * (size_t)c->n_head_kv;

    model_identity id;
    identity_of(ctx->model, &id);
    bb_writer mb = {0}, cb = {0}, sb = {0}, kb = {0};
    put_identity(&mb, &id);

    bb_put_u32(&cb, (uint32_t)ctx->n_ctx);
    bb_put_u32(&cb, (uint32_t)kp->type);
    bb_put_u32(&cb, (uint32_t)bt);
    bb_put_u32(&cb, (uint32_t)pos);
    bb_put_u32(&cb, (uint32_t)ctx->has_logits);
    bb_put_u32(&cb, ctx->sidx != NULL);
    put_stats(&cb, ctx);

    if (ctx->sidx) {
        bb_put_u32(&sb, (uint32_t)ctx->sparse_topk);
        bb_put_u32(&sb, (uint32_t)ctx->params.sparse_adapt);
        bb_put_u32(&sb, (uint32_t)nlh);
        bb_put(&sb, ctx->head_weight, nlh * sizeof(float));
        bb_put(&sb, ctx->recall_ema, nlh * sizeof(float));
        bb_put(&sb, ctx->gain_ema, nlh * sizeof(float));
        bb_put(&sb, ctx->layer_dense, (size_t)c->n_layer);
    }

    bb_put_u32(&kb, (uint32_t)c->n_layer);
    bb_put_u32(&kb, (uint32_t)c->n_head_kv);
    bb_put_u32(&kb, (uint32_t)nb);
    bb_put_u32(&kb, 0);
    bb_put_u64(&kb, (uint64_t)block_bytes);
    const uint64_t kv_len = (uint64_t)kb.n + (uint64_t)nlh * (uint64_t)nb * block_bytes;

    ellm_status st = ELLM_OK;
    if (mb.oom || cb.oom || sb.oom || kb.oom) {
        st = ellm_fail(err, ELLM_ERR_NOMEM, "state save: out of memory");
        goto out;
    }
    const size_t logits_len = ctx->has_logits ? (size_t)c->n_vocab * sizeof(float) : 0;
    uint32_t n_sections = 4 + (ctx->has_logits != 0) + (ctx->sidx != NULL);
    uint64_t total = STATE_HEADER_BYTES;
    const uint64_t lens[6] = {app_len, mb.n, cb.n, logits_len, sb.n, kv_len};
    const int present[6] = {1, 1, 1, ctx->has_logits != 0, ctx->sidx != NULL, 1};
    for (int i = 0; i < 6; i++)
        if (present[i]) total += SECTION_HEADER_BYTES + lens[i] + 4;

    file_atomic af;
    if ((st = file_atomic_open(path, &af, err))) goto out;
    unsigned char h[STATE_HEADER_BYTES] = {0};
    const uint32_t version = STATE_VERSION;
    memcpy(h, STATE_MAGIC, 8);
    memcpy(h + 8, &version, 4);
    memcpy(h + 12, &n_sections, 4);
    memcpy(h + 16, &total, 8);
    uint32_t hcrc = crc32c_update(0, h, 28);
    memcpy(h + 28, &hcrc, 4);
    file_atomic_write(&af, h, sizeof h);
    write_section(&af, TAG_APP, app, app_len);
    write_section(&af, TAG_MODEL, mb.p, mb.n);
    write_section(&af, TAG_CTX, cb.p, cb.n);
    if (ctx->has_logits) write_section(&af, TAG_LOGITS, ctx->logits, logits_len);
    if (ctx->sidx) write_section(&af, TAG_SPARSE, sb.p, sb.n);
    uint32_t crc;
    write_section_header(&af, &crc, TAG_KV, kv_len);
    crc = crc32c_update(crc, kb.p, kb.n);
    file_atomic_write(&af, kb.p, kb.n);
    for (int l = 0; l < c->n_layer; l++)
        for (int hh = 0; hh < c->n_head_kv; hh++)
            for (int b = 0; b < nb; b++) {
                const void *blk = kv_cache_block_k(ctx->kv, l, hh, b);
                crc = crc32c_update(crc, blk, block_bytes);
                file_atomic_write(&af, blk, block_bytes);
            }
    file_atomic_write(&af, &crc, 4);
    st = file_atomic_commit(&af, err);
out:
    free(mb.p);
    free(cb.p);
    free(sb.p);
    free(kb.p);
    return st;
}

/* ---- reading ------------------------------------------------------------- */

typedef struct {
    FILE *f;
    const char *path;
    uint64_t size;   /* bytes in the file */
    uint64_t off;    /* read so far */
    uint32_t n_sections;
} state_reader;

static const char *tag_name(uint32_t tag, char out[5]) {
    memcpy(out, &tag, 4);
    for (int i = 0; i < 4; i++)
        if (out[i] < 32 || out[i] > 126) out[i] = '?';
    out[4] = 0;
    return out;
}

/* Reads exactly n bytes; a short read is a truncated file. */
static ellm_status read_exact(state_reader *r, void *out, size_t n, const char *what, ellm_error *err) {
    if (n && fread(out, 1, n, r->f) != n)
        return ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s' is truncated: it ends inside %s (offset %llu)",
                         r->path, what, (unsigned long long)r->off);
    r->off += n;
    return ELLM_OK;
}

/* Opens the file and checks its header: magic, version, CRC and that the file
 * has exactly the bytes the header announces. */
static ellm_status reader_open(const char *path, state_reader *r, ellm_error *err) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->f = fopen(path, "rb");
    if (!r->f) return ellm_fail(err, ELLM_ERR_IO, "cannot open state file '%s': %s", path, strerror(errno));
    struct stat sbuf;
    if (fstat(fileno(r->f), &sbuf) != 0) {
        fclose(r->f);
        r->f = NULL;
        return ellm_fail(err, ELLM_ERR_IO, "cannot read state file '%s': %s", path, strerror(errno));
    }
    setvbuf(r->f, NULL, _IOFBF, 1 << 20);
    r->size = (uint64_t)sbuf.st_size;
    unsigned char h[STATE_HEADER_BYTES];
    ellm_status st = ELLM_OK;
    if (r->size < STATE_HEADER_BYTES || fread(h, 1, sizeof h, r->f) != sizeof h || memcmp(h, STATE_MAGIC, 8)) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s' is not an eLLM state file (no ELLMSTAT header)", path);
        goto fail;
    }
    r->off = STATE_HEADER_BYTES;
    uint32_t version, hcrc;
    uint64_t total;
    memcpy(&version, h + 8, 4);
    memcpy(&r->n_sections, h + 12, 4);
    memcpy(&total, h + 16, 8);
    memcpy(&hcrc, h + 28, 4);
    if (crc32c_update(0, h, 28) != hcrc) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s' is corrupted: header checksum mismatch", path);
        goto fail;
    }
    if (version != STATE_VERSION) {
        st = ellm_fail(err, ELLM_ERR_UNSUPPORTED, "state file '%s' has version %u; this build reads version %u",
                       path, version, STATE_VERSION);
        goto fail;
    }
    if (total != r->size) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s' is %s: the header says %llu bytes, the file has %llu",
                       path, r->size < total ? "truncated" : "longer than written", (unsigned long long)total,
                       (unsigned long long)r->size);
        goto fail;
    }
    return ELLM_OK;
fail:
    fclose(r->f);
    r->f = NULL;
    return st;
}

static void reader_close(state_reader *r) {
    if (r->f) fclose(r->f);
    r->f = NULL;
}

/* Reads the next section header, which must carry `tag` (optional sections
 * may be skipped by the caller checking *got first); starts its CRC. */
static ellm_status section_begin(state_reader *r, uint32_t *tag, uint64_t *len, uint32_t *crc, ellm_error *err) {
    unsigned char h[SECTION_HEADER_BYTES];
    ellm_status st = read_exact(r, h, sizeof h, "a section header", err);
    if (st) return st;
    memcpy(tag, h, 4);
    memcpy(len, h + 8, 8);
    if (*len > r->size - r->off || r->size - r->off - *len < 4) {
        char name[5];
        return ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s' is corrupted: section %s claims %llu bytes, more than the file holds",
                         r->path, tag_name(*tag, name), (unsigned long long)*len);
    }
    *crc = crc32c_update(0, h, sizeof h);
    return ELLM_OK;
}

static ellm_status section_end(state_reader *r, uint32_t tag, uint32_t crc, ellm_error *err) {
    uint32_t stored;
    char name[5];
    ellm_status st = read_exact(r, &stored, 4, "a section checksum", err);
    if (st) return st;
    if (stored != crc)
        return ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s' is corrupted: checksum mismatch in section %s",
                         r->path, tag_name(tag, name));
    return ELLM_OK;
}

/* A whole small section into a malloc'ed buffer, checked. */
static ellm_status read_section(state_reader *r, uint32_t want, unsigned char **data, uint64_t *len,
                                ellm_error *err) {
    uint32_t tag, crc;
    char a[5], b[5];
    *data = NULL;
    ellm_status st = section_begin(r, &tag, len, &crc, err);
    if (st) return st;
    if (tag != want)
        return ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s' is corrupted: expected section %s, found %s", r->path,
                         tag_name(want, a), tag_name(tag, b));
    if (want != TAG_KV && *len > STATE_MAX_APP_BYTES)
        return ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s': section %s of %llu bytes is too large", r->path,
                         tag_name(want, a), (unsigned long long)*len);
    *data = malloc(*len ? (size_t)*len : 1);
    if (!*data) return ellm_fail(err, ELLM_ERR_NOMEM, "state file: out of memory for %llu bytes", (unsigned long long)*len);
    if ((st = read_exact(r, *data, (size_t)*len, tag_name(want, a), err))) goto fail;
    crc = crc32c_update(crc, *data, (size_t)*len);
    if ((st = section_end(r, tag, crc, err))) goto fail;
    return ELLM_OK;
fail:
    free(*data);
    *data = NULL;
    return st;
}

ellm_status ellm_state_read_app(const char *path, void **app, size_t *app_len, ellm_error *err) {
    *app = NULL;
    *app_len = 0;
    state_reader r;
    ellm_status st = reader_open(path, &r, err);
    if (st) return st;
    unsigned char *data;
    uint64_t len;
    st = read_section(&r, TAG_APP, &data, &len, err);
    reader_close(&r);
    if (st) return st;
    *app = data;
    *app_len = (size_t)len;
    return ELLM_OK;
}

ellm_status ellm_context_state_load(ellm_context *ctx, const char *path, ellm_error *err) {
    if (!ctx || !path) return ellm_fail(err, ELLM_ERR_ARG, "state load: no context or path");
    const model_config *c = &ctx->model->cfg;
    const kv_cache_params *kp = kv_cache_get_params(ctx->kv);
    const size_t nlh = (size_t)c->n_layer * (size_t)c->n_head_kv;
    state_reader r;
    ellm_status st = reader_open(path, &r, err);
    if (st) return st;
    unsigned char *app = NULL, *md = NULL, *cd = NULL, *ld = NULL, *sd = NULL;
    float *sparse_f = NULL;
    unsigned char *sparse_dense = NULL;
    int sparse_topk = 0, sparse_adapt = 0;
    uint64_t len;
    int touched = 0; /* the cache has been overwritten: reset it on failure */
    if ((st = read_section(&r, TAG_APP, &app, &len, err))) goto out;
    if ((st = read_section(&r, TAG_MODEL, &md, &len, err))) goto out;
    model_identity have, want;
    identity_of(ctx->model, &have);
    bb_reader mb = {md, (size_t)len, 0, 0};
    get_identity(&mb, &want);
    if (mb.bad) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s': model section too short", path);
        goto out;
    }
    if (want.n_layer != have.n_layer || want.n_kv_head != have.n_kv_head || want.head_dim != have.head_dim ||
        want.n_vocab != have.n_vocab || want.n_embd != have.n_embd || strcmp(want.arch, have.arch)) {
        st = ellm_fail(err, ELLM_ERR_ARG,
                       "state file '%s' was written for another model (%s, %u layers, %u KV heads of %u, "
                       "vocabulary %u); this model is %s, %u layers, %u KV heads of %u, vocabulary %u",
                       path, want.arch, want.n_layer, want.n_kv_head, want.head_dim, want.n_vocab, have.arch,
                       have.n_layer, have.n_kv_head, have.head_dim, have.n_vocab);
        goto out;
    }
    if (want.file_bytes != have.file_bytes || want.hash != have.hash) {
        st = ellm_fail(err, ELLM_ERR_ARG,
                       "state file '%s' was written for another model file of the same shape, or with other "
                       "RoPE settings (%llu bytes, identity %016llx; this one has %llu bytes, identity %016llx)",
                       path, (unsigned long long)want.file_bytes, (unsigned long long)want.hash,
                       (unsigned long long)have.file_bytes, (unsigned long long)have.hash);
        goto out;
    }

    if ((st = read_section(&r, TAG_CTX, &cd, &len, err))) goto out;
    bb_reader cb = {cd, (size_t)len, 0, 0};
    const uint32_t n_ctx = bb_get_u32(&cb), kv_type = bb_get_u32(&cb), bt = bb_get_u32(&cb), pos = bb_get_u32(&cb);
    const uint32_t has_logits = bb_get_u32(&cb), has_sparse = bb_get_u32(&cb);
    struct ellm_context saved_counters;
    memset(&saved_counters, 0, sizeof saved_counters);
    get_stats(&cb, &saved_counters);
    if (cb.bad) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s': context section too short", path);
        goto out;
    }
    (void)n_ctx;
    if ((int)kv_type != kp->type || (int)bt != kp->block_tokens) {
        const qtype_info *saved = qtype_get((int)kv_type), *here = qtype_get(kp->type);
        st = ellm_fail(err, ELLM_ERR_ARG,
                       "state file '%s' holds a KV cache of type %s in blocks of %u tokens; this context has "
                       "type %s in blocks of %d (use the same --kv-type)",
                       path, saved ? saved->name : "unknown", bt, here ? here->name : "unknown", kp->block_tokens);
        goto out;
    }
    if ((int64_t)pos > ctx->n_ctx) {
        st = ellm_fail(err, ELLM_ERR_CONTEXT_FULL, "state file '%s' holds %u tokens, more than this context's %d",
                       path, pos, ctx->n_ctx);
        goto out;
    }
    if (has_logits > 1 || has_sparse > 1) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s': bad flags in the context section", path);
        goto out;
    }
    if (has_logits) {
        if ((st = read_section(&r, TAG_LOGITS, &ld, &len, err))) goto out;
        if (len != (uint64_t)c->n_vocab * sizeof(float)) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s': logits section has %llu bytes, expected %zu", path,
                           (unsigned long long)len, (size_t)c->n_vocab * sizeof(float));
            goto out;
        }
    }
    if (has_sparse) {
        if ((st = read_section(&r, TAG_SPARSE, &sd, &len, err))) goto out;
        bb_reader sb = {sd, (size_t)len, 0, 0};
        uint32_t topk = bb_get_u32(&sb), adapt = bb_get_u32(&sb), n = bb_get_u32(&sb);
        if (sb.bad || n != nlh || len != 12 + 3 * nlh * sizeof(float) + (size_t)c->n_layer) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s': sparse section does not match the model", path);
            goto out;
        }
        if (!ctx->sidx) {
            st = ellm_fail(err, ELLM_ERR_ARG, "state file '%s' was saved with a sparse index; this context is dense-only",
                           path);
            goto out;
        }
        sparse_f = malloc(3 * nlh * sizeof(float));
        sparse_dense = malloc((size_t)c->n_layer);
        if (!sparse_f || !sparse_dense) {
            st = ellm_fail(err, ELLM_ERR_NOMEM, "state load: out of memory");
            goto out;
        }
        bb_get(&sb, sparse_f, 3 * nlh * sizeof(float));
        bb_get(&sb, sparse_dense, (size_t)c->n_layer);
        for (int l = 0; l < c->n_layer; l++)
            if (sparse_dense[l] > 1) {
                st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s': bad dense-layer flag", path);
                goto out;
            }
        /* values no saver writes (the checksums only catch damage): a
         * budget of topk x weight must stay an int, the averages numbers */
        if (topk > (uint32_t)INT_MAX || adapt > 1) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s': sparse budget %u or adaptation flag %u out of range",
                           path, topk, adapt);
            goto out;
        }
        for (size_t i = 0; i < 3 * nlh; i++) {
            const float x = sparse_f[i];
            if (i < nlh ? !(x > 0 && x <= SPARSE_MAX_HEAD_WEIGHT) : !isfinite(x)) {
                st = ellm_fail(err, ELLM_ERR_FORMAT,
                               "state file '%s': sparse section: %s of layer %zu head %zu is %g",
                               path, i < nlh ? "budget weight" : i < 2 * nlh ? "recall average" : "gain average",
                               i % nlh / (size_t)c->n_head_kv, i % nlh % (size_t)c->n_head_kv, (double)x);
                goto out;
            }
        }
        sparse_topk = (int)topk;
        sparse_adapt = (int)adapt;
    }

    /* KV: streamed into the cache block by block, checked at the end. */
    uint32_t tag, crc;
    char name[5];
    if ((st = section_begin(&r, &tag, &len, &crc, err))) goto out;
    if (tag != TAG_KV) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s' is corrupted: expected section KVCB, found %s", path,
                       tag_name(tag, name));
        goto out;
    }
    unsigned char kh[24];
    if ((st = read_exact(&r, kh, sizeof kh, "the KV section", err))) goto out;
    crc = crc32c_update(crc, kh, sizeof kh);
    bb_reader kb = {kh, sizeof kh, 0, 0};
    const uint32_t kl = bb_get_u32(&kb), kn = bb_get_u32(&kb), nb = bb_get_u32(&kb);
    (void)bb_get_u32(&kb);
    const uint64_t block_bytes = bb_get_u64(&kb);
    if (kl != (uint32_t)c->n_layer || kn != (uint32_t)c->n_head_kv || block_bytes != kv_cache_block_bytes(ctx->kv) ||
        nb != (pos + bt - 1) / bt || len != sizeof kh + (uint64_t)nlh * nb * block_bytes) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s': the KV section does not match its context section", path);
        goto out;
    }
    if ((st = kv_cache_reserve(ctx->kv, (int)pos, err))) goto out; /* KV pages for the blocks read */
    touched = 1;
    for (int l = 0; l < c->n_layer && !st; l++)
        for (int h = 0; h < c->n_head_kv && !st; h++)
            for (uint32_t b = 0; b < nb && !st; b++) {
                void *dst = kv_cache_block_data(ctx->kv, l, h, (int)b);
                if (!(st = read_exact(&r, dst, (size_t)block_bytes, "the KV blocks", err)))
                    crc = crc32c_update(crc, dst, (size_t)block_bytes);
            }
    if (st || (st = section_end(&r, TAG_KV, crc, err))) goto out;
    if (r.off != r.size) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "state file '%s' has %llu unexpected bytes after its sections", path,
                       (unsigned long long)(r.size - r.off));
        goto out;
    }

    /* Everything checked: commit. */
    kv_cache_set_len(ctx->kv, (int)pos);
    if (ctx->sidx) engine_rebuild_index(ctx, (int)pos); /* equal: a function of the stored keys */
    if (sparse_f) {
        memcpy(ctx->head_weight, sparse_f, nlh * sizeof(float));
        memcpy(ctx->recall_ema, sparse_f + nlh, nlh * sizeof(float));
        memcpy(ctx->gain_ema, sparse_f + 2 * nlh, nlh * sizeof(float));
        memcpy(ctx->layer_dense, sparse_dense, (size_t)c->n_layer);
        ctx->sparse_topk = sparse_topk;
        ctx->params.sparse_adapt = sparse_adapt;
    }
    ctx->stats = saved_counters.stats;
    ctx->n_sparse_heads = saved_counters.n_sparse_heads;
    ctx->attended_sum = saved_counters.attended_sum;
    ctx->sel_stats = saved_counters.sel_stats;
    ctx->has_logits = (int)has_logits;
    if (has_logits) memcpy(ctx->logits, ld, (size_t)c->n_vocab * sizeof(float));
out:
    if (st && touched) ellm_context_truncate(ctx, 0);
    reader_close(&r);
    free(app);
    free(md);
    free(cd);
    free(ld);
    free(sd);
    free(sparse_f);
    free(sparse_dense);
    return st;
}
