/* Tensor names, element counts and byte sizes (overflow-checked), natural order, fast name sorting, big arrays, dims formatting. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sd_format.h"
#include "sd_layout.h"

const char *sd_fmt_dims(char *buf, size_t cap, uint32_t ndim, const uint64_t *v) {
  size_t o = 0;
  if (cap < 8) {
    if (cap) buf[0] = '\0';
    return buf;
  }
  buf[o++] = '[';
  for (uint32_t i = 0; i < ndim; i++) {
    char num[24];
    int k = snprintf(num, sizeof num, "%s%llu", i ? "," : "", (unsigned long long)v[i]);
    if (o + (size_t)k + 5 > cap) {
      memcpy(buf + o, "...", 3);
      o += 3;
      break;
    }
    memcpy(buf + o, num, (size_t)k);
    o += (size_t)k;
  }
  buf[o++] = ']';
  buf[o] = '\0';
  return buf;
}

/* ------------------------------------------------------------------------ *
 * Big arrays
 * ------------------------------------------------------------------------ */
#define HUGE_PAGE (2u << 20)

void *sd_big_alloc(size_t n) {
  if (n < SD_BIG_ALLOC_MIN) return malloc(n);
  /* Whole huge pages, so the tail is not left to thousands of small
   * faults either. */
  if (n > SIZE_MAX - HUGE_PAGE) return NULL;
  n = (n + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
  void *p;
  if (posix_memalign(&p, HUGE_PAGE, n) != 0) return NULL;
  /* Advice only: where transparent huge pages are off or refused, this is
   * plain malloc'd memory. */
#ifdef MADV_HUGEPAGE
  madvise(p, n, MADV_HUGEPAGE);
#endif
  return p;
}

/* ------------------------------------------------------------------------ *
 * Names
 * ------------------------------------------------------------------------ */
int sd_name_check(const char *name, size_t len, sd_error *err) {
  char shown[SD_MSGNAME_MAX];
  if (!name) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor name is missing");
  if (len == 0) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor name is empty");
  if (len > SD_NAME_MAX)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "tensor name '%s' is %zu bytes, over the %d-byte limit",
                   sd_msgstr(shown, sizeof shown, name, len), len, SD_NAME_MAX);
  const unsigned char *u = (const unsigned char *)name;
  for (size_t i = 0; i < len; i++) {
    /* DEL is refused with the C0 controls: it is invisible in every listing. */
    if (u[i] < 0x20 || u[i] == 0x7F) {
      if (u[i] == 0)
        return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                       "tensor name '%s' contains a NUL byte at byte %zu",
                       sd_msgstr(shown, sizeof shown, name, i), i);
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                     "tensor name '%s' contains control character 0x%02x at byte %zu",
                     sd_msgstr(shown, sizeof shown, name, i), u[i], i);
    }
  }
  size_t bad = 0;
  if (!sd_utf8_valid(name, len, &bad))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "tensor name '%s' is not valid UTF-8 at byte %zu",
                   sd_msgstr(shown, sizeof shown, name, bad), bad);
  if (len == 12 && memcmp(name, "__metadata__", 12) == 0)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "tensor name '__metadata__' is reserved by the safetensors format");
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Sizes
 * ------------------------------------------------------------------------ */

/* Readers (jansson, serde_json, Python) handle integers up to INT64_MAX, and
 * a zero dimension must not hide an overflowing product from a reader that
 * multiplies in another order, so the product of the non-zero dimensions is
 * what must fit. */
int sd_tensor_numel(const char *name, uint32_t ndim, const uint64_t *shape, uint64_t *numel,
                    sd_error *err) {
  char shown[SD_MSGNAME_MAX], dims[128];
  const char *nm = name ? name : "";
  if (ndim > SD_MAX_DIMS)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': %u dimensions, over the limit of %d",
                   sd_msgstr(shown, sizeof shown, nm, strlen(nm)), ndim, SD_MAX_DIMS);
  uint64_t nz = 1;
  int zero = 0;
  for (uint32_t i = 0; i < ndim; i++) {
    if (shape[i] > (uint64_t)INT64_MAX)
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                     "tensor '%s': dimension %u (%llu) is too large",
                     sd_msgstr(shown, sizeof shown, nm, strlen(nm)), i,
                     (unsigned long long)shape[i]);
    if (shape[i] == 0) {
      zero = 1;
      continue;
    }
    if (__builtin_mul_overflow(nz, shape[i], &nz) || nz > (uint64_t)INT64_MAX)
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                     "tensor '%s': shape %s has too many elements",
                     sd_msgstr(shown, sizeof shown, nm, strlen(nm)),
                     sd_fmt_dims(dims, sizeof dims, ndim, shape));
  }
  if (numel) *numel = zero ? 0 : nz;
  return 0;
}

