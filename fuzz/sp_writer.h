/* A minimal SentencePiece ModelProto writer for the converter's fuzz seeds
 * and harnesses: pieces (text, score, type) and the normalizer's
 * add_dummy_prefix (sp_model.c documents the fields). */
#ifndef ELLM_FUZZ_SP_WRITER_H
#define ELLM_FUZZ_SP_WRITER_H

#include <stdint.h>
#include <string.h>

static size_t spw_varint(uint8_t *o, uint64_t v) {
    size_t n = 0;
    do {
        o[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) o[n] |= 0x80;
        n++;
    } while (v);
    return n;
}

/* Writes the model into out (cap bytes; each piece takes at most its length
 * + 24) and returns its size, or 0 if it does not fit. add_dummy_prefix < 0
 * leaves the normalizer out. */
static size_t spw_model(uint8_t *out, size_t cap, const char *const *pieces, const float *scores, const int *types,
                        int n, int add_dummy_prefix) {
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        uint8_t pc[600];
        size_t len = strlen(pieces[i]), m = 0;
        if (len > 512) return 0;
        pc[m++] = 1 << 3 | 2;
        m += spw_varint(pc + m, len);
        memcpy(pc + m, pieces[i], len);
        m += len;
        pc[m++] = 2 << 3 | 5;
        memcpy(pc + m, &scores[i], 4);
        m += 4;
        pc[m++] = 3 << 3 | 0;
        m += spw_varint(pc + m, (uint64_t)types[i]);
        if (k + m + 12 > cap) return 0;
        out[k++] = 1 << 3 | 2;
        k += spw_varint(out + k, m);
        memcpy(out + k, pc, m);
        k += m;
    }
    if (add_dummy_prefix >= 0) {
        if (k + 8 > cap) return 0;
        out[k++] = 3 << 3 | 2;
        out[k++] = 2;
        out[k++] = 3 << 3 | 0;
        out[k++] = (uint8_t)(add_dummy_prefix != 0);
    }
    return k;
}

/* A 16-piece model: unk, bos, eos, the byte pieces <0x0A> and <0x20>, and
 * a few word pieces. */
static size_t spw_small_model(uint8_t *out, size_t cap) {
    static const char *const p[16] = {"<unk>", "<s>", "</s>", "<0x0A>", "<0x20>", "\xe2\x96\x81", "a", "b",
                                      "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab", "c", "d", "e", "H", "o"};
    float sc[16];
    int ty[16];
    for (int i = 0; i < 16; i++) {
        sc[i] = -(float)i;
        ty[i] = i == 0 ? 2 : i < 3 ? 3 : i < 5 ? 6 : 1;
    }
    return spw_model(out, cap, p, sc, ty, 16, 1);
}

#endif
