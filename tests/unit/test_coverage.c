/* Slice coverage: exact cover, replicas, overlaps and gaps, checked case by case and against a brute-force grid. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"

static sd_box bx(uint32_t ndim, const uint64_t *start, const uint64_t *count) {
  sd_box b;
  memset(&b, 0, sizeof b);
  for (uint32_t i = 0; i < ndim; i++) {
    b.start[i] = start[i];
    b.count[i] = count[i];
  }
  return b;
}
#define B2(s0, s1, c0, c1) bx(2, (uint64_t[]){s0, s1}, (uint64_t[]){c0, c1})

static const uint64_t SH88[2] = {8, 8};

/* ------------------------------------------------------------------------ *
 * Cases
 * ------------------------------------------------------------------------ */
Test(coverage, exact_splits_pass) {
  uint8_t keep[8];
  sd_error err = {0};
  sd_box rows[] = {B2(0, 0, 4, 8), B2(4, 0, 4, 8)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, rows, 2, keep, &err), 0, "%s", err.msg);
  cr_assert(keep[0] && keep[1]);
  sd_box cols[] = {B2(0, 6, 8, 2), B2(0, 0, 8, 3), B2(0, 3, 8, 3)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, cols, 3, keep, &err), 0, "%s", err.msg);
  sd_box grid[] = {B2(0, 0, 5, 3), B2(0, 3, 5, 5), B2(5, 0, 3, 6), B2(5, 6, 3, 2)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, grid, 4, keep, &err), 0, "%s", err.msg);
  uint64_t sh3[3] = {2, 6, 4};
  sd_box inner[] = {bx(3, (uint64_t[]){0, 3, 0}, (uint64_t[]){2, 3, 4}),
                    bx(3, (uint64_t[]){0, 0, 0}, (uint64_t[]){2, 3, 4})};
  cr_assert_eq(sd_coverage_check("w3", 3, sh3, inner, 2, keep, &err), 0, "%s", err.msg);
  uint64_t sh1[1] = {10};
  sd_box whole = bx(1, (uint64_t[]){0}, (uint64_t[]){10});
  cr_assert_eq(sd_coverage_check("v", 1, sh1, &whole, 1, NULL, &err), 0, "keep may be NULL");
}

Test(coverage, replicas_keep_the_first) {
  uint8_t keep[6];
  sd_box b[] = {B2(4, 0, 4, 8), B2(0, 0, 4, 8), B2(4, 0, 4, 8), B2(0, 0, 4, 8), B2(0, 0, 4, 8),
                B2(4, 0, 4, 8)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, b, 6, keep, NULL), 0);
  uint8_t want[] = {1, 1, 0, 0, 0, 0};
  cr_assert_arr_eq(keep, want, 6);
  sd_box all[] = {B2(0, 0, 8, 8), B2(0, 0, 8, 8), B2(0, 0, 8, 8)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, all, 3, keep, NULL), 0);
  cr_assert(keep[0] && !keep[1] && !keep[2]);
}

Test(coverage, partial_overlap_names_both_boxes) {
  sd_error err = {0};
  uint8_t keep[3];
  sd_box b[] = {B2(0, 0, 4, 8), B2(2, 0, 4, 8), B2(6, 0, 2, 8)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, b, 3, keep, &err), SHARDD_E_OVERLAP);
  cr_assert_eq(err.code, SHARDD_E_OVERLAP);
  cr_assert_str_eq(err.msg,
                   "tensor 'w': box start=[0,0] count=[4,8] overlaps box start=[2,0] count=[4,8]");
  /* A box inside another is an overlap, not a replica. */
  sd_box in[] = {B2(0, 0, 8, 8), B2(1, 1, 2, 2)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, in, 2, keep, &err), SHARDD_E_OVERLAP);
  cr_assert_str_eq(err.msg,
                   "tensor 'w': box start=[0,0] count=[8,8] overlaps box start=[1,1] count=[2,2]");
  /* The message orders the boxes as the caller gave them. */
  sd_box rev[] = {B2(4, 4, 4, 4), B2(0, 0, 8, 5)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, rev, 2, keep, &err), SHARDD_E_OVERLAP);
  cr_assert_str_eq(err.msg,
                   "tensor 'w': box start=[4,4] count=[4,4] overlaps box start=[0,0] count=[8,5]");
}