int sd_tensor_nbytes(const sd_tensor *t, uint64_t *nbytes, sd_error *err) {
  char shown[SD_MSGNAME_MAX], dims[128];
  const char *nm = t->name ? t->name : "";
  unsigned es = sd_dtype_size(t->dtype);
  if (!es)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': invalid dtype %d",
                   sd_msgstr(shown, sizeof shown, nm, strlen(nm)), (int)t->dtype);
  uint64_t n;
  int rc = sd_tensor_numel(t->name, t->ndim, t->shape, &n, err);
  if (rc) return rc;
  /* Same order-independence as numel: a zero dimension must not excuse
   * a byte size that would overflow if computed the other way round. */
  uint64_t nz = 1;
  for (uint32_t i = 0; i < t->ndim; i++)
    if (t->shape[i]) nz *= t->shape[i]; /* cannot overflow: checked in numel */
  uint64_t b;
  if (__builtin_mul_overflow(nz, (uint64_t)es, &b) || b > (uint64_t)INT64_MAX)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': byte size of %s%s overflows",
                   sd_msgstr(shown, sizeof shown, nm, strlen(nm)), sd_dtype_name(t->dtype),
                   sd_fmt_dims(dims, sizeof dims, t->ndim, t->shape));
  if (nbytes) *nbytes = n ? b : 0;
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Natural order
 * ------------------------------------------------------------------------ */
static inline int is_digit(unsigned char c) { return (unsigned)c - '0' < 10u; }

/* Strings are compared as sequences of tokens: a run of digits is one token
 * ordered by its numeric value, any other byte is a token ordered by value
 * (a digit run against a byte compares as its first digit would). When the
 * token sequences are equal the first difference in leading zeros decides
 * (fewer zeros first), so the order is total: 0 only for equal strings. */
int sd_natural_cmp(const char *a, const char *b) {
  const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
  size_t i = 0;
  /* Skip the identical prefix, then step back to the start of a digit run
   * we may have entered: "a12" vs "a100" must compare 12 with 100. */
  while (x[i] && x[i] == y[i]) i++;
  if (x[i] == y[i]) return 0;
  while (i > 0 && is_digit(x[i - 1])) i--;
  x += i;
  y += i;
  int tie = 0;
  for (;;) {
    unsigned char cx = *x, cy = *y;
    if (is_digit(cx) && is_digit(cy)) {
      const unsigned char *px = x, *py = y;
      while (*px == '0') px++;
      while (*py == '0') py++;
      size_t zx = (size_t)(px - x), zy = (size_t)(py - y);
      const unsigned char *ex = px, *ey = py;
      while (is_digit(*ex)) ex++;
      while (is_digit(*ey)) ey++;
      size_t lx = (size_t)(ex - px), ly = (size_t)(ey - py);
      if (lx != ly) return lx < ly ? -1 : 1;
      for (size_t k = 0; k < lx; k++)
        if (px[k] != py[k]) return px[k] < py[k] ? -1 : 1;
      if (!tie && zx != zy) tie = zx < zy ? -1 : 1;
      x = ex;
      y = ey;
      continue;
    }
    if (cx != cy) {
      if (!cx) return -1;
      if (!cy) return 1;
      return cx < cy ? -1 : 1;
    }
    if (!cx) return tie;
    x++;
    y++;
  }
}

/* ------------------------------------------------------------------------ *
 * Sort keys
 * ------------------------------------------------------------------------ */
size_t sd_natural_key_max(size_t len) { return 4 * len + 4; }

/* Byte order of the keys is sd_natural_cmp's order: a digit run becomes the
 * marker '0' (which sorts against other bytes as any digit does), its
 * significant-digit count as two big-endian bytes, and those digits; after
 * a 0x00 separator (below every byte a name may hold) come the runs'
 * leading-zero counts, the tie-break. */
size_t sd_natural_key(const char *name, size_t len, unsigned char *out) {
  const unsigned char *s = (const unsigned char *)name;
  size_t o = 0, i = 0, nruns = 0;
  while (i < len) {
    if (!is_digit(s[i])) {
      out[o++] = s[i++];
      continue;
    }
    size_t z = i;
    while (z < len && s[z] == '0') z++;
    size_t e = z;
    while (e < len && is_digit(s[e])) e++;
    size_t sig = e - z;
    out[o++] = '0';
    out[o++] = (unsigned char)(sig >> 8);
    out[o++] = (unsigned char)sig;
    memcpy(out + o, s + z, sig);
    o += sig;
    nruns++;
    i = e;
  }
  out[o++] = 0;
  /* Zero counts go after every token, so they are re-scanned here rather
   * than buffered. A run of r digits costs at most r + 5 key bytes in all,
   * and runs are at least 2 bytes apart, hence 4 * len + 4. */
  for (i = 0; i < len && nruns;) {
    if (!is_digit(s[i])) {
      i++;
      continue;
    }
    size_t z = i;
    while (z < len && s[z] == '0') z++;
    size_t zeros = z - i;
    out[o++] = (unsigned char)(zeros >> 8);
    out[o++] = (unsigned char)zeros;
    while (z < len && is_digit(s[z])) z++;
    i = z;
  }
  return o;
}

