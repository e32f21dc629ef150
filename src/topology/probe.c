/* The hardware probe: measurements and advice. */
#include "core/cgroup.h"
#include "core/meminfo.h"
#include "topology/probe.h"
#include "core/cpu.h"
#include "core/membw.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "topology/place.h"
#include "topology/plan.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

void probe_set_topology(probe_report *r, const topology *t) {
    r->physical_cores = t->n_cores;
    r->n_packages = t->n_packages;
    r->smt = t->smt;
    r->n_nodes = t->n_nodes < PROBE_MAX_NODES ? t->n_nodes : PROBE_MAX_NODES;
    topology_describe(t, r->topology, sizeof r->topology);
    for (int k = 0; k < r->n_nodes; k++) {
        probe_node *n = &r->nodes[k];
        free(n->cpus);
        memset(n, 0, sizeof *n);
        n->os_index = t->nodes[k].os_index;
        n->memory_bytes = t->nodes[k].memory_bytes;
        n->n_cores = t->nodes[k].n_cores;
        n->remote_node = -1;
        n->cpus = calloc((size_t)t->nodes[k].n_cpus + 1, sizeof *n->cpus);
        for (int c = 0; c < t->n_cores && n->cpus; c++)
            if (t->cores[c].node == k)
                for (int j = 0; j < t->cores[c].n_pus; j++) n->cpus[n->n_cpus++] = t->cores[c].pus[j];
        if (n->cpus) qsort(n->cpus, (size_t)n->n_cpus, sizeof *n->cpus, cmp_int);
    }
}

void probe_report_free(probe_report *r) {
    for (int k = 0; k < PROBE_MAX_NODES; k++) {
        free(r->nodes[k].cpus);
        r->nodes[k].cpus = NULL;
    }
}

/* Read rate of `pool` over `bytes` of memory on node `node` (kernel number). */
static double node_read(threadpool *pool, int node, size_t bytes, int reps) {
    char *buf = place_alloc_on_node(bytes, node);
    if (!buf) return 0;
    memset(buf, 1, bytes); /* commit the pages (on `node`: the range is bound) */
    double gbps = membw_read_buffer_gbps(pool, buf, bytes, reps);
    place_free(buf, bytes);
    return gbps;
}

ellm_status probe_measure(probe_report *r, const topology *t, size_t bytes, int reps, ellm_error *err) {
    cpu_set_t saved;
    int have_saved = pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) == 0;
    bytes &= ~(size_t)4095;
    ellm_status st = ELLM_OK;
    int *cpus = calloc((size_t)t->n_cores + 1, sizeof *cpus);
    if (!cpus) return ellm_fail(err, ELLM_ERR_NOMEM, "probe: out of memory");
    /* Per node: its cores (one thread each) reading local memory, then the
     * next node's memory. */
    for (int k = 0; k < r->n_nodes && st == ELLM_OK; k++) {
        int n = 0;
        for (int c = 0; c < t->n_cores; c++)
            if (t->cores[c].node == k) cpus[n++] = t->cores[c].pus[0];
        if (!n) continue; /* a node with memory and no cores (CXL, HBM) */
        threadpool *pool = NULL;
        if ((st = threadpool_init_cpus(n, cpus, &pool, err))) break;
        r->nodes[k].read_gbps = node_read(pool, t->nodes[k].os_index, bytes, reps);
        if (r->n_nodes > 1) {
            int j = (k + 1) % r->n_nodes;
            r->nodes[k].remote_node = t->nodes[j].os_index;
            r->nodes[k].remote_read_gbps = node_read(pool, t->nodes[j].os_index, bytes, reps);
        }
        threadpool_free(pool);
    }
    if (st == ELLM_OK) r->all_read_gbps = r->n_nodes > 1 ? probe_all_read_gbps(t, bytes * (size_t)r->n_nodes, reps)
                                                          : r->nodes[0].read_gbps;
    free(cpus);
    if (have_saved) pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    return st;
}

