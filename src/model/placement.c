/* Weight placement on NUMA nodes (ellm_numa_mode) and the thread plan.
 *
 * The weights stay in the file mapping (zero-copy) except under replicate,
 * which copies them once per node. distribute and interleave move pages of
 * the mapping: page-cache pages are placed where they were first read, so the
 * range is read once here and then migrated with mbind(MPOL_MF_MOVE) (pages
 * another process also maps stay where they are; the result is counted).
 * With one node in use nothing is moved or copied, so every mode computes
 * exactly what the default does. ELLM_TOPOLOGY (an hwloc synthetic
 * description, or a path to an XML export) replaces this machine's topology:
 * for tests of the multi-node code paths on a one-node machine. */
#include "model/model.h"
#include "core/cpu.h"
#include "core/status.h"
#include "topology/place.h"

#define PLACE_COUNT_NODES 64

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* [lo, hi): the bytes of every weight matrix (they lie in one mapping). */
static void weight_span(const ellm_model *m, const char **lo, const char **hi) {
    const char *a = NULL, *b = NULL;
#define SPAN(mat)                                                                        \
    do {                                                                                 \
        const char *p = (const char *)(mat).data, *q = p + (size_t)(mat).rows * (mat).row_bytes; \
        if (p && (!a || p < a)) a = p;                                                   \
        if (p && (!b || q > b)) b = q;                                                   \
    } while (0)
    SPAN(m->tok_embd);
    SPAN(m->output);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const model_layer *L = &m->layers[l];
        SPAN(L->wq);
        SPAN(L->wk);
        SPAN(L->wv);
        SPAN(L->wo);
        SPAN(L->w_gate);
        SPAN(L->w_up);
        SPAN(L->w_down);
    }
#undef SPAN
    *lo = a;
    *hi = b;
}

/* The topology placement plans on: ELLM_TOPOLOGY if set, else this machine. */
static ellm_status load_topology(topology **t, ellm_error *err) {
    const char *env = getenv("ELLM_TOPOLOGY");
    if (!env || !*env) return topology_init_system(t, err);
    if (strchr(env, ':') && !strchr(env, '/')) return topology_init_synthetic(env, t, err);
    FILE *f = fopen(env, "rb");
    if (!f) return ellm_fail(err, ELLM_ERR_IO, "ELLM_TOPOLOGY: cannot open %s: %s", env, strerror(errno));
    char *buf = malloc(1 << 22);
    size_t n = buf ? fread(buf, 1, 1 << 22, f) : 0;
    fclose(f);
    if (!buf) return ellm_fail(err, ELLM_ERR_NOMEM, "ELLM_TOPOLOGY: out of memory");
    ellm_status st = topology_init_xml(buf, n, t, err);
    free(buf);
    return st;
}

/* Reads one byte per page so every page of the range is in memory (and in
 * this process's page tables, which migration needs). */
static void touch(const char *lo, const char *hi) {
    volatile char sink = 0;
    for (const char *p = lo; p < hi; p += 4096) sink ^= *p;
    (void)sink;
}

static void note(ellm_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(ellm_model *m, const char *fmt, ...) {
    size_t n = strlen(m->placement);
    if (n + 3 >= sizeof m->placement) return;
    if (n) {
        memcpy(m->placement + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->placement + n, sizeof m->placement - n, fmt, ap);
    va_end(ap);
}

/* Rows of each matrix on the node whose threads compute them. Returns the
 * number of ranges the kernel refused. */
static int distribute(ellm_model *m) {
    const topo_plan *pl = m->plan;
    int failed = 0, n = 0;
    const model_matrix **ws = malloc(((size_t)m->cfg.n_layer * 7 + 2) * sizeof *ws);
    if (!ws) return -1;
    ws[n++] = &m->output;
    if (m->tok_embd.data != m->output.data) ws[n++] = &m->tok_embd;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const model_layer *L = &m->layers[l];
        const model_matrix *lw[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) ws[n++] = lw[i];
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < pl->n_nodes; k++) {
            int64_t b, e;
            topo_plan_node_rows(pl, ws[i]->rows, 16, k, &b, &e);
            char *p = (char *)ws[i]->data + (size_t)b * ws[i]->row_bytes;
            if (e > b && place_on_node(p, (size_t)(e - b) * ws[i]->row_bytes, pl->node_os[k], PLACE_MOVE) != 0)
                failed++;
        }
    /* Check where the pages are: a few sampled pages of each node's rows of
     * every matrix (move_pages reports each page's node). */
    int on_node = 0, sampled = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < pl->n_nodes; k++) {
            int64_t b, e;
            topo_plan_node_rows(pl, ws[i]->rows, 16, k, &b, &e);
            int count[PLACE_COUNT_NODES] = {0};
            const char *p = (const char *)ws[i]->data + (size_t)b * ws[i]->row_bytes;
            int found = e > b ? place_page_nodes(p, (size_t)(e - b) * ws[i]->row_bytes, 4, count, PLACE_COUNT_NODES) : 0;
            if (found <= 0) continue;
            sampled += found;
            if (pl->node_os[k] < PLACE_COUNT_NODES) on_node += count[pl->node_os[k]];
        }
    if (sampled) note(m, "%d%% of %d sampled weight pages on the node that reads them", 100 * on_node / sampled, sampled);
    free(ws);
    return failed;
}

