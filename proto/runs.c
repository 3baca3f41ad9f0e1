/* Maps a slice box of a row-major tensor to the fewest contiguous byte runs in the file. */
#include "sd_format.h"

/* Let j be the innermost dimension the box does not span fully: every
 * dimension inside j is whole, so the box is contiguous from there in, and
 * one run covers count[j] rows of the inner block. Consecutive runs are then
 * stride[j-1] apart but only count[j]*stride[j] < stride[j-1] long, so no two
 * can touch: this is the coalesced form. */
int sd_box_runs(uint32_t ndim, const uint64_t *shape, unsigned elem_size, const sd_box *b,
                uint64_t file_base, sd_run_cb cb, void *ud) {
  if (ndim > SD_MAX_DIMS || elem_size == 0) return SHARDD_E_INVALID_ARGUMENT;
  if (ndim == 0) return cb(ud, file_base, 0, elem_size);
  for (uint32_t d = 0; d < ndim; d++)
    if (b->count[d] == 0) return 0;

  uint64_t stride[SD_MAX_DIMS];
  stride[ndim - 1] = elem_size;
  for (uint32_t d = ndim - 1; d > 0; d--) stride[d - 1] = stride[d] * shape[d];

  uint32_t j = ndim - 1;
  while (j > 0 && b->count[j] == shape[j]) j--;
  uint64_t run = b->count[j] * stride[j];

  uint64_t base = 0;
  for (uint32_t d = 0; d < ndim; d++) base += b->start[d] * stride[d];

  /* Odometer over the dimensions outside j. */
  uint64_t ctr[SD_MAX_DIMS] = {0};
  uint64_t src = 0, off = base;
  for (;;) {
    int rc = cb(ud, file_base + off, src, run);
    if (rc) return rc;
    src += run;
    uint32_t d = j;
    for (;;) {
      if (d == 0) return 0;
      d--;
      if (++ctr[d] < b->count[d]) {
        off += stride[d];
        break;
      }
      off -= (ctr[d] - 1) * stride[d];
      ctr[d] = 0;
    }
  }
}
