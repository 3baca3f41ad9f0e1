/* UTF-8 checks and the safe quoting of untrusted text in error messages (proto/utf8.c). */
#ifndef SD_UTF8_H
#define SD_UTF8_H

#include <stddef.h>

/* 1 when s[0..len) is valid UTF-8 (no overlongs, surrogates or code points
 * past U+10FFFF); otherwise 0 and *bad (if not NULL) is the offending byte. */
int sd_utf8_valid(const char *s, size_t len, size_t *bad);

/* Copies s into buf for use inside an error message: at most about cap-4
 * bytes, cut on a character boundary with "..." appended, and every byte that
 * is not printable valid UTF-8 replaced by '?'. Messages travel inside JSON on
 * the wire, so they must stay valid UTF-8 whatever the caller sent. */
const char *sd_msgstr(char *buf, size_t cap, const char *s, size_t len);

#endif