double probe_all_read_gbps(const topology *t, size_t bytes, int reps) {
    cpu_set_t saved;
    int have_saved = pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) == 0;
    bytes &= ~(size_t)4095;
    topo_plan_params pp = {.n_threads = 0, .mode = TOPO_NUMA_DISTRIBUTE};
    topo_plan *plan = NULL;
    threadpool *pool = NULL;
    char *buf = NULL;
    double gbps = 0;
    if (topo_plan_init(t, &pp, &plan, NULL) == ELLM_OK &&
        threadpool_init_cpus(plan->n_threads, plan->cpu, &pool, NULL) == ELLM_OK &&
        (buf = place_alloc_on_node(bytes, plan->node_os[0]))) {
        /* thread i reads part i (membw's split): put each node's parts on it */
        for (int k = 0; k < plan->n_nodes && plan->n_nodes > 1; k++) {
            int64_t b, e;
            topo_plan_node_rows(plan, (int64_t)bytes, 4096, k, &b, &e);
            place_on_node(buf + b, (size_t)(e - b), plan->node_os[k], PLACE_STRICT);
        }
        memset(buf, 1, bytes);
        gbps = membw_read_buffer_gbps(pool, buf, bytes, reps);
    }
    place_free(buf, bytes);
    threadpool_free(pool);
    topo_plan_free(plan);
    if (have_saved) pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    return gbps;
}

/* The cache file's path into buf; 0 if there is no place for it. */
static int cache_path(char *buf, size_t cap, int make_dirs) {
    const char *env = getenv("ELLM_PROBE_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && *env) return snprintf(buf, cap, "%s", env) < (int)cap;
    char dir[512];
    if (xdg && *xdg) snprintf(dir, sizeof dir, "%s/ellm", xdg);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/ellm", home);
    else return 0;
    if (make_dirs) {
        char parent[512];
        snprintf(parent, sizeof parent, "%s", dir);
        char *slash = strrchr(parent, '/');
        if (slash) *slash = 0;
        mkdir(parent, 0755);
        mkdir(dir, 0755);
    }
    return snprintf(buf, cap, "%s/probe.txt", dir) < (int)cap;
}

int probe_cache_save(const probe_report *r) {
    char path[600];
    if (!cache_path(path, sizeof path, 1)) return -1;
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "ellm-probe 1\nphysical_cores %d\nall_read_gbps %.3f\nmeasured_at %lld\n", r->physical_cores,
            r->all_read_gbps, (long long)time(NULL));
    return fclose(f) == 0 ? 0 : -1;
}

int probe_cache_load(double *all_read_gbps, double *age_s) {
    char path[600];
    if (!cache_path(path, sizeof path, 0)) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int version = 0, cores = -1;
    double gbps = 0;
    long long at = -1;
    int ok = fscanf(f, "ellm-probe %d physical_cores %d all_read_gbps %lf", &version, &cores, &gbps) == 3;
    if (ok && fscanf(f, " measured_at %lld", &at) != 1) at = -1;
    fclose(f);
    /* the cores this process may use (sampled before any thread was pinned) */
    if (!ok || version != 1 || cores != ellm_cpu_physical_cores() || !(gbps > 0)) return 0;
    *all_read_gbps = gbps;
    if (age_s) *age_s = at >= 0 ? difftime(time(NULL), (time_t)at) : -1;
    return 1;
}

void probe_age_text(double age_s, char *buf, size_t n) {
    if (age_s < 0) snprintf(buf, n, "measured at an unknown time");
    else if (age_s < 120) snprintf(buf, n, "measured %.0f s ago", age_s);
    else if (age_s < 7200) snprintf(buf, n, "measured %.0f min ago", age_s / 60);
    else snprintf(buf, n, "measured %.1f h ago", age_s / 3600);
}

size_t probe_test_bytes(const topology *t) {
    topology *own = NULL;
    if (!t && topology_init_system(&own, NULL) == ELLM_OK) t = own;
    uint64_t bytes = (uint64_t)128 << 20;
    if (t && t->n_nodes > 0) {
        /* past the caches a node's cores share: 2x its L3 */
        uint64_t l3_node = t->l3_bytes * (uint64_t)(t->n_l3 > 0 ? t->n_l3 : 1) / (uint64_t)t->n_nodes;
        if (2 * l3_node > bytes) bytes = 2 * l3_node;
        if (bytes > ((uint64_t)1 << 30)) bytes = (uint64_t)1 << 30;
    }
    topology_free(own);
    ellm_meminfo mi;
    ellm_meminfo_get(&mi);
    if (mi.known && mi.available / 8 < bytes) bytes = mi.available / 8;
    if (bytes < ((uint64_t)4 << 20)) bytes = (uint64_t)4 << 20;
    return (size_t)bytes;
}

double probe_reference_gbps(size_t bytes, int reps, int *saved, double *age_s) {
    double gbps = 0;
    *age_s = -1;
    *saved = probe_cache_load(&gbps, age_s);
    if (*saved) return gbps;
    topology *t = NULL;
    if (topology_init_system(&t, NULL) == ELLM_OK) gbps = probe_all_read_gbps(t, bytes ? bytes : probe_test_bytes(t), reps);
    topology_free(t);
    return gbps;
}

