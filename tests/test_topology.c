/* Topology and placement planner on hwloc synthetic topologies of machines we
 * do not have (2 sockets x 1 node, 2 sockets x 2 nodes (SNC/NPS2), 1 socket x
 * 4 nodes, SMT on and off), an XML round trip, and this machine. Checks the
 * thread -> core plan, the row -> node and KV head -> node plans and the
 * replicate fallback. */
#include "harness.h"
#include "core/cpu.h"
#include "topology/plan.h"
#include "topology/topology.h"

#include <hwloc.h>
#include <string.h>

#define GB (1ull << 30)

static topology *synth(const char *desc) {
    topology *t = NULL;
    ellm_error err = {0};
    ellm_status st = topology_init_synthetic(desc, &t, &err);
    CHECK(st == ELLM_OK && t, "synthetic '%s': %s", desc, err.msg);
    return t;
}

static topo_plan *plan(const topology *t, int n_threads, topo_numa_mode mode, uint64_t weights) {
    topo_plan_params pp = {.n_threads = n_threads, .mode = mode, .weight_bytes = weights};
    topo_plan *p = NULL;
    ellm_error err = {0};
    CHECK(topo_plan_init(t, &pp, &p, &err) == ELLM_OK && p, "plan: %s", err.msg);
    return p;
}

/* The core (index into t->cores) that runs OS CPU `cpu`, or -1. */
static int core_of(const topology *t, int cpu) {
    for (int c = 0; c < t->n_cores; c++)
        for (int j = 0; j < t->cores[c].n_pus; j++)
            if (t->cores[c].pus[j] == cpu) return c;
    return -1;
}

/* Invariants of every plan: thread count, each thread on a usable CPU of its
 * plan node, threads contiguous per node, no core shared unless there are
 * more threads than cores, rows and KV heads partitioned. */
static void check_plan_invariants(const topology *t, const topo_plan *p, int want_threads, const char *what) {
    CHECK(p->n_threads == want_threads, "%s: %d threads, want %d", what, p->n_threads, want_threads);
    CHECK(p->node_first_thread[0] == 0 && p->node_first_thread[p->n_nodes] == p->n_threads,
          "%s: node thread ranges do not cover the threads", what);
    int *uses = calloc((size_t)t->n_cores, sizeof *uses);
    for (int k = 0; k < p->n_nodes; k++) {
        CHECK(p->node_first_thread[k] < p->node_first_thread[k + 1], "%s: plan node %d has no thread", what, k);
        int ni = topology_node_index(t, p->node_os[k]);
        CHECK(ni >= 0, "%s: plan node %d is not a node", what, p->node_os[k]);
        for (int th = p->node_first_thread[k]; th < p->node_first_thread[k + 1]; th++) {
            int c = core_of(t, p->cpu[th]);
            CHECK(c >= 0, "%s: thread %d on cpu %d which is not usable", what, th, p->cpu[th]);
            if (c < 0) continue;
            CHECK(t->cores[c].node == ni, "%s: thread %d (cpu %d) is not on node %d", what, th, p->cpu[th],
                  p->node_os[k]);
            CHECK(p->thread_node[th] == k, "%s: thread_node[%d] = %d, want %d", what, th, p->thread_node[th], k);
            uses[c]++;
        }
    }
    int max_use = 0;
    for (int c = 0; c < t->n_cores; c++) max_use = uses[c] > max_use ? uses[c] : max_use;
    if (p->n_threads <= t->n_cores)
        CHECK(max_use == 1 && !p->smt_shared, "%s: a core runs %d threads with %d threads for %d cores", what,
              max_use, p->n_threads, t->n_cores);
    else
        CHECK(p->smt_shared, "%s: more threads than cores but no SMT sharing reported", what);
    free(uses);
    /* rows: the node slices tile [0, rows) in node order */
    int64_t rows = 4096 + 48, prev = 0;
    for (int k = 0; k < p->n_nodes; k++) {
        int64_t b, e;
        topo_plan_node_rows(p, rows, 16, k, &b, &e);
        CHECK(b == prev && e >= b, "%s: node %d rows [%lld, %lld) after %lld", what, k, (long long)b,
              (long long)e, (long long)prev);
        prev = e;
    }
    CHECK(prev == rows, "%s: node rows end at %lld of %lld", what, (long long)prev, (long long)rows);
}

/* Expected per-node thread counts and first CPUs. */
static void check_counts(const topo_plan *p, int n_nodes, const int *counts, const char *what) {
    CHECK(p->n_nodes == n_nodes, "%s: %d nodes in use, want %d", what, p->n_nodes, n_nodes);
    for (int k = 0; k < n_nodes && k < p->n_nodes; k++) {
        int got = p->node_first_thread[k + 1] - p->node_first_thread[k];
        CHECK(got == counts[k], "%s: node %d has %d threads, want %d", what, k, got, counts[k]);
    }
}

