/* Machine topology: packages (sockets), NUMA nodes and their memory, physical
 * cores and their SMT siblings, cache sizes.
 *
 * Read from hwloc, for this machine (restricted to the CPUs this process may
 * run on) or from an hwloc synthetic description / XML export, so placement
 * can be planned and tested for machines we do not have. This is a low layer:
 * it depends only on core/ and hwloc; the engine and the CLI use it. */
#ifndef ELLM_TOPOLOGY_TOPOLOGY_H
#define ELLM_TOPOLOGY_TOPOLOGY_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

#define TOPO_MAX_SMT 8 /* hardware threads per core kept (SMT-8 is the most shipped) */

typedef struct {
    int package;           /* index of its package, 0..n_packages-1 */
    int node;              /* index into topology.nodes of its local NUMA node */
    int n_pus;             /* hardware threads of the core this process may use */
    int pus[TOPO_MAX_SMT]; /* their OS CPU ids, ascending; pus[0] is the one to pin */
} topo_core;

typedef struct {
    int os_index;          /* the kernel's node number (for mbind, /sys paths) */
    int package;           /* package holding it, or -1 if it spans several */
    uint64_t memory_bytes; /* local memory (0 for a node without memory) */
    int n_cores;           /* usable cores whose local node this is */
    int n_cpus;            /* usable logical CPUs whose local node this is */
} topo_node;

typedef struct {
    int n_packages;
    int n_nodes;         /* NUMA nodes with memory or with usable cores */
    int n_cores;         /* usable physical cores (>= 1) */
    int n_pus;           /* usable logical CPUs */
    int smt;             /* most hardware threads on one usable core */
    topo_core *cores;    /* (n_cores) ordered by node, then hwloc's logical order */
    topo_node *nodes;    /* (n_nodes) ordered by os_index */
    uint64_t l1d_bytes;  /* size of one L1 data cache (0: unknown) */
    uint64_t l2_bytes;   /* size of one L2 */
    uint64_t l3_bytes;   /* size of one L3 */
    int n_l3;            /* L3 instances */
} topology;

/* This machine, as hwloc sees it, restricted to the CPUs in this process's
 * affinity mask (the mask numactl/taskset set). */
ellm_status topology_init_system(topology **out, ellm_error *err);

/* An hwloc synthetic description, e.g.
 * "pack:2 [numa(memory=68719476736)] l3:1(size=33554432) core:8 pu:2"
 * (every CPU usable). Bad descriptions give ELLM_ERR_FORMAT. */
ellm_status topology_init_synthetic(const char *desc, topology **out, ellm_error *err);

/* An hwloc XML export (`lstopo --of xml`) of `len` bytes. */
ellm_status topology_init_xml(const char *xml, size_t len, topology **out, ellm_error *err);

void topology_free(topology *t);

/* Index into t->nodes of the node with kernel number os_index, or -1. */
int topology_node_index(const topology *t, int os_index);

/* One-line summary: "2 packages, 4 NUMA nodes, 32 cores, 64 logical CPUs, SMT on,
 * L1d 48 KB, L2 2048 KB, L3 2 x 32 MB". */
void topology_describe(const topology *t, char *buf, size_t cap);

#endif
