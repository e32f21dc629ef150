/* Monotonic time in milliseconds / nanoseconds. */
#ifndef ELLM_CORE_TIMER_H
#define ELLM_CORE_TIMER_H
#include <stdint.h>
#include <time.h>

static inline uint64_t ellm_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline double ellm_time_ms(void) { return (double)ellm_time_ns() / 1e6; }
#endif