static void check_cpus(const topo_plan *p, const int *cpus, int n, const char *what) {
    for (int i = 0; i < n && i < p->n_threads; i++)
        CHECK(p->cpu[i] == cpus[i], "%s: thread %d on cpu %d, want %d", what, i, p->cpu[i], cpus[i]);
}

static void check_kv(const topo_plan *p, int n_kv, const int *want, const char *what) {
    for (int h = 0; h < n_kv; h++) {
        int k = topo_plan_kv_head_node(p, n_kv, h);
        CHECK(k == want[h], "%s: KV head %d of %d on plan node %d, want %d", what, h, n_kv, k, want[h]);
    }
}

static void test_two_sockets_one_node(void) {
    /* 2 packages x 1 node x 4 cores x SMT 2: cpus 0..7 on node 0 (core c has 2c, 2c+1) */
    topology *t = synth("pack:2 [numa(memory=68719476736)] l3:1(size=33554432) l2:4(size=1048576) core:1 pu:2");
    if (!t) return;
    CHECK(t->n_packages == 2 && t->n_nodes == 2 && t->n_cores == 8 && t->n_pus == 16 && t->smt == 2,
          "2x1 SMT: %d packages %d nodes %d cores %d pus smt %d", t->n_packages, t->n_nodes, t->n_cores, t->n_pus,
          t->smt);
    CHECK(t->l3_bytes == 33554432 && t->n_l3 == 2 && t->l2_bytes == 1048576, "caches: l3 %llu x%d l2 %llu",
          (unsigned long long)t->l3_bytes, t->n_l3, (unsigned long long)t->l2_bytes);
    CHECK(t->nodes[0].memory_bytes == 64 * GB && t->nodes[1].package == 1 && t->nodes[0].n_cores == 4 &&
              t->nodes[1].n_cpus == 8,
          "node attributes");
    CHECK(t->cores[0].n_pus == 2 && t->cores[0].pus[0] == 0 && t->cores[0].pus[1] == 1 && t->cores[5].node == 1,
          "core siblings");

    topo_plan *p = plan(t, 0, TOPO_NUMA_DISTRIBUTE, 0);
    check_plan_invariants(t, p, 8, "2x1 smt default");
    int c8[] = {0, 2, 4, 6, 8, 10, 12, 14};
    check_cpus(p, c8, 8, "2x1 smt default: one per core, siblings avoided");
    int n44[] = {4, 4};
    check_counts(p, 2, n44, "2x1 smt default");
    int64_t b, e;
    topo_plan_node_rows(p, 4096, 16, 1, &b, &e);
    CHECK(b == 2048 && e == 4096, "2x1: node 1 rows [%lld, %lld), want [2048, 4096)", (long long)b, (long long)e);
    int kv8[] = {0, 0, 0, 0, 1, 1, 1, 1}, kv2[] = {0, 1};
    check_kv(p, 8, kv8, "2x1 8 KV heads");
    check_kv(p, 2, kv2, "2x1 2 KV heads");
    topo_plan_free(p);

    p = plan(t, 4, TOPO_NUMA_DISTRIBUTE, 0);
    check_plan_invariants(t, p, 4, "2x1 distribute 4");
    int c4[] = {0, 2, 8, 10}, n22[] = {2, 2};
    check_cpus(p, c4, 4, "2x1 distribute 4: spread over both nodes");
    check_counts(p, 2, n22, "2x1 distribute 4");
    topo_plan_free(p);

    p = plan(t, 4, TOPO_NUMA_OFF, 0);
    check_plan_invariants(t, p, 4, "2x1 off 4");
    int o4[] = {0, 2, 4, 6}, n4[] = {4};
    check_cpus(p, o4, 4, "2x1 off 4: one node filled first");
    check_counts(p, 1, n4, "2x1 off 4");
    topo_plan_free(p);

    p = plan(t, 12, TOPO_NUMA_DISTRIBUTE, 0);
    check_plan_invariants(t, p, 12, "2x1 12 threads (SMT)");
    int c12[] = {0, 2, 4, 6, 1, 3, 8, 10, 12, 14, 9, 11}, n66[] = {6, 6};
    check_cpus(p, c12, 12, "2x1 12 threads: cores first, then siblings");
    check_counts(p, 2, n66, "2x1 12 threads");
    topo_plan_free(p);

    p = plan(t, 40, TOPO_NUMA_DISTRIBUTE, 0); /* more than the 16 hardware threads */
    check_plan_invariants(t, p, 40, "2x1 oversubscribed");
    topo_plan_free(p);

    /* replicate: 64 GB nodes hold a 16 GB copy, not a 60 GB one */
    p = plan(t, 0, TOPO_NUMA_REPLICATE, 16 * GB);
    CHECK(p->mode == TOPO_NUMA_REPLICATE && !p->note[0], "replicate 16 GB: mode %s note '%s'",
          topo_numa_mode_str(p->mode), p->note);
    topo_plan_free(p);
    p = plan(t, 0, TOPO_NUMA_REPLICATE, 60 * GB);
    CHECK(p->mode == TOPO_NUMA_DISTRIBUTE && strstr(p->note, "distributing"), "replicate 60 GB: mode %s note '%s'",
          topo_numa_mode_str(p->mode), p->note);
    topo_plan_free(p);
    topology_free(t);
}

