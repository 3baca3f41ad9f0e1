/* Strict RFC 4648 base64 (standard alphabet, '=' padding) for inline put/file payloads. */
#ifndef SD_BASE64_H
#define SD_BASE64_H

#include <stddef.h>
#include <stdint.h>

#include "sd_error.h"

/* Characters sd_b64_encode writes for n input bytes, NOT counting the NUL:
 * the output buffer must hold sd_b64_encoded_len(n) + 1 bytes. Returns
 * SIZE_MAX if the length would not fit in a size_t. */
size_t sd_b64_encoded_len(size_t n);

/* Encodes n bytes of src into out (padded, no line breaks) and writes a
 * terminating NUL. Returns the number of characters written, NUL excluded. */
size_t sd_b64_encode(const void *src, size_t n, char *out);

/* Decodes exactly len characters of s (no NUL needed). Strict: len must be a
 * multiple of 4, only the standard alphabet, '=' only as the final one or two
 * characters, unused bits of the last group must be zero, no whitespace.
 * On success *out is a malloc'd buffer (never NULL, even for empty input;
 * the caller frees it) and *outlen its length. On failure returns
 * SHARDD_E_INVALID_ARGUMENT (or SHARDD_E_NO_MEMORY) with a message giving
 * the offending position, and leaves *out NULL. */
int sd_b64_decode(const char *s, size_t len, uint8_t **out, size_t *outlen, sd_error *err);

#endif
