/* The hardware probe: the SMBIOS type 17 parser on tables built here (several
 * DIMM layouts, extended sizes and speeds, a virtual machine's table, no
 * memory devices, truncated and malformed tables, absent and unreadable
 * files), the advice on synthetic machines (it must name the real
 * bottleneck first), the bandwidth measurement on this machine, and
 * `ellm probe --json` end to end (its exact shape). */
#include "harness.h"
#include "topology/dmi.h"
#include "topology/probe.h"
#include "core/meminfo.h"

#include <cjson/cJSON.h>
#include <sched.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- building SMBIOS tables ------------------------------------------------- */

typedef struct {
    uint8_t b[1 << 16];
    size_t n;
} table;

static void put16(uint8_t *p, unsigned v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, v & 0xFFFF), put16(p + 2, v >> 16); }

/* Appends a structure: `flen` bytes of formatted area (fa, header filled
 * here) and the strings (NULL-terminated list; none: the double NUL alone). */
static void add_struct(table *t, int type, uint8_t *fa, int flen, const char *const *strings) {
    fa[0] = (uint8_t)type;
    fa[1] = (uint8_t)flen;
    put16(fa + 2, (unsigned)(0x1000 + t->n));
    memcpy(t->b + t->n, fa, (size_t)flen);
    t->n += (size_t)flen;
    int any = 0;
    for (int i = 0; strings && strings[i]; i++) {
        size_t l = strlen(strings[i]) + 1;
        memcpy(t->b + t->n, strings[i], l);
        t->n += l;
        any = 1;
    }
    if (!any) t->b[t->n++] = 0;
    t->b[t->n++] = 0;
}

typedef struct {
    const char *dev, *bank, *maker;
    unsigned size_mb;  /* 0: empty slot */
    int speed, conf;   /* MT/s */
    int type;          /* SMBIOS memory type byte */
    int flen;          /* formatted length: 0x15 (2.1), 0x28 (2.8), 0x5C (3.3) */
} dimm;

static void add_dimm(table *t, const dimm *d) {
    uint8_t fa[0x5C];
    memset(fa, 0, sizeof fa);
    int flen = d->flen ? d->flen : 0x28;
    put16(fa + 0x04, 0x1000);
    put16(fa + 0x08, 72);
    put16(fa + 0x0A, 64);
    if (d->size_mb >= 0x7FFF) {
        put16(fa + 0x0C, 0x7FFF);
        put32(fa + 0x1C, d->size_mb);
    } else {
        put16(fa + 0x0C, d->size_mb);
    }
    fa[0x0E] = 0x09; /* DIMM */
    /* strings: SMBIOS has no empty strings, an absent one is index 0 */
    const char *all[3] = {d->dev, d->bank, d->maker ? d->maker : "Samsung"}, *strs[4] = {NULL};
    int idx[3], ns = 0;
    for (int i = 0; i < 3; i++) {
        idx[i] = all[i] && *all[i] ? ns + 1 : 0;
        if (idx[i]) strs[ns++] = all[i];
    }
    fa[0x10] = (uint8_t)idx[0]; /* device locator */
    fa[0x11] = (uint8_t)idx[1]; /* bank locator */
    fa[0x12] = (uint8_t)d->type;
    if (d->speed > 0xFFFE) {
        put16(fa + 0x15, 0xFFFF);
        put32(fa + 0x54, (uint32_t)d->speed);
    } else {
        put16(fa + 0x15, (unsigned)d->speed);
    }
    fa[0x17] = (uint8_t)idx[2]; /* manufacturer */
    if (d->conf > 0xFFFE) {
        put16(fa + 0x20, 0xFFFF);
        put32(fa + 0x58, (uint32_t)d->conf);
    } else {
        put16(fa + 0x20, (unsigned)d->conf);
    }
    add_struct(t, 17, fa, flen, strs);
}

static void add_bios_and_end(table *t, int end) {
    uint8_t fa[0x18] = {0};
    fa[4] = 1;
    const char *strs[] = {"Vendor", "1.0", NULL};
    add_struct(t, 0, fa, sizeof fa, strs);
    if (end) {
        uint8_t e[4] = {0};
        add_struct(t, 127, e, 4, NULL);
    }
}

/* Parses t; with ELLM_DMI_SEEDS=DIR set, also writes it there (the fuzz
 * corpus in fuzz/corpus_dmi was made so). */
static int parse(const table *t, dmi_memory *m, ellm_error *err) {
    static int n_written;
    const char *dir = getenv("ELLM_DMI_SEEDS");
    if (dir && *dir) {
        char path[512];
        snprintf(path, sizeof path, "%s/table-%02d", dir, n_written++);
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(t->b, 1, t->n, f);
            fclose(f);
        }
    }
    return dmi_parse_memory(t->b, t->n, m, err);
}

