/* Checkpoints made by hand for the writer tests (test_staging.c, test_copies.c, test_gather.c): files, ops, publish requests, bytes compared on disk. */
#ifndef SD_UNIT_FIXTURE_CKPT_H
#define SD_UNIT_FIXTURE_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "fixture_root.h"

/* Files of a 4096-byte header and data, the data written by ops; want holds each file's bytes. */
typedef struct {
  sd_plan plan;
  uint8_t **want;          /* each file's bytes */
  uint8_t *src;            /* where fc_init's ops read from (one buffer for all) */
  int own_src;             /* src was allocated here: fc_free frees it */
  sd_write_op *ops;
  size_t nops, cap;
} fc_ckpt;

void fc_add_op(fc_ckpt *c, uint32_t f, uint64_t off, uint64_t len, const uint8_t *src, uint32_t flags);
/* Files of 4096-byte headers plus data_sizes[i] bytes. When src is NULL, a
 * private buffer holds the data; otherwise src (at least the sum of the data
 * sizes) does, and is filled here. Data is cut into pieces of 1..max_piece
 * bytes (whole when 0) and the ops are shuffled (fr_rnd). */
void fc_init(fc_ckpt *c, size_t nfiles, const uint64_t *data_sizes, uint64_t max_piece, uint8_t *src,
             uint32_t flags);
/* fc_init with nfiles files of size bytes of data each. */
void fc_init_even(fc_ckpt *c, size_t nfiles, uint64_t size, uint64_t max_piece, uint8_t *src, uint32_t flags);
void fc_free(fc_ckpt *c);
/* Replaces c's ops by an inner-dimension split of its first file: rows rows, each rank 0's w bytes
 * then rank 1's, rank k's rows packed at seg + k * rows * w (SD_WOP_SHARED); the file's bytes
 * (c->want) are taken from bytes, laid out as seg is. */
void fc_split_rows(fc_ckpt *c, uint64_t rows, uint64_t w, const uint8_t *seg, const uint8_t *bytes);

/* A publish of c into FR.root/rel reporting to o (span: none when NULL). */
sd_publish_req fc_req(fc_ckpt *c, const char *rel, fr_outcome *o, const sd_shm_span *span);
/* Starts fc_req's publish on FR.w and runs the loop until it is done. */
void fc_publish(fc_ckpt *c, const char *rel, fr_outcome *o, const sd_shm_span *span);
/* Expects FR.root/rel to hold c's files and, with several, the index. */
void fc_expect(const char *rel, const fc_ckpt *c);

/* A shared-memory segment of len bytes (a memfd at *fd), mapped read-write. */
uint8_t *fc_shared_segment(size_t len, int *fd);
/* Whether the file system at dir takes O_DIRECT at all. */
int fc_takes_direct(const char *dir);

#endif
