/* Hardware probe (`ellm probe`): ISA, topology, measured read bandwidth per
 * NUMA node (local, and remote where there are several nodes) and over all
 * nodes, memory channels from the DIMM table, the transparent-huge-page mode,
 * and advice in plain words that names the bottleneck first. */
#ifndef ELLM_TOPOLOGY_PROBE_H
#define ELLM_TOPOLOGY_PROBE_H

#include "topology/dmi.h"
#include "topology/topology.h"

#define PROBE_MAX_NODES 64
#define PROBE_MAX_ADVICE 10

typedef struct {
    int os_index;
    uint64_t memory_bytes;
    int n_cores;
    int n_cpus;
    int *cpus;               /* (n_cpus) usable OS CPU ids, ascending (owned) */
    double read_gbps;        /* this node's cores reading this node's memory (0: not measured) */
    double remote_read_gbps; /* this node's cores reading the next node's memory (0: one node) */
    int remote_node;         /* the node read remotely (-1: none) */
} probe_node;

typedef struct {
    char isa[16];
    int logical_cpus;     /* CPUs in this process's affinity mask */
    int physical_cores;
    int n_packages;
    int smt;              /* hardware threads per core (1: SMT off or unused) */
    int n_nodes;
    char topology[200];   /* topology_describe: packages, nodes, cores, SMT, caches */
    probe_node nodes[PROBE_MAX_NODES];
    double all_read_gbps; /* every core reading its own node's memory at once */
    int channels_known;   /* dmi describes real channels */
    dmi_memory dmi;
    char channels_why[160]; /* why channels are unknown: unreadable, absent, virtual */
    char thp[16];         /* transparent huge pages: "always", "madvise", "never", "" unknown */
    /* what the process's cgroups allow (a container's --cpus / --memory) */
    double cpu_quota;          /* CPUs of time per period (0: no quota) */
    int default_threads;       /* compute threads eLLM runs without -t (ellm_default_threads) */
    uint64_t memory_limit;     /* the memory cgroup's limit (0: none) */
    uint64_t memory_available; /* what the process may still take (core/meminfo.h; 0: unknown) */
    int n_advice;
    char advice[PROBE_MAX_ADVICE][320];
    double elapsed_ms;
} probe_report;

/* Fills the topology fields of r from t (nodes, cores, SMT, packages). */
void probe_set_topology(probe_report *r, const topology *t);

/* Measures read bandwidth on this machine into r (per node local, remote to
 * the next node, all nodes at once), streaming `bytes` per measurement, best
 * of `reps`. Restores the calling thread's CPU affinity. */
ellm_status probe_measure(probe_report *r, const topology *t, size_t bytes, int reps, ellm_error *err);

/* The whole probe of this machine: topology, bandwidth, DIMM table (from
 * dmi_path, NULL: /sys/firmware/dmi/tables/DMI), THP mode, advice. `bytes`
 * per measurement; 0: 2x a node's L3, at least 128 MB. */
ellm_status probe_run(probe_report *r, size_t bytes, const char *dmi_path, ellm_error *err);

/* Read rate (GB/s) of every usable core at once, each reading memory placed
 * on its own node: the probe's all-node figure. Restores the caller's CPU
 * affinity; 0 on failure. */
double probe_all_read_gbps(const topology *t, size_t bytes, int reps);

/* The probe's result kept for later runs (`ellm run --stats`, `ellm bench`):
 * $ELLM_PROBE_CACHE, else $XDG_CACHE_HOME/ellm/probe.txt, else
 * ~/.cache/ellm/probe.txt. Save returns 0 on success; load returns 1 and the
 * all-node GB/s if a result for as many usable cores as now is there, with
 * its age in seconds in *age_s (-1 if the file predates the time stamp;
 * age_s may be NULL). A figure measured on a busy machine stays low until the
 * probe runs again, so callers show the age next to it. */
int probe_cache_save(const probe_report *r);
int probe_cache_load(double *all_read_gbps, double *age_s);
/* "measured 40 s ago", "measured 14 min ago", "measured 2.5 h ago" (or
 * "measured at an unknown time" for age_s < 0) into buf. */
void probe_age_text(double age_s, char *buf, size_t n);
/* The size a read-bandwidth test needs to measure memory rather than the
 * caches: twice the L3 a node's cores share, at least 128 MB, at most 1 GB;
 * and at most an eighth of the memory available (a small container: the
 * test must not be what gets the process killed), at least 4 MB. t NULL:
 * the system's topology. */
size_t probe_test_bytes(const topology *t);
/* The yardstick `ellm run --stats` and `ellm bench` compare decode with: the
 * saved probe result (*saved = 1, its age in *age_s), else the all-node read
 * rate measured now as the probe does, over `bytes` (0: probe_test_bytes),
 * best of `reps` (*saved = 0). 0 if neither is possible. */
double probe_reference_gbps(size_t bytes, int reps, int *saved, double *age_s);

/* Frees what the report owns (the nodes' CPU lists). */
void probe_report_free(probe_report *r);

/* Sets r->channels_known/dmi/channels_why from a dmi_read_memory result. */
void probe_set_channels(probe_report *r, ellm_status dmi_status, const dmi_memory *m, const char *why);

/* Writes r->advice from the other fields, the biggest expected gain first;
 * the first line names the bottleneck (or says bandwidth itself is). */
void probe_advise(probe_report *r);

#endif
