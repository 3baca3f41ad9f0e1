/* Slice-to-file byte runs: coalescing rules and a brute-force element-by-element copy as the oracle. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"

typedef struct {
  uint64_t dst, src, len;
} run;

typedef struct {
  run r[4096];
  size_t n;
  size_t stop_after; /* 0: never */
} runs;

static int collect(void *ud, uint64_t dst, uint64_t src, uint64_t len) {
  runs *rs = ud;
  cr_assert_lt(rs->n, 4096);
  rs->r[rs->n++] = (run){dst, src, len};
  if (rs->stop_after && rs->n == rs->stop_after) return 42;
  return 0;
}

static runs *go(uint32_t ndim, const uint64_t *shape, unsigned es, const uint64_t *st,
                const uint64_t *ct, uint64_t base) {
  static runs rs;
  memset(&rs, 0, sizeof rs);
  sd_box b;
  memset(&b, 0, sizeof b);
  for (uint32_t i = 0; i < ndim; i++) {
    b.start[i] = st[i];
    b.count[i] = ct[i];
  }
  cr_assert_eq(sd_box_runs(ndim, shape, es, &b, base, collect, &rs), 0);
  return &rs;
}

Test(runs, dim0_split_is_one_run) {
  runs *r = go(2, (uint64_t[]){8, 4}, 4, (uint64_t[]){2, 0}, (uint64_t[]){4, 4}, 4096);
  cr_assert_eq(r->n, 1);
  cr_assert_eq(r->r[0].dst, 4096 + 2 * 16);
  cr_assert_eq(r->r[0].src, 0);
  cr_assert_eq(r->r[0].len, 64);
}

Test(runs, whole_tensor_is_one_run) {
  runs *r = go(3, (uint64_t[]){2, 3, 4}, 2, (uint64_t[]){0, 0, 0}, (uint64_t[]){2, 3, 4}, 100);
  cr_assert_eq(r->n, 1);
  cr_assert_eq(r->r[0].dst, 100);
  cr_assert_eq(r->r[0].len, 48);
}

Test(runs, inner_split_is_one_run_per_row) {
  runs *r = go(2, (uint64_t[]){4, 8}, 2, (uint64_t[]){0, 2}, (uint64_t[]){4, 3}, 0);
  cr_assert_eq(r->n, 4);
  for (uint64_t i = 0; i < 4; i++) {
    cr_assert_eq(r->r[i].dst, i * 16 + 4);
    cr_assert_eq(r->r[i].src, i * 6);
    cr_assert_eq(r->r[i].len, 6);
  }
}

Test(runs, three_d_split_on_dim1_is_one_run_per_dim0_index) {
  runs *r = go(3, (uint64_t[]){2, 6, 4}, 4, (uint64_t[]){0, 3, 0}, (uint64_t[]){2, 3, 4}, 8);
  cr_assert_eq(r->n, 2);
  cr_assert_eq(r->r[0].dst, 8 + 3 * 16);
  cr_assert_eq(r->r[0].len, 48);
  cr_assert_eq(r->r[1].dst, 8 + 96 + 3 * 16);
  cr_assert_eq(r->r[1].src, 48);
}

Test(runs, single_row_of_an_inner_split_is_one_run) {
  runs *r = go(3, (uint64_t[]){5, 6, 4}, 1, (uint64_t[]){2, 1, 1}, (uint64_t[]){1, 1, 2}, 0);
  cr_assert_eq(r->n, 1);
  cr_assert_eq(r->r[0].dst, 2 * 24 + 4 + 1);
  cr_assert_eq(r->r[0].len, 2);
}

Test(runs, scalar_and_empty) {
  runs *r = go(0, NULL, 8, NULL, NULL, 4096);
  cr_assert_eq(r->n, 1);
  cr_assert_eq(r->r[0].dst, 4096);
  cr_assert_eq(r->r[0].len, 8);
  r = go(2, (uint64_t[]){0, 4}, 4, (uint64_t[]){0, 0}, (uint64_t[]){0, 4}, 0);
  cr_assert_eq(r->n, 0);
  r = go(2, (uint64_t[]){5, 4}, 4, (uint64_t[]){1, 0}, (uint64_t[]){2, 0}, 0);
  cr_assert_eq(r->n, 0);
}

