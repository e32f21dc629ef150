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

/* Reads one field: its number, wire type and value (varint/fixed in *v,
 * length-delimited as [*sub, *sub + *sub_len)). */
static ellm_status pb_field(pb *b, int *field, int *wt, uint64_t *v, const uint8_t **sub, size_t *sub_len) {
    uint64_t key;
    ellm_status st = pb_varint(b, &key);
    if (st) return st;
    *field = (int)(key >> 3);
    *wt = (int)(key & 7);
    switch (*wt) {
    case 0: return pb_varint(b, v);
    case 1:
        if (b->end - b->p < 8) return pb_fail(b, "fixed64 runs past the end");
        memcpy(v, b->p, 8);
        b->p += 8;
        return ELLM_OK;
    case 5: {
        if (b->end - b->p < 4) return pb_fail(b, "fixed32 runs past the end");
        uint32_t u;
        memcpy(&u, b->p, 4);
        *v = u;
        b->p += 4;
        return ELLM_OK;
    }
    case 2: {
        uint64_t n;
        if ((st = pb_varint(b, &n))) return st;
        if (n > (uint64_t)(b->end - b->p)) return pb_fail(b, "length-delimited field runs past the end");
        *sub = b->p;
        *sub_len = (size_t)n;
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
        int f, wt;
        uint64_t v = 0;
        const uint8_t *sub = NULL;
        size_t n = 0;
        ellm_status st = pb_field(&b, &f, &wt, &v, &sub, &n);
        if (st) return st;
        if (f == 1 && wt == 2) {
            pc->piece = (const char *)sub;
            pc->len = n;
        } else if (f == 2 && wt == 5) {
            uint32_t u = (uint32_t)v;
            memcpy(&pc->score, &u, 4);
        } else if (f == 3 && wt == 0) {
            if (v < SP_NORMAL || v > SP_BYTE) return pb_fail(&b, "piece type out of range 1..6");
            pc->type = (int)v;
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
        int f, wt;
        uint64_t v = 0;
        const uint8_t *sub = NULL;
        size_t n = 0;
        if ((st = pb_field(&b, &f, &wt, &v, &sub, &n))) break;
        if (f == 1 && wt == 2) {
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
            st = parse_piece(&b, sub, n, &m->pieces[m->n_pieces]);
            if (st == ELLM_OK) m->n_pieces++;
        } else if (f == 3 && wt == 2) {
            pb nb = {sub, sub + n, b.base, what, err};
            while (nb.p < nb.end && st == ELLM_OK) {
                int f2, wt2;
                uint64_t v2 = 0;
                const uint8_t *s2 = NULL;
                size_t n2 = 0;
                if ((st = pb_field(&nb, &f2, &wt2, &v2, &s2, &n2))) break;
                if (f2 == 3 && wt2 == 0) m->add_dummy_prefix = v2 != 0;
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
