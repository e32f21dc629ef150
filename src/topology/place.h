/* Memory placement on NUMA nodes through the kernel's mbind/move_pages
 * (libnuma). Every call is best effort: on a kernel without NUMA support it
 * does nothing and says so, and a placement that fails leaves the memory
 * where it was (still correct, only slower). Addresses are rounded to pages:
 * a range starts at the page holding `addr` and ends before the page holding
 * addr + len, so consecutive ranges tile without overlap. */
#ifndef ELLM_TOPOLOGY_PLACE_H
#define ELLM_TOPOLOGY_PLACE_H

#include <stddef.h>

/* 1 if the kernel supports NUMA placement calls. */
int place_numa_available(void);

enum {
    PLACE_STRICT = 1, /* bind: allocation fails rather than fall back to another node */
    PLACE_MOVE = 2    /* also migrate pages already present (not shared with other processes) */
};

/* Puts [addr, addr + len) on node `node` (kernel number): preferred, or bound
 * with PLACE_STRICT. Returns 0 on success, -1 (errno set) otherwise. */
int place_on_node(void *addr, size_t len, int node, int flags);
/* Spreads the range's pages round-robin over nodes[0..n). */
int place_interleave(void *addr, size_t len, const int *nodes, int n, int flags);

/* Anonymous memory of `bytes` (rounded up to pages) bound to `node`,
 * untouched; NULL on failure. Free with place_free. */
void *place_alloc_on_node(size_t bytes, int node);
void place_free(void *p, size_t bytes);

/* Samples up to max_samples pages of the range evenly and counts, per kernel
 * node 0..max_node-1, the present pages found there (count_by_node[node]).
 * Returns the pages sampled that are present, or -1 if the kernel cannot say. */
int place_page_nodes(const void *addr, size_t len, int max_samples, int *count_by_node, int max_node);

#endif
