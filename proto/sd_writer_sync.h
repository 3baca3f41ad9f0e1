/* Synchronous in-process checkpoint writer: the test oracle and the "one rank writes everything" baseline. */
#ifndef SD_WRITER_SYNC_H
#define SD_WRITER_SYNC_H

#include <stddef.h>
#include <stdint.h>

#include "sd_error.h"
#include "sd_format.h"

typedef struct {
  size_t nfiles;            /* shard files written (the index not counted) */
  uint64_t tensor_bytes;    /* sum of tensor bytes (the index's total_size) */
  uint64_t file_bytes;      /* headers + data + index: everything written */
} sd_write_result;

/* Plans and writes a whole checkpoint into dir, which must not exist
 * (SHARDD_E_EXISTS) and whose parent must. data[i] holds tensor i's packed
 * row-major bytes (sd_tensor_nbytes of them; may be NULL when that is 0).
 * Each file gets its header with one pwrite, then one pwrite per tensor in
 * file order (buffered, as a single rank writes today), then fsync; then the
 * index (when the plan needs one) and an fsync of dir and of its parent. On
 * failure whatever was created is removed. result may be NULL. */
int sd_write_checkpoint_sync(const char *dir, const sd_tensor *tensors, const void *const *data,
                             size_t n, const sd_plan_opts *opts, sd_write_result *result,
                             sd_error *err);

#endif
