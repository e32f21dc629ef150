/* SentencePiece ModelProto reader (see sp_model.h). Wire format: each field
 * is a varint key (field number << 3 | wire type) and a value: 0 varint,
 * 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit.
 *
 *   ModelProto      1: repeated SentencePiece pieces   3: NormalizerSpec
 *   SentencePiece   1: string piece   2: float score   3: enum type (default 1)
 *   NormalizerSpec  3: bool add_dummy_prefix (default true) */
#include "convert/sp_model.h"

#include "core/status.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *p, *end, *base;
    const char *what;
    ellm_error *err;
} pb;

static ellm_status pb_fail(pb *b, const char *msg) {
    return ellm_fail(b->err, ELLM_ERR_FORMAT, "'%s': malformed protobuf at byte %zu: %s", b->what,
                     (size_t)(b->p - b->base), msg);
}

static ellm_status pb_varint(pb *b, uint64_t *v) {
    uint64_t r = 0;
    for (int s = 0; s < 64; s += 7) {
        if (b->p >= b->end) return pb_fail(b, "varint runs past the end");
        uint8_t c = *b->p++;
        r |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) {
            *v = r;
            return ELLM_OK;
        }
    }
    return pb_fail(b, "varint longer than 10 bytes");
}

/* One field of a message. */
typedef struct {
    int field, wt;       /* field number, wire type */
    uint64_t v;          /* varint and fixed values (wire types 0, 1, 5) */
    const uint8_t *sub;  /* length-delimited (wire type 2): [sub, sub + n) */
    size_t n;
} pb_item;

/* Reads the next field into *it (the members its wire type does not use are
 * zero / NULL). */
static ellm_status pb_field(pb *b, pb_item *it) {
    memset(it, 0, sizeof *it);
    uint64_t key;
    ellm_status st = pb_varint(b, &key);
    if (st) return st;
    it->field = (int)(key >> 3);
    it->wt = (int)(key & 7);
    switch (it->wt) {
    case 0: return pb_varint(b, &it->v);
    case 1:
        if (b->end - b->p < 8) return pb_fail(b, "fixed64 runs past the end");
        memcpy(&it->v, b->p, 8);
        b->p += 8;
        return ELLM_OK;
    case 5: {
        if (b->end - b->p < 4) return pb_fail(b, "fixed32 runs past the end");
        uint32_t u;
        memcpy(&u, b->p, 4);
        it->v = u;
        b->p += 4;
        return ELLM_OK;
    }
    case 2: {
        uint64_t n;
        if ((st = pb_varint(b, &n))) return st;
        if (n > (uint64_t)(b->end - b->p)) return pb_fail(b, "length-delimited field runs past the end");
        it->sub = b->p;
        it->n = (size_t)n;
        b->p += n;
        return ELLM_OK;
    }
    default: return pb_fail(b, "unknown wire type (groups are not used by SentencePiece)");
    }
}

static ellm_status parse_piece(pb *outer, const uint8_t *data, size_t len, sp_piece *pc) {
    pb b = {data, data + len, outer->base, outer->what, outer->err};
    pc->piece = "";
    pc->len = 0;
    pc->score = 0;
    pc->type = SP_NORMAL;
    while (b.p < b.end) {
        pb_item it;
        ellm_status st = pb_field(&b, &it);
        if (st) return st;
        if (it.field == 1 && it.wt == 2) {
            pc->piece = (const char *)it.sub;
            pc->len = it.n;
        } else if (it.field == 2 && it.wt == 5) {
            uint32_t u = (uint32_t)it.v;
            memcpy(&pc->score, &u, 4);
        } else if (it.field == 3 && it.wt == 0) {
            if (it.v < SP_NORMAL || it.v > SP_BYTE) return pb_fail(&b, "piece type out of range 1..6");
            pc->type = (int)it.v;
        }
    }
    return ELLM_OK;
}

ellm_status sp_model_parse(const void *data, size_t size, const char *what, sp_model *m, ellm_error *err) {
    memset(m, 0, sizeof *m);
    m->add_dummy_prefix = -1;
    pb b = {data, (const uint8_t *)data + size, data, what, err};
    int64_t cap = 0;
    ellm_status st = ELLM_OK;
    while (b.p < b.end && st == ELLM_OK) {
        pb_item it;
        if ((st = pb_field(&b, &it))) break;
        if (it.field == 1 && it.wt == 2) {
            if (m->n_pieces == cap) {
                if (cap >= (1 << 24)) {
                    st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': more than %d pieces", what, 1 << 24);
                    break;
                }
                cap = cap ? 2 * cap : 1024;
                sp_piece *p = realloc(m->pieces, (size_t)cap * sizeof *p);
                if (!p) {
                    st = ellm_fail(err, ELLM_ERR_NOMEM, "out of memory reading '%s'", what);
                    break;
                }
                m->pieces = p;
            }
            st = parse_piece(&b, it.sub, it.n, &m->pieces[m->n_pieces]);
            if (st == ELLM_OK) m->n_pieces++;
        } else if (it.field == 3 && it.wt == 2) { /* normalizer_spec */
            pb nb = {it.sub, it.sub + it.n, b.base, what, err};
            while (nb.p < nb.end && st == ELLM_OK) {
                pb_item ns;
                if ((st = pb_field(&nb, &ns))) break;
                if (ns.field == 3 && ns.wt == 0) m->add_dummy_prefix = ns.v != 0;
            }
        }
    }
    if (st == ELLM_OK && m->n_pieces == 0)
        st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s' holds no pieces (not a SentencePiece model?)", what);
    if (st != ELLM_OK) sp_model_free(m);
    return st;
}

void sp_model_free(sp_model *m) {
    free(m->pieces);
    m->pieces = NULL;
    m->n_pieces = 0;
}
