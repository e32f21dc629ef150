/* Q8_0 and Q4_0 matrices (and, where the AVX2 kernel runs, those of the other
 * types of kern_r16_type) rewritten at load into the layout the AVX2 and
 * AVX-512 kernels read (kern_r16_pack: 16 rows interleaved, the same bytes per group).
 *
 * The bytes from the first to the last such matrix are written into new
 * anonymous memory (huge pages where the kernel gives them), the matrices
 * packed on the way and everything between them copied, and that memory
 * then takes the place of the file's pages at the same addresses (mremap):
 * every pointer into the mapping stays valid. Writing into the private file
 * mapping instead would copy it page by page on write faults, ~30x slower
 * (0.65 s for a 143 MB model in a VM, mostly TLB flushes). Two threads share
 * the work, and with it the new memory's page faults (the kernel zeroing its
 * pages, about half the time): 69-93 ms for that model, 128-373 ms on one
 * thread. The weights then live in private memory, no longer in page cache
 * shared with other processes mapping the file.
 *
 * Matrices that share a launch (Q/K/V, gate/up) are packed together or not
 * at all: the engine splits their concatenated rows in 16-row units, which
 * must meet a packed matrix at a group boundary. A model opened from memory,
 * a CPU without the kernel or ellm_model_params.keep_layout keeps the file's
 * layout; so does any failure here, which leaves the mapping as it was. */
#include "model/model.h"
#include "core/cpu.h"
#include "core/meminfo.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { HUGE_PAGE = 2 << 20 };

/* One past a matrix's last byte. */
static uintptr_t end_of(const model_matrix *w) { return (uintptr_t)w->data + (size_t)w->rows * w->row_bytes; }

static int by_address(const void *x, const void *y) {
    const uintptr_t p = (uintptr_t)(*(model_matrix *const *)x)->data, q = (uintptr_t)(*(model_matrix *const *)y)->data;
    return (p > q) - (p < q);
}

/* Matrices [i0, i1) of the address-ordered list packed into dst (the copy
 * of [a, b)), with the bytes before each from the end of the one before it
 * (or a), and with `last` the bytes from the last one's end to b. */
typedef struct {
    model_matrix *const *list;
    int i0, i1;
    uintptr_t a, b;
    char *dst;
    int done, last;
} pack_part;

static void *pack_run(void *arg) {
    pack_part *t = arg;
    model_matrix *const *list = t->list;
    uintptr_t at = t->i0 ? end_of(list[t->i0 - 1]) : t->a;
    for (int i = t->i0; i < t->i1; i++) {
        const uintptr_t p = (uintptr_t)list[i]->data;
        memcpy(t->dst + (at - t->a), (const void *)at, p - at);
        t->done += kern_r16_pack(list[i]->type, t->dst + (p - t->a), list[i]->data, list[i]->rows, list[i]->cols) == 0;
        at = end_of(list[i]);
    }
    if (t->last) memcpy(t->dst + (at - t->a), (const void *)at, t->b - at);
    return NULL;
}

/* Whether len bytes of new private memory fit in what the process may still
 * take, less a margin for the KV cache and the rest (10%, at least 256 MB):
 * else the weights stay where they are, in page cache that the kernel can
 * drop, where a private copy could get the process killed (a container's
 * memory limit, a model nearly the size of RAM); why (if not NULL) says so. */
static int fits_in_memory(size_t len, char *why, size_t why_cap) {
    ellm_meminfo mi;
    ellm_meminfo_get(&mi);
    if (!mi.known) return 1;
    const double need = (double)len, avail = (double)mi.available;
    const double margin = avail / 10 > 256e6 ? avail / 10 : 256e6;
    if (need <= avail - margin) return 1;
    if (why)
        snprintf(why, why_cap,
                 "weights kept in the file's layout: interleaving them takes %.2f GB of private memory and %.2f GB "
                 "is available%s",
                 need / 1e9, avail / 1e9, mi.cgroup_bound ? " (memory cgroup limit)" : "");
    return 0;
}

/* Packs the n address-ordered, disjoint matrices of list into new memory
 * that replaces the pages they lie in; 0 when anything fails or the memory
 * does not fit (fits_in_memory; the mapping is then as it was). */