static void test_layouts(void) {
    dmi_memory m;
    ellm_error err = {0};
    table *t = calloc(1, sizeof *t);

    /* 2-socket EPYC-style: "P0 CHANNEL A".."L" / "DIMM 0", all 24 populated, DDR5-4800, 64 GB */
    t->n = 0;
    add_bios_and_end(t, 0);
    for (int s = 0; s < 2; s++)
        for (int c = 0; c < 12; c++) {
            char bank[32];
            snprintf(bank, sizeof bank, "P%d CHANNEL %c", s, 'A' + c);
            dimm d = {"DIMM 0", bank, "Samsung", 65536, 4800, 4800, 0x22, 0x5C};
            add_dimm(t, &d);
        }
    uint8_t e[4] = {0};
    add_struct(t, 127, e, 4, NULL);
    CHECK(parse(t, &m, &err) == ELLM_OK, "EPYC: %s", err.msg);
    CHECK(m.n_slots == 24 && m.n_populated == 24 && m.n_channels == 24 && m.n_channels_populated == 24,
          "EPYC: slots %d populated %d channels %d/%d", m.n_slots, m.n_populated, m.n_channels_populated, m.n_channels);
    CHECK(!strcmp(m.type, "DDR5") && m.speed_mts == 4800 && m.total_bytes == 24ull * 64 * (1ull << 30),
          "EPYC: %s-%d %llu bytes", m.type, m.speed_mts, (unsigned long long)m.total_bytes);
    CHECK(fabs(m.peak_gbps - 24 * 4800 * 8 / 1000.0) < 1e-6 && dmi_channels_known(&m), "EPYC peak %.2f", m.peak_gbps);

    /* Intel-style 1 socket, 8 channels x 2 slots, only slot 1 of channels A-D:
     * 4 of 8 channels, configured 2933 on 3200-rated modules */
    t->n = 0;
    add_bios_and_end(t, 0);
    for (int c = 0; c < 8; c++)
        for (int j = 1; j <= 2; j++) {
            char dev[32];
            snprintf(dev, sizeof dev, "CPU0_DIMM_%c%d", 'A' + c, j);
            dimm d = {dev, "NODE 0", "Hynix", (c < 4 && j == 1) ? 32768 : 0, 3200, 2933, 0x1A, 0x28};
            add_dimm(t, &d);
        }
    add_struct(t, 127, e, 4, NULL);
    CHECK(parse(t, &m, &err) == ELLM_OK, "Intel: %s", err.msg);
    CHECK(m.n_slots == 16 && m.n_populated == 4 && m.n_channels == 8 && m.n_channels_populated == 4,
          "Intel: slots %d populated %d channels %d/%d", m.n_slots, m.n_populated, m.n_channels_populated, m.n_channels);
    CHECK(m.speed_mts == 2933 && m.rated_mts == 3200 && !strcmp(m.type, "DDR4"), "Intel speed %d rated %d",
          m.speed_mts, m.rated_mts);
    CHECK(fabs(m.peak_gbps - 4 * 2933 * 8 / 1000.0) < 1e-6 && fabs(m.full_peak_gbps - 2 * m.peak_gbps) < 1e-6,
          "Intel peak %.3f full %.3f", m.peak_gbps, m.full_peak_gbps);

    /* Desktop: "ChannelA-DIMM0" / "BANK 0", 2 of 4 slots (one per channel), 48 GB modules
     * (extended size), DDR5-6000 as an extended speed on a 3.3 record */
    t->n = 0;
    const char *devs[4] = {"ChannelA-DIMM0", "ChannelA-DIMM1", "ChannelB-DIMM0", "ChannelB-DIMM1"};
    for (int i = 0; i < 4; i++) {
        dimm d = {devs[i], "BANK 0", "Kingston", (i % 2 == 0) ? 0x8000 * 2 - 0x4000 : 0, 70000, 70000, 0x22, 0x5C};
        add_dimm(t, &d);
    }
    CHECK(parse(t, &m, &err) == ELLM_OK, "desktop: %s", err.msg); /* no end-of-table record: ends at the buffer */
    CHECK(m.n_slots == 4 && m.n_populated == 2 && m.n_channels == 2 && m.n_channels_populated == 2,
          "desktop: slots %d populated %d channels %d/%d", m.n_slots, m.n_populated, m.n_channels_populated, m.n_channels);
    CHECK(m.total_bytes == 2ull * 49152 << 20 && m.speed_mts == 70000, "desktop: %llu bytes, %d MT/s",
          (unsigned long long)m.total_bytes, m.speed_mts);

    /* Names without a channel ("SLOT1".."SLOT4"), old 2.1 records without speed fields */
    t->n = 0;
    for (int i = 0; i < 4; i++) {
        char dev[16];
        snprintf(dev, sizeof dev, "SLOT%d", i + 1);
        dimm d = {dev, "", NULL, i < 3 ? 8192 : 0, 2666, 2666, 0x1A, 0x28};
        add_dimm(t, &d);
    }
    CHECK(parse(t, &m, &err) == ELLM_OK && m.n_channels == 4 && m.n_channels_populated == 3,
          "slots: channels %d/%d", m.n_channels_populated, m.n_channels);
    t->n = 0;
    dimm old = {"DIMM1", "BANK0", NULL, 4096, 0, 0, 0x18, 0x15};
    add_dimm(t, &old);
    CHECK(parse(t, &m, &err) == ELLM_OK && m.n_populated == 1 && m.speed_mts == 0 && !dmi_channels_known(&m),
          "2.1 record: populated %d speed %d", m.n_populated, m.speed_mts);

    /* KB-granular size */
    t->n = 0;
    dimm kb = {"DIMM_A1", "BANK 0", NULL, 1, 1600, 1600, 0x18, 0x28};
    add_dimm(t, &kb);
    put16(t->b + 0x0C, 0x8000 | 512); /* bit 15: size in KB */
    CHECK(parse(t, &m, &err) == ELLM_OK && m.total_bytes == 512 * 1024, "KB size: %llu", (unsigned long long)m.total_bytes);

    /* A virtual machine's table: QEMU, no speed */
    t->n = 0;
    add_bios_and_end(t, 0);
    dimm q = {"DIMM 0", "", "QEMU", 16384, 0, 0, 0x07, 0x28};
    add_dimm(t, &q);
    add_struct(t, 127, e, 4, NULL);
    CHECK(parse(t, &m, &err) == ELLM_OK && m.virtual_table && !dmi_channels_known(&m), "QEMU table: virtual %d",
          m.virtual_table);
    t->n = 0;
    dimm q2 = {"DIMM 0", "", "QEMU", 16384, 4800, 4800, 0x22, 0x28}; /* a speed, still a VM's */
    add_dimm(t, &q2);
    CHECK(parse(t, &m, &err) == ELLM_OK && m.virtual_table, "QEMU with speed: virtual %d", m.virtual_table);

    /* No memory devices */
    t->n = 0;
    add_bios_and_end(t, 1);
    CHECK(parse(t, &m, &err) == ELLM_OK && m.n_slots == 0 && !dmi_channels_known(&m), "no type 17: %d slots", m.n_slots);
    CHECK(dmi_parse_memory(NULL, 0, &m, &err) == ELLM_OK && m.n_slots == 0, "empty table");
    free(t);
}

