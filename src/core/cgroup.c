/* Walking the process's cgroups (v1 and v2) and reading their numbers. */
#include "core/cgroup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

uint64_t cgroup_read_number(const char *root, const char *path, const char *key, int *ok) {
    char full[1200];
    snprintf(full, sizeof full, "%s%s", root, path);
    FILE *f = fopen(full, "r");
    *ok = 0;
    if (!f) return 0;
    char line[512];
    uint64_t v = 0;
    const size_t kl = key ? strlen(key) : 0;
    while (fgets(line, sizeof line, f)) {
        if (key && (strncmp(line, key, kl) || (line[kl] != ' ' && line[kl] != ':' && line[kl] != '\t'))) continue;
        const char *p = line + kl;
        while (*p == ' ' || *p == '\t' || *p == ':') p++;
        if (!strncmp(p, "max", 3)) {
            v = UINT64_MAX;
            *ok = 1;
            break;
        }
        char *end;
        unsigned long long x = strtoull(p, &end, 10);
        if (end != p && *p != '-') {
            v = (uint64_t)x;
            *ok = 1;
        }
        break;
    }
    fclose(f);
    return v;
}

/* fn for mount + path and each ancestor up to the mount itself. */
static void walk_tree(const char *root, const char *mount, const char *path, int v2, cgroup_visit_fn fn, void *arg) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s%s", mount, path);
    const size_t base = strlen(mount);
    for (;;) {
        size_t n = strlen(dir);
        while (n > base && dir[n - 1] == '/') dir[--n] = 0; /* "/x/" -> "/x"; the mount itself stays */
        fn(root, dir, v2, arg);
        char *slash = strrchr(dir + base, '/');
        if (!slash || n <= base) break;
        *slash = 0;
    }
}

static int is_dir(const char *root, const char *path) {
    char full[1200];
    struct stat sb;
    snprintf(full, sizeof full, "%s%s", root, path);
    return stat(full, &sb) == 0 && S_ISDIR(sb.st_mode);
}

void cgroup_walk(const char *root, const char *controller, cgroup_visit_fn fn, void *arg) {
    /* /proc/self/cgroup: "0::/path" (v2) or "N:controllers:/path" (v1) */
    char full[1024], line[1024];
    snprintf(full, sizeof full, "%s/proc/self/cgroup", root);
    FILE *f = fopen(full, "r");
    const size_t cl = strlen(controller);
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = 0;
        const char *controllers = c1 + 1, *path = c2 + 1;
        if (!*controllers && !strcmp(line, "0")) {
            walk_tree(root, is_dir(root, "/sys/fs/cgroup/unified") ? "/sys/fs/cgroup/unified" : "/sys/fs/cgroup", path, 1,
                      fn, arg);
            continue;
        }
        for (const char *c = controllers; (c = strstr(c, controller)); c += cl)
            if ((c == controllers || c[-1] == ',') && (c[cl] == 0 || c[cl] == ',')) {
                /* mounted under the controller's name (often a link to "cpu,cpuacct"), else the list's */
                char mount[300];
                snprintf(mount, sizeof mount, "/sys/fs/cgroup/%s", controller);
                if (!is_dir(root, mount)) snprintf(mount, sizeof mount, "/sys/fs/cgroup/%s", controllers);
                walk_tree(root, mount, path, 0, fn, arg);
                break;
            }
    }
    if (f) fclose(f);
}

static void quota_visit(const char *root, const char *dir, int v2, void *arg) {
    double *best = arg;
    char path[1100];
    int ok_q, ok_p = 0;
    uint64_t q, p = 0;
    if (v2) { /* cpu.max: "QUOTA PERIOD" or "max PERIOD" */
        snprintf(path, sizeof path, "%s%s/cpu.max", root, dir);
        FILE *f = fopen(path, "r");
        char qs[32] = "";
        unsigned long long per = 0;
        ok_q = f && fscanf(f, "%31s %llu", qs, &per) == 2 && strcmp(qs, "max") != 0;
        if (f) fclose(f);
        if (!ok_q) return;
        q = strtoull(qs, NULL, 10);
        p = per;
        ok_p = 1;
    } else { /* cfs_quota_us is -1 without a quota */
        snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
        q = cgroup_read_number(root, path, NULL, &ok_q);
        snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
        p = cgroup_read_number(root, path, NULL, &ok_p);
    }
    if (!ok_q || !ok_p || !q || !p || q == UINT64_MAX) return;
    const double cpus = (double)q / (double)p;
    if (*best == 0 || cpus < *best) *best = cpus;
}

double cgroup_cpu_quota(const char *root) {
    double best = 0;
    cgroup_walk(root, "cpu", quota_visit, &best);
    return best;
}
