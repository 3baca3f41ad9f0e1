/* Slice coverage: do the boxes ranks declared for a tensor cover it exactly once (replicas aside)? */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"
#include "sd_layout.h"

/* Work arrays live on the stack up to this many boxes, the common case. */
#define STACK_BOXES 256

static const char *fmt_box(char *buf, size_t cap, uint32_t ndim, const sd_box *b) {
  char s[96], c[96];
  snprintf(buf, cap, "start=%s count=%s", sd_fmt_dims(s, sizeof s, ndim, b->start),
           sd_fmt_dims(c, sizeof c, ndim, b->count));
  return buf;
}

int sd_box_check(const char *name, uint32_t ndim, const uint64_t *shape, const sd_box *b,
                 sd_error *err) {
  char shown[SD_MSGNAME_MAX], bx[200], sh[100];
  const char *nm = name ? name : "";
  if (ndim > SD_MAX_DIMS)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': %u dimensions, over the limit of %d",
                   sd_msgstr(shown, sizeof shown, nm, strlen(nm)), ndim, SD_MAX_DIMS);
  for (uint32_t i = 0; i < ndim; i++) {
    if (b->start[i] > shape[i] || b->count[i] > shape[i] - b->start[i])
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                     "tensor '%s': box %s lies outside shape %s in dimension %u",
                     sd_msgstr(shown, sizeof shown, nm, strlen(nm)), fmt_box(bx, sizeof bx, ndim, b),
                     sd_fmt_dims(sh, sizeof sh, ndim, shape), i);
  }
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Sorting box indices: key dimension k first, then the other starts, then
 * the counts, then input position, so identical boxes end up adjacent with
 * the first given leading its group.
 * ------------------------------------------------------------------------ */
typedef struct {
  const sd_box *boxes;
  uint32_t ndim;
  uint32_t k;
} sort_ctx;

static int box_less(const sort_ctx *c, uint32_t ia, uint32_t ib) {
  const sd_box *a = &c->boxes[ia], *b = &c->boxes[ib];
  uint32_t k = c->k;
  if (a->start[k] != b->start[k]) return a->start[k] < b->start[k];
  for (uint32_t i = 0; i < c->ndim; i++)
    if (i != k && a->start[i] != b->start[i]) return a->start[i] < b->start[i];
  for (uint32_t i = 0; i < c->ndim; i++)
    if (a->count[i] != b->count[i]) return a->count[i] < b->count[i];
  return ia < ib;
}

static void merge_sort(const sort_ctx *c, uint32_t *v, uint32_t *tmp, size_t n) {
  if (n <= 16) {
    for (size_t i = 1; i < n; i++) {
      uint32_t x = v[i];
      size_t j = i;
      while (j > 0 && box_less(c, x, v[j - 1])) {
        v[j] = v[j - 1];
        j--;
      }
      v[j] = x;
    }
    return;
  }
  size_t h = n / 2;
  merge_sort(c, v, tmp, h);
  merge_sort(c, v + h, tmp, n - h);
  if (!box_less(c, v[h], v[h - 1])) return;
  memcpy(tmp, v, h * sizeof *v);
  size_t i = 0, j = h, o = 0;
  while (i < h && j < n) v[o++] = box_less(c, v[j], tmp[i]) ? v[j++] : tmp[i++];
  while (i < h) v[o++] = tmp[i++];
}

static int box_same(const sd_box *a, const sd_box *b, uint32_t ndim) {
  for (uint32_t i = 0; i < ndim; i++)
    if (a->start[i] != b->start[i] || a->count[i] != b->count[i]) return 0;
  return 1;
}

static int box_empty(const sd_box *b, uint32_t ndim) {
  for (uint32_t i = 0; i < ndim; i++)
    if (b->count[i] == 0) return 1;
  return 0;
}

static int box_overlap(const sd_box *a, const sd_box *b, uint32_t ndim) {
  for (uint32_t i = 0; i < ndim; i++)
    if (a->start[i] >= b->start[i] + b->count[i] || b->start[i] >= a->start[i] + a->count[i])
      return 0;
  return 1;
}

/* ------------------------------------------------------------------------ *
 * First uncovered element (error path only; boxes known to be disjoint).
 * Dimension by dimension: the first coordinate whose slab is not fully
 * covered holds the first hole in row-major order, and only the boxes that
 * cross that slab matter further down.
 * ------------------------------------------------------------------------ */
typedef struct {
  uint64_t pos;
  uint64_t vol;
  int add;
} gap_ev;