/* MSD radix sort on 8-byte chunks: at each depth every key contributes its
 * next 8 bytes (zero padded) plus how many bytes it has left (capped at 9,
 * so a key that ends sorts before a longer one with the same chunk); groups
 * that still agree and continue are sorted again 8 bytes deeper. Each level
 * is a stable LSD byte radix, so equal keys keep their input order. Shared
 * prefixes (every name starting "model.layers.") cost one pass per 8 bytes
 * instead of a re-comparison in every one of n log n comparisons. */
typedef struct {
  uint64_t chunk;
  const unsigned char *key; /* carried here, not looked up: saves a miss per key per level */
  uint32_t len;
  uint32_t idx : 28;
  uint32_t cls : 4;
} skw;

static uint64_t load_chunk(const skw *k, size_t depth, unsigned *cls) {
  size_t left = k->len - depth;
  uint64_t v = 0;
  if (left >= 8) {
    memcpy(&v, k->key + depth, 8);
    *cls = left > 8 ? 9 : 8;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return __builtin_bswap64(v);
#else
    return v;
#endif
  }
  for (size_t j = 0; j < left; j++) v |= (uint64_t)k->key[depth + j] << (56 - 8 * j);
  *cls = (unsigned)left;
  return v;
}

static int skw_less(const skw *x, const skw *y, size_t depth) {
  size_t lx = x->len - depth, ly = y->len - depth, m = lx < ly ? lx : ly;
  int c = memcmp(x->key + depth, y->key + depth, m);
  if (c) return c < 0;
  return lx < ly;
}

static void radix_level(skw *w, skw *tmp, size_t n, size_t depth) {
  for (;;) {
    if (n <= 24) {
      for (size_t i = 1; i < n; i++) {
        skw x = w[i];
        size_t j = i;
        while (j > 0 && skw_less(&x, &w[j - 1], depth)) {
          w[j] = w[j - 1];
          j--;
        }
        w[j] = x;
      }
      return;
    }
    for (size_t i = 0; i < n; i++) {
      /* Keys are scattered in memory: fetch a few ahead of use. */
      if (i + 8 < n) __builtin_prefetch(w[i + 8].key + depth);
      unsigned cls;
      w[i].chunk = load_chunk(&w[i], depth, &cls);
      w[i].cls = cls & 15;
    }

    /* 9 byte digits: cls (least significant), then the chunk LSB first. */
    static _Thread_local size_t cnt[9][256], pos[256];
    memset(cnt, 0, sizeof cnt);
    for (size_t i = 0; i < n; i++) {
      cnt[0][w[i].cls]++;
      uint64_t c = w[i].chunk;
      for (int d = 1; d < 9; d++, c >>= 8) cnt[d][c & 0xFF]++;
    }
    int passes = 0;
    skw *src = w, *dst = tmp;
    for (int d = 0; d < 9; d++) {
      unsigned digit0 = d == 0 ? w[0].cls : (unsigned)(w[0].chunk >> (8 * (d - 1))) & 0xFF;
      if (cnt[d][digit0] == n) continue; /* every key has the same byte here */
      size_t acc = 0;
      for (int b = 0; b < 256; b++) {
        pos[b] = acc;
        acc += cnt[d][b];
      }
      for (size_t i = 0; i < n; i++) {
        unsigned dg = d == 0 ? src[i].cls : (unsigned)(src[i].chunk >> (8 * (d - 1))) & 0xFF;
        dst[pos[dg]++] = src[i];
      }
      skw *x = src;
      src = dst;
      dst = x;
      passes++;
    }
    if (src != w) memcpy(w, src, n * sizeof *w);
    if (passes == 0) {
      /* One group: descend without recursion (long shared prefixes). */
      if (w[0].cls < 9) return; /* identical keys */
      depth += 8;
      continue;
    }
    for (size_t s = 0; s < n;) {
      size_t e = s + 1;
      while (e < n && w[e].chunk == w[s].chunk && w[e].cls == w[s].cls) e++;
      if (e - s > 1 && w[s].cls == 9) radix_level(w + s, tmp + s, e - s, depth + 8);
      s = e;
    }
    return;
  }
}

