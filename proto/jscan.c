/* A strict JSON text read in place: checked once as jansson's loader would refuse it, then walked without building a tree, so a 100 MB header costs its own bytes and what the caller keeps. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sd_grow.h"
#include "sd_jscan.h"

#define DEPTH_MAX 2048 /* jansson's JSON_PARSER_MAX_DEPTH */

typedef struct {
  const unsigned char *p, *end, *start;
  const char *why;
  int utf8;
} chk;

static int fail(chk *c, const char *why) {
  c->why = why;
  return -1;
}

static void ws_raw(const unsigned char **p, const unsigned char *end) {
  while (*p < end && (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r')) (*p)++;
}

static int hexval(unsigned char h) {
  if (h >= '0' && h <= '9') return h - '0';
  if (h >= 'a' && h <= 'f') return h - 'a' + 10;
  if (h >= 'A' && h <= 'F') return h - 'A' + 10;
  return -1;
}

/* Four hex digits at p (p + 4 <= end checked by the caller); -1 when not. */
static long hex4(const unsigned char *p) {
  long v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval(p[i]);
    if (h < 0) return -1;
    v = v << 4 | h;
  }
  return v;
}

/* One UTF-8 sequence at c->p (its first byte >= 0x80): its length, or 0 when it is not well formed. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end) {
  unsigned char b = p[0];
  size_t n = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
  if (!n || (size_t)(end - p) < n) return 0;
  for (size_t i = 1; i < n; i++)
    if ((p[i] & 0xC0) != 0x80) return 0;
  if (b == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
  if (b == 0xED && p[1] > 0x9F) return 0; /* a surrogate */
  if (b == 0xF0 && p[1] < 0x90) return 0; /* overlong */
  if (b == 0xF4 && p[1] > 0x8F) return 0; /* past U+10FFFF */
  return n;
}

static int check_string(chk *c) {
  c->p++; /* the opening quote */
  for (;;) {
    if (c->p >= c->end) return fail(c, "premature end of input in a string");
    unsigned char b = *c->p;
    if (b == '"') {
      c->p++;
      return 0;
    }
    if (b < 0x20) return fail(c, "control character in a string");
    if (b >= 0x80) {
      size_t n = utf8_len(c->p, c->end);
      if (!n) {
        c->utf8 = 1;
        return fail(c, "invalid UTF-8 in a string");
      }
      c->p += n;
      continue;
    }
    if (b != '\\') {
      c->p++;
      continue;
    }
    if (c->end - c->p < 2) return fail(c, "premature end of input in an escape");
    unsigned char e = c->p[1];
    if (strchr("\"\\/bfnrt", e) && e) {
      c->p += 2;
      continue;
    }
    if (e != 'u') return fail(c, "invalid escape");
    if (c->end - c->p < 6) return fail(c, "invalid \\u escape");
    long u = hex4(c->p + 2);
    if (u < 0) return fail(c, "invalid \\u escape");
    if (u == 0) return fail(c, "\\u0000 is not allowed");
    if (u >= 0xDC00 && u <= 0xDFFF) return fail(c, "invalid Unicode: a lone low surrogate");
    if (u >= 0xD800 && u <= 0xDBFF) {
      long lo = c->end - c->p >= 12 && c->p[6] == '\\' && c->p[7] == 'u' ? hex4(c->p + 8) : -1;
      if (lo < 0xDC00 || lo > 0xDFFF) return fail(c, "invalid Unicode: a lone high surrogate");
      c->p += 6;
    }
    c->p += 6;
  }
}

static int digits(chk *c) {
  const unsigned char *s = c->p;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
  return c->p > s ? 0 : fail(c, "invalid number");
}

static int check_number(chk *c) {
  const unsigned char *s = c->p;
  int neg = *c->p == '-', real = 0;
  if (neg) c->p++;
  if (c->p < c->end && *c->p == '0') {
    c->p++;
    if (c->p < c->end && *c->p >= '0' && *c->p <= '9') return fail(c, "invalid number: a leading zero");
  } else if (digits(c)) {
    return -1;
  }
  if (c->p < c->end && *c->p == '.') {
    c->p++;
    real = 1;
    if (digits(c)) return -1;
  }
  if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
    c->p++;
    real = 1;
    if (c->p < c->end && (*c->p == '+' || *c->p == '-')) c->p++;
    if (digits(c)) return -1;
  }
  size_t n = (size_t)(c->p - s);
  char small[64], *tok = n < sizeof small ? small : malloc(n + 1);
  if (!tok) return fail(c, "out of memory");
  memcpy(tok, s, n);
  tok[n] = '\0';
  errno = 0;
  int rc = 0;
  if (!real) {
    (void)strtoll(tok, NULL, 10);
    if (errno == ERANGE) rc = fail(c, neg ? "too big negative integer" : "too big integer");
  } else {
    double d = strtod(tok, NULL);
    if (errno == ERANGE && isinf(d)) rc = fail(c, "real number overflow");
  }
  if (tok != small) free(tok);
  if (rc) c->p = s;
  return rc;
}

static int check_value(chk *c, unsigned depth);