Test(coverage, gap_names_the_first_uncovered_element) {
  sd_error err = {0};
  uint8_t keep[3];
  sd_box b[] = {B2(0, 0, 3, 8), B2(4, 0, 4, 8)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, b, 2, keep, &err), SHARDD_E_GAP);
  cr_assert_str_eq(err.msg, "tensor 'w': element [3,0] is not covered");
  sd_box c[] = {B2(0, 0, 8, 5), B2(0, 6, 8, 2), B2(0, 5, 7, 1)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, c, 3, keep, &err), SHARDD_E_GAP);
  cr_assert_str_eq(err.msg, "tensor 'w': element [7,5] is not covered");
  cr_assert_eq(sd_coverage_check("w", 2, SH88, NULL, 0, keep, &err), SHARDD_E_GAP);
  cr_assert_str_eq(err.msg, "tensor 'w': element [0,0] is not covered");
}

Test(coverage, scalars_and_zero_size_tensors) {
  sd_error err = {0};
  uint8_t keep[3] = {9, 9, 9};
  sd_box s[3];
  memset(s, 0, sizeof s);
  cr_assert_eq(sd_coverage_check("s", 0, NULL, s, 3, keep, &err), 0, "%s", err.msg);
  cr_assert(keep[0] == 1 && keep[1] == 0 && keep[2] == 0);
  cr_assert_eq(sd_coverage_check("s", 0, NULL, s, 0, keep, &err), SHARDD_E_GAP);
  cr_assert_str_eq(err.msg, "tensor 's': element [] is not covered");

  uint64_t z[2] = {0, 4};
  sd_box e[] = {B2(0, 0, 0, 4), B2(0, 0, 0, 2), B2(0, 0, 0, 4)};
  cr_assert_eq(sd_coverage_check("z", 2, z, e, 3, keep, &err), 0, "%s", err.msg);
  cr_assert(keep[0] == 1 && keep[1] == 1 && keep[2] == 0);
  cr_assert_eq(sd_coverage_check("z", 2, z, e, 0, keep, &err), 0, "nothing to cover");
  sd_box out[] = {B2(0, 2, 0, 4)};
  cr_assert_eq(sd_coverage_check("z", 2, z, out, 1, keep, &err), SHARDD_E_INVALID_ARGUMENT);
}

/* Uneven splits (tensor_split, DTensor Shard, FSDP2) give some ranks an
 * empty box: it covers nothing, overlaps nothing and is never written. */
Test(coverage, empty_boxes_cover_nothing_and_are_not_kept) {
  sd_error err = {0};
  uint8_t keep[8];
  /* a bias of 3 over 4 ranks: [0,0) [0,1) [1,2) [2,3) */
  uint64_t b3[1] = {3};
  sd_box bias[] = {bx(1, (uint64_t[]){0}, (uint64_t[]){0}), bx(1, (uint64_t[]){0}, (uint64_t[]){1}),
                   bx(1, (uint64_t[]){1}, (uint64_t[]){1}), bx(1, (uint64_t[]){2}, (uint64_t[]){1})};
  memset(keep, 9, sizeof keep);
  cr_assert_eq(sd_coverage_check("bias", 1, b3, bias, 4, keep, &err), 0, "%s", err.msg);
  uint8_t want[] = {0, 1, 1, 1};
  cr_assert_arr_eq(keep, want, 4);
  /* empty boxes at the end (start == dim), in the middle of a full box and
   * strictly inside another box's range: none is an overlap */
  sd_box mid[] = {B2(8, 0, 0, 8), B2(0, 0, 8, 8), B2(3, 3, 0, 2), B2(2, 8, 4, 0), B2(3, 3, 0, 2)};
  memset(keep, 9, sizeof keep);
  cr_assert_eq(sd_coverage_check("w", 2, SH88, mid, 5, keep, &err), 0, "%s", err.msg);
  cr_assert(!keep[0] && keep[1] && !keep[2] && !keep[3] && !keep[4]);
  /* 2 columns over 3 ranks: one rank's box has no columns; replicas of it too */
  uint64_t sh[2] = {4, 2};
  sd_box cols[] = {B2(0, 0, 4, 1), B2(0, 1, 4, 1), B2(0, 2, 4, 0), B2(0, 1, 4, 1), B2(0, 2, 4, 0)};
  cr_assert_eq(sd_coverage_check("c", 2, sh, cols, 5, keep, &err), 0, "%s", err.msg);
  cr_assert(keep[0] && keep[1] && !keep[2] && !keep[3] && !keep[4]);
  /* keep may be NULL, on the heap path too */
  cr_assert_eq(sd_coverage_check("w", 2, SH88, mid, 5, NULL, &err), 0, "%s", err.msg);
}

