/* A puts line of the shape libshardd writes, read in one pass without a JSON tree: jansson's objects, hash tables and frees cost the daemon about 3 us a slice; anything else is left to the JSON reader. */
#include <stdlib.h>
#include <string.h>

#include "sd_grow.h"
#include "sd_puts_scan.h"

typedef struct {
  const char *p, *end;
  char *pool;
  size_t pool_at;
} scan;

static void ws(scan *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int lit(scan *s, char c) {
  ws(s);
  if (s->p < s->end && *s->p == c) {
    s->p++;
    return 1;
  }
  return 0;
}

/* A string of printable ASCII with no escapes (so valid UTF-8 with no NUL, read as jansson reads
 * it): its bytes in *b, *n; 0 for any other string or token. */
static int raw_str(scan *s, const char **b, size_t *n) {
  if (!lit(s, '"')) return 0;
  const char *start = s->p;
  for (; s->p < s->end && *s->p != '"'; s->p++) {
    unsigned char c = (unsigned char)*s->p;
    if (c < 0x20 || c > 0x7E || c == '\\') return 0;
  }
  if (s->p >= s->end) return 0;
  *b = start;
  *n = (size_t)(s->p - start);
  s->p++;
  return 1;
}

/* The same, copied into the pool with a NUL: each string takes no more there than its quotes and
 * bytes take in the line. */
static const char *str(scan *s, size_t *len) {
  const char *b;
  size_t n;
  if (!raw_str(s, &b, &n)) return NULL;
  char *o = s->pool + s->pool_at;
  memcpy(o, b, n);
  o[n] = 0;
  s->pool_at += n + 1;
  if (len) *len = n;
  return o;
}

/* A key and its colon. */
static int key(scan *s, const char **b, size_t *n) { return raw_str(s, b, n) && lit(s, ':'); }

/* A non-negative integer of at most 15 digits (below 2^53: exact in a double, within every field's
 * bound), written as JSON writes it: no sign, fraction, exponent or leading zero. */
static int num(scan *s, uint64_t *v) {
  ws(s);
  const char *b = s->p;
  uint64_t x = 0;
  while (s->p < s->end && *s->p >= '0' && *s->p <= '9' && s->p - b < 16) x = x * 10 + (uint64_t)(*s->p++ - '0');
  size_t n = (size_t)(s->p - b);
  if (n == 0 || n > 15 || (n > 1 && *b == '0')) return 0;
  if (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E' || (*s->p >= '0' && *s->p <= '9'))) return 0;
  *v = x;
  return 1;
}

static int dims(scan *s, uint64_t *v, uint32_t *n) {
  *n = 0;
  if (!lit(s, '[')) return 0;
  if (lit(s, ']')) return 1;
  do {
    if (*n >= SD_MAX_DIMS || !num(s, &v[*n])) return 0;
    (*n)++;
  } while (lit(s, ','));
  return lit(s, ']');
}

static int word(scan *s, const char *w) {
  size_t n = strlen(w);
  ws(s);
  if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0) return 0;
  s->p += n;
  return 1;
}

static int boolean(scan *s, int *v) {
  if (word(s, "true")) return *v = 1;
  if (word(s, "false")) return (*v = 0) == 0;
  return 0;
}

enum { F_NAME = 1, F_DTYPE = 2, F_SHAPE = 4, F_START = 8, F_COUNT = 16, F_INDEX = 32, F_PREFIX = 64, F_REGION = 128,
       F_OFFSET = 256, F_DEFERRED = 512 };

static unsigned field_of(const char *k, size_t n) {
  static const struct {
    const char *name;
    unsigned f;
  } fields[] = {{"name", F_NAME},     {"dtype", F_DTYPE},   {"shape", F_SHAPE},   {"start", F_START},
                {"count", F_COUNT},   {"index", F_INDEX},   {"prefix", F_PREFIX}, {"region", F_REGION},
                {"offset", F_OFFSET}, {"deferred", F_DEFERRED}};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    if (strlen(fields[i].name) == n && memcmp(fields[i].name, k, n) == 0) return fields[i].f;
  return 0;
}

/* One slice object's fields, each once. */
static int slice_fields(scan *s, sd_puts_slice *o, unsigned *seen, const char **dtype, uint32_t *ns, uint32_t *nc,
                        uint64_t *index) {
  if (!lit(s, '{')) return 0;
  if (lit(s, '}')) return 1;
  do {
    const char *k;
    size_t kn;
    unsigned f = key(s, &k, &kn) ? field_of(k, kn) : 0;
    if (!f || (*seen & f)) return 0;
    *seen |= f;
    int ok;
    switch (f) {
    case F_NAME: ok = (o->t.name = str(s, &o->name_len)) != NULL; break;
    case F_DTYPE: ok = (*dtype = str(s, NULL)) != NULL; break;
    case F_SHAPE: ok = dims(s, o->t.shape, &o->t.ndim); break;
    case F_START: ok = dims(s, o->t.start, ns); break;
    case F_COUNT: ok = dims(s, o->t.count, nc); break;
    case F_INDEX: ok = num(s, index); break;
    case F_PREFIX: ok = (o->t.prefix = str(s, NULL)) != NULL; break;
    case F_REGION: ok = num(s, &o->src.region); break;
    case F_OFFSET: ok = num(s, &o->src.offset); break;
    default: ok = boolean(s, &o->src.deferred); break;
    }
    if (!ok) return 0;
  } while (lit(s, ','));
  return lit(s, '}');
}

/* One slice, judged as sd_req_tensor_parse and sd_req_source_parse judge it: 0 for any slice
 * either would refuse, or that only the JSON reader takes (inline data). */
static int slice(scan *s, sd_puts_slice *o) {
  unsigned seen = 0;
  const char *dtype = NULL;
  uint32_t ns = 0, nc = 0;
  uint64_t index = 0;
  sd_error err;
  memset(o, 0, sizeof *o);
  if (!slice_fields(s, o, &seen, &dtype, &ns, &nc, &index)) return 0;
  sd_req_tensor *t = &o->t;
  if ((seen & (F_NAME | F_DTYPE | F_SHAPE)) != (F_NAME | F_DTYPE | F_SHAPE) ||
      sd_name_check(t->name, o->name_len, &err) != 0 || sd_dtype_parse(dtype, &t->dtype, &err) != 0)
    return 0;
  if (!(seen & F_START) != !(seen & F_COUNT)) return 0;
  if (seen & F_START) {
    if (ns != t->ndim || nc != t->ndim) return 0;
  } else {
    memcpy(t->count, t->shape, sizeof t->count);
  }
  t->index = seen & F_INDEX ? (int64_t)index : -1;
  if (sd_req_tensor_finish(t, &err) != 0) return 0;
  if ((seen & F_REGION) && (seen & F_OFFSET)) {
    o->src.has_region = 1;
    return 1;
  }
  /* Neither: only a slice of no bytes, which reads nothing (and so defers nothing). */
  o->src.deferred = 0;
  return !(seen & (F_REGION | F_OFFSET)) && t->len == 0;
}

enum { T_ID = 1, T_SAVE = 2, T_SLICES = 4 };

static int slices(scan *s, sd_puts_scan *out) {
  if (!lit(s, '[')) return 0;
  if (lit(s, ']')) return 1;
  do {
    if (out->n >= SD_PUTS_MAX || SD_GROW(out->slices, out->cap, out->n + 1, 256) != 0 ||
        !slice(s, &out->slices[out->n]))
      return 0;
    out->n++;
  } while (lit(s, ','));
  return lit(s, ']');
}

/* The request's other fields, after its head. */
static int request(scan *s, sd_puts_scan *out) {
  unsigned seen = 0;
  while (lit(s, ',')) {
    const char *k;
    size_t kn;
    if (!key(s, &k, &kn)) return 0;
    unsigned f = kn == 2 && memcmp(k, "id", 2) == 0         ? T_ID
                 : kn == 4 && memcmp(k, "save", 4) == 0     ? T_SAVE
                 : kn == 6 && memcmp(k, "slices", 6) == 0   ? T_SLICES
                                                            : 0;
    if (!f || (seen & f)) return 0;
    seen |= f;
    uint64_t id = 0;
    int ok = f == T_ID ? num(s, &id) : f == T_SAVE ? (out->save = str(s, NULL)) != NULL : slices(s, out);
    if (!ok) return 0;
    if (f == T_ID) out->id = (int64_t)id;
  }
  if (seen != (T_ID | T_SAVE | T_SLICES) || !lit(s, '}')) return 0;
  ws(s);
  return s->p == s->end;
}

int sd_puts_scan_line(const char *line, size_t len, sd_puts_scan *out) {
  /* libshardd writes "op" first: any other line is left to the JSON reader at once. */
  static const char head[] = "{\"op\":\"puts\"";
  memset(out, 0, sizeof *out);
  if (len < sizeof head - 1 || memcmp(line, head, sizeof head - 1) != 0) return 0;
  scan s = {.p = line + sizeof head - 1, .end = line + len, .pool = malloc(len + 1)};
  out->pool = s.pool;
  if (s.pool && request(&s, out)) return 1;
  sd_puts_scan_free(out);
  return 0;
}

void sd_puts_scan_take(sd_puts_scan *p, char *line, size_t len) {
  p->line = line;
  p->len = len;
}

int sd_puts_scan_fits(const sd_puts_scan *p, size_t max_name_len, size_t max_dims) {
  for (size_t k = 0; k < p->n; k++)
    if (p->slices[k].name_len > max_name_len || p->slices[k].t.ndim > max_dims) return 0;
  return 1;
}

void sd_puts_scan_free(sd_puts_scan *p) {
  free(p->slices);
  free(p->pool);
  free(p->line);
  memset(p, 0, sizeof *p);
}
