/* Safetensors reader (see safetensors.h). Each file is mapped once; the JSON
 * header is parsed with cJSON and every entry checked before anything points
 * into the data section. */
#include "convert/safetensors.h"

#include "convert/fileio.h"
#include "core/status.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A header larger than this is refused before it is parsed (real headers of
 * 100B-parameter checkpoints are a few MB). */
#define ST_MAX_HEADER ((uint64_t)100 << 20)
#define ST_MAX_FILES 4096

static const struct {
    const char *name;
    size_t size;
} st_dtypes[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4},   [ST_F16] = {"F16", 2},   [ST_BF16] = {"BF16", 2},
    [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8},   [ST_I32] = {"I32", 4},
    [ST_I16] = {"I16", 2},   [ST_I8] = {"I8", 1},     [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1}, [ST_U16] = {"U16", 2},   [ST_U32] = {"U32", 4},
    [ST_U64] = {"U64", 8},   [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(st_dtype t) { return t < ST_DTYPE_COUNT ? st_dtypes[t].name : "?"; }
size_t st_dtype_size(st_dtype t) { return t < ST_DTYPE_COUNT ? st_dtypes[t].size : 0; }

typedef struct {
    char *path;          /* for messages */
    const uint8_t *base; /* whole file */
    size_t size;
    int mapped;
} st_file;

struct st_set {
    st_file *files;
    int n_files;
    st_tensor *tensors; /* sorted by name */
    int64_t n_tensors, cap_tensors;
    uint64_t data_bytes;
};

const char *st_file_name(const st_set *s, int file) {
    return file >= 0 && file < s->n_files ? s->files[file].path : "?";
}

int64_t st_n_tensors(const st_set *s) { return s->n_tensors; }
uint64_t st_data_bytes(const st_set *s) { return s->data_bytes; }

const st_tensor *st_tensor_at(const st_set *s, int64_t i) {
    return i >= 0 && i < s->n_tensors ? &s->tensors[i] : NULL;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

const st_tensor *st_find(const st_set *s, const char *name) {
    st_tensor key = {.name = name};
    if (!s->n_tensors) return NULL; /* a header without tensors leaves s->tensors NULL */
    return bsearch(&key, s->tensors, (size_t)s->n_tensors, sizeof key, cmp_name);
}

void st_close(st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) {
        if (s->files[i].mapped) cv_unmap_file(s->files[i].base, s->files[i].size);
        free(s->files[i].path);
    }
    for (int64_t i = 0; i < s->n_tensors; i++) free((char *)s->tensors[i].name);
    free(s->files);
    free(s->tensors);
    free(s);
}

void st_release(const st_set *s, const st_tensor *t) {
    if (!t || t->file < 0 || t->file >= s->n_files || !s->files[t->file].mapped || !t->n_bytes) return;
    /* Only whole pages inside the tensor: a neighbour may share the edges. */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t b = ((uintptr_t)t->data + page - 1) & ~(page - 1);
    uintptr_t e = ((uintptr_t)t->data + t->n_bytes) & ~(page - 1);
    if (e > b) madvise((void *)b, e - b, MADV_DONTNEED);
}

void st_prefetch(const st_set *s, const st_tensor *t) {
    if (!t || t->file < 0 || t->file >= s->n_files || !s->files[t->file].mapped || !t->n_bytes) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t b = (uintptr_t)t->data & ~(page - 1);
    madvise((void *)b, (uintptr_t)t->data + t->n_bytes - b, MADV_WILLNEED);
}

/* ---- one file's header ---- */

typedef struct {
    uint64_t begin, end;
    const char *name;
} st_span;

static int cmp_span(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* A JSON number that is an integer in [0, 2^53]. */
static int as_u64(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

static ellm_status add_tensor(st_set *s, const st_tensor *t, ellm_error *err) {
    if (s->n_tensors == s->cap_tensors) {
        int64_t cap = s->cap_tensors ? 2 * s->cap_tensors : 256;
        st_tensor *p = realloc(s->tensors, (size_t)cap * sizeof *p);
        if (!p) return ellm_fail(err, ELLM_ERR_NOMEM, "safetensors: out of memory");
        s->tensors = p;
        s->cap_tensors = cap;
    }
    s->tensors[s->n_tensors] = *t;
    s->tensors[s->n_tensors].name = strdup(t->name);
    if (!s->tensors[s->n_tensors].name) return ellm_fail(err, ELLM_ERR_NOMEM, "safetensors: out of memory");
    s->n_tensors++;
    return ELLM_OK;
}

/* Parses and checks the header of file `fi` of the set and adds its tensors. */
static ellm_status parse_file(st_set *s, int fi, ellm_error *err) {
    const st_file *f = &s->files[fi];
    const char *what = f->path;
    if (f->size < 8)
        return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': %zu bytes, too short for a safetensors header length",
                         what, f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | f->base[i];
    if (hlen > f->size - 8)
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "'%s': header length %llu runs past the end of the file (%zu bytes; truncated?)", what,
                         (unsigned long long)hlen, f->size);
    if (hlen > ST_MAX_HEADER)
        return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': header length %llu is over the %llu-byte limit", what,
                         (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
    const char *json = (const char *)f->base + 8;
    const uint8_t *data = f->base + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= json && end <= json + hlen ? (size_t)(end - json) : (size_t)hlen;
        return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': malformed header JSON near byte %zu", what, at + 8);
    }
    ellm_status st = ELLM_OK;
    st_span *spans = NULL;
    int n_spans = 0;
    if (!cJSON_IsObject(root)) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': the header is not a JSON object", what);
        goto done;
    }
    int n_items = cJSON_GetArraySize(root);
    spans = malloc((size_t)(n_items ? n_items : 1) * sizeof *spans);
    if (!spans) {
        st = ellm_fail(err, ELLM_ERR_NOMEM, "safetensors: out of memory");
        goto done;
    }
    for (const cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string ? e->string : "";
        if (!strcmp(name, "__metadata__")) continue;
        if (!*name || strlen(name) > 4096) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': a tensor name is empty or too long", what);
            goto done;
        }
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs)) {
            st = ellm_fail(err, ELLM_ERR_FORMAT,
                           "'%s': tensor '%.200s' needs a string \"dtype\" and arrays \"shape\" and "
                           "\"data_offsets\"",
                           what, name);
            goto done;
        }
        st_tensor t = {.name = name, .file = fi};
        int dtype = -1;
        for (int k = 0; k < ST_DTYPE_COUNT; k++)
            if (!strcmp(dt->valuestring, st_dtypes[k].name)) dtype = k;
        if (dtype < 0) {
            st = ellm_fail(err, ELLM_ERR_UNSUPPORTED, "'%s': tensor '%.200s' has unknown dtype '%.32s'", what, name,
                           dt->valuestring);
            goto done;
        }
        t.dtype = (st_dtype)dtype;
        int nd = cJSON_GetArraySize(shape);
        if (nd > ST_MAX_DIMS) {
            st = ellm_fail(err, ELLM_ERR_UNSUPPORTED, "'%s': tensor '%.200s' has %d dimensions (at most %d)", what,
                           name, nd, ST_MAX_DIMS);
            goto done;
        }
        t.n_dims = nd;
        /* Element count, refusing overflow: each dim < 2^53 and the product
         * checked against what the file could hold. */
        uint64_t count = 1;
        int i = 0, overflow = 0;
        for (const cJSON *d = shape->child; d; d = d->next, i++) {
            uint64_t v;
            if (!as_u64(d, &v)) {
                st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': tensor '%.200s': shape[%d] is not a non-negative integer",
                               what, name, i);
                goto done;
            }
            t.shape[i] = (int64_t)v;
            if (v && count > UINT64_MAX / v) overflow = 1;
            count *= v;
        }
        uint64_t b, en;
        if (cJSON_GetArraySize(offs) != 2 || !as_u64(offs->child, &b) || !as_u64(offs->child->next, &en) || en < b) {
            st = ellm_fail(err, ELLM_ERR_FORMAT,
                           "'%s': tensor '%.200s': data_offsets is not [begin, end] with begin <= end", what, name);
            goto done;
        }
        if (en > data_size) {
            st = ellm_fail(err, ELLM_ERR_FORMAT,
                           "'%s': tensor '%.200s': data_offsets [%llu, %llu) end past the data section (%llu bytes; "
                           "truncated?)",
                           what, name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size);
            goto done;
        }
        size_t esz = st_dtypes[t.dtype].size;
        if (overflow || count > UINT64_MAX / esz || count * esz != en - b) {
            st = ellm_fail(err, ELLM_ERR_FORMAT,
                           "'%s': tensor '%.200s': shape and dtype %s give %s%llu bytes but data_offsets hold %llu",
                           what, name, st_dtypes[t.dtype].name, overflow ? "more than " : "",
                           overflow ? (unsigned long long)UINT64_MAX : (unsigned long long)(count * esz),
                           (unsigned long long)(en - b));
            goto done;
        }
        t.data = data + b;
        t.n_bytes = (size_t)(en - b);
        spans[n_spans++] = (st_span){b, en, e->string};
        if ((st = add_tensor(s, &t, err)) != ELLM_OK) goto done;
        s->data_bytes += t.n_bytes;
    }
    /* No two tensors may share bytes (empty tensors take none). */
    qsort(spans, (size_t)n_spans, sizeof *spans, cmp_span);
    uint64_t reach = 0;
    const char *reach_name = NULL;
    for (int i = 0; i < n_spans; i++) {
        if (spans[i].begin == spans[i].end) continue;
        if (spans[i].begin < reach) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': tensors '%.200s' and '%.200s' overlap", what, reach_name,
                           spans[i].name);
            goto done;
        }
        reach = spans[i].end;
        reach_name = spans[i].name;
    }
