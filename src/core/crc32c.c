/* CRC-32C: reflected polynomial 0x82F63B78, initial and final XOR ~0, so
 * crc32c("123456789") = 0xE3069283. */
#include "core/crc32c.h"

#include <string.h>

static uint32_t table[256];
static int table_ready;

static void table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[i] = c;
    }
    table_ready = 1; /* idempotent: racing initializers write the same values */
}

uint32_t crc32c_update_ref(uint32_t crc, const void *data, size_t n) {
    if (!table_ready) table_init();
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
    }
    uint32_t c32 = (uint32_t)c;
    for (; n; n--, p++) c32 = __builtin_ia32_crc32qi(c32, *p);
    return ~c32;
}
#endif

uint32_t crc32c_update(uint32_t crc, const void *data, size_t n) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) return crc32c_hw(crc, data, n);
#endif
    return crc32c_update_ref(crc, data, n);
}
