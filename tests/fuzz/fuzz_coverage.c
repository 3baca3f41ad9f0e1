/* libFuzzer target: sd_coverage_check against a brute-force element grid (small shapes) and box algebra (any shape). */
#include <inttypes.h>
#include <string.h>

#include "fuzz_util.h"
#include "sd_format.h"
#include "sd_layout.h"

#define MAX_BOXES 1024   /* room for grids past the checker's 256 stack boxes, plus edits */
#define GRID_BOXES 512   /* cells a generated grid may have: keeps each run in milliseconds */
#define GRID_MAX 4096    /* elements the brute force walks */

typedef struct {
  uint32_t ndim;
  uint64_t shape[SD_MAX_DIMS];
  size_t n;
  sd_box boxes[MAX_BOXES];
} cov_case;

/* ------------------------------------------------------------------------ *
 * Decoding bytes into a case
 * ------------------------------------------------------------------------ */
/* Small shapes, boxes anywhere (outside the shape and empty ones too). */
static void decode_random(fuzz_bytes *in, cov_case *c) {
  c->ndim = fuzz_u8(in) % 5;
  for (uint32_t d = 0; d < c->ndim; d++) c->shape[d] = fuzz_u8(in) % 6;
  c->n = fuzz_u8(in) % 24;
  for (size_t i = 0; i < c->n; i++)
    for (uint32_t d = 0; d < c->ndim; d++) {
      c->boxes[i].start[d] = fuzz_u8(in) % (c->shape[d] + 2);
      c->boxes[i].count[d] = fuzz_u8(in) % (c->shape[d] + 2);
    }
}

/* A grid tiling (a valid cover), scaled by `scale`, then edited: boxes
 * dropped, replicated, nudged or reordered. */
static void decode_grid(fuzz_bytes *in, cov_case *c, uint64_t scale) {
  c->ndim = 1 + fuzz_u8(in) % 4;
  uint64_t cut[SD_MAX_DIMS][8];
  size_t ncut[SD_MAX_DIMS];
  size_t total = 1;
  for (uint32_t d = 0; d < c->ndim; d++) {
    uint64_t s = 1 + fuzz_u8(in) % 6;
    uint8_t mask = fuzz_u8(in);
    if (total * (size_t)__builtin_popcount(mask & 0x3e & ((1u << s) - 1)) + total > GRID_BOXES) mask = 0;
    ncut[d] = 0;
    cut[d][ncut[d]++] = 0;
    for (uint64_t p = 1; p < s; p++)
      if (mask & (1u << p)) cut[d][ncut[d]++] = p * scale;
    cut[d][ncut[d]] = s * scale;
    c->shape[d] = s * scale;
    total *= ncut[d];
  }
  c->n = 0;
  for (size_t k = 0; k < total && c->n < MAX_BOXES; k++) {
    size_t r = k;
    sd_box *b = &c->boxes[c->n++];
    for (uint32_t d = c->ndim; d-- > 0;) {
      size_t j = r % ncut[d];
      r /= ncut[d];
      b->start[d] = cut[d][j];
      b->count[d] = cut[d][j + 1] - cut[d][j];
    }
  }
  unsigned edits = fuzz_u8(in) % 5;
  for (unsigned e = 0; e < edits && c->n; e++) {
    unsigned op = fuzz_u8(in) % 5;
    size_t i = fuzz_u8(in) % c->n, j = fuzz_u8(in) % c->n;
    uint32_t d = fuzz_u8(in) % c->ndim;
    switch (op) {
    case 0: /* drop: a gap */
      c->boxes[i] = c->boxes[--c->n];
      break;
    case 1: /* replicate: still a cover */
      if (c->n < MAX_BOXES) c->boxes[c->n++] = c->boxes[i];
      break;
    case 2: { /* nudge one edge: overlap, gap or out of shape */
      uint8_t how = fuzz_u8(in);
      uint64_t *v = how & 1 ? &c->boxes[i].start[d] : &c->boxes[i].count[d];
      if (how & 2)
        *v += 1 + (how >> 2) % 3 * scale;
      else if (*v)
        *v -= 1;
      break;
    }
    case 4: /* an uneven split's empty slice: box i cut to no width somewhere along d */
      if (c->n < MAX_BOXES) {
        sd_box *b = &c->boxes[c->n++];
        *b = c->boxes[i];
        b->start[d] += j % (b->count[d] + 1);
        b->count[d] = 0;
      }
      break;
    default: { /* reorder */
      sd_box t = c->boxes[i];
      c->boxes[i] = c->boxes[j];
      c->boxes[j] = t;
    }
    }
  }
}

