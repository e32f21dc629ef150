/* Placement planner: threads to cores, rows and KV heads to nodes. */
#include "topology/plan.h"
#include "core/status.h"
#include "core/threadpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *topo_numa_mode_str(topo_numa_mode mode) {
    switch (mode) {
    case TOPO_NUMA_OFF: return "off";
    case TOPO_NUMA_DISTRIBUTE: return "distribute";
    case TOPO_NUMA_REPLICATE: return "replicate";
    case TOPO_NUMA_INTERLEAVE: return "interleave";
    }
    return "?";
}

int topo_numa_mode_parse(const char *s, topo_numa_mode *mode) {
    static const topo_numa_mode all[] = {TOPO_NUMA_OFF, TOPO_NUMA_DISTRIBUTE, TOPO_NUMA_REPLICATE,
                                         TOPO_NUMA_INTERLEAVE};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (s && !strcmp(s, topo_numa_mode_str(all[i]))) {
            *mode = all[i];
            return 1;
        }
    return 0;
}

void topo_split(int64_t n, int ith, int nth, int64_t align, int64_t *b, int64_t *e) {
    long lb, le;
    threadpool_split((long)n, ith, nth, (long)align, &lb, &le);
    *b = lb;
    *e = le;
}

void topo_plan_free(topo_plan *plan) {
    if (!plan) return;
    free(plan->cpu);
    free(plan->thread_node);
    free(plan->node_os);
    free(plan->node_first_thread);
    free(plan);
}

ellm_status topo_plan_init(const topology *t, const topo_plan_params *p, topo_plan **out, ellm_error *err) {
    *out = NULL;
    if (!t || !p) return ellm_fail(err, ELLM_ERR_ARG, "plan: no topology or parameters");
    if (p->n_threads > 4096) return ellm_fail(err, ELLM_ERR_ARG, "plan: %d threads is too many", p->n_threads);
    const int nn = t->n_nodes;
    int n = p->n_threads > 0 ? p->n_threads : t->n_cores;
    topo_plan *plan = calloc(1, sizeof *plan);
    int *count = calloc((size_t)nn, sizeof *count), *cap = calloc((size_t)nn, sizeof *cap);
    int *first_core = calloc((size_t)nn + 1, sizeof *first_core);
    if (plan) {
        plan->cpu = calloc((size_t)n, sizeof *plan->cpu);
        plan->thread_node = calloc((size_t)n, sizeof *plan->thread_node);
        plan->node_os = calloc((size_t)nn, sizeof *plan->node_os);
        plan->node_first_thread = calloc((size_t)nn + 1, sizeof *plan->node_first_thread);
    }
    if (!plan || !count || !cap || !first_core || !plan->cpu || !plan->thread_node || !plan->node_os ||
        !plan->node_first_thread) {
        free(count);
        free(cap);
        free(first_core);
        topo_plan_free(plan);
        return ellm_fail(err, ELLM_ERR_NOMEM, "plan: out of memory");
    }
    plan->mode = p->mode;
    plan->n_threads = n;
    /* Cores are sorted by node: node k's cores are [first_core[k], first_core[k + 1]). */
    for (int c = 0; c < t->n_cores; c++) first_core[t->cores[c].node + 1]++;
    for (int k = 0; k < nn; k++) first_core[k + 1] += first_core[k];
    for (int k = 0; k < nn; k++) cap[k] = t->nodes[k].n_cores;

    /* How many threads per node: one per core first (round-robin over nodes
     * when placing memory, node after node otherwise), then SMT siblings the
     * same way, then (oversubscribed) round-robin without limit. */
    int left = n;
    for (int pass = 0; left > 0; pass++) {
        int progress = 0;
        if (pass > 0) /* second pass: a second hardware thread per core */
            for (int k = 0; k < nn; k++) {
                int extra = 0;
                for (int c = first_core[k]; c < first_core[k + 1]; c++)
                    if (t->cores[c].n_pus > pass) extra++;
                cap[k] += extra;
            }
        if (pass > TOPO_MAX_SMT) /* more threads than hardware threads */
            for (int k = 0; k < nn; k++) cap[k] = t->nodes[k].n_cores ? 1 << 30 : 0;
        if (p->mode == TOPO_NUMA_OFF) {
            for (int k = 0; k < nn && left > 0; k++)
                while (count[k] < cap[k] && left > 0) {
                    count[k]++;
                    left--;
                    progress = 1;
                }
        } else {
            do {
                progress = 0;
                for (int k = 0; k < nn && left > 0; k++)
                    if (count[k] < cap[k]) {
                        count[k]++;
                        left--;
                        progress = 1;
                    }
            } while (progress && left > 0);
        }
        (void)progress;
    }
    /* Threads node by node; within a node, first hardware threads of its cores,
     * then second ones, ... */
    int th = 0;
    for (int k = 0; k < nn; k++) {
        if (!count[k]) continue;
        int pk = plan->n_nodes++;
        plan->node_os[pk] = t->nodes[k].os_index;
        plan->node_first_thread[pk] = th;
        int ncores = first_core[k + 1] - first_core[k];
        for (int j = 0; j < count[k]; j++) {
            int slot = j % (ncores * TOPO_MAX_SMT);
            int level = slot / ncores, core = first_core[k] + slot % ncores;
            /* a core with fewer hardware threads than `level`: wrap onto its first */
            const topo_core *c = &t->cores[core];
            plan->cpu[th] = c->pus[level < c->n_pus ? level : level % c->n_pus];
            plan->thread_node[th] = pk;
            if (level > 0) plan->smt_shared = 1;
            th++;
        }
    }
    plan->node_first_thread[plan->n_nodes] = th;
    free(count);
    free(cap);
    free(first_core);

    if (plan->mode == TOPO_NUMA_REPLICATE) {
        for (int k = 0; k < plan->n_nodes; k++) {
            const topo_node *node = &t->nodes[topology_node_index(t, plan->node_os[k])];
            /* a copy must leave room for the KV cache and the rest: 10% and 1 GB spare */
            uint64_t need = p->weight_bytes + p->weight_bytes / 10 + (1ull << 30);
            if (node->memory_bytes && node->memory_bytes < need) {
                plan->mode = TOPO_NUMA_DISTRIBUTE;
                snprintf(plan->note, sizeof plan->note,
                         "replicate: node %d has %.1f GB, a copy of the weights needs %.1f GB; distributing instead",
                         node->os_index, node->memory_bytes / 1e9, need / 1e9);
                break;
            }
        }
    }
    if (plan->mode != TOPO_NUMA_OFF && plan->n_nodes == 1 && !plan->note[0])
        snprintf(plan->note, sizeof plan->note, "one NUMA node in use: %s places nothing",
                 topo_numa_mode_str(plan->mode));
    *out = plan;
    return ELLM_OK;
}