done:
    free(spans);
    cJSON_Delete(root);
    return st;
}

/* Sorts by name and refuses a name held twice (two shards, or a JSON
 * object with a repeated key). */
static ellm_status finish(st_set *s, ellm_error *err) {
    if (!s->n_tensors) return ELLM_OK; /* qsort's array may not be NULL, even when empty */
    qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, cmp_name);
    for (int64_t i = 1; i < s->n_tensors; i++)
        if (!strcmp(s->tensors[i].name, s->tensors[i - 1].name))
            return ellm_fail(err, ELLM_ERR_FORMAT, "tensor '%.200s' appears twice ('%s' and '%s')",
                             s->tensors[i].name, st_file_name(s, s->tensors[i - 1].file),
                             st_file_name(s, s->tensors[i].file));
    return ELLM_OK;
}

static st_set *set_new(int n_files) {
    st_set *s = calloc(1, sizeof *s);
    if (s) s->files = calloc((size_t)n_files, sizeof *s->files);
    if (s && !s->files) {
        free(s);
        s = NULL;
    }
    return s;
}

/* Maps `path` read-only as file `fi` of the set. */
static ellm_status map_file(st_set *s, int fi, const char *path, ellm_error *err) {
    st_file *f = &s->files[fi];
    f->path = strdup(path);
    if (!f->path) return ellm_fail(err, ELLM_ERR_NOMEM, "safetensors: out of memory");
    const void *p = NULL;
    size_t size = 0;
    ellm_status st = cv_map_file(path, &p, &size, err);
    if (st == ELLM_OK && size) {
        f->base = p;
        f->size = size;
        f->mapped = 1;
    }
    return st;
}

