/* Escaping untrusted text for log lines (pure): controls and non-UTF-8 bytes as \xNN, bounded. */
#include <string.h>

#include "sd_escape.h"

/* Length of the valid UTF-8 sequence at s (n bytes available) that is not a C1 control; 0 when
 * the byte at s must be escaped. */
static size_t utf8_ok(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c >= 0x20 && c < 0x7f) return 1;
  if (c < 0xc2 || c > 0xf4) return 0;
  size_t len = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
  if (n < len) return 0;
  /* The second byte's range rules out overlong forms, surrogates and code points past U+10FFFF. */
  unsigned lo = 0x80, hi = 0xbf;
  if (c == 0xe0) lo = 0xa0;
  else if (c == 0xed) hi = 0x9f;
  else if (c == 0xf0) lo = 0x90;
  else if (c == 0xf4) hi = 0x8f;
  if (s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < len; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if (c == 0xc2 && s[1] < 0xa0) return 0; /* U+0080..U+009F: C1 controls (CSI is U+009B) */
  return len;
}

size_t sd_escape(const char *in, size_t inlen, size_t max_in, char *out, size_t outsz) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *s = (const unsigned char *)in;
  size_t i = 0, o = 0;
  if (outsz == 0) return 0;
  size_t stop = inlen < max_in ? inlen : max_in;
  while (i < stop) {
    size_t len = utf8_ok(s + i, inlen - i);
    size_t need = len ? len : 4;
    if (i + (len ? len : 1) > stop || o + need + 1 > outsz) break;
    if (len) {
      memcpy(out + o, s + i, len);
      i += len;
    } else {
      out[o++] = '\\';
      out[o++] = 'x';
      out[o++] = hex[s[i] >> 4];
      out[o++] = hex[s[i] & 15];
      o -= 4;
      i++;
    }
    o += need;
  }
  if (i < inlen) {
    /* Make room for the mark by dropping whole characters or escapes from the end. */
    while (o + 4 > outsz && o > 0) {
      size_t back = o >= 4 && out[o - 4] == '\\' && out[o - 3] == 'x' ? 4 : 1;
      while (back == 1 && o > 1 && ((unsigned char)out[o - 1] & 0xc0) == 0x80) {
        o--;
      }
      o -= back;
    }
    if (o + 4 <= outsz) {
      memcpy(out + o, "...", 3);
      o += 3;
    }
  }
  out[o] = '\0';
  return o;
}

const char *sd_esc(sd_escbuf *b, const char *s) {
  if (!s) s = "";
  sd_escape(s, strlen(s), SD_ESCAPE_LOG, b->s, sizeof b->s);
  return b->s;
}