static void test_malformed(void) {
    table *t = calloc(1, sizeof *t);
    dmi_memory m;
    ellm_error err = {0};
    add_bios_and_end(t, 0);
    dimm d = {"CPU0_DIMM_A1", "NODE 0", "Micron", 16384, 3200, 3200, 0x1A, 0x5C};
    add_dimm(t, &d);
    uint8_t e[4] = {0};
    add_struct(t, 127, e, 4, NULL);
    CHECK(parse(t, &m, &err) == ELLM_OK && m.n_populated == 1, "valid base table: %s", err.msg);
    /* every truncation: an error naming an offset, or (cut at a record
     * boundary) a clean parse of the records before it; never a crash */
    int n_err = 0;
    for (size_t cut = 0; cut < t->n; cut++) {
        ellm_error e2 = {0};
        ellm_status st = dmi_parse_memory(t->b, cut, &m, &e2);
        if (st != ELLM_OK) {
            n_err++;
            CHECK(st == ELLM_ERR_FORMAT && strstr(e2.msg, "offset"), "cut %zu: status %d '%s'", cut, st, e2.msg);
            CHECK(m.n_slots == 0, "cut %zu: a failed parse leaves a zeroed result", cut);
        } else {
            CHECK(m.n_slots <= 1, "cut %zu: %d slots", cut, m.n_slots);
        }
    }
    CHECK(n_err > (int)t->n / 2, "only %d of %zu truncations rejected", n_err, t->n);
    /* a length below the header */
    table *b = calloc(1, sizeof *b);
    memcpy(b, t, sizeof *t);
    b->b[1] = 3;
    CHECK(parse(b, &m, &err) == ELLM_ERR_FORMAT && strstr(err.msg, "length 3"), "length 3: %s", err.msg);
    /* a formatted length past the table */
    memcpy(b, t, sizeof *t);
    b->b[1] = 0xFF;
    b->n = 0x40;
    CHECK(parse(b, &m, &err) == ELLM_ERR_FORMAT && strstr(err.msg, "runs past"), "long record: %s", err.msg);
    /* strings never terminated: the table ends inside a string */
    memcpy(b, t, sizeof *t);
    b->n = 0x18 + 4;
    CHECK(parse(b, &m, &err) == ELLM_ERR_FORMAT && strstr(err.msg, "not terminated"), "strings: %s", err.msg);
    /* string indices past the set, all-0xFF bytes */
    memcpy(b, t, sizeof *t);
    size_t dimm_at = 0x18 + strlen("Vendor") + strlen("1.0") + 3;
    b->b[dimm_at + 0x10] = 9;
    b->b[dimm_at + 0x11] = 200;
    CHECK(parse(b, &m, &err) == ELLM_OK && m.n_slots == 1, "bad string index: %s", err.msg);
    memset(b->b, 0xFF, 4096);
    b->n = 4096;
    CHECK(parse(b, &m, &err) == ELLM_ERR_FORMAT, "all 0xFF accepted");
    free(b);
    free(t);

    /* absent and unreadable files */
    CHECK(dmi_read_memory("/nonexistent/DMI", &m, &err) == ELLM_ERR_IO && strstr(err.msg, "/nonexistent/DMI"),
          "absent: %s", err.msg);
    CHECK(dmi_read_memory("/tmp", &m, &err) == ELLM_ERR_IO, "a directory: %s", err.msg);
    if (geteuid() != 0) {
        const char *p = "/tmp/ellm_test_dmi_noread";
        FILE *f = fopen(p, "wb");
        fputs("x", f);
        fclose(f);
        chmod(p, 0);
        CHECK(dmi_read_memory(p, &m, &err) == ELLM_ERR_IO, "unreadable: %s", err.msg);
        remove(p);
    } else {
        printf("SKIP: unreadable DMI file case (running as root, every file is readable)\n");
    }
}