/* Any 64-bit values: overflow and limit paths, no brute force. */
static uint64_t wide(fuzz_bytes *in) {
  uint64_t v = fuzz_u64(in);
  return v >> (fuzz_u8(in) % 64);
}

static void decode_wide(fuzz_bytes *in, cov_case *c) {
  c->ndim = fuzz_u8(in) % (SD_MAX_DIMS + 2); /* one past the limit too */
  for (uint32_t d = 0; d < c->ndim && d < SD_MAX_DIMS; d++) c->shape[d] = wide(in);
  c->n = fuzz_u8(in) % 48;
  for (size_t i = 0; i < c->n; i++)
    for (uint32_t d = 0; d < c->ndim && d < SD_MAX_DIMS; d++) {
      c->boxes[i].start[d] = wide(in);
      c->boxes[i].count[d] = wide(in);
    }
}

/* ------------------------------------------------------------------------ *
 * Box algebra
 * ------------------------------------------------------------------------ */
static int in_shape(const cov_case *c, const sd_box *b) {
  for (uint32_t d = 0; d < c->ndim; d++)
    if (b->start[d] > c->shape[d] || b->count[d] > c->shape[d] - b->start[d]) return 0;
  return 1;
}

static int same(const cov_case *c, const sd_box *a, const sd_box *b) {
  for (uint32_t d = 0; d < c->ndim; d++)
    if (a->start[d] != b->start[d] || a->count[d] != b->count[d]) return 0;
  return 1;
}

/* Boxes inside the shape, so no sum overflows. */
static int overlap(const cov_case *c, const sd_box *a, const sd_box *b) {
  for (uint32_t d = 0; d < c->ndim; d++)
    if (a->start[d] >= b->start[d] + b->count[d] || b->start[d] >= a->start[d] + a->count[d]) return 0;
  return 1;
}

static int contains(const cov_case *c, const sd_box *b, const uint64_t *e) {
  for (uint32_t d = 0; d < c->ndim; d++)
    if (e[d] < b->start[d] || e[d] - b->start[d] >= b->count[d]) return 0;
  return 1;
}

static unsigned __int128 volume(uint32_t ndim, const uint64_t *v) {
  unsigned __int128 p = 1;
  for (uint32_t d = 0; d < ndim; d++) {
    if (v[d] == 0) return 0;
    if (p > ((unsigned __int128)1 << 100)) return (unsigned __int128)1 << 101; /* "huge", no wrap */
    p *= v[d];
  }
  return p;
}

static void fmt_box(char *buf, size_t cap, const cov_case *c, const sd_box *b) {
  char s[96], k[96];
  snprintf(buf, cap, "start=%s count=%s", sd_fmt_dims(s, sizeof s, c->ndim, b->start),
           sd_fmt_dims(k, sizeof k, c->ndim, b->count));
}

/* The first identical box leads its group; an empty box of a non-empty
 * tensor covers nothing and is never kept. */
static void ref_keep(const cov_case *c, int nonempty_tensor, uint8_t *keep) {
  for (size_t i = 0; i < c->n; i++) {
    keep[i] = 1;
    for (uint32_t d = 0; nonempty_tensor && d < c->ndim; d++)
      if (c->boxes[i].count[d] == 0) keep[i] = 0;
    for (size_t j = 0; j < i && keep[i]; j++)
      if (same(c, &c->boxes[i], &c->boxes[j])) keep[i] = 0;
  }
}

/* ------------------------------------------------------------------------ *
 * Checks that hold for every shape
 * ------------------------------------------------------------------------ */