Test(coverage, empty_boxes_do_not_hide_gaps_or_overlaps) {
  sd_error err = {0};
  uint8_t keep[4];
  /* rows 0..3 and 5..7 held, row 4 only by an empty box */
  sd_box g[] = {B2(0, 0, 4, 8), B2(4, 0, 0, 8), B2(5, 0, 3, 8)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, g, 3, keep, &err), SHARDD_E_GAP);
  cr_assert_str_eq(err.msg, "tensor 'w': element [4,0] is not covered");
  /* a real overlap is still found past empty boxes sorted between */
  sd_box o[] = {B2(0, 0, 5, 8), B2(4, 0, 0, 8), B2(4, 0, 4, 8), B2(2, 2, 2, 0)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, o, 4, keep, &err), SHARDD_E_OVERLAP);
  cr_assert_str_eq(err.msg, "tensor 'w': box start=[0,0] count=[5,8] overlaps box start=[4,0] count=[4,8]");
  /* an empty box must still lie within the shape */
  sd_box out[] = {B2(0, 0, 8, 8), B2(9, 0, 0, 8)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, out, 2, keep, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "tensor 'w': box start=[9,0] count=[0,8] lies outside shape [8,8] in dimension 0");
}

Test(coverage, a_tensor_covered_only_by_empty_boxes_has_a_gap) {
  sd_error err = {0};
  uint8_t keep[3];
  sd_box e[] = {B2(0, 0, 0, 8), B2(8, 0, 0, 8), B2(2, 3, 6, 0)};
  cr_assert_eq(sd_coverage_check("model.layers.0.router.bias", 2, SH88, e, 3, keep, &err), SHARDD_E_GAP);
  cr_assert_str_eq(err.msg, "tensor 'model.layers.0.router.bias': element [0,0] is not covered");
  uint64_t b3[1] = {3};
  sd_box one = bx(1, (uint64_t[]){3}, (uint64_t[]){0});
  cr_assert_eq(sd_coverage_check("bias", 1, b3, &one, 1, keep, &err), SHARDD_E_GAP);
  cr_assert_str_eq(err.msg, "tensor 'bias': element [0] is not covered");
}

/* Many ranks, most of them empty (a router of 8 experts over 300 ranks),
 * past the stack arrays. */
Test(coverage, many_empty_boxes_use_the_heap_path) {
  enum { N = 300 };
  uint64_t sh[2] = {8, 16};
  sd_box b[N];
  uint8_t keep[N];
  for (int r = 0; r < N; r++) {
    uint64_t a = 8ull * (uint64_t)r / N, z = 8ull * (uint64_t)(r + 1) / N;
    b[r] = B2(a, 0, z - a, 16);
  }
  sd_error err = {0};
  cr_assert_eq(sd_coverage_check("router", 2, sh, b, N, keep, &err), 0, "%s", err.msg);
  int kept = 0;
  for (int r = 0; r < N; r++) {
    kept += keep[r];
    cr_assert_eq(keep[r], b[r].count[0] != 0, "keep[%d]", r);
  }
  cr_assert_eq(kept, 8);
}