static void test_two_sockets_smt_off(void) {
    topology *t = synth("pack:2 [numa(memory=34359738368)] core:4 pu:1");
    if (!t) return;
    CHECK(t->n_cores == 8 && t->n_pus == 8 && t->smt == 1, "2x1 no SMT: %d cores %d pus", t->n_cores, t->n_pus);
    topo_plan *p = plan(t, 0, TOPO_NUMA_DISTRIBUTE, 0);
    check_plan_invariants(t, p, 8, "2x1 no smt");
    int c8[] = {0, 1, 2, 3, 4, 5, 6, 7};
    check_cpus(p, c8, 8, "2x1 no smt");
    topo_plan_free(p);
    p = plan(t, 3, TOPO_NUMA_INTERLEAVE, 0);
    check_plan_invariants(t, p, 3, "2x1 interleave 3");
    int n21[] = {2, 1}, c3[] = {0, 1, 4};
    check_counts(p, 2, n21, "2x1 interleave 3");
    check_cpus(p, c3, 3, "2x1 interleave 3");
    topo_plan_free(p);
    p = plan(t, 10, TOPO_NUMA_OFF, 0); /* no siblings to fall back on: cores shared */
    check_plan_invariants(t, p, 10, "2x1 no smt 10 threads");
    topo_plan_free(p);
    topology_free(t);
}

static void test_snc2(void) {
    /* 2 packages x 2 sub-NUMA clusters x 4 cores x SMT 2 */
    topology *t = synth("pack:2 group:2 [numa(memory=17179869184)] core:4 pu:2");
    if (!t) return;
    CHECK(t->n_packages == 2 && t->n_nodes == 4 && t->n_cores == 16 && t->smt == 2, "SNC2: %d pkgs %d nodes %d cores",
          t->n_packages, t->n_nodes, t->n_cores);
    for (int k = 0; k < t->n_nodes; k++)
        CHECK(t->nodes[k].os_index == k && t->nodes[k].package == k / 2 && t->nodes[k].n_cores == 4,
              "SNC2 node %d: os %d package %d cores %d", k, t->nodes[k].os_index, t->nodes[k].package,
              t->nodes[k].n_cores);
    topo_plan *p = plan(t, 0, TOPO_NUMA_DISTRIBUTE, 0);
    check_plan_invariants(t, p, 16, "SNC2 default");
    int n4[] = {4, 4, 4, 4};
    check_counts(p, 4, n4, "SNC2 default");
    int kv8[] = {0, 0, 1, 1, 2, 2, 3, 3};
    check_kv(p, 8, kv8, "SNC2 8 KV heads");
    int kv4[] = {0, 1, 2, 3};
    check_kv(p, 4, kv4, "SNC2 4 KV heads");
    int64_t b, e;
    topo_plan_node_rows(p, 4096, 16, 2, &b, &e);
    CHECK(b == 2048 && e == 3072, "SNC2 node 2 rows [%lld, %lld)", (long long)b, (long long)e);
    topo_plan_free(p);
    p = plan(t, 6, TOPO_NUMA_DISTRIBUTE, 0);
    check_plan_invariants(t, p, 6, "SNC2 6 threads");
    int n2211[] = {2, 2, 1, 1};
    check_counts(p, 4, n2211, "SNC2 6 threads");
    int c6[] = {0, 2, 8, 10, 16, 24};
    check_cpus(p, c6, 6, "SNC2 6 threads");
    topo_plan_free(p);
    topology_free(t);
}

