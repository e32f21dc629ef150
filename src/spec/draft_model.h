/* Models derived from the target for drafting: a low-bit copy of its weights
 * (quant:TYPE) and its first k layers (shallow:k). Each is made once per model
 * and kind, kept with the model (model_derived) and shared by every context
 * and speculative state over it; it borrows the tokenizer, the vectors (norms,
 * biases, RoPE tables) and every matrix it does not change.
 *
 * The low-bit copy is cached on disk so that only the first load pays for
 * the requantization: beside the model when its folder is writable
 * ("<model>.<type>.ellm-draft"), else in $XDG_CACHE_HOME/ellm or
 * ~/.cache/ellm ("<model file name>-<path hash>.<type>.ellm-draft"), else it
 * is kept in memory only. A cache file records the model file's size,
 * modification time, inode and a checksum of its header and of 64 chunks
 * spread over it, plus a checksum of its own payload; a file that does not
 * match the model as it is now (or is torn) is rebuilt, never used. The
 * file is machine-local (native byte order). */
#ifndef ELLM_SPEC_DRAFT_MODEL_H
#define ELLM_SPEC_DRAFT_MODEL_H

#include "ellm.h"
#include "model/model.h"

typedef enum {
    DRAFT_CACHE_LOADED = 1, /* read from a cache file that matched the model */
    DRAFT_CACHE_SAVED,      /* requantized now and saved to a cache file */
    DRAFT_CACHE_MEMORY      /* requantized now, no writable place: memory only */
} draft_cache_state;

typedef struct {
    draft_cache_state state;
    char path[1024];     /* the cache file (LOADED, SAVED) */
    int n_requantized;   /* matrices stored at the low-bit type (the rest borrowed) */
    uint64_t draft_weight_bytes; /* bytes a draft step reads from the matrices */
    char rejected[160];  /* why an existing cache file was not used, or "" */
} draft_quant_info;

/* The base model's matrices requantized to `type` (a type with a quantizer:
 * qtype_has_quantizer): matrices whose rows would not get
 * smaller, or whose row length the type's blocks do not divide, are borrowed
 * unchanged. Made on first use and kept with `base` (thread-safe); *info
 * (may be NULL) describes where the copy came from. ELLM_ERR_ARG names an
 * unusable type; ELLM_ERR_NOMEM if the copy does not fit. */
ellm_status draft_model_quant(ellm_model *base, int type, const ellm_model **out, draft_quant_info *info,
                              ellm_error *err);

/* The base model cut to its first n_layer layers (1 <= n_layer < the base's),
 * with the linear map of `map_path` (a draft map written by ellm calibrate
 * --draft for this model and n_layer, see draft_map.h) or none (NULL). */
ellm_status draft_model_shallow(ellm_model *base, int n_layer, const char *map_path, const ellm_model **out,
                                ellm_error *err);

/* The cache files tried for a copy of the model at `model_path` in `type_name`,
 * in order (beside the model, then the user cache folder); returns how many
 * (0..2) were written to paths. Exposed for tests. */
int draft_cache_paths(const char *model_path, const char *type_name, char paths[2][1024]);

#endif
