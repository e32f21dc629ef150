/* Status names and error-message helpers. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>

const char *ellm_status_str(ellm_status status) {
    switch (status) {
    case ELLM_OK: return "ok";
    case ELLM_ERR_IO: return "i/o error";
    case ELLM_ERR_FORMAT: return "malformed input";
    case ELLM_ERR_UNSUPPORTED: return "unsupported";
    case ELLM_ERR_NOMEM: return "out of memory";
    case ELLM_ERR_ARG: return "invalid argument";
    case ELLM_ERR_CONTEXT_FULL: return "context full";
    }
    return "unknown status";
}

ellm_status ellm_fail(ellm_error *err, ellm_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

#include <stdlib.h>
void ellm_assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "eLLM: %s:%d: assertion failed: %s\n", file, line, expr);
    abort();
}