/* ---- advice ----------------------------------------------------------------- */

static probe_report *report(const char *desc, double local, double remote) {
    static probe_report r;
    probe_report_free(&r);
    memset(&r, 0, sizeof r);
    topology *t = NULL;
    ellm_error err = {0};
    CHECK(topology_init_synthetic(desc, &t, &err) == ELLM_OK, "%s: %s", desc, err.msg);
    if (!t) return &r;
    probe_set_topology(&r, t);
    topology_free(t);
    snprintf(r.isa, sizeof r.isa, "avx512");
    r.logical_cpus = r.physical_cores * r.smt;
    for (int k = 0; k < r.n_nodes; k++) {
        r.nodes[k].read_gbps = local;
        if (r.n_nodes > 1) r.nodes[k].remote_read_gbps = remote, r.nodes[k].remote_node = (k + 1) % r.n_nodes;
    }
    r.all_read_gbps = local * r.n_nodes;
    snprintf(r.thp, sizeof r.thp, "madvise");
    return &r;
}

static void set_channels(probe_report *r, int populated, int total, int mts) {
    dmi_memory m = {0};
    m.n_slots = total, m.n_populated = populated, m.n_channels = total, m.n_channels_populated = populated;
    m.speed_mts = m.rated_mts = mts, m.data_width_bits = 64;
    snprintf(m.type, sizeof m.type, "DDR5");
    m.peak_gbps = populated * mts * 8 / 1000.0, m.full_peak_gbps = total * mts * 8 / 1000.0;
    probe_set_channels(r, ELLM_OK, &m, NULL);
}

static int has_advice(const probe_report *r, const char *what) {
    for (int i = 0; i < r->n_advice; i++)
        if (strstr(r->advice[i], what)) return 1;
    return 0;
}