Test(coverage, boxes_outside_the_shape) {
  sd_error err = {0};
  sd_box b = B2(6, 0, 4, 8);
  cr_assert_eq(sd_box_check("w", 2, SH88, &b, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg,
                   "tensor 'w': box start=[6,0] count=[4,8] lies outside shape [8,8] in dimension 0");
  b = B2(1, 0, UINT64_MAX, 8); /* start + count wraps to 0 */
  cr_assert_eq(sd_box_check("w", 2, SH88, &b, &err), SHARDD_E_INVALID_ARGUMENT);
  b = B2(0, 9, 8, 0);
  cr_assert_eq(sd_box_check("w", 2, SH88, &b, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "dimension 1"), "%s", err.msg);
  b = B2(0, 8, 8, 0);
  cr_assert_eq(sd_box_check("w", 2, SH88, &b, &err), 0, "an empty box at the end is inside");
  b = B2(2, 2, 6, 6);
  cr_assert_eq(sd_box_check("w", 2, SH88, &b, &err), 0);
  cr_assert_eq(sd_box_check("w", SD_MAX_DIMS + 1, SH88, &b, &err), SHARDD_E_INVALID_ARGUMENT);
  sd_box bad[] = {B2(0, 0, 8, 8), B2(UINT64_MAX, 0, 2, 8)};
  cr_assert_eq(sd_coverage_check("w", 2, SH88, bad, 2, NULL, &err), SHARDD_E_INVALID_ARGUMENT);
}

Test(coverage, many_slices_use_the_heap_path) {
  enum { R = 1000, COPIES = 3 };
  uint64_t sh[2] = {R, 3};
  sd_box *b = malloc(R * COPIES * sizeof *b);
  uint8_t *keep = malloc(R * COPIES);
  srand(3);
  for (int i = 0; i < R * COPIES; i++) b[i] = B2((uint64_t)(i % R), 0, 1, 3);
  for (int i = R * COPIES - 1; i > 0; i--) {
    int j = rand() % (i + 1);
    sd_box tmp = b[i];
    b[i] = b[j];
    b[j] = tmp;
  }
  sd_error err = {0};
  cr_assert_eq(sd_coverage_check("big", 2, sh, b, R * COPIES, keep, &err), 0, "%s", err.msg);
  int kept = 0;
  for (int i = 0; i < R * COPIES; i++) {
    kept += keep[i];
    int first = 1;
    for (int j = 0; j < i && first; j++)
      if (b[j].start[0] == b[i].start[0]) first = 0;
    cr_assert_eq(keep[i], first);
  }
  cr_assert_eq(kept, R);
  size_t m = 0;
  for (int i = 0; i < R * COPIES; i++)
    if (b[i].start[0] != 500) b[m++] = b[i];
  cr_assert_eq(sd_coverage_check("big", 2, sh, b, m, keep, &err), SHARDD_E_GAP);
  cr_assert_str_eq(err.msg, "tensor 'big': element [500,0] is not covered");
  free(b);
  free(keep);
}

/* ------------------------------------------------------------------------ *
 * Randomized against a brute-force element grid
 * ------------------------------------------------------------------------ */
typedef struct {
  uint32_t ndim;
  uint64_t shape[4];
  size_t numel;
} geo;

static void split(const geo *g, sd_box b, int depth, sd_box *out, size_t *n) {
  int dims[4], nd = 0;
  for (uint32_t d = 0; d < g->ndim; d++)
    if (b.count[d] >= 2) dims[nd++] = (int)d;
  if (depth == 0 || nd == 0 || rand() % 4 == 0) {
    out[(*n)++] = b;
    return;
  }
  int d = dims[rand() % nd];
  uint64_t cut = 1 + (uint64_t)rand() % (b.count[d] - 1);
  sd_box lo = b, hi = b;
  lo.count[d] = cut;
  hi.start[d] += cut;
  hi.count[d] -= cut;
  split(g, lo, depth - 1, out, n);
  split(g, hi, depth - 1, out, n);
}

static int same(const sd_box *a, const sd_box *b, uint32_t nd) {
  for (uint32_t i = 0; i < nd; i++)
    if (a->start[i] != b->start[i] || a->count[i] != b->count[i]) return 0;
  return 1;
}

static int contains(const sd_box *b, const uint64_t *e, uint32_t nd) {
  for (uint32_t i = 0; i < nd; i++)
    if (e[i] < b->start[i] || e[i] >= b->start[i] + b->count[i]) return 0;
  return 1;
}

static void unravel(const geo *g, size_t flat, uint64_t *e) {
  for (uint32_t i = g->ndim; i-- > 0;) {
    e[i] = flat % g->shape[i];
    flat /= g->shape[i];
  }
}

static void fmt_dims(char *o, uint32_t nd, const uint64_t *v) {
  o += sprintf(o, "[");
  for (uint32_t i = 0; i < nd; i++) o += sprintf(o, "%s%llu", i ? "," : "", (unsigned long long)v[i]);
  sprintf(o, "]");
}

static void fmt_box(char *o, uint32_t nd, const sd_box *b) {
  char s[100], c[100];
  fmt_dims(s, nd, b->start);
  fmt_dims(c, nd, b->count);
  sprintf(o, "start=%s count=%s", s, c);
}

/* What the check must answer, decided element by element. */
static void brute_expect(const geo *g, const sd_box *b, size_t n) {
  uint8_t *first = malloc(n + 1);
  for (size_t i = 0; i < n; i++) {
    first[i] = 1;
    for (uint32_t d = 0; d < g->ndim; d++)
      if (b[i].count[d] == 0) first[i] = 0; /* covers nothing, never written */
    for (size_t j = 0; j < i && first[i]; j++)
      if (same(&b[i], &b[j], g->ndim)) first[i] = 0;
  }
  int overlap = 0;
  size_t gap_at = SIZE_MAX;
  for (size_t f = 0; f < g->numel; f++) {
    uint64_t e[4];
    unravel(g, f, e);
    int c = 0;
    for (size_t i = 0; i < n; i++)
      if (first[i] && contains(&b[i], e, g->ndim)) c++;
    if (c > 1) overlap = 1;
    if (c == 0 && gap_at == SIZE_MAX) gap_at = f;
  }
  uint8_t keep[128];
  sd_error err = {0};
  int rc = sd_coverage_check("t", g->ndim, g->shape, b, n, keep, &err);
  if (overlap) {
    cr_assert_eq(rc, SHARDD_E_OVERLAP, "rc %d: %s", rc, err.msg);
    /* The named pair must really overlap. */
    int found = 0;
    for (size_t i = 0; i < n && !found; i++)
      for (size_t j = i + 1; j < n && !found; j++) {
        if (!first[i] || !first[j]) continue;
        int ov = 1;
        for (uint32_t d = 0; d < g->ndim; d++)
          if (b[i].start[d] >= b[j].start[d] + b[j].count[d] ||
              b[j].start[d] >= b[i].start[d] + b[i].count[d])
            ov = 0;
        if (!ov) continue;
        char m[1200], x[512], y[512];
        fmt_box(x, g->ndim, &b[i]);
        fmt_box(y, g->ndim, &b[j]);
        snprintf(m, sizeof m, "tensor 't': box %s overlaps box %s", x, y);
        found = strcmp(m, err.msg) == 0;
      }
    cr_assert(found, "message names a pair that does not overlap: %s", err.msg);
  } else if (gap_at != SIZE_MAX) {
    cr_assert_eq(rc, SHARDD_E_GAP, "rc %d: %s", rc, err.msg);
    uint64_t e[4];
    unravel(g, gap_at, e);
    char m[300], d[128];
    fmt_dims(d, g->ndim, e);
    snprintf(m, sizeof m, "tensor 't': element %s is not covered", d);
    cr_assert_str_eq(err.msg, m);
  } else {
    cr_assert_eq(rc, 0, "%s", err.msg);
    for (size_t i = 0; i < n; i++) cr_assert_eq(keep[i], first[i], "keep[%zu]", i);
  }
  free(first);
}

static void shuffle(sd_box *b, size_t n) {
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)rand() % i;
    sd_box t = b[i - 1];
    b[i - 1] = b[j];
    b[j] = t;
  }
}

