/* Small file helpers shared by the converter's readers. */
#include "convert/fileio.h"

#include "core/status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

ellm_status cv_read_file(const char *path, size_t max, char **buf, size_t *len, ellm_error *err) {
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return ellm_fail(err, ELLM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    ellm_status st = ELLM_OK;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0)
        st = ellm_fail(err, ELLM_ERR_IO, "cannot read '%s': not a regular file", path);
    else if ((size_t)n > max)
        st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s' is %ld bytes (at most %zu allowed)", path, n, max);
    else if (!(*buf = malloc((size_t)n + 1)))
        st = ellm_fail(err, ELLM_ERR_NOMEM, "out of memory reading '%s'", path);
    else if (fread(*buf, 1, (size_t)n, f) != (size_t)n)
        st = ellm_fail(err, ELLM_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
    else {
        (*buf)[n] = 0;
        *len = (size_t)n;
    }
    fclose(f);
    if (st != ELLM_OK) {
        free(*buf);
        *buf = NULL;
    }
    return st;
}

ellm_status cv_map_file(const char *path, const void **data, size_t *len, ellm_error *err) {
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ellm_fail(err, ELLM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    ellm_status st = ELLM_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = ellm_fail(err, ELLM_ERR_IO, "cannot read '%s': not a regular file", path);
    } else if (sb.st_size > 0) {
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            st = ellm_fail(err, ELLM_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
        } else {
            madvise(m, (size_t)sb.st_size, MADV_SEQUENTIAL);
            *data = m;
            *len = (size_t)sb.st_size;
        }
    }
    close(fd);
    return st;
}

void cv_unmap_file(const void *data, size_t len) {
    if (data && len) munmap((void *)data, len);
}

char *cv_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

int cv_is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}
