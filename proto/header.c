/* Safetensors file headers as the reference writer lays them out: metadata first, tensors by alignment then name. */
#include <stdlib.h>
#include <string.h>

#include "sd_checksum.h"
#include "sd_format.h"
#include "sd_layout.h"

/* ------------------------------------------------------------------------ *
 * Byte buffer
 * ------------------------------------------------------------------------ */
void sd_buf_reserve(sd_buf *b, size_t extra) {
  if (b->oom) return;
  if (b->cap - b->len >= extra) return;
  size_t need = b->len + extra;
  if (need < b->len) {
    b->oom = 1;
    return;
  }
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) {
    if (cap > SIZE_MAX / 2) {
      cap = need;
      break;
    }
    cap *= 2;
  }
  char *p;
  if (cap >= SD_BIG_ALLOC_MIN && b->cap < SD_BIG_ALLOC_MIN) {
    /* Crossing into big-buffer sizes: move to memory that may use huge
     * pages (later growth reallocs, which keeps that). */
    p = sd_big_alloc(cap);
    if (p && b->len) memcpy(p, b->p, b->len);
    if (p) free(b->p);
  } else {
    p = realloc(b->p, cap);
  }
  if (!p) {
    b->oom = 1;
    return;
  }
  b->p = p;
  b->cap = cap;
}

void sd_buf_put(sd_buf *b, const void *s, size_t n) {
  sd_buf_reserve(b, n);
  if (b->oom) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

void sd_buf_puts(sd_buf *b, const char *s) { sd_buf_put(b, s, strlen(s)); }

void sd_buf_putc(sd_buf *b, char c) {
  sd_buf_reserve(b, 1);
  if (b->oom) return;
  b->p[b->len++] = c;
}

void sd_buf_put_u64(sd_buf *b, uint64_t v) {
  sd_buf_reserve(b, SD_U64_DIGITS_MAX);
  if (b->oom) return;
  b->len = (size_t)(sd_put_u64(b->p + b->len, v) - b->p);
}

/* ------------------------------------------------------------------------ *
 * Numbers
 * ------------------------------------------------------------------------ */
static const char digit_pairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

unsigned sd_u64_digits(uint64_t v) {
  unsigned d = 1;
  for (;;) {
    if (v < 10) return d;
    if (v < 100) return d + 1;
    if (v < 1000) return d + 2;
    if (v < 10000) return d + 3;
    v /= 10000;
    d += 4;
  }
}

char *sd_put_u64(char *o, uint64_t v) {
  char *end = o + sd_u64_digits(v), *p = end;
  while (v >= 100) {
    unsigned r = (unsigned)(v % 100);
    v /= 100;
    p -= 2;
    memcpy(p, digit_pairs + 2 * r, 2);
  }
  if (v >= 10) {
    memcpy(p - 2, digit_pairs + 2 * v, 2);
  } else {
    p[-1] = (char)('0' + v);
  }
  return end;
}

/* ------------------------------------------------------------------------ *
 * JSON strings
 *
 * Names are mostly long stretches that need no escaping, so eight bytes are
 * tested at once with the classic SWAR tests; the word-wide test is exact
 * (no false negatives), and any word that trips it is handled one byte at a
 * time, so the output never depends on the word path being taken.
 * ------------------------------------------------------------------------ */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Nonzero when some byte of w is zero / below n (n <= 128). */
static inline uint64_t has_zero(uint64_t w) { return (w - ONES) & ~w & HIGHS; }
static inline uint64_t has_less(uint64_t w, unsigned n) { return (w - ONES * n) & ~w & HIGHS; }

/* A byte serde_json would escape: '"', '\\' or a C0 control. */
static inline uint64_t word_escapes(uint64_t w) {
  return has_zero(w ^ (ONES * '"')) | has_zero(w ^ (ONES * '\\')) | has_less(w, 0x20);
}

/* ... or, for Python's ensure_ascii, anything outside ' '..'~'. */
static inline uint64_t word_escapes_ascii(uint64_t w) {
  return word_escapes(w) | (w & HIGHS) | has_zero(w ^ (ONES * 0x7F));
}

static const char hexd[] = "0123456789abcdef";

static inline char *put_u16esc(char *o, unsigned v) {
  o[0] = '\\';
  o[1] = 'u';
  o[2] = hexd[(v >> 12) & 15];
  o[3] = hexd[(v >> 8) & 15];
  o[4] = hexd[(v >> 4) & 15];
  o[5] = hexd[v & 15];
  return o + 6;
}

/* Returns the short escape for c, or 0 when c needs \u00XX or none. */
static inline char short_esc(unsigned char c) {
  switch (c) {
    case '"': return '"';
    case '\\': return '\\';
    case '\b': return 'b';
    case '\f': return 'f';
    case '\n': return 'n';
    case '\r': return 'r';
    case '\t': return 't';
    default: return 0;
  }
}

/* The escaped bytes of s[0..n) without the quotes. */
static char *escape_serde(char *o, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    if (n - i >= 8) {
      uint64_t w;
      memcpy(&w, u + i, 8);
      if (!word_escapes(w)) {
        memcpy(o, &w, 8);
        o += 8;
        i += 8;
        continue;
      }
    }
    unsigned char c = u[i++];
    if (c >= 0x20 && c != '"' && c != '\\') {
      *o++ = (char)c;
      continue;
    }
    char e = short_esc(c);
    if (e) {
      o[0] = '\\';
      o[1] = e;
      o += 2;
    } else {
      o = put_u16esc(o, c);
    }
  }
  return o;
}