static void check_any(const cov_case *c, int rc, const sd_error *err, const uint8_t *keep) {
  static uint8_t rk[MAX_BOXES];
  int shape_ok = c->ndim <= SD_MAX_DIMS;
  for (uint32_t d = 0; shape_ok && d < c->ndim; d++) shape_ok = c->shape[d] <= (uint64_t)INT64_MAX;
  if (shape_ok) {
    /* numel is checked ignoring zero dimensions */
    unsigned __int128 nz = 1;
    for (uint32_t d = 0; d < c->ndim && nz <= INT64_MAX; d++)
      if (c->shape[d]) nz *= c->shape[d];
    shape_ok = nz <= INT64_MAX;
  }
  int boxes_in = 1;
  for (size_t i = 0; shape_ok && i < c->n; i++) boxes_in &= in_shape(c, &c->boxes[i]);

  if (!shape_ok || !boxes_in) {
    FUZZ_CHECK(rc == SHARDD_E_INVALID_ARGUMENT, "bad shape or box outside accepted: rc %d %s", rc, err->msg);
    return;
  }
  unsigned __int128 numel = volume(c->ndim, c->shape);
  if (c->ndim == 0) {
    FUZZ_CHECK(rc == (c->n ? 0 : SHARDD_E_GAP), "scalar with %zu boxes: rc %d %s", c->n, rc, err->msg);
    for (size_t i = 0; rc == 0 && i < c->n; i++) FUZZ_CHECK(keep[i] == (i == 0), "scalar keep[%zu]", i);
    return;
  }
  ref_keep(c, numel > 0, rk);
  if (numel == 0) {
    FUZZ_CHECK(rc == 0, "zero-size tensor refused: %s", err->msg);
  }
  FUZZ_CHECK(rc == 0 || rc == SHARDD_E_OVERLAP || rc == SHARDD_E_GAP, "rc %d: %s", rc, err->msg);
  if (rc == 0) {
    for (size_t i = 0; i < c->n; i++) FUZZ_CHECK(keep[i] == rk[i], "keep[%zu] %d, expected %d", i, keep[i], rk[i]);
    if (numel == 0) return;
    unsigned __int128 sum = 0;
    for (size_t i = 0; i < c->n; i++) {
      if (!rk[i]) continue;
      sum += volume(c->ndim, c->boxes[i].count);
      for (size_t j = 0; j < i; j++)
        FUZZ_CHECK(!rk[j] || !overlap(c, &c->boxes[i], &c->boxes[j]), "boxes %zu and %zu overlap yet accepted", j, i);
    }
    FUZZ_CHECK(sum == numel, "accepted boxes hold %llu of %llu elements", (unsigned long long)sum,
               (unsigned long long)numel);
    return;
  }
  int any_overlap = 0;
  char want[512], b1[200], b2[200];
  for (size_t i = 0; i < c->n; i++)
    for (size_t j = 0; j < i; j++)
      if (rk[i] && rk[j] && overlap(c, &c->boxes[i], &c->boxes[j])) {
        any_overlap = 1;
        if (rc == SHARDD_E_OVERLAP) {
          fmt_box(b1, sizeof b1, c, &c->boxes[j]);
          fmt_box(b2, sizeof b2, c, &c->boxes[i]);
          snprintf(want, sizeof want, "box %s overlaps box %s", b1, b2);
          if (strstr(err->msg, want)) return; /* names a real pair */
        }
      }
  if (rc == SHARDD_E_OVERLAP) FUZZ_CHECK(0, "overlap reported, no overlapping pair named: %s", err->msg);
  FUZZ_CHECK(!any_overlap, "partial overlap reported as a gap: %s", err->msg);
  /* A gap: the element named must be inside the shape and in no box. */
  const char *p = strstr(err->msg, "element [");
  FUZZ_CHECK(p, "gap without an element: %s", err->msg);
  if (strstr(p, "...]")) return; /* too long to be shown in full */
  p += strlen("element [");
  uint64_t e[SD_MAX_DIMS];
  for (uint32_t d = 0; d < c->ndim; d++) {
    char *end;
    e[d] = strtoull(p, &end, 10);
    FUZZ_CHECK(end != p && (*end == ',' || *end == ']'), "cannot read the gap element: %s", err->msg);
    FUZZ_CHECK(e[d] < c->shape[d], "gap element outside the shape: %s", err->msg);
    p = end + 1;
  }
  for (size_t i = 0; i < c->n; i++)
    FUZZ_CHECK(!contains(c, &c->boxes[i], e), "gap element is covered by box %zu: %s", i, err->msg);
}

/* ------------------------------------------------------------------------ *
 * Brute force over every element (small shapes)
 * ------------------------------------------------------------------------ */