ellm_status st_open_memory(const void *data, size_t size, const char *what, st_set **out, ellm_error *err) {
    *out = NULL;
    st_set *s = set_new(1);
    if (!s) return ellm_fail(err, ELLM_ERR_NOMEM, "safetensors: out of memory");
    s->n_files = 1;
    s->files[0].path = strdup(what ? what : "(memory)");
    s->files[0].base = data;
    s->files[0].size = size;
    ellm_status st = s->files[0].path ? parse_file(s, 0, err) : ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    if (st == ELLM_OK) st = finish(s, err);
    if (st != ELLM_OK) {
        st_close(s);
        return st;
    }
    *out = s;
    return ELLM_OK;
}

ellm_status st_open_file(const char *path, st_set **out, ellm_error *err) {
    *out = NULL;
    st_set *s = set_new(1);
    if (!s) return ellm_fail(err, ELLM_ERR_NOMEM, "safetensors: out of memory");
    s->n_files = 1;
    ellm_status st = map_file(s, 0, path, err);
    if (st == ELLM_OK) st = parse_file(s, 0, err);
    if (st == ELLM_OK) st = finish(s, err);
    if (st != ELLM_OK) {
        st_close(s);
        return st;
    }
    *out = s;
    return ELLM_OK;
}

/* Opens the shards an index names and checks that each tensor of its
 * weight_map is in the shard it names. */