static void test_nps4(void) {
    /* 1 package x 4 nodes x 2 cores, SMT on and off */
    const char *descs[2] = {"pack:1 group:4 [numa(memory=8589934592)] core:2 pu:2",
                            "pack:1 group:4 [numa(memory=8589934592)] core:2 pu:1"};
    for (int s = 0; s < 2; s++) {
        topology *t = synth(descs[s]);
        if (!t) continue;
        CHECK(t->n_packages == 1 && t->n_nodes == 4 && t->n_cores == 8 && t->smt == 2 - s,
              "NPS4 smt %d: %d pkgs %d nodes %d cores smt %d", 1 - s, t->n_packages, t->n_nodes, t->n_cores, t->smt);
        topo_plan *p = plan(t, 0, TOPO_NUMA_DISTRIBUTE, 0);
        check_plan_invariants(t, p, 8, s ? "NPS4 no smt" : "NPS4 smt");
        int n2[] = {2, 2, 2, 2};
        check_counts(p, 4, n2, "NPS4");
        int cs[] = {0, 2, 4, 6, 8, 10, 12, 14}, cn[] = {0, 1, 2, 3, 4, 5, 6, 7};
        check_cpus(p, s ? cn : cs, 8, s ? "NPS4 no smt" : "NPS4 smt");
        int kv8[] = {0, 0, 1, 1, 2, 2, 3, 3}, kv2[] = {0, 2};
        check_kv(p, 8, kv8, "NPS4 8 KV heads");
        check_kv(p, 2, kv2, "NPS4 2 KV heads"); /* 2 heads on 4 nodes: the node holding each head's middle */
        topo_plan_free(p);
        p = plan(t, 2, TOPO_NUMA_OFF, 0);
        int n1[] = {2};
        check_counts(p, 1, n1, "NPS4 off 2 threads");
        topo_plan_free(p);
        topology_free(t);
    }
}

static void test_xml_and_errors(void) {
    topology *t = NULL;
    ellm_error err = {0};
    CHECK(topology_init_synthetic("pack:2 banana:3", &t, &err) == ELLM_ERR_FORMAT && !t && err.msg[0],
          "bad synthetic accepted");
    CHECK(topology_init_xml("<not xml", 8, &t, &err) == ELLM_ERR_FORMAT && !t, "bad XML accepted");
    topo_numa_mode m;
    CHECK(topo_numa_mode_parse("replicate", &m) && m == TOPO_NUMA_REPLICATE && !topo_numa_mode_parse("numa", &m),
          "mode parse");

    /* XML export of a synthetic SNC2 machine reads back the same */
    hwloc_topology_t ht;
    hwloc_topology_init(&ht);
    hwloc_topology_set_synthetic(ht, "pack:2 group:2 [numa(memory=17179869184)] core:4 pu:2");
    char *xml = NULL;
    int len = 0;
    int ok = hwloc_topology_load(ht) == 0 && hwloc_topology_export_xmlbuffer(ht, &xml, &len, 0) == 0;
    CHECK(ok, "hwloc XML export");
    if (ok) {
        CHECK(topology_init_xml(xml, (size_t)len - 1, &t, &err) == ELLM_OK, "XML: %s", err.msg);
        if (t) {
            CHECK(t->n_nodes == 4 && t->n_cores == 16 && t->n_pus == 32 && t->nodes[3].memory_bytes == 16 * GB,
                  "XML SNC2: %d nodes %d cores %d pus", t->n_nodes, t->n_cores, t->n_pus);
            topology_free(t);
        }
        hwloc_free_xmlbuffer(ht, xml);
    }
    hwloc_topology_destroy(ht);
}

static void test_this_machine(void) {
    topology *t = NULL;
    ellm_error err = {0};
    CHECK(topology_init_system(&t, &err) == ELLM_OK && t, "system topology: %s", err.msg);
    if (!t) return;
    CHECK(t->n_cores == ellm_cpu_physical_cores(), "hwloc sees %d usable cores, sysfs %d", t->n_cores,
          ellm_cpu_physical_cores());
    CHECK(t->n_nodes >= 1 && t->n_pus >= t->n_cores, "nodes %d pus %d", t->n_nodes, t->n_pus);
    topo_plan *p = plan(t, 0, TOPO_NUMA_OFF, 0);
    check_plan_invariants(t, p, t->n_cores, "this machine");
    for (int i = 0; i < p->n_threads; i++)
        CHECK(p->cpu[i] == ellm_cpu_core_id(i), "thread %d: plan cpu %d, sysfs first sibling %d", i, p->cpu[i],
              ellm_cpu_core_id(i));
    char buf[256];
    topology_describe(t, buf, sizeof buf);
    CHECK(strstr(buf, "cores") != NULL, "describe: %s", buf);
    topo_plan_describe(p, buf, sizeof buf);
    CHECK(strstr(buf, "numa off") != NULL, "plan describe: %s", buf);
    topo_plan_free(p);
    topology_free(t);
}

int main(void) {
    test_two_sockets_one_node();
    test_two_sockets_smt_off();
    test_snc2();
    test_nps4();
    test_xml_and_errors();
    test_this_machine();
    return test_finish();
}
