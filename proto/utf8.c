/* UTF-8 checks and the safe quoting of untrusted text in error messages (below every other proto file). */
#include <stddef.h>
#include <string.h>

#include "sd_utf8.h"

/* Length of the well-formed UTF-8 sequence at s[0..avail), or 0. Follows the
 * Unicode table of well-formed byte sequences, which excludes overlongs,
 * surrogates and anything past U+10FFFF by construction. */
static size_t utf8_seq(const unsigned char *s, size_t avail) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;
  if (c < 0xE0) return avail >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
  if (c < 0xF0) {
    if (avail < 3) return 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80) return 0;
    return 3;
  }
  if (c < 0xF5) {
    if (avail < 4) return 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
    return 4;
  }
  return 0;
}

int sd_utf8_valid(const char *s, size_t len, size_t *bad) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < len) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    size_t k = utf8_seq(u + i, len - i);
    if (!k) {
      if (bad) *bad = i;
      return 0;
    }
    i += k;
  }
  return 1;
}

const char *sd_msgstr(char *buf, size_t cap, const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  size_t o = 0, i = 0;
  if (cap == 0) return buf;
  if (!s) len = 0;
  size_t room = cap > 4 ? cap - 4 : 0; /* keep space for "..." and NUL */
  while (i < len) {
    size_t k = u[i] < 0x80 ? 1 : utf8_seq(u + i, len - i);
    int printable = k > 1 || (k == 1 && u[i] >= 0x20 && u[i] != 0x7F);
    size_t out = printable ? k : 1;
    if (o + out > room) {
      if (cap >= 4) {
        memcpy(buf + o, "...", 3);
        o += 3;
      }
      break;
    }
    if (printable)
      memcpy(buf + o, s + i, k);
    else
      buf[o] = '?';
    o += out;
    i += k ? k : 1;
  }
  buf[o < cap ? o : cap - 1] = '\0';
  return buf;
}