void probe_set_channels(probe_report *r, ellm_status dmi_status, const dmi_memory *m, const char *why) {
    r->dmi = *m;
    r->channels_known = dmi_status == ELLM_OK && dmi_channels_known(m);
    r->channels_why[0] = 0;
    if (r->channels_known) return;
    if (dmi_status != ELLM_OK)
        snprintf(r->channels_why, sizeof r->channels_why, "%s", why && *why ? why : "the DIMM table is unreadable");
    else if (m->n_slots == 0)
        snprintf(r->channels_why, sizeof r->channels_why, "the DIMM table lists no memory devices");
    else if (m->virtual_table)
        snprintf(r->channels_why, sizeof r->channels_why, "the DIMM table is a virtual machine's (no real channels)");
    else
        snprintf(r->channels_why, sizeof r->channels_why, "the DIMM table gives no module speed");
}

/* The bracketed choice in a sysfs mode file ("always [madvise] never"). */
static void read_thp(char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return;
    char line[128];
    if (fgets(line, sizeof line, f)) {
        char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
        if (a && b && (size_t)(b - a - 1) < cap) {
            memcpy(out, a + 1, (size_t)(b - a - 1));
            out[b - a - 1] = 0;
        }
    }
    fclose(f);
}

ellm_status probe_run(probe_report *r, size_t bytes, const char *dmi_path, ellm_error *err) {
    double t0 = ellm_time_ms();
    memset(r, 0, sizeof *r);
    snprintf(r->isa, sizeof r->isa, "%s", ellm_isa_str(ellm_cpu_isa()));
    cpu_set_t set;
    CPU_ZERO(&set);
    r->logical_cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    topology *t = NULL;
    ellm_status st = topology_init_system(&t, err);
    if (st) return st;
    probe_set_topology(r, t);
    if (!bytes) bytes = probe_test_bytes(t);
    st = probe_measure(r, t, bytes, 3, err);
    topology_free(t);
    if (st) {
        probe_report_free(r);
        return st;
    }
    dmi_memory m;
    ellm_error derr = {0};
    ellm_status ds = dmi_read_memory(dmi_path, &m, &derr);
    char why[160];
    snprintf(why, sizeof why, "%.150s", derr.msg);
    if (ds == ELLM_ERR_IO) /* say which: absent, or readable by root only */
        snprintf(why, sizeof why, "%s", strstr(derr.msg, "ermission") ? "the DIMM table is readable by root only (run as root to see channels)"
                                                                   : "there is no DIMM table (/sys/firmware/dmi/tables/DMI)");
    probe_set_channels(r, ds, &m, why);
    read_thp(r->thp, sizeof r->thp);
    r->cpu_quota = cgroup_cpu_quota("");
    r->default_threads = ellm_default_threads();
    ellm_meminfo mi;
    ellm_meminfo_get(&mi);
    r->memory_limit = mi.cgroup_limit;
    r->memory_available = mi.available; /* 0 when unknown */
    probe_advise(r);
    r->elapsed_ms = ellm_time_ms() - t0;
    return ELLM_OK;
}

/* ---- advice ---------------------------------------------------------------- */

typedef struct {
    double gain; /* expected speed-up of decode if this is fixed (1: none) */
    char text[320];
} advice_item;