static geo random_geo(void) {
  geo g = {.ndim = 1 + (uint32_t)(rand() % 4)};
  g.numel = 1;
  for (uint32_t d = 0; d < g.ndim; d++) {
    g.shape[d] = 1 + (uint64_t)(rand() % (g.ndim > 2 ? 5 : 9));
    g.numel *= g.shape[d];
  }
  return g;
}

static sd_box random_box(const geo *g) {
  sd_box b;
  memset(&b, 0, sizeof b);
  for (uint32_t d = 0; d < g->ndim; d++) {
    b.start[d] = (uint64_t)rand() % g->shape[d];
    b.count[d] = 1 + (uint64_t)rand() % (g->shape[d] - b.start[d]);
  }
  return b;
}

Test(coverage, random_partitions_with_replicas_pass, .timeout = 60) {
  srand(1);
  for (int it = 0; it < 3000; it++) {
    geo g = random_geo();
    sd_box full;
    memset(&full, 0, sizeof full);
    for (uint32_t d = 0; d < g.ndim; d++) full.count[d] = g.shape[d];
    sd_box b[128];
    size_t n = 0;
    split(&g, full, 6, b, &n);
    size_t extra = (size_t)rand() % 4;
    for (size_t k = 0; k < extra && n < 128; k++) {
      size_t src = (size_t)rand() % n;
      b[n] = b[src];
      n++;
    }
    shuffle(b, n);
    brute_expect(&g, b, n);
  }
}