static int check_container(chk *c, unsigned depth) {
  unsigned char close = *c->p == '{' ? '}' : ']';
  if (depth > DEPTH_MAX) return fail(c, "maximum parsing depth reached");
  c->p++;
  ws_raw(&c->p, c->end);
  if (c->p < c->end && *c->p == close) {
    c->p++;
    return 0;
  }
  for (;;) {
    ws_raw(&c->p, c->end);
    if (close == '}') {
      if (c->p >= c->end || *c->p != '"') return fail(c, "string or '}' expected");
      if (check_string(c)) return -1;
      ws_raw(&c->p, c->end);
      if (c->p >= c->end || *c->p != ':') return fail(c, "':' expected");
      c->p++;
      ws_raw(&c->p, c->end);
    }
    if (check_value(c, depth + 1)) return -1;
    ws_raw(&c->p, c->end);
    if (c->p < c->end && *c->p == ',') {
      c->p++;
      continue;
    }
    if (c->p < c->end && *c->p == close) {
      c->p++;
      return 0;
    }
    return fail(c, close == '}' ? "',' or '}' expected" : "',' or ']' expected");
  }
}

static int literal(chk *c, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n)) return fail(c, "invalid token");
  c->p += n;
  return 0;
}

static int check_value(chk *c, unsigned depth) {
  if (c->p >= c->end) return fail(c, "premature end of input");
  switch (*c->p) {
  case '{':
  case '[': return check_container(c, depth);
  case '"': return check_string(c);
  case 't': return literal(c, "true");
  case 'f': return literal(c, "false");
  case 'n': return literal(c, "null");
  default:
    if (*c->p == '-' || (*c->p >= '0' && *c->p <= '9')) return check_number(c);
    return fail(c, "invalid token");
  }
}

int sd_json_check(const char *buf, size_t len, size_t *at, const char **why, int *utf8) {
  chk c = {.p = (const unsigned char *)buf, .end = (const unsigned char *)buf + len, .start = (const unsigned char *)buf};
  ws_raw(&c.p, c.end);
  int rc = c.p < c.end && (*c.p == '{' || *c.p == '[') ? check_container(&c, 1) : fail(&c, "'[' or '{' expected");
  if (!rc) {
    ws_raw(&c.p, c.end);
    if (c.p != c.end) rc = fail(&c, "end of file expected");
  }
  *at = (size_t)(c.p - c.start);
  *why = c.why;
  *utf8 = c.utf8;
  return rc;
}

/* ------------------------------------------------------------------------ *
 * The walk over a checked text
 * ------------------------------------------------------------------------ */