static ellm_status open_index(const char *dir, const char *index_path, st_set **out, ellm_error *err) {
    char *text = NULL;
    size_t len = 0;
    ellm_status st = cv_read_file(index_path, 64u << 20, &text, &len, err);
    if (st != ELLM_OK) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!root || !cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': %s", index_path,
                         root ? "no \"weight_map\" object" : "malformed JSON");
    }
    /* Distinct shard names, in first-seen order. */
    const char **names = calloc((size_t)cJSON_GetArraySize(map) + 1, sizeof *names);
    int n_names = 0;
    st_set *s = NULL;
    if (!names) st = ellm_fail(err, ELLM_ERR_NOMEM, "safetensors: out of memory");
    for (const cJSON *e = map->child; e && st == ELLM_OK; e = e->next) {
        const char *fn = cJSON_IsString(e) ? e->valuestring : NULL;
        if (!fn || !*fn || strchr(fn, '/') || !strcmp(fn, ".") || !strcmp(fn, "..")) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': weight_map['%.200s'] is not a file name in the same folder",
                           index_path, e->string ? e->string : "");
            break;
        }
        int k = 0;
        while (k < n_names && strcmp(names[k], fn)) k++;
        if (k == n_names) {
            if (n_names == ST_MAX_FILES) {
                st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s' names more than %d shards", index_path, ST_MAX_FILES);
                break;
            }
            names[n_names++] = fn;
        }
    }
    if (st == ELLM_OK && n_names == 0) st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': weight_map is empty", index_path);
    if (st == ELLM_OK && !(s = set_new(n_names))) st = ellm_fail(err, ELLM_ERR_NOMEM, "safetensors: out of memory");
    for (int k = 0; k < n_names && st == ELLM_OK; k++) {
        char *p = cv_path_join(dir, names[k]);
        if (!p) {
            st = ellm_fail(err, ELLM_ERR_NOMEM, "safetensors: out of memory");
            break;
        }
        s->n_files = k + 1;
        st = map_file(s, k, p, err);
        free(p);
        if (st == ELLM_OK) st = parse_file(s, k, err);
    }
    if (st == ELLM_OK) st = finish(s, err);
    for (const cJSON *e = map->child; e && st == ELLM_OK; e = e->next) {
        const st_tensor *t = st_find(s, e->string);
        if (!t || strcmp(strrchr(s->files[t->file].path, '/') + 1, e->valuestring))
            st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s' puts tensor '%.200s' in '%s', which does not hold it", index_path,
                           e->string, e->valuestring);
    }
    free(names);
    cJSON_Delete(root);
    if (st != ELLM_OK) {
        st_close(s);
        return st;
    }
    *out = s;
    return ELLM_OK;
}

ellm_status st_open_dir(const char *dir, st_set **out, ellm_error *err) {
    *out = NULL;
    char *index = cv_path_join(dir, "model.safetensors.index.json");
    char *single = cv_path_join(dir, "model.safetensors");
    ellm_status st;
    if (!index || !single)
        st = ellm_fail(err, ELLM_ERR_NOMEM, "safetensors: out of memory");
    else if (cv_is_file(index))
        st = open_index(dir, index, out, err);
    else if (cv_is_file(single))
        st = st_open_file(single, out, err);
    else
        st = ellm_fail(err, ELLM_ERR_IO, "'%s' has neither model.safetensors nor model.safetensors.index.json", dir);
    free(index);
    free(single);
    return st;
}