static int ev_cmp(const void *pa, const void *pb) {
  const gap_ev *a = pa, *b = pb;
  return a->pos < b->pos ? -1 : a->pos > b->pos;
}

static int find_gap(const sd_box *boxes, const uint8_t *keep, size_t n, uint32_t ndim,
                    const uint64_t *shape, uint64_t *elem) {
  uint32_t *cand = malloc((n ? n : 1) * sizeof *cand);
  gap_ev *ev = malloc((2 * n + 1) * sizeof *ev);
  int rc = SHARDD_E_NO_MEMORY;
  if (!cand || !ev) goto out;
  size_t nc = 0;
  for (size_t i = 0; i < n; i++)
    if (keep[i]) cand[nc++] = (uint32_t)i;
  rc = SHARDD_E_INTERNAL;
  for (uint32_t l = 0; l < ndim; l++) {
    uint64_t slab = 1;
    for (uint32_t i = l + 1; i < ndim; i++) slab *= shape[i];
    size_t ne = 0;
    for (size_t c = 0; c < nc; c++) {
      const sd_box *b = &boxes[cand[c]];
      uint64_t cv = 1;
      for (uint32_t i = l + 1; i < ndim; i++) cv *= b->count[i];
      ev[ne++] = (gap_ev){b->start[l], cv, 1};
      ev[ne++] = (gap_ev){b->start[l] + b->count[l], cv, 0};
    }
    qsort(ev, ne, sizeof *ev, ev_cmp);
    uint64_t cur = 0, p = 0;
    size_t e = 0;
    int found = 0;
    for (;;) {
      /* Coverage is constant between event positions, so only those (and
       * 0) can be the first uncovered coordinate. Unsigned wrap between an
       * end and a start at the same position cancels out. */
      while (e < ne && ev[e].pos <= p) {
        cur = ev[e].add ? cur + ev[e].vol : cur - ev[e].vol;
        e++;
      }
      if (cur < slab) {
        found = 1;
        break;
      }
      if (e == ne) break;
      p = ev[e].pos;
      if (p >= shape[l]) break;
    }
    if (!found) goto out;
    elem[l] = p;
    size_t m = 0;
    for (size_t c = 0; c < nc; c++) {
      const sd_box *b = &boxes[cand[c]];
      if (b->start[l] <= p && p < b->start[l] + b->count[l]) cand[m++] = cand[c];
    }
    nc = m;
  }
  rc = 0;
out:
  free(cand);
  free(ev);
  return rc;
}

/* ------------------------------------------------------------------------ *
 * The check
 * ------------------------------------------------------------------------ */
