/* Available memory: /proc/meminfo and the process's memory cgroups. */
#include "core/meminfo.h"
#include "core/cgroup.h"

#include <stdio.h>
#include <string.h>

/* Limits at or above this mean "none" (v1 reports 2^63 rounded down to a page). */
#define NO_LIMIT ((uint64_t)1 << 60)

typedef struct {
    uint64_t headroom; /* smallest so far; UINT64_MAX: no limit seen */
    uint64_t limit;    /* smallest limit so far; 0: none */
} mem_walk;

/* A cgroup's headroom: limit - (usage - page cache). */
static void memory_visit(const char *root, const char *dir, int v2, void *arg) {
    mem_walk *w = arg;
    char path[1100];
    int ok_l, ok_u, ok_c;
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    const uint64_t lim = cgroup_read_number(root, path, NULL, &ok_l);
    if (!ok_l || lim >= NO_LIMIT) return;
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
    const uint64_t used = cgroup_read_number(root, path, NULL, &ok_u);
    if (!ok_u) return;
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    const uint64_t cache = cgroup_read_number(root, path, v2 ? "file" : "total_cache", &ok_c);
    const uint64_t held = !ok_c ? used : cache < used ? used - cache : 0;
    const uint64_t h = held < lim ? lim - held : 0;
    if (h < w->headroom) w->headroom = h;
    if (!w->limit || lim < w->limit) w->limit = lim;
}

void ellm_meminfo_at(const char *root, ellm_meminfo *out) {
    memset(out, 0, sizeof *out);
    int ok;
    const uint64_t kb = cgroup_read_number(root, "/proc/meminfo", "MemAvailable", &ok);
    if (ok) out->system = kb * 1024;
    out->available = out->system;
    out->known = ok;
    mem_walk w = {UINT64_MAX, 0};
    cgroup_walk(root, "memory", memory_visit, &w);
    if (w.headroom != UINT64_MAX) {
        out->cgroup = w.headroom;
        out->cgroup_limit = w.limit;
        out->cgroup_bound = !out->known || w.headroom <= out->available;
        if (out->cgroup_bound) out->available = w.headroom;
        out->known = 1;
    }
}

void ellm_meminfo_get(ellm_meminfo *out) { ellm_meminfo_at("", out); }