static void check_grid(const cov_case *c, int rc, const sd_error *err) {
  static uint8_t rk[MAX_BOXES];
  static uint16_t cov[GRID_MAX];
  uint64_t numel = 1;
  for (uint32_t d = 0; d < c->ndim; d++) numel *= c->shape[d];
  if (c->ndim == 0 || numel == 0 || rc == SHARDD_E_INVALID_ARGUMENT) return; /* check_any settled these */
  ref_keep(c, 1, rk);
  memset(cov, 0, numel * sizeof cov[0]);
  for (size_t i = 0; i < c->n; i++) {
    const sd_box *b = &c->boxes[i];
    if (!rk[i]) continue;
    /* Odometer over the box's own elements (boxes are inside the shape). */
    uint64_t e[SD_MAX_DIMS];
    memcpy(e, b->start, sizeof e);
    for (;;) {
      uint64_t k = 0;
      for (uint32_t d = 0; d < c->ndim; d++) k = k * c->shape[d] + e[d];
      cov[k]++;
      uint32_t d = c->ndim;
      while (d-- > 0 && ++e[d] == b->start[d] + b->count[d]) e[d] = b->start[d];
      if (d == UINT32_MAX) break;
    }
  }
  int over = 0;
  uint64_t hole = UINT64_MAX;
  for (uint64_t k = 0; k < numel; k++) {
    over |= cov[k] > 1;
    if (!cov[k] && hole == UINT64_MAX) hole = k;
  }
  if (over) {
    FUZZ_CHECK(rc == SHARDD_E_OVERLAP, "grid has an overlap, checker rc %d: %s", rc, err->msg);
  } else if (hole != UINT64_MAX) {
    FUZZ_CHECK(rc == SHARDD_E_GAP, "grid has a hole at %" PRIu64 ", checker rc %d: %s", hole, rc, err->msg);
    uint64_t e[SD_MAX_DIMS];
    for (uint32_t d = c->ndim; d-- > 0;) {
      e[d] = hole % c->shape[d];
      hole /= c->shape[d];
    }
    char dims[128], want[160];
    snprintf(want, sizeof want, "element %s is not covered", sd_fmt_dims(dims, sizeof dims, c->ndim, e));
    FUZZ_CHECK(strstr(err->msg, want), "first hole is %s; checker says: %s", dims, err->msg);
  } else {
    FUZZ_CHECK(rc == 0, "grid is an exact cover, checker rc %d: %s", rc, err->msg);
  }
}

/* Byte 0 picks the decoder and whether keep[] is passed. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static cov_case c;
  static uint8_t keep[MAX_BOXES];
  fuzz_bytes in = {data, size};
  uint8_t ctl = fuzz_u8(&in);
  memset(&c, 0, sizeof c);
  int small = 1;
  switch (ctl % 4) {
  case 0:
    decode_random(&in, &c);
    break;
  case 1:
    decode_grid(&in, &c, 1);
    break;
  case 2:
    decode_grid(&in, &c, 1 + (fuzz_u64(&in) >> (fuzz_u8(&in) % 64)));
    small = 0;
    break;
  default:
    decode_wide(&in, &c);
    small = 0;
  }
  int pass_keep = !(ctl & 4);
  memset(keep, 0xAA, sizeof keep);
  sd_error err = {0};
  int rc = sd_coverage_check("t", c.ndim, c.shape, c.boxes, c.n, pass_keep ? keep : NULL, &err);
  FUZZ_CHECK(rc <= 0 && (rc == 0 || err.code == rc), "rc %d, err.code %d", rc, err.code);
  if (rc) FUZZ_CHECK(err.msg[0] && sd_utf8_valid(err.msg, strlen(err.msg), NULL), "bad message: %s", err.msg);
  if (pass_keep) {
    check_any(&c, rc, &err, keep);
  } else {
    /* Without keep[] only the verdict can be compared; rerun with it. */
    sd_error e2 = {0};
    int rc2 = sd_coverage_check("t", c.ndim, c.shape, c.boxes, c.n, keep, &e2);
    FUZZ_CHECK(rc2 == rc && strcmp(err.msg, e2.msg) == 0, "keep=NULL gives %d '%s', keep gives %d '%s'", rc,
               err.msg, rc2, e2.msg);
    check_any(&c, rc, &err, keep);
  }
  if (small) check_grid(&c, rc, &err);
  return 0;
}