Test(runs, callback_can_stop_the_walk) {
  static runs rs;
  memset(&rs, 0, sizeof rs);
  rs.stop_after = 2;
  sd_box b;
  memset(&b, 0, sizeof b);
  b.count[0] = 4;
  b.count[1] = 1;
  uint64_t sh[2] = {4, 4};
  cr_assert_eq(sd_box_runs(2, sh, 1, &b, 0, collect, &rs), 42);
  cr_assert_eq(rs.n, 2);
  cr_assert_eq(sd_box_runs(SD_MAX_DIMS + 1, sh, 1, &b, 0, collect, &rs), SHARDD_E_INVALID_ARGUMENT);
}

Test(runs, random_boxes_match_an_element_by_element_copy, .timeout = 60) {
  srand(9);
  static uint8_t file_a[1 << 16], file_b[1 << 16], slice[1 << 16];
  for (int it = 0; it < 5000; it++) {
    uint32_t nd = (uint32_t)(rand() % 5);
    uint64_t sh[4], st[4], ct[4], numel = 1;
    for (uint32_t d = 0; d < nd; d++) {
      sh[d] = 1 + (uint64_t)(rand() % 6);
      numel *= sh[d];
      /* Often span the whole dimension so coalescing kicks in. */
      if (rand() % 2) {
        st[d] = 0;
        ct[d] = sh[d];
      } else {
        st[d] = (uint64_t)rand() % sh[d];
        ct[d] = 1 + (uint64_t)rand() % (sh[d] - st[d]);
      }
    }
    static const unsigned sizes[] = {1, 2, 4, 8};
    unsigned es = sizes[rand() % 4];
    uint64_t base = (uint64_t)(rand() % 3) * 64;
    uint64_t fsize = base + numel * es;
    uint64_t vol = 1;
    for (uint32_t d = 0; d < nd; d++) vol *= ct[d];
    for (uint64_t i = 0; i < vol * es; i++) slice[i] = (uint8_t)(1 + (i * 131 + (uint64_t)it) % 251);
    memset(file_a, 0, fsize);
    memset(file_b, 0, fsize);

    /* Oracle: walk the box element by element in row-major order. */
    uint64_t idx[4] = {0};
    for (uint64_t k = 0; k < vol; k++) {
      uint64_t off = 0;
      for (uint32_t d = 0; d < nd; d++) off = off * sh[d] + st[d] + idx[d];
      memcpy(file_a + base + off * es, slice + k * es, es);
      for (uint32_t d = nd; d-- > 0;) {
        if (++idx[d] < ct[d]) break;
        idx[d] = 0;
      }
    }

    runs *r = go(nd, sh, es, st, ct, base);
    uint64_t src = 0;
    for (size_t i = 0; i < r->n; i++) {
      cr_assert_eq(r->r[i].src, src, "runs follow the packed slice in order");
      cr_assert_gt(r->r[i].len, 0);
      cr_assert_leq(r->r[i].dst + r->r[i].len, fsize);
      cr_assert_geq(r->r[i].dst, base);
      if (i > 0) cr_assert_neq(r->r[i - 1].dst + r->r[i - 1].len, r->r[i].dst, "not coalesced");
      memcpy(file_b + r->r[i].dst, slice + r->r[i].src, r->r[i].len);
      src += r->r[i].len;
    }
    cr_assert_eq(src, vol * es);
    cr_assert_eq(memcmp(file_a, file_b, fsize), 0, "iteration %d", it);

    /* Expected count: the product of the counts outside the innermost
     * dimension the box does not span. */
    uint64_t want = vol ? 1 : 0;
    if (vol && nd) {
      int j = (int)nd - 1;
      while (j > 0 && ct[j] == sh[j]) j--;
      for (int d = 0; d < j; d++) want *= ct[d];
    }
    cr_assert_eq(r->n, want);
  }
}
