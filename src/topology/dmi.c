/* SMBIOS type 17 (Memory Device) parser: slots, modules, channels, speed.
 *
 * Channels are not a field of SMBIOS; they come from the slot names the
 * firmware writes ("P0 CHANNEL A" / "DIMM 0", "CPU0_DIMM_B1", "ChannelA-DIMM0",
 * "DIMM_A2"): a channel is a (socket, channel letter) pair. Slots whose names
 * follow none of these patterns count as one channel each, which is right for
 * servers with one DIMM per channel. Extra modules in a channel add capacity,
 * not bandwidth. */
#include "topology/dmi.h"
#include "core/status.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DMI_MEMORY_DEVICE 17
#define DMI_END_OF_TABLE 127
#define DMI_MAX_TABLE (64u << 20) /* SMBIOS 3 allows up to 4 GB; real tables are KBs */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* String `idx` (1-based) of the string set [s, end), copied into out (cap
 * bytes, truncated); "" for index 0 or a missing string. */
static void dmi_string(const uint8_t *s, const uint8_t *end, int idx, char *out, size_t cap) {
    out[0] = 0;
    if (idx <= 0) return;
    for (int i = 1; s < end && *s; i++) {
        const uint8_t *z = memchr(s, 0, (size_t)(end - s));
        if (!z) return;
        if (i == idx) {
            size_t n = (size_t)(z - s) < cap - 1 ? (size_t)(z - s) : cap - 1;
            memcpy(out, s, n);
            out[n] = 0;
            return;
        }
        s = z + 1;
    }
}

static const char *memory_type_name(int t) {
    switch (t) {
    case 0x12: return "DDR";
    case 0x13: return "DDR2";
    case 0x18: return "DDR3";
    case 0x1A: return "DDR4";
    case 0x1B: return "LPDDR";
    case 0x1C: return "LPDDR2";
    case 0x1D: return "LPDDR3";
    case 0x1E: return "LPDDR4";
    case 0x20: return "HBM";
    case 0x21: return "HBM2";
    case 0x22: return "DDR5";
    case 0x23: return "LPDDR5";
    case 0x24: return "HBM3";
    }
    return "";
}

/* Position just after `word` in s (uppercase), or NULL. */
static const char *after(const char *s, const char *word) {
    const char *p = strstr(s, word);
    return p ? p + strlen(word) : NULL;
}

static const char *skip_sep(const char *p) {
    while (*p == ' ' || *p == '_' || *p == '-' || *p == '#') p++;
    return p;
}

/* Socket number named in s ("CPU0", "CPU 1", "P1", "SOCKET 0", "NODE1"), or -1. */
static int socket_of(const char *s) {
    static const char *const words[] = {"CPU", "SOCKET", "PROC", "NODE"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        const char *p = after(s, words[i]);
        if (p && isdigit((unsigned char)*(p = skip_sep(p)))) return atoi(p);
    }
    for (const char *p = s; *p; p++) /* "P0 ..." / "..._P1_..." */
        if (*p == 'P' && (p == s || !isalnum((unsigned char)p[-1])) && isdigit((unsigned char)p[1]) &&
            !isalnum((unsigned char)p[2]))
            return p[1] - '0';
    return -1;
}

/* Channel named in s ("CHANNEL A", "CHANNELB", "CH_C", "DIMM_A1", "DIMMB2"), or 0. */
static char channel_of(const char *s) {
    const char *p = after(s, "CHANNEL");
    if (p && isalnum((unsigned char)*(p = skip_sep(p)))) return *p;
    for (const char *q = s; (q = strstr(q, "CH")); q += 2) /* "CH_A", "CH A", "CHA" not in a word */
        if (q == s || !isalnum((unsigned char)q[-1])) {
            const char *r = skip_sep(q + 2);
            if (isalpha((unsigned char)*r) && !isalnum((unsigned char)r[1])) return *r;
        }
    for (const char *q = s; (q = strstr(q, "DIMM")); q += 4) {
        const char *r = skip_sep(q + 4);
        if (isalpha((unsigned char)*r) && isdigit((unsigned char)r[1])) return *r;
    }
    return 0;
}

/* A channel key for a slot: "socket:letter", or the slot's own names. */
static void channel_key(const char *dev, const char *bank, char *key, size_t cap) {
    char both[160];
    snprintf(both, sizeof both, "%s|%s", bank, dev);
    for (char *p = both; *p; p++) *p = (char)toupper((unsigned char)*p);
    char ch = channel_of(both);
    if (ch) snprintf(key, cap, "%d:%c", socket_of(both), ch);
    else snprintf(key, cap, "slot:%s", both);
}

static int is_virtual_vendor(const char *m) {
    static const char *const vendors[] = {"QEMU", "VMware", "Microsoft", "Xen", "Bochs", "innotek", "Red Hat",
                                          "Amazon EC2", "Google", "Parallels"};
    for (size_t i = 0; i < sizeof vendors / sizeof *vendors; i++)
        if (strstr(m, vendors[i])) return 1;
    return 0;
}

typedef struct {
    char key[168];
    int populated;
} chan;

