/* Topology from hwloc: the objects eLLM places work and memory on. */
#include "topology/topology.h"
#include "core/status.h"

#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Index of the node in t->nodes whose CPUs include `set`'s first CPU. */
static int node_of_cpuset(hwloc_topology_t ht, hwloc_const_cpuset_t set, const int *node_os,
                          int n_nodes) {
    for (int i = 0; i < n_nodes; i++) {
        hwloc_obj_t n = hwloc_get_numanode_obj_by_os_index(ht, (unsigned)node_os[i]);
        if (n && hwloc_bitmap_intersects(n->cpuset, set)) return i;
    }
    return -1;
}

static uint64_t first_cache_size(hwloc_topology_t ht, hwloc_obj_type_t type, int *count) {
    int n = hwloc_get_nbobjs_by_type(ht, type);
    if (count) *count = n > 0 ? n : 0;
    hwloc_obj_t o = n > 0 ? hwloc_get_obj_by_type(ht, type, 0) : NULL;
    return o && o->attr ? (uint64_t)o->attr->cache.size : 0;
}

static int package_of(hwloc_topology_t ht, hwloc_obj_t o) {
    hwloc_obj_t p = hwloc_get_ancestor_obj_by_type(ht, HWLOC_OBJ_PACKAGE, o);
    return p ? (int)p->logical_index : 0;
}

static int cmp_core_node(const void *a, const void *b) {
    const topo_core *x = a, *y = b;
    if (x->node != y->node) return x->node < y->node ? -1 : 1;
    return x->pus[0] < y->pus[0] ? -1 : x->pus[0] > y->pus[0];
}

/* Builds the eLLM view of a loaded hwloc topology, keeping only the CPUs in
 * `usable`. Returns ELLM_ERR_FORMAT if no usable CPU remains. */
static ellm_status build(hwloc_topology_t ht, hwloc_const_cpuset_t usable, topology **out,
                         ellm_error *err) {
    topology *t = calloc(1, sizeof *t);
    int n_numa = hwloc_get_nbobjs_by_type(ht, HWLOC_OBJ_NUMANODE);
    int n_core_objs = hwloc_get_nbobjs_by_type(ht, HWLOC_OBJ_CORE);
    int n_pu_objs = hwloc_get_nbobjs_by_type(ht, HWLOC_OBJ_PU);
    if (n_numa < 0) n_numa = 0;
    if (n_core_objs < 0) n_core_objs = 0;
    if (n_pu_objs < 0) n_pu_objs = 0;
    /* Without Core objects every PU stands for a core. */
    int use_pus = n_core_objs == 0;
    int n_slots = use_pus ? n_pu_objs : n_core_objs;
    int *node_os = calloc((size_t)(n_numa > 0 ? n_numa : 1), sizeof *node_os);
    if (t) t->cores = calloc((size_t)(n_slots > 0 ? n_slots : 1), sizeof *t->cores);
    if (t) t->nodes = calloc((size_t)(n_numa > 0 ? n_numa : 1), sizeof *t->nodes);
    if (!t || !node_os || !t->cores || !t->nodes) {
        free(node_os);
        topology_free(t);
        return ellm_fail(err, ELLM_ERR_NOMEM, "topology: out of memory");
    }
    /* Nodes in os_index order (hwloc's logical order already is, on Linux). */
    for (int i = 0; i < n_numa; i++) node_os[i] = (int)hwloc_get_obj_by_type(ht, HWLOC_OBJ_NUMANODE, (unsigned)i)->os_index;
    for (int i = 1; i < n_numa; i++)
        for (int j = i; j > 0 && node_os[j] < node_os[j - 1]; j--) {
            int x = node_os[j]; node_os[j] = node_os[j - 1]; node_os[j - 1] = x;
        }

    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    for (int i = 0; i < n_slots; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(ht, use_pus ? HWLOC_OBJ_PU : HWLOC_OBJ_CORE, (unsigned)i);
        hwloc_bitmap_and(set, o->cpuset, usable);
        if (hwloc_bitmap_iszero(set)) continue;
        topo_core *c = &t->cores[t->n_cores];
        int cpu;
        hwloc_bitmap_foreach_begin(cpu, set) {
            if (c->n_pus < TOPO_MAX_SMT) c->pus[c->n_pus++] = cpu;
            t->n_pus++;
        }
        hwloc_bitmap_foreach_end();
        c->package = package_of(ht, o);
        c->node = n_numa ? node_of_cpuset(ht, o->cpuset, node_os, n_numa) : 0;
        if (c->node < 0) c->node = 0;
        if (c->n_pus > t->smt) t->smt = c->n_pus;
        t->n_cores++;
    }
    hwloc_bitmap_free(set);
    if (t->n_cores == 0) {
        free(node_os);
        topology_free(t);
        return ellm_fail(err, ELLM_ERR_FORMAT, "topology: no usable CPU");
    }
    /* Keep nodes that have memory or usable cores; renumber the cores' nodes. */
    int *remap = calloc((size_t)(n_numa > 0 ? n_numa : 1), sizeof *remap);
    if (!remap) {
        free(node_os);
        topology_free(t);
        return ellm_fail(err, ELLM_ERR_NOMEM, "topology: out of memory");
    }
    if (n_numa == 0) { /* hwloc always reports one node; be safe anyway */
        t->nodes[0] = (topo_node){.os_index = 0, .package = 0};
        t->n_nodes = 1;
    }
    for (int i = 0; i < n_numa; i++) {
        hwloc_obj_t n = hwloc_get_numanode_obj_by_os_index(ht, (unsigned)node_os[i]);
        int cores = 0;
        for (int c = 0; c < t->n_cores; c++) cores += t->cores[c].node == i;
        uint64_t mem = n->attr ? n->attr->numanode.local_memory : 0;
        remap[i] = -1;
        if (!cores && !mem) continue;
        remap[i] = t->n_nodes;
        topo_node *tn = &t->nodes[t->n_nodes++];
        tn->os_index = node_os[i];
        tn->memory_bytes = mem;
        hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(ht, HWLOC_OBJ_PACKAGE, n);
        tn->package = pkg ? (int)pkg->logical_index : (hwloc_get_nbobjs_by_type(ht, HWLOC_OBJ_PACKAGE) <= 1 ? 0 : -1);
    }
    for (int c = 0; c < t->n_cores; c++) {
        topo_core *core = &t->cores[c];
        if (n_numa) core->node = remap[core->node];
        t->nodes[core->node].n_cores++;
        t->nodes[core->node].n_cpus += core->n_pus;
    }
    free(remap);
    free(node_os);
    qsort(t->cores, (size_t)t->n_cores, sizeof *t->cores, cmp_core_node);
    int n_pkg = hwloc_get_nbobjs_by_type(ht, HWLOC_OBJ_PACKAGE);
    t->n_packages = n_pkg > 0 ? n_pkg : 1;
    t->l1d_bytes = first_cache_size(ht, HWLOC_OBJ_L1CACHE, NULL);
    t->l2_bytes = first_cache_size(ht, HWLOC_OBJ_L2CACHE, NULL);
    t->l3_bytes = first_cache_size(ht, HWLOC_OBJ_L3CACHE, &t->n_l3);
    *out = t;
    return ELLM_OK;
}

