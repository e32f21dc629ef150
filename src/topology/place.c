/* NUMA memory placement with mbind/move_pages. */
#include "topology/place.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PLACE_MAX_NODES 1024

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

int place_numa_available(void) { return numa_available() >= 0; }

/* [addr, addr + len) rounded down at both ends to pages; 0 if empty. */
static size_t page_range(void *addr, size_t len, void **start) {
    uintptr_t ps = page_size(), a = (uintptr_t)addr & ~(ps - 1), e = ((uintptr_t)addr + len) & ~(ps - 1);
    *start = (void *)a;
    return e > a ? (size_t)(e - a) : 0;
}

static int do_mbind(void *addr, size_t len, int mode, const int *nodes, int n, int flags) {
    if (!place_numa_available()) {
        errno = ENOSYS;
        return -1;
    }
    unsigned long mask[PLACE_MAX_NODES / (8 * sizeof(unsigned long))];
    memset(mask, 0, sizeof mask);
    for (int i = 0; i < n; i++) {
        if (nodes[i] < 0 || nodes[i] >= PLACE_MAX_NODES) {
            errno = EINVAL;
            return -1;
        }
        mask[nodes[i] / (8 * sizeof(unsigned long))] |= 1ul << (nodes[i] % (8 * sizeof(unsigned long)));
    }
    void *start;
    size_t bytes = page_range(addr, len, &start);
    if (!bytes) return 0;
    unsigned mflags = (flags & PLACE_MOVE) ? MPOL_MF_MOVE : 0;
    return (int)mbind(start, bytes, mode, mask, PLACE_MAX_NODES + 1, mflags);
}

int place_on_node(void *addr, size_t len, int node, int flags) {
    return do_mbind(addr, len, (flags & PLACE_STRICT) ? MPOL_BIND : MPOL_PREFERRED, &node, 1, flags);
}

int place_interleave(void *addr, size_t len, const int *nodes, int n, int flags) {
    return do_mbind(addr, len, MPOL_INTERLEAVE, nodes, n, flags);
}

void *place_alloc_on_node(size_t bytes, int node) {
    size_t ps = page_size();
    bytes = (bytes + ps - 1) & ~(ps - 1);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    if (place_numa_available() && place_on_node(p, bytes, node, PLACE_STRICT) != 0) {
        munmap(p, bytes);
        return NULL;
    }
    return p;
}

void place_free(void *p, size_t bytes) {
    if (!p) return;
    size_t ps = page_size();
    munmap(p, (bytes + ps - 1) & ~(ps - 1));
}

int place_page_nodes(const void *addr, size_t len, int max_samples, int *count_by_node, int max_node) {
    if (!place_numa_available() || max_samples <= 0) return -1;
    void *start;
    size_t bytes = page_range((void *)addr, len, &start), ps = page_size();
    size_t n_pages = bytes / ps;
    if (!n_pages) return 0;
    size_t n = n_pages < (size_t)max_samples ? n_pages : (size_t)max_samples;
    void **pages = malloc(n * sizeof *pages);
    int *status = malloc(n * sizeof *status);
    if (!pages || !status) {
        free(pages);
        free(status);
        return -1;
    }
    for (size_t i = 0; i < n; i++) pages[i] = (char *)start + (i * n_pages / n) * ps;
    int found = -1;
    if (move_pages(0, (unsigned long)n, pages, NULL, status, 0) == 0) {
        found = 0;
        for (size_t i = 0; i < n; i++)
            if (status[i] >= 0) {
                found++;
                if (status[i] < max_node) count_by_node[status[i]]++;
            }
    }
    free(pages);
    free(status);
    return found;
}