static void test_advice(void) {
    /* 2 sockets x 1 node, all 12+12 channels, measured 80% of peak: NUMA placement is the bottleneck */
    probe_report *r = report("pack:2 [numa(memory=68719476736)] core:8 pu:2", 184, 92);
    set_channels(r, 24, 24, 4800);
    r->all_read_gbps = 0.8 * r->dmi.peak_gbps;
    probe_advise(r);
    CHECK(r->n_advice > 0 && strstr(r->advice[0], "2 NUMA nodes: use --numa-aware") && strstr(r->advice[0], "50%"),
          "2x1: first advice '%s'", r->n_advice ? r->advice[0] : "");
    CHECK(has_advice(r, "SMT on") && has_advice(r, "threads = physical cores (16"), "2x1: SMT advice missing");
    CHECK(has_advice(r, "80% of the channels' peak"), "2x1: bandwidth share missing");

    /* SNC2: 4 nodes */
    r = report("pack:2 group:2 [numa(memory=17179869184)] core:4 pu:1", 60, 45);
    set_channels(r, 16, 16, 4800);
    r->all_read_gbps = 0.85 * r->dmi.peak_gbps;
    probe_advise(r);
    CHECK(strstr(r->advice[0], "4 NUMA nodes: use --numa-aware") != NULL, "SNC2: first advice '%s'", r->advice[0]);
    CHECK(!has_advice(r, "SMT on"), "SNC2 without SMT: SMT advice given");

    /* 1 socket x 1 node, 4 of 8 channels populated (and NPS4 with 4 of 8, where channels still come first) */
    r = report("pack:1 [numa(memory=68719476736)] core:16 pu:1", 150, 0);
    set_channels(r, 4, 8, 4800);
    r->all_read_gbps = 0.8 * r->dmi.peak_gbps;
    probe_advise(r);
    CHECK(strstr(r->advice[0], "4 of 8 channels populated: bandwidth capped at 153.6 GB/s") != NULL,
          "half channels: first advice '%s'", r->advice[0]);
    r = report("pack:1 group:4 [numa(memory=8589934592)] core:4 pu:2", 40, 30);
    set_channels(r, 4, 8, 4800);
    r->all_read_gbps = 0.8 * r->dmi.peak_gbps;
    probe_advise(r);
    CHECK(strstr(r->advice[0], "4 of 8 channels") && strstr(r->advice[1], "4 NUMA nodes"),
          "NPS4 half channels: '%s' then '%s'", r->advice[0], r->advice[1]);

    /* every channel populated but only 55% of their peak measured */
    r = report("pack:1 [numa(memory=68719476736)] core:16 pu:1", 0, 0);
    set_channels(r, 8, 8, 4800);
    r->all_read_gbps = 0.55 * r->dmi.peak_gbps;
    r->nodes[0].read_gbps = r->all_read_gbps;
    probe_advise(r);
    CHECK(strstr(r->advice[0], "measured bandwidth is 55% of the channels' peak") != NULL, "55%%: first advice '%s'",
          r->advice[0]);

    /* 2 packages shown as 1 node: firmware interleaving */
    r = report("pack:2 core:8 pu:1", 200, 0);
    set_channels(r, 16, 16, 4800);
    r->all_read_gbps = 0.8 * r->dmi.peak_gbps;
    probe_advise(r);
    CHECK(r->n_nodes == 1 && strstr(r->advice[0], "interleaves memory across the sockets") != NULL,
          "interleaved: %d nodes, first advice '%s'", r->n_nodes, r->advice[0]);

    /* a healthy SMT machine: bandwidth itself is the bottleneck; THP off is named */
    r = report("pack:1 [numa(memory=68719476736)] core:8 pu:2", 80, 0);
    set_channels(r, 8, 8, 4800);
    r->all_read_gbps = 0.85 * r->dmi.peak_gbps;
    probe_advise(r);
    CHECK(strstr(r->advice[0], "no placement problem found") != NULL && has_advice(r, "SMT on (2 hardware threads"),
          "healthy SMT: first advice '%s'", r->advice[0]);
    snprintf(r->thp, sizeof r->thp, "never");
    probe_advise(r);
    CHECK(has_advice(r, "transparent huge pages are off"), "THP never not reported");
    /* a container's limits: a 2-CPU quota on 8 cores comes first (the largest gain), the memory limit is named */
    r->cpu_quota = 2;
    r->default_threads = 2;
    r->memory_limit = 8000000000ull;
    r->memory_available = 6000000000ull;
    probe_advise(r);
    CHECK(strstr(r->advice[0], "a CPU quota of 2 CPUs (cgroup) below the 8 cores: eLLM runs 2 compute threads") &&
              has_advice(r, "a memory limit of 8.00 GB (cgroup), 6.00 GB of it free"),
          "limits: first advice '%s'", r->advice[0]);

    /* channels unknown: said why */
    r = report("pack:1 [numa(memory=8589934592)] core:2 pu:1", 20, 0);
    dmi_memory none = {0};
    probe_set_channels(r, ELLM_ERR_IO, &none, "the DIMM table is readable by root only (run as root to see channels)");
    probe_advise(r);
    CHECK(!r->channels_known && has_advice(r, "memory channels unknown: the DIMM table is readable by root only") &&
              strstr(r->advice[0], "no placement problem"),
          "unreadable table: '%s'", r->advice[0]);
    dmi_memory vm = {.n_slots = 1, .n_populated = 1, .virtual_table = 1};
    probe_set_channels(r, ELLM_OK, &vm, NULL);
    probe_advise(r);
    CHECK(has_advice(r, "virtual machine"), "virtual table not named");
    probe_report_free(r);
}

/* ---- this machine ------------------------------------------------------------ */

static void test_measure(void) {
    topology *t = NULL;
    ellm_error err = {0};
    CHECK(topology_init_system(&t, &err) == ELLM_OK, "system: %s", err.msg);
    if (!t) return;
    static probe_report r;
    memset(&r, 0, sizeof r);
    probe_set_topology(&r, t);
    cpu_set_t before, after;
    sched_getaffinity(0, sizeof before, &before);
    CHECK(probe_measure(&r, t, 32u << 20, 2, &err) == ELLM_OK, "measure: %s", err.msg);
    sched_getaffinity(0, sizeof after, &after);
    CHECK(CPU_EQUAL(&before, &after), "probe_measure did not restore the affinity");
    for (int k = 0; k < r.n_nodes; k++)
        if (r.nodes[k].n_cores) CHECK(r.nodes[k].read_gbps > 0, "node %d: no bandwidth measured", r.nodes[k].os_index);
    CHECK(r.all_read_gbps > 0, "all-node bandwidth %.2f", r.all_read_gbps);
    probe_report_free(&r);
    topology_free(t);
}