typedef enum { SRC_SYSTEM, SRC_SYNTHETIC, SRC_XML } source;

static ellm_status load(source src, const char *text, size_t len, topology **out, ellm_error *err) {
    *out = NULL;
    hwloc_topology_t ht;
    if (hwloc_topology_init(&ht) != 0) return ellm_fail(err, ELLM_ERR_NOMEM, "topology: hwloc init failed");
    int rc = 0;
    char *buf = NULL;
    if (src == SRC_SYNTHETIC) {
        rc = hwloc_topology_set_synthetic(ht, text);
    } else if (src == SRC_XML) {
        /* hwloc wants the terminating NUL counted */
        if (len > (size_t)1 << 30 || !(buf = malloc(len + 1))) rc = -1;
        else {
            memcpy(buf, text, len);
            buf[len] = 0;
            rc = hwloc_topology_set_xmlbuffer(ht, buf, (int)len + 1);
        }
    }
    if (rc == 0) rc = hwloc_topology_load(ht);
    free(buf);
    if (rc != 0) {
        hwloc_topology_destroy(ht);
        return ellm_fail(err, ELLM_ERR_FORMAT, "topology: hwloc cannot read the %s",
                         src == SRC_SYNTHETIC ? "synthetic description" : src == SRC_XML ? "XML" : "machine");
    }
    hwloc_bitmap_t usable = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(ht));
    if (src == SRC_SYSTEM) {
        hwloc_bitmap_t bound = hwloc_bitmap_alloc();
        if (hwloc_get_cpubind(ht, bound, HWLOC_CPUBIND_PROCESS) == 0 && !hwloc_bitmap_iszero(bound))
            hwloc_bitmap_and(usable, usable, bound);
        hwloc_bitmap_free(bound);
    }
    ellm_status st = build(ht, usable, out, err);
    hwloc_bitmap_free(usable);
    hwloc_topology_destroy(ht);
    return st;
}

ellm_status topology_init_system(topology **out, ellm_error *err) {
    return load(SRC_SYSTEM, NULL, 0, out, err);
}

ellm_status topology_init_synthetic(const char *desc, topology **out, ellm_error *err) {
    if (!desc) return ellm_fail(err, ELLM_ERR_ARG, "topology: no synthetic description");
    return load(SRC_SYNTHETIC, desc, 0, out, err);
}

ellm_status topology_init_xml(const char *xml, size_t len, topology **out, ellm_error *err) {
    if (!xml) return ellm_fail(err, ELLM_ERR_ARG, "topology: no XML");
    return load(SRC_XML, xml, len, out, err);
}

void topology_free(topology *t) {
    if (!t) return;
    free(t->cores);
    free(t->nodes);
    free(t);
}

int topology_node_index(const topology *t, int os_index) {
    for (int i = 0; i < t->n_nodes; i++)
        if (t->nodes[i].os_index == os_index) return i;
    return -1;
}

void topology_describe(const topology *t, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%d package%s, %d NUMA node%s, %d cores, %d logical CPUs, SMT %s",
                     t->n_packages, t->n_packages == 1 ? "" : "s", t->n_nodes, t->n_nodes == 1 ? "" : "s",
                     t->n_cores, t->n_pus, t->smt > 1 ? "on" : "off");
    if (n > 0 && (size_t)n < cap && t->l3_bytes)
        snprintf(buf + n, cap - (size_t)n, ", L1d %llu KB, L2 %llu KB, L3 %d x %llu MB",
                 (unsigned long long)(t->l1d_bytes >> 10), (unsigned long long)(t->l2_bytes >> 10), t->n_l3,
                 (unsigned long long)(t->l3_bytes >> 20));
}