/* Input is valid UTF-8 (checked by the callers), so decoding needs no
 * error path. */
static char *escape_ascii(char *o, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    if (n - i >= 8) {
      uint64_t w;
      memcpy(&w, u + i, 8);
      if (!word_escapes_ascii(w)) {
        memcpy(o, &w, 8);
        o += 8;
        i += 8;
        continue;
      }
    }
    unsigned char c = u[i];
    if (c >= 0x20 && c <= 0x7E && c != '"' && c != '\\') {
      *o++ = (char)c;
      i++;
      continue;
    }
    char e = c < 0x80 ? short_esc(c) : 0;
    if (e) {
      o[0] = '\\';
      o[1] = e;
      o += 2;
      i++;
      continue;
    }
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if (c < 0xE0) {
      cp = ((uint32_t)(c & 0x1F) << 6) | (u[i + 1] & 0x3F);
      i += 2;
    } else if (c < 0xF0) {
      cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(u[i + 1] & 0x3F) << 6) | (u[i + 2] & 0x3F);
      i += 3;
    } else {
      cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(u[i + 1] & 0x3F) << 12) |
           ((uint32_t)(u[i + 2] & 0x3F) << 6) | (u[i + 3] & 0x3F);
      i += 4;
    }
    if (cp >= 0x10000) {
      cp -= 0x10000;
      o = put_u16esc(o, 0xD800 | (cp >> 10));
      o = put_u16esc(o, 0xDC00 | (cp & 0x3FF));
    } else {
      o = put_u16esc(o, cp);
    }
  }
  return o;
}

char *sd_json_str_put(char *o, const char *s, size_t n) {
  *o++ = '"';
  o = escape_serde(o, s, n);
  *o++ = '"';
  return o;
}

char *sd_json_str_ascii_put(char *o, const char *s, size_t n) {
  *o++ = '"';
  o = escape_ascii(o, s, n);
  *o++ = '"';
  return o;
}

/* Into a buffer, a slice at a time, so a long string (metadata may run to
 * megabytes) never reserves six times its size: room for the worst case of
 * one slice suffices. ASCII slices end on a UTF-8 sequence boundary. */
#define ESCAPE_SLICE 4096

static void buf_json_str(sd_buf *b, const char *s, size_t n, int ascii) {
  const unsigned char *u = (const unsigned char *)s;
  sd_buf_putc(b, '"');
  for (size_t i = 0; i < n && !b->oom;) {
    size_t k = n - i < ESCAPE_SLICE ? n - i : ESCAPE_SLICE;
    if (ascii)
      while (i + k < n && k > 1 && (u[i + k] & 0xC0) == 0x80) k--;
    sd_buf_reserve(b, 6 * k);
    if (b->oom) return;
    char *o = b->p + b->len;
    o = ascii ? escape_ascii(o, s + i, k) : escape_serde(o, s + i, k);
    b->len = (size_t)(o - b->p);
    i += k;
  }
  sd_buf_putc(b, '"');
}

void sd_buf_json_str(sd_buf *b, const char *s, size_t n) { buf_json_str(b, s, n, 0); }