/* ---- ellm probe --json --------------------------------------------------------- */

/* The object's keys are exactly `keys` (NULL-terminated). */
static int exact_keys(const cJSON *o, const char *const *keys) {
    int n = 0;
    for (const cJSON *c = o ? o->child : NULL; c; c = c->next) {
        int found = 0;
        for (int i = 0; keys[i]; i++) found |= !strcmp(c->string, keys[i]);
        if (!found) return 0;
        n++;
    }
    int want = 0;
    while (keys[want]) want++;
    return n == want;
}

static void check_probe_json(const char *out, int want_cpus, int want_channels) {
    cJSON *j = cJSON_Parse(out);
    CHECK(j != NULL, "probe --json is not JSON: %s", out);
    if (!j) return;
    static const char *const top[] = {"isa",     "logical_cpus", "physical_cores", "numa_nodes", "channels",
                                      "thp",     "limits",       "advice",         NULL};
    static const char *const limits[] = {"cpu_quota", "default_threads", "memory_limit_bytes", "memory_available_bytes",
                                         NULL};
    static const char *const node[] = {"id", "cpus", "memory_bytes", "read_gbps", NULL};
    CHECK(exact_keys(j, top), "top-level keys differ: %s", out);
    const cJSON *isa = cJSON_GetObjectItem(j, "isa"), *lc = cJSON_GetObjectItem(j, "logical_cpus");
    const cJSON *pc = cJSON_GetObjectItem(j, "physical_cores"), *nodes = cJSON_GetObjectItem(j, "numa_nodes");
    const cJSON *ch = cJSON_GetObjectItem(j, "channels"), *thp = cJSON_GetObjectItem(j, "thp");
    const cJSON *adv = cJSON_GetObjectItem(j, "advice");
    CHECK(cJSON_IsString(isa) && (!strcmp(isa->valuestring, "avx512") || !strcmp(isa->valuestring, "avx2") ||
                                  !strcmp(isa->valuestring, "scalar")),
          "isa");
    CHECK(cJSON_IsNumber(lc) && lc->valueint == want_cpus, "logical_cpus %d, affinity mask has %d",
          lc ? lc->valueint : -1, want_cpus);
    CHECK(cJSON_IsNumber(pc) && pc->valueint >= 1 && pc->valueint <= want_cpus, "physical_cores");
    CHECK(cJSON_IsArray(nodes) && cJSON_GetArraySize(nodes) >= 1, "numa_nodes");
    int cpus_total = 0;
    for (const cJSON *n = nodes ? nodes->child : NULL; n; n = n->next) {
        CHECK(exact_keys(n, node), "node keys differ");
        const cJSON *c = cJSON_GetObjectItem(n, "cpus");
        CHECK(cJSON_IsNumber(cJSON_GetObjectItem(n, "id")) && cJSON_IsArray(c) &&
                  cJSON_IsNumber(cJSON_GetObjectItem(n, "memory_bytes")) &&
                  cJSON_GetObjectItem(n, "memory_bytes")->valuedouble > 0 &&
                  cJSON_IsNumber(cJSON_GetObjectItem(n, "read_gbps")),
              "node fields");
        cpus_total += c ? cJSON_GetArraySize(c) : 0;
        if (c && cJSON_GetArraySize(c)) CHECK(cJSON_GetObjectItem(n, "read_gbps")->valuedouble > 0, "node read_gbps 0");
    }
    CHECK(cpus_total == want_cpus, "nodes list %d cpus, mask has %d", cpus_total, want_cpus);
    CHECK(want_channels ? cJSON_IsObject(ch) : (cJSON_IsNull(ch) || cJSON_IsObject(ch)), "channels");
    if (want_channels && cJSON_IsObject(ch))
        CHECK(cJSON_GetObjectItem(ch, "populated_channels")->valueint == 4 &&
                  cJSON_GetObjectItem(ch, "channels")->valueint == 8 &&
                  cJSON_GetObjectItem(ch, "peak_gbps")->valuedouble > 93,
              "channels from --dmi: %s", out);
    CHECK(cJSON_IsString(thp) || cJSON_IsNull(thp), "thp");
    const cJSON *lim = cJSON_GetObjectItem(j, "limits");
    CHECK(cJSON_IsObject(lim) && exact_keys(lim, limits) &&
              cJSON_GetObjectItem(lim, "default_threads")->valueint >= 1 &&
              cJSON_GetObjectItem(lim, "default_threads")->valueint <= (pc ? pc->valueint : 0) &&
              cJSON_GetObjectItem(lim, "memory_available_bytes")->valuedouble > 0 &&
              cJSON_GetObjectItem(lim, "cpu_quota")->valuedouble >= 0,
          "limits: %s", out);
    CHECK(cJSON_IsArray(adv) && cJSON_GetArraySize(adv) >= 1 && cJSON_IsString(adv->child), "advice");
    int named = 0;
    for (const cJSON *a = adv ? adv->child : NULL; a; a = a->next) named |= strstr(a->valuestring, "4 of 8 channels populated") != NULL;
    if (want_channels) CHECK(named, "no advice on the 4 of 8 channels: %s", out);
    cJSON_Delete(j);
}

