/* Small file helpers shared by the converter's readers. */
#ifndef ELLM_CONVERT_FILEIO_H
#define ELLM_CONVERT_FILEIO_H

#include "ellm.h"

#include <stddef.h>

/* Reads the whole file `path` (at most `max` bytes) into a malloc'ed,
 * NUL-terminated buffer. ELLM_ERR_IO names the path when it cannot be read,
 * ELLM_ERR_FORMAT when it is larger than `max`. */
ellm_status cv_read_file(const char *path, size_t max, char **buf, size_t *len, ellm_error *err);
/* Maps the whole file `path` read-only (any size; an empty file gives
 * *data = NULL, *len = 0). ELLM_ERR_IO names the path when it cannot be
 * opened, is not a regular file or cannot be mapped. Release with
 * cv_unmap_file. */
ellm_status cv_map_file(const char *path, const void **data, size_t *len, ellm_error *err);
void cv_unmap_file(const void *data, size_t len);
/* "dir/name", malloc'ed; NULL when out of memory. */
char *cv_path_join(const char *dir, const char *name);
/* 1 if `path` names an existing regular file. */
int cv_is_file(const char *path);

#endif