void sd_buf_json_str_ascii(sd_buf *b, const char *s, size_t n) { buf_json_str(b, s, n, 1); }

/* ------------------------------------------------------------------------ *
 * __metadata__
 * ------------------------------------------------------------------------ */
static int kv_cmp(const void *pa, const void *pb) {
  const sd_kv *a = *(const sd_kv *const *)pa, *b = *(const sd_kv *const *)pb;
  return strcmp(a->key, b->key);
}

static const sd_kv sum_kv = {SD_CHECKSUM_KEY, "00000000"};

static int meta_json(const sd_kv *kv, size_t n, int with_sum, sd_buf *out, size_t *sum_at, sd_error *err) {
  char shown[SD_MSGNAME_MAX];
  const sd_kv **v = NULL;
  size_t m = 0;
  if (n || with_sum) {
    v = malloc((n + 1) * sizeof *v);
    if (!v) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding metadata");
  }
  for (size_t i = 0; i < n; i++) {
    if (!kv[i].key || !kv[i].value) {
      free(v);
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "metadata entry %zu has no %s", i,
                     kv[i].key ? "value" : "key");
    }
    size_t bad;
    if (!sd_utf8_valid(kv[i].key, strlen(kv[i].key), &bad) ||
        !sd_utf8_valid(kv[i].value, strlen(kv[i].value), &bad)) {
      free(v);
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "metadata '%s' is not valid UTF-8",
                     sd_msgstr(shown, sizeof shown, kv[i].key, strlen(kv[i].key)));
    }
    /* transformers refuses checkpoints whose format is not "pt", so the
     * caller cannot change it. */
    if (strcmp(kv[i].key, "format") == 0) continue;
    /* shardd's own: a caller's value (metadata read back from an earlier checkpoint) could only be stale */
    if (strcmp(kv[i].key, SD_CHECKSUM_KEY) == 0) continue;
    v[m++] = &kv[i];
  }
  if (with_sum) v[m++] = &sum_kv;
  if (m > 1) qsort(v, m, sizeof *v, kv_cmp);
  for (size_t i = 1; i < m; i++) {
    if (strcmp(v[i - 1]->key, v[i]->key) == 0) {
      int rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "metadata key '%s' is given twice",
                       sd_msgstr(shown, sizeof shown, v[i]->key, strlen(v[i]->key)));
      free(v);
      return rc;
    }
  }
  sd_buf_puts(out, "{\"__metadata__\":{\"format\":\"pt\"");
  for (size_t i = 0; i < m; i++) {
    sd_buf_putc(out, ',');
    sd_buf_json_str(out, v[i]->key, strlen(v[i]->key));
    sd_buf_putc(out, ':');
    if (v[i] == &sum_kv && sum_at) *sum_at = out->len + 1;
    sd_buf_json_str(out, v[i]->value, strlen(v[i]->value));
  }
  sd_buf_putc(out, '}');
  free(v);
  if (out->oom) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding metadata");
  return 0;
}

int sd_header_meta_json(const sd_kv *kv, size_t n, sd_buf *out, sd_error *err) {
  return meta_json(kv, n, 0, out, NULL, err);
}

int sd_header_meta_json_sum(const sd_kv *kv, size_t n, sd_buf *out, size_t *sum_at, sd_error *err) {
  return meta_json(kv, n, 1, out, sum_at, err);
}

void sd_header_put_sum(const sd_plan_file *f, char *header, uint32_t crc) {
  char hex[SD_CHECKSUM_HEX + 1];
  sd_crc32c_hex(crc, hex);
  if (f->sum_at) memcpy(header + f->sum_at, hex, SD_CHECKSUM_HEX);
}

/* ------------------------------------------------------------------------ *
 * One file's header
 * ------------------------------------------------------------------------ */
#define LIT(o, s) (memcpy((o), (s), sizeof(s) - 1), (o) + sizeof(s) - 1)
#define ENTRY_OPEN ":{\"dtype\":\""
#define ENTRY_SHAPE "\",\"shape\":["
#define ENTRY_OFFSETS "],\"data_offsets\":["

static const unsigned char dtype_name_len[SD_DT__COUNT] = {
#define SD_XX_(name, size) sizeof #name - 1,
    SD_DTYPE_MAP(SD_XX_)
#undef SD_XX_
};