static void add(advice_item *items, int *n, double gain, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add(advice_item *items, int *n, double gain, const char *fmt, ...) {
    if (*n >= PROBE_MAX_ADVICE) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(items[*n].text, sizeof items[*n].text, fmt, ap);
    va_end(ap);
    items[*n].gain = gain;
    (*n)++;
}

void probe_advise(probe_report *r) {
    advice_item items[PROBE_MAX_ADVICE];
    int n = 0;
    double local = 0, remote = 0;
    int n_local = 0, n_remote = 0;
    for (int k = 0; k < r->n_nodes; k++) {
        if (r->nodes[k].read_gbps > 0) local += r->nodes[k].read_gbps, n_local++;
        if (r->nodes[k].remote_read_gbps > 0) remote += r->nodes[k].remote_read_gbps, n_remote++;
    }
    local = n_local ? local / n_local : 0;
    remote = n_remote ? remote / n_remote : 0;

    if (r->n_nodes > 1) {
        /* Without placement a thread's reads are spread over all nodes: a
         * fraction (N-1)/N of them remote, at remote/local of the speed. */
        double ratio = local > 0 && remote > 0 ? remote / local : 0.5;
        double N = r->n_nodes, gain = 1 / N + (N - 1) / N / ratio;
        if (remote > 0)
            add(items, &n, gain,
                "%d NUMA nodes: use --numa-aware (each node's threads then read only their node's memory); "
                "remote reads ran at %.0f%% of local (%.1f vs %.1f GB/s), so unplaced decode could be up to %.1fx slower",
                r->n_nodes, 100 * ratio, remote, local, gain);
        else
            add(items, &n, gain, "%d NUMA nodes: use --numa-aware (each node's threads then read only their node's memory)",
                r->n_nodes);
    } else if (r->n_packages > 1) {
        add(items, &n, 1.4,
            "%d packages but 1 NUMA node: the firmware interleaves memory across the sockets, so about half of "
            "every read crosses the socket link; turn node interleaving off (NUMA on) in the BIOS, then use --numa-aware",
            r->n_packages);
    }
    if (r->channels_known) {
        const dmi_memory *m = &r->dmi;
        if (m->n_channels_populated < m->n_channels)
            add(items, &n, (double)m->n_channels / m->n_channels_populated,
                "%d of %d channels populated: bandwidth capped at %.1f GB/s (%s-%d x %d channels); populating every "
                "channel would allow %.1f GB/s",
                m->n_channels_populated, m->n_channels, m->peak_gbps, m->type[0] ? m->type : "DIMM", m->speed_mts,
                m->n_channels_populated, m->full_peak_gbps);
        double bw = r->all_read_gbps, frac = m->peak_gbps > 0 ? bw / m->peak_gbps : 0;
        if (bw > 0 && frac < 0.7) {
            char slow[96] = "";
            if (m->rated_mts > m->speed_mts)
                snprintf(slow, sizeof slow, "; the modules run at %d MT/s, rated %d", m->speed_mts, m->rated_mts);
            add(items, &n, 0.8 / frac,
                "measured bandwidth is %.0f%% of the channels' peak (%.1f of %.1f GB/s)%s: check the BIOS memory "
                "speed and that no other process is streaming memory",
                100 * frac, bw, m->peak_gbps, slow);
        } else if (bw > 0) {
            add(items, &n, 1.0, "measured bandwidth is %.0f%% of the channels' peak (%.1f of %.1f GB/s)", 100 * frac, bw,
                m->peak_gbps);
        }
    }
    if (r->smt > 1)
        add(items, &n, 1.0,
            "SMT on (%d hardware threads per core): threads = physical cores (%d, the default); more threads share "
            "load ports and add no bandwidth",
            r->smt, r->physical_cores);
    if (r->cpu_quota > 0 && r->cpu_quota < r->physical_cores)
        add(items, &n, r->physical_cores / (r->cpu_quota < 1 ? 1 : r->cpu_quota),
            "a CPU quota of %.3g CPUs (cgroup) below the %d cores: eLLM runs %d compute thread%s by default; a "
            "larger quota (docker run --cpus, CPUQuota=) lets it use every core",
            r->cpu_quota, r->physical_cores, r->default_threads, r->default_threads == 1 ? "" : "s");
    if (r->memory_limit)
        add(items, &n, 1.0,
            "a memory limit of %.2f GB (cgroup), %.2f GB of it free: weights that do not fit in that less 10%% stay "
            "in the file's layout (read from page cache), and a server's default KV pool takes at most 80%% of it",
            r->memory_limit / 1e9, r->memory_available / 1e9);
    if (!strcmp(r->thp, "never"))
        add(items, &n, 1.05,
            "transparent huge pages are off: `echo madvise > /sys/kernel/mm/transparent_hugepage/enabled` lets "
            "weights and KV use 2 MB pages (fewer TLB misses)");
    if (!r->channels_known)
        add(items, &n, 1.0, "memory channels unknown: %s", r->channels_why[0] ? r->channels_why : "no DIMM table");

    /* Biggest gain first (stable); if nothing is worth 5%, bandwidth itself is the bottleneck. */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && items[j].gain > items[j - 1].gain; j--) {
            advice_item x = items[j];
            items[j] = items[j - 1];
            items[j - 1] = x;
        }
    r->n_advice = 0;
    if (n == 0 || items[0].gain < 1.05)
        snprintf(r->advice[r->n_advice++], sizeof r->advice[0],
                 "no placement problem found: decode is bound by memory bandwidth itself (%.1f GB/s measured over %d "
                 "core%s)",
                 r->all_read_gbps, r->physical_cores, r->physical_cores == 1 ? "" : "s");
    for (int i = 0; i < n && r->n_advice < PROBE_MAX_ADVICE; i++)
        snprintf(r->advice[r->n_advice++], sizeof r->advice[0], "%s", items[i].text);
}
