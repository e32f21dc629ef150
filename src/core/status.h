/* Internal status helpers shared by every module. */
#ifndef ELLM_CORE_STATUS_H
#define ELLM_CORE_STATUS_H

#include "ellm.h"

/* Fills `err` (which may be NULL) with a printf-style message and returns
 * `status`, so that error paths read `return ellm_fail(err, ELLM_ERR_X, ...)`. */
ellm_status ellm_fail(ellm_error *err, ellm_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Broken invariants (programmer errors) only; never for bad input. */
#define ELLM_ASSERT(x)                                                              \
    do {                                                                            \
        if (!(x)) {                                                                 \
            ellm_assert_fail(__FILE__, __LINE__, #x);                               \
        }                                                                           \
    } while (0)
void ellm_assert_fail(const char *file, int line, const char *expr) __attribute__((noreturn));

#endif
