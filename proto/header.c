/* Safetensors file headers as the reference writer lays them out: metadata first, tensors by alignment then name. */
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"
#include "sd_layout.h"

/* ------------------------------------------------------------------------ *
 * Byte buffer and JSON strings
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
  char *p = realloc(b->p, cap);
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
  char tmp[20];
  size_t n = 0;
  do {
    tmp[sizeof tmp - 1 - n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  sd_buf_put(b, tmp + sizeof tmp - n, n);
}

static const char hexd[] = "0123456789abcdef";

static void put_u16esc(sd_buf *b, unsigned v) {
  char e[6] = {'\\', 'u', hexd[(v >> 12) & 15], hexd[(v >> 8) & 15], hexd[(v >> 4) & 15],
               hexd[v & 15]};
  sd_buf_put(b, e, 6);
}

/* Returns the short escape for c, or 0 when c needs \u00XX or none. */
static char short_esc(unsigned char c) {
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

void sd_buf_json_str(sd_buf *b, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  sd_buf_reserve(b, n + 2);
  sd_buf_putc(b, '"');
  size_t run = 0; /* start of the pending unescaped stretch */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = u[i];
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    sd_buf_put(b, s + run, i - run);
    run = i + 1;
    char e = short_esc(c);
    if (e) {
      char two[2] = {'\\', e};
      sd_buf_put(b, two, 2);
    } else {
      put_u16esc(b, c);
    }
  }
  sd_buf_put(b, s + run, n - run);
  sd_buf_putc(b, '"');
}

/* Input is valid UTF-8 (checked by the callers), so decoding needs no
 * error path. */
void sd_buf_json_str_ascii(sd_buf *b, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  sd_buf_putc(b, '"');
  size_t i = 0;
  while (i < n) {
    unsigned char c = u[i];
    if (c >= 0x20 && c <= 0x7E) {
      size_t j = i;
      while (j < n && u[j] >= 0x20 && u[j] <= 0x7E && u[j] != '"' && u[j] != '\\') j++;
      if (j > i) {
        sd_buf_put(b, s + i, j - i);
        i = j;
        continue;
      }
    }
    char e = c < 0x80 ? short_esc(c) : 0;
    if (e) {
      char two[2] = {'\\', e};
      sd_buf_put(b, two, 2);
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
      put_u16esc(b, 0xD800 | (cp >> 10));
      put_u16esc(b, 0xDC00 | (cp & 0x3FF));
    } else {
      put_u16esc(b, cp);
    }
  }
  sd_buf_putc(b, '"');
}

/* ------------------------------------------------------------------------ *
 * __metadata__
 * ------------------------------------------------------------------------ */
static int kv_cmp(const void *pa, const void *pb) {
  const sd_kv *a = *(const sd_kv *const *)pa, *b = *(const sd_kv *const *)pb;
  return strcmp(a->key, b->key);
}

int sd_header_meta_json(const sd_kv *kv, size_t n, sd_buf *out, sd_error *err) {
  char shown[SD_MSGNAME_MAX];
  const sd_kv **v = NULL;
  size_t m = 0;
  if (n) {
    v = malloc(n * sizeof *v);
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
    v[m++] = &kv[i];
  }
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
    sd_buf_json_str(out, v[i]->value, strlen(v[i]->value));
  }
  sd_buf_putc(out, '}');
  free(v);
  if (out->oom) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding metadata");
  return 0;
}

/* ------------------------------------------------------------------------ *
 * One file's header
 * ------------------------------------------------------------------------ */
int sd_header_encode(sd_plan_file *f, uint32_t file_no, const sd_tensor *tensors,
                     const uint64_t *nbytes, const uint32_t *name_len, const char *meta_json,
                     size_t meta_len, sd_plan_loc *loc, sd_error *err) {
  size_t n = f->ntensors;
  /* Room for typical entries (a 40-byte name, two dimensions) up front:
   * pages past the end of the text are never touched, and when longer
   * names need more, realloc of a large block remaps rather than copies. */
  sd_buf b = {0};
  sd_buf_reserve(&b, 8 + meta_len + SD_HEADER_ALIGN + 2 + n * 160);
  sd_buf_put(&b, "\0\0\0\0\0\0\0\0", 8);
  sd_buf_put(&b, meta_json, meta_len);
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    /* Input order is arbitrary, so these are cache misses: start them
     * early (the name pointer needs its tensor first, hence two steps). */
    if (i + 16 < n) {
      uint32_t a = f->tensors[i + 16];
      __builtin_prefetch(&tensors[a]);
      __builtin_prefetch(&nbytes[a]);
      __builtin_prefetch(&name_len[a]);
      __builtin_prefetch(&loc[a], 1);
    }
    if (i + 8 < n) __builtin_prefetch(tensors[f->tensors[i + 8]].name);
    uint32_t ti = f->tensors[i];
    const sd_tensor *t = &tensors[ti];
    uint64_t len = nbytes[ti];
    loc[ti].file = file_no;
    loc[ti].nbytes = len;
    loc[ti].data_begin = off;
    sd_buf_putc(&b, ',');
    sd_buf_json_str(&b, t->name, name_len[ti]);
    sd_buf_puts(&b, ":{\"dtype\":\"");
    sd_buf_puts(&b, sd_dtype_name(t->dtype));
    sd_buf_puts(&b, "\",\"shape\":[");
    for (uint32_t d = 0; d < t->ndim; d++) {
      if (d) sd_buf_putc(&b, ',');
      sd_buf_put_u64(&b, t->shape[d]);
    }
    sd_buf_puts(&b, "],\"data_offsets\":[");
    sd_buf_put_u64(&b, off);
    sd_buf_putc(&b, ',');
    sd_buf_put_u64(&b, off + len);
    sd_buf_puts(&b, "]}");
    off += len; /* the planner bounded the sum by INT64_MAX */
  }
  sd_buf_putc(&b, '}');
  if (b.oom) {
    free(b.p);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding the header of %s", f->name);
  }

  /* Spaces after the JSON are insignificant to every parser; padding makes
   * the data section start on a 4 KiB boundary for direct I/O. */
  uint64_t json_len = b.len - 8;
  uint64_t padded = (8 + json_len + SD_HEADER_ALIGN - 1) / SD_HEADER_ALIGN * SD_HEADER_ALIGN - 8;
  if (padded > SD_HEADER_MAX) {
    free(b.p);
    return sd_fail(err, SHARDD_E_LIMIT,
                   "%s: header of %llu bytes (%zu tensors) exceeds the format's limit of %llu bytes",
                   f->name, (unsigned long long)padded, n, (unsigned long long)SD_HEADER_MAX);
  }
  sd_buf_reserve(&b, padded - json_len);
  if (b.oom) {
    free(b.p);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding the header of %s", f->name);
  }
  memset(b.p + b.len, ' ', padded - json_len);
  b.len += padded - json_len;
  for (int i = 0; i < 8; i++) b.p[i] = (char)(unsigned char)(padded >> (8 * i));

  f->header = b.p;
  f->header_size = 8 + padded;
  f->data_size = off;
  f->file_size = f->header_size + off;
  for (size_t i = 0; i < n; i++) {
    sd_plan_loc *l = &loc[f->tensors[i]];
    l->file_offset = f->header_size + l->data_begin;
  }
  return 0;
}