ellm_status model_place_weights(ellm_model *m, const ellm_model_params *params, ellm_error *err) {
    ellm_numa_mode mode = params ? params->numa : ELLM_NUMA_OFF;
    const char *lo, *hi;
    weight_span(m, &lo, &hi);
    /* 2 MB pages for the weights where the kernel can give them (read-only
     * file THP needs CONFIG_READ_ONLY_THP_FOR_FS; harmless otherwise). */
    if (lo && hi > lo) {
        uintptr_t a = ((uintptr_t)lo + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1), b = (uintptr_t)hi & ~(uintptr_t)((2u << 20) - 1);
#ifdef MADV_HUGEPAGE
        if (b > a) madvise((void *)a, b - a, MADV_HUGEPAGE);
#endif
    }
    if (mode != ELLM_NUMA_OFF) {
        topology *t = NULL;
        ellm_status st = load_topology(&t, err);
        if (st) return st;
        topo_plan_params pp = {.n_threads = params->n_threads > 0 ? params->n_threads : m->n_threads,
                               .mode = (topo_numa_mode)mode,
                               .weight_bytes = (uint64_t)(hi - lo)};
        st = topo_plan_init(t, &pp, &m->plan, err);
        topology_free(t);
        if (st) return st;
        m->n_threads = m->plan->n_threads;
        char desc[256];
        topo_plan_describe(m->plan, desc, sizeof desc);
        note(m, "%s", desc);
        if (m->plan->note[0]) note(m, "%s", m->plan->note);
        const topo_plan *pl = m->plan;
        if (pl->n_nodes > 1 && lo) {
            if (!place_numa_available()) note(m, "the kernel has no NUMA support: memory left in place");
            if (pl->mode == TOPO_NUMA_DISTRIBUTE) {
                touch(lo, hi);
                m->split_by_matrix = 1;
                int failed = distribute(m);
                if (failed) note(m, "%d row ranges could not be moved (%s)", failed, strerror(errno));
            } else if (pl->mode == TOPO_NUMA_INTERLEAVE) {
                touch(lo, hi);
                if (place_interleave((void *)lo, (size_t)(hi - lo), pl->node_os, pl->n_nodes, PLACE_MOVE) != 0)
                    note(m, "interleave refused (%s)", strerror(errno));
            } else if (pl->mode == TOPO_NUMA_REPLICATE) {
                m->replica_bytes = (size_t)(hi - lo);
                m->replicas = calloc((size_t)pl->n_nodes, sizeof *m->replicas);
                m->node_delta = calloc((size_t)pl->n_nodes, sizeof *m->node_delta);
                if (!m->replicas || !m->node_delta) return ellm_fail(err, ELLM_ERR_NOMEM, "placement: out of memory");
                int unbound = 0;
                for (int k = 0; k < pl->n_nodes; k++) {
                    void *copy = place_alloc_on_node(m->replica_bytes, pl->node_os[k]);
                    if (!copy) { /* the node refused: an unbound copy keeps the mode's code path */
                        unbound++;
                        copy = mmap(NULL, m->replica_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                        if (copy == MAP_FAILED) copy = NULL;
                    }
                    if (!copy)
                        return ellm_fail(err, ELLM_ERR_NOMEM, "replicate: cannot allocate %.2f GB for node %d",
                                         m->replica_bytes / 1e9, pl->node_os[k]);
                    m->replicas[k] = copy;
                    memcpy(copy, lo, m->replica_bytes);
                    m->node_delta[k] = (const char *)copy - lo;
                }
                if (unbound) note(m, "%d of %d copies could not be bound to their node", unbound, pl->n_nodes);
            }
        }
    } else {
        snprintf(m->placement, sizeof m->placement, "%d threads pinned one per physical core (first: cpu %d), numa off",
                 m->n_threads, ellm_cpu_core_id(0));
        if (!m->pin_threads) snprintf(m->placement, sizeof m->placement, "%d threads, not pinned", m->n_threads);
    }
    if (params && params->mlock && lo) {
        int rc = 0;
        if (m->replicas)
            for (int k = 0; k < m->plan->n_nodes && rc == 0; k++) rc = mlock(m->replicas[k], m->replica_bytes);
        else
            rc = mlock(lo, (size_t)(hi - lo));
        if (rc != 0)
            note(m, "mlock of %.2f GB failed: %s (raise `ulimit -l`)", (hi - lo) / 1e9, strerror(errno));
        else
            note(m, "weights locked in memory");
    }
    return ELLM_OK;
}

void model_placement_free(ellm_model *m) {
    for (int k = 0; m->replicas && m->plan && k < m->plan->n_nodes; k++)
        if (m->replicas[k]) munmap(m->replicas[k], m->replica_bytes);
    free(m->replicas);
    free(m->node_delta);
    topo_plan_free(m->plan);
    m->replicas = NULL;
    m->node_delta = NULL;
    m->plan = NULL;
}