int sd_coverage_check(const char *name, uint32_t ndim, const uint64_t *shape, const sd_box *boxes,
                      size_t n, uint8_t *keep, sd_error *err) {
  char shown[SD_MSGNAME_MAX], b1[200], b2[200], el[200];
  const char *nm = name ? name : "";
  uint64_t vol_total;
  int rc = sd_tensor_numel(name, ndim, shape, &vol_total, err);
  if (rc) return rc;
  if (n > UINT32_MAX)
    return sd_fail(err, SHARDD_E_LIMIT, "tensor '%s': too many slices",
                   sd_msgstr(shown, sizeof shown, nm, strlen(nm)));
  for (size_t i = 0; i < n; i++)
    if ((rc = sd_box_check(name, ndim, shape, &boxes[i], err))) return rc;
  if (n == 1 && vol_total > 0) {
    /* One box of the whole tensor (most tensors of a save: each put whole by one rank) covers it. */
    uint32_t d = 0;
    while (d < ndim && boxes[0].start[d] == 0 && boxes[0].count[d] == shape[d]) d++;
    if (d == ndim) {
      if (keep) keep[0] = 1;
      return 0;
    }
  }

  if (vol_total == 0 || ndim == 0) {
    /* Zero-size tensors have nothing to cover; a scalar's boxes are all
     * the same empty-dimension box. Either way only replicas remain. */
    if (ndim == 0) {
      if (n == 0)
        return sd_fail(err, SHARDD_E_GAP, "tensor '%s': element [] is not covered",
                       sd_msgstr(shown, sizeof shown, nm, strlen(nm)));
      for (size_t i = 0; i < n; i++)
        if (keep) keep[i] = i == 0;
      return 0;
    }
  }

  uint32_t st_idx[STACK_BOXES], st_tmp[STACK_BOXES], st_act[STACK_BOXES];
  uint8_t st_keep[STACK_BOXES];
  uint32_t *idx = st_idx, *tmp = st_tmp, *act = st_act;
  uint8_t *kp = keep;
  void *heap = NULL;
  if (n > STACK_BOXES) {
    heap = malloc(n * (3 * sizeof(uint32_t) + (keep ? 0 : 1)));
    if (!heap)
      return sd_fail(err, SHARDD_E_NO_MEMORY, "tensor '%s': out of memory checking %zu slices",
                     sd_msgstr(shown, sizeof shown, nm, strlen(nm)), n);
    idx = heap;
    tmp = idx + n;
    act = tmp + n;
    if (!keep) kp = (uint8_t *)(act + n);
  } else if (!keep) {
    kp = st_keep;
  }

  /* An empty box of a non-empty tensor (an uneven split giving a rank
   * nothing) covers nothing and overlaps nothing: it is never written, and
   * only the m boxes with elements take part below. A zero-size tensor's
   * boxes are all empty; they stay, so one of each group is kept. */
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (vol_total && box_empty(&boxes[i], ndim)) kp[i] = 0;
    else idx[m++] = (uint32_t)i;
  }

  /* Sweep along the dimension where boxes are thinnest relative to the
   * tensor: sum(count/shape) estimates how many boxes a sweep line crosses,
   * which bounds the pairs compared (1 for a pure split on that dim). */
  sort_ctx sc = {boxes, ndim, 0};
  if (vol_total) {
    double best = 0;
    for (uint32_t d = 0; d < ndim; d++) {
      double s = 0;
      for (size_t i = 0; i < m; i++) s += (double)boxes[idx[i]].count[d];
      s /= (double)shape[d];
      if (d == 0 || s < best) {
        best = s;
        sc.k = d;
      }
    }
  }
  int sorted = 1;
  for (size_t i = 1; i < m && sorted; i++) sorted = !box_less(&sc, idx[i], idx[i - 1]);
  if (!sorted) merge_sort(&sc, idx, tmp, m);

  for (size_t i = 0; i < m; i++)
    kp[idx[i]] = i == 0 || !box_same(&boxes[idx[i]], &boxes[idx[i - 1]], ndim);

  if (vol_total == 0) goto ok;
  if (m == 0) goto gap;

  /* Every pair whose key-dimension intervals intersect meets in the active
   * list, so every partial overlap is found. */
  uint32_t k = sc.k;
  size_t nact = 0;
  for (size_t i = 0; i < m; i++) {
    uint32_t bi = idx[i];
    if (!kp[bi]) continue;
    const sd_box *b = &boxes[bi];
    uint64_t s = b->start[k];
    size_t m = 0;
    for (size_t j = 0; j < nact; j++) {
      const sd_box *a = &boxes[act[j]];
      if (a->start[k] + a->count[k] > s) act[m++] = act[j];
    }
    nact = m;
    for (size_t j = 0; j < nact; j++) {
      if (box_overlap(&boxes[act[j]], b, ndim)) {
        uint32_t first = act[j] < bi ? act[j] : bi, second = act[j] < bi ? bi : act[j];
        rc = sd_fail(err, SHARDD_E_OVERLAP, "tensor '%s': box %s overlaps box %s",
                     sd_msgstr(shown, sizeof shown, nm, strlen(nm)),
                     fmt_box(b1, sizeof b1, ndim, &boxes[first]),
                     fmt_box(b2, sizeof b2, ndim, &boxes[second]));
        goto out;
      }
    }
    act[nact++] = bi;
  }

  /* Disjoint boxes inside the tensor: exact cover iff the volumes add up. */
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) {
    if (!kp[i]) continue;
    uint64_t v = 1;
    for (uint32_t d = 0; d < ndim; d++) v *= boxes[i].count[d];
    sum += v;
  }
  if (sum == vol_total) goto ok;

gap:;
  uint64_t elem[SD_MAX_DIMS] = {0};
  if (n) {
    rc = find_gap(boxes, kp, n, ndim, shape, elem);
    if (rc) {
      rc = sd_fail(err, rc, "tensor '%s': %s while locating a gap",
                   sd_msgstr(shown, sizeof shown, nm, strlen(nm)),
                   rc == SHARDD_E_NO_MEMORY ? "out of memory" : "internal error");
      goto out;
    }
  }
  rc = sd_fail(err, SHARDD_E_GAP, "tensor '%s': element %s is not covered",
               sd_msgstr(shown, sizeof shown, nm, strlen(nm)),
               sd_fmt_dims(el, sizeof el, ndim, elem));
  goto out;

ok:
  rc = 0;
out:
  free(heap);
  return rc;
}