static void ws(sd_jcur *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

char sd_jcur_peek(sd_jcur *c) {
  ws(c);
  return c->p < c->end ? *c->p : '\0';
}

void sd_jcur_enter(sd_jcur *c) {
  ws(c);
  c->p++;
}

int sd_jcur_more(sd_jcur *c) {
  ws(c);
  if (*c->p == '}' || *c->p == ']') {
    c->p++;
    return 0;
  }
  if (*c->p == ',') c->p++;
  ws(c);
  return 1;
}

size_t sd_jcur_strmax(sd_jcur *c) {
  ws(c);
  const char *q = c->p + 1;
  while (*q != '"') q += *q == '\\' ? 2 : 1;
  return (size_t)(q - c->p - 1);
}

/* UTF-8 of code point u into out. */
static size_t put_utf8(char *out, unsigned long u) {
  if (u < 0x80) {
    out[0] = (char)u;
    return 1;
  }
  if (u < 0x800) {
    out[0] = (char)(0xC0 | u >> 6);
    out[1] = (char)(0x80 | (u & 0x3F));
    return 2;
  }
  if (u < 0x10000) {
    out[0] = (char)(0xE0 | u >> 12);
    out[1] = (char)(0x80 | (u >> 6 & 0x3F));
    out[2] = (char)(0x80 | (u & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | u >> 18);
  out[1] = (char)(0x80 | (u >> 12 & 0x3F));
  out[2] = (char)(0x80 | (u >> 6 & 0x3F));
  out[3] = (char)(0x80 | (u & 0x3F));
  return 4;
}

size_t sd_jcur_string(sd_jcur *c, char *out) {
  ws(c);
  const unsigned char *p = (const unsigned char *)c->p + 1;
  size_t n = 0;
  while (*p != '"') {
    if (*p != '\\') {
      out[n++] = (char)*p++;
      continue;
    }
    unsigned char e = p[1];
    if (e != 'u') {
      out[n++] = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : (char)e;
      p += 2;
      continue;
    }
    unsigned long u = (unsigned long)hex4(p + 2);
    p += 6;
    if (u >= 0xD800 && u <= 0xDBFF) {
      u = 0x10000 + ((u - 0xD800) << 10) + ((unsigned long)hex4(p + 2) - 0xDC00);
      p += 6;
    }
    n += put_utf8(out + n, u);
  }
  out[n] = '\0';
  c->p = (const char *)p + 1;
  return n;
}

char *sd_jcur_key(sd_jcur *c) {
  char *k = malloc(sd_jcur_strmax(c) + 1);
  if (!k) return NULL;
  sd_jcur_string(c, k);
  ws(c);
  c->p++; /* ':' */
  return k;
}

int sd_jcur_number(sd_jcur *c, int64_t *v) {
  ws(c);
  const char *s = c->p;
  int real = 0;
  while (c->p < c->end && strchr("+-0123456789.eE", *c->p) && *c->p) {
    if (*c->p == '.' || *c->p == 'e' || *c->p == 'E') real = 1;
    c->p++;
  }
  if (real) return 0;
  char small[32];
  size_t n = (size_t)(c->p - s);
  if (n >= sizeof small) n = sizeof small - 1; /* checked to fit in int64: never this long but for zeros */
  memcpy(small, s, n);
  small[n] = '\0';
  *v = strtoll(small, NULL, 10);
  return 1;
}

void sd_jcur_skip(sd_jcur *c) {
  char k = sd_jcur_peek(c);
  if (k == '"') {
    c->p += sd_jcur_strmax(c) + 2;
    return;
  }
  if (k != '{' && k != '[') {
    while (c->p < c->end && !strchr(",]} \t\r\n", *c->p)) c->p++;
    return;
  }
  unsigned depth = 0;
  do {
    if (*c->p == '"') {
      c->p += sd_jcur_strmax(c) + 2;
      continue;
    }
    if (*c->p == '{' || *c->p == '[') depth++;
    if (*c->p == '}' || *c->p == ']') depth--;
    c->p++;
  } while (depth);
}

/* ------------------------------------------------------------------------ *
 * Repeated keys
 * ------------------------------------------------------------------------ */
/* Up to this many keys a scan finds a repeat as fast as a hash table, without its allocation. */
#define JKEYS_SCAN 8

static const char *jkey_at(const void *ctx, uint32_t i) {
  const sd_jkeys *s = ctx;
  return s->text + s->at[i];
}

void sd_jkeys_init(sd_jkeys *s) { memset(s, 0, sizeof *s); }

void sd_jkeys_free(sd_jkeys *s) {
  free(s->text);
  free(s->at);
  sd_nameidx_free(&s->idx);
  sd_jkeys_init(s);
}

/* The key at the cursor decoded onto the end of s's text and the cursor past its ':'; compared with
 * the object's keys, those from first on (idx: their table, started once they pass the scan's size):
 * 0 kept, 1 a repeat (not kept), -1 out of memory. *key is valid until the next read into s. */
static int keys_read(sd_jkeys *s, size_t first, sd_nameidx *idx, sd_jcur *c, const char **key) {
  if (SD_GROW(s->text, s->tcap, s->len + sd_jcur_strmax(c) + 1, 256) || SD_GROW(s->at, s->acap, s->n + 1, 16))
    return -1;
  char *k = s->text + s->len;
  size_t klen = sd_jcur_string(c, k);
  ws(c);
  c->p++; /* ':' */
  *key = k;
  size_t had = s->n - first;
  if (had <= JKEYS_SCAN) {
    for (size_t i = first; i < s->n; i++)
      if (!strcmp(s->text + s->at[i], k)) return 1;
  } else if (sd_nameidx_find(idx, k, jkey_at, s) != SD_NAMEIDX_NONE) {
    return 1;
  }
  s->at[s->n] = s->len;
  /* Past the scan's size every key of the object goes into the table once, then each new one. */
  for (size_t i = had == JKEYS_SCAN ? first : s->n; had >= JKEYS_SCAN && i <= s->n; i++)
    if (sd_nameidx_insert(idx, s->text + s->at[i], (uint32_t)i, jkey_at, s) != 0) return -1;
  s->len += klen + 1;
  s->n++;
  return 0;
}

int sd_jkeys_read(sd_jkeys *s, sd_jcur *c, const char **key) { return keys_read(s, 0, &s->idx, c, key); }

/* One value past c; the keys of the objects open around it stay in s, this one's are dropped after. */
static int skip_in(sd_jcur *c, sd_jkeys *s, char **dup, size_t *dup_at) {
  char k = sd_jcur_peek(c);
  if (k != '{' && k != '[') {
    sd_jcur_skip(c);
    return 0;
  }
  size_t first = s->n, len = s->len;
  sd_nameidx idx;
  sd_nameidx_init(&idx);
  int rc = 0;
  sd_jcur_enter(c);
  while (!rc && sd_jcur_more(c)) {
    if (k == '{') {
      size_t at = sd_jcur_at(c);
      const char *key;
      rc = keys_read(s, first, &idx, c, &key);
      if (rc == 1) {
        *dup_at = at;
        if (!(*dup = strdup(key))) rc = -1;
      }
      if (rc) break;
    }
    /* a checked text is at most 2048 levels deep: so is this recursion */
    rc = skip_in(c, s, dup, dup_at);
  }
  sd_nameidx_free(&idx);
  s->n = first;
  s->len = len;
  return rc;
}

int sd_jcur_skip_unique(sd_jcur *c, char **dup, size_t *dup_at) {
  sd_jkeys s;
  sd_jkeys_init(&s);
  int rc = skip_in(c, &s, dup, dup_at);
  sd_jkeys_free(&s);
  return rc;
}
