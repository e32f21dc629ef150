/* Available memory: /proc/meminfo and the process's memory cgroup (v1 or v2). */
#include "core/meminfo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limits at or above this mean "none" (v1 reports 2^63 rounded down to a page). */
#define NO_LIMIT ((uint64_t)1 << 60)

/* The first unsigned number of file root/path (optionally after `key` at a
 * line's start); 0 and *ok = 0 if there is none. */
static uint64_t read_number(const char *root, const char *path, const char *key, int *ok) {
    char full[1024];
    snprintf(full, sizeof full, "%s%s", root, path);
    FILE *f = fopen(full, "r");
    *ok = 0;
    if (!f) return 0;
    char line[512];
    uint64_t v = 0;
    const size_t kl = key ? strlen(key) : 0;
    while (fgets(line, sizeof line, f)) {
        if (key && (strncmp(line, key, kl) || (line[kl] != ' ' && line[kl] != ':' && line[kl] != '\t'))) continue;
        const char *p = line + kl + (key ? 1 : 0);
        while (*p == ' ' || *p == '\t' || *p == ':') p++;
        if (!key && !strncmp(p, "max", 3)) { /* v2's "max": no limit */
            v = UINT64_MAX;
            *ok = 1;
            break;
        }
        char *end;
        unsigned long long x = strtoull(p, &end, 10);
        if (end != p) {
            v = (uint64_t)x;
            *ok = 1;
        }
        break;
    }
    fclose(f);
    return v;
}

/* Headroom of cgroup directory dir (under root): limit - (usage - page
 * cache), or UINT64_MAX when it sets no limit or cannot be read. */
static uint64_t headroom(const char *root, const char *dir, int v2, uint64_t *limit) {
    char path[1024];
    int ok_l, ok_u, ok_c;
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    const uint64_t lim = read_number(root, path, NULL, &ok_l);
    if (!ok_l || lim >= NO_LIMIT) return UINT64_MAX;
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
    const uint64_t used = read_number(root, path, NULL, &ok_u);
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    const uint64_t cache = read_number(root, path, v2 ? "file" : "total_cache", &ok_c);
    if (!ok_u) return UINT64_MAX;
    const uint64_t held = !ok_c ? used : cache < used ? used - cache : 0;
    if (lim < *limit || !*limit) *limit = lim;
    return held < lim ? lim - held : 0;
}

/* The smallest headroom over cgroup `path` (as /proc/self/cgroup names it)
 * and its ancestors, mounted at `mount` under root. */
static uint64_t tree_headroom(const char *root, const char *mount, const char *path, int v2, uint64_t *limit) {
    char dir[1024];
    uint64_t best = UINT64_MAX;
    snprintf(dir, sizeof dir, "%s%s", mount, path);
    size_t base = strlen(mount);
    for (;;) {
        size_t n = strlen(dir);
        while (n > base && dir[n - 1] == '/') dir[--n] = 0; /* "/x/" -> "/x"; the mount itself stays */
        const uint64_t h = headroom(root, dir, v2, limit);
        if (h < best) best = h;
        char *slash = strrchr(dir + base, '/');
        if (!slash || n <= base) break;
        *slash = 0;
    }
    return best;
}

void ellm_meminfo_at(const char *root, ellm_meminfo *out) {
    memset(out, 0, sizeof *out);
    int ok;
    const uint64_t kb = read_number(root, "/proc/meminfo", "MemAvailable", &ok);
    if (ok) out->system = kb * 1024;
    /* /proc/self/cgroup: "0::/path" (v2) or "N:...memory...:/path" (v1) */
    char full[1024], line[1024];
    snprintf(full, sizeof full, "%s/proc/self/cgroup", root);
    FILE *f = fopen(full, "r");
    uint64_t cg = UINT64_MAX;
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = 0;
        const char *controllers = c1 + 1, *path = c2 + 1;
        uint64_t h = UINT64_MAX;
        if (!*controllers && !strcmp(line, "0")) {
            h = tree_headroom(root, "/sys/fs/cgroup", path, 1, &out->cgroup_limit);
            if (h == UINT64_MAX) /* a v2 hierarchy beside v1 ones */
                h = tree_headroom(root, "/sys/fs/cgroup/unified", path, 1, &out->cgroup_limit);
        } else {
            char *ctl = strstr(controllers, "memory");
            if (ctl && (ctl == controllers || ctl[-1] == ',') && (ctl[6] == 0 || ctl[6] == ','))
                h = tree_headroom(root, "/sys/fs/cgroup/memory", path, 0, &out->cgroup_limit);
        }
        if (h < cg) cg = h;
    }
    if (f) fclose(f);
    out->available = out->system;
    out->known = ok;
    if (cg != UINT64_MAX) {
        out->cgroup = cg;
        if (!out->known || cg < out->available) out->available = cg;
        out->known = 1;
    }
}

void ellm_meminfo_get(ellm_meminfo *out) { ellm_meminfo_at("", out); }