void topo_plan_node_rows(const topo_plan *plan, int64_t rows, int64_t align, int k, int64_t *b, int64_t *e) {
    int64_t b0, e0, b1, e1;
    topo_split(rows, plan->node_first_thread[k], plan->n_threads, align, &b0, &e0);
    topo_split(rows, plan->node_first_thread[k + 1] - 1, plan->n_threads, align, &b1, &e1);
    *b = b0;
    *e = e1;
}

int topo_plan_kv_head_node(const topo_plan *plan, int n_kv_head, int h) {
    const int64_t per_head = 1 << 20; /* units per head: any large equal count */
    const int64_t total = (int64_t)n_kv_head * per_head, mid = (int64_t)h * per_head + (per_head - 1) / 2;
    for (int t = 0; t < plan->n_threads; t++) {
        int64_t b, e;
        topo_split(total, t, plan->n_threads, 1, &b, &e);
        if (mid >= b && mid < e) return plan->thread_node[t];
    }
    return 0;
}

void topo_plan_describe(const topo_plan *plan, char *buf, size_t cap) {
    size_t n = 0;
#define PUT(...)                                                                     \
    do {                                                                             \
        int w = snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__);               \
        if (w > 0) n += (size_t)w;                                                   \
    } while (0)
    if (!cap) return;
    buf[0] = 0;
    PUT("%d thread%s on %d node%s (", plan->n_threads, plan->n_threads == 1 ? "" : "s", plan->n_nodes,
        plan->n_nodes == 1 ? "" : "s");
    for (int k = 0; k < plan->n_nodes; k++) {
        PUT("%snode %d: cpus", k ? "; " : "", plan->node_os[k]);
        for (int t = plan->node_first_thread[k]; t < plan->node_first_thread[k + 1]; t++)
            PUT("%s%d", t == plan->node_first_thread[k] ? " " : ",", plan->cpu[t]);
    }
    PUT("), numa %s%s", topo_numa_mode_str(plan->mode), plan->smt_shared ? ", SMT siblings shared" : "");
#undef PUT
    if (n >= cap) buf[cap - 1] = 0;
}
