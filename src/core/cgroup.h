/* The process's control groups (cgroup v1 and v2): what its container or
 * service manager allows it, read from the files the kernel exposes. Every
 * function takes `root`, a prefix for every path read ("" for the real
 * system; a test's folder holding proc/self/cgroup and sys/fs/cgroup/...). */
#ifndef ELLM_CORE_CGROUP_H
#define ELLM_CORE_CGROUP_H

#include <stdint.h>

/* Called for the folder of the process's cgroup of one controller and then
 * for each ancestor's up to the hierarchy's mount: dir is the path under
 * root, v2 says which version's files it holds. */
typedef void (*cgroup_visit_fn)(const char *root, const char *dir, int v2, void *arg);

/* Visits the cgroups of `controller` ("memory", "cpu"): the v2 hierarchy's
 * (mounted at sys/fs/cgroup, or sys/fs/cgroup/unified beside v1 ones) and the
 * v1 hierarchy that has the controller (sys/fs/cgroup/<controller>). */
void cgroup_walk(const char *root, const char *controller, cgroup_visit_fn fn, void *arg);

/* The first unsigned number in file root/path, or after `key` at a line's
 * start (e.g. memory.stat's "file 123"); v2's "max" reads as UINT64_MAX.
 * *ok = 0 when there is none. */
uint64_t cgroup_read_number(const char *root, const char *path, const char *key, int *ok);

/* CPUs of time per period the cgroups allow (v2 cpu.max, v1
 * cpu.cfs_quota_us / cpu.cfs_period_us; the smallest over the process's
 * cgroup and its ancestors), e.g. 2.5; 0 when no quota is set. */
double cgroup_cpu_quota(const char *root);

#endif
