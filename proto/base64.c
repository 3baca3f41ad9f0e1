/* Strict RFC 4648 base64: inline tensor bytes and file artifacts travel this way on the wire. */
#include <stdint.h>
#include <stdlib.h>

#include "sd_base64.h"

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t sd_b64_encoded_len(size_t n) {
  size_t groups = n / 3 + (n % 3 != 0);
  if (groups > SIZE_MAX / 4) return SIZE_MAX;
  return groups * 4;
}

size_t sd_b64_encode(const void *src, size_t n, char *out) {
  const uint8_t *p = src;
  size_t o = 0, i = 0;
  for (; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    out[o++] = b64_alphabet[v >> 18 & 63];
    out[o++] = b64_alphabet[v >> 12 & 63];
    out[o++] = b64_alphabet[v >> 6 & 63];
    out[o++] = b64_alphabet[v & 63];
  }
  if (n - i == 1) {
    uint32_t v = (uint32_t)p[i] << 16;
    out[o++] = b64_alphabet[v >> 18 & 63];
    out[o++] = b64_alphabet[v >> 12 & 63];
    out[o++] = '=';
    out[o++] = '=';
  } else if (n - i == 2) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
    out[o++] = b64_alphabet[v >> 18 & 63];
    out[o++] = b64_alphabet[v >> 12 & 63];
    out[o++] = b64_alphabet[v >> 6 & 63];
    out[o++] = '=';
  }
  out[o] = '\0';
  return o;
}

/* 0..63 for an alphabet character, -1 otherwise (including '=' and NUL). */
static int b64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

static int b64_bad_char(sd_error *err, const char *s, size_t pos) {
  unsigned char c = (unsigned char)s[pos];
  if (c == '=')
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "base64: padding '=' at position %zu is not at the end", pos);
  if (c >= 0x20 && c < 0x7f)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "base64: invalid character '%c' at position %zu", c, pos);
  return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                 "base64: invalid byte 0x%02x at position %zu", c, pos);
}

int sd_b64_decode(const char *s, size_t len, uint8_t **out, size_t *outlen, sd_error *err) {
  *out = NULL;
  *outlen = 0;
  if (len % 4 != 0)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "base64: length %zu is not a multiple of 4", len);

  /* Padding is only legal in the final group: "xx==" or "xxx=". */
  size_t pad = 0;
  if (len >= 4) {
    if (s[len - 1] == '=') pad = 1;
    if (pad && s[len - 2] == '=') pad = 2;
  }
  size_t n = len / 4 * 3 - pad;
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return sd_fail(err, SHARDD_E_NO_MEMORY, "base64: cannot allocate %zu bytes", n);

  size_t o = 0;
  size_t body = len - pad;
  size_t full = len == 0 ? 0 : (pad ? len - 4 : len);
  for (size_t i = 0; i < full; i += 4) {
    int a = b64_value((unsigned char)s[i]), b = b64_value((unsigned char)s[i + 1]);
    int c = b64_value((unsigned char)s[i + 2]), d = b64_value((unsigned char)s[i + 3]);
    if ((a | b | c | d) < 0) {
      size_t bad = i + (a < 0 ? 0 : b < 0 ? 1 : c < 0 ? 2 : 3);
      free(buf);
      return b64_bad_char(err, s, bad);
    }
    uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
    buf[o++] = (uint8_t)(v >> 16);
    buf[o++] = (uint8_t)(v >> 8);
    buf[o++] = (uint8_t)v;
  }
  if (pad) {
    size_t i = full;
    int v[3] = {0, 0, 0};
    for (size_t k = 0; i + k < body; k++) {
      v[k] = b64_value((unsigned char)s[i + k]);
      if (v[k] < 0) {
        free(buf);
        return b64_bad_char(err, s, i + k);
      }
    }
    uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6;
    /* Non-zero leftover bits would let two strings decode to the same bytes;
     * refusing them keeps the encoding canonical. */
    uint32_t leftover = pad == 2 ? (w & 0xffff) : (w & 0xff);
    if (leftover) {
      free(buf);
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                     "base64: non-zero padding bits in the final group at position %zu", i);
    }
    buf[o++] = (uint8_t)(w >> 16);
    if (pad == 1) buf[o++] = (uint8_t)(w >> 8);
  }
  *out = buf;
  *outlen = o;
  return 0;
}
