/* Placement planner: which core each compute thread runs on, which NUMA node
 * holds which rows of each weight matrix and which KV heads.
 *
 * Threads are numbered node by node (the threads of plan node k are
 * [node_first_thread[k], node_first_thread[k + 1])), one per physical core,
 * pinned to the core's first hardware thread; SMT siblings are used only when
 * more threads are asked for than there are cores. Because the engine splits
 * rows and KV units into contiguous ranges by thread index, each node's
 * threads then own a contiguous slice of every matrix and a contiguous run of
 * KV heads, and placement puts exactly those bytes on that node.
 *
 * Modes (`ellm run --numa MODE`):
 *   off         threads pinned, memory left to the kernel (first touch);
 *   distribute  each matrix's rows split across nodes, node k's slice on node k,
 *               read only by node k's threads; KV heads on the node whose
 *               threads attend to them;
 *   replicate   a full copy of the weights on every node, each thread reading
 *               its own node's copy (falls back to distribute when a node's
 *               memory cannot hold a copy); KV as distribute;
 *   interleave  weights and KV pages spread round-robin over the nodes (a
 *               baseline: half of every read is remote on 2 nodes). */
#ifndef ELLM_TOPOLOGY_PLAN_H
#define ELLM_TOPOLOGY_PLAN_H

#include "topology/topology.h"

typedef enum {
    TOPO_NUMA_OFF = 0,
    TOPO_NUMA_DISTRIBUTE,
    TOPO_NUMA_REPLICATE,
    TOPO_NUMA_INTERLEAVE
} topo_numa_mode;

/* "off", "distribute", "replicate", "interleave". */
const char *topo_numa_mode_str(topo_numa_mode mode);
/* Parses a mode name; returns 0 if `s` names none. */
int topo_numa_mode_parse(const char *s, topo_numa_mode *mode);

typedef struct {
    int n_threads;       /* <= 0: one per physical core of the nodes in use */
    topo_numa_mode mode;
    uint64_t weight_bytes; /* size of one copy of the weights (replicate's check) */
} topo_plan_params;

typedef struct {
    topo_numa_mode mode;     /* the mode planned (replicate may become distribute) */
    int n_threads;
    int *cpu;                /* (n_threads) OS CPU id thread i is pinned to */
    int *thread_node;        /* (n_threads) plan node of thread i */
    int n_nodes;             /* nodes with threads */
    int *node_os;            /* (n_nodes) kernel node number of plan node k */
    int *node_first_thread;  /* (n_nodes + 1) */
    int smt_shared;          /* 1: some core runs two threads (more threads than cores) */
    char note[160];          /* why the plan differs from the request, or "" */
} topo_plan;

/* Plans `p` on `t`. Default threads: every usable physical core. With a mode
 * other than off, threads are spread evenly over the nodes (so every node's
 * memory bandwidth is used); with off, they fill node 0's cores first. */
ellm_status topo_plan_init(const topology *t, const topo_plan_params *p, topo_plan **out, ellm_error *err);
void topo_plan_free(topo_plan *plan);

/* Splits [0, n) into nth contiguous parts rounded to multiples of `align`
 * (the engine's split, threadpool_split): part ith into [*b, *e). */
void topo_split(int64_t n, int ith, int nth, int64_t align, int64_t *b, int64_t *e);

/* Rows [*b, *e) of a `rows`-row matrix that plan node k's threads compute when
 * each thread takes its topo_split part (align rows per unit): the rows to
 * place on node k under distribute. */
void topo_plan_node_rows(const topo_plan *plan, int64_t rows, int64_t align, int k, int64_t *b, int64_t *e);

/* Plan node whose threads attend to KV head h of n_kv_head, when the units of
 * all heads (equal per head) are cut into contiguous per-thread ranges: the
 * node owning the head's middle unit (the lower node on a tie). */
int topo_plan_kv_head_node(const topo_plan *plan, int n_kv_head, int h);

/* One line: "4 threads on 2 nodes (0: cpus 0,1; 1: cpus 8,9), distribute". */
void topo_plan_describe(const topo_plan *plan, char *buf, size_t cap);

#endif