static void test_cli(void) {
    static char out[1 << 16];
    /* keep the probe's saved result out of the user's cache */
    char cache[64], dmi[64];
    snprintf(cache, sizeof cache, "/tmp/ellm_test_probe_cache.%d.txt", (int)getpid());
    snprintf(dmi, sizeof dmi, "/tmp/ellm_test_probe.%d.dmi", (int)getpid());
    setenv("ELLM_PROBE_CACHE", cache, 1);
    cpu_set_t set;
    sched_getaffinity(0, sizeof set, &set);
    int rc = test_ellm("probe --json --bw-mb 32", out, sizeof out);
    CHECK(rc == 0, "ellm probe --json failed (%d): %s", rc, out);
    if (rc == 0) check_probe_json(out, CPU_COUNT(&set), 0);
    /* restricted to one CPU, and channels from a stored table */
    table *t = calloc(1, sizeof *t);
    for (int c = 0; c < 8; c++) {
        char dev[32];
        snprintf(dev, sizeof dev, "CPU0_DIMM_%c1", 'A' + c);
        dimm d = {dev, "NODE 0", "Hynix", c < 4 ? 32768 : 0, 3200, 2933, 0x1A, 0x28};
        add_dimm(t, &d);
    }
    FILE *f = fopen(dmi, "wb");
    fwrite(t->b, 1, t->n, f);
    fclose(f);
    free(t);
    if (access("/usr/bin/taskset", X_OK) == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "taskset -c 0 %s probe --json --bw-mb 32 --dmi %s 2>&1", test_ellm_bin(), dmi);
        int st = test_shell(cmd, out, sizeof out);
        CHECK(st == 0, "taskset probe: %s", out);
        if (st == 0) check_probe_json(out, 1, 1);
    } else {
        SKIP("probe under taskset (no /usr/bin/taskset)");
    }
    char probe_dmi[128];
    snprintf(probe_dmi, sizeof probe_dmi, "probe --dmi %s --bw-mb 32", dmi);
    rc = test_ellm(probe_dmi, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "4 of 8 channels populated") && strstr(out, "advice:") && strstr(out, "topology: ") &&
              strstr(out, "NUMA node"),
          "text probe: %s", out);
    remove(dmi);
    /* the probe keeps its all-node figure; run --stats and bench report against it */
    remove(cache);
    rc = test_ellm("run -n 16 --seed 2 --stats", out, sizeof out);
    CHECK(rc == 0 && strstr(out, "bandwidth: ") && strstr(out, "measured now as ellm probe does"),
          "run --stats without a saved probe: %s", out);
    rc = test_ellm("probe --bw-mb 32", out, sizeof out);
    char *saved = test_read_file(cache, NULL);
    double gbps = 0;
    int saved_cores = 0;
    CHECK(rc == 0 && saved && sscanf(saved, "ellm-probe 1 physical_cores %d all_read_gbps %lf", &saved_cores, &gbps) == 2 &&
              gbps > 0,
          "probe did not save its result: %s", saved ? saved : "(no file)");
    free(saved);
    rc = test_ellm("run -n 16 --seed 2 --stats", out, sizeof out);
    char want[96];
    snprintf(want, sizeof want, "of the %.2f GB/s ellm probe measured", gbps);
    CHECK(rc == 0 && strstr(out, want), "run --stats: no '%s' in %s", want, out);
    rc = test_ellm("bench -n 4 --depths 0 --prefill 0 --bw-mb 16 --json", out, sizeof out);
    cJSON *j = cJSON_Parse(out);
    const cJSON *pb = j ? cJSON_GetObjectItem(j, "probe_read_gbps") : NULL;
    const cJSON *pts = j ? cJSON_GetObjectItem(j, "points") : NULL;
    const cJSON *pf = pts && pts->child ? cJSON_GetObjectItem(pts->child, "probe_fraction") : NULL;
    const cJSON *g = pts && pts->child ? cJSON_GetObjectItem(pts->child, "gbps") : NULL;
    CHECK(rc == 0 && cJSON_IsNumber(pb) && fabs(pb->valuedouble - gbps) < 0.01 && cJSON_IsNumber(pf) && g &&
              fabs(pf->valuedouble - g->valuedouble / gbps) < 0.01,
          "bench probe_read_gbps / probe_fraction: %s", out);
    /* the saved figure's age: the probe ran a few seconds ago */
    const cJSON *ps = j ? cJSON_GetObjectItem(j, "probe_saved") : NULL;
    const cJSON *age = j ? cJSON_GetObjectItem(j, "probe_age_s") : NULL;
    CHECK(cJSON_IsTrue(ps) && cJSON_IsNumber(age) && age->valuedouble >= 0 && age->valuedouble < 600,
          "bench probe_saved / probe_age_s: %s", out);
    cJSON_Delete(j);
    rc = test_ellm("bench -n 4 --depths 0 --prefill 0 --bw-mb 16", out, sizeof out);
    snprintf(want, sizeof want, "share of the %.1f GB/s `ellm probe` measured ", gbps);
    CHECK(rc == 0 && strstr(out, want) && strstr(out, " s ago (all nodes)"), "bench text: no '%s... s ago' in %s", want,
          out);
    /* an old result says how old */
    FILE *old = fopen(cache, "w");
    if (old) {
        fprintf(old, "ellm-probe 1\nphysical_cores %d\nall_read_gbps 12.345\nmeasured_at %lld\n",
                saved_cores, (long long)time(NULL) - 3 * 3600);
        fclose(old);
    }
    rc = test_ellm("bench -n 4 --depths 0 --prefill 0 --bw-mb 16", out, sizeof out);
    CHECK(old && rc == 0 && strstr(out, "share of the 12.3 GB/s `ellm probe` measured 3.0 h ago (all nodes)"),
          "bench with a 3-hour-old probe: %s", out);
    remove(cache);
    rc = test_ellm("bench -n 4 --depths 0 --prefill 0 --bw-mb 16 --json", out, sizeof out);
    j = cJSON_Parse(out);
    ps = j ? cJSON_GetObjectItem(j, "probe_saved") : NULL;
    age = j ? cJSON_GetObjectItem(j, "probe_age_s") : NULL;
    pb = j ? cJSON_GetObjectItem(j, "probe_read_gbps") : NULL;
    CHECK(rc == 0 && cJSON_IsFalse(ps) && cJSON_IsNumber(age) && age->valuedouble == 0 && cJSON_IsNumber(pb) &&
              pb->valuedouble > 0,
          "bench without a saved probe: %s", out);
    cJSON_Delete(j);
    unsetenv("ELLM_PROBE_CACHE");
    remove(cache);

    rc = test_ellm("probe --bogus", out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--bogus"), "bad option: %d %s", rc, out);
    rc = test_ellm("probe --bw-mb 1", out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--bw-mb"), "bad --bw-mb: %d %s", rc, out);
}

/* The bandwidth test's buffer: past twice a node's L3 (a 260 MB L3 holds a
 * 128 MB buffer, and then the figure is the cache's), within 128 MB..1 GB,
 * and never more than an eighth of the memory available. */
static void test_test_bytes(void) {
    ellm_meminfo mi;
    ellm_meminfo_get(&mi);
    const uint64_t eighth = mi.known ? mi.available / 8 : UINT64_MAX;
    const struct {
        const char *desc;
        uint64_t want;
    } cases[] = {
        {"pack:1 [numa(memory=8589934592)] l3:1(size=33554432) core:4 pu:1", 128u << 20},
        {"pack:1 [numa(memory=8589934592)] l3:1(size=272629760) core:2 pu:1", 2 * 272629760ull},
        {"pack:1 [numa(memory=8589934592)] l3:1(size=1073741824) core:2 pu:1", 1u << 30},
        {"pack:2 [numa(memory=8589934592)] l3:1(size=201326592) core:4 pu:1", 2 * 201326592ull},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        topology *t = NULL;
        ellm_error err = {0};
        CHECK(topology_init_synthetic(cases[i].desc, &t, &err) == ELLM_OK, "%s: %s", cases[i].desc, err.msg);
        if (!t) continue;
        uint64_t want = cases[i].want < eighth ? cases[i].want : eighth;
        if (want < (4u << 20)) want = 4u << 20;
        size_t got = probe_test_bytes(t);
        CHECK(got == want, "%s: test bytes %zu, want %llu", cases[i].desc, got, (unsigned long long)want);
        topology_free(t);
    }
    size_t sys = probe_test_bytes(NULL);
    CHECK(sys >= (4u << 20) && sys <= (1u << 30) && (!mi.known || sys <= mi.available / 8 || sys == (4u << 20)),
          "this system's test bytes %zu", sys);
}

int main(void) {
    test_layouts();
    test_malformed();
    test_advice();
    test_measure();
    test_cli();
    test_test_bytes();
    return test_finish();
}
