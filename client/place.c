/* libshardd placement: arena offsets that let the daemon write a rank's slices straight from its memory (shardd_place). */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "sd_error.h"
#include "sd_format.h"
#include "shardd/shardd.h"

#define PACK_ALIGN 64 /* slices that cannot go zero-copy start on cache lines */
#define STRIDED (UINT64_MAX - 1) /* fo[i]: the slice lands in its file as several runs */

typedef struct {
  uint64_t dst;            /* file offset of the first run */
  unsigned runs;
} first_run;

static int note_run(void *ud, uint64_t dst, uint64_t src, uint64_t len) {
  (void)src;
  (void)len;
  first_run *r = ud;
  if (r->runs++ == 0) r->dst = dst;
  return r->runs > 1; /* two runs: an inner-dimension split; stop there */
}

static int name_cmp(const void *a, const void *b) {
  const shardd_tensor_desc *x = *(const shardd_tensor_desc *const *)a, *y = *(const shardd_tensor_desc *const *)b;
  return strcmp(x->name, y->name);
}

/* The file offset of each slice's bytes when they form one stretch of the
 * file, else UINT64_MAX; 0 when the plan could be made. */
static int file_offsets(const shardd_tensor_desc *t, size_t n, uint64_t max_shard_size, uint64_t *fo) {
  const shardd_tensor_desc **order = malloc((n ? n : 1) * sizeof *order);
  sd_tensor *tens = malloc((n ? n : 1) * sizeof *tens);
  size_t *slot = malloc((n ? n : 1) * sizeof *slot); /* t[i]'s tensor in tens */
  int rc = -1;
  sd_plan plan;
  memset(&plan, 0, sizeof plan);
  if (!order || !tens || !slot) goto out;
  for (size_t i = 0; i < n; i++) order[i] = &t[i];
  qsort(order, n, sizeof *order, name_cmp); /* several slices of one tensor make one tensor */
  size_t m = 0;
  for (size_t k = 0; k < n; k++) {
    const shardd_tensor_desc *d = order[k];
    if (m == 0 || strcmp(tens[m - 1].name, d->name) != 0) {
      sd_tensor *x = &tens[m++];
      memset(x, 0, sizeof *x);
      x->name = d->name;
      sd_error e;
      if (sd_dtype_parse(d->dtype, &x->dtype, &e)) goto out;
      x->ndim = (uint32_t)d->ndim;
      for (int j = 0; j < d->ndim; j++) x->shape[j] = d->shape[j];
      x->index = d->index;
    }
    slot[d - t] = m - 1;
  }
  sd_plan_opts opts = {.max_shard_size = max_shard_size};
  sd_error e;
  if (sd_plan_build(&plan, tens, m, &opts, &e)) goto out;
  for (size_t i = 0; i < n; i++) {
    const sd_tensor *x = &tens[slot[i]];
    sd_box b;
    for (uint32_t j = 0; j < x->ndim; j++) {
      b.start[j] = t[i].start ? t[i].start[j] : 0;
      b.count[j] = t[i].start ? t[i].count[j] : x->shape[j];
    }
    first_run r = {0, 0};
    sd_box_runs(x->ndim, x->shape, sd_dtype_size(x->dtype), &b, plan.loc[slot[i]].file_offset, note_run, &r);
    fo[i] = r.runs == 1 ? r.dst : r.runs > 1 ? STRIDED : UINT64_MAX;
  }
  rc = 0;
out:
  sd_plan_free(&plan);
  free(order);
  free(tens);
  free(slot);
  return rc;
}

SHARDD_EXPORT int shardd_place(const shardd_tensor_desc *t, size_t n, uint64_t max_shard_size, uint64_t base,
                               uint64_t *offsets, uint64_t *end) {
  if (n && (!t || !offsets)) return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "place: tensors or offsets is NULL");
  uint64_t *fo = calloc(n ? n : 1, sizeof *fo), *size = calloc(n ? n : 1, sizeof *size);
  if (!fo || !size) {
    free(fo);
    free(size);
    return sd_client_connect_fail(SHARDD_E_NO_MEMORY, "place: out of memory");
  }
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    const shardd_tensor_desc *d = &t[i];
    sd_dtype dt;
    sd_error e;
    /* A slice the daemon will refuse is packed by its count (the put then says why). */
    int ok = d->name && d->dtype && !sd_dtype_parse(d->dtype, &dt, &e) && d->ndim >= 0 && d->ndim <= SD_MAX_DIMS &&
             (d->ndim == 0 || d->shape) && !d->start == !d->count;
    uint64_t nb = ok ? sd_dtype_size(dt) : 1;
    for (int j = 0; ok && j < d->ndim; j++) {
      uint64_t dim = d->start ? d->count[j] : d->shape[j];
      if (d->start && (d->start[j] > d->shape[j] || dim > d->shape[j] - d->start[j])) ok = 0;
      if (dim && nb > UINT64_MAX / 2 / dim) ok = 0, nb = 0;
      nb *= dim;
    }
    size[i] = nb;
    bad |= !ok;
  }
  /* Only a slice of SD_PLACE_MIN bytes or more is placed by its file offset: with none, the
   * plan (a sort of every name) is not needed. */
  int any_big = 0;
  for (size_t i = 0; i < n && !any_big; i++) any_big = size[i] >= SD_PLACE_MIN;
  /* No plan (a name twice with different shapes, say): every slice is packed. */
  if (bad || !any_big || file_offsets(t, n, max_shard_size, fo) != 0)
    for (size_t i = 0; i < n; i++) fo[i] = UINT64_MAX;
  uint64_t at = base;
  for (size_t i = 0; i < n; i++) {
    uint64_t off;
    if (size[i] > UINT64_MAX / 2 - at) size[i] = 0; /* refused at the put anyway */
    if (fo[i] < STRIDED && size[i] >= SD_PLACE_MIN)
      off = at + ((fo[i] - at) & (SD_PLACE_ALIGN - 1)); /* the next offset congruent to the file's */
    else if (fo[i] == STRIDED && size[i] >= SD_PLACE_MIN)
      /* Row fragments a multiple of 512 long then sit where a device taking
       * direct I/O from 512-aligned memory gathers them into one write. The
       * daemon asks the device (statx STATX_DIOALIGN); a client cannot, and
       * 512 is what common block devices ask. */
      off = (at + SD_GATHER_ALIGN - 1) / SD_GATHER_ALIGN * SD_GATHER_ALIGN;
    else
      off = (at + PACK_ALIGN - 1) / PACK_ALIGN * PACK_ALIGN;
    offsets[i] = off;
    at = off + size[i];
  }
  if (end) *end = at;
  free(fo);
  free(size);
  return 0;
}
