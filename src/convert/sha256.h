/* SHA-256 of a byte string (FIPS 180-4), for the pre-tokenizer fingerprint
 * that names a byte-level BPE tokenizer as llama.cpp's converter does. */
#ifndef ELLM_CONVERT_SHA256_H
#define ELLM_CONVERT_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* Writes the digest of `len` bytes at `data` as 64 lowercase hex digits + NUL. */
void cv_sha256_hex(const void *data, size_t len, char out[65]);

#endif