Test(coverage, removing_a_box_leaves_the_right_gap, .timeout = 60) {
  srand(2);
  for (int it = 0; it < 3000; it++) {
    geo g = random_geo();
    sd_box full;
    memset(&full, 0, sizeof full);
    for (uint32_t d = 0; d < g.ndim; d++) full.count[d] = g.shape[d];
    sd_box b[128];
    size_t n = 0;
    split(&g, full, 6, b, &n);
    if (rand() % 2 && n < 100) b[n++] = b[0];
    shuffle(b, n);
    sd_box gone = b[(size_t)rand() % n];
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
      if (!same(&b[i], &gone, g.ndim)) b[m++] = b[i];
    brute_expect(&g, b, m);
  }
}

Test(coverage, perturbed_and_arbitrary_boxes_match_brute_force, .timeout = 60) {
  srand(4);
  for (int it = 0; it < 6000; it++) {
    geo g = random_geo();
    sd_box b[128];
    size_t n = 0;
    if (it % 2) {
      sd_box full;
      memset(&full, 0, sizeof full);
      for (uint32_t d = 0; d < g.ndim; d++) full.count[d] = g.shape[d];
      split(&g, full, 6, b, &n);
      b[(size_t)rand() % n] = random_box(&g);
      if (rand() % 3 == 0) b[(size_t)rand() % n] = random_box(&g);
    } else {
      n = 1 + (size_t)rand() % 8;
      for (size_t i = 0; i < n; i++) b[i] = random_box(&g);
    }
    shuffle(b, n);
    brute_expect(&g, b, n);
  }
}

/* An empty box anywhere within the shape: start in [0, dim], a zero count in
 * at least one dimension, any count elsewhere that fits. */
static sd_box random_empty_box(const geo *g) {
  sd_box b;
  memset(&b, 0, sizeof b);
  uint32_t z = (uint32_t)rand() % g->ndim;
  for (uint32_t d = 0; d < g->ndim; d++) {
    b.start[d] = (uint64_t)rand() % (g->shape[d] + 1);
    b.count[d] = d == z ? 0 : (uint64_t)rand() % (g->shape[d] - b.start[d] + 1);
  }
  return b;
}

Test(coverage, empty_boxes_sprinkled_anywhere_match_brute_force, .timeout = 60) {
  srand(7);
  for (int it = 0; it < 4000; it++) {
    geo g = random_geo();
    sd_box full;
    memset(&full, 0, sizeof full);
    for (uint32_t d = 0; d < g.ndim; d++) full.count[d] = g.shape[d];
    sd_box b[128];
    size_t n = 0;
    if (it % 4 != 3) split(&g, full, 6, b, &n);
    if (it % 4 == 1 && n > 1) n--;                             /* and a gap */
    if (it % 4 == 2) b[(size_t)rand() % n] = random_box(&g);  /* likely an overlap */
    size_t empties = 1 + (size_t)rand() % 5;
    for (size_t k = 0; k < empties && n < 128; k++) b[n++] = random_empty_box(&g);
    if (n < 128 && rand() % 2) b[n] = b[n - 1], n++;           /* a replica of an empty box */
    shuffle(b, n);
    brute_expect(&g, b, n);
  }
}

Test(coverage, grids_of_64_in_any_order) {
  srand(6);
  for (int it = 0; it < 200; it++) {
    geo g = {.ndim = 2, .shape = {64, 64}, .numel = 4096};
    sd_box b[64];
    size_t n = 0;
    for (int r = 0; r < 8; r++)
      for (int c = 0; c < 8; c++) b[n++] = B2((uint64_t)r * 8, (uint64_t)c * 8, 8, 8);
    if (it % 3 == 1) b[rand() % 64].count[1] = 7;          /* a one-column gap */
    if (it % 3 == 2) b[rand() % 56].count[0] = 9;          /* runs into the block below */
    shuffle(b, n);
    brute_expect(&g, b, n);
  }
}