ellm_status dmi_parse_memory(const uint8_t *table, size_t len, dmi_memory *out, ellm_error *err) {
    memset(out, 0, sizeof *out);
    if (!table && len) return ellm_fail(err, ELLM_ERR_ARG, "DMI: no table");
    if (len > DMI_MAX_TABLE) return ellm_fail(err, ELLM_ERR_FORMAT, "DMI: table of %zu bytes is too large", len);
    chan *chans = calloc(DMI_MAX_CHANNELS, sizeof *chans);
    if (!chans) return ellm_fail(err, ELLM_ERR_NOMEM, "DMI: out of memory");
    int n_chans = 0, n_virtual = 0, n_speed = 0;
    ellm_status st = ELLM_OK;
    size_t off = 0;
    while (off < len) {
        if (len - off < 4) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "DMI: structure header at offset %zu is cut off (%zu bytes left)", off,
                           len - off);
            break;
        }
        const uint8_t *h = table + off;
        int type = h[0], flen = h[1];
        if (flen < 4) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "DMI: structure at offset %zu has length %d (< 4)", off, flen);
            break;
        }
        if ((size_t)flen > len - off) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "DMI: structure type %d at offset %zu runs past the table (%d bytes, %zu left)",
                           type, off, flen, len - off);
            break;
        }
        /* the string set ends at the first double NUL after the formatted area */
        const uint8_t *s = h + flen, *end = table + len, *z = s;
        while (z + 1 < end && !(z[0] == 0 && z[1] == 0)) z++;
        if (z + 1 >= end) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "DMI: strings of structure type %d at offset %zu are not terminated",
                           type, off);
            break;
        }
        if (type == DMI_END_OF_TABLE) break;
        if (type == DMI_MEMORY_DEVICE && flen >= 0x15) {
            out->n_slots++;
            uint16_t size = rd16(h + 0x0C);
            uint64_t bytes = 0;
            if (size == 0x7FFF && flen >= 0x20) bytes = (uint64_t)(rd32(h + 0x1C) & 0x7FFFFFFF) << 20;
            else if (size != 0xFFFF && size != 0) bytes = (size & 0x8000) ? (uint64_t)(size & 0x7FFF) << 10
                                                                         : (uint64_t)size << 20;
            int installed = size != 0;
            char dev[64], bank[64], maker[64];
            dmi_string(s, z + 1, h[0x10], dev, sizeof dev);
            dmi_string(s, z + 1, h[0x11], bank, sizeof bank);
            dmi_string(s, z + 1, flen > 0x17 ? h[0x17] : 0, maker, sizeof maker);
            char key[168];
            channel_key(dev, bank, key, sizeof key);
            int c;
            for (c = 0; c < n_chans; c++)
                if (!strcmp(chans[c].key, key)) break;
            if (c == n_chans && n_chans < DMI_MAX_CHANNELS) snprintf(chans[n_chans++].key, sizeof chans->key, "%s", key);
            if (installed) {
                out->n_populated++;
                out->total_bytes += bytes;
                if (c < n_chans) chans[c].populated = 1;
                int speed = flen >= 0x17 ? rd16(h + 0x15) : 0;
                if (speed == 0xFFFF) speed = flen >= 0x58 ? (int)(rd32(h + 0x54) & 0x7FFFFFFF) : 0;
                int conf = flen >= 0x22 ? rd16(h + 0x20) : 0;
                if (conf == 0xFFFF) conf = flen >= 0x5C ? (int)(rd32(h + 0x58) & 0x7FFFFFFF) : 0;
                if (!conf) conf = speed;
                if (speed > out->rated_mts) out->rated_mts = speed;
                if (conf > 0 && (out->speed_mts == 0 || conf < out->speed_mts)) out->speed_mts = conf;
                if (conf > 0) n_speed++;
                int width = rd16(h + 0x0A);
                if (width != 0xFFFF && width > 0 && width <= 1024) out->data_width_bits = width;
                const char *tn = memory_type_name(h[0x12]);
                if (*tn) snprintf(out->type, sizeof out->type, "%s", tn);
                if (is_virtual_vendor(maker) || is_virtual_vendor(dev)) n_virtual++;
            }
        }
        off = (size_t)(z + 2 - table);
    }
    if (st == ELLM_OK) {
        out->n_channels = n_chans;
        for (int c = 0; c < n_chans; c++) out->n_channels_populated += chans[c].populated;
        if (out->n_populated && !out->data_width_bits) out->data_width_bits = 64;
        out->virtual_table = out->n_populated > 0 && (n_virtual > 0 || n_speed == 0);
        double per_channel = (double)out->speed_mts * out->data_width_bits / 8 / 1000; /* GB/s */
        out->peak_gbps = per_channel * out->n_channels_populated;
        out->full_peak_gbps = per_channel * out->n_channels;
    } else {
        dmi_memory keep = {0};
        *out = keep;
    }
    free(chans);
    return st;
}

ellm_status dmi_read_memory(const char *path, dmi_memory *out, ellm_error *err) {
    memset(out, 0, sizeof *out);
    if (!path) path = "/sys/firmware/dmi/tables/DMI";
    FILE *f = fopen(path, "rb");
    if (!f) return ellm_fail(err, ELLM_ERR_IO, "DMI: cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        if (cap >= DMI_MAX_TABLE) break;
        uint8_t *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf) return ellm_fail(err, ELLM_ERR_NOMEM, "DMI: out of memory reading %s", path);
    if (failed) {
        free(buf);
        return ellm_fail(err, ELLM_ERR_IO, "DMI: cannot read %s", path);
    }
    ellm_status st = dmi_parse_memory(buf, n, out, err);
    free(buf);
    return st;
}

int dmi_channels_known(const dmi_memory *m) {
    return m->n_populated > 0 && m->speed_mts > 0 && !m->virtual_table && m->n_channels_populated > 0;
}
