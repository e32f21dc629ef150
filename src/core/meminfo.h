/* Memory this process could still take before the kernel refuses it or its
 * container's OOM killer ends it: what sizes the server's KV pool by default
 * and decides whether weights are rewritten into private memory at load. */
#ifndef ELLM_CORE_MEMINFO_H
#define ELLM_CORE_MEMINFO_H

#include <stdint.h>

typedef struct {
    int known;             /* 1 if either figure below could be read */
    uint64_t available;    /* the smaller of the two that were read */
    uint64_t system;       /* MemAvailable of /proc/meminfo (0 if unreadable) */
    uint64_t cgroup;       /* headroom of the memory cgroup and its ancestors (meaningful when cgroup_limit) */
    uint64_t cgroup_limit; /* the smallest limit among them; 0: none set */
    int cgroup_bound;      /* 1 if available is the cgroup's headroom (a limit set, below MemAvailable) */
} ellm_meminfo;

/* Reads the system's figures. The cgroup's headroom is its limit less what
 * it holds, page cache excepted (the kernel reclaims that before it kills),
 * for cgroup v2 (memory.max, memory.current, memory.stat "file") and v1
 * (memory.limit_in_bytes, memory.usage_in_bytes, memory.stat "total_cache"),
 * the smallest over the process's cgroup and every ancestor. */
void ellm_meminfo_get(ellm_meminfo *out);
/* The same with every path read under `root` (e.g. a test's directory
 * holding proc/meminfo, proc/self/cgroup and sys/fs/cgroup/...); "" is the
 * real system. */
void ellm_meminfo_at(const char *root, ellm_meminfo *out);

#endif
