/* CRC-32C (Castagnoli), the checksum of state files: the SSE4.2 instruction
 * where the CPU has it (about 8 bytes a cycle, so checksumming a KV cache of
 * gigabytes costs well under its write time), else a table-driven reference.
 * Both give the same value. */
#ifndef ELLM_CORE_CRC32C_H
#define ELLM_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues a CRC: start with crc = 0, feed the data in any pieces. */
uint32_t crc32c_update(uint32_t crc, const void *data, size_t n);
/* The portable reference (tests compare the two). */
uint32_t crc32c_update_ref(uint32_t crc, const void *data, size_t n);

#endif