static int key_less(const sd_skey *a, const sd_skey *b) {
  uint32_t m = a->len < b->len ? a->len : b->len;
  int c = memcmp(a->key, b->key, m);
  return c < 0 || (c == 0 && a->len < b->len);
}

/* Three-way compare: memcmp, then the shorter key first. */
static inline int key_cmp(const sd_skey *a, const sd_skey *b) {
  uint32_t m = a->len < b->len ? a->len : b->len;
  int c = memcmp(a->key, b->key, m);
  if (c) return c;
  return a->len < b->len ? -1 : a->len > b->len;
}

/* Input that is already a few sorted runs (the index walks files that are
 * each sorted, the walk of a checkpoint saved in order) is merged in
 * place of a full radix sort, all runs at once through a small heap of
 * their heads: comparisons only ever touch the runs' current heads, so each
 * key's bytes come from memory once, where merging two runs at a time
 * would fetch them again in every pass. Ties go to the earlier run, which
 * keeps the merge stable. */
#define MERGE_RUNS_MAX 32

typedef struct {
  const sd_skey *v;
  size_t pos[MERGE_RUNS_MAX], end[MERGE_RUNS_MAX];
} run_heap;

static inline int head_less(const run_heap *h, uint32_t a, uint32_t b) {
  int c = key_cmp(&h->v[h->pos[a]], &h->v[h->pos[b]]);
  return c < 0 || (c == 0 && a < b);
}

static void sift_down(const run_heap *h, uint32_t *heap, size_t hn, size_t i) {
  uint32_t x = heap[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= hn) break;
    if (c + 1 < hn && head_less(h, heap[c + 1], heap[c])) c++;
    if (!head_less(h, heap[c], x)) break;
    heap[i] = heap[c];
    i = c;
  }
  heap[i] = x;
}

static void merge_runs(sd_skey *v, size_t n, const size_t *start, size_t runs, sd_skey *tmp) {
  run_heap h;
  uint32_t heap[MERGE_RUNS_MAX];
  size_t hn = 0;
  h.v = v;
  for (size_t r = 0; r < runs; r++) {
    h.pos[r] = start[r];
    h.end[r] = r + 1 < runs ? start[r + 1] : n;
    if (h.pos[r] < h.end[r]) heap[hn++] = (uint32_t)r;
  }
  for (size_t i = hn / 2; i-- > 0;) sift_down(&h, heap, hn, i);
  for (size_t o = 0; o < n; o++) {
    uint32_t r = heap[0];
    tmp[o] = v[h.pos[r]++];
    if (h.pos[r] + 4 < h.end[r]) __builtin_prefetch(v[h.pos[r] + 4].key);
    if (h.pos[r] == h.end[r]) heap[0] = heap[--hn];
    if (hn > 1) sift_down(&h, heap, hn, 0);
  }
  memcpy(v, tmp, n * sizeof *v);
}

size_t sd_sort_keys_scratch(size_t n) { return 2 * n * sizeof(skw); }

int sd_sort_keys_in(sd_skey *v, size_t n, void *scratch, size_t scratch_size) {
  if (n < 2) return 0;
  size_t start[MERGE_RUNS_MAX], runs = 1;
  start[0] = 0;
  for (size_t i = 1; i < n && runs <= MERGE_RUNS_MAX; i++)
    if (key_less(&v[i], &v[i - 1])) {
      if (runs < MERGE_RUNS_MAX) start[runs] = i;
      runs++;
    }
  if (runs == 1) return 0;
  if (runs > MERGE_RUNS_MAX && n >= (1u << 28)) return SHARDD_E_LIMIT;
  size_t need = runs <= MERGE_RUNS_MAX ? n * sizeof *v : sd_sort_keys_scratch(n);
  void *own = NULL;
  if (!scratch || scratch_size < need) {
    scratch = own = sd_big_alloc(need);
    if (!own) return SHARDD_E_NO_MEMORY;
  }
  if (runs <= MERGE_RUNS_MAX) {
    merge_runs(v, n, start, runs, scratch);
  } else {
    skw *w = scratch;
    for (size_t i = 0; i < n; i++)
      w[i] = (skw){0, v[i].key, v[i].len, v[i].idx & ((1u << 28) - 1), 0};
    radix_level(w, w + n, n, 0);
    for (size_t i = 0; i < n; i++) v[i] = (sd_skey){w[i].key, w[i].len, w[i].idx};
  }
  free(own);
  return 0;
}

int sd_sort_keys(sd_skey *v, size_t n) { return sd_sort_keys_in(v, n, NULL, 0); }