static int pack_all(model_matrix *const *list, int n, char *why, size_t why_cap) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = (uintptr_t)list[0]->data & ~(page - 1), b = (end_of(list[n - 1]) + page - 1) & ~(page - 1);
    const size_t len = b - a;
    if (!fits_in_memory(len, why, why_cap)) return 0;
    /* new memory at the same offset modulo 2 MB as [a, b), so that its huge
     * pages stay whole when moved there */
    char *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return 0;
    char *dst = raw + ((a - (uintptr_t)raw) & (HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
    madvise(dst, len, MADV_HUGEPAGE);
#endif
    /* the matrices packed, the bytes between them copied: about the first
     * half of the bytes here, the rest on a second thread (the new memory's
     * page faults, half the time, run on both) */
    const size_t half = (end_of(list[n - 1]) - (uintptr_t)list[0]->data) / 2;
    int h = 0;
    while (h < n && end_of(list[h]) - (uintptr_t)list[0]->data <= half) h++;
    pack_part parts[2] = {{list, 0, h, a, b, dst, 0, 0}, {list, h, n, a, b, dst, 0, 1}};
    pthread_t th;
    const int threaded = h < n && pthread_create(&th, NULL, pack_run, &parts[1]) == 0;
    pack_run(&parts[0]);
    if (threaded) pthread_join(th, NULL);
    else pack_run(&parts[1]);
    if (parts[0].done + parts[1].done < n || mremap(dst, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)a) == MAP_FAILED) {
        munmap(raw, len + HUGE_PAGE);
        return 0;
    }
    /* the rest of the scratch mapping, on both sides of what moved */
    if (dst > raw) munmap(raw, (size_t)(dst - raw));
    if (raw + len + HUGE_PAGE > dst + len) munmap(dst + len, (size_t)(raw + len + HUGE_PAGE - (dst + len)));
    mprotect((void *)a, len, PROT_READ);
    return 1;
}

int model_pack_r16(model_matrix **list, int n, char *why, size_t why_cap) {
    if (n <= 0 || !kern_r16_fast()) return 0;
    /* in address order; a matrix bound twice (or overlapping another): nothing is packed */
    qsort(list, (size_t)n, sizeof *list, by_address);
    for (int i = 1; i < n; i++)
        if ((uintptr_t)list[i]->data < end_of(list[i - 1])) return 0;
    if (!pack_all(list, n, why, why_cap)) return 0;
    for (int i = 0; i < n; i++) list[i]->layout = MODEL_LAYOUT_R16;
    return n;
}

/* Adds to list those of w[0 .. n) (one launch's matrices) that can be
 * packed and pass `take`, if every matrix of the launch has whole groups of
 * 16 rows (the engine splits the launch's concatenated rows in 16-row
 * units, which must meet each packed matrix at a group boundary). A launch
 * may mix layouts: Q4_K_M files have Q4_K attn_q and attn_k beside a Q6_K
 * attn_v. */
static void take_launch(model_matrix *const *w, int n, int (*take)(const model_matrix *, void *), void *arg,
                        model_matrix **list, int *count) {
    for (int i = 0; i < n; i++)
        if (!w[i]->data || w[i]->rows % 16) return;
    for (int i = 0; i < n; i++)
        if (kern_r16_packs(w[i]->type) && w[i]->layout == MODEL_LAYOUT_ROWS && (!take || take(w[i], arg)))
            list[(*count)++] = w[i];
}

int model_r16_candidates(ellm_model *m, int (*take)(const model_matrix *w, void *arg), void *arg,
                         model_matrix **list) {
    int n = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        model_layer *L = &m->layers[l];
        model_matrix *qkv[3] = {&L->wq, &L->wk, &L->wv}, *gu[2] = {&L->w_gate, &L->w_up};
        model_matrix *o[1] = {&L->wo}, *down[1] = {&L->w_down};
        take_launch(qkv, 3, take, arg, list, &n);
        take_launch(o, 1, take, arg, list, &n);
        take_launch(gu, 2, take, arg, list, &n);
        take_launch(down, 1, take, arg, list, &n);
    }
    model_matrix *out[1] = {&m->output};
    take_launch(out, 1, take, arg, list, &n);
    return n;
}

void model_repack_weights(ellm_model *m, const ellm_model_params *params) {
    m->keep_layout = params && params->keep_layout;
    if (m->keep_layout || !gguf_is_mapped(m->file) || !kern_r16_fast()) return;
    model_matrix **list = malloc(((size_t)m->cfg.n_layer * 7 + 1) * sizeof *list);
    if (!list) return;
    const int n = model_r16_candidates(m, NULL, NULL, list);
    const uint64_t hash = n ? model_file_hash(m->file) : 0; /* the file's bytes, before they change */
    if (model_pack_r16(list, n, m->repack_note, sizeof m->repack_note)) {
        /* the same matrix under another name: tied embeddings (the lookups read the packed bytes) */
        if (m->tok_embd.data == m->output.data) m->tok_embd.layout = m->output.layout;
        m->n_repacked = n;
        m->repacked_hash = hash;
    }
    free(list);
}

void model_matrix_row(const model_matrix *w, int64_t r, float *dst) {
    if (w->layout == MODEL_LAYOUT_R16) kern_r16_row(w->type, w->data, w->cols, r, dst);
    else kern_dequantize(w->type, (const char *)w->data + (size_t)r * w->row_bytes, dst, w->cols);
}