size_t sd_header_entry_max(const sd_tensor *t, size_t escaped_name_len) {
  size_t dl = (unsigned)t->dtype < SD_DT__COUNT ? dtype_name_len[t->dtype] : strlen("invalid");
  size_t m = 1 + escaped_name_len + (sizeof ENTRY_OPEN - 1) + dl +
             (sizeof ENTRY_SHAPE - 1) + (sizeof ENTRY_OFFSETS - 1) + 2 * SD_U64_DIGITS_MAX + 1 + 2;
  for (uint32_t d = 0; d < t->ndim && d < SD_MAX_DIMS; d++) m += 1 + sd_u64_digits(t->shape[d]);
  return m;
}

size_t sd_header_file_max(size_t meta_len) { return 8 + meta_len + 1 + SD_HEADER_ALIGN; }

int sd_header_encode(sd_plan_file *f, uint32_t file_no, const sd_tensor *tensors,
                     const uint64_t *nbytes, const uint32_t *name_len, const char *meta_json,
                     size_t meta_len, char *out, sd_plan_loc *loc, sd_error *err) {
  size_t n = f->ntensors;
  const char *dname[SD_DT__COUNT];
  size_t dlen[SD_DT__COUNT];
  for (unsigned d = 0; d < SD_DT__COUNT; d++) {
    dname[d] = sd_dtype_name((sd_dtype)d);
    dlen[d] = strlen(dname[d]);
  }
  char *o = out + 8;
  memcpy(o, meta_json, meta_len);
  o += meta_len;
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    /* Input order is arbitrary, so these are cache misses: start them
     * early (the name pointer needs its tensor first, hence two steps; a
     * tensor's first two dimensions may sit in the next cache line). */
    if (i + 16 < n) {
      uint32_t a = f->tensors[i + 16];
      __builtin_prefetch(&tensors[a]);
      __builtin_prefetch(&tensors[a].shape[1]);
      __builtin_prefetch(&nbytes[a]);
      __builtin_prefetch(&name_len[a]);
    }
    if (i + 8 < n) __builtin_prefetch(tensors[f->tensors[i + 8]].name);
    uint32_t ti = f->tensors[i];
    const sd_tensor *t = &tensors[ti];
    uint64_t len = nbytes[ti];
    *o++ = ',';
    o = sd_json_str_put(o, t->name, name_len[ti]);
    o = LIT(o, ENTRY_OPEN);
    memcpy(o, dname[t->dtype], dlen[t->dtype]);
    o += dlen[t->dtype];
    o = LIT(o, ENTRY_SHAPE);
    for (uint32_t d = 0; d < t->ndim; d++) {
      if (d) *o++ = ',';
      o = sd_put_u64(o, t->shape[d]);
    }
    o = LIT(o, ENTRY_OFFSETS);
    o = sd_put_u64(o, off);
    *o++ = ',';
    o = sd_put_u64(o, off + len);
    o = LIT(o, "]}");
    off += len; /* the planner bounded the sum by INT64_MAX */
  }
  *o++ = '}';

  /* Spaces after the JSON are insignificant to every parser; padding makes
   * the data section start on a 4 KiB boundary for direct I/O. */
  uint64_t json_len = (uint64_t)(o - out) - 8;
  uint64_t padded = (8 + json_len + SD_HEADER_ALIGN - 1) / SD_HEADER_ALIGN * SD_HEADER_ALIGN - 8;
  if (padded > SD_HEADER_MAX)
    return sd_fail(err, SHARDD_E_LIMIT,
                   "%s: header of %llu bytes (%zu tensors) exceeds the format's limit of %llu bytes",
                   f->name, (unsigned long long)padded, n, (unsigned long long)SD_HEADER_MAX);
  memset(o, ' ', padded - json_len);
  for (int i = 0; i < 8; i++) out[i] = (char)(unsigned char)(padded >> (8 * i));

  f->header = out;
  f->header_size = 8 + padded;
  f->data_size = off;
  f->file_size = f->header_size + off;
  /* Locations in one pass once the header size is known: the sizes are
   * still in cache, the location entries are scattered. */
  off = 0;
  for (size_t i = 0; i < n; i++) {
    if (i + 16 < n) __builtin_prefetch(&loc[f->tensors[i + 16]], 1);
    uint32_t ti = f->tensors[i];
    uint64_t len = nbytes[ti];
    loc[ti] = (sd_plan_loc){file_no, len, off, f->header_size + off};
    off += len;
  }
  return 0;
}
